"""Weight-sync transport throughput: shared memory and TCP loopback between two processes,
stated against the single-thread memcpy rate measured in the same run (by the runner), in wall
time and per CPU second (the figure that holds up when other processes share the cores).

    .venv/bin/python bench/peers/sync_transport.py [--build build/sync] [--total-mb 2048] [--bucket-mb 256] [--reps 3]

Dense updates of a bf16 model of --total-mb split in --bucket-mb buckets: the sender packs each
bucket into a slot (copy + XXH3 per piece), the receiver verifies every piece (XXH3) and hands
it to a no-op load callback (streaming), or copies it into its staging area and swaps that in
as its mirror at commit (staged, the default mode: the previous version survives any failure).
"""
import argparse
import os
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
    p.add_argument("--total-mb", type=int, default=2048)
    p.add_argument("--bucket-mb", type=int, default=256)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--staged-total-mb", type=int, default=1024, help="model size for the staged receiver (needs 3x)")
    p.add_argument("--build", default=str(common.ROOT / "build" / "sync"), help="build directory holding the runner")
    args = p.parse_args()
    exe = runner(args.build)
    common.check_venv()
    rows = []
    for transport in ("shm", "tcp"):
        for staged in (False, True):
            total = args.staged_total_mb if staged else args.total_mb
            load0 = os.getloadavg()[0]
            r = common.run_cpp(exe, [transport, total, args.bucket_mb, args.reps] + (["staged"] if staged else []))
            if not r["receiver_ok"]:
                raise SystemExit(f"{transport}: the receiver failed")
            rows.append({"transport": transport, "receiver": r["receiver"], "MiB": total, "bucket MiB": args.bucket_mb,
                         "load": f"{load0:.1f} → {os.getloadavg()[0]:.1f}",
                         "wall s": r["best_s"], "GB/s": r["gbps"], "memcpy GB/s": r["memcpy_gbps"],
                         "of memcpy": r["fraction_of_memcpy"],
                         "sender CPU s (best / mean)": f"{r['sender_cpu_s']:.3g} / {r['sender_cpu_mean_s']:.3g}",
                         "receiver CPU s (best / mean)": f"{r['receiver_cpu_s']:.3g} / {r['receiver_cpu_mean_s']:.3g}",
                         "GB per CPU s": r["cpu_gbps"], "memcpy GB per CPU s": r["memcpy_cpu_gbps"],
                         "of memcpy (CPU)": r["cpu_fraction_of_memcpy"],
                         "of memcpy (CPU, mean)": r["cpu_mean_fraction_of_memcpy"],
                         "piece memcpy GB per CPU s": r["memcpy_piece_cpu_gbps"],
                         "of piece memcpy (CPU)": r["cpu_fraction_of_piece_memcpy"]})
    keys = list(rows[0])
    print("| " + " | ".join(keys) + " |\n|" + "---|" * len(keys))
    for row in rows:
        print("| " + " | ".join(f"{row[k]:.3g}" if isinstance(row[k], float) else str(row[k]) for k in keys) + " |")
    print("GB/s: bytes of the model per second (best of --reps dense versions, wall clock); memcpy: single-thread\n"
          "memcpy of 1 GiB, bytes copied per second, same run (best of 5). load: 1-minute load average before -> after.\n"
          "CPU columns: CPU seconds per version of each process (best and mean of --reps); GB per CPU s = bytes / the\n"
          "slower side's best CPU seconds (the rate with a free core per side), against memcpy's bytes per CPU second\n"
          "(best of 5); the mean column uses each side's mean instead; piece memcpy: the same 1 GiB copied in pieces of one model tensor (32 MiB), as the\n"
          "sender packs them (glibc uses non-temporal stores only above x86_non_temporal_threshold).")


if __name__ == "__main__":
    main()
