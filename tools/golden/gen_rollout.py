"""Rollout balancing and micro-batching: partitions computed by verl's own seqlen_balancing functions.

- balance.bin: get_seqlen_balanced_partitions(calculate_workload(L), k, equal_size) on three length
  distributions (lognormal median 2000, long tail with 15% at the 16k cap, uniform 256..8192).
- groups.bin: get_group_balanced_partitions(L, uid, k): contiguous groups kept whole.
- microbatch.bin: rearrange_micro_batches(TensorDict(input_ids, attention_mask), max_token_len).

The C++ tests check that rlpt's balance is never worse than verl's (max load over ranks) and that its
micro-batches respect the cap with no more micro-batches than verl.
"""
from pathlib import Path

import numpy as np
import torch

import peers
import rlpt_golden

CAP = 16384
PROMPT = 256
DISTS = ("lognormal", "longtail", "uniform")


def lengths(rng: np.random.Generator, dist: str, n: int) -> np.ndarray:
    """Sequence lengths (prompt + response) as in async_buffers.md §5.2."""
    if dist == "lognormal":
        x = PROMPT + rng.lognormal(np.log(2000.0), 0.8, n)
    elif dist == "longtail":
        x = PROMPT + rng.lognormal(np.log(1500.0), 0.9, n)
        x[rng.random(n) < 0.15] = CAP
    elif dist == "uniform":
        x = rng.integers(256, 8193, n)
    else:
        raise ValueError(dist)
    return np.clip(np.asarray(x, dtype=np.int64), 1, CAP)


def assignment(parts: list[list[int]], n: int) -> np.ndarray:
    out = np.full(n, -1, dtype=np.int64)
    for p, items in enumerate(parts):
        out[np.asarray(items, dtype=np.int64)] = p
    assert (out >= 0).all()
    return out


def generate(out_dir: Path, seed: int) -> None:
    from tensordict import TensorDict
    from verl.utils import seqlen_balancing as sb

    rng = np.random.default_rng(seed)
    arrays, cases = {}, []
    for d, dist in enumerate(DISTS):
        for n, ks in ((64, (4, 8)), (256, (8, 32)), (1024, (8, 32)), (4096, (64,))):
            for k in ks:
                for equal in (True, False):
                    if n == 4096 and not equal:
                        continue
                    L = lengths(rng, dist, n)
                    w = sb.calculate_workload(torch.from_numpy(L)).tolist()
                    parts = sb.get_seqlen_balanced_partitions(w, k, equal_size=equal)
                    c = len(cases)
                    arrays[f"c{c}_lengths"] = L.astype(np.int32)
                    arrays[f"c{c}_assign"] = assignment(parts, n).astype(np.int32)
                    arrays[f"c{c}_params"] = np.array([k, int(equal), d], dtype=np.int64)
                    cases.append((dist, n, k, equal))
    arrays["cases"] = np.array([len(cases)], dtype=np.int64)
    rlpt_golden.write(out_dir / "balance.bin", arrays, peers.meta(
        "rollout", seed, cases=cases, cost="calculate_workload = 24576*L + L^2",
        reference="verl.utils.seqlen_balancing.get_seqlen_balanced_partitions(workload, k, equal_size)"))

    arrays, cases = {}, []
    for d, dist in enumerate(DISTS[:2]):
        for n_groups, size, k in ((32, 8, 8), (64, 16, 8), (128, 4, 16)):
            L = lengths(rng, dist, n_groups * size)
            uid = [f"g{i // size}" for i in range(n_groups * size)]
            parts = sb.get_group_balanced_partitions(L.tolist(), uid, k)
            c = len(cases)
            arrays[f"c{c}_lengths"] = L.astype(np.int32)
            arrays[f"c{c}_assign"] = assignment(parts, len(L)).astype(np.int32)
            arrays[f"c{c}_params"] = np.array([k, size, d], dtype=np.int64)
            cases.append((dist, n_groups, size, k))
    arrays["cases"] = np.array([len(cases)], dtype=np.int64)
    rlpt_golden.write(out_dir / "groups.bin", arrays, peers.meta(
        "rollout", seed, cases=cases,
        reference="verl.utils.seqlen_balancing.get_group_balanced_partitions(L, uid, k) (groups contiguous)"))

    arrays, cases = {}, []
    for d, dist in enumerate(DISTS):
        for n, budget in ((64, 16384), (256, 16384), (256, 32768)):
            L = lengths(rng, dist, n)
            width = int(L.max())
            mask = torch.arange(width)[None, :] < torch.from_numpy(L)[:, None]
            batch = TensorDict({"input_ids": mask.long(), "attention_mask": mask.long()}, batch_size=[n])
            _, mbs = sb.rearrange_micro_batches(batch, max_token_len=budget)
            mb = np.full(n, -1, dtype=np.int64)
            for m, items in enumerate(mbs):
                mb[np.asarray(items, dtype=np.int64)] = m
            assert (mb >= 0).all()
            c = len(cases)
            arrays[f"c{c}_lengths"] = L.astype(np.int32)
            arrays[f"c{c}_assign"] = mb.astype(np.int32)
            arrays[f"c{c}_params"] = np.array([budget, len(mbs), d], dtype=np.int64)
            cases.append((dist, n, budget, len(mbs)))
    arrays["cases"] = np.array([len(cases)], dtype=np.int64)
    rlpt_golden.write(out_dir / "microbatch.bin", arrays, peers.meta(
        "rollout", seed, cases=cases,
        reference="verl.utils.seqlen_balancing.rearrange_micro_batches(TensorDict, max_token_len) "
                  "(use_dynamic_bsz_balance=True, no dp group)"))
