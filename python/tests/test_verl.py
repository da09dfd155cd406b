# SPDX-License-Identifier: Apache-2.0
"""rlpt.verl against verl 0.9.1: every function registered under rlpt's name gives verl's own
result through verl's registry lookup (float32 tolerance) and the same gradient, on seeded inputs
with ragged, out-of-order groups, one-token and empty rows, non-contiguous tensors and every
aggregation mode; patch() puts the rlpt functions under verl's names."""
import numpy as np
import pytest
import torch

pytest.importorskip("verl")
import rlpt  # noqa: E402
import rlpt.verl as rv  # noqa: E402
from conftest import close, ragged_mask  # noqa: E402
from verl.trainer.config import AlgoConfig, RolloutCorrectionConfig  # noqa: E402
from verl.trainer.ppo import core_algos as ca  # noqa: E402
from verl.workers.config import ActorConfig  # noqa: E402
from verl.workers.config.actor import PolicyLossConfig  # noqa: E402

AGG_MODES = ["token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean"]
TOL = dict(rtol=2e-5, atol=2e-6)


def rollout(seed, B=14, T=10):
    g = torch.Generator().manual_seed(seed)
    lengths, mask = ragged_mask(g, B, T, {0: 1, 3: 0})  # a one-token row, an empty row
    mask = mask.to(torch.int64)  # verl's response_mask (attention mask slice)
    # ragged groups in shuffled order, one of them a single sample
    uids = np.array(["p0"] * 4 + ["p1"] * 3 + ["p2"] * 5 + ["p3"] * 1 + ["p4"] * 1, dtype=object)
    uids = uids[torch.randperm(B, generator=g).numpy()]
    scores = torch.randint(0, 5, (B,), generator=g).float() / 4 + 0.1 * torch.rand(B, generator=g)
    tlr = torch.zeros(B, T)
    last = (lengths - 1).clamp(min=0)
    tlr[torch.arange(B), last] = scores * (lengths > 0)
    tlr += 0.01 * torch.randn(B, T, generator=g) * mask  # per-token shaping terms
    return g, mask, uids, tlr


@pytest.mark.parametrize("name", ["grpo", "grpo_vectorized", "rloo", "rloo_vectorized", "opo", "gpg",
                                  "reinforce_plus_plus", "reinforce_plus_plus_baseline", "remax", "grpo_passk"])
@pytest.mark.parametrize("seed", [0, 1])
def test_estimators_match_verl(name, seed):
    g, mask, uids, tlr = rollout(seed)
    if name == "grpo_passk":  # verl raises for a group of one
        keep = np.isin(uids, ["p0", "p1", "p2"])
        mask, uids, tlr = mask[keep], uids[keep], tlr[keep]
    config = AlgoConfig(gamma=0.97, norm_adv_by_std_in_grpo=True)
    kwargs = dict(token_level_rewards=tlr, response_mask=mask, config=config)
    if name not in ("reinforce_plus_plus", "remax"):
        kwargs["index"] = uids
    if name == "remax":
        kwargs["reward_baselines"] = torch.rand(tlr.shape[0], generator=g)
    ours = ca.get_adv_estimator_fn("rlpt_" + name)
    theirs = ca.get_adv_estimator_fn(name)
    a1, r1 = ours(**{k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in kwargs.items()})
    a2, r2 = theirs(**{k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in kwargs.items()})
    m = mask.to(torch.bool)
    close(a1 * m, a2 * m, what="advantages", **TOL)
    close(r1 * m, r2 * m, what="returns", **TOL)


@pytest.mark.parametrize("norm", [True, False])
def test_grpo_direct_call_and_dr_grpo(norm):
    _, mask, uids, tlr = rollout(5)
    a1, _ = rv.compute_grpo_outcome_advantage(tlr, mask, uids, norm_adv_by_std_in_grpo=norm)
    a2, _ = ca.compute_grpo_outcome_advantage(tlr.clone(), mask, uids, norm_adv_by_std_in_grpo=norm)
    close(a1, a2, **TOL)


