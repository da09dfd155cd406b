# SPDX-License-Identifier: Apache-2.0
"""Fake (meta) kernels and autograd formulas of the torch.ops.rlpt operators, and the Python
functions that call them. The kernels themselves are C++ (rlpt._C, TORCH_LIBRARY "rlpt")."""
import functools

import torch

from . import _C, _spec
from ._errors import Error, call

ops = torch.ops.rlpt

#: Names of the entries of a metrics tensor (rlpt::objective_result, in order).
METRICS = ("loss", "policy_loss", "kl_loss", "entropy_loss", "value_loss", "tokens", "loss_tokens", "seqs",
           "clip_frac_low", "clip_frac_high", "clip_frac_dual", "clamped_frac", "approx_kl", "kl_mean",
           "is_weight_min", "is_weight_mean", "is_weight_max", "rejected_frac", "entropy_mean", "value_clip_frac",
           "nonfinite_tokens", "denominator_error")
if len(METRICS) != _C.num_metrics:
    raise ImportError(f"rlpt._C reports {_C.num_metrics} objective metrics, the package knows {len(METRICS)}: "
                      "rebuild the package")

#: Entries of the mismatch_metrics tensor (rlpt::mismatch_metrics, in order).
MISMATCH = ("tokens", "seqs", "nonfinite_tokens", "k1", "k3", "abs_diff_mean", "abs_diff_max", "prob_abs_diff_mean",
            "prob_abs_diff_max", "prob_abs_diff_std", "pearson_logp", "pearson_prob", "out_of_band", "chi2_token",
            "chi2_seq", "trainer_ppl", "rollout_ppl", "trainer_log_ppl", "rollout_log_ppl", "log_ppl_diff",
            "log_ppl_abs_diff", "log_ppl_diff_max", "log_ppl_diff_min", "ppl_ratio")
if len(MISMATCH) != _C.num_mismatch_metrics:
    raise ImportError(f"rlpt._C reports {_C.num_mismatch_metrics} mismatch metrics, the package knows "
                      f"{len(MISMATCH)}: rebuild the package")

#: Entries of the stats tensor of the outcome estimators.
GROUP_STATS = ("num_degenerate", "frac_degenerate", "num_nonfinite", "batch_std")
#: Entries of the stats tensor of the token estimators (GAE, REINFORCE++, REINFORCE++-baseline).
TOKEN_STATS = ("num_nonfinite_seqs", "whiten_mean", "whiten_inv_std", "whiten_num_nonfinite")


def metrics_dict(metrics, names=METRICS):
    """A metrics / stats tensor as {name: float} (one device sync)."""
    return dict(zip(names, metrics.detach().cpu().tolist()))


# --- fake kernels -------------------------------------------------------------------------------

@torch.library.register_fake("rlpt::logprob_entropy")
def _logprob_fake(logits, tokens, valid, cu_seqlens, sequence, temperature, top_k, top_p, ignore_index, min_p=0.0,
                  min_p_first=True):
    rows = tokens.numel()
    truncated = rows if (top_k > 0 or top_p < 1.0 or min_p > 0.0) else 0
    f32 = torch.float32
    return (logits.new_empty(tokens.shape, dtype=f32), logits.new_empty(tokens.shape, dtype=f32),
            logits.new_empty((rows,), dtype=f32), logits.new_empty((truncated,), dtype=f32),
            logits.new_empty((truncated,), dtype=torch.int64), logits.new_empty(tokens.shape, dtype=torch.bool))


@torch.library.register_fake("rlpt::logprob_entropy_backward")
def _logprob_backward_fake(dlogp, dentropy, logits, tokens, valid, cu_seqlens, logp, entropy, lse, threshold,
                           tie_last, sequence, temperature, top_k, top_p, ignore_index, min_p=0.0, min_p_first=True):
    return torch.empty_like(logits, memory_format=torch.contiguous_format)


def _compute_dtype(t):
    return torch.float64 if t.dtype == torch.float64 else torch.float32


@torch.library.register_fake("rlpt::objective")
def _objective_fake(spec, logp, mask, old_logp, behav_logp, ref_logp, adv, seq_adv, entropy, values, old_values,
                    returns, cu_seqlens, grad_logp, grad_entropy, grad_values, seq_in_denominator=None):
    ref = logp if logp is not None else values
    if ref is None:
        raise ValueError("rlpt::error [rlpt.python.shape]: rlpt objective: pass logp or values")
    ct = _compute_dtype(ref)

    def grad(t, want):
        if want and t is not None:
            return t.new_empty(t.shape)
        return ref.new_empty((0,), dtype=ct)

    return (ref.new_empty((), dtype=ct), grad(logp, grad_logp), grad(entropy, grad_entropy),
            grad(values, grad_values), ref.new_empty((_C.num_metrics,), dtype=torch.float64))


