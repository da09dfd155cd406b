# SPDX-License-Identifier: Apache-2.0
"""rlpt inside OpenRLHF (0.10-0.11.2): drop-ins for openrlhf.models.loss.PolicyLoss and ValueLoss (same
constructor arguments, same forward() arguments and return values), the KL loss term the actor
builds from compute_approx_kl, and the advantage computations of the experience maker.

PolicyLoss takes either release's constructor: 0.11.2's is_correction_* arguments (forward returns
five values, is_filter_ratio last) or 0.10-0.11.1's enable_vllm_is_correction,
vllm_is_truncated_threshold and vllm_is_correction_type (four values). Given neither, it follows
the installed openrlhf (RLPT_OPENRLHF_VERSION overrides it; 0.11.2's form without openrlhf).

    from rlpt.openrlhf import PolicyLoss, ValueLoss     # instead of openrlhf.models.loss
    rlpt.openrlhf.patch()                               # or: swap them in OpenRLHF's own modules

and of openrlhf.utils.seqlen_balancing's get_seqlen_balanced_partitions and
get_minimum_num_micro_batch_size (dynamic batching: the same micro-batches, item for item).

Differences on purpose (docs/python.md): an all-masked micro-batch gives loss 0 (OpenRLHF: NaN);
a group of one under group_norm / rloo raises rlpt.Error (OpenRLHF: NaN); outputs at masked
tokens of GAE / returns are 0.
"""
import importlib
import os
from importlib import metadata

import torch

import rlpt

from ._ops import cached_objective, metrics_dict
from ._rollout import exact_workloads, kk_partitions, plan_microbatches


def _batch_opts(dp_size, batch_num_tokens, global_batch_size):
    opts = {"dp_size": int(dp_size)}
    if batch_num_tokens is not None:
        opts["batch_num_tokens"] = float(batch_num_tokens)
    if global_batch_size is not None:
        opts["global_batch_size"] = float(global_batch_size)
    return opts


def _masked_mean(x, mask):
    """OpenRLHF's masked_mean over every element (the plain mean without a mask)."""
    return x.mean() if mask is None else (x * mask).sum() / mask.sum()


# 0.10-0.11.1's vllm_is_correction_type as 0.11.2's (is_correction_level, is_correction_mode), both
# gated on the ratio: tis clamps the token weight to the band, icepop drops tokens outside it and
# seq-mask-tis rows whose geometric-mean ratio is outside it; survivors keep the token weight.
_VLLM_IS_TYPES = {"tis": ("token", "clip"), "icepop": ("token", "mask"), "seq-mask-tis": ("seq", "mask")}


def _installed_returns():
    """How many values PolicyLoss.forward returns in the OpenRLHF this process follows: 0.11.2 added
    is_filter_ratio."""
    version = os.environ.get("RLPT_OPENRLHF_VERSION")
    if not version:
        try:
            version = metadata.version("openrlhf")
        except metadata.PackageNotFoundError:
            return 5
    try:
        release = tuple(int(x) for x in version.split("+")[0].split(".")[:3])
    except ValueError as e:
        raise rlpt.Error("rlpt.objective.compat",
                         f"PolicyLoss: cannot read OpenRLHF version {version!r} (RLPT_OPENRLHF_VERSION or the "
                         "installed openrlhf); expected a release such as 0.11.2") from e
    return 5 if release >= (0, 11, 2) else 4


def _legacy_correction(enable, threshold, kind):
    """0.10-0.11.1's correction arguments as 0.11.2's keyword arguments."""
    if kind not in _VLLM_IS_TYPES:
        raise rlpt.Error("rlpt.objective.compat",
                         f"PolicyLoss: vllm_is_correction_type = {kind!r}; expected one of {sorted(_VLLM_IS_TYPES)}")
    if not enable:
        return {"is_correction_level": "off"}
    if threshold is None or len(threshold) != 2:
        raise rlpt.Error("rlpt.objective.compat",
                         "PolicyLoss: enable_vllm_is_correction needs vllm_is_truncated_threshold = [low, high], got "
                         f"{threshold!r}")
    level, mode = _VLLM_IS_TYPES[kind]
    return {"is_correction_level": level, "is_correction_mode": mode, "is_correction_gating": "ratio",
            "is_correction_threshold": (float(threshold[0]), float(threshold[1]))}