def test_gae_matches_verl():
    g, mask, _, tlr = rollout(3)
    mask[0, 0] = 1
    values = torch.randn(tlr.shape, generator=g)
    # multi-turn style holes: masked tokens inside the response are skipped by both
    mask[5, 2] = 0
    a1, r1 = ca.get_adv_estimator_fn("rlpt_gae")(token_level_rewards=tlr, values=values, response_mask=mask,
                                                 gamma=0.95, lam=0.9)
    a2, r2 = ca.compute_gae_advantage_return(tlr, values, mask, 0.95, 0.9)
    close(a1 * mask, a2 * mask, **TOL)
    close(r1 * mask, r2 * mask, **TOL)


def actor_config(mode, agg, **kw):
    return ActorConfig(strategy="fsdp", rollout_n=1, clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=3.0,
                       ppo_micro_batch_size_per_gpu=1, loss_agg_mode=agg,
                       policy_loss=PolicyLossConfig(loss_mode=mode, rollout_correction=RolloutCorrectionConfig(),
                                                    dro_beta=0.5 if mode == "dro" else None),
                       **kw)


def policy_inputs(seed, B=12, T=9):
    g = torch.Generator().manual_seed(seed)
    _, mask = ragged_mask(g, B, T, {1: 1, 4: 0})
    wide = torch.rand(B, T + 5, generator=g) * -3  # log_prob[:, -T:] of a wider tensor: non-contiguous
    log_prob = wide[:, -T:]
    old = log_prob + 0.25 * torch.randn(B, T, generator=g)
    seq_adv = torch.randn(B, generator=g)
    adv = (seq_adv[:, None] * mask).t().contiguous().t()  # column-major: non-contiguous
    w = torch.rand(B, T, generator=g) * 2
    return wide, log_prob, old, adv, mask, w


@pytest.mark.parametrize("mode", ["vanilla", "gspo", "sapo", "gpg", "geo_mean", "cispo", "dppo_tv", "dppo_kl", "dro"])
@pytest.mark.parametrize("agg", AGG_MODES)
@pytest.mark.parametrize("weights", [False, True])
def test_policy_losses_match_verl(mode, agg, weights):
    if mode == "geo_mean" and agg != "token-mean":
        pytest.skip("geo_mean ignores loss_agg_mode")
    if mode == "dro" and weights:
        pytest.skip("rlpt_dro takes no rollout_is_weights (test_dro_refuses_rollout_is_weights)")
    wide, _, old, adv, mask, w = policy_inputs(7)
    cfg = actor_config(mode, agg)
    results = []
    for fn in (ca.get_policy_loss_fn("rlpt_" + mode), ca.get_policy_loss_fn(mode)):
        x = wide.clone().requires_grad_()
        loss, metrics = fn(old_log_prob=old, log_prob=x[:, -old.shape[1]:], advantages=adv, response_mask=mask,
                           loss_agg_mode=agg, config=cfg, rollout_is_weights=w if weights else None)
        (grad,) = torch.autograd.grad(loss, x)
        results.append((loss, grad, metrics))
    (l1, g1, m1), (l2, g2, m2) = results
    close(l1, l2, what="loss", **TOL)
    close(g1, g2, what="grad", rtol=2e-5, atol=1e-7)
    assert set(m1) == set(m2)
    if not weights:
        for k in m2:
            assert m1[k] == pytest.approx(m2[k], abs=1e-6), k


