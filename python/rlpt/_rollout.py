# SPDX-License-Identifier: Apache-2.0
"""Rank balancing and micro-batch plans (rlpt/rollout/balance.hpp, packing.hpp) from Python.

Lists or 1-D CPU tensors in, lists of item indices out (ascending within each part)."""
import numpy as np
import torch

from . import _C
from ._errors import Error, call


def _vector(x, what, integer):
    """x as a 1-D CPU tensor: integers (int64) for lengths, float64 for weights."""
    if isinstance(x, torch.Tensor):
        t = x.detach()
    else:  # numpy reads a list several times faster than torch.as_tensor
        try:
            a = np.asarray(x) if integer else np.asarray(x, dtype=np.float64)
        except (TypeError, ValueError, OverflowError) as e:
            raise Error("rlpt.python.dtype", f"{what} must be numbers: {e}") from None
        if integer and a.size == 0:
            a = a.astype(np.int64)
        if a.dtype.kind not in "biuf" or a.dtype == np.uint64:
            raise Error("rlpt.python.dtype", f"{what} must be {'int64 integers' if integer else 'numbers'}, "
                        f"got {a.dtype} values")
        t = torch.from_numpy(a)
    if t.dim() != 1:
        raise Error("rlpt.python.shape", f"{what} must be 1-D, got shape {list(t.shape)}")
    if integer and (t.is_floating_point() or t.is_complex() or t.dtype == torch.bool):
        raise Error("rlpt.python.dtype", f"{what} must hold integers (token counts), got {t.dtype}")
    return t.cpu()


def _cost(cost):
    if cost is None:
        return None
    linear, quadratic = cost
    return float(linear), float(quadratic)


def balance_partitions(weights, parts, *, equal_count=True, algorithm="best", refine=True, return_loads=False):
    """Partitions items with non-negative costs into `parts` parts with a small max load
    (rlpt::partition_weights). algorithm: "karmarkar_karp" (verl's), "lpt" (AReaL's) or "best"
    (both, the smaller max load kept, then refined). With equal_count, part sizes differ by at most
    one. Returns [[item, ...] per part] (and the loads with return_loads)."""
    w = _vector(weights, "weights", integer=False)
    items, loads = call(_C.partition_weights, w, int(parts), str(algorithm), bool(equal_count), bool(refine))
    return (items, loads) if return_loads else items


def balance(lengths, ranks, *, preset="rlpt", algorithm=None, equal_count=None, refine=None, cost=None,
            return_loads=False):
    """Balances sequences of the given lengths (token counts) across `ranks` data-parallel ranks
    (rlpt::balance). preset: "rlpt" (best, refined, verl's workload 24576 L + L^2), "verl"
    (_balance_batch), "areal", "slime" or "trl"; algorithm / equal_count / refine / cost =
    (linear, quadratic) override the preset's. Returns [[sequence, ...] per rank]."""
    lengths = _vector(lengths, "lengths", integer=True)
    items, loads = call(_C.balance, lengths, int(ranks), str(preset), algorithm,
                        None if equal_count is None else bool(equal_count), None if refine is None else bool(refine),
                        _cost(cost))
    return (items, loads) if return_loads else items


def plan_microbatches(lengths, token_budget, *, preset="rlpt", algorithm=None, min_microbatches=None, divisor=None,
                      small_at_ends=None, cost=None):
    """Cuts one rank's sequences into micro-batches of at most `token_budget` tokens
    (rlpt::plan_microbatches). preset: "rlpt", "verl" (rearrange_micro_batches), "areal" or
    "slime"; the keywords override the preset's (algorithm: "karmarkar_karp", "ffd" or
    "first_fit", first fit in the given order). Returns {"microbatches": [[sequence, ...], ...],
    "tokens": [...], "oversize": n, "empty": n, "fell_back": bool}."""
    lengths = _vector(lengths, "lengths", integer=True)
    return call(_C.plan_microbatches, lengths, int(token_budget), str(preset), algorithm,
                None if min_microbatches is None else int(min_microbatches),
                None if divisor is None else int(divisor), None if small_at_ends is None else bool(small_at_ends),
                _cost(cost))


# --- the Karmarkar-Karp drop-ins of verl and OpenRLHF ----------------------------------------------

#: Workloads are handled by rlpt when they are non-negative integers whose total is below this:
#: rlpt sums them in doubles, exactly, so every comparison is the peer's on Python ints.
_EXACT_TOTAL = 2 ** 52


def exact_workloads(seqlen_list):
    """The workloads as an int64 CPU tensor when rlpt's sums of them are exact, else None."""
    try:
        t = _vector(seqlen_list, "workloads", integer=True).long()
    except Error:  # floats, objects, > int64, ragged, not 1-D
        return None
    if t.numel() and (int(t.min()) < 0 or float(t.double().sum()) >= _EXACT_TOTAL):
        return None
    return t


def kk_partitions(seqlen_list, k_partitions, equal_size, peer_karmarkar_karp):
    """get_seqlen_balanced_partitions as verl has it (OpenRLHF's is a copy of an earlier verl's, the
    same function): Karmarkar-Karp parts in the peer's order, each sorted, with the peer's
    assertions. Workloads rlpt cannot sum exactly go to peer_karmarkar_karp() (a callable that
    returns the peer's own karmarkar_karp), so every input gets the peer's answer."""
    n = len(seqlen_list)
    assert n >= k_partitions, f"number of items:[{n}] < k_partitions:[{k_partitions}]"
    w = exact_workloads(seqlen_list)
    if w is None:
        kk = peer_karmarkar_karp()
        parts = [sorted(p) for p in kk(seqlen_list=seqlen_list, k_partitions=k_partitions, equal_size=equal_size)]
    else:
        if equal_size:
            assert n % k_partitions == 0, f"{n} % {k_partitions} != 0"
        parts = balance_partitions(w, k_partitions, equal_count=bool(equal_size), algorithm="karmarkar_karp",
                                   refine=False)
    assert len(parts) == k_partitions, f"{len(parts)} != {k_partitions}"
    for i, p in enumerate(parts):
        assert len(p) > 0, f"the {i}-th partition is empty"
    return parts
