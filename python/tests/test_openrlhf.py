# SPDX-License-Identifier: Apache-2.0
"""rlpt.openrlhf against OpenRLHF 0.11.2's own classes and functions on the same inputs."""
import pytest
import torch

pytest.importorskip("openrlhf")
import importlib.util  # noqa: E402
import pathlib  # noqa: E402
import sys  # noqa: E402
import types  # noqa: E402

import rlpt.openrlhf as ro  # noqa: E402
from conftest import close, ragged_mask  # noqa: E402


def _openrlhf_models(sub):
    """openrlhf.models.<sub> without openrlhf/models/__init__.py (which imports peft, deepspeed
    models, ... that these functions never use)."""
    if "openrlhf.models" not in sys.modules:
        root = pathlib.Path(importlib.util.find_spec("openrlhf").submodule_search_locations[0])
        pkg = types.ModuleType("openrlhf.models")
        pkg.__path__ = [str(root / "models")]
        sys.modules["openrlhf.models"] = pkg
    return importlib.import_module(f"openrlhf.models.{sub}")


ol = _openrlhf_models("loss")
ou = _openrlhf_models("utils")

TOL = dict(rtol=2e-5, atol=2e-6)


def inputs(seed, B=10, T=8):
    g = torch.Generator().manual_seed(seed)
    _, mask = ragged_mask(g, B, T, {2: 1})
    lp = torch.rand(B, T, generator=g) * -3
    old = lp + 0.3 * torch.randn(B, T, generator=g)
    rollout = old + 0.3 * torch.randn(B, T, generator=g)
    adv = torch.randn(B, T, generator=g) * mask
    return g, lp, old, rollout, adv, mask


@pytest.mark.parametrize("kw", [
    {}, {"clip_eps_high": 0.28}, {"dual_clip": 3.0}, {"token_level_loss": False},
    {"policy_loss_type": "gspo"},
    {"policy_loss_type": "gspo", "is_correction_level": "token"},  # the ratio against the rollout log-probs
    {"policy_loss_type": "gspo", "is_correction_level": "seq", "dual_clip": 3.0},
    {"is_correction_level": "token", "is_correction_mode": "mask"},
    {"is_correction_level": "token", "is_correction_mode": "clip"},
    {"is_correction_level": "token", "is_correction_mode": "clip", "is_correction_threshold": (0.9, 1.1)},  # binds
    {"is_correction_level": "seq", "is_correction_mode": "mask"},
    {"is_correction_level": "seq", "is_correction_mode": "mask", "is_correction_threshold": (0.9, 1.1)},  # binds
    {"is_correction_level": "token", "is_correction_gating": "binary_kl", "is_correction_threshold": (0.0, 0.01)},
    {"is_correction_level": "seq", "is_correction_gating": "tv", "is_correction_threshold": (0.0, 0.1)},
])
@pytest.mark.parametrize("batch", [{}, {"dp_size": 2, "batch_num_tokens": 97.0, "global_batch_size": 23.0}])
def test_policy_loss_matches(kw, batch):
    _, lp, old, rollout, adv, mask = inputs(3)
    res = []
    for cls in (ro.PolicyLoss, ol.PolicyLoss):
        x = lp.clone().requires_grad_()
        out = cls(**kw)(x, old, adv, mask, rollout_log_probs=rollout, **batch)
        (g,) = torch.autograd.grad(out[0], x)
        res.append((out, g))
    (o1, g1), (o2, g2) = res
    close(o1[0], o2[0], what="loss", **TOL)
    close(g1, g2, what="grad", rtol=2e-5, atol=1e-7)
    close(o1[2], o2[2], what="ppo_kl", **TOL)
    if kw.get("policy_loss_type") != "gspo":
        close(o1[1], o2[1], what="clip_ratio", **TOL)
    assert (o1[3] is None) == (o2[3] is None) and (o1[4] is None) == (o2[4] is None)
    if o2[3] is not None:
        close(o1[3], o2[3], what="vllm_kl", **TOL)
    if o2[4] is not None:
        close(o1[4], o2[4], what="is_filter_ratio", **TOL)