@pytest.mark.parametrize("mode", ["vanilla", "clip_cov"])
@pytest.mark.parametrize("bounds", ["default", "none"])
def test_clip_ratio_alone_as_verl_reads_it(mode, bounds):
    """ActorConfig's clip_ratio_low/high default to 0.2, not None: clip_ratio = 0.05 alone changes no
    bound in verl. Set to None, each bound is clip_ratio. The plugin reads them as verl does."""
    wide, _, old, adv, mask, _ = policy_inputs(9)
    kw = {} if bounds == "default" else dict(clip_ratio_low=None, clip_ratio_high=None)
    cfg = ActorConfig(strategy="fsdp", rollout_n=1, clip_ratio=0.05, ppo_micro_batch_size_per_gpu=1,
                      policy_loss=PolicyLossConfig(loss_mode=mode, rollout_correction=RolloutCorrectionConfig(),
                                                   clip_cov_ratio=0.05),
                      **kw)
    losses = []
    for fn in (ca.get_policy_loss_fn("rlpt_" + mode), ca.get_policy_loss_fn(mode)):
        torch.manual_seed(5)
        losses.append(fn(old_log_prob=old, log_prob=wide[:, -old.shape[1]:], advantages=adv, response_mask=mask,
                         loss_agg_mode="token-mean", config=cfg)[0])
    close(losses[0], losses[1], what="loss", **TOL)
    # The two readings give different losses on these inputs, so the comparison tests the reading.
    other = dict(clip_ratio_low=None, clip_ratio_high=None) if bounds == "default" else {}
    cfg2 = ActorConfig(strategy="fsdp", rollout_n=1, clip_ratio=0.05, ppo_micro_batch_size_per_gpu=1,
                       policy_loss=cfg.policy_loss, **other)
    torch.manual_seed(5)
    alt = ca.get_policy_loss_fn(mode)(old_log_prob=old, log_prob=wide[:, -old.shape[1]:], advantages=adv,
                                      response_mask=mask, loss_agg_mode="token-mean", config=cfg2)[0]
    assert abs(float(alt - losses[1])) > 1e-4 * abs(float(losses[1]))


def test_preset_defaults_are_actor_configs():
    """rlpt.Objective.verl_actor() with ActorConfig's defaults: clip_ratio alone moves no bound."""
    _, lp, old, adv, mask, _ = policy_inputs(9)
    cfg = ActorConfig(strategy="fsdp", rollout_n=1, clip_ratio=0.05, ppo_micro_batch_size_per_gpu=1)
    want = ca.get_policy_loss_fn("vanilla")(old_log_prob=old, log_prob=lp, advantages=adv, response_mask=mask,
                                            loss_agg_mode="token-mean", config=cfg)[0]
    got, _ = rlpt.policy_loss(rlpt.Objective.verl_actor(clip_ratio=0.05), lp, mask, old_logp=old, adv=adv)
    close(got, want, what="loss", **TOL)


def batch_normalized(seed, level, threshold):
    """policy_inputs with rollout log-probs, and verl's own rollout correction of them with
    rollout_is_batch_normalize: (log_prob, old, behav, adv, mask, verl's weights, mask, metrics)."""
    from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_and_rejection_mask
    _, lp, old, adv, mask, _ = policy_inputs(seed)
    behav = old + 0.4 * torch.randn(old.shape, generator=torch.Generator().manual_seed(seed + 1))
    with torch.no_grad():
        proto, rmask, metrics = compute_rollout_correction_and_rejection_mask(
            old_log_prob=old, rollout_log_prob=behav, response_mask=mask.float(), rollout_is=level,
            rollout_is_threshold=threshold, rollout_is_batch_normalize=True)
    return lp, old, behav, adv, mask, proto.batch["rollout_is_weights"], rmask, metrics


