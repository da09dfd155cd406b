# SPDX-License-Identifier: Apache-2.0
"""The operators themselves: registration checks (torch.library.opcheck), torch.compile without
graph breaks, gradients against plain torch, dtypes, layouts, strides, errors."""
import pathlib
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import rlpt
from conftest import close, cuda, ragged_mask

ops = torch.ops.rlpt
F64 = torch.float64


def batch(gen, B=6, T=9, dtype=F64, lengths=None):
    lp = (torch.rand(B, T, generator=gen, dtype=dtype) * -3)
    old = lp + 0.3 * torch.randn(B, T, generator=gen, dtype=dtype)
    ref = lp + 0.3 * torch.randn(B, T, generator=gen, dtype=dtype)
    behav = old + 0.2 * torch.randn(B, T, generator=gen, dtype=dtype)
    ent = torch.rand(B, T, generator=gen, dtype=dtype) * 2
    if lengths is None:
        lengths = torch.randint(1, T + 1, (B,), generator=gen)
    mask = torch.arange(T)[None, :] < lengths[:, None]
    adv = torch.randn(B, generator=gen, dtype=dtype)
    return lp, old, ref, behav, ent, mask, adv


# --- plain torch references (float64) -------------------------------------------------------------

def agg(x, mask, mode):
    m = mask.to(x.dtype)
    if mode == "token-mean":
        return (x * m).sum() / m.sum()
    if mode == "token-sum":
        return (x * m).sum()
    rows = m.sum(-1)
    keep = rows > 0
    if mode == "seq-mean-token-sum":
        return (x * m).sum(-1)[keep].sum() / keep.sum()
    if mode == "seq-mean-token-mean":
        return ((x * m).sum(-1)[keep] / rows[keep]).sum() / keep.sum()
    raise ValueError(mode)


def ppo_ref(lp, old, adv_tok, mask, lo, hi, c, mode):
    r = torch.exp(torch.clamp(lp - old, -20, 20))
    l1, l2 = -adv_tok * r, -adv_tok * torch.clamp(r, 1 - lo, 1 + hi)
    l = torch.maximum(l1, l2)
    l = torch.where(adv_tok < 0, torch.minimum(l, -adv_tok * c), l)
    return agg(l, mask, mode)


def k3_ref(lp, ref):
    kl = torch.clamp(ref - lp, -20, 20)
    return torch.clamp(torch.exp(kl) - kl - 1, -10, 10)


# --- objective ------------------------------------------------------------------------------------

@pytest.mark.parametrize("mode", ["token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean"])
def test_verl_actor_matches_torch(gen, mode):
    lp, old, ref, _, ent, mask, adv = batch(gen)
    lp.requires_grad_()
    ent.requires_grad_()
    obj = rlpt.Objective.verl_actor(clip_ratio_low=0.2, clip_ratio_high=0.28, loss_agg_mode=mode, use_kl_loss=True,
                                    kl_loss_coef=0.01, kl_loss_type="low_var_kl", entropy_coeff=0.005)
    loss, metrics = rlpt.policy_loss(obj, lp, mask, old_logp=old, ref_logp=ref, seq_adv=adv, entropy=ent)
    g = torch.autograd.grad(loss, (lp, ent))
    adv_tok = adv[:, None].expand_as(lp)
    want = (ppo_ref(lp, old, adv_tok, mask, 0.2, 0.28, 3.0, mode) + 0.01 * agg(k3_ref(lp, ref), mask, mode)
            - 0.005 * agg(ent, mask, mode))
    w = torch.autograd.grad(want, (lp, ent))
    close(loss, want, 1e-12, 1e-14, "loss")
    close(g[0], w[0], 1e-10, 1e-15, "d loss / d logp")
    close(g[1], w[1], 1e-10, 1e-15, "d loss / d entropy")
    d = rlpt.metrics_dict(metrics)
    assert d["tokens"] == float(mask.sum())
    assert d["loss"] == pytest.approx(float(loss.detach()))


def test_objective_opcheck(gen):
    lp, old, ref, behav, ent, mask, adv = batch(gen)
    spec = rlpt.Objective.verl_actor(use_kl_loss=True, entropy_coeff=0.01, rollout_is="token").spec
    lp.requires_grad_()
    ent.requires_grad_()
    args = (spec, lp, mask, old, behav, ref, None, adv, ent, None, None, None, None, True, True, False)
    torch.library.opcheck(ops.objective.default, args)


def test_objective_packed_equals_padded(gen):
    lp, old, ref, _, _, mask, adv = batch(gen, dtype=torch.float32)
    obj = rlpt.Objective.verl_actor(loss_agg_mode="seq-mean-token-mean", use_kl_loss=True)
    lpp = lp.clone().requires_grad_()
    loss, _ = rlpt.policy_loss(obj, lpp, mask, old_logp=old, ref_logp=ref, seq_adv=adv)
    (g,) = torch.autograd.grad(loss, lpp)
    lengths = mask.sum(-1)
    cu = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])
    pk = lambda x: x[mask]  # noqa: E731  (rows are left-aligned)
    lpk = pk(lp).clone().requires_grad_()
    loss_p, _ = rlpt.policy_loss(obj, lpk, None, old_logp=pk(old), ref_logp=pk(ref), seq_adv=adv, cu_seqlens=cu)
    (gp,) = torch.autograd.grad(loss_p, lpk)
    close(loss_p, loss, 1e-6, 1e-7, "packed loss")
    close(gp, g[mask], 1e-6, 1e-8, "packed grad")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_objective_dtypes(gen, dtype):
    lp, old, _, _, _, mask, adv = batch(gen, dtype=torch.float32)
    obj = rlpt.Objective.trl_grpo(loss_type="grpo")
    x = lp.to(dtype).requires_grad_()
    loss, _ = rlpt.policy_loss(obj, x, mask, old_logp=old.to(dtype), seq_adv=adv.to(dtype))
    (g,) = torch.autograd.grad(loss, x)
    assert loss.dtype == torch.float32 and g.dtype == dtype
    y = lp.to(dtype).to(torch.float32).requires_grad_()
    want, _ = rlpt.policy_loss(obj, y, mask, old_logp=old.to(dtype).float(), seq_adv=adv.to(dtype).float())
    (gw,) = torch.autograd.grad(want, y)
    close(loss, want, 1e-6, 1e-7)
    close(g.float(), gw.to(dtype).float(), 0, 0)