@torch.library.register_fake("rlpt::local_denominators")
@torch.library.register_fake("rlpt::local_is_weights")
def _local_share_fake(spec, logp, mask, old_logp, behav_logp, ref_logp, adv, seq_adv, entropy, values, old_values,
                      returns, cu_seqlens, seq_in_denominator=None):
    return torch.empty((2,), dtype=torch.float64)


@torch.library.register_fake("rlpt::m2po_mask")
def _m2po_mask_fake(old_logp, behav_logp, mask, cu_seqlens, m2_threshold):
    return torch.empty_like(old_logp, dtype=torch.uint8)


@torch.library.register_fake("rlpt::mismatch_metrics")
def _mismatch_metrics_fake(trainer_logp, rollout_logp, mask, cu_seqlens, eps_low, eps_high, log_ratio_clamp,
                           mask_nonfinite):
    return trainer_logp.new_empty((len(MISMATCH),), dtype=torch.float64, device="cpu")


@torch.library.register_fake("rlpt::areal_normalize")
def _areal_normalize_fake(x, mask, mean_level, mean_leave1out, std_level, std_unbiased, eps, group_size):
    return torch.empty_like(x, dtype=torch.float32)


@torch.library.register_fake("rlpt::outcome_advantages")
def _outcome_fake(spec, rewards, group_ids, lengths):
    return (rewards.new_empty(rewards.shape, dtype=torch.float32), torch.empty((4,), dtype=torch.float64),
            rewards.new_empty(rewards.shape, dtype=torch.bool))


@torch.library.register_fake("rlpt::step_returns")
def _step_returns_fake(step_rewards, traj_ids, gamma, mask_nonfinite):
    return step_rewards.new_empty(step_rewards.shape, dtype=torch.float32)


@torch.library.register_fake("rlpt::gigpo")
def _gigpo_fake(episode_scores, episode_ids, step_returns, anchor_ids, mode, step_advantage_w, epsilon,
                mask_nonfinite):
    return (episode_scores.new_empty(episode_scores.shape, dtype=torch.float32),
            torch.empty((2, len(GROUP_STATS)), dtype=torch.float64))


@torch.library.register_fake("rlpt::gae")
def _gae_fake(spec, rewards, values, mask, cu_seqlens, bootstrap):
    f = torch.float32
    return (rewards.new_empty(rewards.shape, dtype=f), rewards.new_empty(rewards.shape, dtype=f),
            torch.empty((4,), dtype=torch.float64))


@torch.library.register_fake("rlpt::reinforce_pp")
def _reinforce_fake(spec, token_rewards, mask, cu_seqlens):
    f = torch.float32
    return (token_rewards.new_empty(token_rewards.shape, dtype=f), token_rewards.new_empty(token_rewards.shape, dtype=f),
            torch.empty((4,), dtype=torch.float64))


@torch.library.register_fake("rlpt::reinforce_pp_baseline")
def _reinforce_baseline_fake(spec, rewards, group_ids, mask, cu_seqlens):
    return rewards.new_empty(mask.shape, dtype=torch.float32), torch.empty((4,), dtype=torch.float64)


@torch.library.register_fake("rlpt::remax")
def _remax_fake(spec, token_rewards, baselines, mask, cu_seqlens):
    f = torch.float32
    return token_rewards.new_empty(token_rewards.shape, dtype=f), token_rewards.new_empty(token_rewards.shape, dtype=f)


if _C.lm_head:
    @torch.library.register_fake("rlpt::lm_head_logprob_entropy")
    def _lm_head_fake(hidden, weight, targets, temperature, ignore_index):
        f32 = torch.float32
        return (hidden.new_empty(targets.shape, dtype=f32), hidden.new_empty(targets.shape, dtype=f32),
                hidden.new_empty((targets.numel(),), dtype=f32))

    @torch.library.register_fake("rlpt::lm_head_logprob_entropy_backward")
    def _lm_head_backward_fake(dlogp, dentropy, hidden, weight, targets, entropy, lse, temperature, ignore_index,
                               grad_hidden, grad_weight):
        gh = torch.empty_like(hidden, memory_format=torch.contiguous_format) if grad_hidden else \
            hidden.new_empty((0, hidden.shape[-1]))
        gw = torch.empty_like(weight, memory_format=torch.contiguous_format) if grad_weight else \
            weight.new_empty((0, weight.shape[-1]))
        return gh, gw


