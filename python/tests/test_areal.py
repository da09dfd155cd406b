# SPDX-License-Identifier: Apache-2.0
"""rlpt.Objective.areal_actor against AReaL 1.0.4's own ppo_actor_loss_fn and sapo_loss_fn."""
import warnings

import pytest
import torch

pytest.importorskip("areal")
from areal.api.cli_args import RejectionSamplingConfig  # noqa: E402
from areal.utils.functional import apply_rejection_sampling, ppo_actor_loss_fn, sapo_loss_fn  # noqa: E402

import rlpt  # noqa: E402
from conftest import close, ragged_mask  # noqa: E402

TOL = dict(rtol=2e-5, atol=2e-6)


def inputs(seed, B=12, T=16, token_adv=False):
    g = torch.Generator().manual_seed(seed)
    _, mask = ragged_mask(g, B, T, {2: 1})
    mask[5, 3] = False  # an interior hole
    lp = torch.rand(B, T, generator=g) * -3
    prox = lp + 0.25 * torch.randn(B, T, generator=g)
    behave = prox + 0.2 * torch.randn(B, T, generator=g)
    behave[0, 0] -= 2.5  # ratios of e^2.5 and e^-2.5: outside even the default bound (5)
    behave[3, 0] += 2.5
    if token_adv:
        adv = torch.randn(B, T, generator=g)
    else:
        adv = torch.randn(B, 1, generator=g).expand(B, T).contiguous()
    return lp, prox, behave, adv, mask