def test_objective_row_slices_are_read_in_place(gen):
    # verl's log_prob[:, -response_length:] slices: every per-token input shares one row stride.
    full = torch.randn(4, 12, generator=gen, dtype=F64)
    lp = full[:, 4:].clone()
    wide = torch.randn(4, 12, generator=gen, dtype=F64)
    wide[:, 4:] = lp.detach() + 0.1
    mask_w = torch.ones(4, 12, dtype=torch.bool)
    obj = rlpt.Objective.verl_actor()
    rlpt.reset_copy_stats()
    x = torch.zeros(4, 12, dtype=F64)
    x[:, 4:] = lp
    xs = x[:, 4:].requires_grad_()
    loss, _ = rlpt.policy_loss(obj, xs, mask_w[:, 4:], old_logp=wide[:, 4:], adv=(wide * 0 + 1.0)[:, 4:])
    assert rlpt.copy_stats() == {}
    y = lp.clone().requires_grad_()
    want, _ = rlpt.policy_loss(obj, y, torch.ones(4, 8, dtype=torch.bool), old_logp=wide[:, 4:].contiguous(),
                               adv=torch.ones(4, 8, dtype=F64))
    assert loss.item() == want.item()
    g1, = torch.autograd.grad(loss, xs)
    g2, = torch.autograd.grad(want, y)
    assert torch.equal(g1, g2)


def test_noncontiguous_is_copied_and_counted_or_refused(gen):
    lp, old, _, _, _, mask, adv = batch(gen)
    old_t = old.t().contiguous().t()  # same values, column-major
    obj = rlpt.Objective.verl_actor()
    rlpt.reset_copy_stats()
    a, _ = rlpt.policy_loss(obj, lp, mask, old_logp=old_t, seq_adv=adv)
    b, _ = rlpt.policy_loss(obj, lp, mask, old_logp=old, seq_adv=adv)
    assert float(a) == float(b)
    assert rlpt.copy_stats()[("copy", "old_logp")] == 1
    rlpt.set_strict(True)
    try:
        with pytest.raises(rlpt.Error) as e:
            rlpt.policy_loss(obj, lp, mask, old_logp=old_t, seq_adv=adv)
        assert e.value.id == "rlpt.python.strides" and "old_logp" in e.value.message
    finally:
        rlpt.set_strict(False)


def test_errors_carry_rlpt_ids(gen):
    lp, old, _, _, _, mask, adv = batch(gen)
    obj = rlpt.Objective.verl_actor()
    with pytest.raises(rlpt.Error) as e:
        rlpt.policy_loss(obj, lp, mask, seq_adv=adv)  # no old_logp
    assert e.value.id == "rlpt.objective.missing_input"
    assert isinstance(e.value, ValueError)
    with pytest.raises(rlpt.Error) as e:
        rlpt.Objective.verl_actor(clip_ratio_hgh=0.3)
    assert e.value.id == "rlpt.python.bad_option" and "clip_ratio_hgh" in e.value.message
    with pytest.raises(rlpt.Error) as e:
        rlpt.Objective.verl_actor(loss_agg_mode="token-median")
    assert e.value.id == "rlpt.objective.compat"
    bad = lp.clone()
    bad[0, 0] = float("nan")
    with pytest.raises(rlpt.Error) as e:
        rlpt.policy_loss(obj, bad, torch.ones_like(mask), old_logp=old, seq_adv=adv)
    assert e.value.id == "rlpt.objective.nonfinite"
    with pytest.raises(rlpt.Error) as e:
        rlpt.policy_loss(obj, lp, mask[:, :3], old_logp=old, seq_adv=adv)
    assert e.value.id == "rlpt.python.shape"


def test_all_masked_micro_batch_gives_zero_loss(gen):
    lp, old, _, _, _, mask, adv = batch(gen)
    x = lp.clone().requires_grad_()
    for mode in ("token-mean", "seq-mean-token-mean"):
        loss, _ = rlpt.policy_loss(rlpt.Objective.verl_actor(loss_agg_mode=mode), x, torch.zeros_like(mask),
                                   old_logp=old, seq_adv=adv)
        (g,) = torch.autograd.grad(loss, x)
        assert loss.item() == 0.0 and not bool(g.any())