@pytest.mark.parametrize("level,threshold", [("token", 2.0), ("sequence", "0.2_5.0")])
def test_rollout_is_batch_normalize_matches_verl(level, threshold):
    # verl's own rollout correction with rollout_is_batch_normalize, then its vanilla loss with those
    # weights, against the verl_actor preset that forms and normalises the weights itself.
    lp, old, behav, adv, mask, w, rmask, _ = batch_normalized(11, level, threshold)
    x = lp.clone().requires_grad_()
    want, _ = ca.get_policy_loss_fn("vanilla")(old_log_prob=old, log_prob=x, advantages=adv, response_mask=rmask.bool(),
                                               loss_agg_mode="token-mean", config=actor_config("vanilla", "token-mean"),
                                               rollout_is_weights=w)
    (gw,) = torch.autograd.grad(want, x)
    obj = rlpt.Objective.verl_actor(clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=3.0, rollout_is=level,
                                    rollout_is_threshold=str(threshold), rollout_is_batch_normalize=True)
    y = lp.clone().requires_grad_()
    loss, _ = rlpt.policy_loss(obj, y, mask, old_logp=old, behav_logp=behav, adv=adv)
    (gy,) = torch.autograd.grad(loss, y)
    close(loss, want, what="loss", **TOL)
    close(gy, gw, what="grad", rtol=2e-5, atol=1e-7)
    # Without the normalisation the loss differs (the weights' mean is not 1 on these inputs).
    plain = rlpt.Objective.verl_actor(clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=3.0, rollout_is=level,
                                      rollout_is_threshold=str(threshold))
    other, _ = rlpt.policy_loss(plain, lp, mask, old_logp=old, behav_logp=behav, adv=adv)
    assert abs(float(other.detach()) - float(want.detach())) > 1e-4 * abs(float(want.detach()))


@pytest.mark.parametrize("rs,threshold", [("token_k1,seq_max_k2", "0.7_1.4,0.3"),
                                          ("seq_mean_k3, token_k2,seq_sum_k1", "0.08,0.1,0.5_2.0"),
                                          ("token_k1,token_k3,seq_sum_k2,seq_mean_k1,seq_max_k3,seq_mean_k2,seq_sum_k3",
                                           "0.5_2.0,0.3,0.5,0.85_1.15,0.5,0.08,0.6")])
def test_comma_separated_rollout_rs_matches_verl(rs, threshold):
    # verl's own correction with several rejection criteria (every one must pass) and token TIS, then
    # its vanilla loss, against the verl_actor preset that applies them itself.
    from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_and_rejection_mask
    _, lp, old, adv, mask, _ = policy_inputs(13)
    behav = old + 0.3 * torch.randn(old.shape, generator=torch.Generator().manual_seed(14))
    with torch.no_grad():
        proto, rmask, metrics = compute_rollout_correction_and_rejection_mask(
            old_log_prob=old, rollout_log_prob=behav, response_mask=mask.float(), rollout_is="token",
            rollout_is_threshold=2.0, rollout_rs=rs, rollout_rs_threshold=threshold)
    each = [v for k, v in metrics.items()
            if k.endswith("_masked_fraction") and "seq_masked" not in k and not k.endswith("/rollout_rs_masked_fraction")]
    assert len(each) == len(rs.split(",")) and min(each) > 0  # every option rejects some tokens...
    assert metrics["rollout_corr/rollout_rs_masked_fraction"] > max(each)  # ...and not the same ones
    x = lp.clone().requires_grad_()
    want, _ = ca.get_policy_loss_fn("vanilla")(old_log_prob=old, log_prob=x, advantages=adv, response_mask=rmask.bool(),
                                               loss_agg_mode="token-mean", config=actor_config("vanilla", "token-mean"),
                                               rollout_is_weights=proto.batch["rollout_is_weights"])
    (gw,) = torch.autograd.grad(want, x)
    obj = rlpt.Objective.verl_actor(clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=3.0, rollout_is="token",
                                    rollout_is_threshold="2.0", rollout_rs=rs, rollout_rs_threshold=threshold)
    y = lp.clone().requires_grad_()
    loss, _ = rlpt.policy_loss(obj, y, mask, old_logp=old, behav_logp=behav, adv=adv)
    (gy,) = torch.autograd.grad(loss, y)
    close(loss, want, what="loss", **TOL)
    close(gy, gw, what="grad", rtol=2e-5, atol=1e-7)