# --- autograd -----------------------------------------------------------------------------------

def _logprob_setup(ctx, inputs, output):
    logits, tokens, valid, cu_seqlens = inputs[:4]
    logp, ent, lse, thr, tie, _scored = output
    ctx.save_for_backward(logits, tokens, valid, cu_seqlens, logp, ent, lse, thr, tie)
    ctx.args = tuple(inputs[4:])  # sequence, temperature, top_k, top_p, ignore_index[, min_p, min_p_first]
    ctx.n_inputs = len(inputs)


def _logprob_backward(ctx, dlogp, dentropy, _dlse, _dthr, _dtie, _dscored):
    logits, tokens, valid, cu_seqlens, logp, ent, lse, thr, tie = ctx.saved_tensors
    if dlogp is None and dentropy is None:
        return (None,) * ctx.n_inputs
    dlogits = ops.logprob_entropy_backward(dlogp, dentropy, logits, tokens, valid, cu_seqlens, logp, ent, lse, thr,
                                           tie, *ctx.args)
    return (dlogits,) + (None,) * (ctx.n_inputs - 1)


torch.library.register_autograd("rlpt::logprob_entropy", _logprob_backward, setup_context=_logprob_setup)


def _lm_head_setup(ctx, inputs, output):
    hidden, weight, targets, temperature, ignore_index = inputs
    _logp, ent, lse = output
    ctx.save_for_backward(hidden, weight, targets, ent, lse)
    ctx.args = (temperature, ignore_index)


def _lm_head_backward(ctx, dlogp, dentropy, _dlse):
    hidden, weight, targets, ent, lse = ctx.saved_tensors
    want_h, want_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
    if (dlogp is None and dentropy is None) or not (want_h or want_w):
        return None, None, None, None, None
    gh, gw = ops.lm_head_logprob_entropy_backward(dlogp, dentropy, hidden, weight, targets, ent, lse, *ctx.args,
                                                  want_h, want_w)
    return (gh if want_h else None), (gw if want_w else None), None, None, None


if _C.lm_head:
    torch.library.register_autograd("rlpt::lm_head_logprob_entropy", _lm_head_backward, setup_context=_lm_head_setup)


def _objective_setup(ctx, inputs, output):
    _loss, g_logp, g_ent, g_val, _metrics = output
    logp, entropy, values = inputs[1], inputs[8], inputs[9]
    want_logp, want_ent, want_val = inputs[13], inputs[14], inputs[15]
    ctx.have = (want_logp and logp is not None, want_ent and entropy is not None, want_val and values is not None)
    ctx.save_for_backward(g_logp, g_ent, g_val)


def _objective_backward(ctx, g_loss, *_unused):
    g_logp, g_ent, g_val = ctx.saved_tensors
    out = [None] * 17
    if g_loss is None:
        return tuple(out)
    for slot, have, g in ((1, ctx.have[0], g_logp), (8, ctx.have[1], g_ent), (9, ctx.have[2], g_val)):
        if have:
            out[slot] = (g * g_loss.to(g.dtype))
    return tuple(out)


torch.library.register_autograd("rlpt::objective", _objective_backward, setup_context=_objective_setup)


# --- Python API ---------------------------------------------------------------------------------

def _min_p_first(min_p_order):
    if min_p_order not in ("first", "last"):
        raise Error("rlpt.logprob.min_p", f"min_p_order is {min_p_order!r}: neither 'first' (vLLM: min-p before "
                    f"top-k/top-p) nor 'last' (SGLang, Hugging Face: after them)")
    return min_p_order == "first"


def logprob_entropy(logits, targets, temperature=1.0, top_k=0, top_p=1.0, ignore_index=-100, min_p=0.0,
                    min_p_order="first"):
    """Per-row log-probability of ``targets`` and entropy of softmax(logits / temperature)
    [top-k / top-p / min-p truncated], no label shift: logits [N, V] with targets [N], or
    [B, T, V] with [B, T]. ``min_p`` keeps tokens with p >= min_p * max p, before top-k/top-p
    (``min_p_order="first"``, vLLM) or after them (``"last"``, SGLang and Hugging Face).
    float32 results whatever the logits' dtype (float32, float64, bfloat16, float16);
    differentiable in ``logits``."""
    out = call(ops.logprob_entropy, logits, targets, None, None, False, float(temperature), int(top_k),
               float(top_p), int(ignore_index), float(min_p), _min_p_first(min_p_order))
    return out[0], out[1]