def test_local_denominators_split_equals_whole(gen):
    lp, old, _, _, _, mask, adv = batch(gen, B=8)
    obj = rlpt.Objective.verl_actor(loss_agg_mode="token-mean")
    x = lp.clone().requires_grad_()
    whole, _ = rlpt.policy_loss(obj, x, mask, old_logp=old, seq_adv=adv)
    (gw,) = torch.autograd.grad(whole, x)
    parts = [slice(0, 3), slice(3, 8)]
    den = sum(rlpt.local_denominators(obj, lp[s], mask[s], old_logp=old[s], seq_adv=adv[s]) for s in parts)
    glob = obj.with_denominators(tokens=float(den[0]), seqs=float(den[1]))
    total = 0
    y = lp.clone().requires_grad_()
    for s in parts:
        part, _ = rlpt.policy_loss(glob, y[s], mask[s], old_logp=old[s], seq_adv=adv[s])
        total = total + part
    (gy,) = torch.autograd.grad(total, y)
    close(total, whole, 1e-12, 1e-14)
    close(gy, gw, 1e-12, 1e-15)


def test_seq_in_denominator_leaves_zero_variance_groups_out_of_the_denominator(gen):
    # TRL PR #6368's dapo_zv with PR #7068's concern: every token's loss in the numerator (the constant
    # group's KL included), only the other groups' tokens in the token-mean's denominator.
    lp, old, ref, _, _, mask, _ = batch(gen, B=8)
    rewards = torch.tensor([1.0, 1.0, 1.0, 1.0, 0.0, 1.0, 0.0, 0.0])
    ids = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    adv, stats, counted = rlpt.grpo_advantages(rewards, ids, preset="trl", return_nondegenerate=True)
    assert counted.dtype == torch.bool and counted.tolist() == [False] * 4 + [True] * 4
    assert rlpt.grpo_advantages(rewards, ids, preset="trl")[1].tolist() == stats.tolist()  # two outputs by default
    obj = rlpt.Objective.verl_actor(loss_agg_mode="token-mean", use_kl_loss=True, kl_loss_coef=0.1,
                                    kl_loss_type="low_var_kl")
    x = lp.clone().requires_grad_()
    adv64 = adv.to(F64)
    loss, metrics = rlpt.policy_loss(obj, x, mask, old_logp=old, ref_logp=ref, seq_adv=adv64,
                                     seq_in_denominator=counted)
    y = lp.clone().requires_grad_()
    adv_tok = adv64[:, None].expand_as(y)
    m = mask.to(F64)
    r = torch.exp(torch.clamp(y - old, -20, 20))
    pol = torch.maximum(-adv_tok * r, -adv_tok * torch.clamp(r, 0.8, 1.2))
    pol = torch.where(adv_tok < 0, torch.minimum(pol, -adv_tok * 3.0), pol)
    per_token = pol + 0.1 * k3_ref(y, ref)
    want = (per_token * m).sum() / m[counted].sum()
    close(loss, want, 1e-12, 1e-14, "loss")
    close(torch.autograd.grad(loss, x)[0], torch.autograd.grad(want, y)[0], 1e-10, 1e-15, "d loss / d logp")
    assert rlpt.metrics_dict(metrics)["tokens"] == float(mask.sum())  # metrics see every token
    den = rlpt.local_denominators(obj, lp, mask, old_logp=old, ref_logp=ref, seq_adv=adv64,
                                  seq_in_denominator=counted)
    assert den.tolist() == [float(mask[counted].sum()), 4.0]
    with pytest.raises(rlpt.Error, match="seq_in_denominator has 7 elements, expected 8"):
        rlpt.policy_loss(obj, lp, mask, old_logp=old, ref_logp=ref, seq_adv=adv64, seq_in_denominator=counted[:7])
    torch.library.opcheck(ops.objective.default, (obj.spec, x, mask, old, None, ref, None, adv64, None, None, None,
                                                  None, None, True, False, False, counted))


def test_critic_value_loss(gen):
    B, T = 5, 7
    v = torch.randn(B, T, generator=gen, dtype=F64, requires_grad=True)
    old = v.detach() + 0.3 * torch.randn(B, T, generator=gen, dtype=F64)
    ret = torch.randn(B, T, generator=gen, dtype=F64)
    mask = torch.rand(B, T, generator=gen) > 0.3
    loss, _ = rlpt.policy_loss(rlpt.Objective.verl_critic(cliprange_value=0.5), None, mask, values=v, old_values=old,
                               returns=ret)
    vc = old + torch.clamp(v - old, -0.5, 0.5)
    want = 0.5 * agg(torch.maximum((v - ret) ** 2, (vc - ret) ** 2), mask, "token-mean")
    close(loss, want, 1e-12, 1e-14)
    close(torch.autograd.grad(loss, v)[0], torch.autograd.grad(want, v)[0], 1e-10, 1e-15)


# --- logprob / entropy ----------------------------------------------------------------------------