def test_local_is_weights_is_verls_batch_norm_factor_and_adds_over_micro_batches():
    lp, old, behav, adv, mask, _, _, metrics = batch_normalized(13, "token", 2.0)
    (factor,) = [v for k, v in metrics.items() if k.endswith("rollout_is_batch_norm_factor")]
    obj = rlpt.Objective.verl_actor(rollout_is="token", rollout_is_threshold="2.0", rollout_is_batch_normalize=True)
    kw = dict(old_logp=old, behav_logp=behav, adv=adv)
    full = rlpt.local_is_weights(obj, lp, mask, **kw)
    assert float(full[0] / full[1]) == pytest.approx(factor, rel=1e-6)
    # A step of two micro-batches: their shares add up, and with the step's mean and denominators
    # the micro-batch losses add up to the full batch's.
    halves = [slice(0, 5), slice(5, None)]
    part = {h.start: {k: v[h] for k, v in kw.items()} for h in halves}
    shares = sum(rlpt.local_is_weights(obj, lp[h], mask[h], **part[h.start]) for h in halves)
    close(shares, full, rtol=1e-12, atol=0, what="is weight sums")
    den = sum(rlpt.local_denominators(obj, lp[h], mask[h], **part[h.start]) for h in halves)
    step = rlpt.Objective.verl_actor(rollout_is="token", rollout_is_threshold="2.0", rollout_is_batch_normalize=True,
                                     rollout_is_batch_mean=float(shares[0] / shares[1]))
    step = step.with_denominators(float(den[0]), float(den[1]))
    total = sum(rlpt.policy_loss(step, lp[h], mask[h], **part[h.start])[0] for h in halves)
    whole, _ = rlpt.policy_loss(obj, lp, mask, **kw)
    close(total, whole, rtol=1e-5, atol=1e-7, what="step loss")


def test_dro_refuses_rollout_is_weights_and_needs_beta():
    _, lp, old, adv, mask, w = policy_inputs(7)
    fn = ca.get_policy_loss_fn("rlpt_dro")
    with pytest.raises(NotImplementedError, match="rollout_is_weights"):
        fn(old_log_prob=old, log_prob=lp, advantages=adv, response_mask=mask, config=actor_config("dro", "token-mean"),
           rollout_is_weights=w)
    no_beta = ActorConfig(strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1,
                          policy_loss=PolicyLossConfig(loss_mode="dro", rollout_correction=RolloutCorrectionConfig()))
    with pytest.raises(rlpt.Error, match="dro_beta"):
        fn(old_log_prob=old, log_prob=lp, advantages=adv, response_mask=mask, config=no_beta)


def cov_inputs(seed, B=24, T=40):
    """Rows with spread advantages and log-ratios, so that Clip-Cov finds tokens in (lb, ub) that
    the clip did not take, and KL-Cov's top share is more than one token."""
    g = torch.Generator().manual_seed(seed)
    _, mask = ragged_mask(g, B, T, {2: 0})
    log_prob = torch.rand(B, T, generator=g) * -6
    old = log_prob + 0.3 * torch.randn(B, T, generator=g)
    adv = 2.5 * torch.randn(B, 1, generator=g) * mask
    w = torch.rand(B, T, generator=g) * 2
    return log_prob, old, adv, mask, w


