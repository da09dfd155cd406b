# SPDX-License-Identifier: Apache-2.0
import os

import pytest
import torch

torch.set_num_threads(1)
os.environ.setdefault("OMP_NUM_THREADS", "1")


def close(got, want, rtol, atol, what=""):
    got = torch.as_tensor(got).detach().to(torch.float64).cpu()
    want = torch.as_tensor(want).detach().to(torch.float64).cpu()
    assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)} vs {tuple(want.shape)}"
    err = (got - want).abs()
    bad = err > atol + rtol * want.abs()
    assert not bool(bad.any()), f"{what}: max |diff| {float(err.max()):.3e} at {bad.nonzero()[:4].tolist()}"


def ragged_mask(g, B, T, fixed=None):
    """Row lengths drawn from g in [1, T] (with `fixed` {row: length} set after the draw) and the
    [B, T] bool mask of each row's first `length` slots."""
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    for row, n in (fixed or {}).items():
        lengths[row] = n
    return lengths, torch.arange(T)[None, :] < lengths[:, None]


@pytest.fixture
def gen():
    return torch.Generator().manual_seed(1234)


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
