"""Policy objectives: golden losses and gradients from verl, TRL, OpenRLHF and AReaL on seeded inputs.

Every loss comes from the peer's own function, and every gradient from torch autograd through it:
  verl      verl.trainer.ppo.core_algos: POLICY_LOSS_REGISTRY kernels (vanilla, gspo, sapo, geo_mean,
            cispo, dppo_tv, dppo_kl, dro, gpg, bypass_mode), agg_loss, kl_penalty, compute_value_loss;
            rollout corrections from
            verl.trainer.ppo.rollout_corr_helper.compute_rollout_correction_and_rejection_mask. The
            composed actor loss follows verl/workers/utils/losses.ppo_loss: pg_loss (with the rollout IS
            weights and the rejection-modified response mask) - entropy_coeff * agg_loss(entropy)
            + kl_loss_coef * agg_loss(kl_penalty).
  TRL       trl.trainer.grpo_trainer.GRPOTrainer._compute_loss itself, on an object created with
            object.__new__ that carries the attributes the method reads (loss_type, epsilons, beta,
            delta, importance_sampling_level, ...) and whose _get_per_token_logps_and_entropies returns
            the given log-probs (a leaf tensor) instead of running a model. The vLLM importance ratio
            is computed in TRL inside _generate_and_score_completions (needs generation); the one case
            that uses it builds the ratio with that method's formula (exp(old - sampling) clamped to
            [clip_min, clip_max], token_truncate) and passes it as inputs["importance_sampling_ratio"].
  OpenRLHF  openrlhf.models.loss.PolicyLoss / ValueLoss / aggregate_loss and
            openrlhf.models.utils.compute_approx_kl (imported without the package __init__).
  AReaL     areal.utils.functional.ppo_actor_loss_fn with areal.api.cli_args.RejectionSamplingConfig,
            and sapo_loss_fn (generate_areal).
Each case runs twice: float32 (the peers' dtype) and float64 (the same functions on float64
tensors), so the C++ tests can separate rlpt's rounding from the peer's.

Inputs: padded [B, T] with right padding, interior mask holes (multi-turn), a fully masked row,
finite garbage under the mask, per-sequence or per-token advantages with exact zeros, and (the
"large" sets) log-ratio gaps up to +-30 so the +-20 clamps bind.
"""
from collections import defaultdict
from types import SimpleNamespace as NS

import numpy as np
import torch

import peers
import rlpt_golden

B, T = 7, 24


# --- inputs ---------------------------------------------------------------------------------------

def make_inputs(rng, large=False, token_adv=False):
    lengths = rng.integers(3, T + 1, B)
    lengths[2] = 0  # a fully masked row
    mask = np.zeros((B, T), dtype=np.uint8)
    for b, n in enumerate(lengths):
        mask[b, :n] = 1
    holes = rng.random((B, T)) < 0.12  # multi-turn: environment tokens inside a response
    mask[holes] = 0
    lp = -rng.uniform(0.02, 4.0, (B, T))
    old = lp + rng.normal(0.0, 0.25, (B, T))
    behav = old + rng.normal(0.0, 0.2, (B, T))
    ref = lp + rng.normal(0.0, 0.4, (B, T))
    if large:
        pick = rng.random((B, T)) < 0.15
        old[pick] = lp[pick] + rng.choice([-30.0, -22.0, -8.0, -2.5, 2.5, 8.0, 22.0, 30.0], pick.sum())
        pick = rng.random((B, T)) < 0.1
        behav[pick] = old[pick] + rng.choice([-6.0, -1.5, 1.5, 6.0], pick.sum())
        pick = rng.random((B, T)) < 0.08
        ref[pick] = lp[pick] + rng.choice([-25.0, -12.0, 12.0, 25.0], pick.sum())
    if token_adv:
        adv = rng.normal(0.0, 1.0, (B, T))
        adv[rng.random((B, T)) < 0.1] = 0.0
    else:
        seq = rng.normal(0.0, 1.0, B)
        seq[rng.random(B) < 0.2] = 0.0
        adv = np.repeat(seq[:, None], T, axis=1)
    entropy = rng.uniform(0.0, 3.0, (B, T))
    values = rng.normal(0.0, 1.0, (B, T))
    old_values = values + rng.normal(0.0, 0.5, (B, T))
    returns = rng.normal(0.0, 1.0, (B, T))
    arrays = dict(lp=lp, old=old, behav=behav, ref=ref, adv=adv, entropy=entropy, values=values,
                  old_values=old_values, returns=returns)
    off = mask == 0  # finite garbage under the mask (kept within exp range for peers that don't clamp)
    for name in ("lp", "old", "behav", "ref"):
        arrays[name][off] = -rng.uniform(0.0, 30.0, off.sum())
    for name in ("adv", "entropy", "values", "old_values", "returns"):
        arrays[name][off] = rng.normal(0.0, 50.0, off.sum())
    arrays["mask"] = mask
    return arrays


# --- peers ------------------------------------------------------------------------------------------

def verl_modules():
    import verl.trainer.ppo.core_algos as algos
    import verl.trainer.ppo.rollout_corr_helper as corr
    from verl.workers.config import ActorConfig
    return algos, corr, ActorConfig


def _policy_loss_config(loss_mode, rollout_correction, dro_beta=None):
    from verl.trainer.config import RolloutCorrectionConfig
    from verl.workers.config.actor import PolicyLossConfig
    rc = RolloutCorrectionConfig(**(rollout_correction or {}))
    return PolicyLossConfig(loss_mode=loss_mode, rollout_correction=rc, dro_beta=dro_beta)


