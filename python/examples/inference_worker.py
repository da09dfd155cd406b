# SPDX-License-Identifier: Apache-2.0
"""An inference worker that takes versioned weights from a trainer through rlpt's weight sync.

    python examples/inference_worker.py --demo     # a trainer process and this worker, 3 versions

The worker serves requests with the version it has; between requests it polls the receiver
(non-blocking), and when a version has been published (complete and verified) it loads it into
the model. A failed update (a trainer that died mid-update, a timeout) leaves the last complete
version in place: the worker keeps serving it and logs why.
"""
import argparse
import subprocess
import sys
import time

import torch

import rlpt.sync


def make_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Embedding(16, 8), torch.nn.Linear(8, 16))


def worker(address, last_version=None, seconds=120.0):
    """Serves until `last_version` is loaded (or `seconds` pass)."""
    model = make_model().eval()
    rx = rlpt.sync.Receiver("shm", address, timeout=30.0)
    served = 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and (last_version is None or rx.version != last_version):
        u = rx.poll(wait=0.0)  # does not block between updates
        if u["state"] == "published":
            rx.load_into(model)
            print(f"worker: loaded version {u['version']} ({u['bytes']} bytes, {u['seconds'] * 1e3:.1f} ms)")
        elif u["state"] == "failed":
            print(f"worker: update {u['version']} failed ({u['error_id']}): keeping version {rx.version}")
        with torch.no_grad():  # one "request"
            tokens = torch.randint(0, 16, (4,))
            model(tokens).argmax(-1)
        served += 1
        time.sleep(0.01)
    return rx.version


def trainer(address, versions):
    model = make_model()
    tx = rlpt.sync.Sender(model.state_dict(), "shm", address)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for v in range(1, versions + 1):
        loss = model(torch.arange(16)).logsumexp(-1).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()  # in place: the sender reads the same tensors
        tx.publish(v)
        print(f"trainer: published version {v}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--role", choices=["worker", "trainer"], default="worker")
    ap.add_argument("--address", default="rlpt-example-policy")
    ap.add_argument("--demo", action="store_true")
    a = ap.parse_args()
    if a.demo:
        t = subprocess.Popen([sys.executable, __file__, "--role", "trainer", "--address", a.address])
        v = worker(a.address, last_version=3)
        t.wait()
        print(f"worker: finished on version {v}")
        sys.exit(0 if v == 3 and t.returncode == 0 else 1)
    elif a.role == "trainer":
        trainer(a.address, 3)
    else:
        worker(a.address)
