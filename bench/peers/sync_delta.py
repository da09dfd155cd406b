"""Delta weight sync on an RL-like update stream: fraction of bf16 elements that change per
step, bytes on the wire against dense, and encode/apply throughput of rlpt's codec against the
torch encoder the frameworks use (verl delta_sharded / vLLM sparse_nccl style: compare the bits,
nonzero() for indices, gather values; apply with index_copy_), on the same tensors.

    .venv/bin/python bench/peers/sync_delta.py [--build build/sync] [--numel 33554432] [--steps 8]

The stream: fp32 master weights (N(0, 0.02)) updated by Adam (beta 0.9/0.999, unit-scale random
gradients) at learning rates 1e-6 and 1e-5, cast to bf16 after every step. The last step's
bf16 pair (prev, now) goes to rlpt's runner through a safetensors file in /dev/shm; the runner
also simulates the same stream in C++ (delta-sim) and encodes/applies every step. Throughputs are
bytes of the dense bf16 tensor per CPU second of one thread (robust on a shared machine), next to
memcpy's bytes copied per CPU second measured by the runner in the same run; wall rates too.
"""
import argparse
import os
import tempfile
import time
from pathlib import Path

import common


def runner(build: str):
    """The C++ runner in BUILD (cmake --build BUILD --target bench_sync_runner)."""
    path = Path(build) / "bench" / "sync" / "bench_sync_runner"
    if not path.exists():
        raise SystemExit(f"{path} missing: cmake --build {build} --target bench_sync_runner")
    return path


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--numel", type=int, default=32 << 20)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--build", default=str(common.ROOT / "build" / "sync"), help="build directory holding the runner")
    args = p.parse_args()
    exe = runner(args.build)
    versions = common.check_venv()
    import torch
    import safetensors.torch

    torch.manual_seed(0)
    streams, pairs = [], []
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

        t_enc = cpu_time(torch_encode, args.reps)
        t_app = cpu_time(torch_apply, args.reps)
        assert torch.equal(target.view(torch.int16), now.view(torch.int16))
        torch_wire = idx.numel() * (4 + 2)  # int32 index + bf16 value
        with tempfile.TemporaryDirectory(dir="/dev/shm" if os.path.isdir("/dev/shm") else None) as tmp:
            path = os.path.join(tmp, "pair.safetensors")
            safetensors.torch.save_file({"prev": prev, "now": now}, path)
            r = common.run_cpp(exe, ["delta-pair", path, args.reps])
        sim = common.run_cpp(exe, ["delta-sim", args.numel, lr, args.steps])
        dense = args.numel * 2
        gb = dense / 1e9
        streams.append({"lr": lr, "steps": args.steps, "changed % (rlpt stream)": 100 * sim["changed_fraction"],
                        "changed % (torch stream)": 100 * sum(fractions) / len(fractions),
                        "dense/wire": sim["reduction"], "encode GB/CPU s": sim["encode_cpu_gbps"],
                        "apply GB/CPU s": sim["apply_cpu_gbps"], "memcpy GB/CPU s": sim["memcpy_cpu_gbps"],
                        "encode GB/s wall": sim["encode_gbps"], "apply GB/s wall": sim["apply_gbps"],
                        "memcpy GB/s wall": sim["memcpy_gbps"]})
        pairs.append({"lr": lr, "changed %": 100 * r["changed"] / args.numel,
                      "rlpt dense/wire": dense / max(r["wire_bytes"], 1), "torch dense/wire": dense / max(torch_wire, 1),
                      "rlpt enc": gb / r["encode_cpu_s"], "torch enc": gb / t_enc, "enc rlpt/torch": t_enc / r["encode_cpu_s"],
                      "rlpt apply": gb / r["apply_cpu_s"], "torch apply": gb / t_app,
                      "apply rlpt/torch": t_app / r["apply_cpu_s"], "memcpy": r["memcpy_cpu_gbps"]})
    print(f"## Update stream ({args.numel} bf16 elements, {args.steps} Adam steps; rlpt's C++ stream, all steps encoded and applied)")
    markdown(streams)
    print(f"\n## Last step's pair, rlpt vs torch (nonzero + gather / index_copy_), GB of dense bf16 per CPU second, 1 thread; "
          f"torch {versions['torch']}")
    markdown(pairs)


def cpu_time(fn, repeat: int) -> float:
    """Best process CPU seconds of fn() on one torch thread (rlpt's runner reports the same per thread)."""
    import torch

    torch.set_num_threads(1)
    fn()
    best = float("inf")
    for _ in range(repeat):
        start = time.process_time()
        fn()
        best = min(best, time.process_time() - start)
    return best


def markdown(rows: list[dict]) -> None:
    keys = list(rows[0])
    print("| " + " | ".join(keys) + " |\n|" + "---|" * len(keys))
    for row in rows:
        print("| " + " | ".join(f"{row[k]:.4g}" if isinstance(row[k], float) else str(row[k]) for k in keys) + " |")

if __name__ == "__main__":
    main()