def verl_config(ActorConfig, loss_mode="vanilla", clip_ratio=0.2, low=None, high=None, c=3.0, agg="token-mean",
                batch_info=None, tau_pos=1.0, tau_neg=1.05, rollout_correction=None, dro_beta=None):
    cfg = ActorConfig(strategy="fsdp", rollout_n=1, clip_ratio=clip_ratio, clip_ratio_low=low, clip_ratio_high=high,
                      clip_ratio_c=c, ppo_micro_batch_size_per_gpu=1, loss_agg_mode=agg, tau_pos=tau_pos,
                      tau_neg=tau_neg, policy_loss=_policy_loss_config(loss_mode, rollout_correction, dro_beta))
    cfg.global_batch_info.update(batch_info or {})
    return cfg


class _Acc:
    num_processes = 1
    sync_gradients = True

    def gather(self, x):
        return x

    def gather_for_metrics(self, x):
        return x

    def reduce(self, x, reduction="sum"):
        return x


def trl_compute_loss(t, loss_type, beta=0.0, eps=0.2, eps_high=None, delta=None, level="token", bias_kl=False,
                     entropy_coef=0.0, ga=1, nitems=None, spg=None, is_ratio=None, max_len=None, seq_adv=True):
    """Calls GRPOTrainer._compute_loss on a stub trainer; t holds the (leaf) tensors."""
    from trl.trainer.grpo_trainer import GRPOTrainer
    tr = object.__new__(GRPOTrainer)
    tr.args = NS(delta=delta, use_bias_correction_kl=bias_kl, sapo_temperature_pos=1.0, sapo_temperature_neg=1.05,
                 steps_per_generation=spg or ga, entropy_target=0.2, vespo_k_pos=2.0, vespo_lambda_pos=3.0,
                 vespo_k_neg=3.0, vespo_lambda_neg=2.0)
    tr.loss_type = loss_type
    tr.epsilon_low = eps
    tr.epsilon_high = eps_high if eps_high is not None else eps
    tr.beta = beta
    tr.importance_sampling_level = level
    tr.top_entropy_quantile = 1.0
    tr.off_policy_mask_threshold = None
    tr.use_vllm = is_ratio is not None
    tr.vllm_importance_sampling_correction = is_ratio is not None
    tr.model = NS(training=True)
    tr.current_gradient_accumulation_steps = ga
    tr.max_completion_length = max_len or T
    tr.accelerator = _Acc()
    tr._entropy_bonus_enabled = entropy_coef != 0.0
    tr.use_adaptive_entropy = False
    tr.entropy_coef = entropy_coef
    tr._metrics = {"train": defaultdict(list), "eval": defaultdict(list)}
    tr.aux_loss_enabled = False
    tr._get_per_token_logps_and_entropies = lambda *a, **k: (t["lp"], t["entropy"], None)
    mask = t["mask"]
    adv = t["adv"][:, 0] if seq_adv else t["adv"]
    inputs = {"prompt_ids": torch.zeros(B, 1, dtype=torch.long), "prompt_mask": torch.ones(B, 1, dtype=torch.long),
              "completion_ids": torch.zeros(B, T, dtype=torch.long), "completion_mask": mask.long(),
              "advantages": adv, "old_per_token_logps": t["old"], "ref_per_token_logps": t["ref"]}
    if nitems is not None:
        inputs["num_items_in_batch"] = torch.tensor(float(nitems), dtype=t["lp"].dtype)
    if is_ratio is not None:
        inputs["importance_sampling_ratio"] = is_ratio
    return tr._compute_loss(None, inputs)


def trl_rloo_compute_loss(t, eps=0.2, eps_high=None):
    """Calls RLOOTrainer._compute_loss on a stub trainer: each row's summed log-ratio against the
    old log-probs summed as _generate_and_score_completions sums them."""
    from trl.trainer.rloo_trainer import RLOOTrainer
    tr = object.__new__(RLOOTrainer)
    tr.epsilon_low = eps
    tr.epsilon_high = eps_high if eps_high is not None else eps
    tr.model = NS(training=True)
    tr.accelerator = _Acc()
    tr._metrics = {"train": defaultdict(list), "eval": defaultdict(list)}
    tr.aux_loss_enabled = False
    tr._get_per_token_logps_and_entropies = lambda *a, **k: (t["lp"], t["entropy"], None)
    mask = t["mask"]
    inputs = {"prompt_ids": torch.zeros(B, 1, dtype=torch.long), "prompt_mask": torch.ones(B, 1, dtype=torch.long),
              "completion_ids": torch.zeros(B, T, dtype=torch.long), "completion_mask": mask.long(),
              "advantages": t["adv"][:, 0], "old_logps": (t["old"] * mask).sum(1)}
    return tr._compute_loss(None, inputs)


# --- case runner -----------------------------------------------------------------------------------

def run_case(out_dir, seed, name, inputs, fn, params):
    """Runs fn(tensors) -> loss in float32 and float64 with autograd; writes inputs, loss and grads."""
    arrays = {k: np.asarray(v) for k, v in inputs.items()}
    for dtype, suffix in ((torch.float32, ""), (torch.float64, "_64")):
        t = {k: torch.tensor(v, dtype=dtype) for k, v in inputs.items() if k != "mask"}
        t["mask"] = torch.tensor(inputs["mask"]).bool()
        for k in ("lp", "entropy", "values"):
            t[k].requires_grad_(True)
        loss = fn(t)
        loss.backward()
        arrays["loss" + suffix] = loss.detach().reshape(1)
        for k, out in (("lp", "grad_logp"), ("entropy", "grad_entropy"), ("values", "grad_values")):
            g = t[k].grad
            arrays[out + suffix] = g if g is not None else torch.zeros_like(t[k])
    rlpt_golden.write(out_dir / f"{name}.bin", arrays, peers.meta("objective", seed, case=name, B=B, T=T, **params))