class PolicyLoss(torch.nn.Module):
    """openrlhf.models.loss.PolicyLoss computed by rlpt."""

    def __init__(self, clip_eps_low=0.2, clip_eps_high=0.2, dual_clip=None, token_level_loss=True,
                 policy_loss_type="ppo", is_correction_level=None, is_correction_mode=None,
                 is_correction_gating=None, is_correction_threshold=None, enable_vllm_is_correction=None,
                 vllm_is_truncated_threshold=None, vllm_is_correction_type=None):
        super().__init__()
        if dual_clip is not None and dual_clip <= 1.0:
            raise rlpt.Error("rlpt.objective.bad_option", f"dual_clip must be > 1.0, got {dual_clip}")
        current = {k: v for k, v in (("is_correction_level", is_correction_level),
                                     ("is_correction_mode", is_correction_mode),
                                     ("is_correction_gating", is_correction_gating),
                                     ("is_correction_threshold", is_correction_threshold)) if v is not None}
        legacy = [k for k, v in (("enable_vllm_is_correction", enable_vllm_is_correction),
                                 ("vllm_is_truncated_threshold", vllm_is_truncated_threshold),
                                 ("vllm_is_correction_type", vllm_is_correction_type)) if v is not None]
        if current and legacy:
            raise rlpt.Error("rlpt.objective.compat",
                             f"PolicyLoss: {sorted(current)} (OpenRLHF 0.11.2) and {legacy} (0.10-0.11.1) are two "
                             "releases' spellings of the rollout correction; pass one")
        self._returns = 4 if legacy else 5 if current else _installed_returns()
        if legacy or self._returns == 4:
            current = _legacy_correction(bool(enable_vllm_is_correction), vllm_is_truncated_threshold,
                                         "tis" if vllm_is_correction_type is None else vllm_is_correction_type)
        is_correction_level = current.get("is_correction_level", "off")
        is_correction_mode = current.get("is_correction_mode", "mask")
        is_correction_gating = current.get("is_correction_gating", "ratio")
        is_correction_threshold = current.get("is_correction_threshold", (0.5, 5.0))
        self.policy_loss_type = policy_loss_type
        self.is_correction_level = is_correction_level
        # OpenRLHF's gspo with a correction level takes its sequence ratio against the rollout
        # log-probs and applies no other correction: rlpt's gspo with those as old_logp.
        self._gspo_rollout = policy_loss_type == "gspo" and is_correction_level != "off"
        low, high = is_correction_threshold
        self._opts = dict(clip_eps_low=float(clip_eps_low), clip_eps_high=float(clip_eps_high),
                          dual_clip=None if dual_clip is None else float(dual_clip),
                          token_level_loss=bool(token_level_loss), policy_loss_type=policy_loss_type,
                          is_correction_level="off" if self._gspo_rollout else is_correction_level,
                          is_correction_mode=is_correction_mode,
                          is_correction_gating=is_correction_gating, is_correction_low=float(low),
                          is_correction_high=float(high))
        self._cache = {}
        self._objective(1, None, None)  # validates the configuration now

    def _objective(self, dp_size, batch_num_tokens, global_batch_size):
        key = (dp_size, batch_num_tokens, global_batch_size)
        obj = self._cache.get(key)
        if obj is None:
            opts = dict(self._opts, **_batch_opts(dp_size, batch_num_tokens, global_batch_size))
            obj = self._cache[key] = rlpt.Objective.openrlhf_policy(**opts)
        return obj

    def forward(self, log_probs, old_log_probs, advantages, action_mask=None, rollout_log_probs=None, dp_size=1,
                batch_num_tokens=None, global_batch_size=None):
        obj = self._objective(dp_size, batch_num_tokens, global_batch_size)
        if self.is_correction_level != "off" and rollout_log_probs is None:
            raise rlpt.Error("rlpt.objective.missing_input",
                             f"PolicyLoss: is_correction_level = {self.is_correction_level!r} needs rollout_log_probs")
        dev = log_probs.device
        if self._gspo_rollout:
            loss, m = rlpt.policy_loss(obj, log_probs, action_mask, old_logp=rollout_log_probs, adv=advantages)
            d = metrics_dict(m)
            ppo_kl = _masked_mean(old_log_probs - log_probs.detach(), action_mask)  # against the old policy
            return (loss, torch.tensor(d["clip_frac_low"] + d["clip_frac_high"], device=dev), ppo_kl, None,
                    None)[:self._returns]
        behav = rollout_log_probs if self.is_correction_level != "off" else None
        loss, m = rlpt.policy_loss(obj, log_probs, action_mask, old_logp=old_log_probs, behav_logp=behav,
                                   adv=advantages)
        d = metrics_dict(m)
        clip_ratio = torch.tensor(d["clip_frac_low"] + d["clip_frac_high"], device=dev)
        ppo_kl = torch.tensor(d["approx_kl"], device=dev)
        vllm_kl = is_filter_ratio = None
        if behav is not None:
            vllm_kl = _masked_mean(rollout_log_probs - old_log_probs, action_mask)
            is_filter_ratio = self._filter_ratio(old_log_probs, rollout_log_probs, action_mask)
        return (loss, clip_ratio, ppo_kl, vllm_kl, is_filter_ratio)[:self._returns]


    def _filter_ratio(self, old, rollout, mask):
        """OpenRLHF's is_filter_ratio: the share of units (tokens, or rows at seq level) whose gated
        statistic is outside the band, clamped ones included. A metric: rlpt's rejected_frac counts
        rejected tokens only, so this is computed from the inputs as OpenRLHF defines it."""
        o = self._opts
        low, high, seq = o["is_correction_low"], o["is_correction_high"], self.is_correction_level == "seq"
        with torch.no_grad():
            if o["is_correction_gating"] == "ratio":
                stat = old - rollout
            else:
                p, q = rollout.exp().clamp(1e-6, 1 - 1e-6), old.exp().clamp(1e-6, 1 - 1e-6)
                stat = (p - q).abs() if o["is_correction_gating"] == "tv" else \
                    p * (p / q).log() + (1 - p) * ((1 - p) / (1 - q)).log()
            if seq:
                m = torch.ones_like(stat) if mask is None else mask.to(stat.dtype)
                stat = (stat * m).sum(-1) / m.sum(-1)
            if o["is_correction_gating"] == "ratio":
                stat = stat.exp()
            filtered = ~((stat >= low) & (stat <= high))  # NaN (a row with no token) counts as filtered
            return filtered.float().mean() if seq else _masked_mean(filtered.float(), mask)


