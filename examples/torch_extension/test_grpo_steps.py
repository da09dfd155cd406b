#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""A few GRPO steps of a tiny causal transformer trained through rlpt_torch, checked three ways:

(a) against the rlpt C++ library alone (rlpt_torch_reference_runner on the same inputs): the
    advantages, logprobs, entropies, loss and d loss / d logits are equal bit for bit;
(b) against the same math in plain float64 torch (verl's formulas): loss and every parameter
    gradient agree to float32 precision (rlpt's logprob kernel works in float32): loss 1e-6
    relative + 2e-7, gradients 1e-5 relative + 1e-6 of the largest entry;
(c) the objective and advantages alone on float64 inputs against plain torch (verl actor and TRL
    GRPO presets, GRPO and RLOO advantages): 1e-12 relative for the objective.

Run by CTest (label `examples`) with Debian's /usr/bin/python3 and PYTHONPATH pointing at the
built package; --runner is the C++ runner, --workdir a scratch directory for the step dumps.
"""
import argparse
import copy
import math
import pathlib
import subprocess
import sys

import torch

import rlpt_torch as rt

F64 = torch.float64
VOCAB, PROMPT_LEN, COMPLETION_LEN, PROMPTS, GROUP = 12, 2, 6, 4, 4
T = PROMPT_LEN + COMPLETION_LEN
B = PROMPTS * GROUP
EOS = 0
CFG = dict(clip_ratio_low=0.2, clip_ratio_high=0.28, kl_loss_coef=0.05, kl_loss_type="low_var_kl",
           entropy_coeff=0.01, loss_agg_mode="token-mean", temperature=0.9)


class TinyLM(torch.nn.Module):
    """One pre-norm causal self-attention block and an MLP, float64."""

    def __init__(self, d=32):
        super().__init__()
        self.emb = torch.nn.Embedding(VOCAB, d)
        self.pos = torch.nn.Parameter(0.1 * torch.randn(T, d))
        self.ln1, self.ln2 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
        self.qkv = torch.nn.Linear(d, 3 * d)
        self.proj = torch.nn.Linear(d, d)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(d, 2 * d), torch.nn.GELU(), torch.nn.Linear(2 * d, d))
        self.head = torch.nn.Linear(d, VOCAB)

    def forward(self, tokens):
        n = tokens.shape[1]
        x = self.emb(tokens) + self.pos[:n]
        q, k, v = self.qkv(self.ln1(x)).chunk(3, dim=-1)
        att = (q @ k.transpose(1, 2)) / math.sqrt(q.shape[-1])
        att = att.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf")).softmax(-1)
        x = x + self.proj(att @ v)
        x = x + self.mlp(self.ln2(x))
        return self.head(x)


def generate(model, prompts, gen):
    """Temperature sampling; after EOS the sequence is padded with EOS (outside the loss mask)."""
    tokens = prompts
    done = torch.zeros(prompts.shape[0], dtype=torch.bool)
    with torch.no_grad():
        for _ in range(COMPLETION_LEN):
            probs = (model(tokens)[:, -1] / CFG["temperature"]).softmax(-1)
            nxt = torch.multinomial(probs, 1, generator=gen).squeeze(1)
            nxt = torch.where(done, torch.full_like(nxt, EOS), nxt)
            tokens = torch.cat([tokens, nxt[:, None]], 1)
            done |= nxt == EOS
    completion = tokens[:, PROMPT_LEN:]
    ended = (completion == EOS).long().cumsum(1)
    mask = torch.zeros(B, T, dtype=torch.bool)
    mask[:, PROMPT_LEN:] = (ended == 0) | ((ended == 1) & (completion == EOS))  # tokens up to and with EOS
    # Task: repeat the first prompt token; reward = share of the completion slots that do.
    hits = ((completion == tokens[:, :1]) & mask[:, PROMPT_LEN:]).sum(1)
    rewards = (hits.double() / COMPLETION_LEN).float()
    return tokens, mask, rewards


# --- plain-torch references (verl core_algos formulas) -------------------------------------------

def ref_logprob_entropy(logits, tokens):
    """Token t's logprob and entropy from logits row t - 1; 0 for the first token."""
    ls = torch.log_softmax(logits / CFG["temperature"], -1)
    lp = torch.zeros(tokens.shape, dtype=logits.dtype)
    ent = torch.zeros(tokens.shape, dtype=logits.dtype)
    lp[:, 1:] = ls[:, :-1].gather(-1, tokens[:, 1:, None]).squeeze(-1)
    ent[:, 1:] = -(ls[:, :-1].exp() * ls[:, :-1]).sum(-1)
    return lp, ent


def ref_grpo(rewards, ids, eps=1e-6):
    r = rewards.double()
    out = torch.empty_like(r)
    for g in ids.unique():
        sel = ids == g
        out[sel] = (r[sel] - r[sel].mean()) / (r[sel].std() + eps)
    return out


def ref_rloo(rewards, ids):
    r = rewards.double()
    out = torch.empty_like(r)
    for g in ids.unique():
        sel = ids == g
        n = int(sel.sum())
        out[sel] = r[sel] - (r[sel].sum() - r[sel]) / (n - 1)
    return out


def ref_verl_actor(logp, ent, old, ref, adv, mask, c=CFG, clip_c=3.0):
    """verl compute_policy_loss_vanilla + kl_penalty(low_var_kl) + entropy, agg_loss token-mean."""
    m = mask.to(logp.dtype)
    agg = lambda x: (x * m).sum() / m.sum()
    A = adv[:, None].expand_as(logp)
    ratio = torch.exp(torch.clamp(logp - old, -20.0, 20.0))
    l1 = -A * ratio
    l2 = -A * torch.clamp(ratio, 1 - c["clip_ratio_low"], 1 + c["clip_ratio_high"])
    clip1 = torch.maximum(l1, l2)
    clip2 = torch.minimum(-A * clip_c, clip1)
    pg = agg(torch.where(A < 0, clip2, clip1))
    kl = torch.clamp(ref - logp, -20.0, 20.0)
    kld = torch.clamp(torch.exp(kl) - kl - 1, -10.0, 10.0)
    return pg + c["kl_loss_coef"] * agg(kld) - c["entropy_coeff"] * agg(ent)


def ref_trl_grpo(logp, old, ref, adv, mask, eps=0.2, eps_high=0.28, beta=0.04):
    """TRL GRPOTrainer._compute_loss, loss_type="grpo" (seq-mean-token-mean), token-level IS."""
    m = mask.to(logp.dtype)
    coef1 = torch.exp(logp - old)
    coef2 = torch.clamp(coef1, 1 - eps, 1 + eps_high)
    A = adv[:, None]
    per_token = -torch.minimum(coef1 * A, coef2 * A)
    per_token = per_token + beta * (torch.exp(ref - logp) - (ref - logp) - 1)
    return ((per_token * m).sum(-1) / m.sum(-1).clamp(min=1.0)).mean()


# --- checks ---------------------------------------------------------------------------------------

def close(name, got, want, rtol, atol=0.0):
    got, want = torch.as_tensor(got, dtype=F64), torch.as_tensor(want, dtype=F64)
    err = (got - want).abs()
    bound = atol + rtol * want.abs()
    if not bool((err <= bound).all()):
        i = int((err - bound).argmax())
        raise AssertionError(f"{name}: max error {float(err.max()):.3g} at flat index {i} "
                             f"(got {float(got.flatten()[i])!r}, want {float(want.flatten()[i])!r}, "
                             f"rtol {rtol}, atol {atol})")


def same_bits(name, got, want):
    if got.dtype != want.dtype or got.shape != want.shape or not torch.equal(got, want):
        diff = (got.double() - want.double()).abs().max() if got.shape == want.shape else "shape"
        raise AssertionError(f"{name}: rlpt_torch and the C++ library differ (max diff {diff}, "
                             f"dtypes {got.dtype} / {want.dtype})")


def check_against_runner(runner, d, logits, tokens, mask, rewards, ids, old, ref, got):
    """(a) the step through the C++ library alone must give the very same bits."""
    d.mkdir(parents=True, exist_ok=True)
    (d / "dims.txt").write_text(f"{B} {T} {VOCAB}\n")
    (d / "config.txt").write_text("".join(f"{k} {v}\n" for k, v in CFG.items()))
    for name, t in (("rewards.f32", rewards), ("group_ids.i64", ids), ("logits.f64", logits),
                    ("tokens.i64", tokens), ("mask.u8", mask.to(torch.uint8)), ("old_logp.f64", old),
                    ("ref_logp.f64", ref)):
        t.detach().contiguous().numpy().tofile(d / name)
    subprocess.run([runner, str(d)], check=True, stdout=subprocess.DEVNULL)

    def load(name, dtype, shape):
        import numpy
        a = numpy.fromfile(d / name, dtype=dtype)
        return torch.from_numpy(a).reshape(shape)

    same_bits("advantages", got["adv"], load("out_adv.f32", "float32", (B,)))
    same_bits("logp", got["logp"], load("out_logp.f32", "float32", (B, T)))
    same_bits("entropy", got["entropy"], load("out_entropy.f32", "float32", (B, T)))
    same_bits("loss", got["loss"].reshape(1), load("out_loss.f64", "float64", (1,)))
    same_bits("d loss / d logits", got["dlogits"], load("out_grad_logits.f64", "float64", (B, T, VOCAB)))


def check_objectives_fp64(gen):
    """(c) objective and advantages alone, float64, against plain torch."""
    NB, NT = 32, 24
    lp = (-2.0 * torch.rand(NB, NT, generator=gen, dtype=F64) - 0.1).requires_grad_()
    ent = (2.0 * torch.rand(NB, NT, generator=gen, dtype=F64)).requires_grad_()
    old = lp.detach() + 0.8 * torch.randn(NB, NT, generator=gen, dtype=F64)  # ratios past the dual clip too
    ref = lp.detach() + 1.2 * torch.randn(NB, NT, generator=gen, dtype=F64)  # some k3 values past the 10 clamp
    adv = torch.randn(NB, generator=gen, dtype=F64)
    mask = torch.rand(NB, NT, generator=gen) < 0.7
    mask[3] = False  # an empty row

    obj = rt.Objective.verl_actor(clip_ratio_low=CFG["clip_ratio_low"], clip_ratio_high=CFG["clip_ratio_high"],
                                  use_kl_loss=True, kl_loss_coef=CFG["kl_loss_coef"],
                                  kl_loss_type=CFG["kl_loss_type"], entropy_coeff=CFG["entropy_coeff"])
    loss, metrics = rt.policy_loss(obj, lp, mask, entropy=ent, old_logp=old, ref_logp=ref, seq_adv=adv)
    g_lp, g_ent = torch.autograd.grad(loss, (lp, ent))
    want = ref_verl_actor(lp, ent, old, ref, adv, mask)
    w_lp, w_ent = torch.autograd.grad(want, (lp, ent))
    close("verl actor loss (fp64)", loss, want, 1e-12)
    close("verl actor d/d logp (fp64)", g_lp, w_lp, 1e-12, 1e-15)
    close("verl actor d/d entropy (fp64)", g_ent, w_ent, 1e-12, 1e-15)
    assert min(metrics["clip_frac_high"], metrics["clip_frac_low"], metrics["clip_frac_dual"]) > 0, metrics

    obj = rt.Objective.trl_grpo(loss_type="grpo", epsilon=0.2, epsilon_high=0.28, beta=0.04)
    loss, _ = rt.policy_loss(obj, lp, mask, old_logp=old, ref_logp=ref, seq_adv=adv)
    (g_lp,) = torch.autograd.grad(loss, (lp,))
    want = ref_trl_grpo(lp, old, ref, adv, mask)
    (w_lp,) = torch.autograd.grad(want, (lp,))
    close("TRL grpo loss (fp64)", loss, want, 1e-12)
    close("TRL grpo d/d logp (fp64)", g_lp, w_lp, 1e-12, 1e-15)

    # A loss that is one term of a larger graph: upstream gradient 0.5.
    loss, _ = rt.policy_loss(obj, lp, mask, old_logp=old, ref_logp=ref, seq_adv=adv)
    (g_half,) = torch.autograd.grad(0.5 * loss, (lp,))
    close("upstream gradient scales", g_half, 0.5 * w_lp, 1e-12, 1e-15)

    rewards = torch.rand(B, generator=gen)
    ids = torch.arange(PROMPTS).repeat_interleave(GROUP)[torch.randperm(B, generator=gen)]  # any order
    adv32, stats = rt.grpo_advantages(rewards, ids, preset="verl")
    close("GRPO advantages", adv32, ref_grpo(rewards, ids), 1e-6, 1e-7)
    adv32, _ = rt.rloo_advantages(rewards, ids, preset="verl")
    close("RLOO advantages", adv32, ref_rloo(rewards, ids), 1e-6, 1e-7)
    adv32, _ = rt.grpo_advantages(rewards, ids, preset="verl", scale="none")
    group_mean = torch.stack([rewards[ids == i].double().mean() for i in ids])
    close("Dr. GRPO advantages", adv32, rewards.double() - group_mean, 1e-6, 1e-7)


def check_layouts_and_dtypes(gen):
    """Packed sequences give the padded results bit for bit; bf16 / fp32 logits work end to end."""
    lens = [5, 3, 7]
    Tm, V = max(lens), 11
    logits = torch.randn(len(lens), Tm, V, generator=gen, dtype=F64, requires_grad=True)
    tokens = torch.randint(0, V, (len(lens), Tm), generator=gen)
    valid = torch.arange(Tm)[None, :] < torch.tensor(lens)[:, None]
    logp, ent = rt.sequence_logprob_entropy(logits, tokens, valid=valid)
    (g_pad,) = torch.autograd.grad((logp * 1.5).sum() + ent.sum(), (logits,))
    flat_logits = torch.cat([logits[b, :n] for b, n in enumerate(lens)]).detach().requires_grad_()
    flat_tokens = torch.cat([tokens[b, :n] for b, n in enumerate(lens)])
    cu = torch.tensor([0] + lens).cumsum(0)
    lp_p, ent_p = rt.sequence_logprob_entropy(flat_logits, flat_tokens, cu_seqlens=cu)
    (g_pk,) = torch.autograd.grad((lp_p * 1.5).sum() + ent_p.sum(), (flat_logits,))
    same_bits("packed vs padded logp", lp_p, logp[valid])
    same_bits("packed vs padded entropy", ent_p, ent[valid])
    same_bits("packed vs padded d logits", g_pk, g_pad[valid])
    assert float(g_pad[~valid].abs().max()) == 0.0, "padding got a gradient"
    for dtype in (torch.float32, torch.bfloat16):
        x = logits.detach().to(dtype).requires_grad_()
        lp, _ = rt.sequence_logprob_entropy(x, tokens, valid=valid)
        (g,) = torch.autograd.grad(lp.sum(), (x,))
        assert lp.dtype == torch.float32 and g.dtype == dtype, (lp.dtype, g.dtype)
        want, _ = ref_logprob_entropy(x.detach().double() * CFG["temperature"], tokens)  # ref divides by T
        close(f"{dtype} logits: logp", lp[valid], want[valid], 1e-5, 1e-6)  # same rounded inputs


def check_top_k(gen):
    """Sampling-consistent scoring: top-k at temperature 0.7 against torch's masked log_softmax,
    forward and backward; a target outside the top-k scores -inf, unscored, with no gradient."""
    x = torch.randn(6, 9, dtype=F64, generator=gen, requires_grad=True)
    t = x.detach().topk(3, -1).indices[:, 1].clone()
    t[5] = x.detach()[5].argmin()
    lp, ent, scored = rt.LogprobEntropy.apply(x, t, None, None, False, 0.7, 3, 1.0, -100)
    z = x / 0.7
    ls = torch.log_softmax(z.masked_fill(z < z.topk(3, -1).values[:, -1:], float("-inf")), -1)
    want_lp = ls.gather(-1, t[:, None]).squeeze(-1)
    want_ent = -(ls.exp() * ls.nan_to_num(0.0, 0.0, 0.0)).sum(-1)
    assert scored.tolist() == [True] * 5 + [False] and lp[5] == float("-inf"), (scored, lp)
    close("top-k logp", lp[:5], want_lp[:5], 1e-6, 1e-6)
    close("top-k entropy", ent, want_ent, 1e-6, 1e-6)
    (g,) = torch.autograd.grad(lp[:5].sum() + ent.sum(), (x,))
    (w,) = torch.autograd.grad(want_lp[:5].sum() + want_ent.sum(), (x,))
    close("top-k d logits", g, w, 1e-5, 1e-6)


def ref_gae_skip(r, v, m, gamma, lam):
    """GAE over the valid tokens of each row only (masked tokens are transparent: verl's
    convention), value 0 after the last token."""
    adv, ret = torch.zeros_like(r), torch.zeros_like(r)
    for b in range(r.shape[0]):
        nxt_v, acc = 0.0, 0.0
        for t in reversed(range(r.shape[1])):
            if not m[b, t]:
                continue
            delta = r[b, t] + gamma * nxt_v - v[b, t]
            acc = delta + gamma * lam * acc
            adv[b, t], ret[b, t], nxt_v = acc, acc + v[b, t], v[b, t]
    return adv, ret


def check_gae(gen):
    """GAE (plain, and verl's preset with masked_whiten) against a direct float64 loop."""
    r = torch.randn(6, 9, generator=gen)
    v = torch.randn(6, 9, generator=gen)
    m = torch.rand(6, 9, generator=gen) < 0.8
    want_adv, want_ret = ref_gae_skip(r.double(), v.double(), m, 0.9, 0.8)
    adv, ret, _ = rt.gae(r, v, m, gamma=0.9, lam=0.8, preset="rlpt", masked="skip")
    close("GAE advantages", adv, want_adv, 1e-6, 1e-6)
    close("GAE returns", ret, want_ret, 1e-6, 1e-6)
    adv, ret, info = rt.gae(r, v, m, gamma=0.9, lam=0.8, preset="verl")
    x = want_adv[m]
    close("GAE + masked_whiten (verl)", adv[m], (x - x.mean()) / torch.sqrt(x.var() + 1e-8), 1e-5, 1e-6)
    assert float(adv[~m].abs().max()) == 0.0 and info["whiten_count"] == int(m.sum()), info


def check_errors():
    """Bad input is an rlpt_torch.Error that names the problem (never a crash or a silent copy)."""
    obj = rt.Objective.verl_actor()
    lp = torch.zeros(4, 6, dtype=F64)
    cases = [
        (lambda: rt.policy_loss(obj, lp, torch.ones(4, 6, dtype=torch.bool)), "rlpt.objective.missing_input"),
        (lambda: rt.policy_loss(obj, lp.t(), torch.ones(6, 4, dtype=torch.bool), old_logp=lp.t(),
                                seq_adv=torch.zeros(6, dtype=F64)), "rlpt.torch.strides"),
        (lambda: rt.policy_loss(obj, lp, torch.ones(4, 6, dtype=torch.bool), old_logp=lp.float(),
                                seq_adv=torch.zeros(4, dtype=F64)), "rlpt.torch.dtype"),
        (lambda: rt.grpo_advantages(torch.zeros(4), torch.zeros(4, dtype=torch.long), bogus=1), "unknown option 'bogus'"),
        (lambda: rt.Objective.verl_actor(loss_agg_mode="mean"), "rlpt.objective"),
        (lambda: rt.sequence_logprob_entropy(torch.zeros(2, 3, 5), torch.full((2, 3), 7)), "rlpt.logprob"),
    ]
    for fn, needle in cases:
        try:
            fn()
        except rt.Error as e:
            assert needle in str(e), f"expected '{needle}' in: {e}"
        else:
            raise AssertionError(f"no error for a case expecting {needle}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runner", required=True)
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--steps", type=int, default=3)
    args = ap.parse_args()
    work = pathlib.Path(args.workdir)
    torch.manual_seed(1234)
    gen = torch.Generator().manual_seed(99)

    check_errors()
    check_layouts_and_dtypes(gen)
    check_gae(gen)
    check_top_k(gen)
    check_objectives_fp64(gen)

    policy = TinyLM().to(F64)
    reference = copy.deepcopy(policy).requires_grad_(False)
    params = list(policy.parameters())
    opt = torch.optim.Adam(params, lr=1e-2)
    obj = rt.Objective.verl_actor(clip_ratio_low=CFG["clip_ratio_low"], clip_ratio_high=CFG["clip_ratio_high"],
                                  loss_agg_mode=CFG["loss_agg_mode"], use_kl_loss=True,
                                  kl_loss_coef=CFG["kl_loss_coef"], kl_loss_type=CFG["kl_loss_type"],
                                  entropy_coeff=CFG["entropy_coeff"])
    temp = CFG["temperature"]
    for step in range(args.steps):
        prompts = torch.randint(1, VOCAB, (PROMPTS, PROMPT_LEN), generator=gen).repeat_interleave(GROUP, 0)
        tokens, mask, rewards = generate(policy, prompts, gen)
        ids = torch.arange(PROMPTS).repeat_interleave(GROUP)
        with torch.no_grad():
            old = rt.sequence_logprob_entropy(policy(tokens), tokens, temperature=temp)[0].double()
            ref = rt.sequence_logprob_entropy(reference(tokens), tokens, temperature=temp)[0].double()
        adv, _ = rt.grpo_advantages(rewards, ids, preset="verl")
        close("GRPO advantages", adv, ref_grpo(rewards, ids), 1e-6, 1e-7)
        for epoch in range(2):  # two PPO epochs: the second one sees ratios != 1
            opt.zero_grad()
            logits = policy(tokens)
            logits.retain_grad()
            logp, ent = rt.sequence_logprob_entropy(logits, tokens, temperature=temp)
            loss, metrics = rt.policy_loss(obj, logp.double(), mask, entropy=ent.double(), old_logp=old,
                                           ref_logp=ref, seq_adv=adv.double())
            loss.backward()
            grads = [p.grad.clone() for p in params]
            check_against_runner(args.runner, work / f"step{step}_epoch{epoch}", logits, tokens, mask, rewards,
                                 ids, old, ref, dict(adv=adv, logp=logp.detach(), entropy=ent.detach(),
                                                     loss=loss.detach(), dlogits=logits.grad))
            # (b) the same step in plain float64 torch
            opt.zero_grad()
            lp_r, ent_r = ref_logprob_entropy(policy(tokens), tokens)
            loss_r = ref_verl_actor(lp_r, ent_r, old, ref, ref_grpo(rewards, ids), mask)
            loss_r.backward()
            # rlpt's logprobs are float32 (per-token error ~1e-7 of |logp|): 1e-6 relative, plus an
            # absolute 2e-7 for the losses where positive and negative advantages cancel.
            close(f"step {step}.{epoch} loss vs plain torch", loss.detach(), loss_r.detach(), 1e-6, 2e-7)
            for (name, _), g, w in zip(policy.named_parameters(), grads, (p.grad for p in params)):
                close(f"step {step}.{epoch} d loss / d {name} vs plain torch", g, w, 1e-5,
                      1e-6 * float(w.abs().max()) + 1e-12)
            for p, g in zip(params, grads):
                p.grad = g
            opt.step()
        print(f"step {step}: reward {float(rewards.mean()):.3f}  loss {float(loss):+.6f}  "
              f"clip_frac {metrics['clip_frac_low'] + metrics['clip_frac_high']:.3f}  "
              f"kl {metrics['kl_loss']:.2e}  entropy {metrics['entropy_mean']:.3f}")
    print("rlpt_torch: C++ bit-identical, plain torch within tolerance, errors named")
    return 0


if __name__ == "__main__":
    sys.exit(main())
