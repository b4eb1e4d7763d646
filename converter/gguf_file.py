"""A GGUF file's header, metadata and tensor table, read in one pass over the mapped file.

The gguf package's GGUFReader makes a numpy view for every element of every metadata array: it
took 3.1 s of a 1.1B conversion for TinyLlama's 32,000 tokens, scores and types (AMD EPYC,
2026-12-06). Here a numeric array is one np.frombuffer and a string array a loop over lengths;
strings stay bytes until a value is asked for, so that a bad one is reported by its key. Tensor
data stay in the mapping, typed as GGUFReader types them (float arrays for F32/F16/F64 and the
integer types, the blocks' bytes otherwise); the gguf package still names the types and
dequantizes. Damage it recognises raises GgufFormatError with what and where (GgufModel makes
anything else the bytes provoke a ConversionError too).
"""
from __future__ import annotations

import struct
from typing import Any, NamedTuple

import numpy as np

GGUF_MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 8  # ggml has 4; a table entry with more is damage, not a model
MAX_NESTING = 8  # arrays of arrays: no model has any; a deep chain of them is damage

# GGUF value types: the scalars as (struct code, numpy dtype code), and the two composite ones
_SCALARS = {0: ("B", "u1"), 1: ("b", "i1"), 2: ("H", "u2"), 3: ("h", "i2"), 4: ("I", "u4"), 5: ("i", "i4"),
            6: ("f", "f4"), 7: ("?", "u1"), 10: ("Q", "u8"), 11: ("q", "i8"), 12: ("d", "f8")}
STRING, ARRAY, BOOL = 8, 9, 7
# tensor types whose data GGUFReader gives as typed values rather than block bytes
_TYPED = {0: "f4", 1: "f2", 24: "i1", 25: "i2", 26: "i4", 27: "i8", 28: "f8"}


class GgufFormatError(ValueError):
    pass


class Field:
    """A metadata value; types as GGUFReader lists them (the value type, then a non-empty array's
    element type, and so on inward)."""
    __slots__ = ("types", "_value")

    def __init__(self, types: list, value: Any):
        self.types, self._value = types, value

    def contents(self) -> Any:
        """As Python objects: str, int, float, bool, or a list of those (strings decoded here)."""
        return _decode(self._value)


def _decode(v):
    if isinstance(v, bytes):
        return v.decode("utf-8")
    if isinstance(v, list):
        return [_decode(x) for x in v]
    return v


class Tensor(NamedTuple):
    name: str
    tensor_type: Any      # gguf.GGMLQuantizationType
    shape: tuple          # GGUF's ne: innermost first
    n_elements: int
    n_bytes: int
    data: np.ndarray