@pytest.mark.parametrize("clip_eps", [None, 0.2])
@pytest.mark.parametrize("token_level", [True, False])
def test_value_loss_matches(clip_eps, token_level):
    g, _, _, _, _, mask = inputs(4)
    v = torch.randn(mask.shape, generator=g)
    old = v + 0.4 * torch.randn(mask.shape, generator=g)
    ret = torch.randn(mask.shape, generator=g)
    res = []
    for cls in (ro.ValueLoss, ol.ValueLoss):
        x = v.clone().requires_grad_()
        loss = cls(clip_eps=clip_eps, token_level_loss=token_level)(x, old, ret, mask)
        res.append((loss, torch.autograd.grad(loss, x)[0]))
    close(res[0][0], res[1][0], **TOL)
    close(res[0][1], res[1][1], **TOL)


@pytest.mark.parametrize("est", ["k1", "k2", "k3"])
@pytest.mark.parametrize("unbiased", [False, True])
def test_kl_loss_matches(est, unbiased):
    _, lp, old, base, _, mask = inputs(5)
    x1, x2 = lp.clone().requires_grad_(), lp.clone().requires_grad_()
    l1 = ro.kl_loss(x1, base, mask, est, unbiased, log_probs_old=old)
    l2 = ol.aggregate_loss(ou.compute_approx_kl(x2, base, old, est, unbiased), mask)
    close(l1, l2, **TOL)
    close(torch.autograd.grad(l1, x1)[0], torch.autograd.grad(l2, x2)[0], rtol=2e-5, atol=1e-7)


@pytest.mark.parametrize("estimator", ["rloo", "reinforce_baseline", "dr_grpo", "group_norm"])
def test_reward_shaping_matches(estimator):
    g = torch.Generator().manual_seed(6)
    n = 4
    r = torch.rand(6 * n, generator=g)
    got = ro.shape_rewards(r, n, estimator)
    x = r.reshape(-1, n)
    if estimator == "rloo":
        want = x - (x.sum(-1, keepdim=True) - x) / (n - 1)
    elif estimator == "group_norm":
        want = (x - x.mean(-1, keepdim=True)) / (x.std(-1, keepdim=True) + 1e-9)
    else:
        want = x - x.mean(-1, keepdim=True)
    close(got, want.reshape(-1), **TOL)


def gae_loop(values, rewards, mask, gamma, lambd):
    """The experience maker's GAE as written in its docstring: masked values and rewards are 0."""
    values, rewards = values * mask, rewards * mask
    T = rewards.shape[1]
    adv = torch.zeros_like(rewards)
    last = torch.zeros(rewards.shape[0])
    for t in reversed(range(T)):
        nv = values[:, t + 1] if t + 1 < T else 0.0
        last = rewards[:, t] + gamma * nv - values[:, t] + gamma * lambd * last
        adv[:, t] = last
    return adv, adv + values


def test_gae_and_returns_match_experience_maker():
    g, _, _, _, _, mask = inputs(7)
    mask[1, 3] = False  # a hole inside a response
    rewards = torch.randn(mask.shape, generator=g)
    values = torch.randn(mask.shape, generator=g)
    try:
        from openrlhf.trainer.ppo_utils.experience_maker import RemoteExperienceMaker as M

        a2, r2 = M.get_advantages_and_returns(None, values, rewards, mask, 0.99, 0.95)
        c2 = M.get_cumulative_returns(None, rewards, mask, 0.99)
    except ImportError:  # the experience maker needs ray / vllm: the same recurrences written out
        a2, r2 = gae_loop(values, rewards, mask, 0.99, 0.95)
        c2, _ = gae_loop(torch.zeros_like(values), rewards, mask, 0.99, 1.0)
    a1, r1 = ro.get_advantages_and_returns(values, rewards, mask, 0.99, 0.95)
    close(a1 * mask, a2 * mask, **TOL)
    close(r1 * mask, r2 * mask, **TOL)
    c1 = ro.get_cumulative_returns(rewards, mask, 0.99)
    close(c1 * mask, c2 * mask, **TOL)


def test_divergence_gating_takes_an_upper_bound_only():
    # OpenRLHF raises ValueError here; rlpt says why with its compat error.
    with pytest.raises(ro.rlpt.Error) as e:
        ro.PolicyLoss(is_correction_level="token", is_correction_gating="tv")
    assert e.value.id == "rlpt.objective.compat"
    assert "upper bound only" in str(e.value)
    with pytest.raises(ValueError):
        ol.PolicyLoss(is_correction_level="token", is_correction_gating="tv")


