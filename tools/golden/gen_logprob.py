"""Logprob family: chosen-token logprob, entropy and their gradient from the peers' own functions.

Files (tests/data/golden/logprob/):
- from_logits.bin: fp32 logits (row 1 has masked −inf columns), targets, temperature; torch
  log_softmax+gather and softmax entropy (fp64 and fp32 evaluations), verl logprobs_from_logits / entropy_from_logits, TRL
  selective_log_softmax / entropy_from_logits, and torch.autograd's d(Σ dlogp·logp + dH·H)/dlogits
  (fp64, stored as fp32).
- from_bf16.bin: the same for logits that are exact bf16 values (stored as fp32), scored by torch
  in fp32 after the upcast verl/TRL do (logits.float()).
- sampled.bin: temperature + Hugging Face TopKLogitsWarper / TopPLogitsWarper (the vLLM/HF
  sampling rule), then log_softmax+gather and entropy of the truncated, renormalised distribution,
  and the kept mask.
- sampled_min_p.bin: the same with Hugging Face's MinPLogitsWarper, in generate()'s order
  (TopK, TopP, MinP: SGLang's too) and in vLLM's (MinP, then TopK and TopP).
- mismatch.bin: trainer and rollout log-probs of sampled tokens ([B, T] with a ragged mask, every
  row with a valid token), and verl's own metrics of their mismatch: compute_offpolicy_metrics
  (rollout_corr_helper) and calculate_debug_metrics (utils/debug/metrics), each run on float32
  tensors (as verl runs them) and on float64 ones.
"""
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

import peers
import rlpt_golden

N, V = 32, 1003


def _logits(rng: np.random.Generator, n: int, v: int, scale: float) -> np.ndarray:
    x = rng.normal(0.0, scale, size=(n, v)).astype(np.float32)
    x[0, :] += 40.0  # a shifted row: exercises the max subtraction
    x[1, ::7] = -np.inf  # masked vocabulary entries
    return x


def _torch_reference(x: np.ndarray, t: np.ndarray, temp: float, dlogp: np.ndarray, dent: np.ndarray) -> dict:
    out = {}
    for name, dtype in (("f64", torch.float64), ("f32", torch.float32)):
        logits = torch.from_numpy(x).to(dtype).requires_grad_(True)
        z = logits / temp
        logp_all = F.log_softmax(z, dim=-1)
        logp = logp_all.gather(-1, torch.from_numpy(t).unsqueeze(-1)).squeeze(-1)
        # H = lse − Σ p·z with masked (−inf) columns contributing 0: finite values and gradients
        # where -(p·log p).sum() would give 0·inf = NaN (TRL's entropy_from_logits does, below)
        ent = torch.logsumexp(z, dim=-1) - (logp_all.exp() * torch.where(torch.isinf(z), 0.0, z)).sum(-1)
        loss = (torch.from_numpy(dlogp).to(dtype) * logp).sum() + (torch.from_numpy(dent).to(dtype) * ent).sum()
        (grad,) = torch.autograd.grad(loss, logits)
        out[f"torch_logp_{name}"] = logp.detach()
        out[f"torch_entropy_{name}"] = ent.detach()
        if name == "f64":
            out["torch_grad"] = grad.to(torch.float32)  # f32 storage keeps the file small
    return out


def _peer_functions(x: np.ndarray, t: np.ndarray, temp: float) -> dict:
    from trl.trainer.utils import entropy_from_logits as trl_entropy
    from trl.trainer.utils import selective_log_softmax
    from verl.utils.torch_functional import entropy_from_logits as verl_entropy
    from verl.utils.torch_functional import logprobs_from_logits

    logits = torch.from_numpy(x)
    labels = torch.from_numpy(t)
    # verl: logits.div_(temperature) in the actor, then these two helpers
    z = logits / temp
    finite = torch.where(torch.isinf(z), torch.full_like(z, -1e30), z)  # verl's entropy multiplies p·logits: 0·-inf
    return {
        "verl_logp": logprobs_from_logits(z, labels),
        "verl_entropy": verl_entropy(finite),
        "trl_logp": selective_log_softmax(logits, labels, temperature=temp),
        "trl_entropy": trl_entropy(z),
    }


# verl's metric names, in the order of MISMATCH_KEYS in tests/logprob/test_mismatch.cpp
OFFPOLICY_KEYS = ("kl", "k3_kl", "training_ppl", "training_log_ppl", "rollout_ppl", "rollout_log_ppl", "log_ppl_diff",
                  "log_ppl_abs_diff", "log_ppl_diff_max", "log_ppl_diff_min", "ppl_ratio", "chi2_token", "chi2_seq")
DEBUG_KEYS = ("training/rollout_probs_diff_max", "training/rollout_probs_diff_mean", "training/rollout_probs_diff_std",
              "training/rollout_actor_probs_pearson_corr")


