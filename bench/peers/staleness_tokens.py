"""rlpt vs torch eager: the per-token staleness kernels, same inputs, same run, one thread each.

    .venv/bin/python bench/peers/staleness_tokens.py [--build build/staleness] [--n 4194304]

Needs the C++ runner: cmake --build build/staleness --target bench_staleness_runner.

No peer framework ships these as a library function: AReaL computes its log-linear proximal
approximation (prox_logp_method=loglinear) and its staleness metrics with torch elementwise
ops inside the actor, and prime-rl masks stale tokens the same way. The peer column is that
torch-eager formula (written here from AReaL's documented formula, not copied) on the same
inputs (bench/staleness/inputs.hpp's closed forms), checked against rlpt's result.
Columns: seconds (median), and rlpt's effective bandwidth as a fraction of the single-thread
copy bandwidth probed in the same run.
"""
import argparse
import sys
from pathlib import Path

import common

versions = common.check_venv()

import torch  # noqa: E402

CURRENT = 20


def inputs(n: int):
    i = torch.arange(n, dtype=torch.int64)
    prompt = (i % 1000) < 100
    versions = torch.where(prompt, torch.tensor(-1), CURRENT - (i * 7) % 8).to(torch.int32)
    mask = ~(prompt | (i % 13 == 0))
    behav = -(i % 1000).to(torch.float32) / 100.0
    cur = -((i * 31) % 1000).to(torch.float32) / 100.0
    return versions, mask, behav, cur


def torch_mask(versions, mask, max_age=3):
    # A trained token stays in the loss iff current - version <= max_age.
    return mask & ((CURRENT - versions) <= max_age)


def torch_prox(behav, cur, versions, mask, v_theta=CURRENT, lag=1, linear=False):
    v_prox = v_theta - lag
    vb = versions.to(torch.float32)
    on_policy = (versions < 0) | (versions >= v_theta)
    alpha = torch.where(on_policy, 0.0, ((v_prox - vb) / (v_theta - vb)).clamp(0.0, 1.0))
    if linear:
        out = torch.log((1 - alpha) * behav.exp() + alpha * cur.exp())
    else:
        out = behav + alpha * (cur - behav)
    return torch.where(mask, out, behav)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=str(common.ROOT / "build" / "staleness"))
    ap.add_argument("--runner", help="path of bench_staleness_runner (default: under --build)")
    ap.add_argument("--n", type=int, default=1 << 22)
    args = ap.parse_args()
    runner = Path(args.runner) if args.runner else Path(args.build) / "bench" / "staleness" / "bench_staleness_runner"
    if not runner.exists():
        sys.exit(f"missing {runner}: cmake --build {args.build} --target bench_staleness_runner")
    n = args.n
    bw = common.bandwidth_probe() * 1e9
    versions_t, mask_t, behav, cur = inputs(n)
    print(f"torch {versions['torch']}; n = {n} tokens; copy bandwidth {bw / 1e9:.1f} GB/s (1 thread)")
    rows = []
    cases = [
        ("mask", "stale-token mask (max_age 3)", 4 + 1 + 1, lambda: torch_mask(versions_t, mask_t)),
        ("prox", "proximal loglinear", 4 + 4 + 4 + 1 + 4, lambda: torch_prox(behav, cur, versions_t, mask_t)),
        ("prox_linear", "proximal linear (prob. space)", 4 + 4 + 4 + 1 + 4,
         lambda: torch_prox(behav, cur, versions_t, mask_t, linear=True)),
    ]
    for op, label, bytes_per_token, fn in cases:
        got = common.run_cpp(runner, [op, n, 20])
        ref = fn()
        if op == "mask":
            want = float(ref.sum())
            ok = got["checksum"] == want
        else:
            want = float(ref.to(torch.float64)[mask_t].sum())
            ok = abs(got["checksum"] - want) <= 1e-5 * abs(want)
        if not ok:
            sys.exit(f"{op}: rlpt checksum {got['checksum']} != torch {want}")
        t_torch = common.timeit(fn, threads=1)
        rows.append({"kernel": label, "rlpt": got["seconds"], "torch_1t": t_torch,
                     "rlpt of copy bw": f"{bytes_per_token * n / got['seconds'] / bw:.2f}"})
    common.print_table(rows)


if __name__ == "__main__":
    main()
