# SPDX-License-Identifier: Apache-2.0
"""rlpt inside a PyTorch trainer: advantages, the policy objective and the logprob/entropy kernel.

Every function reads and writes the tensors' own memory (CPU tensors; no copies of contiguous
inputs). The differentiable ones are ``torch.autograd.Function``\\ s:

    logp, ent = rlpt_torch.sequence_logprob_entropy(logits, tokens)          # [B,T,V] -> [B,T]
    adv, _ = rlpt_torch.grpo_advantages(rewards, group_ids, preset="verl")   # [B]
    obj = rlpt_torch.Objective.verl_actor(clip_ratio_high=0.28, use_kl_loss=True)
    loss, metrics = rlpt_torch.policy_loss(obj, logp.double(), mask, old_logp=old,
                                           ref_logp=ref, seq_adv=adv.double(), entropy=ent.double())
    loss.backward()

Errors raise ``rlpt_torch.Error`` (a ValueError) whose message starts with rlpt's stable id,
e.g. ``rlpt::error [rlpt.objective.missing_input]: ...``. See docs/torch.md.
"""
import torch  # loads libtorch before the extension that links against it

from . import _C

Error = _C.Error
Objective = _C.Objective

__all__ = ["Error", "Objective", "grpo_advantages", "rloo_advantages", "gae", "logprob_entropy",
           "sequence_logprob_entropy", "policy_loss", "local_denominators", "LogprobEntropy", "PolicyLoss"]


# --- advantages (no gradient: inputs of the loss) ---------------------------------------------

def grpo_advantages(rewards, group_ids, preset="verl", **overrides):
    """GRPO advantages, one per sequence (float32). ``preset``: rlpt, verl, trl, openrlhf, areal,
    slime; ``overrides``: scale ("group", "batch", "none"), unbiased, epsilon, std_floor, single
    ("raw", "zero", "raise"), on_nonfinite ("raise", "mask"). Returns (advantages, group stats)."""
    return _C.grpo_advantages(rewards, group_ids, preset, **overrides)


def rloo_advantages(rewards, group_ids, preset="verl", **overrides):
    """RLOO advantages (float32). ``preset``: rlpt, verl, verl_vectorized, trl, openrlhf;
    ``overrides``: single, on_nonfinite, batch_normalize, batch_epsilon."""
    return _C.rloo_advantages(rewards, group_ids, preset, **overrides)


def gae(rewards, values, mask=None, cu_seqlens=None, gamma=1.0, lam=1.0, preset="verl", **overrides):
    """GAE advantages and returns per token (float32 [B, T], or packed [N] with cu_seqlens).
    ``preset``: rlpt, verl (skip masked tokens, whiten), openrlhf, slime, areal; ``overrides``:
    masked ("skip", "zero", "reset"), whiten (bool). Returns (advantages, returns, info)."""
    return _C.gae(rewards, values, mask, cu_seqlens, gamma, lam, preset, **overrides)


# --- logprob / entropy --------------------------------------------------------------------------

class LogprobEntropy(torch.autograd.Function):
    """(logp, entropy) of targets under softmax(logits / temperature) [top-k / top-p truncated],
    in float32 whatever the logits' dtype; backward writes d logits in the logits' dtype."""

    @staticmethod
    def forward(ctx, logits, tokens, valid, cu_seqlens, sequence, temperature, top_k, top_p, ignore_index):
        logp, ent, lse, thr, tie, scored, _ = _C.logprob_forward(
            logits, tokens, valid, cu_seqlens, sequence, temperature, top_k, top_p, ignore_index)
        ctx.save_for_backward(logits, tokens, ent, lse, thr, tie)
        ctx.valid, ctx.cu_seqlens = valid, cu_seqlens
        ctx.args = (sequence, temperature, top_k, top_p, ignore_index)
        ctx.mark_non_differentiable(scored)
        ctx.set_materialize_grads(False)  # an unused output costs no backward work
        return logp, ent, scored

    @staticmethod
    def backward(ctx, dlogp, dentropy, _dscored):
        logits, tokens, ent, lse, thr, tie = ctx.saved_tensors
        if dlogp is None and dentropy is None:
            return (None,) * 9
        sequence, temperature, top_k, top_p, ignore_index = ctx.args
        dlogits = _C.logprob_backward(logits, tokens, ctx.valid, ctx.cu_seqlens, sequence, dlogp, dentropy, ent,
                                      lse, thr, tie, temperature, top_k, top_p, ignore_index)
        return (dlogits,) + (None,) * 8


