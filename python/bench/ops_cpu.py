#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""CPU time of each rlpt op against the framework function it replaces (verl 0.9.1's eager torch
code), on the same inputs in one run. Prints one line per op: rlpt and verl CPU milliseconds per
call (median of --repeat rounds, each round alternating the two) and the ratio verl / rlpt.

    .venv/bin/python python/bench/ops_cpu.py [--threads 1] [--repeat 7] [--quick] [--only lm_head,...]

Run it on an idle machine (docs/performance.md records the figures with this command).
"""
import argparse
import statistics
import time

import numpy as np
import torch

import rlpt
import rlpt.verl as rv
from verl.trainer.config import RolloutCorrectionConfig
from verl.trainer.ppo import core_algos as ca
from verl.utils import seqlen_balancing as sb
from verl.utils import torch_functional as vf
from verl.workers.config import ActorConfig
from verl.workers.config.actor import PolicyLossConfig


def cpu_ms(fn, calls):
    t0 = time.process_time()
    for _ in range(calls):
        fn()
    return (time.process_time() - t0) * 1e3 / calls


SECTIONS = ("advantages", "losses", "balancing", "openrlhf", "logprob", "lm_head")


def compare(name, ours, theirs, calls, repeat, peer="verl"):
    ours(), theirs()  # warm-up
    a, b = [], []
    for _ in range(repeat):
        a.append(cpu_ms(ours, calls))
        b.append(cpu_ms(theirs, calls))
    ma, mb = statistics.median(a), statistics.median(b)
    print(f"{name:44s} rlpt {ma:9.3f} ms   {peer} {mb:9.3f} ms   {peer}/rlpt {mb / ma:6.2f}x", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--quick", action="store_true", help="small sizes, 1 round (a smoke run)")
    ap.add_argument("--only", default="", help="comma-separated sections: " + ", ".join(SECTIONS))
    a = ap.parse_args()
    only = {x for x in a.only.split(",") if x}
    if only - set(SECTIONS):
        ap.error(f"unknown sections {sorted(only - set(SECTIONS))}; choose from {', '.join(SECTIONS)}")

    def on(section):
        return not only or section in only

    torch.set_num_threads(a.threads)
    g = torch.Generator().manual_seed(0)
    q = a.quick
    repeat = 1 if q else a.repeat
    print(f"torch {torch.__version__}, {a.threads} thread(s), CPU time per call")

    if on("advantages"):
        g.manual_seed(0)  # each section draws the same inputs with or without --only
        # advantages: GRPO over B sequences in groups of 8 (verl's uid strings), GAE over [B, T]
        B, T = (64, 64) if q else (1024, 512)
        tlr = torch.zeros(B, T)
        lengths = torch.randint(1, T + 1, (B,), generator=g)
        mask = (torch.arange(T)[None, :] < lengths[:, None]).to(torch.int64)
        tlr[torch.arange(B), lengths - 1] = torch.rand(B, generator=g)
        uids = np.array([f"uid-{i // 8}" for i in range(B)], dtype=object)
        compare(f"grpo advantages [B={B}, groups of 8]", lambda: rv.compute_grpo_outcome_advantage(tlr, mask, uids),
                lambda: ca.compute_grpo_outcome_advantage(tlr.clone(), mask, uids), 3 if q else 10, repeat)
        values = torch.randn(B, T, generator=g)
        compare(f"gae + whitening [{B}, {T}]", lambda: rv.compute_gae_advantage_return(tlr, values, mask, 1.0, 0.95),
                lambda: ca.compute_gae_advantage_return(tlr, values, mask, 1.0, 0.95), 2 if q else 5, repeat)

    if on("losses"):
        g.manual_seed(1)  # each section draws the same inputs with or without --only
        # policy loss (vanilla PPO, clip-higher, dual clip) forward + backward, float32 [B, T]
        B, T = (8, 128) if q else (64, 2048)
        lens = torch.randint(1, T + 1, (B,), generator=g)
        m = torch.arange(T)[None, :] < lens[:, None]
        lp = torch.rand(B, T, generator=g) * -3
        old = lp + 0.2 * torch.randn(B, T, generator=g)
        adv = torch.randn(B, 1, generator=g).expand(B, T) * m
        cfg = ActorConfig(strategy="fsdp", rollout_n=1, clip_ratio_low=0.2, clip_ratio_high=0.28,
                          ppo_micro_batch_size_per_gpu=1, loss_agg_mode="token-mean",
                          policy_loss=PolicyLossConfig(loss_mode="vanilla", rollout_correction=RolloutCorrectionConfig()))

        def loss_bwd(fn):
            def run():
                x = lp.clone().requires_grad_()
                loss, _ = fn(old_log_prob=old, log_prob=x, advantages=adv, response_mask=m, loss_agg_mode="token-mean",
                             config=cfg)
                loss.backward()
            return run

        compare(f"ppo policy loss fwd+bwd [{B}, {T}]", loss_bwd(rv.compute_policy_loss_vanilla),
                loss_bwd(ca.compute_policy_loss_vanilla), 3 if q else 10, repeat)

        ref = lp + 0.2 * torch.randn(B, T, generator=g)

        def kl_bwd(ours):
            def run():
                x = lp.clone().requires_grad_()
                loss = rv.kl_loss(x, ref, m, "low_var_kl") if ours else ca.agg_loss(ca.kl_penalty(x, ref, "low_var_kl"),
                                                                                      m, "token-mean")
                loss.backward()
            return run

        compare(f"low_var_kl loss fwd+bwd [{B}, {T}]", kl_bwd(True), kl_bwd(False), 3 if q else 10, repeat)

    if on("balancing"):
        g.manual_seed(2)  # each section draws the same inputs with or without --only
        # sequence balancing: Karmarkar-Karp over DP ranks with equal counts on the workloads, given as
        # the int64 tensor _balance_batch passes (calculate_workload of the lengths: verl's sort then
        # compares 0-d tensors) and as the list of ints rearrange_micro_batches passes
        verl_gsbp = rv._verl_balancing("get_seqlen_balanced_partitions")
        for n, k in ((64, 8),) if q else ((1024, 8), (8192, 64)):
            w = sb.calculate_workload(torch.exp(torch.randn(n, generator=g) + 6).clamp(1, 32768).long())
            for form, x in (("tensor", w), ("list", w.tolist())):
                assert rv.get_seqlen_balanced_partitions(x, k, True) == verl_gsbp(x, k, True)
                compare(f"seqlen balanced partitions [N={n}, k={k}] {form}",
                        lambda: rv.get_seqlen_balanced_partitions(x, k, True), lambda: verl_gsbp(x, k, True),
                        2 if q else (10 if n < 4096 else 2), repeat)
        # PrefixGrouper's balancing: groups of 8 consecutive uids (verl's uid strings) kept on one rank
        verl_ggbp = rv._verl_balancing("get_group_balanced_partitions")
        n, k = (64, 2) if q else (8192, 64)
        seqlens = torch.exp(torch.randn(n, generator=g) + 6).clamp(1, 32768).long().tolist()
        uid_list = [f"uid-{i // 8}" for i in range(n)]
        assert rv.get_group_balanced_partitions(seqlens, uid_list, k) == verl_ggbp(seqlens, uid_list, k)
        compare(f"group balanced partitions [N={n}, k={k}]", lambda: rv.get_group_balanced_partitions(seqlens, uid_list, k),
                lambda: verl_ggbp(seqlens, uid_list, k), 2, repeat)

    if on("openrlhf"):
        g.manual_seed(3)  # each section draws the same inputs with or without --only
        # OpenRLHF's dynamic batching (experience maker, replay buffer): the first-fit micro-batch count
        # for max_tokens_per_gpu = 16384, then Karmarkar-Karp into that many micro-batches on the
        # samples' total lengths (lists of ints, as OpenRLHF passes them)
        try:
            import rlpt.openrlhf as ro
        except ImportError:
            ro = None
        if ro is not None:
            o_min_mbs = ro._openrlhf_balancing("get_minimum_num_micro_batch_size")
            o_gsbp = ro._openrlhf_balancing("get_seqlen_balanced_partitions")
            for n in (64,) if q else (1024, 8192):
                lens = (torch.exp(torch.randn(n, generator=g) + 7).clamp(1, 16384).long()).tolist()
                mbs = o_min_mbs(lens, 16384, 1, 1)
                assert ro.get_minimum_num_micro_batch_size(lens, 16384, 1, 1) == mbs
                assert ro.get_seqlen_balanced_partitions(lens, mbs, False) == o_gsbp(lens, mbs, False)
                compare(f"openrlhf micro-batch count [N={n}, {mbs}]",
                        lambda: ro.get_minimum_num_micro_batch_size(lens, 16384, 1, 1),
                        lambda: o_min_mbs(lens, 16384, 1, 1), 2 if q else 10, repeat, peer="openrlhf")
                compare(f"openrlhf balanced partitions [N={n}, k={mbs}]",
                        lambda: ro.get_seqlen_balanced_partitions(lens, mbs, False), lambda: o_gsbp(lens, mbs, False),
                        2 if q else (10 if n < 4096 else 2), repeat, peer="openrlhf")

    if on("logprob"):
        g.manual_seed(4)  # each section draws the same inputs with or without --only
        # logprob + entropy from logits, forward + backward (float32 and bfloat16 logits)
        N, V = (256, 4096) if q else (2048, 32768)
        for dtype in (torch.float32, torch.bfloat16):
            logits = (torch.randn(N, V, generator=g) * 2).to(dtype)
            labels = torch.randint(0, V, (N,), generator=g)
            up = torch.randn(N, generator=g)

            def lp_ours():
                x = logits.clone().requires_grad_()
                lpv, ent = rv.logprobs_and_entropy(x, labels)
                ((lpv + 0.01 * ent) * up).sum().backward()

            def lp_theirs():
                x = logits.clone().requires_grad_()
                lpv = vf.logprobs_from_logits(x, labels)
                ent = vf.entropy_from_logits(x)
                ((lpv + 0.01 * ent) * up).sum().backward()

            compare(f"logprob+entropy fwd+bwd [{N}, {V}] {str(dtype)[6:]}", lp_ours, lp_theirs, 1 if q else 2, repeat)

    if on("lm_head"):
        g.manual_seed(5)  # each section draws the same inputs with or without --only
        # fused lm-head: hidden [N, D] x head [V, D] -> logprob + entropy, forward + backward to both,
        # against verl's FusedLinearForPPO (use_fused_kernels, torch backend: chunks of 512 tokens)
        if rlpt._C.lm_head:
            verl_fused_linear = rv._verl_fused_linear()  # verl's own class, patched or not
            N, D, V = (64, 64, 4096) if q else (512, 512, 32768)
            for dtype in (torch.float32, torch.bfloat16):
                hid = (torch.randn(N, D, generator=g) * 0.05).to(dtype)
                head = (torch.randn(V, D, generator=g) * 0.05).to(dtype)
                labels = torch.randint(0, V, (N,), generator=g)
                up = torch.randn(N, generator=g)

                def lm_head(fn):
                    def run():
                        h, w = hid.clone().requires_grad_(), head.clone().requires_grad_()
                        lpv, ent = fn(h, w)
                        ((lpv + 0.01 * ent.float()) * up).sum().backward()
                    return run

                # the build this CPU runs, and the baseline build that CPUs without AVX2 + FMA get
                builds = [rlpt.lm_head_isa()] + (["baseline"] if rlpt.lm_head_isa() != "baseline" else [])
                try:
                    for build in builds:
                        rlpt.lm_head_isa(build)
                        compare(f"fused lm-head fwd+bwd [{N}, {D}] x [{V}] {str(dtype)[6:]} ({build})",
                                lm_head(lambda h, w: rlpt.lm_head_logprob_entropy(h, w, labels)),
                                lm_head(lambda h, w: verl_fused_linear()(h, w, labels)), 1, repeat)
                finally:
                    rlpt.lm_head_isa("auto")

    print("copies made by the rlpt ops:", rlpt.copy_stats() or "none")


if __name__ == "__main__":
    main()
