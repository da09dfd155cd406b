"""Objective: rlpt::evaluate (loss + d loss / d logp in one pass) against verl 0.9.1's eager actor
loss + autograd backward, on every configuration of bench/objective/bench_objective.cpp, written
in verl's terms (rlpt side: compat::verl::actor, objective_runner's peer mode):

- ppo_k3_token_mean: vanilla PPO (clip 0.2, dual clip 3) + low_var_kl (k3) at 0.001, token-mean
  over the global token count;
- ppo_tis_k3_entropy: clip-higher 0.28, token TIS (rollout_is=token, threshold 2), k3 KL 0.001,
  entropy bonus 0.001 (gradient to the entropy too), token-mean over the global token count;
- gspo_seq_is: GSPO (clip 3e-4 / 4e-4) with sequence-level IS (rollout_is=sequence, threshold 2),
  seq-mean-token-mean;
- cispo_local: CISPO (clip_ratio_low 10, clip_ratio_high 0.28) + k3 KL 0.001, token-mean over the
  call's own tokens;
- dppo_kl: DPPO with the binary-KL bound (clip_ratio_low 0.01, clip_ratio_high 0.02, the ratio
  truncated at clip_ratio_c 3), token-mean over the call's own tokens;
- ppo_tis_rs_local: vanilla PPO with token TIS (threshold 2) and rejection sampling
  (rollout_rs="token_k3,seq_mean_k3", thresholds 0.01 and 0.0052: about 16 % of the tokens and a
  quarter of the sequences rejected on the full inputs; rejected tokens leave the loss),
  token-mean over the call's own tokens, which the rejection changes.

verl's step is what its ppo_loss composes: compute_rollout_correction_and_rejection_mask (when a
correction is on: rlpt computes the same weights inside its call), the registered policy loss,
agg_loss of the entropy and of kl_penalty, then loss.backward(). A fresh leaf is made from the
logprobs (detach, no copy) for every call, as a model forward would give.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from core import Case, CheckError, Side, ratio, spread

TITLE = "Objective"
COMMAND = "scripts/bench-peers --only objective"
RUNNERS = ["objective_runner"]

CONFIGS = {
    # name: (loss_mode, clip low, clip high, agg, global token count, rollout_is, kl coef, entropy coef, bytes/token)
    "ppo_k3_token_mean": ("vanilla", None, None, "token-mean", True, None, 1e-3, 0.0, 4 * 4 + 1 + 4),
    "ppo_tis_k3_entropy": ("vanilla", None, 0.28, "token-mean", True, "token", 1e-3, 1e-3, 6 * 4 + 1 + 8),
    "gspo_seq_is": ("gspo", 3e-4, 4e-4, "seq-mean-token-mean", False, "sequence", 0.0, 0.0, 4 * 4 + 1 + 4),
    "cispo_local": ("cispo", 10.0, 0.28, "token-mean", False, None, 1e-3, 0.0, 4 * 4 + 1 + 4),
    "dppo_kl": ("dppo_kl", 0.01, 0.02, "token-mean", False, None, 0.0, 0.0, 3 * 4 + 1 + 4),
    "ppo_tis_rs_local": ("vanilla", None, None, "token-mean", False, "token", 0.0, 0.0, 4 * 4 + 1 + 4),
}
# rollout_rs and its thresholds, for the configurations that reject (verl's comma-separated options).
REJECTION = {"ppo_tis_rs_local": ("token_k3,seq_mean_k3", "0.01,0.0052")}
TOL_LOSS, TOL_GRAD = 1e-5, 1e-5  # |loss diff| / |loss|; max |grad diff| / max |grad|
# Configurations with a fused floor in objective_runner (its floor mode checks itself against evaluate).
FLOORS = ("cispo_local", "dppo_kl")


def make_inputs(d: Path, B: int, T: int, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    lp = (-1.0 + 0.5 * rng.standard_normal((B, T))).astype(np.float32)
    old = (lp + 0.1 * rng.standard_normal((B, T))).astype(np.float32)
    behav = (old + 0.1 * rng.standard_normal((B, T))).astype(np.float32)
    ref = (lp + 0.2 * rng.standard_normal((B, T))).astype(np.float32)
    adv = rng.standard_normal((B, T)).astype(np.float32)
    ent = (1.0 + 0.3 * rng.standard_normal((B, T))).astype(np.float32)
    lengths = rng.integers(T // 4, T + 1, B)
    mask = (np.arange(T)[None, :] < lengths[:, None]).astype(np.uint8)
    for name, a in dict(lp=lp, old=old, behav=behav, ref=ref, adv=adv, ent=ent, mask=mask).items():
        a.tofile(d / f"{name}.bin")


def cases(ctx) -> list[Case]:
    B, T = (64, 128) if ctx.quick else (1024, 1024)
    out = []
    for name in CONFIGS:
        def check(d: Path, o, name=name):
            rl, pe = o["runs"]["rlpt"], o["runs"]["verl"]
            loss_err = abs(rl["loss"] - pe["loss"]) / max(abs(pe["loss"]), 1e-30)
            errs = {"loss rel diff": loss_err}
            files = ["grad.f32"] + (["grad_ent.f32"] if name == "ppo_tis_k3_entropy" else [])
            for f in files:
                got = np.fromfile(o["outs"]["rlpt"] / f, np.float32).astype(np.float64)
                want = np.load(o["outs"]["verl"] / f.replace(".f32", ".npy")).astype(np.float64).ravel()
                errs[f"{f[:-4]} max diff"] = float(np.max(np.abs(got - want)) / max(np.max(np.abs(want)), 1e-30))
            if loss_err > TOL_LOSS or any(v > TOL_GRAD for k, v in errs.items() if k != "loss rel diff"):
                raise CheckError(f"{name}: {errs}")
            return errs

        sides = [Side("rlpt", "objective_runner", ["peer", name, "{dir}", B, T]),
                 Side("verl", peer="loss", params={"config": name, "B": B, "T": T}, role="peer")]
        if name in FLOORS:  # a lower bound: one fused pass (AVX-512, else AVX2) of the arithmetic alone
            sides.append(Side("fused floor", "objective_runner", ["floor", name, "{dir}", B, T], role="limit",
                              check=False))
        out.append(Case(name, {"configuration": name, "tokens": f"{B} x {T}"}, sides,
                        lambda d, B=B, T=T: make_inputs(d, B, T), check))
    return out


def report(ctx, results: list[dict]) -> dict:
    rows, passed, counted, worst, floors = [], 0, 0, None, []
    for r in results:
        name = r["labels"]["configuration"]
        x = ratio(r, "verl")
        s = (r.get("sides") or {}).get("rlpt", {})
        B, T = (int(v) for v in r["labels"]["tokens"].split(" x "))
        rate = CONFIGS[name][-1] * B * T / s["median"] / 1e9 if s.get("median") else None
        c = r.get("check") or {}
        floor = (r.get("sides") or {}).get("fused floor", {})
        vs = (r.get("sides") or {}).get("verl", {})
        fx = vs["median"] / floor["median"] if floor.get("median") and vs.get("median") else None
        if fx is not None:
            floors.append(f"{name}'s fused floor {fx:.3g}x")
        rows.append([name, r["labels"]["tokens"], spread(r, "rlpt"), spread(r, "verl"),
                     "-" if x is None else f"{x:.3g}x",
                     spread(r, "fused floor") if floor else "-", "-" if fx is None else f"{fx:.3g}x",
                     "-" if rate is None else f"{rate:.3g}",
                     "-" if "loss rel diff" not in c else f"{c['loss rel diff']:.1e}",
                     "-" if "grad max diff" not in c else f"{c['grad max diff']:.1e}"])
        if x is not None:
            counted += 1
            passed += x >= 20
            worst = x if worst is None else min(worst, x)
    shape = results[0]["labels"]["tokens"] if results else ""
    table = {"title": f"Loss + backward, {shape} padded float32 tokens (lengths uniform in [T/4, T])",
             "columns": ["configuration", "tokens", "rlpt CPU s/call", "verl CPU s/call", "verl/rlpt (> 1: rlpt faster)",
                         "fused floor CPU s/call", "verl/floor", "rlpt GB per CPU s", "loss rel. diff",
                         "grad max diff / max |grad|"],
             "rows": rows,
             "notes": "rlpt: rlpt::evaluate with the gradient buffer(s) allocated inside every call; verl: eager "
                      "forward + autograd backward. Fused floor (a limit, not a library path): objective_runner's "
                      "floor mode, one pass in the CPU's widest SIMD build (AVX-512, else AVX2) with nothing but the "
                      "configuration's arithmetic (no non-finite "
                      "check, no metric), the gradient allocated per call, checked against evaluate. Bytes per "
                      "token for the GB column: inputs read + gradients written."}
    target = {"text": "Objective, every configuration of the objective bench: >= 20x verl's eager loss + backward",
              "met": (passed == counted) if counted else None,
              "detail": (f"{passed} of {counted} configurations; lowest {worst:.3g}x" +
                         "".join(f"; {f}" for f in floors)) if counted else ""}
    return {"tables": [table], "targets": [target]}


# --- peer side ------------------------------------------------------------------------------------

def make_peer(name: str, params: dict, d: Path):
    import torch
    import verl.trainer.ppo.core_algos as algos
    import verl.trainer.ppo.rollout_corr_helper as corr
    from verl.trainer.config import RolloutCorrectionConfig
    from verl.workers.config import ActorConfig
    from verl.workers.config.actor import PolicyLossConfig
    from worker import Peer

    if name != "loss":
        raise ValueError(f"unknown peer {name}")
    B, T, config = params["B"], params["T"], params["config"]
    loss_mode, low, high, agg, global_tokens, rollout_is, kl_coef, ent_coef, _ = CONFIGS[config]
    t = {k: torch.from_numpy(np.fromfile(d / f"{k}.bin", np.float32).reshape(B, T))
         for k in ("lp", "old", "behav", "ref", "adv", "ent")}
    mask = torch.from_numpy(np.fromfile(d / "mask.bin", np.uint8).reshape(B, T)).bool()
    cfg = ActorConfig(strategy="fsdp", rollout_n=1, clip_ratio=0.2, clip_ratio_low=low, clip_ratio_high=high,
                      clip_ratio_c=3.0, ppo_micro_batch_size_per_gpu=1, loss_agg_mode=agg,
                      policy_loss=PolicyLossConfig(loss_mode=loss_mode, rollout_correction=RolloutCorrectionConfig()))
    if global_tokens:
        cfg.global_batch_info.update(dict(dp_size=1, batch_num_tokens=int(mask.sum())))
    policy_loss = algos.get_policy_loss_fn(loss_mode)
    gbi = dict(cfg.global_batch_info)
    rs, rs_threshold = REJECTION.get(config, (None, None))

    def step():
        lp = t["lp"].detach().requires_grad_(True)
        ent = t["ent"].detach().requires_grad_(True) if ent_coef else None
        m, weights = mask, None
        if rollout_is:
            with torch.no_grad():
                proto, m, _ = corr.compute_rollout_correction_and_rejection_mask(
                    old_log_prob=t["old"], rollout_log_prob=t["behav"], response_mask=mask.to(torch.float32),
                    rollout_is=rollout_is, rollout_is_threshold=2.0, rollout_rs=rs, rollout_rs_threshold=rs_threshold)
            weights = proto.batch["rollout_is_weights"] if proto is not None else None
            m = m.bool()
        loss, _ = policy_loss(old_log_prob=t["old"], log_prob=lp, advantages=t["adv"], response_mask=m,
                              loss_agg_mode=agg, config=cfg, rollout_is_weights=weights)
        if ent is not None:
            loss = loss - ent_coef * algos.agg_loss(ent, m, agg, **gbi)
        if kl_coef:
            kld = algos.kl_penalty(lp, t["ref"], "low_var_kl")
            loss = loss + kl_coef * algos.agg_loss(kld, m, agg, **gbi)
        loss.backward()
        return loss.detach(), lp.grad, (ent.grad if ent is not None else None)

    def save(outputs, out: Path):
        loss, grad, grad_ent = outputs
        np.save(out / "grad.npy", grad.numpy())
        if grad_ent is not None:
            np.save(out / "grad_ent.npy", grad_ent.numpy())
        return {"loss": float(loss)}

    return Peer(step, save)
