"""Advantages: rlpt against verl 0.9.1's own functions (verl.trainer.ppo.core_algos) on CPU torch.

- GAE + masked whitening (compute_gae_advantage_return) and REINFORCE++
  (compute_reinforce_plus_plus_outcome_advantage) at 1024 x 8192 and 8192 x 1024, against the
  single-thread copy bandwidth measured in the same rounds; rlpt's GAE without whitening is
  timed too (a diagnostic: how much of the pass the whitening costs).
- The outcome estimators at group sizes 4 / 16 / 64 and 256 ... 65,536 sequences, grouping of
  the ids inside every call on both sides: GRPO and Dr. GRPO against
  compute_grpo_vectorized_outcome_advantage, RLOO against compute_rloo_vectorized_outcome_advantage,
  and OPO, GPG, REINFORCE++-baseline, pass@k against verl's (loop) functions, which have no
  vectorised version.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from core import Case, CheckError, Side, ratio, spread, fmt_s

TITLE = "Advantage"
COMMAND = "scripts/bench-peers --only advantage"
RUNNERS = ["bench_advantage_runner", "bench_limits"]
COPY_BYTES = 256 << 20

# estimator -> (verl function, kwargs, description)
OUTCOME = {
    "grpo": ("compute_grpo_vectorized_outcome_advantage", {}, "grpo_vectorized"),
    "dr_grpo": ("compute_grpo_vectorized_outcome_advantage", {"norm_adv_by_std_in_grpo": False},
                "grpo_vectorized, no std"),
    "rloo": ("compute_rloo_vectorized_outcome_advantage", {}, "rloo_vectorized"),
    "opo": ("compute_opo_outcome_advantage", {}, "opo (loop)"),
    "gpg": ("compute_gpg_outcome_advantage", {}, "gpg (loop)"),
    "rpp_baseline": ("compute_reinforce_plus_plus_baseline_outcome_advantage", {}, "reinforce_plus_plus_baseline (loop)"),
    "passk": ("compute_grpo_passk_outcome_advantage", {}, "grpo_passk (loop)"),
}
TOL = {"gae": 1e-5, "rpp": 1e-4, "outcome": 1e-5}  # max |rlpt - verl| / max(1, max |verl|), valid tokens


def token_inputs(B: int, T: int, seed: int):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(T // 2, T + 1, B)
    mask = (np.arange(T)[None, :] < lengths[:, None]).astype(np.uint8)
    rewards = (0.01 * rng.standard_normal((B, T))).astype(np.float32)
    rewards[np.arange(B), lengths - 1] += rng.standard_normal(B).astype(np.float32)
    values = rng.standard_normal((B, T)).astype(np.float32)
    return rewards, values, mask


def outcome_inputs(N: int, G: int, est: str, seed: int):
    rng = np.random.default_rng(seed)
    ids = np.repeat(rng.permutation(N // G), G).astype(np.int64)  # verl's repeat_interleave'd uids
    rewards = (rng.random(N) < 0.4).astype(np.float32)  # verifiable 0/1 rewards
    if est == "passk":  # pass@k credits the best sample: break ties so the argmax is unique
        rewards += (1e-3 * rng.random(N)).astype(np.float32)
    return rewards, ids


def scaled_error(got, want, mask=None) -> float:
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    if mask is not None:
        got, want = got[mask.astype(bool)], want[mask.astype(bool)]
    return float(np.max(np.abs(got - want)) / max(1.0, float(np.max(np.abs(want)))))


def cases(ctx) -> list[Case]:
    out = []
    shapes = [(64, 512), (512, 64)] if ctx.quick else [(1024, 8192), (8192, 1024)]
    copy_bytes = (8 << 20) if ctx.quick else COPY_BYTES
    for B, T in shapes:
        def prepare(d: Path, B=B, T=T):
            r, v, m = token_inputs(B, T, seed=B + T)
            r.tofile(d / "rewards.f32"), v.tofile(d / "values.f32"), m.tofile(d / "mask.u8")

        for op in ("gae", "rpp"):
            gamma, lam = 1.0, 0.95
            rl_args = [op, "{dir}", B, T, gamma] + ([lam] if op == "gae" else [])
            sides = [Side("rlpt", "bench_advantage_runner", rl_args),
                     Side("verl", peer=op, params={"B": B, "T": T, "gamma": gamma, "lam": lam}, role="peer")]
            if op == "gae":
                sides.append(Side("rlpt, no whitening", "bench_advantage_runner", ["gae_raw", "{dir}", B, T, gamma, lam],
                                  role="diagnostic", check=False))
            sides.append(Side("copy", "bench_limits", ["copy", copy_bytes], role="limit", check=False))
            # Both sides allocate their two [B, T] float outputs per call (torch.empty / new[]):
            # the first touch of those pages is part of any such call's cost.
            sides.append(Side("outputs first touch", "bench_limits", ["fresh", 8 * B * T], role="limit",
                              check=False))

            def check(d: Path, o, op=op, B=B, T=T):
                m = np.fromfile(d / "mask.u8", np.uint8).reshape(B, T)
                got = np.fromfile(o["outs"]["rlpt"] / "adv.f32", np.float32).reshape(B, T)
                want = np.load(o["outs"]["verl"] / "adv.npy")
                err = scaled_error(got, want, m)
                got_r = np.fromfile(o["outs"]["rlpt"] / "ret.f32", np.float32).reshape(B, T)
                err_r = scaled_error(got_r, np.load(o["outs"]["verl"] / "ret.npy"), m)
                if not max(err, err_r) <= TOL[op]:
                    raise CheckError(f"{op} {B}x{T}: max scaled error {max(err, err_r):.3g} > {TOL[op]}")
                return {"max err": max(err, err_r)}

            out.append(Case(f"{op} {B}x{T}", {"case": "GAE + whitening" if op == "gae" else "REINFORCE++",
                                              "B": B, "T": T}, sides, prepare, check))
    grid = [(4, 256), (16, 1024)] if ctx.quick else [(G, N) for G in (4, 16, 64)
                                                     for N in (256, 1024, 4096, 16384, 65536)]
    for est in OUTCOME:
        for G, N in grid:
            def prepare(d: Path, N=N, G=G, est=est):
                r, ids = outcome_inputs(N, G, est, seed=N + G)
                r.tofile(d / "rewards.f32"), ids.tofile(d / "ids.i64")

            def check(d: Path, o, N=N, est=est):
                got = np.fromfile(o["outs"]["rlpt"] / "adv.f32", np.float32)
                err = scaled_error(got, np.load(o["outs"]["verl"] / "adv.npy"))
                if not err <= TOL["outcome"]:
                    raise CheckError(f"{est} N={N}: max scaled error {err:.3g} > {TOL['outcome']}")
                return {"max err": err}

            sides = [Side("rlpt", "bench_advantage_runner", ["outcome", est, "{dir}", N]),
                     Side("verl", peer="outcome", params={"est": est, "N": N}, role="peer")]
            out.append(Case(f"{est} G={G} N={N}", {"estimator": est, "verl function": OUTCOME[est][2], "G": G, "N": N},
                            sides, prepare, check))
    return out


def gbps(result: dict, label: str, nbytes: float) -> float | None:
    s = (result.get("sides") or {}).get(label) or {}
    return nbytes / s["median"] / 1e9 if s.get("median") else None


def report(ctx, results: list[dict]) -> dict:
    token_rows, outcome_rows, targets = [], [], []
    gae_ok, gae_detail = True, []
    for r in results:
        lab = r["labels"]
        if "B" not in lab:
            continue
        n = lab["B"] * lab["T"]
        work = n * (17.0 if lab["case"].startswith("GAE") else 13.0)
        copy = (r.get("sides") or {}).get("copy", {})
        copy_rate = 2 * copy["bytes"] / copy["median"] / 1e9 if copy.get("median") else None
        rate = gbps(r, "rlpt", work)
        raw = gbps(r, "rlpt, no whitening", work)
        x = ratio(r, "verl")
        frac = rate / copy_rate if rate and copy_rate else None
        # The floor of a call that allocates its outputs: reading its inputs at copy speed, plus the
        # first touch of its freshly allocated outputs, which writes them once (measured in the
        # same rounds; the outputs' 8 bytes per token slot are in that, not counted twice).
        touch = (r.get("sides") or {}).get("outputs first touch", {}).get("median")
        floor = (work - 8.0 * n) / (copy_rate * 1e9) + touch if copy_rate and touch else None
        rl = (r.get("sides") or {}).get("rlpt", {}).get("median")
        peer = (r.get("sides") or {}).get("verl", {}).get("median")
        token_rows.append([lab["case"], lab["B"], lab["T"], spread(r, "rlpt"), spread(r, "verl"), fmt_x(x),
                           fmt_f(rate), fmt_f(copy_rate), fmt_pct(frac),
                           fmt_pct(raw / copy_rate) if raw and copy_rate else "-", fmt_s(touch),
                           fmt_pct(floor / rl) if floor and rl else "-",
                           fmt_x(peer / floor) if floor and peer else "-", fmt_e(r)])
        if lab["case"].startswith("GAE"):
            met = x is not None and frac is not None and x >= 50 and frac >= 0.35
            gae_ok &= met
            gae_detail.append(f"{lab['B']} x {lab['T']}: {fmt_x(x)}, {fmt_pct(frac)} of copy"
                              + (f"; the floor (inputs at copy speed + first touch of the outputs) allows at most "
                                 f"{fmt_x(peer / floor)} verl, rlpt is at {fmt_pct(floor / rl)} of it"
                                 if floor and rl and peer else ""))
    if token_rows:
        targets.append({"text": "GAE + masked whitening, 1024 x 8192 and 8192 x 1024: >= 50x verl and >= 35 % of the "
                                "same-run single-thread copy bandwidth (per CPU second)",
                        "met": gae_ok if all("sides" in r for r in results if "B" in r["labels"]) else None,
                        "detail": "; ".join(gae_detail)})
    worst, worst_at, counted, passed = None, "", 0, 0
    for r in results:
        lab = r["labels"]
        if "estimator" not in lab:
            continue
        x = ratio(r, "verl")
        outcome_rows.append([lab["estimator"], lab["verl function"], lab["G"], lab["N"], spread(r, "rlpt"),
                             spread(r, "verl"), fmt_x(x), fmt_e(r)])
        if x is not None:
            counted += 1
            passed += x >= 5
            if worst is None or x < worst:
                worst, worst_at = x, f"{lab['estimator']} G={lab['G']} N={lab['N']}"
    if outcome_rows:
        targets.append({"text": "GRPO and the other outcome estimators: >= 5x verl's vectorised torch (its loop function "
                                "where verl has no vectorised one) at every group size and batch size, grouping included",
                        "met": (passed == counted) if counted else None,
                        "detail": f"{passed} of {counted} cases; lowest {fmt_x(worst)} ({worst_at})" if counted else ""})
    head = ["case", "B", "T", "rlpt CPU s/call", "verl CPU s/call", "verl/rlpt (> 1: rlpt faster)",
            "rlpt GB per CPU s", "copy GB per CPU s (same run)", "of copy", "of copy, no whitening",
            "outputs first touch CPU s", "of the floor", "verl / floor (most any call allocating its outputs gets)",
            "max err"]
    tables = [{"title": "GAE + masked whitening and REINFORCE++ (verl conventions)", "columns": head, "rows": token_rows,
               "notes": "Times: median (min..max) process CPU seconds per call, one thread each, cold calls. "
                        "Bytes per token slot: GAE 17 (rewards, values, mask in; advantages, returns out), REINFORCE++ 13. "
                        "Copy: single-thread memcpy of 256 MiB in the same rounds, bytes read + written per CPU second. "
                        "Outputs first touch: allocating the call's two [B, T] float outputs (8 bytes per token "
                        "slot) and writing them once (`bench_limits fresh`), which both sides pay since both "
                        "allocate their outputs per call; the limit takes them in transparent huge pages where the "
                        "system allows them, as rlpt's writers do (core/copy.hpp). "
                        "Floor: the call's input bytes (GAE 9, REINFORCE++ 5 per token slot) at copy speed plus "
                        "that first touch, which writes the outputs once; verl / floor is the largest ratio to verl "
                        "that any implementation allocating its outputs could show here."},
              {"title": "Outcome estimators (one reward per sequence, ids grouped inside every call)",
               "columns": ["estimator", "verl function", "G", "N", "rlpt CPU s/call", "verl CPU s/call",
                           "verl/rlpt (> 1: rlpt faster)", "max err"], "rows": outcome_rows, "notes": ""}]
    return {"tables": tables, "targets": targets}


def fmt_x(x):
    return "-" if x is None else f"{x:.3g}x"


def fmt_f(x):
    return "-" if x is None else f"{x:.3g}"


def fmt_pct(x):
    return "-" if x is None else f"{100 * x:.0f} %"


def fmt_e(r):
    e = (r.get("check") or {}).get("max err")
    return "-" if e is None else f"{e:.1e}"


# --- peer side (bench/peers/worker.py) ------------------------------------------------------------

def make_peer(name: str, params: dict, d: Path):
    import torch
    import verl.trainer.ppo.core_algos as ca
    from worker import Peer

    def save(outputs, out: Path):
        adv, ret = outputs
        np.save(out / "adv.npy", adv.numpy().reshape(adv.shape[0], -1) if name != "outcome" else adv[:, 0].numpy())
        if name != "outcome":
            np.save(out / "ret.npy", ret.numpy())

    if name in ("gae", "rpp"):
        B, T = params["B"], params["T"]
        r = torch.from_numpy(np.fromfile(d / "rewards.f32", np.float32).reshape(B, T))
        m = torch.from_numpy(np.fromfile(d / "mask.u8", np.uint8).reshape(B, T)).float()
        if name == "gae":
            v = torch.from_numpy(np.fromfile(d / "values.f32", np.float32).reshape(B, T))
            return Peer(lambda: ca.compute_gae_advantage_return(r, v, m, params["gamma"], params["lam"]), save)
        cfg = type("cfg", (), {"gamma": params["gamma"]})()
        return Peer(lambda: ca.compute_reinforce_plus_plus_outcome_advantage(r, m, config=cfg), save)
    if name == "outcome":
        N = params["N"]
        fn_name, kwargs, _ = OUTCOME[params["est"]]
        fn = getattr(ca, fn_name)
        tok = torch.from_numpy(np.fromfile(d / "rewards.f32", np.float32))[:, None].clone()
        mask = torch.ones(N, 1)
        ids = np.fromfile(d / "ids.i64", np.int64)
        if params["est"] == "passk":
            kwargs = dict(kwargs, config={"norm_adv_by_std_in_grpo": True})
        return Peer(lambda: fn(tok, mask, ids, **kwargs), save)
    raise ValueError(f"unknown peer {name}")
