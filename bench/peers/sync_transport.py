"""Weight-sync transport throughput: shared memory and TCP loopback between two processes,
stated against the single-thread memcpy rate measured in the same run (by the runner).

    .venv/bin/python bench/peers/sync_transport.py [--total-mb 2048] [--bucket-mb 256] [--reps 3]

Dense updates of a bf16 model of --total-mb split in --bucket-mb buckets: the sender packs each
bucket into a slot (copy + XXH3 per piece), the receiver verifies every piece (XXH3) and hands
it to a no-op load callback (streaming), or copies it into its staging area and swaps that in
as its mirror at commit (staged, the default mode: the previous version survives any failure).
"""
import argparse

import common

RUNNER = common.ROOT / "build/sync/bench/sync/bench_sync_runner"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--total-mb", type=int, default=2048)
    p.add_argument("--bucket-mb", type=int, default=256)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--staged-total-mb", type=int, default=1024, help="model size for the staged receiver (needs 3x)")
    args = p.parse_args()
    common.check_venv()
    rows = []
    for transport in ("shm", "tcp"):
        for staged in (False, True):
            total = args.staged_total_mb if staged else args.total_mb
            r = common.run_cpp(RUNNER, [transport, total, args.bucket_mb, args.reps] + (["staged"] if staged else []))
            if not r["receiver_ok"]:
                raise SystemExit(f"{transport}: the receiver failed")
            rows.append({"transport": transport, "receiver": r["receiver"], "MiB": total, "bucket_MiB": args.bucket_mb,
                         "s": r["best_s"], "GB/s": r["gbps"], "memcpy GB/s": r["memcpy_gbps"],
                         "of memcpy": r["fraction_of_memcpy"]})
    common.print_table(rows, base="GB/s")


if __name__ == "__main__":
    main()
