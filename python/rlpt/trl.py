# SPDX-License-Identifier: Apache-2.0
"""rlpt inside TRL (1.16): a GRPOTrainer and an RLOOTrainer whose losses are computed by rlpt.

    from rlpt.trl import GRPOTrainer          # instead of: from trl import GRPOTrainer
    from rlpt.trl import RLOOTrainer          # instead of: from trl import RLOOTrainer

Everything else (generation, rewards, advantages, the model forward that gives the per-token
log-probs and entropies) is TRL's own; the loss of each micro-batch (``loss_type`` grpo, bnpo,
dr_grpo, dapo, luspo, cispo, sapo, vespo; token or sequence importance sampling; ``beta`` k3 KL with
``use_bias_correction_kl``; ``delta``; the entropy bonus, static or adaptive, over the
high-entropy tokens with ``top_entropy_quantile`` < 1; MoE routers' aux loss) is rlpt::evaluate with the
rlpt::compat::trl::grpo preset, TRL's normalisers included (gradient accumulation, processes,
``num_items_in_batch``, ``max_completion_length``). TRL's token masks on the policy term
(``top_entropy_quantile`` < 1, ``off_policy_mask_threshold``) and vLLM's importance-sampling ratio
are made by TRL's own methods and multiply the advantages (every loss type's policy term is
positively homogeneous in A and 0 at A = 0, so that equals multiplying the term, as TRL does;
the KL term is not masked, as in TRL); the clip-ratio metrics then count the tokens the masks keep.
With vespo, the vLLM ratio (token_truncate, token_mask) enters phi's sequence weight as TRL's does,
passed as rollout log-probs. The adaptive entropy controller (``use_adaptive_entropy``) keeps its
state in TRL's own attributes and follows TRL's rule: the coefficient of the last optimizer step
applies while that step's entropy was at or below ``entropy_target``, and each step's token-weighted
entropy moves it by ``entropy_coef_delta`` within [``entropy_coef_min``, ``entropy_coef_max``].
A loss_type rlpt does not know, and vespo with a sequence-level vLLM mode (which TRL refuses when the
trainer is made), use TRL's own loss;
``rlpt_loss_used`` says which one ran last. With vespo the trainer does not log TRL's
``vespo/phi_seq_mean``.

``GRPOTrainer(..., rlpt_degenerate_groups="exclude")`` leaves the sequences of degenerate groups (every
counted reward of the group equal, or fewer than two counted: advantages 0) out of the loss's
denominators, where TRL counts them (``"count"``, the default): their tokens stay in every term (the KL
and the entropy bonus too), but the token-mean's N (``num_items_in_batch`` for dapo, cispo and vespo;
the micro-batch's tokens for bnpo) and the sequence-mean's B (grpo, dr_grpo, luspo, sapo) count only the
other groups, so a step where most groups are tied does not shrink the others' learning rate (TRL issue
#6367; its PRs #6368 and #7068 were closed unmerged). The groups are TRL's own (``num_generations``
consecutive completions of the gathered batch), judged on the rewards TRL's ``sum_then_normalize``
aggregates; ``normalize_then_sum`` gives a tied group a non-zero advantage (its batch normalisation
subtracts the batch mean), so it refuses the switch.

RLOOTrainer's loss (the PPO clip with ``epsilon``/``epsilon_high`` on each sequence's likelihood
ratio exp(sum_t logp - old), the mean over the micro-batch's rows; its KL is in the rewards) is
rlpt::evaluate with the rlpt::compat::trl::rloo preset. TRL keeps each row's old log-prob summed
(``old_logps``); the trainer gives rlpt per-token old log-probs with that row sum (see
``_rlpt_old_per_token``). Its metrics (entropy, the per-sequence clip ratios, the aux loss) are TRL's.
"""
import warnings

import torch
from trl import GRPOTrainer as _TRLGRPOTrainer
from trl import RLOOTrainer as _TRLRLOOTrainer

