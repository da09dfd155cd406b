"""rlpt::evaluate vs verl's eager torch loss on the same 1M-token inputs, in one run.

    .venv/bin/python bench/peers/objective_verl.py [--build build/objective] [--threads 1 2] [--repeat 10]

The configuration is verl's actor loss with vanilla PPO (clip 0.2, dual clip 3), the low_var_kl
(k3) KL loss at coefficient 0.001 and token-mean aggregation with the global token count:
verl = compute_policy_loss_vanilla + kl_penalty + agg_loss, forward and backward through torch
autograd to d loss / d log_prob; rlpt = compat::verl::actor(...) through objective_runner on the
same float32 arrays. Both sides are timed best-of-N wall time and process CPU time at the same
thread count (CPU time is the fairer figure on a shared machine); the table gives the ratios,
rlpt's bytes moved per second and that rate as a fraction of the copy bandwidth measured in the
same run (by the runner, with its threads), and how far the two losses / gradient sums differ.
"""
import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

import common

B, T = 1024, 1024


def make_inputs(seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    lp = (-1.0 + 0.5 * rng.standard_normal((B, T))).astype(np.float32)
    old = (lp + 0.1 * rng.standard_normal((B, T))).astype(np.float32)
    ref = (lp + 0.2 * rng.standard_normal((B, T))).astype(np.float32)
    adv = rng.standard_normal((B, T)).astype(np.float32)
    lengths = rng.integers(T // 4, T + 1, B)
    mask = (np.arange(T)[None, :] < lengths[:, None]).astype(np.uint8)
    return dict(lp=lp, old=old, ref=ref, adv=adv, mask=mask)


def verl_step(arrays: dict, threads: int, repeat: int) -> tuple[float, float, float, np.ndarray]:
    import torch
    import verl.trainer.ppo.core_algos as algos
    from verl.workers.config import ActorConfig

    torch.set_num_threads(threads)
    t = {k: torch.from_numpy(v) for k, v in arrays.items()}
    mask = t["mask"].bool()
    n_tokens = int(mask.sum())
    cfg = ActorConfig(strategy="fsdp", rollout_n=1, clip_ratio=0.2, ppo_micro_batch_size_per_gpu=1,
                      loss_agg_mode="token-mean")
    cfg.global_batch_info.update(dict(dp_size=1, batch_num_tokens=n_tokens))
    policy_loss = algos.get_policy_loss_fn("vanilla")

    def step():
        lp = t["lp"].clone().requires_grad_(True)
        pg, _ = policy_loss(old_log_prob=t["old"], log_prob=lp, advantages=t["adv"], response_mask=mask,
                            loss_agg_mode="token-mean", config=cfg)
        kld = algos.kl_penalty(lp, t["ref"], "low_var_kl")
        loss = pg + 0.001 * algos.agg_loss(kld, mask, "token-mean", batch_num_tokens=n_tokens)
        loss.backward()
        return loss, lp.grad

    for _ in range(2):
        step()
    wall, cpu = float("inf"), float("inf")
    for _ in range(repeat):
        w0, c0 = time.perf_counter(), time.process_time()
        loss, grad = step()
        cpu = min(cpu, time.process_time() - c0)
        wall = min(wall, time.perf_counter() - w0)
    return wall, cpu, float(loss.detach()), grad.numpy()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--build", default=str(common.ROOT / "build" / "objective"))
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--repeat", type=int, default=10)
    args = parser.parse_args()
    versions = common.check_venv()
    runner = Path(args.build) / "bench" / "objective" / "objective_runner"
    arrays = make_inputs()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, value in arrays.items():
            value.tofile(Path(tmp) / f"{name}.bin")
        for threads in args.threads:
            v_wall, v_cpu, v_loss, v_grad = verl_step(arrays, threads, args.repeat)
            r = common.run_cpp(runner, [tmp, B, T, threads, args.repeat])
            grad_sum = float(v_grad.astype(np.float64).sum())
            rows.append({"threads": threads, "rlpt": r["seconds"], "verl": v_wall, "rlpt_cpu": r["cpu_seconds"],
                         "verl_cpu": v_cpu, "rlpt_GBps": r["bytes"] / r["seconds"] / 1e9, "copy_GBps": r["copy_gbps"],
                         "rlpt_cpu_GBps": r["bytes"] / r["cpu_seconds"] / 1e9, "copy_cpu_GBps": r["copy_cpu_gbps"],
                         "loss_rel_diff": abs(r["loss"] - v_loss) / abs(v_loss),
                         "grad_sum_rel_diff": abs(r["grad_sum"] - grad_sum) / max(abs(grad_sum), 1e-30)})
    print(f"vanilla PPO + low_var_kl (0.001) + token-mean, {B}x{T} padded = {B * T} tokens; "
          f"verl {versions.get('verl')}, torch {versions.get('torch')}, {common.CORES} cores")
    print("threads  rlpt wall  verl wall  ratio | rlpt cpu  verl cpu  ratio | GB/s wall (of copy)  GB/s per CPU s "
          "(of 1-thread copy) | loss diff  grad-sum diff")
    for row in rows:
        print(f"{row['threads']:7d}  {row['rlpt'] * 1e3:7.2f}ms {row['verl'] * 1e3:8.1f}ms {row['verl'] / row['rlpt']:5.1f}x | "
              f"{row['rlpt_cpu'] * 1e3:6.2f}ms {row['verl_cpu'] * 1e3:7.1f}ms {row['verl_cpu'] / row['rlpt_cpu']:5.1f}x | "
              f"{row['rlpt_GBps']:6.2f} ({row['rlpt_GBps'] / row['copy_GBps']:.2f} of {row['copy_GBps']:.1f})  "
              f"{row['rlpt_cpu_GBps']:6.2f} ({row['rlpt_cpu_GBps'] / row['copy_cpu_GBps']:.2f} of {row['copy_cpu_GBps']:.1f}) | "
              f"{row['loss_rel_diff']:9.1e}  {row['grad_sum_rel_diff']:13.1e}")


if __name__ == "__main__":
    main()