def test_patch_swaps_the_classes():
    ro.patch()
    try:
        assert ol.PolicyLoss is ro.PolicyLoss and ol.ValueLoss is ro.ValueLoss
    finally:
        ro.unpatch()
    assert ol.PolicyLoss is not ro.PolicyLoss


# OpenRLHF 0.10-0.11.1's spelling of the rollout correction, and each type's 0.11.2 equivalent.
LEGACY = [
    ({"enable_vllm_is_correction": True, "vllm_is_truncated_threshold": [0.5, 2.0], "vllm_is_correction_type": "tis"},
     {"is_correction_level": "token", "is_correction_mode": "clip", "is_correction_threshold": (0.5, 2.0)}),
    ({"enable_vllm_is_correction": True, "vllm_is_truncated_threshold": [0.8, 1.25],
      "vllm_is_correction_type": "icepop"},
     {"is_correction_level": "token", "is_correction_mode": "mask", "is_correction_threshold": (0.8, 1.25)}),
    ({"enable_vllm_is_correction": True, "vllm_is_truncated_threshold": [0.9, 1.1],
      "vllm_is_correction_type": "seq-mask-tis"},
     {"is_correction_level": "seq", "is_correction_mode": "mask", "is_correction_threshold": (0.9, 1.1)}),
    ({"enable_vllm_is_correction": True, "vllm_is_truncated_threshold": [0.5, 2.0], "policy_loss_type": "gspo"},
     {"is_correction_level": "token", "policy_loss_type": "gspo"}),
    ({"enable_vllm_is_correction": False, "vllm_is_truncated_threshold": [0.5, 2.0], "dual_clip": 3.0},
     {"dual_clip": 3.0}),
]


@pytest.mark.parametrize("legacy,current", LEGACY)
def test_legacy_correction_arguments_match_their_current_form(legacy, current):
    """rlpt with 0.11.1's arguments returns 0.11.1's four values, equal to OpenRLHF 0.11.2's own class
    given the same correction in 0.11.2's arguments (the correction types are the same formulas)."""
    _, lp, old, rollout, adv, mask = inputs(8)
    x1, x2 = lp.clone().requires_grad_(), lp.clone().requires_grad_()
    o1 = ro.PolicyLoss(**legacy)(x1, old, adv, mask, rollout_log_probs=rollout)
    o2 = ol.PolicyLoss(**current)(x2, old, adv, mask, rollout_log_probs=rollout)
    assert len(o1) == 4 and len(o2) == 5
    close(o1[0], o2[0], what="loss", **TOL)
    close(torch.autograd.grad(o1[0], x1)[0], torch.autograd.grad(o2[0], x2)[0], rtol=2e-5, atol=1e-7)
    close(o1[2], o2[2], what="ppo_kl", **TOL)
    assert (o1[3] is None) == (o2[3] is None)
    if o2[3] is not None:
        close(o1[3], o2[3], what="vllm_kl", **TOL)


def test_legacy_correction_types_written_out():
    """Each 0.11.1 correction type's weight, written out, times the plain PPO loss of the same class."""
    _, lp, old, rollout, adv, mask = inputs(9)
    low, high = 0.9, 1.1
    plain = ro.PolicyLoss(token_level_loss=True)
    w = (old - rollout).exp()
    seq = ((old - rollout) * mask).sum(-1, keepdim=True) / mask.sum(-1, keepdim=True)
    weights = {"tis": w.clamp(low, high), "icepop": torch.where((w >= low) & (w <= high), w, 0.0),
               "seq-mask-tis": torch.where((seq.exp() >= low) & (seq.exp() <= high), w, 0.0)}
    for kind, weight in weights.items():
        x = lp.clone().requires_grad_()
        got = ro.PolicyLoss(enable_vllm_is_correction=True, vllm_is_truncated_threshold=[low, high],
                            vllm_is_correction_type=kind)(x, old, adv, mask, rollout_log_probs=rollout)[0]
        # The weighted loss is the plain loss with the weight folded into the advantages (PPO's
        # per-token loss is positively homogeneous in A, and every weight here is >= 0).
        want = plain(lp, old, adv * weight, mask)[0]
        close(got, want, what=kind, **TOL)
    assert weights["icepop"].eq(0).any() and weights["seq-mask-tis"].eq(0).any()  # the bands bind


