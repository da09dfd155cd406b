# SPDX-License-Identifier: Apache-2.0
"""rlpt inside verl (0.9.1): advantage estimators and policy losses registered through verl's own
registries (verl.trainer.ppo.core_algos.register_adv_est / register_policy_loss) with verl's
signatures and return values, under rlpt's names:

    algorithm.adv_estimator=rlpt_grpo                      # or rlpt_rloo, rlpt_opo, rlpt_gpg, ...
    actor_rollout_ref.actor.policy_loss.loss_mode=rlpt_vanilla   # or rlpt_gspo, rlpt_cispo, ...

The package declares a ``verl.plugins`` entry point, so ``import verl`` (in the driver and in
every Ray worker) imports this module and registers the names; nothing else to install. With
``RLPT_VERL_PATCH=1`` in the environment (or rlpt.verl.patch()), the rlpt functions also replace
verl's own names ("grpo", "gae", "vanilla", ...), including the GRPO and GAE functions the
trainer calls directly.

Also here: logprobs_from_logits / entropy_from_logits / logprobs_and_entropy drop-ins (rlpt's
kernel), kl_loss and value_loss (verl's kl_penalty + agg_loss and compute_value_loss), and
get_seqlen_balanced_partitions / get_group_balanced_partitions (rlpt's Karmarkar-Karp) and
FusedLinearForPPO (rlpt's fused lm-head on CPU tensors), patched in with the rest.

What differs on purpose (docs/python.md): an all-masked micro-batch gives loss 0 (verl: NaN for
token-mean); NaN inputs raise rlpt.Error instead of propagating; geo_mean's, clip_cov's and
kl_cov's ratios are clamped at 80 in log space (verl: none).
"""
import os
import sys

import torch

import rlpt

from ._ops import cached_objective, metrics_dict
from ._rollout import exact_workloads, kk_partitions

#: verl estimator name -> rlpt function registered as "rlpt_<name>".
ESTIMATORS = ("grpo", "grpo_vectorized", "grpo_passk", "rloo", "rloo_vectorized", "opo", "gpg",
              "reinforce_plus_plus", "reinforce_plus_plus_baseline", "remax", "gae")
#: verl policy loss_mode names rlpt reproduces (registered as "rlpt_<name>").
POLICY_LOSSES = ("vanilla", "gspo", "sapo", "gpg", "geo_mean", "cispo", "dppo_tv", "dppo_kl", "dro", "clip_cov",
                 "kl_cov")


def _get(config, key, default):
    """A config field, `default` where it is missing or None."""
    return _field(config, key, default, default)


def _field(config, key, default, if_none):
    """A config field as verl's loss reads it: `default` (the dataclass's) where the config has no
    such field, `if_none` (the loss's own fallback) where it is None."""
    if config is None:
        return default
    try:
        v = config.get(key, default)
    except AttributeError:
        v = getattr(config, key, default)
    return if_none if v is None else v


def _clip_bounds(config, clip):
    """clip_ratio_low/high: ActorConfig's default is 0.2 (not None), verl's loss takes clip_ratio for None."""
    return [float(_field(config, key, 0.2, clip)) for key in ("clip_ratio_low", "clip_ratio_high")]


def _ids(index):
    return rlpt.group_ids(index)


def _outcome(scores, response_mask, adv):
    out = adv.to(scores.dtype).unsqueeze(-1) * response_mask
    return out, out


# --- advantage estimators (verl signatures) ------------------------------------------------------

def compute_grpo_outcome_advantage(token_level_rewards, response_mask, index, epsilon=1e-6,
                                   norm_adv_by_std_in_grpo=None, config=None, **kwargs):
    """verl compute_grpo_outcome_advantage (and grpo_vectorized: the same numbers)."""
    if norm_adv_by_std_in_grpo is None:
        norm_adv_by_std_in_grpo = _get(config, "norm_adv_by_std_in_grpo", True)
    scores = token_level_rewards.sum(dim=-1)
    adv, _ = rlpt.grpo_advantages(scores, _ids(index), preset="verl", epsilon=float(epsilon),
                                  scale="group" if norm_adv_by_std_in_grpo else "none")
    return _outcome(scores, response_mask, adv)