class ValueLoss(torch.nn.Module):
    """openrlhf.models.loss.ValueLoss computed by rlpt."""

    def __init__(self, clip_eps=None, token_level_loss=True):
        super().__init__()
        self.clip_eps = clip_eps
        self.token_level_loss = token_level_loss

    def forward(self, values, old_values, returns, action_mask=None, dp_size=1, batch_num_tokens=None,
                global_batch_size=None):
        obj = cached_objective("openrlhf_value", clip_eps=None if self.clip_eps is None else float(self.clip_eps),
                               token_level_loss=bool(self.token_level_loss),
                               **_batch_opts(dp_size, batch_num_tokens, global_batch_size))
        loss, _ = rlpt.policy_loss(obj, None, action_mask, values=values, old_values=old_values, returns=returns)
        return loss


def kl_loss(log_probs, log_probs_base, action_mask, kl_estimator="k1", unbiased_gradient=False, log_probs_old=None,
            token_level_loss=True, dp_size=1, batch_num_tokens=None, global_batch_size=None):
    """The actor's KL loss: aggregate_loss(compute_approx_kl(log_probs, log_probs_base, log_probs_old,
    kl_estimator, unbiased_gradient), action_mask, ...) (before the KL coefficient)."""
    opts = {"policy": "none", "kl.openrlhf": kl_estimator, "kl.openrlhf_unbiased": bool(unbiased_gradient),
            "kl.coef": 1.0, "agg.openrlhf_token_level": bool(token_level_loss), "agg.dp_size": int(dp_size)}
    if batch_num_tokens is not None:
        opts["agg.batch_num_tokens"] = float(batch_num_tokens)
    if global_batch_size is not None:
        opts["agg.global_batch_size"] = float(global_batch_size)
    obj = cached_objective("custom", **opts)
    old = log_probs_old if unbiased_gradient else None
    if unbiased_gradient and old is None:
        old = log_probs.detach()  # OpenRLHF: weight 1 without old log-probs
    loss, _ = rlpt.policy_loss(obj, log_probs, action_mask, ref_logp=log_probs_base, old_logp=old)
    return loss