if _C.lm_head:
    def lm_head_logprob_entropy(hidden, weight, targets, temperature=1.0, ignore_index=-100):
        """Log-probability of ``targets`` and entropy under softmax(hidden @ weight.T / temperature),
        without the [N, V] logits: rlpt's fused lm-head (CPU tensors; the product accumulated in
        float32 whatever the inputs' dtype, never rounded to it). hidden [N, D] with targets [N], or
        [B, T, D] with [B, T] (no label shift), weight [V, D] of hidden's dtype (float32, float64,
        bfloat16, float16). Targets equal to ``ignore_index`` get logp 0. Returns float32 (logp,
        entropy); differentiable in ``hidden`` and ``weight``. Runs on torch's intra-op threads
        (torch.get_num_threads()). Present where the package was built with Eigen
        (``rlpt._C.lm_head``)."""
        out = call(ops.lm_head_logprob_entropy, hidden, weight, targets, float(temperature), int(ignore_index))
        return out[0], out[1]

    def lm_head_isa(want=""):
        """The build of the fused lm-head's kernels in use: "avx2" (rlpt/_lm_head_avx2.so, chosen
        where the CPU has AVX2 and FMA) or "baseline". ``want`` = "baseline" or "avx2" forces one
        (rlpt.python.bad_option where the AVX2 build is unavailable), "auto" restores the choice."""
        return call(_C.lm_head_isa, str(want))


def sequence_logprob_entropy(logits, tokens, valid=None, cu_seqlens=None, temperature=1.0, top_k=0, top_p=1.0,
                             ignore_index=-100, return_scored=False, min_p=0.0, min_p_order="first"):
    """Log-probability of every token of each sequence under the model's logits at the previous
    position (rlpt's convention: logp[b, t] belongs to token t, from logits row t - 1; the first
    token of a sequence gets 0). Padded logits [B, T, V] with tokens [B, T] (``valid`` marks real
    tokens), or packed [N, V] with [N] and ``cu_seqlens`` [B + 1]. Truncation as in
    :func:`logprob_entropy`. Returns float32 (logp, entropy[, scored])."""
    out = call(ops.logprob_entropy, logits, tokens, valid, cu_seqlens, True, float(temperature), int(top_k),
               float(top_p), int(ignore_index), float(min_p), _min_p_first(min_p_order))
    return (out[0], out[1], out[5]) if return_scored else (out[0], out[1])


_INPUTS = ("old_logp", "behav_logp", "ref_logp", "adv", "seq_adv", "values", "old_values", "returns", "cu_seqlens",
           "seq_in_denominator")


def _det(t):
    return t.detach() if isinstance(t, torch.Tensor) else t


def policy_loss(objective, logp=None, mask=None, *, old_logp=None, behav_logp=None, ref_logp=None, adv=None,
                seq_adv=None, entropy=None, values=None, old_values=None, returns=None, cu_seqlens=None,
                seq_in_denominator=None):
    """Loss of ``objective`` (an rlpt.Objective) and its metrics tensor (rlpt.METRICS order;
    rlpt.metrics_dict converts it). Differentiable in ``logp``, ``entropy`` and ``values``; every
    other input is a constant. Per-token tensors are [B, T] (mask: bool or integer, nonzero = the
    token counts), or packed [N] with ``cu_seqlens``; ``seq_adv`` is one advantage per sequence.
    ``seq_in_denominator`` [B] (bool or integer): sequences at 0 keep their terms in the loss but
    are left out of its denominators (zero-variance groups: the estimators' return_nondegenerate)."""
    spec = objective.spec if hasattr(objective, "spec") else str(objective)
    grad_on = torch.is_grad_enabled()

    def needs(t):
        return bool(grad_on and t is not None and t.requires_grad)

    loss, _gl, _ge, _gv, metrics = call(
        ops.objective, spec, logp, mask, _det(old_logp), _det(behav_logp), _det(ref_logp), _det(adv), _det(seq_adv),
        entropy, values, _det(old_values), _det(returns), cu_seqlens, needs(logp), needs(entropy), needs(values),
        _det(seq_in_denominator))
    return loss, metrics


def _local_share(op, name, objective, logp, mask, inputs):
    unknown = set(inputs) - set(_INPUTS) - {"entropy"}
    if unknown:
        raise TypeError(f"{name}: unknown input(s) {sorted(unknown)}")
    g = {k: _det(inputs.get(k)) for k in _INPUTS + ("entropy",)}
    spec = objective.spec if hasattr(objective, "spec") else str(objective)
    return call(op, spec, _det(logp), mask, g["old_logp"], g["behav_logp"], g["ref_logp"], g["adv"], g["seq_adv"],
                g["entropy"], g["values"], g["old_values"], g["returns"], g["cu_seqlens"], g["seq_in_denominator"])