def compute_grpo_passk_outcome_advantage(token_level_rewards, response_mask, index, epsilon=1e-6,
                                         norm_adv_by_std_in_grpo=True, config=None, **kwargs):
    """verl compute_grpo_passk_outcome_advantage (reads norm_adv_by_std_in_grpo from config)."""
    if config is not None:
        norm_adv_by_std_in_grpo = _get(config, "norm_adv_by_std_in_grpo", True)
    scores = token_level_rewards.sum(dim=-1)
    adv, _ = rlpt.passk_advantages(scores, _ids(index), preset="verl", epsilon=float(epsilon),
                                   scale_by_std=bool(norm_adv_by_std_in_grpo))
    return _outcome(scores, response_mask, adv)


def compute_rloo_outcome_advantage(token_level_rewards, response_mask, index, epsilon=1e-6, config=None, **kwargs):
    scores = token_level_rewards.sum(dim=-1)
    adv, _ = rlpt.rloo_advantages(scores, _ids(index), preset="verl")
    return _outcome(scores, response_mask, adv)


def compute_rloo_vectorized_outcome_advantage(token_level_rewards, response_mask, index, epsilon=1e-6, config=None,
                                              **kwargs):
    scores = token_level_rewards.sum(dim=-1)
    adv, _ = rlpt.rloo_advantages(scores, _ids(index), preset="verl_vectorized")
    return _outcome(scores, response_mask, adv)


def compute_opo_outcome_advantage(token_level_rewards, response_mask, index, epsilon=1e-6, config=None, **kwargs):
    scores = token_level_rewards.sum(dim=-1)
    lengths = (response_mask != 0).sum(dim=-1).to(torch.int64)
    adv, _ = rlpt.opo_advantages(scores, _ids(index), lengths, preset="verl")
    return _outcome(scores, response_mask, adv)


def compute_gpg_outcome_advantage(token_level_rewards, response_mask, index, epsilon=1e-6, f_norm=1.0, alpha=1.0,
                                  config=None, **kwargs):
    scores = token_level_rewards.sum(dim=-1)
    adv, _ = rlpt.gpg_advantages(scores, _ids(index), preset="verl", f_norm=float(f_norm))
    return _outcome(scores, response_mask, adv)


def compute_reinforce_plus_plus_outcome_advantage(token_level_rewards, response_mask, config=None, **kwargs):
    gamma = float(_get(config, "gamma", 1.0))
    adv, ret, _ = rlpt.reinforce_pp(token_level_rewards, response_mask, gamma=gamma, preset="verl")
    return adv.to(token_level_rewards.dtype), ret.to(token_level_rewards.dtype)


def compute_reinforce_plus_plus_baseline_outcome_advantage(token_level_rewards, response_mask, index, epsilon=1e-6,
                                                           config=None, **kwargs):
    scores = token_level_rewards.sum(dim=-1)
    adv, _ = rlpt.reinforce_pp_baseline(scores, _ids(index), response_mask, preset="verl")
    adv = adv.to(token_level_rewards.dtype)
    return adv, adv


def compute_remax_outcome_advantage(token_level_rewards, reward_baselines, response_mask, config=None, **kwargs):
    adv, ret = rlpt.remax(token_level_rewards, reward_baselines, response_mask, preset="verl")
    return adv.to(token_level_rewards.dtype), ret.to(token_level_rewards.dtype)


def compute_gae_advantage_return(token_level_rewards, values, response_mask, gamma, lam, **kwargs):
    adv, ret, _ = rlpt.gae(token_level_rewards, values, response_mask, gamma=float(gamma), lam=float(lam),
                           preset="verl")
    return adv.to(token_level_rewards.dtype), ret.to(token_level_rewards.dtype)


_ESTIMATOR_FNS = {
    "grpo": compute_grpo_outcome_advantage,
    "grpo_vectorized": compute_grpo_outcome_advantage,
    "grpo_passk": compute_grpo_passk_outcome_advantage,
    "rloo": compute_rloo_outcome_advantage,
    "rloo_vectorized": compute_rloo_vectorized_outcome_advantage,
    "opo": compute_opo_outcome_advantage,
    "gpg": compute_gpg_outcome_advantage,
    "reinforce_plus_plus": compute_reinforce_plus_plus_outcome_advantage,
    "reinforce_plus_plus_baseline": compute_reinforce_plus_plus_baseline_outcome_advantage,
    "remax": compute_remax_outcome_advantage,
    "gae": compute_gae_advantage_return,
}