@pytest.mark.parametrize("mode", ["clip_cov", "kl_cov"])
@pytest.mark.parametrize("agg", AGG_MODES)
@pytest.mark.parametrize("weights", [False, True])
def test_cov_policy_losses_match_verl(mode, agg, weights):
    if mode == "kl_cov" and weights:
        pytest.skip("rlpt_kl_cov takes no rollout_is_weights (test_kl_cov_refuses_rollout_is_weights)")
    lp, old, adv, mask, w = cov_inputs(3)
    cfg = ActorConfig(strategy="fsdp", rollout_n=1, clip_ratio_low=0.2, clip_ratio_high=0.28,
                      ppo_micro_batch_size_per_gpu=1, loss_agg_mode=agg,
                      policy_loss=PolicyLossConfig(loss_mode=mode, rollout_correction=RolloutCorrectionConfig(),
                                                   clip_cov_ratio=0.05, clip_cov_lb=0.5, kl_cov_ratio=0.02,
                                                   ppo_kl_coef=0.7))
    results = []
    for fn in (ca.get_policy_loss_fn("rlpt_" + mode), ca.get_policy_loss_fn(mode)):
        torch.manual_seed(11)  # Clip-Cov's torch.randperm: the same draw on both sides
        x = lp.clone().requires_grad_()
        loss, metrics = fn(old_log_prob=old, log_prob=x, advantages=adv, response_mask=mask, loss_agg_mode=agg,
                           config=cfg, rollout_is_weights=w if weights else None)
        (grad,) = torch.autograd.grad(loss, x)
        results.append((loss.detach(), grad, metrics))
    (l1, g1, m1), (l2, g2, m2) = results
    close(l1, l2, what="loss", **TOL)
    close(g1, g2, what="grad", rtol=2e-5, atol=1e-7)
    assert set(m1) == set(m2)
    for k in m2:
        assert m1[k] == pytest.approx(m2[k], abs=1e-6), k
    # The selection changes the loss on these inputs, so the comparison above tests it.
    n = int(mask.sum())
    if mode == "clip_cov":
        assert m2["actor/pg_clipfrac"] * n == pytest.approx(max(int(0.05 * n), 1))
    else:
        plain = ca.agg_loss(-adv * torch.exp(lp - old), mask, agg)
        assert abs(float(l2 - plain)) > 1e-3 * abs(float(plain))


def test_kl_cov_refuses_rollout_is_weights():
    lp, old, adv, mask, w = cov_inputs(3)
    cfg = ActorConfig(strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1,
                      policy_loss=PolicyLossConfig(loss_mode="kl_cov", rollout_correction=RolloutCorrectionConfig()))
    with pytest.raises(NotImplementedError, match="rollout_is_weights"):
        rv.compute_policy_loss_kl_cov(old, lp, adv, mask, config=cfg, rollout_is_weights=w)


@pytest.mark.parametrize("kl_type", ["kl", "abs", "mse", "low_var_kl", "k3+"])
@pytest.mark.parametrize("agg", AGG_MODES)
def test_kl_loss_matches_verl(kl_type, agg):
    _, lp, _, _, mask, _ = policy_inputs(9)
    ref = lp + 0.4 * torch.randn(lp.shape, generator=torch.Generator().manual_seed(2))
    x1 = lp.clone().requires_grad_()
    x2 = lp.clone().requires_grad_()
    l1 = rv.kl_loss(x1, ref, mask, kl_type, agg)
    l2 = ca.agg_loss(ca.kl_penalty(x2, ref, kl_type), mask, agg)
    close(l1, l2, **TOL)
    close(torch.autograd.grad(l1, x1)[0], torch.autograd.grad(l2, x2)[0], rtol=2e-5, atol=1e-7)


def test_value_loss_matches_verl():
    g = torch.Generator().manual_seed(4)
    v = torch.randn(6, 8, generator=g)
    old = v + 0.5 * torch.randn(6, 8, generator=g)
    ret = torch.randn(6, 8, generator=g)
    mask = torch.rand(6, 8, generator=g) > 0.3
    x1, x2 = v.clone().requires_grad_(), v.clone().requires_grad_()
    l1, c1 = rv.compute_value_loss(x1, ret, old, mask, 0.5)
    l2, c2 = ca.compute_value_loss(x2, ret, old, mask, 0.5)
    close(l1, l2, **TOL)
    close(c1, c2, **TOL)
    close(torch.autograd.grad(l1, x1)[0], torch.autograd.grad(l2, x2)[0], **TOL)