def _mismatch(rng: np.random.Generator) -> tuple[dict, dict]:
    from verl import DataProto
    from verl.trainer.ppo.rollout_corr_helper import compute_offpolicy_metrics
    from verl.utils.debug.metrics import calculate_debug_metrics

    B, T = 12, 40
    lengths = rng.integers(1, T + 1, size=B)
    lengths[0], lengths[1] = T, 1  # a full row, a one-token row
    mask = (np.arange(T)[None, :] < lengths[:, None]).astype(np.uint8)
    mask[2, 5] = 0  # a hole inside a response (multi-turn)
    rollout = (-np.abs(rng.normal(0.0, 1.5, size=(B, T))) - 1e-3).astype(np.float32)
    trainer = (rollout + rng.normal(0.0, 0.08, size=(B, T))).astype(np.float32)
    trainer[3, :4] = rollout[3, :4] + np.float32(1.5)  # large disagreements: out of any band
    trainer = np.minimum(trainer, -1e-4).astype(np.float32)
    trainer[mask == 0] = np.float32(np.nan)  # masked slots hold garbage that must not leak
    rollout[mask == 0] = np.float32(-np.inf)
    arrays = {"trainer_logp": trainer, "rollout_logp": rollout, "mask": mask}
    values = {}
    for name, dtype in (("f32", torch.float32), ("f64", torch.float64)):
        t = torch.from_numpy(np.where(mask == 1, trainer, 0.0)).to(dtype)  # verl multiplies by the mask: no NaN
        r = torch.from_numpy(np.where(mask == 1, rollout, 0.0)).to(dtype)
        m = torch.from_numpy(mask).bool()
        off = compute_offpolicy_metrics(old_log_prob=t, rollout_log_prob=r, response_mask=m)
        dbg = calculate_debug_metrics(DataProto.from_dict(tensors={
            "rollout_log_probs": r, "old_log_probs": t, "response_mask": m.long(),
            "responses": torch.zeros(B, T, dtype=torch.long)}))
        arrays[f"verl_offpolicy_{name}"] = np.array([off[k] for k in OFFPOLICY_KEYS], dtype=np.float64)
        arrays[f"verl_debug_{name}"] = np.array([dbg[k] for k in DEBUG_KEYS], dtype=np.float64)
        values[name] = {**off, **dbg}
    return arrays, {"offpolicy_keys": list(OFFPOLICY_KEYS), "debug_keys": list(DEBUG_KEYS), "B": B, "T": T}


def _truncated_case(c: int, z: torch.Tensor, ts: np.ndarray, params: list) -> dict:
    """One case of a sampled file from the warped logits z (-inf outside the support): the kept mask,
    the targets (the kept token nearest to a random one, so every row scores a sampled token), and
    log_softmax + gather and the entropy of the renormalised support."""
    kept = torch.isfinite(z)
    logp_all = F.log_softmax(z, dim=-1)
    target = np.empty(N, dtype=np.int64)
    for r in range(N):
        cols = np.flatnonzero(kept[r].numpy())
        target[r] = cols[np.argmin(np.abs(cols - ts[r]))]
    p_all = logp_all.exp()
    ent = -(torch.where(kept, p_all * logp_all, torch.zeros_like(p_all))).sum(-1)
    return {f"case{c}_params": np.array(params, dtype=np.float64), f"case{c}_targets": target,
            f"case{c}_logp": logp_all.gather(-1, torch.from_numpy(target).unsqueeze(-1)).squeeze(-1),
            f"case{c}_entropy": ent, f"case{c}_kept": kept.numpy()}


def _sampled_min_p(seed: int) -> tuple[dict, dict]:
    from transformers.generation.logits_process import MinPLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

    # (temperature, top_k, top_p, min_p, min-p first: vLLM's order, else generate()'s)
    cases = [(1.0, 0, 1.0, 0.05, False), (0.7, 50, 0.9, 0.1, False), (0.7, 50, 0.9, 0.1, True),
             (1.3, 0, 0.8, 0.02, True), (1.3, 0, 0.8, 0.02, False), (0.9, 20, 1.0, 0.3, True)]
    rng = np.random.default_rng(seed)
    xs = rng.normal(0.0, 2.5, size=(N, V)).astype(np.float32)  # continuous: no ties at a bound
    ts = rng.integers(0, V, size=N).astype(np.int64)
    arrays = {"logits": xs}
    for c, (temp_c, k, p, mp, first) in enumerate(cases):
        z = torch.from_numpy(xs).to(torch.float64) / temp_c
        warpers = []
        if first:
            warpers.append(MinPLogitsWarper(min_p=mp))
        if k > 0:
            warpers.append(TopKLogitsWarper(top_k=k))
        if p < 1.0:
            warpers.append(TopPLogitsWarper(top_p=p))
        if not first:
            warpers.append(MinPLogitsWarper(min_p=mp))
        for w in warpers:
            z = w(None, z)
        arrays.update(_truncated_case(c, z, ts, [temp_c, k, p, mp, 1.0 if first else 0.0]))
    return arrays, peers.meta(
        "logprob", seed, n=N, v=V, cases=cases,
        reference="transformers MinPLogitsWarper with TopKLogitsWarper / TopPLogitsWarper on logits / T (fp64): "
                  "TopK, TopP, MinP (generate()'s order) or MinP, TopK, TopP (vLLM's sampler order); "
                  "log_softmax + gather and entropy of the renormalised support")