def generate(out_dir, seed):
    torch.use_deterministic_algorithms(True)
    algos, corr, ActorConfig = verl_modules()
    loss_mod = peers.openrlhf_models("loss")
    orl_utils = peers.openrlhf_models("utils")
    rng = np.random.default_rng(seed)
    plain = make_inputs(rng)
    large = make_inputs(rng, large=True)
    tok = make_inputs(rng, large=True, token_adv=True)

    def pg(cfg, loss_mode=None, t=None, weights=None, mask=None):
        fn = algos.get_policy_loss_fn(loss_mode or cfg.policy_loss.loss_mode)
        loss, _ = fn(old_log_prob=t["old"], log_prob=t["lp"], advantages=t["adv"],
                     response_mask=t["mask"] if mask is None else mask, loss_agg_mode=cfg.loss_agg_mode, config=cfg,
                     rollout_is_weights=weights)
        return loss

    # ---------------- verl: each kernel x aggregation -------------------------------------------
    aggs = ["token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]
    for agg in aggs:
        tag = agg.replace("-", "_")
        info = {"loss_scale_factor": 32} if agg == "seq-mean-token-sum-norm" else {}
        cfg = verl_config(ActorConfig, "vanilla", agg=agg, batch_info=info)
        run_case(out_dir, seed, f"verl_vanilla_{tag}", large, lambda t, cfg=cfg: pg(cfg, t=t),
                 dict(peer="verl", loss_mode="vanilla", loss_agg_mode=agg, **info))
    cfg = verl_config(ActorConfig, "vanilla", low=0.2, high=0.28, c=3.0,
                      batch_info={"dp_size": 4, "batch_num_tokens": 400, "global_batch_size": 31})
    run_case(out_dir, seed, "verl_vanilla_clip_higher_global", tok, lambda t: pg(cfg, t=t),
             dict(peer="verl", loss_mode="vanilla", clip_ratio_low=0.2, clip_ratio_high=0.28, dp_size=4,
                  batch_num_tokens=400, global_batch_size=31))
    cfg = verl_config(ActorConfig, "vanilla", agg="seq-mean-token-mean",
                      batch_info={"dp_size": 2, "global_batch_size": 16})
    run_case(out_dir, seed, "verl_vanilla_seq_mean_token_mean_global", large, lambda t: pg(cfg, t=t),
             dict(peer="verl", loss_mode="vanilla", loss_agg_mode="seq-mean-token-mean", dp_size=2,
                  global_batch_size=16))
    for agg in ("token-mean", "seq-mean-token-mean"):
        for low, high in ((0.2, 0.28), (3e-4, 4e-4)):
            cfg = verl_config(ActorConfig, "gspo", low=low, high=high, agg=agg)
            run_case(out_dir, seed, f"verl_gspo_{agg.replace('-', '_')}_{'paper' if low < 0.01 else 'wide'}", tok,
                     lambda t, cfg=cfg: pg(cfg, t=t),
                     dict(peer="verl", loss_mode="gspo", loss_agg_mode=agg, clip_ratio_low=low, clip_ratio_high=high))
    cfg = verl_config(ActorConfig, "sapo", agg="token-mean")
    run_case(out_dir, seed, "verl_sapo", large, lambda t: pg(cfg, t=t),
             dict(peer="verl", loss_mode="sapo", tau_pos=1.0, tau_neg=1.05))
    cfg = verl_config(ActorConfig, "geo_mean", low=0.4, high=0.4)
    run_case(out_dir, seed, "verl_geo_mean", plain, lambda t: pg(cfg, t=t),
             dict(peer="verl", loss_mode="geo_mean", clip_ratio_low=0.4, clip_ratio_high=0.4))
    cfg = verl_config(ActorConfig, "cispo", low=10.0, high=0.28)
    run_case(out_dir, seed, "verl_cispo", large, lambda t: pg(cfg, t=t),
             dict(peer="verl", loss_mode="cispo", clip_ratio_low=10.0, clip_ratio_high=0.28))
    # DPPO: clip_ratio_low/high are divergence bounds, tight enough here that both sides drop tokens.
    for mode, low, high in (("dppo_tv", 0.05, 0.08), ("dppo_kl", 0.01, 0.02)):
        cfg = verl_config(ActorConfig, mode, low=low, high=high, c=3.0)
        run_case(out_dir, seed, f"verl_{mode}", large, lambda t, cfg=cfg: pg(cfg, t=t),
                 dict(peer="verl", loss_mode=mode, clip_ratio_low=low, clip_ratio_high=high, clip_ratio_c=3.0))
    # DRO: a quadratic penalty on the log-ratio; beta large enough that it moves the gradient.
    for agg, beta in (("token-mean", 0.5), ("seq-mean-token-mean", 2.0)):
        cfg = verl_config(ActorConfig, "dro", agg=agg, dro_beta=beta)
        run_case(out_dir, seed, f"verl_dro_{agg.replace('-', '_')}", large, lambda t, cfg=cfg: pg(cfg, t=t),
                 dict(peer="verl", loss_mode="dro", loss_agg_mode=agg, dro_beta=beta))
    cfg = verl_config(ActorConfig, "gpg", agg="seq-mean-token-sum")
    run_case(out_dir, seed, "verl_gpg", tok, lambda t: pg(cfg, t=t),
             dict(peer="verl", loss_mode="gpg", loss_agg_mode="seq-mean-token-sum"))

    # ---------------- verl: KL penalties ---------------------------------------------------------
    for kl_type in ("kl", "abs", "mse", "low_var_kl", "k1+", "abs+", "low_var_kl+"):
        def kl_case(t, kl_type=kl_type):
            kld = algos.kl_penalty(t["lp"], t["ref"], kl_type)
            return algos.agg_loss(kld, t["mask"], "token-mean")
        run_case(out_dir, seed, f"verl_kl_{kl_type.replace('+', '_plus')}", large, kl_case,
                 dict(peer="verl", kl_loss_type=kl_type, loss_agg_mode="token-mean"))

    # ---------------- verl: value loss ------------------------------------------------------------
    for agg in ("token-mean", "seq-mean-token-mean"):
        def value_case(t, agg=agg):
            loss, _ = algos.compute_value_loss(t["values"], t["returns"], t["old_values"], t["mask"], 0.5, agg)
            return loss
        run_case(out_dir, seed, f"verl_value_{agg.replace('-', '_')}", plain, value_case,
                 dict(peer="verl", cliprange_value=0.5, loss_agg_mode=agg))

    # ---------------- verl: rollout corrections and the composed actor loss -------------------------
    corrections = {
        "token_tis": dict(rollout_is="token", rollout_is_threshold=2.0),
        "seq_tis": dict(rollout_is="sequence", rollout_is_threshold=2.0),
        "token_icepop": dict(rollout_is="token", rollout_is_threshold="0.5_2.0"),
        "rs_token_k1": dict(rollout_rs="token_k1", rollout_rs_threshold="0.6_1.8"),
        "rs_seq_mean_k3": dict(rollout_rs="seq_mean_k3", rollout_rs_threshold=0.02),
        "rs_seq_max_k2": dict(rollout_rs="seq_max_k2", rollout_rs_threshold=0.05),
        "rs_seq_sum_k1": dict(rollout_rs="seq_sum_k1", rollout_rs_threshold="0.7_1.4"),
        "tis_and_rs_token_k2": dict(rollout_is="token", rollout_is_threshold=2.0, rollout_rs="token_k2",
                                    rollout_rs_threshold=0.5),
        # comma-separated criteria, every one must pass: one threshold per option, or one shared
        # (spaces and a repeated option as verl takes them)
        "rs_seq_mean_k3_and_token_k1": dict(rollout_rs="seq_mean_k3,token_k1", rollout_rs_threshold="0.02,0.8_1.25"),
        "rs_seq_shared_threshold": dict(rollout_rs="token_k2, seq_mean_k2,token_k2", rollout_rs_threshold="0.03"),
        "rs_seq_four": dict(rollout_rs="token_k2,seq_max_k2,seq_mean_k3,seq_sum_k1",
                            rollout_rs_threshold="0.08,0.1,0.03,0.5_1.2"),
        # every verl option at once: rows 0 and 3 pass all eleven, each other row fails one or more
        "rs_all_eleven": dict(rollout_rs="token_k1,token_k2,token_k3,seq_sum_k1,seq_sum_k2,seq_sum_k3,seq_mean_k1,"
                                         "seq_mean_k2,seq_mean_k3,seq_max_k2,seq_max_k3",
                              rollout_rs_threshold="0.65_1.6,0.09,0.07,0.6_1.6,0.34,0.5,0.9_1.12,0.03,0.04,0.1,0.1"),
        "tis_and_rs_token_k3_seq_sum_k1": dict(rollout_is="token", rollout_is_threshold=2.0,
                                               rollout_rs="token_k3,seq_sum_k1", rollout_rs_threshold="0.05,0.7_1.4"),
        "token_tis_batch_norm": dict(rollout_is="token", rollout_is_threshold=2.0, rollout_is_batch_normalize=True),
        "seq_icepop_batch_norm": dict(rollout_is="sequence", rollout_is_threshold="0.2_5.0",
                                      rollout_is_batch_normalize=True),
    }
    for cname, spec in corrections.items():
        cfg = verl_config(ActorConfig, "vanilla", low=0.2, high=0.28)

        def corr_case(t, spec=spec, cfg=cfg):
            with torch.no_grad():
                proto, mask, _ = corr.compute_rollout_correction_and_rejection_mask(
                    old_log_prob=t["old"], rollout_log_prob=t["behav"], response_mask=t["mask"].to(t["lp"].dtype),
                    rollout_is=spec.get("rollout_is"), rollout_is_threshold=spec.get("rollout_is_threshold", 2.0),
                    rollout_is_batch_normalize=spec.get("rollout_is_batch_normalize", False),
                    rollout_rs=spec.get("rollout_rs"), rollout_rs_threshold=spec.get("rollout_rs_threshold"))
            weights = proto.batch["rollout_is_weights"] if proto is not None else None
            return pg(cfg, t=t, weights=weights, mask=mask.bool())
        src = plain if "seq_" in (spec.get("rollout_rs") or "") else large  # sequence rejection: about half the rows pass
        run_case(out_dir, seed, f"verl_corr_{cname}", src, corr_case,
                 dict(peer="verl", loss_mode="vanilla", clip_ratio_high=0.28, **spec))

    def actor_case(t):
        # verl/workers/utils/losses.ppo_loss with use_kl_loss, entropy and token TIS.
        cfg = verl_config(ActorConfig, "vanilla", low=0.2, high=0.28, agg="token-mean")
        with torch.no_grad():
            proto, mask, _ = corr.compute_rollout_correction_and_rejection_mask(
                old_log_prob=t["old"], rollout_log_prob=t["behav"], response_mask=t["mask"].to(t["lp"].dtype),
                rollout_is="token", rollout_is_threshold=2.0)
        mask = mask.bool()
        loss = pg(cfg, t=t, weights=proto.batch["rollout_is_weights"], mask=mask)
        loss = loss - 0.01 * algos.agg_loss(t["entropy"], mask, "token-mean")
        kld = algos.kl_penalty(t["lp"], t["ref"], "low_var_kl")
        return loss + 0.05 * algos.agg_loss(kld, mask, "token-mean")
    run_case(out_dir, seed, "verl_actor_full", large, actor_case,
             dict(peer="verl", loss_mode="vanilla", clip_ratio_high=0.28, rollout_is="token", rollout_is_threshold=2.0,
                  entropy_coeff=0.01, kl_loss_type="low_var_kl", kl_loss_coef=0.05))

    def bypass_case(t):
        cfg = verl_config(ActorConfig, "bypass_mode", agg="seq-mean-token-sum",
                          rollout_correction=dict(loss_type="reinforce", rollout_is="token", rollout_is_threshold=2.0,
                                                  rollout_rs=None, bypass_mode=True))
        fn = algos.get_policy_loss_fn("bypass_mode")
        loss, _ = fn(old_log_prob=t["behav"], log_prob=t["lp"], advantages=t["adv"], response_mask=t["mask"],
                     loss_agg_mode="seq-mean-token-sum", config=cfg)
        return loss
    run_case(out_dir, seed, "verl_bypass_reinforce", tok, bypass_case,
             dict(peer="verl", loss_mode="bypass_mode", loss_type="reinforce", rollout_is="token",
                  rollout_is_threshold=2.0, loss_agg_mode="seq-mean-token-sum"))

    # ---------------- TRL: GRPOTrainer._compute_loss per loss_type --------------------------------------
    n_items = int(plain["mask"].sum()) * 2 + 5
    for lt in ("grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo"):
        kw = dict(ga=2, nitems=n_items, max_len=32)
        if lt == "cispo":
            kw["eps_high"] = 5.0
        run_case(out_dir, seed, f"trl_{lt}", plain, lambda t, lt=lt, kw=kw: trl_compute_loss(t, lt, **kw),
                 dict(peer="trl", loss_type=lt, gradient_accumulation_steps=2, num_items_in_batch=n_items,
                      max_completion_length=32, **({"epsilon_high": 5.0} if lt == "cispo" else {})))
    run_case(out_dir, seed, "trl_dapo_delta_beta", large,
             lambda t: trl_compute_loss(t, "dapo", beta=0.04, eps_high=0.28, delta=4.0, nitems=n_items),
             dict(peer="trl", loss_type="dapo", beta=0.04, epsilon_high=0.28, delta=4.0, num_items_in_batch=n_items))
    run_case(out_dir, seed, "trl_bnpo_bias_kl_entropy", plain,
             lambda t: trl_compute_loss(t, "bnpo", beta=0.1, bias_kl=True, entropy_coef=0.02, ga=3),
             dict(peer="trl", loss_type="bnpo", beta=0.1, use_bias_correction_kl=True, entropy_coef=0.02,
                  gradient_accumulation_steps=3))
    for lt in ("grpo", "dapo"):
        run_case(out_dir, seed, f"trl_{lt}_sequence", tok,
                 lambda t, lt=lt: trl_compute_loss(t, lt, level="sequence", nitems=n_items, seq_adv=False),
                 dict(peer="trl", loss_type=lt, importance_sampling_level="sequence", num_items_in_batch=n_items,
                      token_advantages=True))
    # SAPO's gate on the sequence ratio (per-token advantages: the gate's side is each token's).
    run_case(out_dir, seed, "trl_sapo_sequence", tok,
             lambda t: trl_compute_loss(t, "sapo", level="sequence", ga=2, seq_adv=False),
             dict(peer="trl", loss_type="sapo", importance_sampling_level="sequence", gradient_accumulation_steps=2,
                  token_advantages=True))

    # The bias-corrected KL at sequence level: TRL multiplies it by coef_1, the sequence ratio,
    # differentiated through the mean (grpo: GSPO; sapo: the gate on the sequence ratio).
    run_case(out_dir, seed, "trl_grpo_sequence_bias_kl", plain,
             lambda t: trl_compute_loss(t, "grpo", beta=0.1, level="sequence", bias_kl=True, ga=2),
             dict(peer="trl", loss_type="grpo", importance_sampling_level="sequence", beta=0.1,
                  use_bias_correction_kl=True, gradient_accumulation_steps=2))
    # CISPO at sequence level: every token's (detached) weight is its row's clamped sequence ratio; with
    # the bias-corrected KL, whose sequence ratio is differentiated.
    run_case(out_dir, seed, "trl_cispo_sequence", tok,
             lambda t: trl_compute_loss(t, "cispo", eps_high=1.05, level="sequence", nitems=n_items, seq_adv=False),
             dict(peer="trl", loss_type="cispo", importance_sampling_level="sequence", epsilon_high=1.05,
                  num_items_in_batch=n_items, token_advantages=True))
    run_case(out_dir, seed, "trl_cispo_sequence_bias_kl", plain,
             lambda t: trl_compute_loss(t, "cispo", eps_high=1.05, beta=0.1, level="sequence", bias_kl=True,
                                        nitems=n_items),
             dict(peer="trl", loss_type="cispo", importance_sampling_level="sequence", epsilon_high=1.05, beta=0.1,
                  use_bias_correction_kl=True, num_items_in_batch=n_items))
    run_case(out_dir, seed, "trl_sapo_sequence_bias_kl", tok,
             lambda t: trl_compute_loss(t, "sapo", beta=0.05, level="sequence", bias_kl=True, seq_adv=False),
             dict(peer="trl", loss_type="sapo", importance_sampling_level="sequence", beta=0.05,
                  use_bias_correction_kl=True, token_advantages=True))

    # LUSPO: the grpo surrogate, each row's token sum, the mean over rows (/ GA); sequence level as
    # TRL recommends (with a k3 KL term, which broadcasts the row's loss over its tokens), and token level.
    run_case(out_dir, seed, "trl_luspo_sequence", plain,
             lambda t: trl_compute_loss(t, "luspo", beta=0.04, level="sequence", ga=2),
             dict(peer="trl", loss_type="luspo", importance_sampling_level="sequence", beta=0.04,
                  gradient_accumulation_steps=2))
    run_case(out_dir, seed, "trl_luspo_token", tok,
             lambda t: trl_compute_loss(t, "luspo", eps_high=0.28, seq_adv=False),
             dict(peer="trl", loss_type="luspo", importance_sampling_level="token", epsilon_high=0.28,
                  token_advantages=True))
    # The same on the plain inputs: TRL does not clamp the ratio, so the large inputs' exp(30)
    # tokens set the golden bound's scale (1e12) and leave every other gradient checked loosely.
    run_case(out_dir, seed, "trl_luspo_token_plain", plain,
             lambda t: trl_compute_loss(t, "luspo", eps_high=0.28, seq_adv=False),
             dict(peer="trl", loss_type="luspo", importance_sampling_level="token", epsilon_high=0.28))

    # VESPO: a soft sequence weight phi(w) of the summed log-ratio, by the advantage's sign; the
    # generation batch's token count normalises as for dapo. Token advantages: both signs in a row.
    run_case(out_dir, seed, "trl_vespo", tok,
             lambda t: trl_compute_loss(t, "vespo", beta=0.04, nitems=n_items, seq_adv=False),
             dict(peer="trl", loss_type="vespo", beta=0.04, num_items_in_batch=n_items, token_advantages=True))
    # The same without the KL term, whose gradients on these inputs are 1e7 times VESPO's (the bound
    # scales with the largest gradient, so with it VESPO's own were checked loosely).
    # At sequence level TRL's vespo is the token-level one (coef_1 reaches only the bias-corrected KL).
    run_case(out_dir, seed, "trl_vespo_sequence", tok,
             lambda t: trl_compute_loss(t, "vespo", beta=0.04, level="sequence", nitems=n_items, seq_adv=False),
             dict(peer="trl", loss_type="vespo", beta=0.04, importance_sampling_level="sequence",
                  num_items_in_batch=n_items, token_advantages=True))
    run_case(out_dir, seed, "trl_vespo_no_kl", tok,
             lambda t: trl_compute_loss(t, "vespo", beta=0.0, nitems=n_items, seq_adv=False),
             dict(peer="trl", loss_type="vespo", beta=0.0, num_items_in_batch=n_items, token_advantages=True))
    # At sequence level with the bias-corrected KL: the KL times the sequence ratio, differentiated
    # through the mean, next to VESPO's own (clamped, summed) weight.
    run_case(out_dir, seed, "trl_vespo_sequence_bias_kl", plain,
             lambda t: trl_compute_loss(t, "vespo", beta=0.1, level="sequence", bias_kl=True, nitems=n_items),
             dict(peer="trl", loss_type="vespo", beta=0.1, importance_sampling_level="sequence",
                  use_bias_correction_kl=True, num_items_in_batch=n_items))

    # VESPO with the vLLM ratio: its log folds into the sequence weight (not the loss), a masked-out
    # ratio (0) as log 1e-8; token-mode ratios only, as TRL requires.
    for vmode, lo, hi in (("token_truncate", 0.5, 3.0), ("token_mask", 0.5, 2.0)):
        def vespo_vllm_case(t, vmode=vmode, lo=lo, hi=hi):
            ratio = torch.exp((t["old"] - t["behav"]) * t["mask"])
            if vmode == "token_truncate":
                ratio = ratio.clamp(min=lo, max=hi)
            else:
                ratio = ratio.masked_fill((ratio < lo) | (ratio > hi), 0.0)
            # no KL term: on these inputs its gradients are 1e7 times VESPO's and would hide them
            return trl_compute_loss(t, "vespo", beta=0.0, nitems=n_items, seq_adv=False, is_ratio=ratio)
        run_case(out_dir, seed, f"trl_vespo_vllm_{vmode}", tok, vespo_vllm_case,
                 dict(peer="trl", loss_type="vespo", beta=0.0, num_items_in_batch=n_items, token_advantages=True,
                      vllm_importance_sampling_mode=vmode, vllm_importance_sampling_min=lo,
                      vllm_importance_sampling_max=hi,
                      note="importance_sampling_ratio built with _generate_and_score_completions' formula"))

    def trl_vllm_case(t):
        # _generate_and_score_completions, token_truncate: ratio = clamp(exp((old - sampling) * mask), min, max)
        ratio = torch.exp((t["old"] - t["behav"]) * t["mask"]).clamp(min=0.5, max=3.0)
        return trl_compute_loss(t, "dapo", beta=0.04, nitems=n_items, is_ratio=ratio)
    run_case(out_dir, seed, "trl_dapo_vllm_token_truncate", large, trl_vllm_case,
             dict(peer="trl", loss_type="dapo", beta=0.04, vllm_importance_sampling_mode="token_truncate",
                  vllm_importance_sampling_min=0.5, vllm_importance_sampling_max=3.0, num_items_in_batch=n_items,
                  note="importance_sampling_ratio built with _generate_and_score_completions' formula"))
    # The same on the plain inputs (the large ones' KL gradients, 1e7, set the bound's scale).
    run_case(out_dir, seed, "trl_dapo_vllm_token_truncate_plain", plain, trl_vllm_case,
             dict(peer="trl", loss_type="dapo", beta=0.04, vllm_importance_sampling_mode="token_truncate",
                  vllm_importance_sampling_min=0.5, vllm_importance_sampling_max=3.0, num_items_in_batch=n_items,
                  note="importance_sampling_ratio built with _generate_and_score_completions' formula"))

    # ---------------- TRL: RLOOTrainer._compute_loss ----------------------------------------------------
    # TRL's loss counts a row with no completion token as -A (its ratio is exp(0)), rlpt's as 0: the
    # fully masked row gets A = 0 here (rlpt's Python trainer adds that term; python/tests/test_trl.py).
    rloo = {k: v.copy() for k, v in plain.items()}
    rloo["adv"][rloo["mask"].sum(1) == 0] = 0.0
    run_case(out_dir, seed, "trl_rloo", rloo, lambda t: trl_rloo_compute_loss(t), dict(peer="trl", trainer="rloo"))
    run_case(out_dir, seed, "trl_rloo_clip_higher", rloo, lambda t: trl_rloo_compute_loss(t, eps=0.1, eps_high=0.28),
             dict(peer="trl", trainer="rloo", epsilon=0.1, epsilon_high=0.28))

    # ---------------- OpenRLHF: PolicyLoss, ValueLoss, compute_approx_kl ----------------------------------
    def orl_policy(t, **kw):
        batch = kw.pop("batch", {})
        module = loss_mod.PolicyLoss(**kw)
        loss, *_ = module(t["lp"], t["old"], t["adv"], action_mask=t["mask"].to(t["lp"].dtype),
                          rollout_log_probs=t["behav"], **batch)
        return loss
    orl_cases = {
        "ppo": dict(),
        "ppo_dual_clip_global": dict(clip_eps_high=0.28, dual_clip=3.0,
                                     batch=dict(dp_size=2, batch_num_tokens=300.0)),
        "ppo_sample_level": dict(token_level_loss=False),
        "ppo_sample_level_global": dict(token_level_loss=False, batch=dict(dp_size=2, global_batch_size=20.0)),
        "gspo": dict(policy_loss_type="gspo"),
        "tis_clip": dict(is_correction_level="token", is_correction_mode="clip"),
        "icepop": dict(is_correction_level="token", is_correction_mode="mask"),
        "seq_mask_tis": dict(is_correction_level="seq", is_correction_mode="mask", is_correction_threshold=(0.8, 1.25)),
        # divergence gates (upper bound only), tight enough that both keep and drop tokens or rows
        "gate_binary_kl": dict(is_correction_level="token", is_correction_gating="binary_kl",
                               is_correction_threshold=(0.0, 0.005)),
        "gate_tv_seq": dict(is_correction_level="seq", is_correction_gating="tv", is_correction_threshold=(0.0, 0.15)),
    }
    for cname, kw in orl_cases.items():
        src = tok if cname == "gspo" else large
        run_case(out_dir, seed, f"openrlhf_{cname}", src, lambda t, kw=kw: orl_policy(t, **dict(kw)),
                 dict(peer="openrlhf", **{k: (list(v) if isinstance(v, tuple) else v) for k, v in kw.items()}))
    for est in ("k1", "k2", "k3"):
        for unbiased in (False, True):
            def orl_kl(t, est=est, unbiased=unbiased):
                kl = orl_utils.compute_approx_kl(t["lp"], t["ref"], t["old"], kl_estimator=est,
                                                 unbiased_gradient=unbiased)
                return loss_mod.aggregate_loss(kl, t["mask"].to(t["lp"].dtype))
            run_case(out_dir, seed, f"openrlhf_kl_{est}{'_unbiased' if unbiased else ''}", large, orl_kl,
                     dict(peer="openrlhf", kl_estimator=est, unbiased_gradient=unbiased))

    def orl_value(t):
        return loss_mod.ValueLoss(clip_eps=0.5)(t["values"], t["old_values"], t["returns"],
                                                action_mask=t["mask"].to(t["values"].dtype))
    run_case(out_dir, seed, "openrlhf_value", plain, orl_value, dict(peer="openrlhf", clip_eps=0.5))

    def orl_value_default(t):  # ValueLoss()'s clip_eps is None: the plain square
        return loss_mod.ValueLoss()(t["values"], t["old_values"], t["returns"],
                                    action_mask=t["mask"].to(t["values"].dtype))
    run_case(out_dir, seed, "openrlhf_value_unclipped", plain, orl_value_default, dict(peer="openrlhf"))

    # ---------------- AReaL: ppo_actor_loss_fn, sapo_loss_fn -------------------------------------------
    generate_areal(out_dir, seed, plain, large, tok)


def generate_areal(out_dir, seed, plain, large, tok):
    """AReaL's ppo_actor_loss_fn (with RejectionSamplingConfig) and sapo_loss_fn, 2D padded.

    rlpt's old_logp is AReaL's proximal_logprobs and behav_logp its old_logprobs (the inference
    engine's). The thresholds are chosen so that every criterion rejects some tokens or rows and keeps
    others; each case's rejected fraction (AReaL's own) is recorded in its parameters."""
    import importlib.metadata
    import warnings

    from areal.api.cli_args import RejectionSamplingConfig
    from areal.utils.functional import apply_rejection_sampling, ppo_actor_loss_fn, sapo_loss_fn
    version = importlib.metadata.version("areal")

    def rs_config(rs):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # agg at level token: ignored, as AReaL warns
            return RejectionSamplingConfig(**rs)

    def actor(t, rs=None, **kw):
        loss, _ = ppo_actor_loss_fn(logprobs=t["lp"], proximal_logprobs=t["old"], old_logprobs=t["behav"],
                                    advantages=t["adv"], loss_mask=t["mask"],
                                    rejection_sampling=None if rs is None else rs_config(rs), **kw)
        return loss

    def filtered(src, rs):
        m = torch.tensor(src["mask"]).bool()
        r = apply_rejection_sampling(torch.tensor(src["old"], dtype=torch.float32),
                                     torch.tensor(src["behav"], dtype=torch.float32), m, None, rs_config(rs))
        return r.filtered_fraction

    cases = {
        # name: (inputs, ppo_actor_loss_fn keywords, RejectionSamplingConfig keywords or None)
        "ppo_token_mask": (large, dict(eps_clip=0.2), dict()),
        "ppo_token_clamp_dual": (large, dict(eps_clip=0.2, eps_clip_higher=0.28, c_clip=3.0),
                                 dict(action="clamp", upper=1.2, lower=0.8)),
        "ppo_no_rejection": (large, dict(eps_clip=0.2, c_clip=3.0), None),
        "ppo_token_ratio_band": (plain, dict(eps_clip=0.2), dict(upper=1.2, lower=0.85)),
        "seq_ratio_mean": (plain, dict(eps_clip=0.2), dict(level="sequence", upper=1.04, lower=0.97)),
        "seq_ratio_sum": (plain, dict(eps_clip=0.2), dict(level="sequence", agg="sum", upper=1.6, lower=0.7)),
        "seq_ratio_max": (plain, dict(eps_clip=0.2), dict(level="sequence", agg="max", upper=1.5)),
        "seq_ratio_clamp": (plain, dict(eps_clip=0.2), dict(level="sequence", action="clamp", upper=1.03,
                                                           lower=0.98)),
        # Clamp on the sum or the max: the geometric-mean weight is clamped only in the sequences whose
        # aggregate is out of bounds. Chosen so that a row's weight is out of bounds with its aggregate
        # in them (sum: row 3, max: row 5), which a plain clamp would move, and another row is clamped.
        "seq_ratio_clamp_sum": (plain, dict(eps_clip=0.2), dict(level="sequence", action="clamp", agg="sum",
                                                               upper=1.6, lower=1.01)),
        "seq_ratio_clamp_max": (plain, dict(eps_clip=0.2), dict(level="sequence", action="clamp", agg="max",
                                                               upper=1.15, lower=0.95)),
        "token_kl_k1": (plain, dict(eps_clip=0.2), dict(metric="kl_k1", upper=0.2, lower=-0.15)),
        "token_kl_k2_band": (plain, dict(eps_clip=0.2), dict(metric="kl_k2", upper=0.03, lower=0.0015)),
        "seq_kl_k3_band": (plain, dict(eps_clip=0.2), dict(level="sequence", metric="kl_k3", upper=0.032,
                                                          lower=0.013)),
        "token_kl_k1_upper": (plain, dict(eps_clip=0.2), dict(metric="kl_k1", upper=-0.05)),
        "token_kl_k2": (plain, dict(eps_clip=0.2), dict(metric="kl_k2", upper=0.03)),
        "token_kl_k3": (large, dict(eps_clip=0.2), dict(metric="kl_k3", upper=0.03)),
        "seq_kl_k1_mean": (plain, dict(eps_clip=0.2), dict(level="sequence", metric="kl_k1", upper=0.05,
                                                          lower=-0.04)),
        "seq_kl_k2_sum": (plain, dict(eps_clip=0.2), dict(level="sequence", metric="kl_k2", agg="sum", upper=0.3)),
        "seq_kl_k3_max": (plain, dict(eps_clip=0.2), dict(level="sequence", metric="kl_k3", agg="max", upper=0.1)),
        "seq_kl_k1_max": (plain, dict(eps_clip=0.2), dict(level="sequence", metric="kl_k1", agg="max", upper=0.4)),
        "gspo_token_mask": (tok, dict(eps_clip=0.2, importance_sampling_level="sequence"),
                            dict(metric="kl_k2", upper=0.03)),
        "gspo_seq_adv": (plain, dict(eps_clip=0.2, eps_clip_higher=0.3, importance_sampling_level="sequence"),
                         dict(level="sequence", upper=1.04, lower=0.97)),
    }
    for cname, (src, kw, rs) in cases.items():
        params = dict(peer="areal", areal=version, **kw)
        if rs is not None:
            params.update(rejection_sampling=rs, filtered_fraction=filtered(src, rs))
        run_case(out_dir, seed, f"areal_{cname}", src, lambda t, kw=kw, rs=rs: actor(t, rs, **kw), params)

    def sapo(t, level="token"):
        loss, _ = sapo_loss_fn(logprobs=t["lp"], old_logprobs=t["old"], advantages=t["adv"], tau_pos=1.0,
                               tau_neg=1.05, loss_mask=t["mask"], importance_sampling_level=level)
        return loss
    run_case(out_dir, seed, "areal_sapo", plain, sapo, dict(peer="areal", areal=version, tau_pos=1.0, tau_neg=1.05))
    # Sequence level: the gate on exp(mean log-ratio), each token with its sequence's mean advantage.
    for src, tag in ((plain, ""), (tok, "_token_adv")):
        run_case(out_dir, seed, f"areal_sapo_sequence{tag}", src, lambda t: sapo(t, "sequence"),
                 dict(peer="areal", areal=version, tau_pos=1.0, tau_neg=1.05, importance_sampling_level="sequence",
                      token_advantages=src is tok))