def test_logprobs_from_logits_matches_verl():
    from verl.utils import torch_functional as vf

    g = torch.Generator().manual_seed(8)
    logits = torch.randn(3, 7, 40, generator=g) * 3
    labels = torch.randint(0, 40, (3, 7), generator=g)
    x1, x2 = logits.clone().requires_grad_(), logits.clone().requires_grad_()
    lp1 = rv.logprobs_from_logits(x1, labels)
    lp2 = vf.logprobs_from_logits(x2, labels)
    close(lp1, lp2, 1e-5, 1e-5)
    close(rv.entropy_from_logits(logits), vf.entropy_from_logits(logits), 1e-5, 1e-5)
    close(torch.autograd.grad(lp1.sum(), x1)[0], torch.autograd.grad(lp2.sum(), x2)[0], 1e-5, 1e-6)


def test_patch_puts_rlpt_under_verl_names():
    orig_loss = ca.get_policy_loss_fn("vanilla")
    rv.patch()
    try:
        assert ca.get_policy_loss_fn("vanilla") is rv.compute_policy_loss_vanilla
        assert ca.get_adv_estimator_fn("rloo") is rv.compute_rloo_outcome_advantage
        assert ca.compute_grpo_outcome_advantage is rv.compute_grpo_outcome_advantage
        assert ca.compute_gae_advantage_return is rv.compute_gae_advantage_return
    finally:
        rv.unpatch()
    assert ca.get_policy_loss_fn("vanilla") is orig_loss


def test_plugin_entry_point_is_declared():
    from importlib.metadata import entry_points

    eps = [e for e in entry_points(group="verl.plugins") if e.name == "rlpt"]
    assert eps and eps[0].value == "rlpt.verl:_plugin"
    assert "rlpt_vanilla" in ca.POLICY_LOSS_REGISTRY and "rlpt_grpo" in ca.ADV_ESTIMATOR_REGISTRY


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_mismatch_metrics_match_verl(seed):
    from verl import DataProto
    from verl.trainer.ppo.rollout_corr_helper import compute_offpolicy_metrics
    from verl.utils.debug.metrics import calculate_debug_metrics

    g = torch.Generator().manual_seed(seed)
    B, T = 9, 17
    _, mask = ragged_mask(g, B, T, {0: T, 1: 1})  # every row has a valid token: verl averages over all rows
    rollout = -torch.rand(B, T, generator=g) * 4 - 1e-3
    trainer = (rollout + 0.2 * torch.randn(B, T, generator=g)).clamp(max=-1e-4)
    want = compute_offpolicy_metrics(old_log_prob=trainer, rollout_log_prob=rollout, response_mask=mask)
    got = rv.compute_offpolicy_metrics(trainer, rollout, mask)
    assert set(got) == set(want)
    for k in want:
        assert got[k] == pytest.approx(want[k], rel=1e-5, abs=1e-6), k
    only = rv.compute_offpolicy_metrics(trainer, None, mask)
    want_only = compute_offpolicy_metrics(old_log_prob=trainer, rollout_log_prob=None, response_mask=mask)
    assert set(only) == set(want_only)
    for k in want_only:
        assert only[k] == pytest.approx(want_only[k], rel=1e-5), k
    data = DataProto.from_dict(tensors={"rollout_log_probs": rollout, "old_log_probs": trainer,
                                        "response_mask": mask.long(), "responses": torch.zeros(B, T, dtype=torch.long)})
    want, got = calculate_debug_metrics(data), rv.calculate_debug_metrics(data)
    assert set(got) == set(want)
    for k in want:
        assert got[k] == pytest.approx(want[k], rel=1e-5, abs=1e-6), k
    data.batch["response_mask"] = torch.zeros(B, T, dtype=torch.long)
    want, got = calculate_debug_metrics(data), rv.calculate_debug_metrics(data)
    assert got["training/rollout_probs_diff_valid"] == want["training/rollout_probs_diff_valid"] == 0