def generate(out_dir: Path, seed: int) -> None:
    rng = np.random.default_rng(seed)
    temp = 0.7

    # fp32 logits
    x = _logits(rng, N, V, 3.0)
    t = rng.integers(0, V, size=N).astype(np.int64)
    t[1] = 3  # a finite column of the masked row (columns 0, 7, 14, ... are -inf)
    dlogp = rng.normal(size=N)
    dent = rng.normal(size=N)
    arrays = {"logits": x, "targets": t, "temperature": np.array(temp, dtype=np.float64),
              "dlogp": dlogp.astype(np.float32), "dentropy": dent.astype(np.float32)}
    arrays.update(_torch_reference(x, t, temp, dlogp.astype(np.float32).astype(np.float64),
                                   dent.astype(np.float32).astype(np.float64)))
    arrays.update(_peer_functions(x, t, temp))
    rlpt_golden.write(out_dir / "from_logits.bin", arrays, peers.meta(
        "logprob", seed, n=N, v=V, temperature=temp,
        reference="torch.log_softmax(logits / T).gather + softmax entropy (f64, f32), torch.autograd gradient; "
                  "verl.utils.torch_functional.logprobs_from_logits/entropy_from_logits; "
                  "trl.trainer.utils.selective_log_softmax(temperature=T)/entropy_from_logits"))

    # bf16 logits (exact bf16 values, upcast to fp32 for scoring as verl/TRL do)
    xb = torch.from_numpy(_logits(rng, N, V, 4.0)).to(torch.bfloat16).to(torch.float32).numpy()
    tb = rng.integers(0, V, size=N).astype(np.int64)
    tb[1] = 5
    arrays = {"logits": xb, "targets": tb, "temperature": np.array(1.0, dtype=np.float64),
              "dlogp": dlogp.astype(np.float32), "dentropy": dent.astype(np.float32)}
    arrays.update(_torch_reference(xb, tb, 1.0, dlogp.astype(np.float32).astype(np.float64),
                                   dent.astype(np.float32).astype(np.float64)))
    arrays.update(_peer_functions(xb, tb, 1.0))
    rlpt_golden.write(out_dir / "from_bf16.bin", arrays, peers.meta(
        "logprob", seed, n=N, v=V, temperature=1.0, dtype="bf16 values stored as f32",
        reference="as from_logits.bin, on torch.bfloat16-rounded logits upcast to float32"))

    # sampling-consistent: temperature, top-k, top-p with the Hugging Face logits warpers
    from transformers.generation.logits_process import TopKLogitsWarper, TopPLogitsWarper

    cases = [(0.8, 50, 1.0), (1.0, 0, 0.9), (0.6, 200, 0.95), (1.2, 5, 0.5)]
    xs = rng.normal(0.0, 2.5, size=(N, V)).astype(np.float32)  # continuous: no ties, sort order is unambiguous
    ts = rng.integers(0, V, size=N).astype(np.int64)
    arrays = {"logits": xs}
    for c, (temp_c, k, p) in enumerate(cases):
        z = torch.from_numpy(xs).to(torch.float64) / temp_c
        if k > 0:
            z = TopKLogitsWarper(top_k=k)(None, z)
        if p < 1.0:
            z = TopPLogitsWarper(top_p=p)(None, z)
        arrays.update(_truncated_case(c, z, ts, [temp_c, k, p]))
    rlpt_golden.write(out_dir / "sampled.bin", arrays, peers.meta(
        "logprob", seed, n=N, v=V, cases=cases,
        reference="transformers TopKLogitsWarper then TopPLogitsWarper on logits / T (fp64), "
                  "log_softmax + gather and entropy of the renormalised support"))

    rlpt_golden.write(out_dir / "sampled_min_p.bin", *_sampled_min_p(seed + 2))

    # training-inference mismatch metrics (verl's functions)
    arrays, params = _mismatch(np.random.default_rng(seed + 1))
    rlpt_golden.write(out_dir / "mismatch.bin", arrays, peers.meta(
        "logprob", seed + 1, **params,
        reference="verl.trainer.ppo.rollout_corr_helper.compute_offpolicy_metrics(old_log_prob=trainer, "
                  "rollout_log_prob=rollout) and verl.utils.debug.metrics.calculate_debug_metrics, float32 and "
                  "float64 tensors; masked slots zeroed for verl (it multiplies by the mask), NaN / -inf in the "
                  "file"))