def rs_config(rs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # agg at level token: AReaL warns that it ignores it
        return RejectionSamplingConfig(**rs)


CASES = [
    (dict(), dict()),  # RejectionSamplingConfig's defaults: token, mask, ratio <= 5
    (dict(eps_clip_higher=0.28, c_clip=3.0), dict(action="clamp", upper=1.2, lower=0.8)),
    (dict(), dict(upper=1.15, lower=0.9)),
    (dict(), dict(level="sequence", upper=1.05, lower=0.96)),
    (dict(), dict(level="sequence", agg="sum", upper=1.5, lower=0.7)),
    (dict(), dict(level="sequence", agg="max", upper=1.4)),
    (dict(), dict(level="sequence", action="clamp", upper=1.03, lower=0.98)),
    # Clamp on the sum and the max: rows 4 (sum) and 6, 11 (max) have their weight out of bounds and
    # their aggregate in them, so AReaL leaves them unclamped.
    (dict(), dict(level="sequence", action="clamp", agg="sum", upper=1.5, lower=1.05)),
    (dict(), dict(level="sequence", action="clamp", agg="max", upper=1.3, lower=0.95)),
    (dict(), dict(metric="kl_k2", upper=0.02, lower=0.001)),
    (dict(), dict(metric="kl_k2", upper=0.02, lower=-0.3)),  # a lower bound <= 0 on a square: none
    (dict(), dict(level="sequence", metric="kl_k3", upper=0.03, lower=0.015)),
    (dict(), dict(metric="kl_k1", upper=0.2, lower=-0.15)),
    (dict(), dict(metric="kl_k2", upper=0.02)),
    (dict(), dict(metric="kl_k3", upper=0.02)),
    (dict(), dict(level="sequence", metric="kl_k1", agg="max", upper=0.3)),
    (dict(), dict(level="sequence", metric="kl_k2", agg="sum", upper=0.2)),
    (dict(), dict(level="sequence", metric="kl_k3", agg="mean", upper=0.02)),
    (dict(importance_sampling_level="sequence"), dict(metric="kl_k2", upper=0.02)),
    (dict(importance_sampling_level="sequence", eps_clip_higher=0.3), dict(level="sequence", upper=1.05)),
    (dict(c_clip=3.0), None),
]


@pytest.mark.parametrize("token_adv", [False, True])
@pytest.mark.parametrize("kw,rs", CASES)
def test_ppo_actor_loss_matches(kw, rs, token_adv):
    lp, prox, behave, adv, mask = inputs(11, token_adv=token_adv)
    if rs is not None and rs.get("action", "mask") == "mask":
        frac = apply_rejection_sampling(prox, behave, mask, None, rs_config(rs)).filtered_fraction
        assert 0.0 < frac < 1.0, f"thresholds reject {frac} of the tokens"
    x = lp.clone().requires_grad_()
    want, _ = ppo_actor_loss_fn(logprobs=x, proximal_logprobs=prox, old_logprobs=behave, advantages=adv,
                                eps_clip=0.2, loss_mask=mask,
                                rejection_sampling=None if rs is None else rs_config(rs), **kw)
    want.backward()
    obj = rlpt.Objective.areal_actor(rejection_sampling=False if rs is None else rs, **kw)
    y = lp.clone().requires_grad_()
    got, _ = rlpt.policy_loss(obj, y, mask, old_logp=prox, behav_logp=behave, adv=adv)
    got.backward()
    close(got, want, **TOL, what="loss")
    close(y.grad, x.grad, **TOL, what="grad")


def test_config_object_and_defaults():
    """The RejectionSamplingConfig object itself, and rejection_sampling=True for its defaults."""
    lp, prox, behave, adv, mask = inputs(5)
    cfg = rs_config(dict(level="sequence", metric="kl_k3", agg="max", upper=0.08))
    a, _ = rlpt.policy_loss(rlpt.Objective.areal_actor(rejection_sampling=cfg), lp, mask, old_logp=prox,
                            behav_logp=behave, adv=adv)
    b, _ = rlpt.policy_loss(rlpt.Objective.areal_actor(rejection_sampling=dict(level="sequence", metric="kl_k3",
                                                                                agg="max", upper=0.08)),
                            lp, mask, old_logp=prox, behav_logp=behave, adv=adv)
    assert torch.equal(a, b)
    want, _ = ppo_actor_loss_fn(logprobs=lp, proximal_logprobs=prox, old_logprobs=behave, advantages=adv,
                                eps_clip=0.2, loss_mask=mask, rejection_sampling=RejectionSamplingConfig())
    got, _ = rlpt.policy_loss(rlpt.Objective.areal_actor(rejection_sampling=True), lp, mask, old_logp=prox,
                              behav_logp=behave, adv=adv)
    close(got, want, **TOL, what="RejectionSamplingConfig defaults")
    # PPOActorConfig's and ppo_actor_loss_fn's default: rejection_sampling None, no behaviour weight.
    want, _ = ppo_actor_loss_fn(logprobs=lp, proximal_logprobs=prox, old_logprobs=behave, advantages=adv,
                                eps_clip=0.2, loss_mask=mask)
    got, _ = rlpt.policy_loss(rlpt.Objective.areal_actor(), lp, mask, old_logp=prox, adv=adv)
    close(got, want, **TOL, what="PPOActorConfig defaults")
    assert not torch.allclose(want, a)  # cfg's rejection moves this loss
    # ppo_actor_loss_fn filters whenever rejection_sampling is set, decoupled loss or not.
    c, _ = rlpt.policy_loss(rlpt.Objective.areal_actor(rejection_sampling=cfg, use_decoupled_loss=False), lp, mask,
                            old_logp=prox, behav_logp=behave, adv=adv)
    assert torch.equal(c, a)


def test_sapo_matches():
    lp, prox, _, adv, mask = inputs(7)
    x = lp.clone().requires_grad_()
    want, _ = sapo_loss_fn(logprobs=x, old_logprobs=prox, advantages=adv, tau_pos=1.0, tau_neg=1.05, loss_mask=mask)
    want.backward()
    y = lp.clone().requires_grad_()
    obj = rlpt.Objective.areal_actor(use_decoupled_loss=False, use_sapo_loss=True, rejection_sampling=None)
    got, _ = rlpt.policy_loss(obj, y, mask, old_logp=prox, adv=adv)
    got.backward()
    close(got, want, **TOL, what="loss")
    close(y.grad, x.grad, **TOL, what="grad")


def test_custom_bound_weight_is_the_areal_sequence_clamp():
    """correction.action = bound_weight through the spec: AReaL's clamp on the sequence max, field by
    field, gives the preset's bits; without the action (every weight clamped) the loss differs."""
    lp, prox, behave, adv, mask = inputs(11)
    preset = rlpt.Objective.areal_actor(rejection_sampling=dict(level="sequence", action="clamp", agg="max",
                                                                upper=1.3, lower=0.95))
    fields = {"policy.dual_clip": 0.0, "policy.log_ratio_clamp": 80.0, "correction.log_ratio_clamp": 80.0,
              "correction.rejected": "masked", "correction.weight.level": "seq_geomean",
              "correction.weight.bound": "truncate", "correction.weight.lo": 0.95, "correction.weight.hi": 1.3}
    criterion = {"correction.reject.stat": "ratio", "correction.reject.level": "seq_max", "correction.reject.lo": 0.95,
                 "correction.reject.hi": 1.3, "correction.action": "bound_weight"}
    kw = dict(old_logp=prox, behav_logp=behave, adv=adv)
    want, _ = rlpt.policy_loss(preset, lp, mask, **kw)
    got, _ = rlpt.policy_loss(rlpt.Objective.custom(policy="ppo_clip", **fields, **criterion), lp, mask, **kw)
    assert torch.equal(got, want)
    every, _ = rlpt.policy_loss(rlpt.Objective.custom(policy="ppo_clip", **fields), lp, mask, **kw)
    assert not torch.equal(every, want)  # rows 6 and 11: weight out of bounds, maximum in them
    with pytest.raises(rlpt.Error, match="must be at a sequence level"):
        rlpt.policy_loss(rlpt.Objective.custom(policy="ppo_clip", **fields,
                                               **{**criterion, "correction.reject.level": "token"}), lp, mask, **kw)


def test_fields_acting_on_the_inputs_say_where_they_are():
    """m2_threshold and prox_logp_method act before the loss (a mask, the proximal log-probs)."""
    with pytest.raises(ValueError, match="rlpt.m2po_mask"):
        rlpt.Objective.areal_actor(m2_threshold=0.04)
    with pytest.raises(ValueError, match="proximal"):
        rlpt.Objective.areal_actor(prox_logp_method="loglinear")
    same = rlpt.Objective.areal_actor(m2_threshold=None, prox_logp_method="recompute")
    assert same.spec == rlpt.Objective.areal_actor().spec


def test_refusals_name_the_option():
    with pytest.raises(ValueError, match="kl_k9"):
        rlpt.Objective.areal_actor(rejection_sampling=dict(metric="kl_k9"))
    with pytest.raises(ValueError, match="unknown rejection_sampling"):
        rlpt.Objective.areal_actor(rejection_sampling=dict(threshold=2.0))
    with pytest.raises(ValueError, match="not reproduced"):
        rlpt.Objective.areal_actor(rejection_sampling=dict(metric="kl_k3", upper=0.1, lower=0.0))


def _areal_m2po():
    """AReaL's own _apply_m2po_masking (areal/trainer/ppo/actor.py), compiled from the installed
    file's source: importing that module pulls in AReaL's trainers and loggers (swanlab, ...), which
    the golden venv does not install. The function and its helper use torch only."""
    import ast
    import importlib.util
    import pathlib
    path = pathlib.Path(importlib.util.find_spec("areal").submodule_search_locations[0]) / "trainer" / "ppo" / "actor.py"
    wanted = ("_apply_m2po_masking", "_get_m2po_loss_mask")
    nodes = [n for n in ast.parse(path.read_text()).body if isinstance(n, ast.FunctionDef) and n.name in wanted]
    assert sorted(n.name for n in nodes) == sorted(wanted), f"{path} no longer defines {wanted}"
    ns = {"torch": torch}
    exec(compile(ast.Module(body=nodes, type_ignores=[]), str(path), "exec"), ns)
    return ns["_apply_m2po_masking"]


@pytest.mark.parametrize("threshold", [1e-9, 0.01, 0.04, 0.2])
def test_m2po_mask_matches(threshold):
    """rlpt.m2po_mask against AReaL's M2PO masking (grpo_loss_fn's m2_threshold), then the loss
    grpo_loss_fn computes on that mask."""
    apply_m2po = _areal_m2po()
    lp, prox, behave, adv, mask = inputs(13)
    want_mask = apply_m2po(behave, prox, mask, threshold)
    got_mask = rlpt.m2po_mask(prox, behave, mask, m2_threshold=threshold)
    assert torch.equal(got_mask.bool(), want_mask.bool())
    kept = int(want_mask.sum())
    assert (kept == 1) if threshold == 1e-9 else (0 < kept <= int(mask.sum()))
    x = lp.clone().requires_grad_()
    want, _ = ppo_actor_loss_fn(logprobs=x, proximal_logprobs=prox, old_logprobs=behave, advantages=adv,
                                eps_clip=0.2, loss_mask=want_mask, rejection_sampling=RejectionSamplingConfig())
    want.backward()
    y = lp.clone().requires_grad_()
    got, _ = rlpt.policy_loss(rlpt.Objective.areal_actor(rejection_sampling=True), y, got_mask, old_logp=prox,
                              behav_logp=behave, adv=adv)
    got.backward()
    close(got, want, **TOL, what="loss")
    close(y.grad, x.grad, **TOL, what="grad")


@pytest.mark.parametrize("token_adv", [False, True])
def test_sapo_sequence_matches(token_adv):
    """sapo_loss_fn with importance_sampling_level="sequence": the gate on exp(mean log-ratio),
    each token with its sequence's mean advantage, the gradient through the mean."""
    lp, prox, _, adv, mask = inputs(17, token_adv=token_adv)
    x = lp.clone().requires_grad_()
    want, _ = sapo_loss_fn(logprobs=x, old_logprobs=prox, advantages=adv, tau_pos=1.0, tau_neg=1.05, loss_mask=mask,
                           importance_sampling_level="sequence")
    want.backward()
    y = lp.clone().requires_grad_()
    obj = rlpt.Objective.areal_actor(use_decoupled_loss=False, use_sapo_loss=True, rejection_sampling=None,
                                     importance_sampling_level="sequence")
    got, _ = rlpt.policy_loss(obj, y, mask, old_logp=prox, adv=adv)
    got.backward()
    close(got, want, **TOL, what="loss")
    close(y.grad, x.grad, **TOL, what="grad")


NORM_LEVELS = ("batch", "group", None)


@pytest.mark.parametrize("mean_level", NORM_LEVELS)
@pytest.mark.parametrize("std_level", NORM_LEVELS)
@pytest.mark.parametrize("leave1out", [False, True])
@pytest.mark.parametrize("unbiased", [True, False])
@pytest.mark.parametrize("group_size", [1, 4])
@pytest.mark.parametrize("shape", ["rewards", "tokens"])
def test_normalize_matches_areal(mean_level, std_level, leave1out, unbiased, group_size, shape):
    """rlpt.areal_normalize against AReaL's own Normalization (reward_norm on [B] rewards, adv_norm
    on [B, T] advantages with their loss mask), every NormConfig level and flag."""
    from areal.api.cli_args import NormConfig
    from areal.utils.data import Normalization
    g = torch.Generator().manual_seed(23)
    if shape == "rewards":
        x, mask = torch.randn(12, generator=g) * 3 + 1, None
    else:
        mask = inputs(29)[4]  # ragged rows, a one-token row, an interior hole
        x = torch.randn(mask.shape, generator=g) * 2 - 0.5
    cfg = NormConfig(mean_level=mean_level, mean_leave1out=leave1out, std_level=std_level, std_unbiased=unbiased,
                     group_size=group_size)
    want = Normalization(cfg)(x, loss_mask=mask)
    got = rlpt.areal_normalize(x, mask, cfg)
    assert got.dtype == want.dtype and got.shape == want.shape
    close(got, want, rtol=1e-6, atol=1e-7, what="normalized")
    zero_mean = mean_level is None or (mean_level == "group" and group_size == 1 and leave1out)
    if not (zero_mean and std_level is None):  # otherwise the identity, in AReaL too
        assert not torch.equal(got, x)


def test_normalize_keywords_and_refusals():
    x = torch.tensor([1.0, 2.0, 3.0, 5.0, 8.0, 13.0])
    from areal.api.cli_args import NormConfig
    from areal.utils.data import Normalization
    want = Normalization(NormConfig(mean_level="group", std_level="batch", group_size=3))(x)
    close(rlpt.areal_normalize(x, mean_level="group", std_level="batch", group_size=3), want, rtol=1e-6, atol=0,
          what="keywords")
    close(rlpt.areal_normalize(x), Normalization(NormConfig())(x), rtol=1e-6, atol=0, what="NormConfig defaults")
    with pytest.raises(rlpt.Error, match="group_size = 4"):
        rlpt.areal_normalize(x, std_level="group", group_size=4)
    with pytest.raises(rlpt.Error, match="x\\[2\\]"):
        rlpt.areal_normalize(torch.tensor([1.0, 2.0, float("nan")]))
    with pytest.raises(TypeError, match="group_sizes"):
        rlpt.areal_normalize(x, group_sizes=2)