def local_denominators(objective, logp=None, mask=None, **inputs):
    """What this micro-batch adds to the step's denominators: a float64 tensor [tokens, seqs].
    Sum over the micro-batches (and all-reduce over ranks), then objective.with_denominators()."""
    return _local_share(ops.local_denominators, "local_denominators", objective, logp, mask, inputs)


def local_is_weights(objective, logp=None, mask=None, **inputs):
    """What this micro-batch adds to the mean that batch-normalised importance weights divide by
    (verl's rollout_is_batch_normalize): a float64 tensor [sum, count]. Sum over the micro-batches
    (and all-reduce over ranks) and pass sum / count as rollout_is_batch_mean (verl_actor) or
    correction.weight.batch_mean (custom)."""
    return _local_share(ops.local_is_weights, "local_is_weights", objective, logp, mask, inputs)


def m2po_mask(old_logp, behav_logp, mask=None, *, m2_threshold, cu_seqlens=None):
    """M2PO's loss mask (AReaL's m2_threshold, applied per micro-batch as AReaL does): the valid
    tokens with the largest (old_logp - behav_logp)^2 dropped until the mean of the rest is below
    m2_threshold (all but one when no number of them is). old_logp is the proximal policy's,
    behav_logp the rollout engine's. Returns a bool tensor shaped as the log-probs; pass it as the
    mask of policy_loss. Runs on the host (CUDA tensors are copied)."""
    out = call(ops.m2po_mask, _det(old_logp), _det(behav_logp), mask, cu_seqlens, float(m2_threshold))
    return out.bool()


def mismatch_metrics(trainer_logp, rollout_logp, mask=None, *, eps_low=0.2, eps_high=0.2, log_ratio_clamp=20.0,
                     nonfinite="raise", cu_seqlens=None):
    """How far the trainer's log-probs of the sampled tokens are from the rollout engine's
    (rlpt::logprob_mismatch): {name: float} with k1, k3, abs_diff_mean/max, prob_abs_diff_*,
    pearson_logp/prob, out_of_band (share of exp(trainer - rollout) outside [1 - eps_low,
    1 + eps_high]), chi2_token/seq, the perplexities and their log difference and ratio, and the
    token, row and non-finite counts. [B, T] with a mask (nonzero = counts; None: every token), or
    packed [N] with cu_seqlens. nonfinite: "raise" (rlpt.logprob.nonfinite naming the token) or
    "mask" (left out, counted). Runs on the host (CUDA tensors are copied); fp64 sums."""
    if nonfinite not in ("raise", "mask"):
        raise ValueError(f"nonfinite = {nonfinite!r}: expected 'raise' or 'mask'")
    out = call(ops.mismatch_metrics, _det(trainer_logp), _det(rollout_logp), mask, cu_seqlens, float(eps_low),
               float(eps_high), float(log_ratio_clamp), nonfinite == "mask")
    return metrics_dict(out, MISMATCH)


def areal_normalize(x, mask=None, config=None, **fields):
    """AReaL's Normalization(NormConfig)(x, loss_mask) (reward_norm on [B] rewards, adv_norm on [B, T]
    advantages with their loss mask): ``config`` a NormConfig (or anything with its fields), or the
    fields as keywords (mean_level, mean_leave1out, std_level, std_unbiased, eps, group_size), with
    NormConfig's defaults. Levels "batch", "group" or None; a group is group_size consecutive rows.
    Computed in float64 on the host, returned as float32 on x's device; the batch is this call's
    (AReaL all-reduces batch-level sums over ranks)."""
    names = ("mean_level", "mean_leave1out", "std_level", "std_unbiased", "eps", "group_size")
    unknown = sorted(set(fields) - set(names))
    if unknown:
        raise TypeError(f"areal_normalize: unknown NormConfig field(s) {unknown}")
    values = dict(mean_level="batch", mean_leave1out=False, std_level="batch", std_unbiased=True, eps=1e-5,
                  group_size=1)
    if config is not None:
        values.update({k: getattr(config, k) for k in names if hasattr(config, k)})
    values.update(fields)
    level = {k: "none" if values[k] is None else str(values[k]) for k in ("mean_level", "std_level")}
    return call(ops.areal_normalize, _det(x), mask, level["mean_level"], bool(values["mean_leave1out"]),
                level["std_level"], bool(values["std_unbiased"]), float(values["eps"]), int(values["group_size"]))


