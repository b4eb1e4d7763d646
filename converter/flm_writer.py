"""Writes `.flm` files (docs/flm_format.md, version 3).

Usage:

    w = FlmWriter("model.flm")
    w.add_string("general.architecture", "llama")
    w.add_i64("llama.num_layers", 2)
    w.add_tensor("token_embd.weight", "f16", (512, 64), lambda: embedding_as_float16_array)
    w.write(progress=True)

Tensors are declared with their name, dtype and shape plus a function that produces the data
when it is needed: `write` lays out the header, metadata and tensor table from the declarations
alone, then calls the producers one after another and streams each result to the file, so only
one tensor's data is in memory at a time.

The file is written to a temporary file in the destination folder and moved over the
destination with `os.replace` only once it is complete; on any exception (KeyboardInterrupt
included) the temporary file is removed and the destination is left untouched.

This module depends on numpy only. bf16 data is passed as uint16 (or int16) arrays holding the
raw bfloat16 bit patterns, since numpy has no bfloat16 type.
"""

from __future__ import annotations

import os
import struct
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

import numpy as np

from . import quantize

MAGIC = b"FASTLLM\0"
VERSION = 3  # 3: families besides llama, and keys a version-2 reader would ignore and so misread
# (rope.dim, rope.long_inv_freq, sliding windows, q/k norms); 2: quantized rows in tiles of 16
ALIGNMENT = 64
HEADER_SIZE = 40

# metadata value types
META_I64 = 1
META_F64 = 2
META_STRING = 3
META_I64_ARRAY = 4
META_F32_ARRAY = 5
META_STRING_ARRAY = 6

# plain tensor dtypes: name -> (code, bytes per element, accepted numpy dtypes); the quantized
# ones (q8, q4, ...) are in quantize.QUANT and are always produced from float32 data.
DTYPES = {
    "f32": (0, 4, (np.dtype(np.float32),)),
    "f16": (1, 2, (np.dtype(np.float16),)),
    "bf16": (2, 2, (np.dtype(np.uint16), np.dtype(np.int16))),
}


def dtype_code(dtype: str) -> int:
    return DTYPES[dtype][0] if dtype in DTYPES else quantize.QUANT[dtype][0]


def f32_to_bf16_bits(a: np.ndarray) -> np.ndarray:
    """Round to nearest even, as torch does."""
    bits = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
MAX_DIMS = 4

_I64_MIN = -(1 << 63)
_I64_MAX = (1 << 63) - 1
_U64_MAX = (1 << 64) - 1


def align_up(n: int, alignment: int = ALIGNMENT) -> int:
    return (n + alignment - 1) // alignment * alignment


def _encode_string(s: str) -> bytes:
    if not isinstance(s, str):
        raise TypeError(f"expected a str, got {type(s).__name__}")
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


def _check_i64(key: str, v) -> int:
    if isinstance(v, (bool, np.bool_)):
        v = int(v)
    if not isinstance(v, (int, np.integer)):
        raise TypeError(f"metadata {key!r}: expected an integer, got {type(v).__name__}")
    v = int(v)
    if not _I64_MIN <= v <= _I64_MAX:
        raise ValueError(f"metadata {key!r}: {v} does not fit in an i64")
    return v


@dataclass
class _TensorDecl:
    name: str
    dtype: str
    shape: tuple
    produce: Callable[[], np.ndarray]
    n_bytes: int
    offset: int = 0  # relative to data_offset, set by _layout


# The header's file kind (the u32 after the version; 0 in files written before adapters).
KIND_MODEL = 0
KIND_ADAPTER = 1