class GgufFile:
    def __init__(self, path, gguf_module):
        try:
            self.map = np.memmap(path, dtype=np.uint8, mode="r")
        except ValueError as e:  # an empty file cannot be mapped
            raise GgufFormatError(str(e)) from None
        self._buf = memoryview(self.map)
        self._pos = 0
        if bytes(self._take(4)) != GGUF_MAGIC:
            raise GgufFormatError("bad magic")
        version = struct.unpack_from("<I", self._buf, 4)[0] if len(self._buf) >= 8 else None
        self._order = "<"
        if version is not None and version & 0xFFFF == 0 and version >> 16:  # written big-endian
            self._order = ">"
        self.little_endian = self._order == "<"  # the file's byte order
        self.version = self._scalar(4)
        if self.version not in (2, 3):
            raise GgufFormatError(f"GGUF version {self.version} is not supported (2 and 3 are)")
        n_tensors, n_kv = self._scalar(10), self._scalar(10)
        self.fields: dict[str, Field] = {}
        for _ in range(n_kv):
            key = self._string().decode("utf-8", errors="replace")
            if key in self.fields:
                raise GgufFormatError(f"metadata key {key!r} appears twice")
            t = self._scalar(4)
            types: list = []
            value = self._value(t, types)
            self.fields[key] = Field([gguf_module.GGUFValueType(x) for x in types], value)
        if n_tensors > len(self._buf) // 24:  # a table entry takes at least 24 bytes
            raise GgufFormatError(f"{n_tensors} tensors do not fit in the file")
        infos = []
        for _ in range(n_tensors):
            name = self._string().decode("utf-8", errors="replace")
            n_dims = self._scalar(4)
            if not 1 <= n_dims <= MAX_DIMS:
                raise GgufFormatError(f"tensor {name!r} has {n_dims} dimensions")
            dims = tuple(self._scalar(10) for _ in range(n_dims))
            infos.append((name, dims, self._scalar(4), self._scalar(10)))
        align = self.fields["general.alignment"]._value if "general.alignment" in self.fields else DEFAULT_ALIGNMENT
        if not isinstance(align, int) or isinstance(align, bool) or align <= 0 or align & (align - 1):
            raise GgufFormatError(f"general.alignment {align!r} is not a power of two")
        self.data_offset = -(-self._pos // align) * align
        self.tensors: list[Tensor] = []
        for name, dims, raw_type, offset in infos:
            try:
                qtype = gguf_module.GGMLQuantizationType(raw_type)
                block, type_size = gguf_module.GGML_QUANT_SIZES[qtype]
            except (ValueError, KeyError):
                raise GgufFormatError(f"tensor {name!r} has an unknown type {raw_type}") from None
            n = int(np.prod(dims, dtype=object))
            if dims[0] % block:
                raise GgufFormatError(f"tensor {name!r}: {dims[0]} values a row are not whole blocks of {block}")
            n_bytes = n // block * type_size
            start = self.data_offset + offset
            if start + n_bytes > len(self._buf):
                raise GgufFormatError(f"tensor {name!r}: its data ({n_bytes} bytes at {start}) lie past the end "
                                      f"of the file ({len(self._buf)} bytes)")
            shape = tuple(reversed(dims))
            if raw_type in _TYPED:
                data = np.frombuffer(self.map, self._order + _TYPED[raw_type], n, start).reshape(shape)
            else:
                data = np.frombuffer(self.map, np.uint8, n_bytes, start).reshape(shape[:-1] + (shape[-1] // block * type_size,))
            self.tensors.append(Tensor(name, qtype, dims, n, n_bytes, data))

    def _take(self, n: int) -> memoryview:
        end = self._pos + n
        if n < 0 or end > len(self._buf):
            raise GgufFormatError(f"truncated: {n} bytes wanted at {self._pos}, the file has {len(self._buf)}")
        view = self._buf[self._pos:end]
        self._pos = end
        return view

    def _scalar(self, t: int):
        code, _ = _SCALARS[t]
        size = struct.calcsize(code)
        v = struct.unpack_from(self._order + code, self._take(size))[0]
        return v

    def _string(self) -> bytes:
        return bytes(self._take(self._scalar(10)))

    def _value(self, t: int, types: list, depth: int = 0):
        types.append(t)
        if t in _SCALARS:
            return self._scalar(t)
        if t == STRING:
            return self._string()
        if t != ARRAY:
            raise GgufFormatError(f"unknown metadata value type {t} at {self._pos - 4}")
        item, n = self._scalar(4), self._scalar(10)
        if n:  # (GGUFReader names no element type for an empty array)
            types.append(item)
        if item in _SCALARS:
            dtype = np.dtype(self._order + _SCALARS[item][1])
            values = np.frombuffer(self._take(n * dtype.itemsize), dtype, n)
            return (values != 0).tolist() if item == BOOL else values.tolist()
        if n > (len(self._buf) - self._pos) // 8:  # every string or array takes at least 8 bytes
            raise GgufFormatError(f"an array of {n} values does not fit in the file")
        if item == STRING:
            return [self._string() for _ in range(n)]
        if item != ARRAY:
            raise GgufFormatError(f"unknown array element type {item} at {self._pos - 12}")
        if depth >= MAX_NESTING:
            raise GgufFormatError(f"arrays nested deeper than {MAX_NESTING} at {self._pos}")
        sub: list = []  # the first element's types after its ARRAY, as GGUFReader lists them
        out = [self._value(item, sub if i == 0 else [], depth + 1) for i in range(n)]
        types += sub[1:]
        return out
