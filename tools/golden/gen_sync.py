"""Golden data for weight sync: safetensors files written by Hugging Face's own `safetensors`
package, its verdicts on malformed files, and (when the C++ runner is built) its reading of
files that rlpt wrote.

    .venv/bin/python tools/golden/gen.py sync

Writes into tests/data/golden/sync/:
  py_<case>.safetensors   files from safetensors.torch.save_file (rlpt must read them, and
                          rlpt's writer must reproduce them byte for byte)
  py_cases.bin            per case and tensor: raw bytes (u8) and values as f64, as torch sees them
  py_malformed.bin        crafted bad files and whether safetensors (Python) accepts each
  py_reads_rlpt.bin       files written by rlpt (bench/sync runner `write-golden`), the bytes,
                          and what safetensors (Python) read back from them (only when the
                          runner exists: build/sync/bench/sync/bench_sync_runner)
  verl_fp8.bin            verl's scaled_fp8_blockwise (its PyTorch path, the one that runs without
                          a GPU) on bf16 and fp32 weights: the E4M3 codes and the scale_inv per
                          block; and torch's float -> float8_e4m3fn conversion over a sweep
"""
import json
import os
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
import safetensors
import safetensors.torch
from safetensors import safe_open

import peers
import rlpt_golden

ROOT = Path(__file__).resolve().parents[2]


def _cases(seed: int) -> dict[str, tuple[dict[str, torch.Tensor], dict | None]]:
    g = torch.Generator().manual_seed(seed)

    def normal(*shape, dtype=torch.float32):
        return torch.randn(shape, generator=g, dtype=torch.float64).to(dtype)

    def ints(lo, hi, *shape, dtype):
        return torch.randint(lo, hi, shape, generator=g, dtype=torch.int64).to(dtype)

    every_dtype = {
        "w.bf16": normal(4, 8, dtype=torch.bfloat16),
        "w.f16": normal(3, 5, dtype=torch.float16),
        "w.f32": normal(2, 3, 4),
        "w.f64": normal(7),
        "i.i64": ints(-2**40, 2**40, 5, dtype=torch.int64),
        "i.i32": ints(-2**30, 2**30, 2, 2, dtype=torch.int32),
        "i.i16": ints(-2**15, 2**15, 6, dtype=torch.int16),
        "i.i8": ints(-128, 128, 9, dtype=torch.int8),
        "i.u8": ints(0, 256, 3, 3, dtype=torch.uint8),
        "m.bool": ints(0, 2, 11, dtype=torch.bool),
        "q.f8e4m3": normal(4, 4).clamp(-400, 400).to(torch.float8_e4m3fn),
        "q.f8e5m2": normal(5).to(torch.float8_e5m2),
    }
    awkward = {
        "scalar": normal(dtype=torch.float32).reshape(()),
        "empty": torch.zeros(0, 3, dtype=torch.bfloat16),
        "unicode.ünï✓": normal(2, dtype=torch.float16),
        'quote"and\\backslash': normal(3),
        "ctrl\ttab\nnewline": normal(1, dtype=torch.float64),
        "a": normal(1),
        "B": normal(1),
        "aa": normal(1),
    }
    # A small "model": what a weight sync carries (bf16 weights, fp32 norms).
    model = {}
    for layer in range(2):
        p = f"model.layers.{layer}."
        model[p + "self_attn.q_proj.weight"] = normal(16, 8, dtype=torch.bfloat16)
        model[p + "self_attn.k_proj.weight"] = normal(8, 8, dtype=torch.bfloat16)
        model[p + "self_attn.v_proj.weight"] = normal(8, 8, dtype=torch.bfloat16)
        model[p + "mlp.gate_proj.weight"] = normal(24, 8, dtype=torch.bfloat16)
        model[p + "mlp.up_proj.weight"] = normal(24, 8, dtype=torch.bfloat16)
        model[p + "input_layernorm.weight"] = normal(8)
    model["model.embed_tokens.weight"] = normal(32, 8, dtype=torch.bfloat16)
    return {
        "every_dtype": (every_dtype, {"format": "pt"}),
        "awkward_names": (awkward, None),
        "model": (model, {"format": "pt"}),
    }


def _tensor_bytes(t: torch.Tensor) -> np.ndarray:
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().copy() if t.numel() else np.zeros(0, np.uint8)


def _values(t: torch.Tensor) -> np.ndarray:
    if t.dtype in (torch.float8_e4m3fn, torch.float8_e5m2, torch.bfloat16, torch.float16, torch.float32, torch.float64):
        return t.to(torch.float64).reshape(-1).numpy()
    return t.to(torch.int64).reshape(-1).numpy().astype(np.float64) if t.dtype != torch.bool else t.reshape(-1).numpy().astype(np.float64)