class FlmWriter:
    """Collects metadata and tensor declarations, then writes the file in `write()`."""

    def __init__(self, path, dtype_policy: Callable[[str, tuple], str] | None = None, kind: int = 0):
        """dtype_policy(name, shape) -> dtype, when given, decides every tensor's dtype (see
        quantize.DtypePolicy); producers may then return float32 data for any dtype. kind: the
        header's file kind (KIND_MODEL, or KIND_ADAPTER for a LoRA adapter: lora.py)."""
        self.path = os.fspath(path)
        self.dtype_policy = dtype_policy
        self.kind = kind
        self._meta: list[bytes] = []
        self._keys: set[str] = set()
        self._tensors: list[_TensorDecl] = []
        self._names: set[str] = set()
        self._scratch: list = [None, None]  # converted bytes of the tensor being written, and the next

    # ---- metadata -------------------------------------------------------------------------

    def _add_meta(self, key: str, type_code: int, payload: bytes) -> None:
        if not isinstance(key, str) or not key:
            raise ValueError(f"metadata key must be a non-empty str, got {key!r}")
        if key in self._keys:
            raise ValueError(f"duplicate metadata key {key!r}")
        self._keys.add(key)
        self._meta.append(_encode_string(key) + struct.pack("<I", type_code) + payload)

    def add_i64(self, key: str, value: int) -> None:
        self._add_meta(key, META_I64, struct.pack("<q", _check_i64(key, value)))

    def add_f64(self, key: str, value: float) -> None:
        if not isinstance(value, (int, float, np.integer, np.floating)) or isinstance(value, bool):
            raise TypeError(f"metadata {key!r}: expected a number, got {type(value).__name__}")
        self._add_meta(key, META_F64, struct.pack("<d", float(value)))

    def add_string(self, key: str, value: str) -> None:
        if not isinstance(value, str):
            raise TypeError(f"metadata {key!r}: expected a str, got {type(value).__name__}")
        self._add_meta(key, META_STRING, _encode_string(value))

    def add_i64_array(self, key: str, values: Iterable[int]) -> None:
        ints = [_check_i64(key, v) for v in values]
        payload = struct.pack("<Q", len(ints)) + np.asarray(ints, dtype="<i8").tobytes()
        self._add_meta(key, META_I64_ARRAY, payload)

    def add_f32_array(self, key: str, values) -> None:
        arr = np.asarray(values)
        if arr.ndim != 1:
            raise ValueError(f"metadata {key!r}: expected a 1-D sequence, got shape {arr.shape}")
        if arr.size and arr.dtype.kind not in "fiu":
            raise TypeError(f"metadata {key!r}: expected numbers, got dtype {arr.dtype}")
        arr = arr.astype("<f4")
        self._add_meta(key, META_F32_ARRAY, struct.pack("<Q", arr.size) + arr.tobytes())

    def add_string_array(self, key: str, values: Sequence[str]) -> None:
        values = list(values)
        for i, v in enumerate(values):
            if not isinstance(v, str):
                raise TypeError(f"metadata {key!r}[{i}]: expected a str, got {type(v).__name__}")
        payload = struct.pack("<Q", len(values)) + b"".join(_encode_string(v) for v in values)
        self._add_meta(key, META_STRING_ARRAY, payload)

    # ---- tensors --------------------------------------------------------------------------

    def add_tensor(self, name: str, dtype: str, shape: Sequence[int],
                   produce: Callable[[], np.ndarray]) -> None:
        """Declares a tensor; `produce()` is called during `write()` and must return a numpy
        array of exactly `shape` with a numpy dtype matching `dtype` (f32: float32, f16: float16,
        bf16: uint16/int16 bit patterns)."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"tensor name must be a non-empty str, got {name!r}")
        if name in self._names:
            raise ValueError(f"duplicate tensor {name!r}")
        shape = tuple(int(d) for d in shape)
        if self.dtype_policy is not None:
            dtype = self.dtype_policy(name, shape)
        if dtype not in DTYPES and dtype not in quantize.QUANT:
            raise ValueError(f"tensor {name!r}: unknown dtype {dtype!r} "
                             f"(known: {', '.join([*DTYPES, *quantize.QUANT])})")
        if not 1 <= len(shape) <= MAX_DIMS:
            raise ValueError(f"tensor {name!r}: {len(shape)} dims, must be 1..{MAX_DIMS}")
        if any(d <= 0 for d in shape):
            raise ValueError(f"tensor {name!r}: every dim must be positive, got {shape}")
        if dtype in quantize.QUANT:
            if len(shape) != 2 or shape[1] % quantize.row_multiple(dtype):
                raise ValueError(f"tensor {name!r}: {dtype} needs a matrix with rows of a multiple of "
                                 f"{quantize.row_multiple(dtype)}, got {shape}")
            n_bytes = quantize.tensor_bytes(dtype, shape)
        else:
            n_bytes = DTYPES[dtype][1]
            for d in shape:
                n_bytes *= d
        if n_bytes > _U64_MAX:
            raise ValueError(f"tensor {name!r}: too large")
        if not callable(produce):
            raise TypeError(f"tensor {name!r}: produce must be callable")
        self._names.add(name)
        self._tensors.append(_TensorDecl(name, dtype, shape, produce, n_bytes))

    # ---- layout and output ----------------------------------------------------------------

    def _layout(self) -> tuple[bytes, int]:
        """Returns the bytes before the tensor data (header, metadata, table, padding) and
        sets each tensor's offset."""
        offset = 0
        for t in self._tensors:
            offset = align_up(offset)
            t.offset = offset
            offset += t.n_bytes
        table = []
        for t in self._tensors:
            table.append(
                _encode_string(t.name)
                + struct.pack("<II", dtype_code(t.dtype), len(t.shape))
                + struct.pack(f"<{len(t.shape)}Q", *t.shape)
                + struct.pack("<QQ", t.offset, t.n_bytes)
            )
        body = b"".join(self._meta) + b"".join(table)
        data_offset = align_up(HEADER_SIZE + len(body))
        header = MAGIC + struct.pack("<IIQQQ", VERSION, self.kind, len(self._meta), len(self._tensors),
                                     data_offset)
        assert len(header) == HEADER_SIZE
        prefix = header + body
        return prefix + b"\0" * (data_offset - len(prefix)), data_offset

    def _buffer(self, slot: int, n_bytes: int) -> np.ndarray:
        """n_bytes of buffer `slot` (0 or 1), kept for the whole file, for a tensor's converted
        bytes: one tensor is written while the next is made (write() alternates them), and fresh
        pages for every tensor took a fifth of an int8 conversion (1.1B shape)."""
        buf = self._scratch[slot]
        if buf is None or buf.size < n_bytes:
            self._scratch[slot] = None
            buf = self._scratch[slot] = np.empty(n_bytes, dtype=np.uint8)
        return buf[:n_bytes]

    def _check_data(self, t: _TensorDecl, arr, slot: int) -> np.ndarray:
        """The bytes of tensor t from its producer's data; converted bytes go in buffer `slot`."""
        if isinstance(arr, quantize.OnGrid):  # weights rounded by calibration, on their own grid
            if t.dtype not in quantize.QUANT or tuple(arr.weights.shape) != t.shape:
                raise ValueError(f"tensor {t.name!r}: weights on a grid need a quantized dtype and "
                                 f"shape {t.shape}, not {t.dtype} {tuple(arr.weights.shape)}")
            return quantize.quantize(arr.weights.astype(np.float32), t.dtype, arr.grid)
        if not isinstance(arr, (np.ndarray, quantize.RowBlocks)):
            raise TypeError(f"tensor {t.name!r}: producer returned {type(arr).__name__}, "
                            f"expected a numpy array")
        native = {np.dtype(np.float32): "f32", np.dtype(np.float16): "f16", quantize.BF16: "bf16"}.get(arr.dtype)
        if t.dtype in quantize.QUANT:  # quantized tensors are always made from float data
            if native is None or tuple(arr.shape) != t.shape:
                raise ValueError(f"tensor {t.name!r}: {t.dtype} needs float data of shape {t.shape}, "
                                 f"got {arr.dtype} {tuple(arr.shape)}")
            data = arr if isinstance(arr, quantize.RowBlocks) or native != "f32" else np.asarray(arr, dtype=np.float32)
            return quantize.quantize(data, t.dtype, out=self._buffer(slot, t.n_bytes))
        if isinstance(arr, quantize.RowBlocks):  # a fused matrix the policy keeps in floats
            arr = np.concatenate(arr.blocks)
        if self.dtype_policy is not None and native is not None and native != t.dtype:
            # float data for a dtype the policy chose: round it here
            arr = quantize.as_float32(np.asarray(arr))
            if t.dtype == "f16":
                out = self._buffer(slot, arr.size * 2).view(np.float16)[:arr.size].reshape(arr.shape)
                np.copyto(out, arr)  # rounds as astype does
                arr = out
            else:
                arr = {"bf16": f32_to_bf16_bits, "f32": lambda a: a}[t.dtype](arr)
        if arr.dtype == quantize.BF16:  # bf16 bits as the file keeps them
            arr = arr.view(np.uint16)
        accepted = DTYPES[t.dtype][2]
        if arr.dtype.newbyteorder("=") not in accepted:
            raise ValueError(f"tensor {t.name!r}: data has dtype {arr.dtype}, expected "
                             f"{' or '.join(str(a) for a in accepted)} for {t.dtype}")
        if tuple(arr.shape) != t.shape:
            raise ValueError(f"tensor {t.name!r}: data has shape {tuple(arr.shape)}, "
                             f"declared {t.shape}")
        # little-endian, C-contiguous
        arr = np.ascontiguousarray(arr, dtype=arr.dtype.newbyteorder("<"))
        assert arr.nbytes == t.n_bytes
        return arr

    def write(self, progress: bool = False, desc: str | None = None) -> str:
        """Writes the file atomically; returns its path."""
        prefix, data_offset = self._layout()
        out_dir = os.path.dirname(os.path.abspath(self.path))
        base = os.path.basename(self.path)
        fd, tmp = tempfile.mkstemp(prefix=f".{base}.", suffix=".tmp", dir=out_dir)
        try:
            # A thread writes each tensor while the next one is made: the copy into the page cache
            # took a third of an int8 conversion's wall time (1.1B shape) with the quantizer idle.
            with os.fdopen(fd, "wb") as f, ThreadPoolExecutor(max_workers=1) as writer:
                f.write(prefix)
                pos = 0  # relative to data_offset
                pending = [None, None]  # the write of each buffer's last tensor
                bar = None
                if progress:
                    from tqdm import tqdm
                    bar = tqdm(total=len(self._tensors), desc=desc or base, unit="tensor",
                               file=sys.stderr, leave=True)

                def put(pad: int, arr: np.ndarray) -> None:
                    if pad:
                        f.write(b"\0" * pad)
                    f.write(memoryview(arr).cast("B"))

                try:
                    for k, t in enumerate(self._tensors):
                        if bar is not None:
                            bar.set_postfix_str(t.name, refresh=False)
                        slot = k % 2
                        if pending[slot] is not None:  # its buffer is free once written
                            pending[slot].result()
                        arr = self._check_data(t, t.produce(), slot)
                        pending[slot] = writer.submit(put, t.offset - pos, arr)
                        pos = t.offset + t.n_bytes
                        del arr
                        if bar is not None:
                            bar.update(1)
                    for w in pending:
                        if w is not None:
                            w.result()
                finally:
                    for w in pending:  # no write may outlive the buffers or the file
                        if w is not None:
                            w.cancel() or w.exception()
                    self._scratch = [None, None]
                    if bar is not None:
                        bar.close()
                f.flush()
                os.fsync(f.fileno())
            expected = data_offset + pos
            actual = os.path.getsize(tmp)
            if actual != expected:
                raise OSError(f"{tmp}: wrote {actual} bytes, expected {expected}")
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(tmp, 0o666 & ~umask)
            os.replace(tmp, self.path)
        except BaseException:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
            raise
        return self.path
