"""Helpers for side-by-side benchmarks of rlpt against its peers (verl, trl, openrlhf, torch).

Run benchmark scripts with the venv made by tools/golden/setup-venv:
    .venv/bin/python bench/peers/<script>.py
`.venv/bin/python bench/peers/common.py` prints the peer versions, thread count and host copy bandwidth.
"""
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
VENV = Path(os.environ.get("RLPT_VENV", ROOT / ".venv"))
CORES = len(os.sched_getaffinity(0))


def check_venv() -> dict[str, str | None]:
    """Exit with a hint unless running in the project venv; return the peer versions."""
    if Path(sys.prefix).resolve() != VENV.resolve():
        sys.exit(f"run this with {VENV}/bin/python (create it with tools/golden/setup-venv)")
    sys.path.insert(0, str(ROOT / "tools" / "golden"))
    import peers
    return peers.versions()


def timeit(fn, repeat: int = 20, warmup: int = 3, threads: int = CORES) -> float:
    """Median wall time of fn() in seconds, with torch limited to `threads` intra-op threads.

    CUDA work is synchronized after each call, so fn may launch kernels asynchronously.
    """
    import torch

    torch.set_num_threads(threads)
    sync = torch.cuda.synchronize if torch.cuda.is_initialized() else (lambda: None)
    for _ in range(warmup):
        fn()
    sync()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def bandwidth_probe(nbytes: int = 1 << 30, repeat: int = 5) -> float:
    """Host memory copy bandwidth in GB/s (1e9 bytes/s), counting bytes read plus bytes written.

    Best of `repeat` single-threaded numpy copies of an `nbytes` buffer (needs 2 * nbytes of memory).
    """
    import numpy as np

    src = np.ones(nbytes, dtype=np.uint8)
    dst = np.zeros_like(src)  # np.zeros_like writes every page, so no first-touch faults are timed
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - start)
    return 2 * nbytes / best / 1e9


def run_cpp(binary, args=()) -> dict:
    """Run a C++ benchmark runner and return the JSON object it prints on its last stdout line."""
    proc = subprocess.run([str(binary), *map(str, args)], capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{binary} exited with {proc.returncode}:\n{proc.stderr}")
    lines = proc.stdout.strip().splitlines()
    if not lines:
        raise RuntimeError(f"{binary} printed nothing on stdout")
    return json.loads(lines[-1])


def print_table(rows: list[dict], base: str = "rlpt") -> None:
    """Print rows (dicts sharing keys) as an aligned table.

    Every float column other than `base` (e.g. a peer's seconds) gets a ratio column "<col>/<base>";
    with times, a ratio above 1 means `base` is faster. Int columns are parameters: shown, not compared.
    Missing values (None) print as "-".
    """
    columns = list(rows[0])
    numeric = [c for c in columns if any(isinstance(row.get(c), float | int) for row in rows)]
    floats = [c for c in numeric if any(isinstance(row.get(c), float) for row in rows)]
    ratios = [c for c in floats if c != base] if base in floats else []

    def fmt(value):
        return "-" if value is None else f"{value:.4g}" if isinstance(value, float) else str(value)

    def ratio(value, ref):
        return "-" if value is None or not ref else f"{value / ref:.2f}x"

    header = columns + [f"{c}/{base}" for c in ratios]
    table = [header] + [[fmt(row.get(c)) for c in columns] + [ratio(row.get(c), row.get(base)) for c in ratios]
                        for row in rows]
    right = [c in numeric for c in columns] + [True] * len(ratios)
    widths = [max(len(line[i]) for line in table) for i in range(len(header))]
    for line in table:
        print("  ".join(s.rjust(w) if r else s.ljust(w) for s, w, r in zip(line, widths, right)).rstrip())


if __name__ == "__main__":
    for name, version in check_venv().items():
        print(f"{name:14} {version}")
    print(f"threads        {CORES}")
    print(f"copy bandwidth {bandwidth_probe():.1f} GB/s (read + write, 1 thread)")
