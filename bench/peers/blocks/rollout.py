"""Rollout: rank balancing and micro-batch planning against verl 0.9.1 (verl.utils.seqlen_balancing),
same lengths (tools/golden/gen_rollout.py: prompt 256 + lognormal response, median 2000, sigma
0.8; long tail, 15 % at the 16384 cap; uniform 256..8192), one thread each.

- Rank balancing, equal counts, verl's workload 24576 L + L^2: verl computes
  calculate_workload(lengths).tolist() and get_seqlen_balanced_partitions(..., k, equal_size=True)
  (what trainer._balance_batch runs, given the workload as a list: the trainer passes a tensor,
  which is slower), against rlpt::balance with compat::verl::balance(k) (Karmarkar-Karp on the
  same costs, computed inside the call). Both sides are timed as single cold calls: each call
  alone, the caches flushed before it; the call allocates and returns its partition. rlpt's
  default (`best`: KK and count-capped LPT, refined) is timed alongside for its quality. The
  check: the verl preset's parts are verl's item for item (ties included), and their loads equal
  verl's exactly.
- Micro-batches of one rank, budget 16384 tokens: verl's planning as rearrange_micro_batches runs
  it (KK on the workload with equal_size=False, the count raised until every micro-batch fits)
  against rlpt::plan_microbatches with the verl preset (the same parts), and
  rearrange_micro_batches end to end (nested input_ids, its index_select of every micro-batch)
  against rlpt plan + pack of every micro-batch into varlen buffers.
- Buffer, 2 producers + 2 consumers (rlpt only, four threads: verl has no such component).
"""
from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np

from core import ROOT, Case, CheckError, Side, ratio, spread

TITLE = "Rollout"
COMMAND = "scripts/bench-peers --only rollout"
RUNNERS = ["bench_rollout_peer"]
BUDGET = 16384


def gen_lengths(dist: str, n: int, seed: int) -> np.ndarray:
    sys.path.insert(0, str(ROOT / "tools" / "golden"))
    try:
        from gen_rollout import lengths
    finally:
        sys.path.pop(0)
    return lengths(np.random.default_rng(seed), dist, n)


def write_lengths(d: Path, L: np.ndarray) -> None:
    (d / "lengths.txt").write_text("\n".join(map(str, L.tolist())) + "\n")


def read_parts(path: Path) -> list[list[int]]:
    return [[int(x) for x in line.split()] for line in path.read_text().splitlines()]


def shape_of(L: np.ndarray, parts) -> list:
    """The parts as sorted multisets of lengths: equal for two partitions that differ only in
    which of two equally long sequences went where (ties that KK may break either way)."""
    return sorted(tuple(sorted(int(L[i]) for i in p)) for p in parts)


def loads(L: np.ndarray, parts) -> np.ndarray:
    w = 24576 * L.astype(np.float64) + L.astype(np.float64) ** 2
    return np.array([w[list(p)].sum() for p in parts])


def _dists():
    sys.path.insert(0, str(ROOT / "tools" / "golden"))
    try:
        from gen_rollout import DISTS
    finally:
        sys.path.pop(0)
    return DISTS