# --- advantages ----------------------------------------------------------------------------------

def shape_rewards(rewards, n_samples_per_prompt, estimator):
    """The baseline step of compute_advantages_and_returns on rewards ordered by prompt (groups of
    n_samples_per_prompt consecutive samples): rloo, reinforce_baseline, dr_grpo, group_norm;
    other estimators return the rewards unchanged."""
    ids = torch.arange(rewards.numel(), device=rewards.device) // int(n_samples_per_prompt)
    r = rewards.reshape(-1).float()
    if estimator == "rloo":
        adv, _ = rlpt.rloo_advantages(r, ids, preset="openrlhf")
    elif estimator in ("reinforce_baseline", "dr_grpo"):
        adv, _ = rlpt.grpo_advantages(r, ids, preset="openrlhf_dr_grpo")
    elif estimator == "group_norm":
        adv, _ = rlpt.grpo_advantages(r, ids, preset="openrlhf")
    else:
        return rewards
    return adv.to(rewards.dtype).view(rewards.shape)


def get_advantages_and_returns(values, rewards, action_mask, gamma, lambd):
    """The experience maker's GAE (no whitening; values and rewards at masked tokens count as 0):
    (advantages, returns), 0 at masked tokens."""
    adv, ret, _ = rlpt.gae(rewards, values, action_mask, gamma=float(gamma), lam=float(lambd), preset="openrlhf",
                           whiten="none")
    return adv.to(rewards.dtype), ret.to(rewards.dtype)


def get_cumulative_returns(rewards, action_mask, gamma):
    """The experience maker's REINFORCE returns (masked tokens count as reward 0)."""
    _adv, ret, _ = rlpt.reinforce_pp(rewards, action_mask, gamma=float(gamma), preset="openrlhf", whiten="none")
    return ret.to(rewards.dtype)


# --- sequence balancing (openrlhf.utils.seqlen_balancing) ---------------------------------------


def _openrlhf_balancing(name):
    """OpenRLHF's own seqlen_balancing.<name>, patched or not (the module registered under its name:
    the installed package's, or a checkout's that its tests load)."""
    sb = importlib.import_module("openrlhf.utils.seqlen_balancing")
    for (mod, attr), original in _saved.items():
        if mod is sb and attr == name:
            return original
    return getattr(sb, name)