def test_policy_loss_returns_follow_the_openrlhf_release(monkeypatch):
    _, lp, old, _, adv, mask = inputs(10)
    for version, n in (("0.11.1", 4), ("0.10.4", 4), ("0.11.2", 5), ("0.12.0", 5)):
        monkeypatch.setenv("RLPT_OPENRLHF_VERSION", version)
        assert len(ro.PolicyLoss()(lp, old, adv, mask)) == n, version
    monkeypatch.setenv("RLPT_OPENRLHF_VERSION", "0.11.1")  # an explicit spelling decides over the release
    assert len(ro.PolicyLoss(is_correction_level="off")(lp, old, adv, mask)) == 5
    monkeypatch.setenv("RLPT_OPENRLHF_VERSION", "0.11.2")
    assert len(ro.PolicyLoss(enable_vllm_is_correction=False)(lp, old, adv, mask)) == 4


@pytest.mark.parametrize("kw,needle", [
    ({"enable_vllm_is_correction": True, "is_correction_level": "token"}, "two releases' spellings"),
    ({"enable_vllm_is_correction": True}, "vllm_is_truncated_threshold = [low, high], got None"),
    ({"vllm_is_correction_type": "mis"}, "vllm_is_correction_type = 'mis'"),
])
def test_legacy_correction_errors(kw, needle):
    with pytest.raises(ro.rlpt.Error) as e:
        ro.PolicyLoss(**kw)
    assert e.value.id == "rlpt.objective.compat" and needle in str(e.value)


# --- sequence balancing: openrlhf.utils.seqlen_balancing ----------------------------------------

from openrlhf.utils import seqlen_balancing as osb  # noqa: E402

# OpenRLHF's own functions, whether or not a patch() is in force.
OPENRLHF_GSBP = ro._openrlhf_balancing("get_seqlen_balanced_partitions")
OPENRLHF_MIN_MBS = ro._openrlhf_balancing("get_minimum_num_micro_batch_size")
assert OPENRLHF_GSBP is not ro.get_seqlen_balanced_partitions


def total_lengths(dist, n, seed):
    """What OpenRLHF balances: each sample's prompt + response token count, as Python ints."""
    g = torch.Generator().manual_seed(seed)
    if dist == "lognormal":
        x = torch.exp(torch.randn(n, generator=g) + 6.0).clamp(1, 32768).long()
    elif dist == "ties":  # few distinct lengths: every tie-break is exercised
        x = torch.tensor([64, 128, 512])[torch.randint(0, 3, (n,), generator=g)]
    else:  # "zeros": empty samples among long ones
        x = torch.randint(0, 8192, (n,), generator=g) * (torch.rand(n, generator=g) > 0.3)
    return x.tolist()


@pytest.mark.parametrize("dist", ["lognormal", "ties", "zeros"])
@pytest.mark.parametrize("n,k", [(1, 1), (2, 2), (7, 3), (64, 8), (256, 8), (256, 64), (1000, 16)])
@pytest.mark.parametrize("equal_size", [True, False])
def test_balanced_partitions_are_openrlhf_item_for_item(dist, n, k, equal_size):
    if equal_size and n % k:
        pytest.skip("OpenRLHF asserts divisibility")
    lengths = total_lengths(dist, n, seed=n * 7 + k)
    want = OPENRLHF_GSBP(lengths, k, equal_size)
    got = ro.get_seqlen_balanced_partitions(lengths, k, equal_size)
    assert got == want
    assert all(type(i) is int for p in got for i in p)
    assert ro.get_seqlen_balanced_partitions(torch.tensor(lengths), k, equal_size) == want


def test_balanced_partitions_hand_openrlhf_what_rlpt_cannot_sum_exactly():
    g = torch.Generator().manual_seed(3)
    floats = (torch.rand(24, generator=g) * 100).tolist()
    negative = torch.randint(-50, 50, (24,), generator=g).tolist()
    huge = [2 ** 60 + i for i in range(24)]
    for given in (floats, negative, huge):
        for equal_size in (True, False):
            assert ro.get_seqlen_balanced_partitions(given, 4, equal_size) == OPENRLHF_GSBP(given, 4, equal_size)


def test_balanced_partitions_keep_openrlhf_assertions():
    with pytest.raises(AssertionError, match=r"number of items:\[3\] < k_partitions:\[4\]"):
        ro.get_seqlen_balanced_partitions([1, 2, 3], 4, False)
    with pytest.raises(AssertionError, match="10 % 4 != 0"):
        ro.get_seqlen_balanced_partitions(list(range(10)), 4, True)