import rlpt

from ._ops import metrics_dict

#: loss_type values rlpt computes.
LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo", "luspo", "cispo", "sapo", "vespo")
#: loss_type values TRL normalises by the generation batch's num_items_in_batch.
_NUM_ITEMS_TYPES = ("dapo", "cispo", "vespo")


def _per_row(advantages):
    """TRL's advantages as [B, 1] (per sequence) or [B, T] (per token): the shape its masks broadcast against."""
    return advantages.unsqueeze(1) if advantages.dim() == 1 else advantages


#: The batch entries TRL's trainers pass to the model forward besides the ids (vision models).
_MODEL_INPUTS = ("pixel_values", "image_grid_thw", "num_images", "pixel_attention_mask", "spatial_shapes", "num_tiles",
                 "image_sizes", "token_type_ids", "mm_token_type_ids", "image_position_ids")


def _forward(trainer, model, inputs):
    """TRL's own forward of a micro-batch, as both trainers' _compute_loss make it: the completion's
    per-token log-probs and entropies, and the routers' aux loss (None unless trainer.aux_loss_enabled)."""
    completion_ids = inputs["completion_ids"]
    input_ids = torch.cat([inputs["prompt_ids"], completion_ids], dim=1)
    attention_mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
    return trainer._get_per_token_logps_and_entropies(
        model, input_ids, attention_mask, completion_ids.size(1), compute_entropy=True,
        compute_aux_loss=trainer.aux_loss_enabled, **{k: inputs.get(k) for k in _MODEL_INPUTS})


