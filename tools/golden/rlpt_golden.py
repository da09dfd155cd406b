"""Writer and reader of rlpt golden-vector files (format RLPTGLD1, little-endian).

    magic    8 bytes  b"RLPTGLD1"
    u32      number of arrays
    per array:
      u16    name length, then the name (UTF-8)
      u8     dtype code: 0=f32 1=f64 2=i32 3=i64 4=u8
      u8     ndim, then ndim x u64 dims
      data   prod(dims) elements, row-major
Metadata is a u8 array named "meta" holding UTF-8 JSON.

    python tools/golden/rlpt_golden.py FILE...     print the arrays and metadata of FILEs
    python tools/golden/rlpt_golden.py --selftest  round-trip self-test
"""
import json
import struct
import sys
from pathlib import Path

import numpy as np

MAGIC = b"RLPTGLD1"
META = "meta"
DTYPES = [np.dtype("<f4"), np.dtype("<f8"), np.dtype("<i4"), np.dtype("<i8"), np.dtype("u1")]  # index = code


def _as_numpy(name: str, value) -> np.ndarray:
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor):
        if value.dtype in (torch.float16, torch.bfloat16):
            raise TypeError(f"array {name!r}: {value.dtype} is not storable; cast it explicitly (e.g. .double())")
        value = value.detach().cpu().numpy()
    array = np.asarray(value)
    if array.dtype == np.bool_:
        return array.astype(np.uint8)
    if array.dtype == np.float16:
        raise TypeError(f"array {name!r}: float16 is not storable; cast it explicitly (e.g. .astype(np.float64))")
    for dtype in DTYPES:
        if array.dtype.kind == dtype.kind and array.dtype.itemsize == dtype.itemsize:
            return array.astype(dtype, copy=False)
    raise TypeError(f"array {name!r}: dtype {array.dtype} is not one of f32, f64, i32, i64, u8 (or bool)")


def _pack(name: str, array: np.ndarray) -> bytes:
    encoded = name.encode("utf-8")
    if not encoded or len(encoded) > 0xFFFF:
        raise ValueError(f"array name {name!r} must be 1..65535 UTF-8 bytes")
    if array.ndim > 0xFF:
        raise ValueError(f"array {name!r}: ndim {array.ndim} exceeds 255")
    code = next(i for i, dtype in enumerate(DTYPES) if array.dtype == dtype)
    header = struct.pack(f"<H{len(encoded)}sBB{array.ndim}Q", len(encoded), encoded, code, array.ndim, *array.shape)
    return header + np.ascontiguousarray(array).tobytes()


def write(path, arrays: dict, meta: dict) -> None:
    """Write `arrays` (numpy arrays or torch tensors; bool is stored as u8) and the JSON-able `meta` to `path`."""
    if META in arrays:
        raise ValueError(f"array name {META!r} is reserved for the metadata")
    meta_bytes = json.dumps(meta, sort_keys=True, ensure_ascii=False).encode("utf-8")
    items = {META: np.frombuffer(meta_bytes, dtype=np.uint8)}
    items.update((name, _as_numpy(name, value)) for name, value in arrays.items())
    body = b"".join(_pack(name, array) for name, array in items.items())
    Path(path).write_bytes(MAGIC + struct.pack("<I", len(items)) + body)


