# SPDX-License-Identifier: Apache-2.0
"""Rank balancing and micro-batch plans from Python (rlpt.balance, rlpt.balance_partitions,
rlpt.plan_microbatches) and verl's get_seqlen_balanced_partitions drop-in (rlpt.verl): the same
partitions as verl's and AReaL's own functions, item for item and in their order of parts, on
seeded lengths with ties and zeros; verl's own callers (rearrange_micro_batches,
get_group_balanced_partitions) through patch(); errors."""
import math

import pytest
import torch

import rlpt


def lengths_of(dist, n, seed):
    g = torch.Generator().manual_seed(seed)
    if dist == "lognormal":
        x = torch.exp(torch.randn(n, generator=g) * 1.0 + 6.0).clamp(1, 32768)
    elif dist == "uniform":
        x = torch.randint(1, 4097, (n,), generator=g).double()
    elif dist == "ties":  # few distinct lengths: every tie-break is exercised
        x = torch.tensor([64.0, 128.0, 512.0])[torch.randint(0, 3, (n,), generator=g)]
    else:  # "zeros": empty responses among long ones
        x = torch.randint(0, 2048, (n,), generator=g).double() * (torch.rand(n, generator=g) > 0.3)
    return x.long()


def max_load(parts, w):
    return max(sum(w[i] for i in p) for p in parts)


def covers(parts, n):
    flat = sorted(i for p in parts for i in p)
    return flat == list(range(n)) and all(p == sorted(p) for p in parts)


CASES = [(dist, n, k) for dist in ("lognormal", "uniform", "ties", "zeros") for n, k in
         ((1, 1), (2, 2), (7, 3), (64, 8), (256, 8), (256, 64), (1000, 8), (1024, 64))]


# --- verl -----------------------------------------------------------------------------------------

verl = pytest.importorskip("verl")
import rlpt.verl as rv  # noqa: E402
from verl.utils import seqlen_balancing as sb  # noqa: E402

from rlpt._rollout import exact_workloads  # noqa: E402

# verl's own function, whether or not RLPT_VERL_PATCH put rlpt's under its name at import.
VERL_GSBP = rv._verl_balancing("get_seqlen_balanced_partitions")
assert VERL_GSBP is not rv.get_seqlen_balanced_partitions


@pytest.mark.parametrize("dist,n,k", CASES)
@pytest.mark.parametrize("equal_size", [True, False])
def test_drop_in_is_verl_item_for_item(dist, n, k, equal_size):
    if equal_size and n % k:
        pytest.skip("verl asserts divisibility")
    seqlens = lengths_of(dist, n, seed=n * 131 + k)
    workloads = sb.calculate_workload(seqlens)  # what _balance_batch passes: an int64 tensor
    for given in (workloads, workloads.tolist(), seqlens.tolist()):  # rearrange_micro_batches: a list
        want = VERL_GSBP(given, k_partitions=k, equal_size=equal_size)
        got = rv.get_seqlen_balanced_partitions(given, k_partitions=k, equal_size=equal_size)
        assert got == want
        assert all(type(i) is int for p in got for i in p)


def test_drop_in_hands_verl_what_rlpt_cannot_sum_exactly():
    # floats, negative workloads and totals past 2^52 go to verl's own Karmarkar-Karp
    g = torch.Generator().manual_seed(5)
    floats = (torch.rand(40, generator=g) * 100).tolist()
    negative = torch.randint(-50, 50, (40,), generator=g).tolist()
    huge = [2 ** 50 + i for i in range(40)]
    beyond_int64 = [2 ** 70 + 3 * i for i in range(40)]
    for given in (floats, negative, huge, beyond_int64):
        for equal_size in (True, False):
            assert rv.get_seqlen_balanced_partitions(given, 4, equal_size) == VERL_GSBP(given, 4, equal_size)
    assert exact_workloads(huge) is None and exact_workloads(floats) is None
    assert exact_workloads([2 ** 40] * 40) is not None


