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


@pytest.fixture
def gen():
    return torch.Generator().manual_seed(1234)


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
