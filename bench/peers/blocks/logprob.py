"""Logprob: logits -> chosen-token logprob + entropy (and the backward) against torch 2.11 eager,
verl 0.9.1's and TRL 1.16's functions, on the same logits, one thread each:

- torch: log_softmax(logits / T) + gather + entropy -(p * logp).sum(-1) in the logits' dtype; the
  backward through torch.autograd of sum(dlogp * logp) + sum(dentropy * entropy);
- verl: verl.utils.torch_functional.logprobs_from_logits (no flash-attn on CPU: log_softmax +
  gather) + entropy_from_logits;
- TRL: trl.trainer.utils.selective_log_softmax(temperature=T) + entropy_from_logits.

The compute limit, measured in the same rounds on the same logits: rlpt's own SIMD exp
(rlpt::detail::simd::exp, the build the row kernels choose) summed over every logit
(bench_limits expsum): one read and one exp per logit, the row read as the row kernels read it
(512 columns loaded, then exponentiated from L1). The forward makes one such pass; forward
+ backward two (the backward recomputes each probability and writes the gradient), so its limit
is twice the exp+sum time plus the first touch of the gradient both sides allocate per call
(bench_limits fresh). Every output is checked against an fp64 evaluation of the first 64
rows (and rlpt against each peer) before anything is timed.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from core import Case, CheckError, Side, ratio, spread, fmt_s

TITLE = "Logprob"
COMMAND = "scripts/bench-peers --only logprob"
RUNNERS = ["bench_logprob_runner", "bench_limits"]
CHECK_ROWS = 64
# max |x - fp64 reference| over the first 64 rows (logp, entropy); gradients: max |diff| / max |ref|
TOL = {"f32": 1e-3, "bf16": 1e-3}
TOL_PEER = {"f32": 2e-3, "bf16": 0.5}  # a peer computing in bf16 rounds its intermediates to 8 bits
TOL_GRAD = {"f32": 1e-4, "bf16": 1e-2}


def to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """Round-to-nearest-even float32 -> bfloat16 bit patterns (as torch's .to(bfloat16))."""
    u = x.astype(np.float32).view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def from_bf16_bits(b: np.ndarray) -> np.ndarray:
    return (b.astype(np.uint32) << 16).view(np.float32)


def make_inputs(d: Path, n: int, v: int, dtype: str, seed: int = 1234) -> None:
    rng = np.random.default_rng(seed)
    path = d / ("logits.bf16" if dtype == "bf16" else "logits.f32")
    with open(path, "wb") as f:
        for r0 in range(0, n, 256):  # in chunks: 8192 x 151936 would be 5 GB at once
            x = (3.0 * rng.standard_normal((min(256, n - r0), v), dtype=np.float32))
            (to_bf16_bits(x) if dtype == "bf16" else x).tofile(f)
    rng.integers(0, v, n).astype(np.int64).tofile(d / "targets.i64")
    rng.standard_normal(n).astype(np.float32).tofile(d / "dlogp.f32")
    rng.standard_normal(n).astype(np.float32).tofile(d / "dentropy.f32")


def reference(d: Path, n: int, v: int, dtype: str, temp: float, rows: int = CHECK_ROWS):
    """fp64 logp, entropy and gradient of the first `rows` rows."""
    rows = min(rows, n)
    if dtype == "bf16":
        x = from_bf16_bits(np.fromfile(d / "logits.bf16", np.uint16, count=rows * v)).reshape(rows, v)
    else:
        x = np.fromfile(d / "logits.f32", np.float32, count=rows * v).reshape(rows, v)
    t = np.fromfile(d / "targets.i64", np.int64)[:rows]
    dl = np.fromfile(d / "dlogp.f32", np.float32)[:rows].astype(np.float64)
    dh = np.fromfile(d / "dentropy.f32", np.float32)[:rows].astype(np.float64)
    z = x.astype(np.float64) / temp
    m = z.max(-1, keepdims=True)
    lse = m[:, 0] + np.log(np.exp(z - m).sum(-1))
    logp_all = z - lse[:, None]
    p = np.exp(logp_all)
    logp = logp_all[np.arange(rows), t]
    ent = -(p * logp_all).sum(-1)
    onehot = np.zeros_like(z)
    onehot[np.arange(rows), t] = 1.0
    grad = (dl[:, None] * (onehot - p) - dh[:, None] * p * (logp_all + ent[:, None])) / temp
    return logp, ent, grad


SHAPES = [  # n, v, dtype, temperature, backward, peers (besides torch)
    (4096, 32768, "f32", 0.7, True, ("verl", "trl")),
    (4096, 32768, "bf16", 0.7, True, ("verl", "trl")),
    (8192, 151936, "bf16", 1.0, False, ()),  # verl / TRL: minutes per call here
]
QUICK = [(64, 4096, "f32", 0.7, True, ("verl", "trl")), (64, 4096, "bf16", 0.7, True, ("verl", "trl"))]


def cases(ctx) -> list[Case]:
    out = []
    for n, v, dtype, temp, backward, extra in (QUICK if ctx.quick else SHAPES):
        nbytes = n * v * (2 if dtype == "bf16" else 4)
        for pass_ in ("fwd", "fwdbwd") if backward else ("fwd",):
            params = {"n": n, "v": v, "dtype": dtype, "temp": temp}
            sides = [Side("rlpt", "bench_logprob_runner", ["peer", "{dir}", n, v, dtype, temp, pass_])]
            if pass_ == "fwd":
                sides.append(Side("torch", peer="torch", params=params, role="peer"))
                sides += [Side(p, peer=p, params=params, role="peer") for p in extra]
                sides.append(Side("exp+sum", "bench_limits", ["expsum", "{dir}", n, v, dtype], role="limit", check=False))
            else:
                sides.append(Side("torch", peer="torch_fwdbwd", params=params, role="peer"))
                # Both sides allocate the [n, v] gradient per call (torch.empty / new[]): its first
                # touch is part of any such backward's cost, and part of its limit.
                sides.append(Side("gradient first touch", "bench_limits", ["fresh", nbytes], role="limit",
                                  check=False))

            def check(d: Path, o, n=n, v=v, dtype=dtype, temp=temp, pass_=pass_):
                rows = min(CHECK_ROWS, n)
                logp, ent, grad = reference(d, n, v, dtype, temp)
                errs = {}
                rl_lp = np.fromfile(o["outs"]["rlpt"] / "logp.f32", np.float32)
                rl_h = np.fromfile(o["outs"]["rlpt"] / "entropy.f32", np.float32)
                errs["rlpt"] = float(max(np.abs(rl_lp[:rows] - logp).max(), np.abs(rl_h[:rows] - ent).max()))
                if errs["rlpt"] > TOL[dtype]:
                    raise CheckError(f"rlpt vs fp64: max |err| {errs['rlpt']:.3g} > {TOL[dtype]}")
                for label, out_dir in o["outs"].items():
                    if label == "rlpt" or not (out_dir / "logp.npy").exists():
                        continue
                    p_lp, p_h = np.load(out_dir / "logp.npy"), np.load(out_dir / "entropy.npy")
                    e = float(max(np.abs(p_lp[:rows] - logp).max(), np.abs(p_h[:rows] - ent).max()))
                    both = float(max(np.abs(p_lp - rl_lp).max(), np.abs(p_h - rl_h).max()))
                    errs[label] = e
                    if e > TOL_PEER[dtype] or both > TOL_PEER[dtype] + TOL[dtype]:
                        raise CheckError(f"{label}: max |err| {e:.3g} vs fp64, {both:.3g} vs rlpt (tolerance "
                                         f"{TOL_PEER[dtype]} in {dtype})")
                if pass_ == "fwdbwd":
                    scale = np.abs(grad).max()
                    g = np.fromfile(o["outs"]["rlpt"] / "grad_head.f32", np.float32).reshape(rows, v)
                    errs["rlpt grad"] = float(np.abs(g - grad).max() / scale)
                    tg = np.load(o["outs"]["torch"] / "grad_head.npy")
                    errs["torch grad"] = float(np.abs(tg - grad).max() / scale)
                    if errs["rlpt grad"] > TOL_GRAD[dtype] or errs["torch grad"] > 4 * TOL_GRAD[dtype]:
                        raise CheckError(f"gradients: {errs}")
                return {f"{k} err": val for k, val in errs.items()}

            out.append(Case(f"{n}x{v} {dtype} {pass_}",
                            {"shape": f"{n} x {v}", "dtype": dtype, "pass": "forward" if pass_ == "fwd" else
                             "forward + backward", "bytes": nbytes},
                            sides, lambda d, n=n, v=v, dtype=dtype: make_inputs(d, n, v, dtype), check,
                            min_memory=int(5.5 * nbytes) if not ctx.quick else 0))
    return out


def report(ctx, results: list[dict]) -> dict:
    rows, mem_rows, targets = [], [], []
    limits = {}
    for r in results:
        s = (r.get("sides") or {}).get("exp+sum")
        if s and s.get("median"):
            limits[(r["labels"]["shape"], r["labels"]["dtype"])] = s["median"]
    vs_torch, vs_limit = [], []
    for r in results:
        lab = r["labels"]
        key = (lab["shape"], lab["dtype"])
        fwd = lab["pass"] == "forward"
        rl = (r.get("sides") or {}).get("rlpt", {}).get("median")
        lim = limits.get(key)
        touch = (r.get("sides") or {}).get("gradient first touch", {}).get("median")
        lim_t = (lim if fwd else 2 * lim + (touch or 0.0)) if lim else None
        frac = lim_t / rl if lim_t and rl else None
        x_torch = ratio(r, "torch")
        rows.append([lab["shape"], lab["dtype"], lab["pass"], spread(r, "rlpt"), spread(r, "torch"),
                     fmt_x(x_torch), fmt_x(ratio(r, "verl")), fmt_x(ratio(r, "trl")),
                     spread(r, "exp+sum") if fwd else (f"2 x exp+sum + {fmt_s(touch)} first touch" if lim and touch
                                                       else "2 x exp+sum" if lim else "-"),
                     "-" if frac is None else f"{100 * frac:.0f} %",
                     "-" if not rl else f"{lab['bytes'] * (1 if fwd else 3) / rl / 1e9:.3g}"])
        info = r.get("info") or {}
        mem_rows.append([lab["shape"], lab["dtype"], lab["pass"],
                         fmt_mb(info.get("rlpt", {}).get("peak_extra_bytes")),
                         fmt_mb(info.get("torch", {}).get("peak_extra_bytes")), fmt_mb(lab["bytes"])])
        if x_torch is not None:
            vs_torch.append((x_torch, f"{lab['shape']} {lab['dtype']} {lab['pass']}"))
        if frac is not None:
            vs_limit.append((frac, f"{lab['shape']} {lab['dtype']} {lab['pass']}"))
    tables = [{"title": "logits -> logprob + entropy (forward), and forward + backward",
               "columns": ["shape", "dtype", "pass", "rlpt CPU s/call", "torch CPU s/call", "torch/rlpt", "verl/rlpt",
                           "TRL/rlpt", "exp+sum limit CPU s", "of the limit", "rlpt GB per CPU s"],
               "rows": rows,
               "notes": "Ratios: > 1 means rlpt is faster. Limit: rlpt's SIMD exp summed over the same logits, one "
                        "thread, same rounds; forward + backward is held against two such passes plus the first touch of "
                        "the freshly allocated gradient (`bench_limits fresh`: both sides allocate it per call; the limit "
                        "takes it in transparent huge pages where the system allows them, as rlpt's backward does). GB: logits read "
                        "(forward), logits read twice + gradient written (forward + backward)."},
              {"title": "Peak resident memory one call adds (outputs and gradient included), MB",
               "columns": ["shape", "dtype", "pass", "rlpt", "torch", "logits"], "rows": mem_rows, "notes": ""}]
    if vs_limit:
        low = min(vs_limit)
        targets.append({"text": "Logprob + entropy and its backward: >= 70 % of the same-run compute limit (rlpt's SIMD "
                                "exp + sum over the same logits)",
                        "met": all(f >= 0.70 for f, _ in vs_limit),
                        "detail": f"lowest {100 * low[0]:.0f} % ({low[1]})"})
    if vs_torch:
        low = min(vs_torch)
        targets.append({"text": "Logprob + entropy and its backward: >= 15x torch's log_softmax + gather + entropy",
                        "met": all(x >= 15 for x, _ in vs_torch), "detail": f"lowest {low[0]:.3g}x ({low[1]})"})
    return {"tables": tables, "targets": targets}


def fmt_x(x):
    return "-" if x is None else f"{x:.3g}x"


def fmt_mb(b):
    return "-" if b is None else f"{b / 1e6:.3g}"


# --- peer side ------------------------------------------------------------------------------------

def make_peer(name: str, params: dict, d: Path):
    import torch
    from worker import Peer

    n, v, dtype, temp = params["n"], params["v"], params["dtype"], params["temp"]
    if dtype == "bf16":
        x = torch.from_numpy(np.fromfile(d / "logits.bf16", np.int16).reshape(n, v)).view(torch.bfloat16)
    else:
        x = torch.from_numpy(np.fromfile(d / "logits.f32", np.float32).reshape(n, v))
    t = torch.from_numpy(np.fromfile(d / "targets.i64", np.int64))
    dl = torch.from_numpy(np.fromfile(d / "dlogp.f32", np.float32))
    dh = torch.from_numpy(np.fromfile(d / "dentropy.f32", np.float32))

    def torch_forward(xx):
        z = xx / temp if temp != 1.0 else xx
        lsm = torch.log_softmax(z, dim=-1)
        return lsm.gather(-1, t[:, None]).squeeze(-1), -(lsm.exp() * lsm).sum(-1)

    def save(outputs, out: Path):
        lp, ent = outputs[0], outputs[1]
        np.save(out / "logp.npy", lp.detach().float().numpy())
        np.save(out / "entropy.npy", ent.detach().float().numpy())
        if len(outputs) > 2:
            np.save(out / "grad_head.npy", outputs[2][:CHECK_ROWS].float().numpy())

    if name == "torch":
        return Peer(lambda: torch_forward(x), save)
    if name == "torch_fwdbwd":
        def step():
            xr = x.detach().requires_grad_(True)
            lp, ent = torch_forward(xr)
            ((lp.float() * dl).sum() + (ent.float() * dh).sum()).backward()
            return lp, ent, xr.grad
        return Peer(step, save)
    if name == "verl":
        from verl.utils.torch_functional import entropy_from_logits, logprobs_from_logits

        def verl_forward():
            z = x / temp if temp != 1.0 else x
            return logprobs_from_logits(z, t), entropy_from_logits(z)
        return Peer(verl_forward, save)
    if name == "trl":
        from trl.trainer.utils import entropy_from_logits, selective_log_softmax
        return Peer(lambda: (selective_log_softmax(x, t, temperature=temp),
                             entropy_from_logits(x / temp if temp != 1.0 else x)), save)
    raise ValueError(f"unknown peer {name}")
