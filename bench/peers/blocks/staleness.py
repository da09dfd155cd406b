"""Staleness: the per-token kernels against torch eager, 4 Mi tokens, one thread each.

No peer framework ships these as library functions: AReaL computes its log-linear proximal
approximation (prox_logp_method=loglinear) with torch elementwise ops inside its actor, and
prime-rl masks stale tokens the same way. The peer is that torch formula (written here from
AReaL's documented formula, not copied) on the same inputs (bench/staleness/inputs.hpp's closed
forms, rebuilt here), checked equal to rlpt's output token by token. The single-thread copy
bandwidth is measured in the same rounds.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from core import Case, CheckError, Side, ratio, spread

TITLE = "Staleness"
COMMAND = "scripts/bench-peers --only staleness"
RUNNERS = ["bench_staleness_runner", "bench_limits"]
CURRENT = 20
KERNELS = {"mask": "stale-token mask (max_age 3)", "prox": "proximal logprobs, log-linear",
           "prox_linear": "proximal logprobs, linear (probability space)"}
TOL = {"prox": 1e-6, "prox_linear": 1e-5}  # max |rlpt - torch| / max(1, |torch|) at trained tokens


def cases(ctx) -> list[Case]:
    n = 1 << 14 if ctx.quick else 1 << 22
    copy_bytes = (8 << 20) if ctx.quick else (64 << 20)
    out = []
    for op, label in KERNELS.items():
        def check(d: Path, o, op=op):
            if op == "mask":
                got = np.fromfile(o["outs"]["rlpt"] / "mask.u8", np.uint8).astype(bool)
                want = np.load(o["outs"]["torch"] / "out.npy")
                bad = int((got != want).sum())
                if bad:
                    raise CheckError(f"mask: {bad} tokens differ")
                return {"differing tokens": 0}
            got = np.fromfile(o["outs"]["rlpt"] / "prox.f32", np.float32).astype(np.float64)
            want = np.load(o["outs"]["torch"] / "out.npy").astype(np.float64)
            err = float(np.max(np.abs(got - want) / np.maximum(1.0, np.abs(want))))
            if err > TOL[op]:
                raise CheckError(f"{op}: max relative error {err:.3g} > {TOL[op]}")
            return {"max err": err}

        out.append(Case(op, {"kernel": label, "tokens": n},
                        [Side("rlpt", "bench_staleness_runner", [op, n]),
                         Side("torch", peer=op, params={"n": n}, role="peer"),
                         Side("copy", "bench_limits", ["copy", copy_bytes], role="limit", check=False)],
                        None, check))
    return out


def report(ctx, results: list[dict]) -> dict:
    rows = []
    for r in results:
        s = (r.get("sides") or {})
        rl, cp = s.get("rlpt", {}), s.get("copy", {})
        rate = rl["bytes"] / rl["median"] / 1e9 if rl.get("median") else None
        copy = 2 * cp["bytes"] / cp["median"] / 1e9 if cp.get("median") else None
        x = ratio(r, "torch")
        rows.append([r["labels"]["kernel"], r["labels"]["tokens"], spread(r, "rlpt"), spread(r, "torch"),
                     "-" if x is None else f"{x:.3g}x", "-" if rate is None else f"{rate:.3g}",
                     "-" if copy is None else f"{copy:.3g}", "-" if not (rate and copy) else f"{100 * rate / copy:.0f} %"])
    return {"tables": [{"title": "Per-token staleness kernels, 4 Mi tokens (packed, 1000 per sequence)",
                        "columns": ["kernel", "tokens", "rlpt CPU s/call", "torch CPU s/call", "torch/rlpt",
                                    "rlpt GB per CPU s", "copy GB per CPU s (same run)", "of copy"],
                        "rows": rows,
                        "notes": "Bytes per token: mask 6 (versions, mask in; mask out), proximal 17 (two logprobs, "
                                 "versions, mask in; logprob out). No target in issue 21: reported."}],
            "targets": []}


# --- peer side ------------------------------------------------------------------------------------

def inputs(n: int):
    import torch
    i = torch.arange(n, dtype=torch.int64)
    prompt = (i % 1000) < 100
    versions = torch.where(prompt, torch.tensor(-1), CURRENT - (i * 7) % 8).to(torch.int32)
    mask = ~(prompt | (i % 13 == 0))
    behav = -(i % 1000).to(torch.float32) / 100.0
    cur = -((i * 31) % 1000).to(torch.float32) / 100.0
    return versions, mask, behav, cur


def make_peer(name: str, params: dict, d: Path):
    import torch
    from worker import Peer

    versions, mask, behav, cur = inputs(params["n"])

    def torch_mask(max_age=3):
        # a trained token stays in the loss iff current - version <= max_age
        return mask & ((CURRENT - versions) <= max_age)

    def torch_prox(v_theta=CURRENT, lag=1, linear=False):
        v_prox = v_theta - lag
        vb = versions.to(torch.float32)
        on_policy = (versions < 0) | (versions >= v_theta)
        alpha = torch.where(on_policy, 0.0, ((v_prox - vb) / (v_theta - vb)).clamp(0.0, 1.0))
        if linear:
            out = torch.log((1 - alpha) * behav.exp() + alpha * cur.exp())
        else:
            out = behav + alpha * (cur - behav)
        return torch.where(mask, out, behav)

    def save(out_t, out: Path):
        np.save(out / "out.npy", out_t.numpy())

    fn = {"mask": torch_mask, "prox": torch_prox, "prox_linear": lambda: torch_prox(linear=True)}[name]
    return Peer(fn, save)