def lp_ref(logits, tokens, temperature):
    z = logits.double() / temperature
    ls = torch.log_softmax(z, -1)
    return ls.gather(-1, tokens[..., None]).squeeze(-1), -(ls.exp() * ls).sum(-1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
def test_logprob_entropy_matches_torch(gen, dtype):
    N, V = 13, 37
    logits = (torch.randn(N, V, generator=gen) * 3).to(dtype).requires_grad_()
    tokens = torch.randint(0, V, (N,), generator=gen)
    lp, ent = rlpt.logprob_entropy(logits, tokens, temperature=0.7)
    wl, we = lp_ref(logits, tokens, 0.7)
    tol = 1e-5 if dtype in (torch.float32, torch.float64) else 1e-4
    close(lp, wl, tol, tol, "logp")
    close(ent, we, tol, tol, "entropy")
    gl, ge = torch.randn(N, generator=gen), torch.randn(N, generator=gen)
    (g,) = torch.autograd.grad((lp * gl).sum() + (ent * ge).sum(), logits)
    (w,) = torch.autograd.grad((wl * gl.double()).sum() + (we * ge.double()).sum(), logits)
    assert g.dtype == dtype
    gtol = {torch.float32: 1e-5, torch.float64: 1e-5, torch.bfloat16: 2e-2, torch.float16: 2e-3}[dtype]
    close(g.float(), w.float(), gtol, gtol, "dlogits")


def test_sequence_logprob_padded_packed_and_shift(gen):
    B, T, V = 3, 6, 11
    logits = torch.randn(B, T, V, generator=gen, requires_grad=True)
    tokens = torch.randint(0, V, (B, T), generator=gen)
    lp, ent = rlpt.sequence_logprob_entropy(logits, tokens)
    wl, _ = lp_ref(logits[:, :-1], tokens[:, 1:], 1.0)
    close(lp[:, 1:], wl, 1e-5, 1e-6, "shifted logp")
    assert not bool(lp[:, 0].any())
    cu = torch.tensor([0, T, 2 * T, 3 * T])
    lpp, entp = rlpt.sequence_logprob_entropy(logits.reshape(B * T, V), tokens.reshape(-1), cu_seqlens=cu)
    assert torch.equal(lpp.view(B, T), lp) and torch.equal(entp.view(B, T), ent)
    (g1,) = torch.autograd.grad(lp.sum(), logits)
    x = logits.detach().reshape(B * T, V).requires_grad_()
    lpp, _ = rlpt.sequence_logprob_entropy(x, tokens.reshape(-1), cu_seqlens=cu)
    (g2,) = torch.autograd.grad(lpp.sum(), x)
    assert torch.equal(g2.view(B, T, V), g1)
    assert not bool(g1[:, -1].any())  # the last position predicts nothing


def test_logprob_opcheck(gen):
    logits = torch.randn(2, 5, 9, generator=gen, requires_grad=True)
    tokens = torch.randint(0, 9, (2, 5), generator=gen)
    valid = torch.ones(2, 5, dtype=torch.bool)
    torch.library.opcheck(ops.logprob_entropy.default, (logits, tokens, valid, None, True, 0.9, 0, 1.0, -100))
    torch.library.opcheck(ops.logprob_entropy.default, (logits.view(10, 9), tokens.view(10), None, None, False,
                                                        1.0, 3, 0.9, -100))
    torch.library.opcheck(ops.logprob_entropy.default, (logits.view(10, 9), tokens.view(10), None, None, False,
                                                        1.0, 0, 0.9, -100, 0.1, False))


def test_logprob_top_k_matches_masked_softmax(gen):
    N, V, k = 8, 20, 5
    logits = torch.randn(N, V, generator=gen, dtype=F64, requires_grad=True)
    top = logits.detach().topk(k, -1).indices
    tokens = top[torch.arange(N), torch.randint(0, k, (N,), generator=gen)]
    lp, _ = rlpt.logprob_entropy(logits, tokens, top_k=k)
    keep = torch.zeros(N, V, dtype=torch.bool).scatter_(1, top, True)
    ref = torch.log_softmax(logits.masked_fill(~keep, float("-inf")), -1).gather(1, tokens[:, None]).squeeze(1)
    close(lp, ref, 1e-5, 1e-6)
    close(torch.autograd.grad(lp.sum(), logits)[0], torch.autograd.grad(ref.sum(), logits)[0], 1e-5, 1e-6)


@pytest.mark.parametrize("order", ["first", "last"])
def test_logprob_min_p_matches_hf_warpers(gen, order):
    # Hugging Face's own warpers in the engine's order: MinP, TopK, TopP (vLLM) or TopK, TopP, MinP
    # (generate(), SGLang); logp, entropy and the gradient against the masked fp64 softmax
    warpers = pytest.importorskip("transformers.generation.logits_process")
    N, V, temp, k, p, mp = 16, 300, 0.8, 40, 0.85, 0.05
    logits = (torch.randn(N, V, generator=gen, dtype=F64) * 2.5).requires_grad_()
    chain = [warpers.TopKLogitsWarper(top_k=k), warpers.TopPLogitsWarper(top_p=p)]
    min_p = warpers.MinPLogitsWarper(min_p=mp)
    chain = [min_p] + chain if order == "first" else chain + [min_p]
    z = logits.detach() / temp
    for w in chain:
        z = w(None, z)
    keep = torch.isfinite(z)
    tokens = z.argmax(-1)
    lp, ent = rlpt.logprob_entropy(logits, tokens, temperature=temp, top_k=k, top_p=p, min_p=mp, min_p_order=order)
    ref_all = torch.log_softmax((logits / temp).masked_fill(~keep, float("-inf")), -1)
    ref = ref_all.gather(1, tokens[:, None]).squeeze(1)
    ref_ent = -(torch.where(keep, ref_all.exp() * ref_all, torch.zeros_like(ref_all))).sum(-1)
    close(lp, ref, 1e-5, 1e-6, "logp")
    close(ent, ref_ent, 1e-5, 1e-6, "entropy")
    gl, ge = torch.randn(N, generator=gen, dtype=F64), torch.randn(N, generator=gen, dtype=F64)
    (g,) = torch.autograd.grad((lp.double() * gl).sum() + (ent.double() * ge).sum(), logits)
    (w,) = torch.autograd.grad((ref * gl).sum() + (ref_ent * ge).sum(), logits)
    close(g, w, 1e-5, 1e-6, "dlogits")


def test_logprob_min_p_golden_and_errors(gen):
    root = pathlib.Path(__file__).resolve().parents[2]
    sys.path.insert(0, str(root / "tools" / "golden"))
    import rlpt_golden
    arrays, _ = rlpt_golden.read(root / "tests" / "data" / "golden" / "logprob" / "sampled_min_p.bin")
    x = torch.from_numpy(arrays["logits"])
    for c in range(6):
        temp, k, p, mp, first = arrays[f"case{c}_params"].tolist()
        t = torch.from_numpy(arrays[f"case{c}_targets"])
        lp, ent = rlpt.logprob_entropy(x, t, temperature=temp, top_k=int(k), top_p=p, min_p=mp,
                                       min_p_order="first" if first else "last")
        close(lp.double(), torch.from_numpy(arrays[f"case{c}_logp"]), 2e-5, 1e-5, f"case {c} logp")
        close(ent.double(), torch.from_numpy(arrays[f"case{c}_entropy"]), 2e-5, 1e-5, f"case {c} entropy")
    with pytest.raises(rlpt.Error) as e:
        rlpt.logprob_entropy(x, t, min_p=0.1, min_p_order="middle")
    assert e.value.id == "rlpt.logprob.min_p" and "'middle'" in e.value.message
    with pytest.raises(rlpt.Error) as e:
        rlpt.logprob_entropy(x, t, min_p=1.5)
    assert e.value.id == "rlpt.logprob.min_p" and "got 1.5" in e.value.message


# --- advantages -----------------------------------------------------------------------------------

def test_advantage_opchecks(gen):
    r = torch.rand(8, generator=gen)
    ids = torch.tensor([0, 0, 1, 1, 1, 2, 2, 2])
    torch.library.opcheck(ops.outcome_advantages.default, ("estimator=grpo;preset=verl", r, ids, None))
    tr = torch.randn(3, 5, generator=gen)
    v = torch.randn(3, 5, generator=gen)
    m = torch.rand(3, 5, generator=gen) > 0.2
    torch.library.opcheck(ops.gae.default, ("preset=verl;gamma=0.9;lam=0.8", tr, v, m, None, None))
    torch.library.opcheck(ops.reinforce_pp.default, ("preset=verl;gamma=1.0", tr, m, None))
    torch.library.opcheck(ops.reinforce_pp_baseline.default, ("preset=verl", r[:3], ids[:3], m, None))
    torch.library.opcheck(ops.remax.default, ("preset=verl", tr, r[:3], m, None))
    torch.library.opcheck(ops.local_denominators.default,
                          ("preset=verl_actor", v, m, v, None, None, None, r[:3], None, None, None, None, None))


def test_gigpo_by_hand_with_text_and_array_observations():
    # One task, three trajectories of two steps (rows interleaved by step); states: all start in
    # "s0"; trajectories 0 and 1 reach "s1", trajectory 2 reaches "s2" (seen once: step advantage 0).
    traj = ["t0", "t1", "t2", "t0", "t1", "t2"]
    rewards = torch.tensor([0.0, 0.0, 0.0, 1.0, 0.0, 1.0])
    ret = rlpt.step_returns(rewards, traj, gamma=0.5)
    assert ret.tolist() == [0.5, 0.0, 0.5, 1.0, 0.0, 1.0]
    scores = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 1.0])
    me = 4.0 / 6.0
    want = [1 - me + (0.5 - 1 / 3), -me - 1 / 3, 1 - me + (0.5 - 1 / 3), 1 - me + 0.5, -me - 0.5, 1 - me]
    for obs in (["s0", "s0", "s0", "s1", "s1", "s2"],
                [np.array([0, 0]), np.array([0, 0]), np.array([0, 0]), np.array([1, 0]), np.array([1, 0]),
                 np.array([0, 1])],
                torch.tensor([7, 7, 7, 8, 8, 9])):
        adv, stats = rlpt.gigpo_advantages(scores, ["task"] * 6, ret, obs)
        close(adv.double(), torch.tensor(want, dtype=F64), 1e-6, 1e-7)
        assert stats.shape == (2, len(rlpt.GROUP_STATS))
        assert stats[1, 0] == 1.0  # one anchor group is degenerate: "s2"
    adv_std, _ = rlpt.gigpo_advantages(scores, ["task"] * 6, ret, traj, mode="mean_std_norm", step_advantage_w=0.5)
    assert torch.isfinite(adv_std).all()
    with pytest.raises(rlpt.Error, match="mode = \"mean\" is not reproduced"):
        rlpt.gigpo_advantages(scores, ["task"] * 6, ret, traj, mode="mean")
    with pytest.raises(rlpt.Error, match="step_rewards"):
        rlpt.step_returns(torch.tensor([0.0, float("nan")]), [0, 0])
    with pytest.raises(rlpt.Error, match="on_nonfinite = 'skip'"):
        rlpt.step_returns(rewards, traj, on_nonfinite="skip")
    torch.library.opcheck(ops.step_returns.default, (rewards, rlpt.group_ids(traj), 0.9, False))
    torch.library.opcheck(ops.gigpo.default, (scores, torch.zeros(6, dtype=torch.int64), ret,
                                              torch.tensor([7, 7, 7, 8, 8, 9]), "mean_norm", 1.0, 1e-6, False))