class Objective:
    """An rlpt objective as an option string (rlpt::objective built by rlpt::compat presets or
    field by field). Construct with a preset:

    - ``Objective.verl_actor(loss_mode=..., clip_ratio_low=..., loss_agg_mode=..., use_kl_loss=...,
      rollout_is=..., ...)``: verl's ActorConfig / PolicyLossConfig / rollout correction names;
    - ``Objective.verl_critic(cliprange_value=..., loss_agg_mode=...)``;
    - ``Objective.trl_grpo(loss_type=..., epsilon=..., beta=..., ...)``: GRPOConfig names;
    - ``Objective.trl_rloo(epsilon=..., epsilon_high=...)``: RLOOConfig names;
    - ``Objective.openrlhf_policy(clip_eps_low=..., policy_loss_type=..., ...)`` and
      ``Objective.openrlhf_value(clip_eps=...)``;
    - ``Objective.custom(policy="ppo_clip", **{"policy.eps_high": 0.28, "kl.coef": 1e-3, ...})``.

    Common options of every preset: ``nonfinite`` ("raise" or "mask"), ``global_tokens`` /
    ``global_seqs`` (the step's denominators), ``policy_agg.mode`` etc. Unknown options raise
    rlpt.Error (rlpt.python.bad_option) here, when the objective is made."""

    def __init__(self, spec):
        self.spec = spec
        self.description = call(_C.describe_objective, spec)

    @classmethod
    def preset(cls, preset, **options):
        return cls(_spec.make(preset=preset, **options))

    @classmethod
    def verl_actor(cls, **options):
        return cls.preset("verl_actor", **options)

    @classmethod
    def verl_critic(cls, **options):
        return cls.preset("verl_critic", **options)

    @classmethod
    def trl_grpo(cls, **options):
        return cls.preset("trl_grpo", **options)

    @classmethod
    def trl_rloo(cls, **options):
        return cls.preset("trl_rloo", **options)

    @classmethod
    def openrlhf_policy(cls, **options):
        return cls.preset("openrlhf_policy", **options)

    @classmethod
    def openrlhf_value(cls, **options):
        return cls.preset("openrlhf_value", **options)

    @classmethod
    def areal_actor(cls, rejection_sampling=None, **options):
        """AReaL's ppo_actor_loss_fn / sapo_loss_fn from PPOActorConfig's field names, with its
        defaults (rejection_sampling None, use_decoupled_loss False).
        rejection_sampling: None or False (off), True (RejectionSamplingConfig's defaults), a dict
        of its fields, or the config object itself. Pass rlpt's old_logp as AReaL's
        proximal_logprobs and behav_logp as its old_logprobs."""
        # PPOActorConfig fields that act before the loss, on its inputs: say where they are in rlpt.
        if options.get("m2_threshold") is not None:
            raise ValueError("rlpt areal_actor: m2_threshold (M2PO) selects tokens over the whole micro-batch; make "
                             "that mask with rlpt.m2po_mask(old_logp, behav_logp, mask, m2_threshold=...) and pass "
                             "it as policy_loss's mask")
        options.pop("m2_threshold", None)
        if options.pop("prox_logp_method", "recompute") not in ("recompute", "metrics"):
            raise ValueError("rlpt areal_actor: prox_logp_method approximates the proximal log-probs, an input: "
                             "compute them (C++: rlpt::compat::areal::proximal, staleness block) and pass them as "
                             "old_logp; the loss is the same")
        options["rejection_sampling"] = not (rejection_sampling is None or rejection_sampling is False)
        if options["rejection_sampling"] and rejection_sampling is not True:
            fields = ("level", "action", "metric", "agg", "upper", "lower")
            if isinstance(rejection_sampling, dict):
                unknown = sorted(set(rejection_sampling) - set(fields))
                if unknown:
                    raise ValueError(f"rlpt areal_actor: unknown rejection_sampling field(s) {unknown}")
                items = rejection_sampling.items()
            else:
                items = ((f, getattr(rejection_sampling, f)) for f in fields)
            for key, value in items:
                options[f"rejection_sampling.{key}"] = "none" if value is None else value
        return cls.preset("areal_actor", **options)

    @classmethod
    def custom(cls, **options):
        return cls.preset("custom", **options)

    def with_options(self, **options):
        """A copy with more options (later keys must not repeat earlier ones)."""
        return Objective(_spec.merge(self.spec, **options))

    def with_denominators(self, tokens=None, seqs=None):
        """A copy whose aggregation uses the step's global token / sequence counts."""
        opts = {}
        if tokens is not None:
            opts["global_tokens"] = float(tokens)
        if seqs is not None:
            opts["global_seqs"] = float(seqs)
        return self.with_options(**opts)

    def __repr__(self):
        return f"rlpt.Objective({self.description}: {self.spec})"


@functools.lru_cache(maxsize=512)
def _cached(preset, items):
    return Objective.preset(preset, **dict(items))