def _python_accepts(data: bytes) -> tuple[bool, str]:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "x.safetensors"
        path.write_bytes(data)
        try:
            safetensors.torch.load_file(str(path))
            return True, ""
        except Exception as e:  # noqa: BLE001 - the verdict is what we record
            return False, f"{type(e).__name__}: {e}"[:200]


def _header(obj, pad=True) -> bytes:
    text = json.dumps(obj, separators=(",", ":")).encode()
    if pad:
        text += b" " * ((8 - len(text) % 8) % 8)
    return struct.pack("<Q", len(text)) + text


def _malformed() -> list[tuple[str, bytes]]:
    good = {"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}
    data = b"\x00" * 8
    cases = [
        ("valid", _header(good) + data),
        ("short_file", b"\x08\x00\x00"),
        ("header_too_long", struct.pack("<Q", 1000) + b"{}"),
        ("header_over_limit", struct.pack("<Q", 100_000_001) + b"{}"),
        ("not_json", struct.pack("<Q", 8) + b"{notjson"),
        ("not_object", _header([1, 2])),
        ("trailing_bytes", _header(good) + data + b"\x00"),
        ("missing_bytes", _header(good) + data[:4]),
        ("gap", _header({"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}) + data),
        ("overlap", _header({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                             "b": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}) + data),
        ("size_mismatch", _header({"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}) + data),
        ("unknown_dtype", _header({"a": {"dtype": "F31", "shape": [2], "data_offsets": [0, 8]}}) + data),
        ("negative_dim", _header({"a": {"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}}) + data),
        ("float_dim", _header({"a": {"dtype": "F32", "shape": [2.0], "data_offsets": [0, 8]}}) + data),
        ("offsets_reversed", _header({"a": {"dtype": "F32", "shape": [0], "data_offsets": [8, 0]}}) + data),
        ("metadata_not_str", _header({"__metadata__": {"k": 1}, **good}) + data),
        ("missing_shape", _header({"a": {"dtype": "F32", "data_offsets": [0, 8]}}) + data),
        ("invalid_utf8", struct.pack("<Q", 56) + b'{"\xff":{"dtype":"F32","shape":[0],"data_offsets":[0,0]}}'.ljust(56)),
        ("duplicate_key_json", struct.pack("<Q", 112) + (b'{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},'
                                                           b'"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}'
                                                           ).ljust(112) + data),
        ("empty_header_object", _header({})),
        ("metadata_only", _header({"__metadata__": {"format": "pt"}})),
    ]
    return cases


def _rlpt_files(out_dir: Path, seed: int) -> dict | None:
    """Has rlpt's runner write files, then reads them with safetensors (Python)."""
    runner = Path(os.environ.get("RLPT_SYNC_RUNNER", ROOT / "build/sync/bench/sync/bench_sync_runner"))
    if not runner.exists():
        print(f"gen_sync: {runner} not built; py_reads_rlpt.bin left as it is", file=sys.stderr)
        return None
    with tempfile.TemporaryDirectory() as tmp:
        proc = subprocess.run([str(runner), "write-golden", tmp, str(seed)], capture_output=True, text=True, check=True)
        written = json.loads(proc.stdout.strip().splitlines()[-1])
        arrays, results = {}, {}
        for k, name in enumerate(written["files"]):  # the order rlpt wrote them (the C++ test relies on it)
            path = Path(tmp) / name
            raw = path.read_bytes()
            arrays[f"file{k}.bytes"] = np.frombuffer(raw, np.uint8)
            loaded = safetensors.torch.load_file(str(path))
            with safe_open(str(path), framework="pt") as f:
                meta = f.metadata() or {}
            results[name] = {
                "tensors": {n: {"dtype": str(t.dtype), "shape": list(t.shape)} for n, t in sorted(loaded.items())},
                "metadata_keys": sorted(meta),
                "index": k,
            }
            for n, t in sorted(loaded.items()):
                arrays[f"file{k}.{n}.bytes"] = _tensor_bytes(t)
        return {"arrays": arrays, "results": results}


def _verl_fp8(seed: int) -> tuple[dict, dict]:
    os.environ["VERL_DISABLE_TRITON_FP8"] = "1"  # the PyTorch path (read when the module is imported)
    from verl.utils.kernel.fp8_kernel import scaled_fp8_blockwise

    rng = np.random.default_rng(seed + 31)
    arrays = {}
    cases = []
    w1 = torch.from_numpy(rng.normal(0.0, 0.02, (256, 384)).astype(np.float32))
    w1[5, 7] = 0.9  # an outlier sets one block's scale
    w2 = torch.from_numpy(rng.normal(0.0, 1.0, (200, 300)).astype(np.float32))
    w2[:128, 128:256] = 0.0  # an all-zero block: scale 1
    w2[128:, :128] *= 1e-30  # tiny values: a large scale
    w3 = torch.from_numpy(rng.standard_t(2.0, (96, 80)).astype(np.float32))
    for k, (w, dtype, block) in enumerate([(w1, torch.bfloat16, 128), (w2, torch.bfloat16, 128),
                                           (w3, torch.float32, 32)]):
        w = w.to(dtype)
        q, scale = scaled_fp8_blockwise(w, weight_block_size=[block, block])
        arrays[f"case{k}.weight"] = w.to(torch.float32).numpy()  # bf16 values are exact in fp32
        arrays[f"case{k}.bf16"] = np.array([1 if dtype == torch.bfloat16 else 0], np.uint8)
        arrays[f"case{k}.q"] = q.view(torch.uint8).numpy()
        arrays[f"case{k}.scale_inv"] = scale.squeeze(-1).numpy()  # as verl's fp8_utils ships it
        arrays[f"case{k}.block"] = np.array([block], np.int64)
        cases.append({"shape": list(w.shape), "dtype": str(dtype), "block": block})
    codes = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).to(torch.float32)
    finite = codes[torch.isfinite(codes)].unique()
    mids = (finite[1:] + finite[:-1]) / 2
    sweep = torch.cat([finite, mids, torch.nextafter(mids, torch.tensor(np.inf)), torch.nextafter(mids, -torch.tensor(np.inf)),
                       torch.tensor([448.0, 450.0, 463.9, 464.0, 464.1, 479.9, 480.0, 1e6, np.inf, -np.inf, np.nan,
                                     2.0 ** -10, 2.0 ** -11, 3 * 2.0 ** -11, 1e-30, -0.0]),
                       torch.from_numpy(rng.normal(0.0, 100.0, 4000).astype(np.float32)),
                       torch.from_numpy(np.exp(rng.uniform(-16.0, 6.2, 4000)).astype(np.float32))])
    arrays["sweep.x"] = sweep.numpy()
    arrays["sweep.code"] = sweep.to(torch.float8_e4m3fn).view(torch.uint8).numpy()
    return arrays, peers.meta("gen_sync.fp8", seed, cases=cases,
                              reference="verl.utils.kernel.fp8_kernel.scaled_fp8_blockwise (VERL_DISABLE_TRITON_FP8=1: "
                                        "its PyTorch path), scale squeezed as verl.utils.fp8_utils ships it; "
                                        "torch .to(torch.float8_e4m3fn) for the sweep")


def generate(out_dir: Path, seed: int) -> None:
    rlpt_golden.write(out_dir / "verl_fp8.bin", *_verl_fp8(seed))
    arrays = {}
    listing = {}
    for case, (tensors, metadata) in _cases(seed).items():
        path = out_dir / f"py_{case}.safetensors"
        safetensors.torch.save_file(tensors, str(path), metadata=metadata)
        listing[case] = {"file": path.name, "metadata": metadata, "tensors": sorted(tensors)}
        for k, name in enumerate(sorted(tensors)):
            t = tensors[name]
            arrays[f"{case}.{k}.bytes"] = _tensor_bytes(t)
            arrays[f"{case}.{k}.values"] = _values(t)
            arrays[f"{case}.{k}.shape"] = np.array(list(t.shape), np.int64)
            arrays[f"{case}.{k}.name"] = np.frombuffer(name.encode("utf-8"), np.uint8)
    rlpt_golden.write(out_dir / "py_cases.bin", arrays,
                      peers.meta("gen_sync.cases", seed, cases=listing,
                                 writer="safetensors.torch.save_file"))

    mal = {}
    verdicts = {}
    for k, (name, data) in enumerate(_malformed()):
        ok, why = _python_accepts(data)
        mal[f"case{k}.bytes"] = np.frombuffer(data, np.uint8)
        mal[f"case{k}.python_accepts"] = np.array([1 if ok else 0], np.uint8)
        verdicts[name] = {"index": k, "python_accepts": ok, "python_error": why}
    rlpt_golden.write(out_dir / "py_malformed.bin", mal,
                      peers.meta("gen_sync.malformed", seed, cases=verdicts, reader="safetensors.torch.load_file"))

    checked = _rlpt_files(out_dir, seed)
    if checked is not None:
        rlpt_golden.write(out_dir / "py_reads_rlpt.bin", checked["arrays"],
                          peers.meta("gen_sync.reads_rlpt", seed, files=checked["results"],
                                     reader="safetensors.torch.load_file + safe_open().metadata()"))