def test_drop_in_keeps_verl_assertions():
    with pytest.raises(AssertionError, match=r"number of items:\[3\] < k_partitions:\[4\]"):
        rv.get_seqlen_balanced_partitions([1, 2, 3], 4, False)
    with pytest.raises(AssertionError, match="10 % 4 != 0"):
        rv.get_seqlen_balanced_partitions(list(range(10)), 4, True)


@pytest.mark.parametrize("k", [1, 2, 4, 8])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_group_drop_in_is_verl_item_for_item(k, seed):
    import numpy as np

    g = torch.Generator().manual_seed(seed)
    sizes = torch.randint(1, 9, (8 * k,), generator=g).tolist()  # ragged groups, 8 per rank
    uids = [f"uid-{j % (3 * k)}" for j, size in enumerate(sizes) for _ in range(size)]  # a uid comes back later
    seqlens = lengths_of("ties" if seed == 2 else "lognormal", len(uids), seed).tolist()
    want = rv._verl_balancing("get_group_balanced_partitions")(seqlens, uids, k)
    assert rv.get_group_balanced_partitions(seqlens, uids, k) == want
    assert rv.get_group_balanced_partitions(seqlens, np.array(uids, dtype=object), k) == want
    floats = [x + 0.5 for x in seqlens]  # verl's own function answers what rlpt does not sum exactly
    assert (rv.get_group_balanced_partitions(floats, uids, k)
            == rv._verl_balancing("get_group_balanced_partitions")(floats, uids, k))


def test_group_drop_in_keeps_verl_assertions():
    with pytest.raises(AssertionError, match="must have same length"):
        rv.get_group_balanced_partitions([1, 2], [0], 1)
    with pytest.raises(AssertionError, match=r"Number of uid groups \(2\) must be >= k_partitions \(4\)"):
        rv.get_group_balanced_partitions([1, 2, 3], [0, 0, 1], 4)
    with pytest.raises(AssertionError, match="3 % 2 != 0"):
        rv.get_group_balanced_partitions([1, 2, 3], [0, 1, 2], 2)