def cases(ctx) -> list[Case]:
    out = []
    dists = _dists()
    grid = [("lognormal", 256, 8), ("longtail", 1024, 64)] if ctx.quick else \
        [(d, n, k) for d in dists for n in (256, 1024, 4096, 16384, 65536) for k in (8, 64)]
    for seed, (dist, n, k) in enumerate(grid):
        def prepare(d: Path, dist=dist, n=n, seed=seed):
            write_lengths(d, gen_lengths(dist, n, seed))

        def check(d: Path, o, k=k):
            L = np.loadtxt(d / "lengths.txt", dtype=np.int64, ndmin=1)
            verl = list(np.load(o["outs"]["verl"] / "parts.npy", allow_pickle=True))
            rl = read_parts(o["outs"]["rlpt"] / "parts.txt")
            lv, lr = loads(L, verl), loads(L, rl)
            if len(rl) != k or sorted(i for p in rl for i in p) != list(range(len(L))) or \
                    not np.array_equal(np.sort(lr), np.sort(lv)):
                raise CheckError(f"the verl preset's part loads differ from verl's (max load {lr.max():.17g} vs "
                                 f"{lv.max():.17g})")
            best = read_parts(o["outs"]["rlpt best"] / "parts.txt")
            lv, lb = loads(L, verl), loads(L, best)
            if sorted(i for p in best for i in p) != list(range(len(L))) or lb.max() > lv.max() * (1 + 1e-12):
                raise CheckError("rlpt's default partition is not a partition or is worse than verl's")
            if sorted(map(tuple, rl)) != sorted(tuple(p) for p in verl):
                raise CheckError("the verl preset's parts differ from verl's (same loads: a tie broken otherwise; "
                                 f"{'only equal lengths swapped' if shape_of(L, rl) == shape_of(L, verl) else 'items'})")
            same = "item for item"
            return {"same parts": same, "verl max/mean - 1": float(lv.max() / lv.mean() - 1),
                    "best max/mean - 1": float(lb.max() / lb.mean() - 1)}

        out.append(Case(f"balance {dist} N={n} k={k}", {"kind": "balance", "dist": dist, "N": n, "k": k},
                        [Side("rlpt", "bench_rollout_peer", ["balance", "{dir}/lengths.txt", k, 1, "verl"]),
                         Side("verl", peer="balance", params={"k": k}, role="peer"),
                         Side("rlpt best", "bench_rollout_peer", ["balance", "{dir}/lengths.txt", k, 1, "best"],
                              role="diagnostic")],
                        prepare, check))
    mgrid = [("uniform", 64)] if ctx.quick else [(d, n) for d in dists for n in (256, 1024)]
    for seed, (dist, n) in enumerate(mgrid):
        def prepare(d: Path, dist=dist, n=n, seed=seed):
            write_lengths(d, gen_lengths(dist, n, 100 + seed))

        def check_plan(d: Path, o):
            L = np.loadtxt(d / "lengths.txt", dtype=np.int64, ndmin=1)
            rl = shape_of(L, read_parts(o["outs"]["rlpt"] / "parts.txt"))
            verl = shape_of(L, np.load(o["outs"]["verl"] / "parts.npy", allow_pickle=True))
            if rl != verl:
                raise CheckError(f"micro-batches differ: rlpt {len(rl)}, verl {len(verl)}")
            return {"micro-batches": len(rl)}

        def check_e2e(d: Path, o):
            rl, verl = o["runs"]["rlpt"], o["runs"]["verl"]
            if rl["count"] != verl["count"] or rl["tokens"] != verl["tokens"]:
                raise CheckError(f"rlpt packed {rl['count']} micro-batches of {rl['tokens']} tokens, verl "
                                 f"{verl['count']} of {verl['tokens']}")
            return {"micro-batches": rl["count"], "tokens": rl["tokens"]}

        out.append(Case(f"plan {dist} N={n}", {"kind": "plan", "dist": dist, "N": n},
                        [Side("rlpt", "bench_rollout_peer", ["microbatch", "{dir}/lengths.txt", BUDGET, "verl"]),
                         Side("verl", peer="plan", params={}, role="peer")], prepare, check_plan))
        out.append(Case(f"plan+pack {dist} N={n}", {"kind": "plan+pack", "dist": dist, "N": n},
                        [Side("rlpt", "bench_rollout_peer", ["pack", "{dir}/lengths.txt", BUDGET, 1]),
                         Side("verl", peer="rearrange", params={}, role="peer")], prepare, check_e2e))
    for mean_len, records in ([(64, 4000)] if ctx.quick else [(64, 400_000), (1024, 40_000)]):
        out.append(Case(f"buffer mean {mean_len}", {"kind": "buffer", "mean_len": mean_len, "records": records},
                        [Side("rlpt", "bench_rollout_peer", ["buffer", 2, 2, records, 8, mean_len], check=False)],
                        flush=False, warmup=0, rounds=3, processes=4))
    return out