class GRPOTrainer(_TRLGRPOTrainer):
    """trl.GRPOTrainer with the loss computed by rlpt (see the module docstring)."""

    rlpt_loss_used = None
    _rlpt_objectives = None
    _rlpt_rewards_per_func = None

    def __init__(self, *args, rlpt_degenerate_groups="count", **kwargs):
        if rlpt_degenerate_groups not in ("count", "exclude"):
            raise rlpt.Error("rlpt.python.bad_option", f"rlpt_degenerate_groups is {rlpt_degenerate_groups!r}: "
                             "'count' (TRL's denominators) or 'exclude' (degenerate groups out of them)")
        self.rlpt_degenerate_groups = rlpt_degenerate_groups
        super().__init__(*args, **kwargs)
        if rlpt_degenerate_groups == "exclude" and self.multi_objective_aggregation != "sum_then_normalize":
            raise rlpt.Error("rlpt.python.bad_option", "rlpt_degenerate_groups='exclude' needs "
                             "multi_objective_aggregation='sum_then_normalize' (with "
                             f"{self.multi_objective_aggregation!r} a tied group's advantage is not 0)")

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        # TRL's gathered [generation batch, reward functions] rewards, kept for the degenerate groups
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        self._rlpt_rewards_per_func = rewards_per_func
        return rewards_per_func

    def _generate_and_score_completions(self, inputs):
        self._rlpt_rewards_per_func = None
        output = super()._generate_and_score_completions(inputs)
        if self.rlpt_degenerate_groups == "exclude":
            self._rlpt_mark_degenerate(output, len(inputs))
        return output

    def _rlpt_mark_degenerate(self, output, local_rows):
        """output["rlpt_in_denominator"]: False for the local completions of degenerate groups, and
        num_items_in_batch over the others' loss tokens (every process's)."""
        per_func = self._rlpt_rewards_per_func
        if per_func is None:
            raise rlpt.Error("rlpt.python.bad_option", "rlpt_degenerate_groups='exclude': this batch was scored "
                             "without TRL's _calculate_rewards, so its groups' rewards are unknown")
        group = self.num_generations if self.model.training else self.num_generations_eval
        rewards = (per_func * self.reward_weights.to(per_func.device).unsqueeze(0)).nansum(dim=1)
        rewards[torch.isnan(per_func).all(dim=1)] = torch.nan  # TRL's unscorable rows: not counted
        ids = torch.arange(rewards.numel() // group).repeat_interleave(group)
        # rlpt's own rule (zero variance, or fewer than two counted rewards), the one the estimators use
        _, _, live = rlpt.grpo_advantages(rewards.float().cpu(), ids, on_nonfinite="mask", single="zero",
                                          return_nondegenerate=True)
        start = self.accelerator.process_index * local_rows
        keep = live[start:start + local_rows].to(per_func.device)
        output["rlpt_in_denominator"] = keep
        loss_mask = output["completion_mask"]
        if output.get("tool_mask") is not None:
            loss_mask = loss_mask * output["tool_mask"]
        output["num_items_in_batch"] = self.accelerator.gather((loss_mask * keep.unsqueeze(1)).sum()).sum()

    def _rlpt_unsupported(self):
        if self.loss_type not in LOSS_TYPES:
            return f"loss_type {self.loss_type}"
        if self._rlpt_vespo_ratio() and self.vllm_importance_sampling_mode not in ("token_truncate", "token_mask"):
            return f"vespo with vllm_importance_sampling_mode {self.vllm_importance_sampling_mode}"
        return None

    def _rlpt_entropy_coef(self):
        """The entropy coefficient this micro-batch applies: the adaptive controller's only while the
        last optimizer step's entropy was at or below the target (inf before the first step)."""
        if not self._entropy_bonus_enabled:
            return 0.0
        if self.use_adaptive_entropy and not self._last_world_entropy <= self.args.entropy_target:
            return 0.0
        return float(self.entropy_coef)

    def _rlpt_adapt_entropy(self, entropies, bonus_mask):
        """One micro-batch of the adaptive controller: its entropy sum and token count join the
        accumulation window's; at the optimizer step the window's mean over every rank moves the
        coefficient one delta towards the target and becomes the last step's entropy."""
        args = self.args
        stats = torch.stack([(entropies * bonus_mask).sum(), bonus_mask.sum()]).detach()
        window = self._entropy_window_stats
        self._entropy_window_stats = stats if window is None else window + stats
        if not self.accelerator.sync_gradients:
            return
        total = self.accelerator.reduce(self._entropy_window_stats, reduction="sum")
        entropy = (total[0] / total[1].clamp(min=1.0)).item()
        if entropy <= args.entropy_target:
            self.entropy_coef = min(self.entropy_coef + args.entropy_coef_delta, args.entropy_coef_max)
        else:
            self.entropy_coef = max(self.entropy_coef - args.entropy_coef_delta, args.entropy_coef_min)
        self._last_world_entropy = entropy
        self._entropy_window_stats = None

    def _rlpt_vespo_ratio(self):
        """VESPO folds the vLLM ratio into its sequence weight: rlpt forms it from log-probs (behav_logp)."""
        return self.loss_type == "vespo" and self.use_vllm and self.vllm_importance_sampling_correction

    def _rlpt_objective(self, train, num_items, entropy_coef):
        args = self.args
        opts = dict(loss_type=self.loss_type, epsilon=float(self.epsilon_low), epsilon_high=float(self.epsilon_high),
                    importance_sampling_level=self.importance_sampling_level, beta=float(self.beta),
                    use_bias_correction_kl=bool(getattr(args, "use_bias_correction_kl", False)),
                    sapo_temperature_pos=float(getattr(args, "sapo_temperature_pos", 1.0)),
                    sapo_temperature_neg=float(getattr(args, "sapo_temperature_neg", 1.05)),
                    vespo_k_pos=float(getattr(args, "vespo_k_pos", 2.0)),
                    vespo_lambda_pos=float(getattr(args, "vespo_lambda_pos", 3.0)),
                    vespo_k_neg=float(getattr(args, "vespo_k_neg", 3.0)),
                    vespo_lambda_neg=float(getattr(args, "vespo_lambda_neg", 2.0)),
                    entropy_coef=entropy_coef,
                    max_completion_length=int(self.max_completion_length),
                    gradient_accumulation_steps=int(self.current_gradient_accumulation_steps if train else 1),
                    num_processes=int(self.accelerator.num_processes),
                    steps_per_generation=int(args.steps_per_generation if train else 1))
        if getattr(args, "delta", None) is not None:
            opts["delta"] = float(args.delta)
        if self.loss_type in _NUM_ITEMS_TYPES:
            opts["num_items_in_batch"] = float(num_items)
        if self._rlpt_vespo_ratio():
            opts.update(vllm_importance_sampling_correction=True,
                        vllm_importance_sampling_mode=self.vllm_importance_sampling_mode,
                        vllm_importance_sampling_max=float(self.vllm_importance_sampling_clip_max))
            if self.vllm_importance_sampling_clip_min is not None:
                opts["vllm_importance_sampling_min"] = float(self.vllm_importance_sampling_clip_min)
        key = tuple(sorted(opts.items()))
        if self._rlpt_objectives is None or len(self._rlpt_objectives) > 64:  # adaptive coefficients vary
            self._rlpt_objectives = {}
        obj = self._rlpt_objectives.get(key)
        if obj is None:
            obj = self._rlpt_objectives[key] = rlpt.Objective.trl_grpo(**opts)
        return obj

    def _rlpt_policy_scale(self, inputs, per_token_logps, entropy_mask, mask, old, advantages):
        """The factors TRL multiplies the policy term by (None: none), from TRL's own methods."""
        scale = entropy_mask
        if self.off_policy_mask_threshold is not None:
            keep = self.get_off_policy_mask(
                advantages=_per_row(advantages),
                per_token_logps=per_token_logps, sampling_per_token_logps=inputs.get("sampling_per_token_logps", old),
                mask=mask, off_policy_threshold=self.off_policy_mask_threshold)
            scale = keep if scale is None else scale * keep
        if self.use_vllm and self.vllm_importance_sampling_correction and not self._rlpt_vespo_ratio():
            ratio = inputs["importance_sampling_ratio"]
            scale = ratio if scale is None else scale * ratio
        return scale

    def _compute_loss(self, model, inputs):
        why = self._rlpt_unsupported()
        if why is not None:
            if self.rlpt_degenerate_groups == "exclude":
                raise rlpt.Error("rlpt.python.bad_option", f"rlpt_degenerate_groups='exclude': {why} is TRL's own "
                                 "loss, which counts every group in its denominators")
            if self.rlpt_loss_used != "trl":
                warnings.warn(f"rlpt.trl.GRPOTrainer: {why} is not reproduced by rlpt; using TRL's own loss",
                              stacklevel=2)
            self.rlpt_loss_used = "trl"
            return super()._compute_loss(model, inputs)
        self.rlpt_loss_used = "rlpt"
        completion_mask = inputs["completion_mask"]
        mask = completion_mask if "tool_mask" not in inputs else completion_mask * inputs["tool_mask"]
        per_token_logps, entropies, aux_loss = _forward(self, model, inputs)
        train = self.model.training
        mode = "train" if train else "eval"
        num_items = inputs["num_items_in_batch"] if self.loss_type in _NUM_ITEMS_TYPES else 0.0
        if isinstance(num_items, torch.Tensor):
            num_items = num_items.item()
        entropy_coef = self._rlpt_entropy_coef()
        obj = self._rlpt_objective(train, num_items, entropy_coef)
        entropy_mask = None
        if self.top_entropy_quantile < 1.0:
            entropy_mask = self.get_high_entropy_mask(entropies, mask, 1 - self.top_entropy_quantile)
        # The bonus is a mean over the tokens it acts on: the high-entropy ones when the policy term
        # is restricted to them.
        bonus_mask = mask if entropy_mask is None else mask * entropy_mask
        bonus_entropy = None
        if entropy_coef != 0.0:
            bonus_entropy = entropies
            if entropy_mask is not None:
                # the sum over the high-entropy tokens (the others' entropy, and gradient, 0) over their count
                bonus_entropy = entropies * entropy_mask
                ga = self.current_gradient_accumulation_steps if train else 1
                counted = bonus_mask
                if inputs.get("rlpt_in_denominator") is not None:  # degenerate groups out of the count too
                    counted = bonus_mask * inputs["rlpt_in_denominator"].unsqueeze(1)
                obj = obj.with_options(**{"entropy_agg.mode": "token_sum",
                                          "entropy_agg.factor": 1.0 / (max(float(counted.sum()), 1.0) * ga)})
        advantages = inputs["advantages"]
        old = inputs.get("old_per_token_logps")
        old = per_token_logps.detach() if old is None else old
        adv_kw = {"seq_adv": advantages} if advantages.dim() == 1 else {"adv": advantages}
        scale = self._rlpt_policy_scale(inputs, per_token_logps, entropy_mask, mask, old, advantages)
        if scale is not None:
            adv = _per_row(advantages) * scale
            adv_kw = {"adv": adv.to(per_token_logps.dtype).expand_as(per_token_logps).contiguous()}
        behav = None
        if self._rlpt_vespo_ratio():
            # TRL's own ratio as the rollout log-probs rlpt forms it from: old - log(ratio) (a ratio of
            # 0 as a log-ratio of -100: its log clamps to log 1e-8 as TRL's does).
            log_ratio = torch.log(inputs["importance_sampling_ratio"].to(old.dtype)).clamp(min=-100.0)
            behav = old - log_ratio.expand_as(old)
        loss, metrics = rlpt.policy_loss(
            obj, per_token_logps, mask, old_logp=old, behav_logp=behav,
            ref_logp=inputs["ref_per_token_logps"] if self.beta != 0.0 else None,
            entropy=bonus_entropy, seq_in_denominator=inputs.get("rlpt_in_denominator"), **adv_kw)
        m = metrics_dict(metrics)
        gather = self.accelerator.gather

        def mean(x):
            return gather(torch.tensor(float(x), device=per_token_logps.device)).mean().item()

        if self._entropy_bonus_enabled:
            self._metrics[mode]["policy_loss"].append(mean(m["policy_loss"]))
            if self.use_adaptive_entropy and train:
                self._rlpt_adapt_entropy(entropies, bonus_mask)
            if train and self.accelerator.sync_gradients:
                self._metrics[mode]["entropy_coef"].append(self.entropy_coef)
        if self.aux_loss_enabled:
            # scaled for gradient accumulation as the policy loss is (TRL turns HF's scaling off)
            loss = loss + self.router_aux_loss_coef * aux_loss / (self.current_gradient_accumulation_steps
                                                                 if train else 1.0)
            self._metrics[mode]["aux_loss"].append(self.accelerator.gather_for_metrics(aux_loss).mean().item())
        if self.beta != 0.0:
            self._metrics[mode]["kl"].append(mean(m["kl_mean"]))
        with torch.no_grad():
            tokens = mask.sum().clamp(min=1.0)
            self._metrics[mode]["entropy"].append(mean(((entropies * mask).sum() / tokens).item()))
        if self.loss_type in ("grpo", "bnpo", "dr_grpo", "dapo", "luspo"):
            self._metrics[mode]["clip_ratio/low_mean"].append(mean(m["clip_frac_low"]))
            self._metrics[mode]["clip_ratio/high_mean"].append(mean(m["clip_frac_high"]))
            self._metrics[mode]["clip_ratio/region_mean"].append(mean(m["clip_frac_low"] + m["clip_frac_high"]))
        elif self.loss_type == "cispo":
            self._metrics[mode]["cispo_clip_ratio"].append(mean(m["clip_frac_high"]))
        return loss


def _rlpt_old_per_token(per_token_logps, mask, old_logps):
    """Per-token old log-probs whose masked row sum is TRL's old_logps: the current log-probs
    (detached), the row's whole difference on its first completion token. The summed log-ratio is
    then TRL's, sum(logp * mask) - old_logps, and no other rlpt output of the RLOO objective reads
    the per-token split."""
    old = per_token_logps.detach().clone()
    lp = per_token_logps.detach()
    has = mask.sum(1) > 0
    first = torch.argmax((mask > 0).to(torch.int8), dim=1)  # the first completion token of each row
    rows = torch.arange(old.size(0), device=old.device)
    diff = (lp * mask).sum(1) - old_logps.to(lp.dtype)
    old[rows[has], first[has]] = lp[rows[has], first[has]] - diff[has]
    return old


class RLOOTrainer(_TRLRLOOTrainer):
    """trl.RLOOTrainer with the loss computed by rlpt (see the module docstring)."""

    rlpt_loss_used = None
    _rlpt_cached = None

    def _rlpt_objective(self):
        key = (float(self.epsilon_low), float(self.epsilon_high))
        if self._rlpt_cached is None or self._rlpt_cached[0] != key:
            self._rlpt_cached = (key, rlpt.Objective.trl_rloo(epsilon=key[0], epsilon_high=key[1]))
        return self._rlpt_cached[1]

    def _compute_loss(self, model, inputs):
        self.rlpt_loss_used = "rlpt"
        per_token_logps, entropies, aux_loss = _forward(self, model, inputs)
        mask = inputs["completion_mask"]
        advantages, old_logps = inputs["advantages"], inputs["old_logps"]
        old = _rlpt_old_per_token(per_token_logps, mask, old_logps)
        loss, _ = rlpt.policy_loss(self._rlpt_objective(), per_token_logps, mask, old_logp=old, seq_adv=advantages)
        # A row with no completion token: no gradient on either side, but TRL's mean counts its loss
        # -A (its ratio is exp(0) = 1) where rlpt's counts 0.
        empty = mask.sum(1) == 0
        if bool(empty.any()):
            loss = loss - (advantages * empty).sum().to(loss.dtype) / mask.size(0)
        mode = "train" if self.model.training else "eval"
        if self.aux_loss_enabled:  # unscaled, as TRL's RLOO loss (the Trainer divides by gradient accumulation)
            loss = loss + self.router_aux_loss_coef * aux_loss
            self._metrics[mode]["aux_loss"].append(self.accelerator.gather_for_metrics(aux_loss).mean().item())
        with torch.no_grad():
            stats = self.accelerator.reduce(torch.stack([(entropies * mask).sum(), mask.sum().float()]),
                                            reduction="sum")
            self._metrics[mode]["entropy"].append((stats[0] / stats[1].clamp(min=1.0)).item())
            # TRL's clip metrics are per sequence, of the unclipped ratio and the advantage's sign.
            ratio = torch.exp((per_token_logps.detach() * mask).sum(1) - old_logps)
            low = ((ratio < 1 - self.epsilon_low) & (advantages < 0)).float()
            high = ((ratio > 1 + self.epsilon_high) & (advantages > 0)).float()
            gather = self.accelerator.gather
            low_all, high_all, region_all = gather(low), gather(high), gather(torch.maximum(low, high))
            m = self._metrics[mode]
            m["clip_ratio/low_mean"].append(low_all.nanmean().item())
            m["clip_ratio/low_min"].append(low_all.min().item() if low_all.numel() else float("nan"))
            m["clip_ratio/high_mean"].append(high_all.nanmean().item())
            m["clip_ratio/high_max"].append(high_all.max().item() if high_all.numel() else float("nan"))
            m["clip_ratio/region_mean"].append(region_all.nanmean().item())
        return loss