def cached_objective(preset, **options):
    """Objective.preset(preset, **options), memoised (options must be hashable): for adapters that
    build the objective from a framework's arguments on every call."""
    return _cached(preset, tuple(sorted(options.items())))


# --- advantages ---------------------------------------------------------------------------------

def group_ids(ids, device=None):
    """Group ids as int64 (a tensor of integers is used as is; strings or other hashables, such as
    verl's uid arrays, are numbered in order of appearance)."""
    if isinstance(ids, torch.Tensor) and not ids.is_floating_point():
        return ids.to(torch.int64)
    seen = {}
    out = [seen.setdefault(x if not hasattr(x, "item") else x.item(), len(seen)) for x in list(ids)]
    return torch.tensor(out, dtype=torch.int64, device=device)


def _outcome(estimator, rewards, ids, lengths=None, preset="rlpt", return_nondegenerate=False, **options):
    spec = _spec.make(estimator=estimator, preset=preset, **options)
    adv, stats, nondegenerate = call(ops.outcome_advantages, spec, rewards, group_ids(ids), lengths)
    return (adv, stats, nondegenerate) if return_nondegenerate else (adv, stats)


def grpo_advantages(rewards, ids, preset="rlpt", **options):
    """GRPO advantages (float32 [B]) and group stats (rlpt.GROUP_STATS). ``preset``: rlpt, verl,
    trl, openrlhf, openrlhf_dr_grpo, areal, slime; options: scale ("group", "batch", "none"),
    unbiased, epsilon, std_floor, single ("raw", "zero", "raise"), on_nonfinite ("raise", "mask").
    Every outcome estimator takes ``return_nondegenerate=True`` to return a third tensor, bool [B]:
    False where the sequence's group is degenerate (zero variance, or fewer than two counted
    rewards), for policy_loss's ``seq_in_denominator``."""
    return _outcome("grpo", rewards, ids, preset=preset, **options)


def rloo_advantages(rewards, ids, preset="rlpt", **options):
    """RLOO advantages. ``preset``: rlpt, verl, verl_vectorized, trl, openrlhf; options: single,
    on_nonfinite, batch_normalize, batch_epsilon."""
    return _outcome("rloo", rewards, ids, preset=preset, **options)


def opo_advantages(rewards, ids, lengths, preset="rlpt", **options):
    """OPO (length-weighted group baseline); ``lengths`` int64 [B] valid tokens per sequence."""
    return _outcome("opo", rewards, ids, lengths=lengths, preset=preset, **options)


def gpg_advantages(rewards, ids, preset="rlpt", **options):
    """GPG advantages; options: f_norm, single, on_nonfinite."""
    return _outcome("gpg", rewards, ids, preset=preset, **options)


def passk_advantages(rewards, ids, preset="rlpt", **options):
    """verl's pass@k advantages; options: scale_by_std, epsilon, single, on_nonfinite."""
    return _outcome("passk", rewards, ids, preset=preset, **options)


def _hashable(x):
    """An observation as a hashable value: numpy arrays and lists by content, dicts by sorted items."""
    if hasattr(x, "tolist") and not isinstance(x, (str, bytes)):
        x = x.tolist()
    if isinstance(x, (list, tuple)):
        return tuple(_hashable(e) for e in x)
    if isinstance(x, dict):
        return tuple(sorted((k, _hashable(v)) for k, v in x.items()))
    return x


def _masks_nonfinite(on_nonfinite):
    """on_nonfinite ("raise" or "mask") as the ops' mask_nonfinite flag."""
    if on_nonfinite not in ("raise", "mask"):
        raise Error("rlpt.advantage.bad_option", f"on_nonfinite = {on_nonfinite!r}: it is \"raise\" or \"mask\"")
    return on_nonfinite == "mask"


def step_returns(step_rewards, traj_ids, gamma=0.95, on_nonfinite="raise"):
    """Discounted step returns G_t = r_t + gamma G_{t+1} along each trajectory (verl-agent's
    compute_step_discounted_returns): one row per step, ``traj_ids`` naming each row's trajectory
    (integers or hashables), its steps in row order. float32 [N]."""
    return call(ops.step_returns, step_rewards, group_ids(traj_ids), float(gamma), _masks_nonfinite(on_nonfinite))


