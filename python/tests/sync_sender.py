# SPDX-License-Identifier: Apache-2.0
"""The trainer side of test_sync.py, run as its own process: publishes versions 1..N of a small
model whose parameters are a function of the version, announces each on stdout, then (with
--hang-at V) starts version V and waits to be killed in the middle of it."""
import argparse
import sys
import threading

import torch

import rlpt.sync


def params(version, big):
    g = torch.Generator().manual_seed(version)
    out = {"embed.weight": torch.randn(64, 32, generator=g), "head.bias": torch.randn(32, generator=g).to(torch.bfloat16),
           "step": torch.tensor([version], dtype=torch.int64)}
    if big:
        out["big"] = torch.randn(big, generator=g)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--transport", required=True)
    ap.add_argument("--address", required=True)
    ap.add_argument("--first", type=int, default=1)
    ap.add_argument("--versions", type=int, required=True)
    ap.add_argument("--hang-at", type=int, default=0)
    ap.add_argument("--big", type=int, default=0)
    ap.add_argument("--secret", default=None)
    a = ap.parse_args()
    state = params(a.first, a.big)
    tx = rlpt.sync.Sender(state, a.transport, a.address, bucket_bytes=1 << 20, timeout=30.0, secret=a.secret)
    for v in range(a.first, a.first + a.versions):
        for k, t in params(v, a.big).items():
            state[k].copy_(t)
        r = tx.publish(v)
        print(f"published {v} {r['digest']}", flush=True)
    if a.hang_at:
        for k, t in params(a.hang_at, a.big).items():
            state[k].copy_(t)
        threading.Timer(0.0, lambda: print(f"publishing {a.hang_at}", flush=True)).start()
        tx.publish(a.hang_at)  # killed by the test while this runs
        print("finished", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