def test_grpo_ragged_groups(gen):
    r = torch.rand(9, generator=gen)
    ids = ["b", "a", "b", "c", "a", "b", "c", "c", "d"]
    adv, stats = rlpt.grpo_advantages(r, ids, preset="verl")
    for g in set(ids):
        idx = [i for i, x in enumerate(ids) if x == g]
        x = r[idx].double()
        want = (x - x.mean()) / (x.std() + 1e-6) if len(idx) > 1 else x / (1 + 1e-6)
        close(adv[idx], want, 1e-6, 1e-6, g)
    assert rlpt.metrics_dict(stats, rlpt.GROUP_STATS)["num_degenerate"] == 1.0


def test_gae_matches_loop(gen):
    B, T, gamma, lam = 3, 7, 0.9, 0.8
    r = torch.randn(B, T, generator=gen)
    v = torch.randn(B, T, generator=gen)
    m = torch.ones(B, T, dtype=torch.bool)
    adv, ret, _ = rlpt.gae(r, v, m, gamma=gamma, lam=lam, preset="rlpt")
    want = torch.zeros(B, T, dtype=F64)
    last = torch.zeros(B, dtype=F64)
    for t in reversed(range(T)):
        nv = v[:, t + 1].double() if t + 1 < T else torch.zeros(B, dtype=F64)
        delta = r[:, t].double() + gamma * nv - v[:, t].double()
        last = delta + gamma * lam * last
        want[:, t] = last
    close(adv, want, 1e-5, 1e-6)
    close(ret, want + v.double(), 1e-5, 1e-6)