# --- policy losses (verl signature) -----------------------------------------------------------------

def _actor_objective(items):
    return cached_objective("verl_actor", **dict(items))


def _global_batch_info(config):
    info = _get(config, "global_batch_info", None) or {}
    return {k: v for k, v in dict(info).items() if v is not None}


def _policy_loss_fn(loss_mode):
    def policy_loss(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean", config=None,
                    rollout_is_weights=None):
        assert config is not None
        clip = float(_get(config, "clip_ratio", 0.2))
        lo, hi = _clip_bounds(config, clip)
        opts = {"loss_mode": loss_mode, "clip_ratio": clip, "clip_ratio_low": lo, "clip_ratio_high": hi,
                "loss_agg_mode": loss_agg_mode}
        opts["clip_ratio_c"] = float(_get(config, "clip_ratio_c", 3.0))
        if loss_mode == "sapo":
            opts["tau_pos"] = float(_get(config, "tau_pos", 1.0))
            opts["tau_neg"] = float(_get(config, "tau_neg", 1.05))
        if loss_mode == "dro":
            beta = _get(_get(config, "policy_loss", None), "dro_beta", None)
            if beta is not None:  # unset: the preset raises, as verl does
                opts["dro_beta"] = float(beta)
            if rollout_is_weights is not None:
                # The weights scale DRO's quadratic penalty too, which is not homogeneous in the
                # advantage: weighting the advantage (below) would be wrong.
                raise NotImplementedError(
                    "rlpt_dro: rollout_is_weights are not supported (they scale the log-ratio penalty, which "
                    "rlpt cannot take through the advantage); use verl's own 'dro' with rollout correction")
        for k, v in _global_batch_info(config).items():
            opts[k] = int(v) if k == "dp_size" else float(v)
        adv = advantages
        if rollout_is_weights is not None:
            # Importance weights are >= 0 and every policy term is positively homogeneous in the
            # advantage, so weighting the loss equals weighting the advantage (geo_mean: verl's
            # per-sequence geometric mean of the weights; dppo keeps or drops a token by the sign of
            # A, which a positive weight keeps, and a token of weight 0 adds 0 either way).
            w = rollout_is_weights.detach()
            if loss_mode == "geo_mean":
                m = response_mask
                n = m.sum(dim=-1)
                w = torch.exp((torch.log(w + 1e-10) * m).sum(dim=-1) / (n + 1e-8)).unsqueeze(-1)
            adv = advantages * w
        obj = _actor_objective(tuple(sorted(opts.items())))
        loss, m = rlpt.policy_loss(obj, log_prob, response_mask, old_logp=old_log_prob, adv=adv)
        d = metrics_dict(m)
        if loss_mode == "gpg":
            return loss, {}
        if loss_mode == "dro":
            return loss, {"actor/ppo_kl": d["approx_kl"]}
        frac = d["clip_frac_low"] + d["clip_frac_high"]
        # dppo: clip_frac_dual counts the kept tokens whose ratio the truncation caps
        dual = loss_mode in ("vanilla", "dppo_tv", "dppo_kl")
        lower = d["clip_frac_dual"] if dual else (d["clip_frac_low"] if loss_mode == "geo_mean" else 0.0)
        if loss_mode == "geo_mean":
            frac = d["clip_frac_high"]
        if loss_mode == "sapo":
            frac = 0.0
        return loss, {"actor/pg_clipfrac": frac, "actor/ppo_kl": d["approx_kl"], "actor/pg_clipfrac_lower": lower}

    policy_loss.__name__ = f"rlpt_policy_loss_{loss_mode}"
    policy_loss.__doc__ = f"verl policy loss '{loss_mode}' computed by rlpt (same signature and returns)."
    return policy_loss


def _masked_mean(values, mask):
    """verl's masked_mean over every element (the same operations, so the same bits)."""
    return (torch.where(mask.bool(), values, 0.0) * mask).sum() / (mask.sum() + 1e-8)


