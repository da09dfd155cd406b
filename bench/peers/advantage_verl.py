"""rlpt host advantages vs verl's own functions on CPU torch, same inputs, same run.

    .venv/bin/python bench/peers/advantage_verl.py [--build build/advantage] [--threads N] [--quick]

verl 0.9.1 functions timed (verl.trainer.ppo.core_algos): compute_gae_advantage_return (GAE +
masked whitening), compute_reinforce_plus_plus_outcome_advantage, compute_grpo_outcome_advantage
(the per-sample Python loop) and compute_grpo_vectorized_outcome_advantage. rlpt runs the matching
presets through build/.../bench_advantage_runner on the very arrays verl gets (written to a temp
dir), and its outputs are checked against verl's before any time is printed. Shapes follow the
issue (B in {1024, 8192} x T in {1024, 8192}, 65,536 sequences in groups of 4-64); --quick drops the
8192 x 8192 case (verl needs minutes and ~6 GB there).

Columns: seconds (median), the ratio verl / rlpt, rlpt's effective bandwidth (17 B per token slot
for GAE: rewards, values, mask in; advantages, returns out) and its fraction of the copy bandwidth
measured by the runner in the same run with the same thread count.

--cpu-time: for a shared, time-sliced machine. One thread on both sides, every time is process
CPU time (median), and the bandwidth fraction is bytes per CPU second over a single-thread memcpy's
bytes per CPU second, both measured by the runner in the same run.
"""
import statistics
import time
import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

import common

versions = common.check_venv()

import torch  # noqa: E402
import verl.trainer.ppo.core_algos as ca  # noqa: E402