# --- torch.compile --------------------------------------------------------------------------------

def _loss_fn(logits, tokens, valid, old, ref, adv, spec):
    logp, ent = rlpt.sequence_logprob_entropy(logits, tokens, valid, temperature=0.9)
    loss, metrics = rlpt.policy_loss(spec, logp, valid, old_logp=old, ref_logp=ref, seq_adv=adv, entropy=ent)
    return loss + 0 * metrics[0]


def test_compile_has_no_graph_breaks(gen):
    B, T, V = 2, 6, 13
    logits = torch.randn(B, T, V, generator=gen, requires_grad=True)
    tokens = torch.randint(0, V, (B, T), generator=gen)
    valid = torch.ones(B, T, dtype=torch.bool)
    old = torch.randn(B, T, generator=gen) - 2
    ref = old + 0.1
    adv = torch.randn(B, generator=gen)
    obj = rlpt.Objective.verl_actor(use_kl_loss=True, entropy_coeff=0.01)
    import torch._dynamo as dynamo

    dynamo.reset()
    explain = dynamo.explain(_loss_fn)(logits, tokens, valid, old, ref, adv, obj)
    assert explain.graph_break_count == 0, explain.break_reasons
    assert explain.graph_count == 1
    compiled = torch.compile(_loss_fn, backend="aot_eager", fullgraph=True)
    got = compiled(logits, tokens, valid, old, ref, adv, obj)
    (g_got,) = torch.autograd.grad(got, logits)
    want = _loss_fn(logits, tokens, valid, old, ref, adv, obj)
    (g_want,) = torch.autograd.grad(want, logits)
    assert got.item() == want.item()
    assert torch.equal(g_got, g_want)


# --- CUDA (skipped without a device) --------------------------------------------------------------

@cuda
def test_cuda_matches_cpu(gen):
    if not rlpt.cuda_kernels:
        pytest.skip("package built without CUDA kernels")
    B, T, V = 3, 8, 50
    logits = torch.randn(B, T, V, generator=gen)
    tokens = torch.randint(0, V, (B, T), generator=gen)
    lp_c, ent_c = rlpt.sequence_logprob_entropy(logits, tokens)
    lp_g, ent_g = rlpt.sequence_logprob_entropy(logits.cuda(), tokens.cuda())
    close(lp_g.cpu(), lp_c, 1e-5, 1e-6)
    close(ent_g.cpu(), ent_c, 1e-5, 1e-6)
    lp, old, ref, _, _, mask, adv = batch(gen, dtype=torch.float32)
    obj = rlpt.Objective.verl_actor(use_kl_loss=True)
    x = lp.clone().requires_grad_()
    loss_c, _ = rlpt.policy_loss(obj, x, mask, old_logp=old, ref_logp=ref, seq_adv=adv)
    xg = lp.cuda().requires_grad_()
    loss_g, _ = rlpt.policy_loss(obj, xg, mask.cuda(), old_logp=old.cuda(), ref_logp=ref.cuda(), seq_adv=adv.cuda())
    close(loss_g.cpu(), loss_c, 1e-5, 1e-7)
    close(torch.autograd.grad(loss_g, xg)[0].cpu(), torch.autograd.grad(loss_c, x)[0], 1e-5, 1e-7)


def test_custom_dppo_equals_the_verl_presets(gen):
    lp, old, _, _, _, mask, adv = batch(gen)
    for divergence, mode in (("tv", "dppo_tv"), ("binary_kl", "dppo_kl")):
        custom = rlpt.Objective.custom(policy="dppo", **{"policy.divergence": divergence, "policy.eps_low": 0.02,
                                                         "policy.eps_high": 0.03, "policy.trunc": 3.0})
        preset = rlpt.Objective.verl_actor(loss_mode=mode, clip_ratio_low=0.02, clip_ratio_high=0.03)
        a, ma = rlpt.policy_loss(custom, lp, mask, old_logp=old, seq_adv=adv)
        b, mb = rlpt.policy_loss(preset, lp, mask, old_logp=old, seq_adv=adv)
        assert float(a) == float(b)
        da, db = rlpt.metrics_dict(ma), rlpt.metrics_dict(mb)
        assert da["clip_frac_low"] + da["clip_frac_high"] > 0  # the bounds drop tokens here
        assert da == db
    with pytest.raises(rlpt.Error, match="divergence"):
        rlpt.Objective.custom(policy="dppo", **{"policy.divergence": "js"})