def _cov_objective(eps_low, eps_high, kl_coef, loss_agg_mode, config):
    """The Clip-Cov / KL-Cov loss as an rlpt objective: PPO's clipped surrogate without dual clip
    (eps_high = 1e38 and eps_low = 1: the bare -A r of KL-Cov) plus kl_coef * |logp - ref| under the
    same aggregation. The log-ratio is clamped at +-80 (rlpt's bound on every ratio; verl's Cov
    losses have none), so the two differ only where exp(logp - old) is beyond 5.5e34."""
    opts = {"policy": "ppo_clip", "policy.eps_low": float(eps_low), "policy.eps_high": float(eps_high),
            "policy.dual_clip": 0.0, "policy.log_ratio_clamp": 80.0, "agg.verl": loss_agg_mode}
    if kl_coef != 0.0:
        opts.update({"kl.estimator": "abs", "kl.coef": float(kl_coef), "kl.output_clamp": 0.0})
    for k, v in _global_batch_info(config).items():
        opts["agg." + k] = int(v) if k == "dp_size" else float(v)
    return cached_objective("custom", **opts)


def compute_policy_loss_clip_cov(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean",
                                 config=None, rollout_is_weights=None):
    """verl policy loss 'clip_cov' (Clip-Cov, Cui et al. 2025): the tokens it takes out of the
    gradient are chosen with verl's own operations in the same order, its torch.randperm call
    included, so with the same RNG state they are the same tokens; the loss is rlpt's."""
    assert config is not None
    pl = _get(config, "policy_loss", None)
    ratio_k = float(_get(pl, "clip_cov_ratio", 0.0002))
    lb = float(_get(pl, "clip_cov_lb", 1.0))
    ub = float(_get(pl, "clip_cov_ub", 5.0))
    if not ratio_k > 0:
        raise ValueError(f"rlpt_clip_cov: clip_cov_ratio = {ratio_k} must be > 0 (verl asserts the same)")
    clip = float(_get(config, "clip_ratio", 0.2))
    lo, hi = _clip_bounds(config, clip)
    with torch.no_grad():
        lp = log_prob.detach()
        ratio = torch.exp(lp - old_log_prob)
        l1 = -advantages * ratio
        l2 = -advantages * torch.clamp(ratio, 1 - lo, 1 + hi)
        clipped = (l2 > l1) & (response_mask > 0)
        cov = (advantages - _masked_mean(advantages, response_mask)) * (lp - _masked_mean(lp, response_mask))
        cov[response_mask == 0] = -torch.inf
        cov[clipped] = -torch.inf
        clip_num = max(int(ratio_k * response_mask.sum().item()), 1)
        picked = torch.nonzero((cov < ub) & (cov > lb) & (response_mask > 0))
        if len(picked) > 0:
            perm = torch.randperm(len(picked))
            picked = picked[perm[: min(clip_num, len(picked))]]
        keep = torch.ones_like(advantages)
        keep[picked[:, 0], picked[:, 1]] = 0
        frac = _masked_mean((keep == 0).float(), response_mask).item()
    # A token taken out adds -0 A r with gradient 0 and stays in the denominators, as verl's
    # loss * 0; rollout weights are >= 0 and the clip is homogeneous in A (see _policy_loss_fn).
    adv = advantages.detach() * keep
    if rollout_is_weights is not None:
        adv = adv * rollout_is_weights.detach()
    obj = _cov_objective(lo, hi, 0.0, loss_agg_mode, config)
    loss, m = rlpt.policy_loss(obj, log_prob, response_mask, old_logp=old_log_prob, adv=adv)
    return loss, {"actor/pg_clipfrac": frac, "actor/ppo_kl": metrics_dict(m)["approx_kl"]}