def read(path) -> tuple[dict[str, np.ndarray], dict]:
    """Read a golden file: returns ({name: array}, meta) with the metadata array removed from the dict."""
    data = Path(path).read_bytes()
    if data[:8] != MAGIC:
        raise ValueError(f"{path}: not an RLPTGLD1 file")
    (count,), offset = struct.unpack_from("<I", data, 8), 12
    arrays = {}
    for _ in range(count):
        (name_len,) = struct.unpack_from("<H", data, offset)
        name = data[offset + 2:offset + 2 + name_len].decode("utf-8")
        code, ndim = struct.unpack_from("<BB", data, offset + 2 + name_len)
        offset += 4 + name_len
        if code >= len(DTYPES):
            raise ValueError(f"{path}: array {name!r} has unknown dtype code {code}")
        if name in arrays:
            raise ValueError(f"{path}: duplicate array {name!r}")
        dims = struct.unpack_from(f"<{ndim}Q", data, offset)
        offset += 8 * ndim
        size = int(np.prod(dims, dtype=np.int64)) * DTYPES[code].itemsize
        if offset + size > len(data):
            raise ValueError(f"{path}: array {name!r} runs past the end of the file")
        arrays[name] = np.frombuffer(data, DTYPES[code], size // DTYPES[code].itemsize, offset).reshape(dims).copy()
        offset += size
    if offset != len(data):
        raise ValueError(f"{path}: {len(data) - offset} trailing bytes")
    if META not in arrays:
        raise ValueError(f"{path}: no {META!r} array")
    return arrays, json.loads(arrays.pop(META).tobytes().decode("utf-8"))


def _selftest() -> None:
    import tempfile

    rng = np.random.default_rng(0)
    arrays = {
        "f32": rng.standard_normal((3, 4)).astype(np.float32),
        "f64_strided": rng.standard_normal((5, 6))[::2, ::-1],
        "i32_big_endian": np.arange(7, dtype=">i4"),
        "i64_scalar": np.array(-(2**40), dtype=np.int64),
        "u8_empty": np.zeros((2, 0, 3), dtype=np.uint8),
        "bool": np.array([True, False, True]),
        "ünï": np.array([1.5]),
    }
    meta = {"generator": "selftest", "seed": 0, "note": "héllo"}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "t.bin"
        write(path, {"a": np.array([1, -2], np.int32)}, {})
        assert path.read_bytes() == (b"RLPTGLD1" b"\2\0\0\0"
                                     b"\4\0meta" b"\4\1" b"\2\0\0\0\0\0\0\0" b"{}"
                                     b"\1\0a" b"\2\1" b"\2\0\0\0\0\0\0\0" b"\1\0\0\0" b"\xfe\xff\xff\xff")

        write(path, arrays, meta)
        got, got_meta = read(path)
        assert got_meta == meta and list(got) == list(arrays)
        for name, want in arrays.items():
            assert got[name].shape == want.shape and np.array_equal(got[name], want), name
        assert got["bool"].dtype == np.uint8 and got["i32_big_endian"].dtype == np.dtype("<i4")

        for bad in ({"x": np.zeros(2, np.float16)}, {"x": np.zeros(2, np.complex64)}, {"x": np.zeros(2, np.uint16)},
                    {META: np.zeros(1)}, {"": np.zeros(1)}):
            try:
                write(path, bad, {})
            except (TypeError, ValueError):
                continue
            raise AssertionError(f"write accepted {bad}")

        try:
            import torch
        except ImportError:
            print("selftest: torch not installed, tensor conversion not tested")
        else:
            tensors = {"t_f32": torch.arange(6, dtype=torch.float32).reshape(2, 3).t(), "t_bool": torch.tensor([True])}
            write(path, tensors, meta)
            got, _ = read(path)
            assert np.array_equal(got["t_f32"], tensors["t_f32"].numpy()) and got["t_bool"].tolist() == [1]
            for dtype in (torch.float16, torch.bfloat16):
                try:
                    write(path, {"x": torch.zeros(1, dtype=dtype)}, {})
                except TypeError:
                    continue
                raise AssertionError(f"write accepted {dtype}")

        path.write_bytes(path.read_bytes() + b"\0")
        try:
            read(path)
        except ValueError:
            pass
        else:
            raise AssertionError("read accepted trailing bytes")
    print("rlpt_golden selftest: ok")


def _dump(path: str) -> None:
    arrays, meta = read(path)
    print(f"{path}\n  meta: {json.dumps(meta, sort_keys=True)}")
    for name, array in arrays.items():
        print(f"  {name}: {array.dtype.name}{list(array.shape)}")


if __name__ == "__main__":
    if sys.argv[1:] == ["--selftest"]:
        _selftest()
    elif sys.argv[1:] and not sys.argv[1].startswith("-"):
        for file in sys.argv[1:]:
            _dump(file)
    else:
        sys.exit(__doc__)