def report(ctx, results: list[dict]) -> dict:
    bal, mb, buf = [], [], []
    counted = passed = differ = 0
    worst, worst_at = None, ""
    for r in results:
        lab, c = r["labels"], r.get("check") or {}
        if lab["kind"] == "balance":
            x = ratio(r, "verl")
            bal.append([lab["dist"], lab["N"], lab["k"], spread(r, "verl"), spread(r, "rlpt"), fx(x),
                        spread(r, "rlpt best"), fx(ratio(r, "verl", "rlpt best")), c.get("same parts", "-"),
                        fe(c.get("verl max/mean - 1")), fe(c.get("best max/mean - 1"))])
            if x is not None:
                counted += 1
                passed += x >= 50
                differ += not str(c.get("same parts", "")).startswith(("item", "up to"))
                if worst is None or x < worst:
                    worst, worst_at = x, f"{lab['dist']} N={lab['N']} k={lab['k']}"
        elif lab["kind"] in ("plan", "plan+pack"):
            mb.append([lab["kind"], lab["dist"], lab["N"], spread(r, "verl"), spread(r, "rlpt"), fx(ratio(r, "verl")),
                       c.get("micro-batches", "-")])
        else:
            s = (r.get("sides") or {}).get("rlpt", {})
            if s.get("median"):
                buf.append([lab["mean_len"], lab["records"], f"{s['records'] / s['median']:.3g}" if s.get("records") else "-",
                            f"{1e9 * s['median'] / s['records']:.3g}" if s.get("records") else "-",
                            f"{s.get('column_cpu_gbps', 0):.3g}", f"{s.get('copy_cpu_gbps', 0):.3g}"])
    tables = [
        {"title": "Rank balancing, equal counts, verl's workload (single cold calls)",
         "columns": ["dist", "N", "k", "verl CPU s/call", "rlpt (verl preset) CPU s/call", "verl/rlpt",
                     "rlpt default (best) CPU s/call", "verl/rlpt best", "same parts", "max/mean - 1: verl = rlpt preset",
                     "rlpt best"],
         "rows": bal, "notes": "Each call timed alone after the caches were flushed (twice the last-level cache "
                               "written), on both sides; median (min..max) over every call of every round."},
        {"title": f"Micro-batches of one rank, budget {BUDGET} tokens",
         "columns": ["what", "dist", "N", "verl CPU s/call", "rlpt CPU s/call", "verl/rlpt", "micro-batches"],
         "rows": mb, "notes": "plan: verl's planning loop (rearrange_micro_batches) vs rlpt::plan_microbatches, verl "
                              "preset; plan+pack: rearrange_micro_batches end to end (nested input_ids) vs rlpt plan + "
                              "pack into varlen buffers."},
        {"title": "Buffer, 2 producers + 2 consumers, groups of 8 (rlpt only; four threads)",
         "columns": ["mean response tokens", "records", "records per CPU s", "CPU ns per record",
                     "column GB per CPU s", "memcpy GB per CPU s (same process)"], "rows": buf,
         "notes": "Column bytes: 13 per token (token, mask, logprob, version), moved in and copied once."}]
    targets = [{"text": "Rank balancing: >= 50x verl in every case, single cold calls on both sides, same partitions",
                "met": (passed == counted and differ == 0) if counted else None,
                "detail": (f">= 50x in {passed} of {counted} cases, lowest {fx(worst)} ({worst_at}); parts differ "
                           f"from verl's (same loads) in {differ}") if counted else ""}]
    return {"tables": tables, "targets": targets}


def fx(x):
    return "-" if x is None else f"{x:.3g}x"


def fe(x):
    return "-" if x is None else f"{x:.2e}"


# --- peer side ------------------------------------------------------------------------------------

def make_peer(name: str, params: dict, d: Path):
    import torch
    from verl.utils import seqlen_balancing as sb
    from worker import Peer

    L = np.loadtxt(d / "lengths.txt", dtype=np.int64, ndmin=1)
    Lt = torch.from_numpy(L)

    def save_parts(parts, out: Path):
        arr = np.empty(len(parts), dtype=object)
        arr[:] = [list(map(int, p)) for p in parts]
        np.save(out / "parts.npy", arr, allow_pickle=True)

    if name == "balance":
        k = params["k"]
        return Peer(lambda: sb.get_seqlen_balanced_partitions(sb.calculate_workload(Lt).tolist(), k, equal_size=True),
                    save_parts)
    if name == "plan":
        def plan():  # rearrange_micro_batches' planning, as it runs it (no forced groups, one rank)
            workloads = sb.calculate_workload(Lt).tolist()
            lens = Lt.tolist()
            k = min(len(lens), math.ceil(sum(lens) / BUDGET))
            while True:
                parts = sb.get_seqlen_balanced_partitions(workloads, k, equal_size=False)
                if all(sum(lens[i] for i in p) <= BUDGET for p in parts):
                    return parts
                k += 1
        return Peer(plan, save_parts)
    if name == "rearrange":
        from tensordict import TensorDict
        ids = torch.nested.nested_tensor([torch.zeros(int(x), dtype=torch.long) for x in L], layout=torch.jagged)
        batch = TensorDict({"input_ids": ids}, batch_size=[len(L)])

        def save(outputs, out: Path):
            mbs, _ = outputs
            return {"count": len(mbs), "tokens": int(sum(int(m["input_ids"].offsets()[-1]) for m in mbs))}
        return Peer(lambda: sb.rearrange_micro_batches(batch, max_token_len=BUDGET), save)
    raise ValueError(f"unknown peer {name}")