def compute_policy_loss_kl_cov(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean",
                               config=None, rollout_is_weights=None):
    """verl policy loss 'kl_cov' (KL-Cov, Cui et al. 2025): -A r on every token, plus
    ppo_kl_coef * |logp - old| on the kl_cov_ratio share of tokens with the largest
    (A - mean A)(logp - mean logp), chosen with verl's operations (torch.topk on the same values).
    The penalty is rlpt's KL term against a reference equal to old_log_prob on those tokens and
    to logp itself elsewhere (|0| = 0, gradient 0)."""
    assert config is not None
    pl = _get(config, "policy_loss", None)
    ratio_k = float(_get(pl, "kl_cov_ratio", 0.0002))
    coef = float(_field(pl, "ppo_kl_coef", 0.1, 1.0))  # PolicyLossConfig's default; verl's fallback for None
    if not ratio_k > 0:
        raise ValueError(f"rlpt_kl_cov: kl_cov_ratio = {ratio_k} must be > 0 (verl asserts the same)")
    if rollout_is_weights is not None:
        # verl weights the KL penalty too, which the advantage cannot carry (as rlpt_dro).
        raise NotImplementedError(
            "rlpt_kl_cov: rollout_is_weights are not supported (they scale the |logp - old| penalty, which rlpt "
            "cannot take through the advantage); use verl's own 'kl_cov' with rollout correction")
    with torch.no_grad():
        lp = log_prob.detach()
        valid = response_mask > 0
        valid_idx = torch.nonzero(valid.reshape(-1), as_tuple=True)[0]
        a = advantages[valid].detach().reshape(-1).cpu()
        x = lp[valid].reshape(-1).cpu()
        ref = lp.clone()
        if len(a) > 0:
            cov = (a - a.mean()) * (x - x.mean())
            top = torch.topk(cov, max(1, int(len(cov) * ratio_k)), largest=True).indices
            flat = valid_idx[top.to(valid_idx.device)]
            T = advantages.shape[1]
            rows, cols = flat // T, flat % T
            ref[rows, cols] = old_log_prob[rows, cols].to(ref.dtype)
        ppo_kl = _masked_mean((lp - old_log_prob).abs(), response_mask).item()
    obj = _cov_objective(1.0, 1e38, coef, loss_agg_mode, config)
    loss, _ = rlpt.policy_loss(obj, log_prob, response_mask, old_logp=old_log_prob, ref_logp=ref, adv=advantages)
    return loss, {"actor/ppo_kl": ppo_kl}


_POLICY_FNS = {name: _policy_loss_fn(name) for name in POLICY_LOSSES if name not in ("clip_cov", "kl_cov")}
_POLICY_FNS["clip_cov"] = compute_policy_loss_clip_cov
_POLICY_FNS["kl_cov"] = compute_policy_loss_kl_cov
compute_policy_loss_vanilla = _POLICY_FNS["vanilla"]
compute_policy_loss_gspo = _POLICY_FNS["gspo"]
compute_policy_loss_sapo = _POLICY_FNS["sapo"]
compute_policy_loss_gpg = _POLICY_FNS["gpg"]
compute_policy_loss_geo_mean = _POLICY_FNS["geo_mean"]
compute_policy_loss_cispo = _POLICY_FNS["cispo"]
compute_policy_loss_dppo_tv = _POLICY_FNS["dppo_tv"]
compute_policy_loss_dppo_kl = _POLICY_FNS["dppo_kl"]
compute_policy_loss_dro = _POLICY_FNS["dro"]


def kl_loss(log_prob, ref_log_prob, response_mask, kl_loss_type="low_var_kl", loss_agg_mode="token-mean",
            **global_batch_info):
    """verl's actor KL term agg_loss(kl_penalty(log_prob, ref_log_prob, kl_loss_type), mask, loss_agg_mode)
    (before kl_loss_coef), differentiable in log_prob."""
    opts = {"policy": "none", "kl.verl": kl_loss_type, "kl.coef": 1.0, "agg.verl": loss_agg_mode}
    for k, v in global_batch_info.items():
        if v is not None:
            opts["agg." + k] = v
    obj = cached_objective("custom", **opts)
    loss, _ = rlpt.policy_loss(obj, log_prob, response_mask, ref_logp=ref_log_prob)
    return loss


def compute_value_loss(vpreds, returns, values, response_mask, cliprange_value, loss_agg_mode="token-mean",
                       dp_size=1, batch_num_tokens=None, global_batch_size=None, loss_scale_factor=None):
    """verl compute_value_loss: (vf_loss, vf_clipfrac)."""
    opts = {"cliprange_value": float(cliprange_value), "loss_agg_mode": loss_agg_mode, "dp_size": int(dp_size)}
    if batch_num_tokens is not None:
        opts["batch_num_tokens"] = float(batch_num_tokens)
    if global_batch_size is not None:
        opts["global_batch_size"] = float(global_batch_size)
    obj = cached_objective("verl_critic", **opts)
    loss, m = rlpt.policy_loss(obj, None, response_mask, values=vpreds, old_values=values, returns=returns)
    return loss, m[rlpt.METRICS.index("value_clip_frac")].to(loss.dtype)