def get_seqlen_balanced_partitions(seqlen_list, k_partitions, equal_size):
    """openrlhf.utils.seqlen_balancing.get_seqlen_balanced_partitions (a copy of verl's) by rlpt's
    Karmarkar-Karp: the same micro-batches, item for item and in OpenRLHF's order, each sorted,
    with its assertions. The experience maker and the replay buffer's dynamic batching call it on
    the sequences' total lengths. Lengths that are not non-negative integers with a total below
    2^52 go to OpenRLHF's own karmarkar_karp."""
    return kk_partitions(seqlen_list, k_partitions, equal_size, lambda: _openrlhf_balancing("karmarkar_karp"))


def get_minimum_num_micro_batch_size(total_lengths, max_tokens_per_gpu, ring_attn_size, ds_tensor_parallel_size):
    """openrlhf.utils.seqlen_balancing.get_minimum_num_micro_batch_size by rlpt: the number of bins
    first fit (in the given order) packs the lengths into, each bin holding
    max_tokens_per_gpu * ring_attn_size * ds_tensor_parallel_size tokens (rlpt.plan_microbatches,
    algorithm "first_fit": a segment tree instead of OpenRLHF's scan of every open bin per
    sequence). Inputs other than non-negative integer lengths and a capacity of at least 1 go to
    OpenRLHF's own function, and so does a sequence longer than the capacity (OpenRLHF 0.11.2
    gives it a bin of its own, later releases raise ValueError: the installed one answers)."""
    cap = max_tokens_per_gpu * ring_attn_size * ds_tensor_parallel_size
    lengths = exact_workloads(total_lengths)
    if (lengths is None or not isinstance(cap, int) or not 1 <= cap < 2 ** 63
            or (lengths.numel() and int(lengths.max()) > cap)):
        return _openrlhf_balancing("get_minimum_num_micro_batch_size")(total_lengths, max_tokens_per_gpu,
                                                                        ring_attn_size, ds_tensor_parallel_size)
    plan = plan_microbatches(lengths, cap, algorithm="first_fit", min_microbatches=0, divisor=1,
                             small_at_ends=False)
    return len(plan["microbatches"])


_BALANCING = ("get_seqlen_balanced_partitions", "get_minimum_num_micro_batch_size")

_saved = {}


def patch():
    """Opt-in: PolicyLoss and ValueLoss replace OpenRLHF's classes, and get_seqlen_balanced_partitions
    and get_minimum_num_micro_batch_size OpenRLHF's functions, in every imported openrlhf module that
    holds them (openrlhf.models.loss, openrlhf.models, openrlhf.utils.seqlen_balancing, the
    experience maker, the replay buffer, the trainer modules): call it after importing OpenRLHF's
    trainer. unpatch() restores them."""
    import sys

    try:
        import openrlhf.models.loss  # noqa: F401
    except ImportError:  # openrlhf.models' __init__ needs peft etc.; patch what is loaded
        pass
    try:
        from openrlhf.utils import seqlen_balancing
    except ImportError:
        seqlen_balancing = None
    if _saved:
        return
    originals = {name: getattr(seqlen_balancing, name, None) for name in _BALANCING} if seqlen_balancing else {}
    for mod_name, mod in list(sys.modules.items()):
        if not mod_name.startswith("openrlhf") or mod is None:
            continue
        for name, cls in (("PolicyLoss", PolicyLoss), ("ValueLoss", ValueLoss)):
            if isinstance(getattr(mod, name, None), type) and getattr(mod, name) is not cls:
                _saved[(mod, name)] = getattr(mod, name)
                setattr(mod, name, cls)
        for name, fn in (("get_seqlen_balanced_partitions", get_seqlen_balanced_partitions),
                         ("get_minimum_num_micro_batch_size", get_minimum_num_micro_batch_size)):
            if originals.get(name) is not None and getattr(mod, name, None) is originals[name]:
                _saved[(mod, name)] = originals[name]
                setattr(mod, name, fn)


def unpatch():
    for (mod, name), cls in list(_saved.items()):
        setattr(mod, name, cls)
    _saved.clear()