def test_patch_reaches_verl_callers():
    torch.manual_seed(3)
    seqlens = lengths_of("lognormal", 96, 7).clamp(max=300)
    mask = torch.arange(300)[None, :] < seqlens[:, None]
    batch = {"input_ids": torch.randint(0, 9, (96, 300)), "attention_mask": mask.long()}
    from verl import DataProto

    proto = DataProto.from_single_dict(batch)
    want_mb = sb.rearrange_micro_batches(proto.batch, max_token_len=2048)[1]
    uids = [i // 4 for i in range(96)]
    want_groups = sb.get_group_balanced_partitions(seqlens.tolist(), uids, 4)
    rv.patch()
    try:
        assert sb.get_seqlen_balanced_partitions is rv.get_seqlen_balanced_partitions
        assert sb.get_group_balanced_partitions is rv.get_group_balanced_partitions
        micro, got_mb = sb.rearrange_micro_batches(proto.batch, max_token_len=2048)
        assert got_mb == want_mb
        assert all(int(m["attention_mask"].sum()) <= 2048 for m in micro)
        assert sb.get_group_balanced_partitions(seqlens.tolist(), uids, 4) == want_groups
    finally:
        rv.unpatch()
    assert sb.get_seqlen_balanced_partitions is VERL_GSBP
    assert sb.get_group_balanced_partitions is rv._verl_balancing("get_group_balanced_partitions")


def test_patch_replaces_the_name_a_trainer_already_imported():
    import sys
    import types

    trainer = types.ModuleType("verl.trainer.sft_trainer_ray")
    trainer.get_seqlen_balanced_partitions = sb.get_seqlen_balanced_partitions
    saved = sys.modules.get(trainer.__name__)
    sys.modules[trainer.__name__] = trainer
    try:
        rv.patch()
        try:
            assert trainer.get_seqlen_balanced_partitions is rv.get_seqlen_balanced_partitions
        finally:
            rv.unpatch()
        assert trainer.get_seqlen_balanced_partitions is VERL_GSBP
    finally:
        if saved is None:
            del sys.modules[trainer.__name__]
        else:
            sys.modules[trainer.__name__] = saved


# --- rlpt.balance and its presets ---------------------------------------------------------------------


@pytest.mark.parametrize("dist,n,k", [c for c in CASES if c[1] % c[2] == 0])
def test_balance_presets_match_the_peers(dist, n, k):
    seqlens = lengths_of(dist, n, seed=n + k)
    assert rlpt.balance(seqlens, k, preset="verl") == VERL_GSBP(sb.calculate_workload(seqlens), k, True)
    areal = pytest.importorskip("areal.utils.seqpack")
    want = [sorted(p) for p in areal.balanced_greedy_partition(seqlens.tolist(), k)]
    assert rlpt.balance(seqlens.tolist(), k, preset="areal") == want


@pytest.mark.parametrize("dist,n,k", CASES)
def test_balance_default_is_never_worse_than_verl(dist, n, k):
    seqlens = lengths_of(dist, n, seed=n * 7 + k)
    w = sb.calculate_workload(seqlens).tolist()
    parts, loads = rlpt.balance(seqlens, k, return_loads=True)
    assert len(parts) == k and covers(parts, n)
    sizes = {len(p) for p in parts}
    assert max(sizes) - min(sizes) <= 1  # equal counts, also when k does not divide n
    assert loads == [float(sum(w[i] for i in p)) for p in parts]
    if n % k == 0:
        assert max_load(parts, w) <= max_load(VERL_GSBP(w, k, True), w)
    assert covers(rlpt.balance(seqlens, k, equal_count=False), n)


def test_balance_partitions_on_weights():
    w = [5.5, 1.25, 3.0, 3.0, 0.0, 8.0, 2.5, 2.5]
    for algorithm in ("karmarkar_karp", "lpt", "best"):
        parts, loads = rlpt.balance_partitions(w, 3, algorithm=algorithm, equal_count=False, return_loads=True)
        assert covers(parts, len(w))
        assert loads == [sum(w[i] for i in p) for p in parts]
    best = rlpt.balance_partitions(torch.tensor(w, dtype=torch.float32), 2, equal_count=False)
    optimum = min(max(s, sum(w) - s) for s in
                  (sum(x for i, x in enumerate(w) if mask >> i & 1) for mask in range(1 << len(w))))
    assert max_load(best, w) == optimum == 13.0  # by exhaustive search over the 2^8 splits
    assert rlpt.balance_partitions([], 2) == [[], []]


def test_cost_override_is_the_cost_model():
    seqlens = lengths_of("uniform", 64, 9)
    tokens = rlpt.balance(seqlens, 4, preset="verl", cost=(1.0, 0.0))
    assert tokens == VERL_GSBP(seqlens, 4, True)  # KK on the lengths themselves
    squared = rlpt.balance(seqlens, 4, preset="trl", return_loads=True)[1]
    parts = rlpt.balance(seqlens, 4, preset="trl")
    assert squared == [float(sum(int(seqlens[i]) ** 2 for i in p)) for p in parts]


# --- micro-batches ------------------------------------------------------------------------------


@pytest.mark.parametrize("dist", ["lognormal", "uniform", "ties"])
@pytest.mark.parametrize("budget", [4096, 16384])
def test_plan_microbatches_verl_preset_is_rearrange_micro_batches(dist, budget):
    seqlens = lengths_of(dist, 256, 11).clamp(min=1, max=4096)
    mask = torch.arange(int(seqlens.max()))[None, :] < seqlens[:, None]
    from verl import DataProto

    proto = DataProto.from_single_dict({"input_ids": torch.zeros(mask.shape, dtype=torch.long),
                                        "attention_mask": mask.long()})
    want = VERL_REARRANGE(proto.batch, max_token_len=budget)[1]
    plan = rlpt.plan_microbatches(seqlens, budget, preset="verl")
    assert sorted(map(sorted, plan["microbatches"])) == sorted(map(sorted, want))
    assert plan["microbatches"] == [sorted(m) for m in want]
    assert plan["tokens"] == [int(sum(int(seqlens[i]) for i in m)) for m in want]
    assert plan["oversize"] == 0 and plan["empty"] == 0 and not plan["fell_back"]


def VERL_REARRANGE(batch, max_token_len):
    """verl's rearrange_micro_batches with verl's own balancing, even when patched."""
    saved = sb.get_seqlen_balanced_partitions
    sb.get_seqlen_balanced_partitions = VERL_GSBP
    try:
        return sb.rearrange_micro_batches(batch, max_token_len=max_token_len)
    finally:
        sb.get_seqlen_balanced_partitions = saved


def test_plan_microbatches_keeps_the_budget():
    seqlens = lengths_of("lognormal", 500, 2).clamp(max=8000)
    for preset in ("rlpt", "verl", "areal", "slime"):
        plan = rlpt.plan_microbatches(seqlens, 8192, preset=preset, divisor=2, min_microbatches=3)
        mbs = plan["microbatches"]
        assert len(mbs) % 2 == 0 and len(mbs) >= 3
        assert sorted(i for m in mbs for i in m) == list(range(500))
        assert all(t <= 8192 for t in plan["tokens"])
        assert math.fsum(plan["tokens"]) == int(seqlens.sum())
    ffd = rlpt.plan_microbatches(seqlens, 8192, algorithm="ffd")
    assert sorted(i for m in ffd["microbatches"] for i in m) == list(range(500))
    assert len(ffd["microbatches"]) >= math.ceil(int(seqlens.sum()) / 8192)
    assert all(t <= 8192 for t in ffd["tokens"])
    long = rlpt.plan_microbatches([100, 20000, 50], 1000)
    assert long["oversize"] == 1 and [1] in long["microbatches"]


# --- errors -------------------------------------------------------------------------------------


@pytest.mark.parametrize("call,eid", [
    (lambda: rlpt.balance([3, -1, 4], 2), "rlpt.rollout.bad_length"),
    (lambda: rlpt.balance([3.0, 1.5], 2), "rlpt.python.dtype"),
    (lambda: rlpt.balance([3, 2 ** 70], 2), "rlpt.python.dtype"),
    (lambda: rlpt.balance(["3", "1"], 2), "rlpt.python.dtype"),
    (lambda: rlpt.balance_partitions([1.0, "x"], 2), "rlpt.python.dtype"),
    (lambda: rlpt.balance(torch.ones(2, 2, dtype=torch.long), 2), "rlpt.python.shape"),
    (lambda: rlpt.balance([3, 1], 2, preset="megatron"), "rlpt.python.bad_option"),
    (lambda: rlpt.balance([3, 1], 2, algorithm="greedy"), "rlpt.python.bad_option"),
    (lambda: rlpt.balance([3, 1], 0), "rlpt.rollout.bad_partition"),
    (lambda: rlpt.balance_partitions([1.0, float("nan"), 2.0], 2), "rlpt.rollout.bad_cost"),
    (lambda: rlpt.balance_partitions([1.0, -2.0], 2), "rlpt.rollout.bad_cost"),
    (lambda: rlpt.plan_microbatches([10, 20], 0), "rlpt.rollout.bad_option"),
    (lambda: rlpt.plan_microbatches([10, 20], 100, preset="trl"), "rlpt.python.bad_option"),
])
def test_errors_name_the_input(call, eid):
    with pytest.raises(rlpt.Error) as e:
        call()
    assert e.value.id == eid, str(e.value)