def token_inputs(B, T, seed):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(T // 2, T + 1, B)
    mask = (np.arange(T)[None, :] < lengths[:, None]).astype(np.uint8)
    rewards = (0.01 * rng.standard_normal((B, T))).astype(np.float32)
    rewards[np.arange(B), lengths - 1] += rng.standard_normal(B).astype(np.float32)
    values = rng.standard_normal((B, T)).astype(np.float32)
    return rewards, values, mask


def check(name, got, want, mask=None, tol=1e-4):
    """rlpt vs verl at valid tokens: relative to the output's scale (verl accumulates in fp32)."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    if mask is not None:
        got, want = got[mask.astype(bool)], want[mask.astype(bool)]
    err = np.max(np.abs(got - want)) / max(1.0, np.max(np.abs(want)))
    if not err <= tol:
        sys.exit(f"{name}: rlpt and verl disagree (max scaled error {err:.3g})")
    return err


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--build", default=str(common.ROOT / "build" / "advantage"))
    parser.add_argument("--threads", type=int, default=common.CORES)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--cpu-time", action="store_true", help="1 thread, process CPU time (shared machines)")
    args = parser.parse_args()
    if args.cpu_time:
        args.threads = 1
    runner = Path(args.build) / "bench" / "advantage" / "bench_advantage_runner"
    if not runner.exists():
        sys.exit(f"{runner} not found: cmake --build {args.build} --target bench_advantage_runner")
    print(f"verl {versions['verl']}, torch {versions['torch']}, threads {args.threads}"
          + (", process CPU time" if args.cpu_time else ", wall time"))
    torch.set_num_threads(args.threads)

    def timed(fn, repeat, warmup=1):
        if not args.cpu_time:
            return common.timeit(fn, repeat=repeat, warmup=warmup, threads=args.threads)
        for _ in range(warmup):
            fn()
        t = []
        for _ in range(repeat):
            start = time.process_time()
            fn()
            t.append(time.process_time() - start)
        return statistics.median(t)

    def pick(rl, wall, cpu):
        return rl[cpu] if args.cpu_time else rl[wall]

    def frac(rl, wall_key, seconds_key_cpu):
        if not args.cpu_time:
            return rl[wall_key] / rl["copy_gbps"], rl[wall_key], rl["copy_gbps"]
        gbps = rl["bytes"] / rl[seconds_key_cpu] / 1e9
        return gbps / rl["copy_gbps_cpu"], gbps, rl["copy_gbps_cpu"]

    rows = []
    shapes = [(1024, 1024), (1024, 8192), (8192, 1024)] + ([] if args.quick else [(8192, 8192)])
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        for B, T in shapes:
            rewards, values, mask = token_inputs(B, T, seed=B + T)
            rewards.tofile(d / "rewards.f32")
            values.tofile(d / "values.f32")
            mask.tofile(d / "mask.u8")
            r, v, m = torch.from_numpy(rewards), torch.from_numpy(values), torch.from_numpy(mask).float()
            repeat = 3 if B * T >= 8192 * 8192 else 5
            gamma, lam = 1.0, 0.95
            rl = common.run_cpp(runner, ["gae", d, B, T, gamma, lam, args.threads, 7])
            adv, ret = ca.compute_gae_advantage_return(r, v, m, gamma, lam)
            err = check(f"gae {B}x{T} advantages", np.fromfile(d / "rlpt_adv.f32", np.float32).reshape(B, T), adv, mask)
            check(f"gae {B}x{T} returns", np.fromfile(d / "rlpt_ret.f32", np.float32).reshape(B, T), ret, mask)
            verl_t = timed(lambda: ca.compute_gae_advantage_return(r, v, m, gamma, lam), repeat)
            f, gbps, copy = frac(rl, "gbps", "cpu_seconds")
            f_raw = frac(rl, "gbps_unwhitened", "cpu_seconds_unwhitened")[0]
            rows.append({"case": "gae+whiten", "B": B, "T": T, "rlpt": pick(rl, "seconds", "cpu_seconds"),
                         "verl": verl_t, "rlpt GB/s": f"{gbps:.2f}", "copy GB/s": f"{copy:.2f}", "of copy": f"{f:.0%}",
                         "of copy, no whitening": f"{f_raw:.0%}", "max err": f"{err:.1e}"})

            rl = common.run_cpp(runner, ["rpp", d, B, T, gamma, args.threads, 7])
            cfg = type("cfg", (), {"gamma": gamma})()
            adv, ret = ca.compute_reinforce_plus_plus_outcome_advantage(r, m, config=cfg)
            err = check(f"reinforce++ {B}x{T}", np.fromfile(d / "rlpt_adv.f32", np.float32).reshape(B, T), adv, mask)
            verl_t = timed(lambda: ca.compute_reinforce_plus_plus_outcome_advantage(r, m, config=cfg), repeat)
            f, gbps, copy = frac(rl, "gbps", "cpu_seconds")
            rows.append({"case": "reinforce++", "B": B, "T": T, "rlpt": pick(rl, "seconds", "cpu_seconds"),
                         "verl": verl_t, "rlpt GB/s": f"{gbps:.2f}", "copy GB/s": f"{copy:.2f}", "of copy": f"{f:.0%}",
                         "of copy, no whitening": "-", "max err": f"{err:.1e}"})
            print(f"  done {B}x{T}", flush=True)

        grpo_rows = []
        N = 65536
        for G in (4, 16, 64):
            rng = np.random.default_rng(G)
            ids = np.repeat(rng.permutation(N // G), G).astype(np.int64)
            rewards = (rng.random(N) < 0.4).astype(np.float32)
            rewards.tofile(d / "rewards.f32")
            ids.tofile(d / "ids.i64")
            tok, m = torch.from_numpy(rewards)[:, None].clone(), torch.ones(N, 1)
            rl = common.run_cpp(runner, ["grpo", d, N, args.threads, 7])
            adv, _ = ca.compute_grpo_outcome_advantage(tok.clone(), m, ids)
            err = check(f"grpo G={G}", np.fromfile(d / "rlpt_adv.f32", np.float32), adv[:, 0], tol=1e-5)
            loop = timed(lambda: ca.compute_grpo_outcome_advantage(tok.clone(), m, ids), 3)
            vec = timed(lambda: ca.compute_grpo_vectorized_outcome_advantage(tok.clone(), m, ids), 7)
            grpo_rows.append({"case": "grpo", "N": N, "group": G, "rlpt": pick(rl, "seconds", "cpu_seconds"),
                              "verl_loop": loop, "verl_vectorized": vec,
                              "rlpt without grouping": f"{pick(rl, 'seconds_advantages_only', 'cpu_seconds_advantages_only'):.3g}",
                              "max err": f"{err:.1e}"})

    common.print_table(rows)
    print()
    common.print_table(grpo_rows)


if __name__ == "__main__":
    main()