@pytest.mark.parametrize("dist", ["lognormal", "ties", "zeros"])
@pytest.mark.parametrize("n", [0, 1, 5, 64, 500])
@pytest.mark.parametrize("cap,ring,tp", [(1, 1, 1), (512, 1, 1), (4096, 1, 1), (2048, 2, 2), (16384, 1, 4)])
def test_minimum_micro_batch_count_is_openrlhf(dist, n, cap, ring, tp, monkeypatch):
    lengths = [min(x, cap * ring * tp) for x in total_lengths(dist, n, seed=n + cap)]
    want = OPENRLHF_MIN_MBS(lengths, cap, ring, tp)
    monkeypatch.setattr(ro, "_openrlhf_balancing", None)  # rlpt's own first fit answers, no fallback
    assert ro.get_minimum_num_micro_batch_size(lengths, cap, ring, tp) == want
    assert ro.get_minimum_num_micro_batch_size(torch.tensor(lengths, dtype=torch.long), cap, ring, tp) == want


def test_minimum_micro_batch_count_keeps_the_input_order():
    # first fit in order: [3, 3, 3, 7, 7, 7] into bins of 10 takes 4 (first-fit decreasing: 3)
    assert ro.get_minimum_num_micro_batch_size([3, 3, 3, 7, 7, 7], 10, 1, 1) == 4
    assert OPENRLHF_MIN_MBS([3, 3, 3, 7, 7, 7], 10, 1, 1) == 4
    # an empty sequence fits anywhere; one over the capacity is the installed OpenRLHF's to answer
    # (0.11.2: a bin of its own; later releases raise ValueError)
    assert ro.get_minimum_num_micro_batch_size([2, 0, 5, 9, 5, 0], 10, 1, 1) == 3  # [2, 0, 5, 0] [9] [5]
    assert OPENRLHF_MIN_MBS([2, 0, 5, 9, 5, 0], 10, 1, 1) == 3
    assert ro.get_minimum_num_micro_batch_size([12, 0, 5, 30, 5, 0], 10, 1, 1) == OPENRLHF_MIN_MBS(
        [12, 0, 5, 30, 5, 0], 10, 1, 1)


def test_minimum_micro_batch_count_hands_openrlhf_what_rlpt_does_not_take():
    for lengths, cap in (([1.5, 2.5, 7.0], 4), ([-3, 4, 5], 6), ([1, 2, 3], 0), ([4, 4, 4], 6.0)):
        assert ro.get_minimum_num_micro_batch_size(lengths, cap, 1, 1) == OPENRLHF_MIN_MBS(lengths, cap, 1, 1)


def test_patch_swaps_the_balancing_functions_where_openrlhf_imported_them():
    # A module that imported the names (as experience_maker and replay_buffer do), stood in for
    # by one that needs neither ray nor deepspeed.
    user = types.ModuleType("openrlhf._rlpt_balancing_user")
    user.get_seqlen_balanced_partitions = osb.get_seqlen_balanced_partitions
    user.get_minimum_num_micro_batch_size = osb.get_minimum_num_micro_batch_size
    sys.modules[user.__name__] = user
    try:
        ro.patch()
        try:
            for mod in (osb, user):
                assert mod.get_seqlen_balanced_partitions is ro.get_seqlen_balanced_partitions
                assert mod.get_minimum_num_micro_batch_size is ro.get_minimum_num_micro_batch_size
            # the originals stay reachable for the fallbacks while patched
            assert ro._openrlhf_balancing("karmarkar_karp") is osb.karmarkar_karp
            assert ro.get_seqlen_balanced_partitions([0.5, 1.5, 2.5], 2, False) == OPENRLHF_GSBP([0.5, 1.5, 2.5], 2,
                                                                                                   False)
            assert ro.get_minimum_num_micro_batch_size([1.5, 2.5], 2, 1, 1) == OPENRLHF_MIN_MBS([1.5, 2.5], 2, 1, 1)
        finally:
            ro.unpatch()
        assert osb.get_seqlen_balanced_partitions is OPENRLHF_GSBP
        assert user.get_minimum_num_micro_batch_size is OPENRLHF_MIN_MBS
    finally:
        del sys.modules[user.__name__]