# --- logprob / entropy ---------------------------------------------------------------------------

def logprobs_from_logits(logits, labels, inplace_backward=True):
    """verl.utils.torch_functional.logprobs_from_logits: log-probabilities of ``labels`` under
    ``logits`` (same leading shape, no shift), float32, differentiable in the logits."""
    return logprobs_and_entropy(logits, labels)[0]


def entropy_from_logits(logits):
    """verl.utils.torch_functional.entropy_from_logits (targets are not read)."""
    labels = torch.zeros(logits.shape[:-1], dtype=torch.int64, device=logits.device)
    return logprobs_and_entropy(logits, labels)[1]


def logprobs_and_entropy(logits, labels, temperature=1.0):
    """Both in one read of the logits (pass the rollout temperature instead of dividing the logits)."""
    shape = logits.shape[:-1]
    lp, ent = rlpt.logprob_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), temperature=temperature)
    return lp.view(shape), ent.view(shape)


class FusedLinearForPPO(torch.nn.Module):
    """verl.utils.experimental.torch_functional.FusedLinearForPPO (``use_fused_kernels``: the
    actor's hidden states x lm_head weight -> log-probs and entropy) by rlpt's fused lm-head
    (rlpt.lm_head_logprob_entropy) on CPU tensors: the same arguments and return values (float32
    log-probs, entropy in the hidden states' dtype), the product accumulated in float32 (verl's
    torch chunks round the logits to a bf16 input's dtype first). Tensors on another device, and a
    package built without Eigen, take verl's own class."""

    def __init__(self, chunk_size=512, impl_backend="torch"):
        super().__init__()
        if impl_backend not in ("torch", "liger"):
            raise ValueError(f"Unsupported FusedLinearForPPO backend: {impl_backend}. Choose 'torch' or 'liger'.")
        self.chunk_size = chunk_size
        self.impl_backend = impl_backend

    def forward(self, hidden_states, vocab_weights, input_ids, temperature=1.0):
        if hidden_states.device.type != "cpu" or not rlpt._C.lm_head:
            verl_cls = _verl_fused_linear()
            return verl_cls(chunk_size=self.chunk_size, impl_backend=self.impl_backend)(
                hidden_states, vocab_weights, input_ids, temperature)
        logp, ent = rlpt.lm_head_logprob_entropy(hidden_states, vocab_weights, input_ids.to(torch.int64),
                                                 temperature=float(temperature))
        return logp, ent.to(hidden_states.dtype)


def _verl_fused_linear():
    """verl's own FusedLinearForPPO, patched or not."""
    from verl.utils.experimental import torch_functional as tf

    return _saved.get(("module", tf.__name__, "FusedLinearForPPO"), tf.FusedLinearForPPO)


# --- training-inference mismatch metrics ----------------------------------------------------------

_OFFPOLICY_NAMES = {"kl": "k1", "k3_kl": "k3", "training_ppl": "trainer_ppl", "training_log_ppl": "trainer_log_ppl",
                    "rollout_ppl": "rollout_ppl", "rollout_log_ppl": "rollout_log_ppl", "log_ppl_diff": "log_ppl_diff",
                    "log_ppl_abs_diff": "log_ppl_abs_diff", "log_ppl_diff_max": "log_ppl_diff_max",
                    "log_ppl_diff_min": "log_ppl_diff_min", "ppl_ratio": "ppl_ratio", "chi2_token": "chi2_token",
                    "chi2_seq": "chi2_seq"}


