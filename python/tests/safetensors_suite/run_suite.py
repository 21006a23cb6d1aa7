"""Runs Hugging Face safetensors' own Python tests (upstream/, see README.md there) against
eredu's drop-in: shim/ answers `import safetensors` with eredu, and the tests run from a
scratch directory laid out as safetensors' bindings/python (they write ./tests/data/...).

Passes when every test passes, except:
  * skips whose reason says a device or framework is absent here (CUDA, NPU, HPU, MLX, S3,
    a torch feature) — upstream's own skip decorators;
  * DIFFERENCES below, each a test that must fail with the reason given (and fails this run
    if it starts passing, so the list never goes stale). docs/python.md lists the same.

usage: run_suite.py [pytest args...]   (PYTHONPATH must reach the eredu package)
"""

import os
import re
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET

HERE = os.path.dirname(os.path.abspath(__file__))

# test id (file::class::name) -> why eredu differs (docs/python.md, "Where eredu differs").
DIFFERENCES = {}

# Skip reasons that name something this machine lacks, not something eredu lacks.
ABSENT = re.compile(r"cuda|npu|hpu|mlx|s3 access|device|available|torch", re.IGNORECASE)


def main(argv):
    with tempfile.TemporaryDirectory(prefix="eredu-safetensors-suite-") as scratch:
        os.makedirs(os.path.join(scratch, "tests", "data"))
        report = os.path.join(scratch, "report.xml")
        env = dict(os.environ)
        inherited = [os.path.abspath(p) for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
        env["PYTHONPATH"] = os.pathsep.join([os.path.join(HERE, "shim"), *inherited])
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs", "--continue-on-collection-errors",
               f"--junitxml={report}",
               os.path.join(HERE, "upstream"), *argv]
        subprocess.run(cmd, cwd=scratch, env=env, check=False)
        if not os.path.exists(report):
            print("run_suite: pytest wrote no report (it could not start)")
            return 1
        root = ET.parse(report).getroot()
    problems, counts = [], {"passed": 0, "skipped": 0, "differences": 0}
    for case in root.iter("testcase"):
        parts = case.get("classname", "").split(".")
        # "...upstream.test_simple.TestCase" + name; a module that failed to import has no class.
        test = f"{parts[-2]}.py::{parts[-1]}::{case.get('name')}" if len(parts) >= 2 and parts[-2].startswith(
            "test_") else f"{case.get('name', '').split('.')[-1]}.py (its import)"
        failed = case.find("failure") is not None or case.find("error") is not None
        skipped = case.find("skipped")
        if test in DIFFERENCES:
            if failed:
                counts["differences"] += 1
            else:
                problems.append(f"{test}: listed as a difference ({DIFFERENCES[test]}) but it "
                                f"{'was skipped' if skipped is not None else 'passes'}: update DIFFERENCES and docs")
        elif failed:
            problems.append(f"{test}: fails")
        elif skipped is not None:
            reason = skipped.get("message", "")
            if not ABSENT.search(reason):
                problems.append(f"{test}: skipped for a reason that is not an absent device or framework: {reason}")
            counts["skipped"] += 1
        else:
            counts["passed"] += 1
    errors = int(root.find("testsuite").get("errors", 0)) if root.find("testsuite") is not None else 0
    print(f"run_suite: {counts['passed']} passed, {counts['skipped']} skipped (absent here), "
          f"{counts['differences']} known differences; collection errors {errors}")
    for p in problems:
        print("run_suite: " + p)
    return 1 if problems or counts["passed"] == 0 else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
