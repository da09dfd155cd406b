"""safetensors read and write: rlpt against Hugging Face's `safetensors` package on the same
tensors and the same file system (/dev/shm, so the memory system is the limit), plus a check
that rlpt's output is byte-identical to Python's and that Python loads it.

    .venv/bin/python bench/peers/sync_safetensors.py [--build build/sync] [--total-mb 1024]

Read = open + copy every tensor into memory the caller owns (safetensors.torch.load_file;
rlpt: safetensors_file + memcpy). Write = serialize to a file (safetensors.torch.save_file;
rlpt: write_safetensors, which also fsyncs and renames for an atomic publish).
"""
import argparse
import os
import tempfile
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
    p.add_argument("--total-mb", type=int, default=1024)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--build", default=str(common.ROOT / "build" / "sync"), help="build directory holding the runner")
    args = p.parse_args()
    exe = runner(args.build)
    versions = common.check_venv()
    import torch
    import safetensors.torch

    torch.manual_seed(0)
    per = 16 << 20  # 16 Mi elements = 32 MiB of bf16
    n = max(1, (args.total_mb << 20) // (per * 2))
    tensors = {f"model.layers.{i}.mlp.weight": torch.randn(per, dtype=torch.bfloat16) for i in range(n)}
    tensors["model.norm.weight"] = torch.randn(4096, dtype=torch.float32)
    nbytes = sum(t.numel() * t.element_size() for t in tensors.values())
    with tempfile.TemporaryDirectory(dir="/dev/shm" if os.path.isdir("/dev/shm") else None) as tmp:
        py_path, rlpt_path = os.path.join(tmp, "py.safetensors"), os.path.join(tmp, "rlpt.safetensors")
        t_write = common.timeit(lambda: safetensors.torch.save_file(tensors, py_path, metadata={"format": "pt"}),
                                repeat=args.reps, warmup=1, threads=1)
        t_read = common.timeit(lambda: {k: v.clone() for k, v in safetensors.torch.load_file(py_path).items()},
                               repeat=args.reps, warmup=1, threads=1)
        r = common.run_cpp(exe, ["st-roundtrip", py_path, rlpt_path, args.reps])
        identical = open(py_path, "rb").read() == open(rlpt_path, "rb").read()
        loaded = safetensors.torch.load_file(rlpt_path)
        same = all(torch.equal(loaded[k], v) for k, v in tensors.items())
    gb = nbytes / 1e9
    rows = [{"op": "write", "MB": nbytes // 1000000, "rlpt": gb / r["write_s"], "safetensors": gb / t_write},
            {"op": "read", "MB": nbytes // 1000000, "rlpt": gb / r["read_s"], "safetensors": gb / t_read}]
    common.print_table(rows)
    print(f"GB/s (1 thread each); memcpy {r['memcpy_gbps']:.2f} GB/s in the same run; rlpt file byte-identical to "
          f"Python's: {identical}; Python loads rlpt's file with equal tensors: {same}; safetensors {versions['safetensors']}")
    if not (identical and same):
        raise SystemExit("rlpt's file differs from Python's")


if __name__ == "__main__":
    main()