def compute_offpolicy_metrics(old_log_prob, rollout_log_prob, response_mask):
    """verl.trainer.ppo.rollout_corr_helper.compute_offpolicy_metrics by rlpt.mismatch_metrics:
    the same keys and values, except that a row with no valid token is left out of the row
    averages (verl counts it as perplexity 1) and no valid token at all gives zeros (verl
    asserts). Without rollout_log_prob, only training_ppl and training_log_ppl, as verl."""
    rollout = old_log_prob if rollout_log_prob is None else rollout_log_prob
    m = rlpt.mismatch_metrics(old_log_prob, rollout, response_mask)
    if rollout_log_prob is None:
        return {"training_ppl": m["trainer_ppl"], "training_log_ppl": m["trainer_log_ppl"]}
    return {name: m[ours] for name, ours in _OFFPOLICY_NAMES.items()}


def calculate_debug_metrics(data):
    """verl.utils.debug.metrics.calculate_debug_metrics by rlpt.mismatch_metrics: the
    training/rollout_probs_diff_* and training/rollout_actor_probs_pearson_corr of a DataProto
    (rollout_log_probs, old_log_probs, response_mask or attention_mask, responses). With no valid
    token, verl's defaults (valid 0, NaN)."""
    batch = data.batch
    rollout, actor = batch["rollout_log_probs"], batch["old_log_probs"]
    mask = batch["response_mask"] if "response_mask" in batch else (
        batch["attention_mask"] if "attention_mask" in batch else torch.ones_like(rollout))
    mask = mask[:, -batch["responses"].size(1):]
    m = rlpt.mismatch_metrics(actor, rollout, mask.bool())
    if m["tokens"] == 0:
        nan = float("nan")
        return {"training/rollout_probs_diff_valid": 0, "training/rollout_probs_diff_max": nan,
                "training/rollout_probs_diff_mean": nan, "training/rollout_probs_diff_std": nan,
                "training/rollout_actor_probs_pearson_corr": nan}
    return {"training/rollout_probs_diff_valid": 1, "training/rollout_probs_diff_max": m["prob_abs_diff_max"],
            "training/rollout_probs_diff_mean": m["prob_abs_diff_mean"],
            "training/rollout_probs_diff_std": m["prob_abs_diff_std"],
            "training/rollout_actor_probs_pearson_corr": m["pearson_prob"]}


# --- sequence balancing ----------------------------------------------------------------------

def get_seqlen_balanced_partitions(seqlen_list, k_partitions, equal_size):
    """verl.utils.seqlen_balancing.get_seqlen_balanced_partitions by rlpt's Karmarkar-Karp (the
    verl balance preset): the same partitions, item for item and in verl's order of parts, each
    sorted, with verl's assertions. verl calls it on the workloads (calculate_workload) to balance
    ranks (_balance_batch) and micro-batches (rearrange_micro_batches). Workloads that are not
    non-negative integers with a total below 2^52 (floats, negative values) go to verl's own
    karmarkar_karp, so every input gets verl's answer."""
    return kk_partitions(seqlen_list, k_partitions, equal_size, lambda: _verl_balancing("karmarkar_karp"))


def _verl_balancing(name):
    """verl's own seqlen_balancing.<name>, patched or not."""
    from verl.utils import seqlen_balancing as sb

    return _saved.get(("module", sb.__name__, name), getattr(sb, name))


def get_group_balanced_partitions(seqlen_list, uid_list, k_partitions):
    """verl.utils.seqlen_balancing.get_group_balanced_partitions (PrefixGrouper's rank balancing:
    each run of equal consecutive uids stays on one rank) by rlpt: the same partitions, in verl's
    order, with verl's assertions. The groups' workloads are summed in int64 (verl: one torch call
    per sample); lengths that are not non-negative integers go to verl's own function."""
    assert len(seqlen_list) == len(uid_list), "seqlen_list and uid_list must have same length"
    lengths = exact_workloads(seqlen_list)
    if lengths is None:
        return _verl_balancing("get_group_balanced_partitions")(seqlen_list, uid_list, k_partitions)
    n = len(uid_list)
    starts = [0] + [i for i in range(1, n) if uid_list[i] != uid_list[i - 1]] if n else []
    bounds = starts + [n]
    num_groups = len(starts)
    assert num_groups >= k_partitions, (
        f"Number of uid groups ({num_groups}) must be >= k_partitions ({k_partitions}). "
        f"Consider reducing world_size or increasing batch_size."
    )
    # verl's calculate_workload per sample, summed per group (exact in int64 as in Python ints)
    cs = [0] + torch.cumsum(24576 * lengths + lengths * lengths, 0).tolist()
    group_workloads = [cs[bounds[g + 1]] - cs[bounds[g]] for g in range(num_groups)]
    parts = get_seqlen_balanced_partitions(group_workloads, k_partitions, True)
    return [[i for g in part for i in range(bounds[g], bounds[g + 1])] for part in parts]


