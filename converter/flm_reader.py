"""Reads `.flm` files (docs/flm_format.md, versions 1 to 3) with numpy only.

    meta, tensors = read_flm("model.flm")
    dtype, shape, data = tensors["token_embd.weight"]

`load_flm` returns an FlmFile with the same two dicts plus the layout (version, data_offset,
each tensor's offset and size), for tools such as `fastllm info`.

Metadata values: i64 -> int, f64 -> float, string -> str, i64 array -> np.ndarray[int64],
f32 array -> np.ndarray[float32], string array -> list[str].
Tensor data is a read-only view into an np.memmap of the file (no copy): f32 -> float32,
f16 -> float16, bf16 -> uint16 bit patterns (see `bf16_to_f32`).

Every field is checked against the file size; a malformed file raises ValueError saying what is
wrong and where.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from . import quantize

MAGIC = b"FASTLLM\0"
SUPPORTED_VERSIONS = (1, 2, 3)  # 1 differs only in the layout of quantized tensors, which it may not hold here
ALIGNMENT = 64
HEADER_SIZE = 40
MAX_DIMS = 4

QUANT_CODES = {code: name for name, (code, *_rest) in quantize.QUANT.items()}

# dtype code -> (name, bytes per element, numpy dtype of the returned view)
DTYPES = {
    0: ("f32", 4, np.dtype("<f4")),
    1: ("f16", 2, np.dtype("<f2")),
    2: ("bf16", 2, np.dtype("<u2")),
}
META_TYPE_NAMES = {1: "i64", 2: "f64", 3: "string", 4: "i64 array", 5: "f32 array",
                   6: "string array"}

_U64_MAX = (1 << 64) - 1


class FlmTensor(NamedTuple):
    dtype: str          # "f32", "f16", "bf16", or a quantized type ("q8", "q4", ...: data is the raw bytes)
    shape: tuple        # outermost first
    data: np.ndarray    # read-only view of the file's bytes, of `shape`


@dataclass
class TensorLocation:
    offset: int         # relative to data_offset
    n_bytes: int


@dataclass
class FlmFile:
    path: str
    version: int
    file_size: int
    data_offset: int
    metadata: dict = field(default_factory=dict)
    meta_types: dict = field(default_factory=dict)      # key -> type name ("i64", ...)
    tensors: dict = field(default_factory=dict)         # name -> FlmTensor
    locations: dict = field(default_factory=dict)       # name -> TensorLocation


bf16_to_f32 = quantize.bf16_to_f32  # bf16 bit patterns -> float32 values (exact)


class _Cursor:
    def __init__(self, buf, size: int, path: str):
        self.buf = buf
        self.size = size
        self.pos = 0
        self.path = path
        self.limit = "the end of the file"

    def need(self, n: int, what: str) -> None:
        if n < 0 or self.pos + n > self.size:
            raise ValueError(f"{self.path}: {what} at offset {self.pos} needs {n} bytes, past "
                             f"{self.limit} ({self.size})")

    def unpack(self, fmt: str, what: str):
        n = struct.calcsize(fmt)
        self.need(n, what)
        vals = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += n
        return vals

    def u32(self, what: str) -> int:
        return self.unpack("<I", what)[0]

    def u64(self, what: str) -> int:
        return self.unpack("<Q", what)[0]

    def raw(self, n: int, what: str) -> bytes:
        self.need(n, what)
        b = bytes(self.buf[self.pos:self.pos + n])
        self.pos += n
        return b

    def string(self, what: str) -> str:
        start = self.pos
        n = self.u64(f"{what} length")
        if n > self.size - self.pos:
            raise ValueError(f"{self.path}: {what} at offset {start}: length {n} runs past the "
                             f"end of the file")
        b = self.raw(n, what)
        try:
            return b.decode("utf-8")
        except UnicodeDecodeError as e:
            raise ValueError(f"{self.path}: {what} at offset {start} is not valid UTF-8: {e}") \
                from None

    def array(self, count: int, itemsize: int, dtype: str, what: str) -> np.ndarray:
        if count > (self.size - self.pos) // itemsize:
            raise ValueError(f"{self.path}: {what} at offset {self.pos}: {count} elements run past "
                             f"the end of the file")
        n = count * itemsize
        arr = np.frombuffer(self.raw(n, what), dtype=dtype).copy()
        return arr


def _read_meta_value(cur: _Cursor, key: str, type_code: int):
    what = f"metadata {key!r}"
    if type_code == 1:
        return cur.unpack("<q", what)[0]
    if type_code == 2:
        return cur.unpack("<d", what)[0]
    if type_code == 3:
        return cur.string(what)
    if type_code == 4:
        count = cur.u64(f"{what} count")
        return cur.array(count, 8, "<i8", what).astype(np.int64)
    if type_code == 5:
        count = cur.u64(f"{what} count")
        return cur.array(count, 4, "<f4", what).astype(np.float32)
    if type_code == 6:
        count = cur.u64(f"{what} count")
        # each string takes at least 8 bytes: reject absurd counts before looping
        if count > (cur.size - cur.pos) // 8:
            raise ValueError(f"{cur.path}: {what}: {count} strings run past the end of the file")
        return [cur.string(f"{what}[{i}]") for i in range(count)]
    raise ValueError(f"{cur.path}: {what}: unknown value type {type_code}")


def load_flm(path) -> FlmFile:
    path = os.fspath(path)
    size = os.path.getsize(path)
    if size < HEADER_SIZE:
        raise ValueError(f"{path}: not a .flm file: {size} bytes, shorter than the "
                         f"{HEADER_SIZE}-byte header")
    mm = np.memmap(path, dtype=np.uint8, mode="r")
    cur = _Cursor(mm, size, path)

    magic = cur.raw(8, "magic")
    if magic != MAGIC:
        raise ValueError(f"{path}: not a .flm file: bad magic {magic!r}")
    version, _reserved = cur.unpack("<II", "version")
    if version not in SUPPORTED_VERSIONS:
        raise ValueError(f"{path}: unsupported .flm version {version} (this reader knows "
                         f"{', '.join(map(str, SUPPORTED_VERSIONS))})")
    n_meta, n_tensors, data_offset = cur.unpack("<QQQ", "header")
    if data_offset % ALIGNMENT:
        raise ValueError(f"{path}: data_offset {data_offset} is not a multiple of {ALIGNMENT}")
    if data_offset > size:
        raise ValueError(f"{path}: data_offset {data_offset} is past the end of the file "
                         f"({size} bytes)")
    # every metadata entry needs >= 8+4 bytes, every table entry >= 8+4+4+8+8+8
    if n_meta > size // 12 or n_tensors > size // 40:
        raise ValueError(f"{path}: implausible counts n_meta={n_meta} n_tensors={n_tensors} for a "
                         f"file of {size} bytes")
    # the metadata and the table must end before the tensor data
    cur.size = data_offset
    cur.limit = "data_offset"

    f = FlmFile(path=path, version=version, file_size=size, data_offset=data_offset)
    for i in range(n_meta):
        key = cur.string(f"metadata key #{i}")
        type_code = cur.u32(f"metadata {key!r} type")
        if type_code not in META_TYPE_NAMES:
            raise ValueError(f"{path}: metadata {key!r}: unknown value type {type_code}")
        value = _read_meta_value(cur, key, type_code)
        if key in f.metadata:
            raise ValueError(f"{path}: duplicate metadata key {key!r}")
        f.metadata[key] = value
        f.meta_types[key] = META_TYPE_NAMES[type_code]

    data_size = size - data_offset
    for i in range(n_tensors):
        name = cur.string(f"tensor name #{i}")
        what = f"tensor {name!r}"
        dtype_code, n_dims = cur.unpack("<II", f"{what} dtype")
        if dtype_code not in DTYPES and dtype_code not in QUANT_CODES:
            raise ValueError(f"{path}: {what}: unknown dtype {dtype_code}")
        if not 1 <= n_dims <= MAX_DIMS:
            raise ValueError(f"{path}: {what}: {n_dims} dims, must be 1..{MAX_DIMS}")
        dims = cur.unpack(f"<{n_dims}Q", f"{what} dims")
        offset, n_bytes = cur.unpack("<QQ", f"{what} offset")
        if any(d == 0 for d in dims):
            raise ValueError(f"{path}: {what}: zero dim in {dims}")
        if dtype_code in QUANT_CODES:  # quantized: the raw bytes (quantize.dequantize decodes them)
            dname, np_dtype = QUANT_CODES[dtype_code], np.dtype(np.uint8)
            if version < 2:
                raise ValueError(f"{path}: {what}: quantized in the .flm version 1 layout; convert the model again")
            if n_dims != 2 or dims[1] % quantize.row_multiple(dname):
                raise ValueError(f"{path}: {what}: {dname} needs a matrix with rows of a multiple of "
                                 f"{quantize.row_multiple(dname)}, got {list(dims)}")
            expected = quantize.tensor_bytes(dname, dims)
        else:
            dname, itemsize, np_dtype = DTYPES[dtype_code]
            expected = itemsize
            for d in dims:
                expected *= d
                if expected > _U64_MAX:
                    raise ValueError(f"{path}: {what}: dims {dims} overflow")
        if n_bytes != expected:
            raise ValueError(f"{path}: {what}: n_bytes {n_bytes} but {dname} {list(dims)} "
                             f"needs {expected}")
        if offset % ALIGNMENT:
            raise ValueError(f"{path}: {what}: offset {offset} is not a multiple of {ALIGNMENT}")
        if offset > data_size or n_bytes > data_size - offset:
            raise ValueError(f"{path}: {what}: bytes {data_offset + offset}..."
                             f"{data_offset + offset + n_bytes} run past the end of the file "
                             f"({size} bytes)")
        if name in f.tensors:
            raise ValueError(f"{path}: duplicate tensor {name!r}")
        start = data_offset + offset
        data = mm[start:start + n_bytes].view(np_dtype)
        if dname not in QUANT_CODES.values():
            data = data.reshape(dims)
        f.tensors[name] = FlmTensor(dname, tuple(int(d) for d in dims), data)
        f.locations[name] = TensorLocation(offset, n_bytes)

    prev_name, prev_end = None, 0
    for name, loc in sorted(f.locations.items(), key=lambda kv: kv[1].offset):
        if prev_name is not None and loc.offset < prev_end:
            raise ValueError(f"{path}: tensors {prev_name!r} and {name!r} overlap")
        prev_name, prev_end = name, loc.offset + loc.n_bytes
    return f


def read_flm(path) -> tuple[dict, dict]:
    """Returns (metadata, tensors) where tensors maps name -> (dtype, shape, data)."""
    f = load_flm(path)
    return f.metadata, f.tensors