def test_custom_rejection_criteria_equal_the_verl_preset(gen):
    lp, old, _, _, _, mask, adv = batch(gen)
    behav = old + 0.3 * torch.randn(old.shape, generator=gen, dtype=old.dtype)
    custom = rlpt.Objective.custom(policy="ppo_clip", **{
        "correction.reject.stat": "k1", "correction.reject.lo": 0.7, "correction.reject.hi": 1.4,
        "correction.reject_also.1.stat": "k2", "correction.reject_also.1.level": "seq_max",
        "correction.reject_also.1.hi": 0.1})
    preset = rlpt.Objective.verl_actor(rollout_rs="token_k1,seq_max_k2", rollout_rs_threshold="0.7_1.4,0.1")
    first = rlpt.Objective.verl_actor(rollout_rs="token_k1", rollout_rs_threshold="0.7_1.4")
    x1, x2 = lp.clone().requires_grad_(), lp.clone().requires_grad_()
    a, ma = rlpt.policy_loss(custom, x1, mask, old_logp=old, behav_logp=behav, seq_adv=adv)
    b, mb = rlpt.policy_loss(preset, x2, mask, old_logp=old, behav_logp=behav, seq_adv=adv)
    _, m1 = rlpt.policy_loss(first, lp, mask, old_logp=old, behav_logp=behav, seq_adv=adv)
    assert a.item() == b.item()
    assert torch.equal(torch.autograd.grad(a, x1)[0], torch.autograd.grad(b, x2)[0])
    da = rlpt.metrics_dict(ma)
    assert da == rlpt.metrics_dict(mb)
    assert 1 > da["rejected_frac"] > rlpt.metrics_dict(m1)["rejected_frac"] > 0  # the second criterion rejects more
    with pytest.raises(rlpt.Error, match=r"reject_also\[2\]\.hi"):
        rlpt.policy_loss(rlpt.Objective.custom(**{"correction.reject_also.2.stat": "k3", "correction.reject_also.2.hi": -1}),
                         lp, mask, old_logp=old, behav_logp=behav, seq_adv=adv)


def _m2po_definition(old, behav, mask, threshold):
    """M2PO's selection from its definition (float64): drop the valid tokens of largest M2, the
    least number for which the rest's mean is below the threshold (all but one when none is)."""
    valid = mask.bool()
    m2 = ((old - behav) ** 2)[valid]
    order = torch.sort(m2, descending=True, stable=True).indices
    s = m2[order]
    n = s.numel()
    means = s.flip(0).cumsum(0).flip(0) / torch.arange(n, 0, -1, dtype=s.dtype)
    below = torch.nonzero(means < threshold).flatten()
    k = int(below[0]) if below.numel() else n - 1
    keep_sorted = torch.ones(n, dtype=torch.bool)
    keep_sorted[:k] = False
    keep = torch.zeros(n, dtype=torch.bool)
    keep[order] = keep_sorted
    out = torch.zeros_like(valid)
    out[valid] = keep
    return out


def test_m2po_mask_matches_its_definition(gen):
    lp, old, _, _, _, mask, adv = batch(gen, B=9, T=13)
    behav = old + 0.4 * torch.randn(old.shape, generator=gen, dtype=old.dtype)
    for threshold in (1e-3, 0.05, 0.15, 10.0):
        got = rlpt.m2po_mask(old, behav, mask, m2_threshold=threshold)
        want = _m2po_definition(old, behav, mask, threshold)
        assert got.dtype == torch.bool and got.shape == old.shape
        assert torch.equal(got, want), threshold
    got = rlpt.m2po_mask(old, behav, mask, m2_threshold=0.05)
    assert 0 < int(got.sum()) < int(mask.sum())  # some dropped, some kept
    # Packed: the valid tokens back to back give the same selection.
    lengths = mask.sum(1)
    cu = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])
    packed = rlpt.m2po_mask(old[mask.bool()], behav[mask.bool()], None, m2_threshold=0.05, cu_seqlens=cu)
    assert torch.equal(packed, got[mask.bool()])
    # The mask goes to the loss: the dropped tokens leave it.
    loss, m = rlpt.policy_loss(rlpt.Objective.verl_actor(), lp, got, old_logp=old, seq_adv=adv)
    assert rlpt.metrics_dict(m)["tokens"] == float(got.sum())
    with pytest.raises(rlpt.Error, match="m2_threshold"):
        rlpt.m2po_mask(old, behav, mask, m2_threshold=0.0)


