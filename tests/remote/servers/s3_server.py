#!/usr/bin/env python3
"""Starts s3rver (npm, pinned in package.json/package-lock.json beside this file; installed by
scripts/setup.sh into build/npm-servers) with one bucket holding the files of --root, and the
SigV4-verifying front of sigv4_front.py before it. Prints `READY http://127.0.0.1:PORT` (the
front's address) once both serve; runs until SIGTERM, then stops s3rver and removes its files.

A missing piece (node, s3rver, botocore) is one line saying so and exit status 1: the test skips
with that line. Everything lives under a temporary directory; both servers bind 127.0.0.1 on free
ports, and die with the process that started this launcher (PR_SET_PDEATHSIG).

The access key must be s3rver's own (S3RVER: the only one it knows, and all it checks); the
secret is any the test chooses, and the front checks it.
"""

import argparse
import ctypes
import http.client
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", "..", ".."))


def fail(why):
    print(why, flush=True)
    sys.exit(1)


def die_with_parent():
    # prctl(PR_SET_PDEATHSIG, SIGTERM): a test that crashes takes its servers with it.
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)
    except (OSError, AttributeError):
        pass


def find_s3rver():
    candidates = [os.environ.get("EREDU_S3RVER", ""),
                  os.path.join(REPO, "build", "npm-servers", "node_modules", "s3rver", "bin", "s3rver.js")]
    for c in candidates:
        if c and os.path.isfile(c):
            return c
    return None


def upload(port, bucket, root):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    for dirpath, _, files in os.walk(root):
        for name in sorted(files):
            path = os.path.join(dirpath, name)
            key = os.path.relpath(path, root).replace(os.sep, "/")
            with open(path, "rb") as body:
                conn.request("PUT", f"/{bucket}/{urllib.parse.quote(key, safe='/')}", body=body,
                             headers={"Content-Length": str(os.path.getsize(path)),
                                      "Content-Type": "application/octet-stream"})
                response = conn.getresponse()
                response.read()
                if response.status != 200:
                    fail(f"s3rver refused the upload of {key}: HTTP {response.status}")
    conn.close()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", required=True, help="directory whose files become the bucket's objects")
    parser.add_argument("--bucket", default="eredu-test")
    parser.add_argument("--access-key", default="S3RVER")
    parser.add_argument("--secret", default="eredu-test-secret")
    parser.add_argument("--region", default="us-east-1")
    parser.add_argument("--allow-anonymous", action="store_true", help="let unsigned requests through")
    parser.add_argument("--max-keys", type=int, default=0,
                        help="page size forced on listings (to exercise continuation tokens)")
    args = parser.parse_args()
    die_with_parent()

    try:
        import sigv4_front
    except ImportError as e:
        fail(f"botocore is missing ({e}); install python3-botocore")
    node = shutil.which("node")
    if not node:
        fail("node is not installed: the S3 test server (s3rver) needs Node.js")
    s3rver = find_s3rver()
    if not s3rver:
        fail("s3rver is not installed: run scripts/setup.sh (npm ci into build/npm-servers)")
    if not os.path.isdir(args.root):
        fail(f"--root {args.root} is not a directory")

    work = tempfile.mkdtemp(prefix="eredu-s3rver-")
    backend = None
    try:
        backend = subprocess.Popen(
            # The legacy provider: s3rver's continuation tokens are DES-encrypted, which Node's
            # OpenSSL 3 offers only there (without it a truncated listing is a 500).
            [node, "--openssl-legacy-provider", s3rver, "-d", os.path.join(work, "data"), "-a", "127.0.0.1", "-p", "0", "-s",
             "--configure-bucket", args.bucket],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, preexec_fn=die_with_parent)
        port = None
        deadline = time.monotonic() + 30
        lines = []
        while time.monotonic() < deadline:
            line = backend.stdout.readline()
            if not line:
                break
            lines.append(line.strip())
            m = re.search(r"listening on 127\.0\.0\.1:(\d+)", line)
            if m:
                port = int(m.group(1))
                break
        if port is None:
            fail(f"s3rver did not start: {' | '.join(lines[-3:]) or 'no output'}")
        # Keep draining its output so it never blocks on a full pipe.
        threading.Thread(target=lambda: [None for _ in backend.stdout], daemon=True).start()
        upload(port, args.bucket, args.root)

        config = sigv4_front.Config(port, args.bucket, args.access_key, args.secret, args.region,
                                    args.allow_anonymous, args.max_keys)
        server = sigv4_front.make_server(config)
        stop = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        signal.signal(signal.SIGINT, lambda *_: stop.set())
        threading.Thread(target=server.serve_forever, daemon=True).start()
        print(f"READY http://127.0.0.1:{server.server_address[1]}", flush=True)
        while not stop.wait(1):
            if backend.poll() is not None:
                print("s3rver exited", flush=True)
                break
        server.shutdown()
    finally:
        if backend is not None and backend.poll() is None:
            backend.terminate()
            try:
                backend.wait(5)
            except subprocess.TimeoutExpired:
                backend.kill()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
