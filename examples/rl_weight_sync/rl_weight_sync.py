"""RL weight sync: a toy trainer publishes its weights after every SGD step; two inference ranks
serve requests and follow its versions through eredu live updates. One version is corrupted in
flight and refused; serving goes on with the last good version. Every response is then checked
against a single-process forward of exactly the version it names.

    mpirun -np 3 python3 examples/rl_weight_sync/rl_weight_sync.py [--steps 8] [--corrupt 4]

Rank 0 trains and publishes; ranks 1 and 2 serve (see README.md).
"""
import argparse
import sys
import threading
import time

import numpy as np

import eredu

IN, HIDDEN, OUT = 16, 32, 4


def initial_weights():
    rng = np.random.default_rng(0)
    return {
        "w1": (rng.standard_normal((HIDDEN, IN)) * 0.1).astype(np.float32),
        "b1": np.zeros(HIDDEN, np.float32),
        "w2": (rng.standard_normal((OUT, HIDDEN)) * 0.1).astype(np.float32),
        "b2": np.zeros(OUT, np.float32),
    }


def forward(w, x):
    h = np.maximum(w["w1"] @ x + w["b1"], 0)
    return w["w2"] @ h + w["b2"]


def sgd_step(w, step):
    """One step of SGD on a fixed regression task (deterministic: any rank can replay it)."""
    rng = np.random.default_rng(1000 + step)
    x = rng.standard_normal((IN, 64)).astype(np.float32)
    target = np.tanh(x[:OUT] * 2)
    h = np.maximum(w["w1"] @ x + w["b1"][:, None], 0)
    y = w["w2"] @ h + w["b2"][:, None]
    g = (y - target) / x.shape[1]
    gh = (w["w2"].T @ g) * (h > 0)
    lr = np.float32(0.1)
    return {
        "w1": w["w1"] - lr * (gh @ x.T), "b1": w["b1"] - lr * gh.sum(1),
        "w2": w["w2"] - lr * (g @ h.T), "b2": w["b2"] - lr * g.sum(1),
    }


def weights_after(step):
    """The trainer's weights after `step` steps, computed exactly as train() computes them."""
    w = initial_weights()
    for s in range(1, step + 1):
        w = {k: v.astype(np.float32) for k, v in sgd_step(w, s).items()}
    return w


def train(group, steps):
    with eredu.Publisher(group) as publisher:
        w = initial_weights()
        previous = None
        for step in range(1, steps + 1):
            w = {k: v.astype(np.float32) for k, v in sgd_step(w, step).items()}  # new arrays: the offered ones stay
            version = publisher.publish(f"step-{step}", w, base=f"step-{step - 1}" if step > 1 else None)
            if not version.wait_served(group.size - 1, 60):
                sys.exit(f"trainer: step-{step} was not taken by every server")
            print(f"trainer: step-{step} served by {version.served}, refused by {version.failed}", flush=True)
            if previous is not None:
                previous.withdraw()  # its memory is the trainer's again
            previous = version


def serve(group, steps, corrupt):
    responses = []  # (origin, x, y)
    stop = threading.Event()
    slot = eredu.ModelSlot(framework="np")

    def server():
        rng = np.random.default_rng(group.rank)
        while not stop.is_set():
            v = slot.current()
            if v is not None:
                x = rng.standard_normal(IN).astype(np.float32)
                responses.append((v.origin, x, forward(v, x)))
            time.sleep(0.001)

    thread = threading.Thread(target=server)
    thread.start()
    refused = []
    with eredu.Subscriber(group, publisher=0) as subscriber:
        for step in range(1, steps + 1):
            version = subscriber.open(f"step-{step}", wait=60)  # once the trainer has published it
            if step == corrupt:
                version.corrupt_next_read(7)  # a block damaged in flight
            try:
                slot.swap_sync(version)
            except eredu.ChecksumError as e:
                refused.append(step)
                print(f"server {group.rank}: refused step-{step}: {e}", flush=True)
            del version
            time.sleep(0.02)  # serve this version a little
    stop.set()
    thread.join()
    # Every response against a single-process forward of exactly the version it names.
    expected = {}
    for origin, x, y in responses:
        step = int(origin.rsplit("step-", 1)[1])
        if step not in expected:
            expected[step] = weights_after(step)
        if not np.array_equal(forward(expected[step], x), y):
            sys.exit(f"server {group.rank}: a response does not match step-{step}")
    served_steps = sorted({int(o.rsplit('step-', 1)[1]) for o, _, _ in responses})
    if corrupt in served_steps:
        sys.exit(f"server {group.rank}: served the corrupted step-{corrupt}")
    if refused != ([corrupt] if 1 <= corrupt <= steps else []):
        sys.exit(f"server {group.rank}: refused {refused}")
    print(f"server {group.rank}: {len(responses)} responses from versions {served_steps}, each matching its "
          f"version; step-{corrupt} refused", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--corrupt", type=int, default=4, help="the step whose transfer is damaged")
    args = parser.parse_args()
    group = eredu.LiveGroup()
    if group.size < 2:
        sys.exit("run it under mpirun -np 3 (one trainer, servers)")
    if group.rank == 0:
        train(group, args.steps)
    else:
        serve(group, args.steps, args.corrupt)


if __name__ == "__main__":
    main()
