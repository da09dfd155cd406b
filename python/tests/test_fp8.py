# SPDX-License-Identifier: Apache-2.0
"""rlpt.sync.quantize_fp8_blockwise against verl's own scaled_fp8_blockwise (its PyTorch path) on
seeded weights of several shapes, dtypes and block sizes, bit for bit; against the committed golden
vectors (without verl); the audit; the errors."""
import pathlib
import sys

import pytest
import torch

import rlpt
import rlpt.sync

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("shape,dtype,block", [((256, 512), torch.bfloat16, 128), ((130, 70), torch.bfloat16, 128),
                                               ((64, 96), torch.float32, 32), ((300, 129), torch.float16, 64)])
def test_quantize_equals_verl(shape, dtype, block, monkeypatch):
    fp8_kernel = pytest.importorskip("verl.utils.kernel.fp8_kernel")
    monkeypatch.setattr(fp8_kernel, "_DISABLE_TRITON_FP8", True)  # its PyTorch path (Triton needs a GPU)
    gen = torch.Generator().manual_seed(sum(shape) + block)
    w = (torch.randn(shape, generator=gen) * 0.05).to(dtype)
    w[0, : min(8, shape[1])] = 0  # part of a block at zero
    q, s = rlpt.sync.quantize_fp8_blockwise(w, block)
    want_q, want_s = fp8_kernel.scaled_fp8_blockwise(w, weight_block_size=[block, block])
    assert q.dtype == torch.float8_e4m3fn and q.shape == w.shape
    assert torch.equal(q.view(torch.uint8), want_q.view(torch.uint8))
    assert torch.equal(s.view(torch.int32), want_s.squeeze(-1).view(torch.int32))
    assert rlpt.sync.audit_fp8_blockwise(w, q, s, block)["ok"]


def test_golden_audit_and_errors():
    sys.path.insert(0, str(ROOT / "tools" / "golden"))
    import rlpt_golden
    g, _ = rlpt_golden.read(ROOT / "tests" / "data" / "golden" / "sync" / "verl_fp8.bin")
    for k in range(3):
        w = torch.from_numpy(g[f"case{k}.weight"])
        if g[f"case{k}.bf16"][0]:
            w = w.to(torch.bfloat16)
        block = int(g[f"case{k}.block"][0])
        q, s = rlpt.sync.quantize_fp8_blockwise(w, block)
        assert torch.equal(q.view(torch.uint8), torch.from_numpy(g[f"case{k}.q"]))
        assert torch.equal(s, torch.from_numpy(g[f"case{k}.scale_inv"]))
    bad = q.view(torch.uint8).clone()
    bad[3, 5] ^= 1
    a = rlpt.sync.audit_fp8_blockwise(w, bad, s, block)
    assert not a["ok"] and a["bad_codes"] == 1 and a["first"] == (3, 5)
    with pytest.raises(rlpt.Error) as e:
        rlpt.sync.quantize_fp8_blockwise(torch.zeros(4, 4, dtype=torch.int32))
    assert e.value.id == "rlpt.python.dtype"
    with pytest.raises(rlpt.Error) as e:
        rlpt.sync.quantize_fp8_blockwise(torch.zeros(4))
    assert e.value.id == "rlpt.python.shape"
    nan = torch.zeros(4, 4)
    nan[1, 2] = float("nan")
    with pytest.raises(rlpt.Error) as e:
        rlpt.sync.quantize_fp8_blockwise(nan, 2)
    assert e.value.id == "rlpt.sync.nonfinite" and "[1, 2]" in e.value.message
    with pytest.raises(rlpt.Error) as e:
        rlpt.sync.quantize_fp8_blockwise(torch.zeros(4, 4), 0)
    assert e.value.id == "rlpt.sync.bad_shape"
