#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The replacements docs/torch.md lists, checked against the frameworks' own functions.

Each rlpt_torch op runs next to the verl / TRL function it replaces on the same tensors:

  verl core_algos.compute_grpo_outcome_advantage      rlpt_torch.grpo_advantages(preset="verl")
  verl core_algos.compute_rloo_outcome_advantage      rlpt_torch.rloo_advantages(preset="verl")
  verl torch_functional.logprobs_from_logits,
       entropy_from_logits (logits / temperature)     rlpt_torch.sequence_logprob_entropy
  TRL  utils.selective_log_softmax, entropy_from_logits   (the same)
  verl compute_policy_loss_vanilla + kl_penalty
       + agg_loss (the actor loss of losses.ppo_loss) rlpt_torch.policy_loss(Objective.verl_actor)

Needs an interpreter with verl and TRL (the project's .venv, whose torch is a PyPI wheel): build
the extension with -DRLPT_TORCH_PYTHON=.venv/bin/python. Exits 77 (CTest: skipped) when verl or
TRL cannot be imported, as with Debian's /usr/bin/python3.
"""
import sys

import torch

try:
    import numpy as np
    import verl.trainer.ppo.core_algos as algos
    import verl.utils.torch_functional as verl_F
    from trl.trainer import utils as trl_utils
    from verl.trainer.config import RolloutCorrectionConfig
    from verl.workers.config import ActorConfig
    from verl.workers.config.actor import PolicyLossConfig
except ImportError as e:  # the peers are optional
    print(f"check_peers: skipped ({e}); run it with an interpreter that has verl and trl")
    sys.exit(77)

import rlpt_torch as rt

F64 = torch.float64


def close(name, got, want, rtol, atol):
    got, want = torch.as_tensor(got.detach(), dtype=F64), torch.as_tensor(want.detach(), dtype=F64)
    err = (got - want).abs().max()
    ok = bool(((got - want).abs() <= atol + rtol * want.abs()).all())
    print(f"  {'ok ' if ok else 'BAD'} {name}: max |diff| {float(err):.2e}")
    if not ok:
        raise AssertionError(name)


def main():
    gen = torch.Generator().manual_seed(5)
    B, T, V, G, temp = 24, 16, 50, 4, 0.8
    logits = torch.randn(B, T, V, generator=gen, dtype=F64) * 3
    tokens = torch.randint(0, V, (B, T), generator=gen)
    resp = 10  # the last 10 tokens are the response
    lengths = torch.randint(3, resp + 1, (B,), generator=gen)
    mask = torch.arange(resp)[None, :] < lengths[:, None]  # response_mask [B, resp]
    ids = np.repeat(np.arange(B // G), G)
    rewards = torch.rand(B, generator=gen).float()

    print("verl advantages")
    tlr = torch.zeros(B, resp)
    tlr[torch.arange(B), lengths - 1] = rewards  # outcome reward on the last response token
    want, _ = algos.compute_grpo_outcome_advantage(tlr, mask.float(), ids)
    adv, _ = rt.grpo_advantages(rewards, torch.from_numpy(ids), preset="verl")
    close("compute_grpo_outcome_advantage", adv[:, None] * mask, want, 1e-6, 1e-6)
    want, _ = algos.compute_rloo_outcome_advantage(tlr, mask.float(), ids)
    adv_rloo, _ = rt.rloo_advantages(rewards, torch.from_numpy(ids), preset="verl")
    close("compute_rloo_outcome_advantage", adv_rloo[:, None] * mask, want, 1e-6, 1e-6)

    print("logprobs and entropy (float32 logits, response tokens, temperature 0.8)")
    # Both sides compute in float32 (the peers' entropy subtracts two sums of ~|logits|), so they
    # agree to float32 precision: 1e-5 relative + 1e-5.
    lg = logits.float()
    logp, ent = rt.sequence_logprob_entropy(lg, tokens, temperature=temp)
    shifted = lg[:, -resp - 1:-1] / temp  # verl/TRL: logits of the previous position, divided by T
    labels = tokens[:, -resp:]
    close("verl logprobs_from_logits", logp[:, -resp:], verl_F.logprobs_from_logits(shifted, labels), 1e-5, 1e-5)
    close("verl entropy_from_logits", ent[:, -resp:], verl_F.entropy_from_logits(shifted), 1e-5, 1e-5)
    close("TRL selective_log_softmax", logp[:, -resp:], trl_utils.selective_log_softmax(shifted, labels), 1e-5, 1e-5)
    close("TRL entropy_from_logits", ent[:, -resp:], trl_utils.entropy_from_logits(shifted), 1e-5, 1e-5)

    print("verl actor loss (float64): compute_policy_loss_vanilla + kl_penalty + agg_loss")
    lp = (torch.rand(B, resp, generator=gen, dtype=F64) * -3).requires_grad_()
    old = lp.detach() + 0.5 * torch.randn(B, resp, generator=gen, dtype=F64)
    ref = lp.detach() + 0.5 * torch.randn(B, resp, generator=gen, dtype=F64)
    entropy = (torch.rand(B, resp, generator=gen, dtype=F64) * 2).requires_grad_()
    seq_adv = adv.double()
    for agg in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum"):
        cfg = ActorConfig(strategy="fsdp", rollout_n=1, clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=3.0,
                          ppo_micro_batch_size_per_gpu=1, loss_agg_mode=agg,
                          policy_loss=PolicyLossConfig(loss_mode="vanilla",
                                                       rollout_correction=RolloutCorrectionConfig()))
        pg, _ = algos.compute_policy_loss_vanilla(old_log_prob=old, log_prob=lp, advantages=seq_adv[:, None] * mask,
                                                  response_mask=mask, loss_agg_mode=agg, config=cfg)
        kl = algos.agg_loss(algos.kl_penalty(lp, ref, "low_var_kl"), mask, agg)
        h = algos.agg_loss(entropy, mask, agg)
        want = pg + 0.01 * kl - 0.005 * h
        w_lp, w_h = torch.autograd.grad(want, (lp, entropy))
        obj = rt.Objective.verl_actor(clip_ratio_low=0.2, clip_ratio_high=0.28, loss_agg_mode=agg, use_kl_loss=True,
                                      kl_loss_coef=0.01, kl_loss_type="low_var_kl", entropy_coeff=0.005)
        loss, _ = rt.policy_loss(obj, lp, mask, entropy=entropy, old_logp=old, ref_logp=ref, seq_adv=seq_adv)
        g_lp, g_h = torch.autograd.grad(loss, (lp, entropy))
        close(f"{agg}: loss", loss, want, 1e-12, 0.0)
        close(f"{agg}: d loss / d log_prob", g_lp, w_lp, 1e-10, 1e-15)
        close(f"{agg}: d loss / d entropy", g_h, w_h, 1e-10, 1e-15)
    print("check_peers: every replacement matches its peer")
    return 0


if __name__ == "__main__":
    sys.exit(main())