def logprob_entropy(logits, targets, temperature=1.0, top_k=0, top_p=1.0, ignore_index=-100):
    """Per-row logprob of ``targets`` [N] and entropy of ``logits`` [N, V] (no label shift)."""
    logp, ent, _ = LogprobEntropy.apply(logits, targets, None, None, False, float(temperature), int(top_k),
                                        float(top_p), int(ignore_index))
    return logp, ent


def sequence_logprob_entropy(logits, tokens, valid=None, cu_seqlens=None, temperature=1.0, top_k=0, top_p=1.0,
                             ignore_index=-100, return_scored=False):
    """Logprob of every token of each sequence from the model's logits at the previous position:
    logits [B, T, V] with tokens [B, T] (``valid`` [B, T] marks real tokens, any padding side), or
    packed logits [N, V] with tokens [N] and ``cu_seqlens`` [B + 1]. logp[b, t] belongs to token t
    (the first token of a sequence gets 0 and is not scored), as verl's log_probs[:, -response_length:]
    after the shift. Returns float32 (logp, entropy[, scored])."""
    logp, ent, scored = LogprobEntropy.apply(logits, tokens, valid, cu_seqlens, True, float(temperature),
                                             int(top_k), float(top_p), int(ignore_index))
    return (logp, ent, scored) if return_scored else (logp, ent)


# --- policy objective -------------------------------------------------------------------------

class PolicyLoss(torch.autograd.Function):
    """rlpt.evaluate: loss and its gradients with respect to logp, entropy and values, computed in
    one pass in the forward; the backward scales them by the upstream gradient."""

    @staticmethod
    def forward(ctx, objective, logp, entropy, values, mask, inputs, metrics_out):
        need = ctx.needs_input_grad
        loss, g_logp, g_ent, g_val, metrics = _C.objective_forward(
            objective, logp, mask, bool(need[1]), bool(need[2]), bool(need[3]),
            entropy=entropy, values=values, **inputs)
        ctx.save_for_backward(*(g for g in (g_logp, g_ent, g_val) if g is not None))
        ctx.have = (g_logp is not None, g_ent is not None, g_val is not None)
        metrics_out.update(metrics)
        return loss

    @staticmethod
    def backward(ctx, grad_loss):
        saved = iter(ctx.saved_tensors)
        grads = [next(saved) * grad_loss if h else None for h in ctx.have]
        return (None, grads[0], grads[1], grads[2], None, None, None)


_INPUTS = ("old_logp", "behav_logp", "ref_logp", "adv", "seq_adv", "old_values", "returns", "cu_seqlens")


def _detached(kw):
    unknown = set(kw) - set(_INPUTS)
    if unknown:
        raise TypeError(f"policy_loss: unknown input(s) {sorted(unknown)}; known: {', '.join(_INPUTS)}")
    return {k: (v.detach() if isinstance(v, torch.Tensor) else v) for k, v in kw.items() if v is not None}


def policy_loss(objective, logp, mask, entropy=None, values=None, **inputs):
    """Loss of ``objective`` (an rlpt_torch.Objective preset) and its metrics dict. Differentiable
    in ``logp``, ``entropy`` and ``values`` (float32 or float64, all the same dtype); the other
    inputs (old_logp, behav_logp, ref_logp, adv [per token] or seq_adv [per sequence], old_values,
    returns) are constants. Per-token tensors are [B, T] (mask: bool or uint8), or packed [N] with
    cu_seqlens [B + 1]."""
    metrics = {}
    loss = PolicyLoss.apply(objective, logp, entropy, values, mask, _detached(inputs), metrics)
    return loss, metrics


def local_denominators(objective, logp, mask, **inputs):
    """What this micro-batch adds to the step's denominators ({"tokens", "seqs"}); sum over the
    micro-batches (and all-reduce over ranks), then ``objective.with_denominators(tokens, seqs)``."""
    return _C.local_denominators(objective, logp.detach(), mask, **_detached(inputs))