def similar_anchor_ids(anchor_obs, episode_ids, threshold):
    """Anchor ids that group text observations by similarity instead of equality (verl-agent's
    enable_similarity): within each task (``episode_ids``), in row order, an observation joins the
    first group whose first observation it matches with a difflib.SequenceMatcher ratio >= ``threshold``
    (in (0, 1)), else it starts a group. int64 [N], one id per (task, group)."""
    import difflib

    if not 0.0 < threshold < 1.0:
        raise Error("rlpt.advantage.bad_option", f"similarity threshold {threshold} is not in (0, 1) (1 is equality: "
                    "pass the observations without a threshold)")
    obs = list(anchor_obs)
    tasks = group_ids(episode_ids).tolist()
    if len(tasks) != len(obs):
        raise Error("rlpt.python.shape", f"anchor_obs has {len(obs)} rows, episode_ids {len(tasks)}")
    reps = {}  # task -> [(a matcher holding the group's first observation as seq2, group id)]
    out = []
    next_id = 0
    for row, (o, t) in enumerate(zip(obs, tasks)):
        if not isinstance(o, str):
            raise Error("rlpt.python.dtype", f"anchor_obs[{row}] is a {type(o).__name__}: similarity grouping "
                        "compares text observations")
        groups = reps.setdefault(t, [])
        for matcher, gid in groups:
            matcher.set_seq1(o)  # seq2 (the group's first observation) keeps its index
            if matcher.ratio() >= threshold:
                out.append(gid)
                break
        else:
            groups.append((difflib.SequenceMatcher(None, o, o), next_id))
            out.append(next_id)
            next_id += 1
    return torch.tensor(out, dtype=torch.int64)


def gigpo_advantages(episode_scores, episode_ids, step_returns, anchor_obs, mode="mean_norm", step_advantage_w=1.0,
                     epsilon=1e-6, on_nonfinite="raise", similarity_threshold=None):
    """GiGPO advantages (verl-agent's compute_gigpo_outcome_advantage), one per step row: the episode
    level over ``episode_ids`` (the rows of one task) plus ``step_advantage_w`` times the step level over
    the rows of one task whose ``anchor_obs`` (the observation the step started from: strings, arrays,
    anything hashable by content; or integer ids) are equal, or, with ``similarity_threshold``, text
    observations that are similar (:func:`similar_anchor_ids`). ``mode``: "mean_norm" (verl-agent's
    default) or "mean_std_norm". Returns (advantages float32 [N], stats float64 [2, 4]: the episode and
    the step level's rlpt.GROUP_STATS)."""
    if similarity_threshold is not None:
        anchors = similar_anchor_ids(anchor_obs, episode_ids, similarity_threshold)
    elif isinstance(anchor_obs, torch.Tensor) and not anchor_obs.is_floating_point():
        anchors = anchor_obs.to(torch.int64)
    else:
        anchors = group_ids([_hashable(o) for o in anchor_obs])
    return call(ops.gigpo, episode_scores, group_ids(episode_ids), step_returns, anchors, str(mode),
                float(step_advantage_w), float(epsilon), _masks_nonfinite(on_nonfinite))


def gae(rewards, values, mask=None, cu_seqlens=None, bootstrap=None, gamma=1.0, lam=1.0, preset="rlpt", **options):
    """GAE advantages and returns per token (float32) and stats (rlpt.TOKEN_STATS). ``preset``:
    rlpt, verl (skip masked tokens, whiten), openrlhf, slime, areal; options: masked ("skip", "zero",
    "reset"), whiten ("none", "verl", "openrlhf", "areal"), on_nonfinite."""
    spec = _spec.make(preset=preset, gamma=float(gamma), lam=float(lam), **options)
    return call(ops.gae, spec, rewards, values, mask, cu_seqlens, bootstrap)


def reinforce_pp(token_rewards, mask=None, cu_seqlens=None, gamma=1.0, preset="rlpt", **options):
    """REINFORCE++: discounted returns, whitened. Returns (advantages, returns, stats)."""
    spec = _spec.make(preset=preset, gamma=float(gamma), **options)
    return call(ops.reinforce_pp, spec, token_rewards, mask, cu_seqlens)


def reinforce_pp_baseline(rewards, ids, mask, cu_seqlens=None, preset="rlpt", **options):
    """REINFORCE++-baseline: R - group mean, broadcast onto the valid tokens, whitened. Returns
    (advantages per token, stats)."""
    spec = _spec.make(preset=preset, **options)
    return call(ops.reinforce_pp_baseline, spec, rewards, group_ids(ids), mask, cu_seqlens)


def remax(token_rewards, baselines, mask=None, cu_seqlens=None, preset="rlpt", **options):
    """ReMax: reward-to-go minus the greedy rollout's reward. Returns (advantages, returns)."""
    spec = _spec.make(preset=preset, **options)
    return call(ops.remax, spec, token_rewards, baselines, mask, cu_seqlens)