def test_custom_dro_equals_the_verl_preset(gen):
    lp, old, _, _, _, mask, adv = batch(gen)
    custom = rlpt.Objective.custom(policy="dro", **{"policy.beta": 0.7})
    preset = rlpt.Objective.verl_actor(loss_mode="dro", dro_beta=0.7)
    x1, x2 = lp.clone().requires_grad_(), lp.clone().requires_grad_()
    a, ma = rlpt.policy_loss(custom, x1, mask, old_logp=old, seq_adv=adv)
    b, mb = rlpt.policy_loss(preset, x2, mask, old_logp=old, seq_adv=adv)
    assert a.item() == b.item()
    assert torch.equal(torch.autograd.grad(a, x1)[0], torch.autograd.grad(b, x2)[0])
    assert rlpt.metrics_dict(ma) == rlpt.metrics_dict(mb)
    with pytest.raises(rlpt.Error, match="dro.beta"):
        rlpt.policy_loss(rlpt.Objective.custom(policy="dro"), lp, mask, old_logp=old, seq_adv=adv)


def test_custom_vespo_equals_the_trl_preset(gen):
    lp, old, _, _, _, mask, adv = batch(gen)
    tok_adv = adv[:, None] * torch.linspace(-1.0, 1.0, lp.shape[1], dtype=lp.dtype)  # both signs in a row
    custom = rlpt.Objective.custom(policy="vespo", **{"policy.k_pos": 1.5, "policy.lambda_neg": 2.5})
    preset = rlpt.Objective.trl_grpo(loss_type="vespo", vespo_k_pos=1.5, vespo_lambda_neg=2.5,
                                     num_items_in_batch=float(mask.sum()))
    x1, x2 = lp.clone().requires_grad_(), lp.clone().requires_grad_()
    a, _ = rlpt.policy_loss(custom, x1, mask, old_logp=old, adv=tok_adv)
    b, _ = rlpt.policy_loss(preset, x2, mask, old_logp=old, adv=tok_adv)
    assert a.item() == pytest.approx(b.item(), rel=1e-15)
    torch.testing.assert_close(torch.autograd.grad(a, x1)[0], torch.autograd.grad(b, x2)[0], rtol=1e-15, atol=0)


def _mismatch_batch(gen, B=6, T=12):
    _, mask = ragged_mask(gen, B, T)
    rollout = -torch.rand(B, T, generator=gen) * 3 - 1e-3
    trainer = (rollout + 0.05 * torch.randn(B, T, generator=gen)).clamp(max=-1e-4)
    return trainer, rollout, mask


def test_mismatch_metrics_packed_padded_dtypes_and_device_copy(gen):
    trainer, rollout, mask = _mismatch_batch(gen)
    m = rlpt.mismatch_metrics(trainer, rollout, mask, eps_low=0.05, eps_high=0.05)
    assert set(m) == set(rlpt.MISMATCH)
    assert m["tokens"] == float(mask.sum()) and m["seqs"] == float((mask.sum(1) > 0).sum())
    # direct evaluation of a few of them
    t, r = trainer[mask].double(), rollout[mask].double()
    assert m["k1"] == pytest.approx(float((r - t).mean()), rel=1e-9)
    assert m["abs_diff_max"] == pytest.approx(float((t - r).abs().max()), rel=1e-12)
    assert m["pearson_logp"] == pytest.approx(float(torch.corrcoef(torch.stack([t, r]))[0, 1]), rel=1e-9)
    rho = (t - r).exp()
    assert m["out_of_band"] == pytest.approx(float(((rho < 0.95) | (rho > 1.05)).double().mean()), rel=1e-12)
    # packed: the valid prefix of each row (ragged_mask masks a suffix)
    lengths = mask.sum(1)
    cu = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])
    packed = rlpt.mismatch_metrics(trainer[mask], rollout[mask], None, eps_low=0.05, eps_high=0.05, cu_seqlens=cu)
    assert packed == m
    # float64 inputs give the same metrics (the float32 values are exact in float64)
    assert rlpt.mismatch_metrics(trainer.double(), rollout.double(), mask, eps_low=0.05, eps_high=0.05) == m
    # a non-contiguous view is read like its contiguous copy
    wide = torch.cat([trainer, trainer], 1)
    assert rlpt.mismatch_metrics(wide[:, :trainer.shape[1]], rollout, mask, eps_low=0.05, eps_high=0.05) == m


def test_mismatch_metrics_errors_and_nonfinite(gen):
    trainer, rollout, mask = _mismatch_batch(gen)
    mask[:] = True
    trainer[1, 2] = float("nan")
    with pytest.raises(rlpt.Error) as e:
        rlpt.mismatch_metrics(trainer, rollout, mask)
    assert e.value.id == "rlpt.logprob.nonfinite" and "sequence 1, position 2" in e.value.message
    m = rlpt.mismatch_metrics(trainer, rollout, mask, nonfinite="mask")
    assert m["nonfinite_tokens"] == 1.0 and m["tokens"] == mask.numel() - 1
    with pytest.raises(rlpt.Error) as e:
        rlpt.mismatch_metrics(trainer, rollout, mask, eps_low=2.0)
    assert e.value.id == "rlpt.logprob.bad_option" and "eps_low = 2" in e.value.message
    with pytest.raises(rlpt.Error) as e:
        rlpt.mismatch_metrics(trainer, rollout[:, :5], mask)
    assert e.value.id == "rlpt.python.shape"
    with pytest.raises(ValueError):
        rlpt.mismatch_metrics(trainer, rollout, mask, nonfinite="skip")
    empty = rlpt.mismatch_metrics(trainer, rollout, torch.zeros_like(mask))
    assert all(v == 0.0 for v in empty.values())


def test_mismatch_metrics_opcheck(gen):
    trainer, rollout, mask = _mismatch_batch(gen)
    torch.library.opcheck(ops.mismatch_metrics.default, (trainer, rollout, mask, None, 0.2, 0.2, 20.0, False))
