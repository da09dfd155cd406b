"""Delta weight sync on an RL-like update stream: fraction of bf16 elements that change per
step, bytes on the wire against dense, and encode/apply throughput of rlpt's codec against the
torch encoder the frameworks use (verl delta_sharded / vLLM sparse_nccl style: compare the bits,
nonzero() for indices, gather values; apply with index_copy_), on the same tensors.

    .venv/bin/python bench/peers/sync_delta.py [--numel 33554432] [--steps 8]

The stream: fp32 master weights (N(0, 0.02)) updated by Adam (beta 0.9/0.999, unit-scale random
gradients) at learning rates 1e-6 and 1e-5, cast to bf16 after every step. The last step's
bf16 pair (prev, now) goes to rlpt's runner through a safetensors file in /dev/shm.
"""
import argparse
import os
import tempfile

import common

RUNNER = common.ROOT / "build/sync/bench/sync/bench_sync_runner"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--numel", type=int, default=32 << 20)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--reps", type=int, default=5)
    args = p.parse_args()
    versions = common.check_venv()
    import torch
    import safetensors.torch

    torch.manual_seed(0)
    rows = []
    for lr in (1e-6, 1e-5):
        w = torch.randn(args.numel, dtype=torch.float32) * 0.02
        m = torch.zeros_like(w)
        v = torch.zeros_like(w)
        prev = w.to(torch.bfloat16)
        fractions = []
        for t in range(1, args.steps + 1):
            g = torch.randn_like(w)
            m.mul_(0.9).add_(g, alpha=0.1)
            v.mul_(0.999).addcmul_(g, g, value=0.001)
            w.sub_(lr * (m / (1 - 0.9**t)) / ((v / (1 - 0.999**t)).sqrt() + 1e-8))
            now = w.to(torch.bfloat16)
            fractions.append((now.view(torch.int16) != prev.view(torch.int16)).float().mean().item())
            if t < args.steps:
                prev = now
        # torch peer on the last pair: what verl's delta_sharded / vLLM's sparse path do.
        def torch_encode():
            changed = (now.view(torch.int16) != prev.view(torch.int16)).nonzero().squeeze(1)
            return changed.to(torch.int32), now[changed]

        idx, vals = torch_encode()
        target = prev.clone()

        def torch_apply():
            target.index_copy_(0, idx.long(), vals)

        t_enc = common.timeit(torch_encode, repeat=args.reps, warmup=1, threads=1)
        t_app = common.timeit(torch_apply, repeat=args.reps, warmup=1, threads=1)
        assert torch.equal(target.view(torch.int16), now.view(torch.int16))
        torch_wire = idx.numel() * (4 + 2)  # int32 index + bf16 value
        with tempfile.TemporaryDirectory(dir="/dev/shm" if os.path.isdir("/dev/shm") else None) as tmp:
            path = os.path.join(tmp, "pair.safetensors")
            safetensors.torch.save_file({"prev": prev, "now": now}, path)
            r = common.run_cpp(RUNNER, ["delta-pair", path, args.reps])
        dense = args.numel * 2
        gb = dense / 1e9
        rows.append({"lr": lr, "changed %": 100 * sum(fractions) / len(fractions), "last step %": 100 * r["changed"] / args.numel,
                     "rlpt dense/wire": dense / max(r["wire_bytes"], 1), "torch dense/wire": dense / max(torch_wire, 1),
                     "rlpt enc GB/s": gb / r["encode_s"], "torch enc GB/s": gb / t_enc,
                     "rlpt apply GB/s": gb / r["apply_s"], "torch apply GB/s": gb / t_app,
                     "memcpy GB/s": r["memcpy_gbps"]})
    for row in rows:
        print("  ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()))
    print(f"ratios (rlpt / torch, 1 thread): encode {[round(r['rlpt enc GB/s'] / r['torch enc GB/s'], 2) for r in rows]}, "
          f"apply {[round(r['rlpt apply GB/s'] / r['torch apply GB/s'], 2) for r in rows]}; torch {versions['torch']}")


if __name__ == "__main__":
    main()