#: Modules that import get_seqlen_balanced_partitions by name (patch() replaces it there too).
_BALANCING_USERS = ("verl.trainer.ppo.ray_trainer", "verl.trainer.ppo.v1.trainer_base", "verl.trainer.sft_trainer_ray")


# --- registration -------------------------------------------------------------------------------

_saved = {}


def register(prefix="rlpt_"):
    """Registers every estimator and policy loss under ``prefix + verl name`` (idempotent)."""
    from verl.trainer.ppo import core_algos as ca

    for name, fn in _ESTIMATOR_FNS.items():
        if ca.ADV_ESTIMATOR_REGISTRY.get(prefix + name) is not fn:
            ca.register_adv_est(prefix + name)(fn)
    for name, fn in _POLICY_FNS.items():
        ca.register_policy_loss(prefix + name)(fn)


def patch():
    """Opt-in: the rlpt functions replace verl's own names in both registries, the GRPO and GAE
    functions the trainer calls directly (core_algos.compute_grpo_outcome_advantage,
    core_algos.compute_gae_advantage_return), seqlen_balancing's get_seqlen_balanced_partitions
    and get_group_balanced_partitions (also where a trainer module already imported them by
    name) and torch_functional's FusedLinearForPPO. unpatch() restores verl's."""
    from verl.trainer.ppo import core_algos as ca

    if _saved:
        return
    for name, fn in _ESTIMATOR_FNS.items():
        _saved[("adv", name)] = ca.ADV_ESTIMATOR_REGISTRY.get(name)
        ca.ADV_ESTIMATOR_REGISTRY[name] = fn
    for name, fn in _POLICY_FNS.items():
        _saved[("loss", name)] = ca.POLICY_LOSS_REGISTRY.get(name)
        ca.POLICY_LOSS_REGISTRY[name] = fn
    for attr, fn in (("compute_grpo_outcome_advantage", compute_grpo_outcome_advantage),
                     ("compute_gae_advantage_return", compute_gae_advantage_return)):
        _saved[("attr", attr)] = getattr(ca, attr)
        setattr(ca, attr, fn)
    # Sequence balancing: in its own module (rearrange_micro_batches and get_group_balanced_partitions
    # look it up there) and in the trainers that imported it by name before the patch.
    from verl.utils import seqlen_balancing as sb

    users = (sb, *(sys.modules.get(m) for m in _BALANCING_USERS))
    for name, fn in (("get_seqlen_balanced_partitions", get_seqlen_balanced_partitions),
                     ("get_group_balanced_partitions", get_group_balanced_partitions)):
        original = getattr(sb, name)
        for module in users:
            if module is not None and getattr(module, name, None) is original:
                _saved[("module", module.__name__, name)] = original
                setattr(module, name, fn)
    # The fused lm-head: verl's model forwards import the class from its module at each call.
    if rlpt._C.lm_head:
        from verl.utils.experimental import torch_functional as tf

        _saved[("module", tf.__name__, "FusedLinearForPPO")] = tf.FusedLinearForPPO
        tf.FusedLinearForPPO = FusedLinearForPPO


def unpatch():
    from verl.trainer.ppo import core_algos as ca

    for (kind, name, *attr), fn in list(_saved.items()):
        if kind == "adv":
            ca.ADV_ESTIMATOR_REGISTRY[name] = fn
        elif kind == "loss":
            ca.POLICY_LOSS_REGISTRY[name] = fn
        elif kind == "module":
            setattr(sys.modules[name], attr[0], fn)
        else:
            setattr(ca, name, fn)
    _saved.clear()


def _plugin():
    """The verl.plugins entry point: registers the rlpt names (and patches with RLPT_VERL_PATCH=1)."""
    register()
    if os.environ.get("RLPT_VERL_PATCH", "0") == "1":
        patch()


try:
    _plugin()
except ImportError:  # verl is not installed: the functions above still work on their own
    pass
