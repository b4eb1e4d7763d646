"""Quantized weight formats of .flm (docs/flm_format.md, "Quantized layouts") and the rules that
pick each tensor's dtype when a quantized --dtype is asked for.

    python convert.py ... --dtype int4                       # q4 (groups of 32), embeddings/head q8
    python convert.py ... --dtype int4 --group_size 128      # q4_g128: ~4.1 bits per weight
    python convert.py ... --dtype int8 --dtype_config 'blk.0.*=f16' --dtype_config 'output.weight=f32'
    python convert.py ... --dtype int4 --calib sample.txt     # calibrated rounding (calibrate.py)

--calib (int8 / int4 / int4m, HF folders): calibrate.py runs the model on the text, scales input
channels by their activations (folded into neighbouring weights) and rounds every quantized matrix
with GPTQ; it hands the writer the rounded weights with their grid (OnGrid), which quantize() then
stores as they are instead of searching scales again.
"""
from __future__ import annotations

import ctypes
import fnmatch
import importlib.util
import os
import sys
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from .errors import ConversionError

PLAIN = ("f32", "f16", "bf16")
# name -> (.flm dtype code, group size G, bits per code, has a minimum per group)
QUANT = {
    "q8": (3, 32, 8, False),
    "q4": (4, 32, 4, False),
    "q4_g64": (5, 64, 4, False),
    "q4_g128": (6, 128, 4, False),
    "q4m": (7, 32, 4, True),
    "q6": (8, 32, 6, False),
    "q4k": (9, 32, 4, True),
    "q6k": (10, 32, 6, False),
    "q3k": (11, 32, 3, True),
    "q5k": (12, 32, 5, True),
}
# K formats: a group's scale (and minimum) is an 8-bit code times an f16 factor per row and
# super-block of SUPER weights (the last one of a row may be shorter), chosen by a weighted search.
K_FORMATS = ("q3k", "q4k", "q5k", "q6k")
SUPER = 256
# Symmetric formats, by bits per code: w / scale is an integer in RANGE, stored as w / scale + ZERO
# (q8 leaves the code 0 unused, so that -w is as exact as w).
RANGE = {8: (-127, 127), 6: (-32, 31), 4: (-8, 7)}
ZERO = {8: 128, 6: 32, 4: 8}


@dataclass(frozen=True)
class Preset:
    """A mixed-precision recipe (as llama.cpp's Q4_K_M & co.): `base` for the matrices, `head` for
    the output head (the tied embedding included), and `rules`: (tensor kinds, dtype, "all" or
    "more_bits" layers) — the first rule naming a layer's tensor (blk.N.KIND.weight) whose layers
    include N gives its dtype."""
    base: str
    head: str
    rules: tuple = ()


def use_more_bits(i: int, n: int) -> bool:
    """The layers a _m preset gives more bits: the first and last eighth, and every third between
    (llama.cpp's choice for Q4_K_M's attn_v / ffn_down: the ends of the stack matter most)."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


_QKV_DOWN = ("attn_qkv", "ffn_down")
PRESETS = {  # docs/quantization.md has them as a table
    "q3_k_m": Preset("q3k", "q6k", ((("attn_qkv", "attn_output", "ffn_down"), "q4k", "all"),)),
    "q4_k_s": Preset("q4k", "q6k"),
    "q4_k_m": Preset("q4k", "q6k", ((_QKV_DOWN, "q6k", "more_bits"),)),
    "q5_k_s": Preset("q5k", "q6k"),
    "q5_k_m": Preset("q5k", "q6k", ((_QKV_DOWN, "q6k", "more_bits"),)),
    "q6_k": Preset("q6k", "q6k"),
}
# --dtype names: the .flm names, the families int8 / int4 (int4's group from --group_size), the presets.
REQUESTS = PLAIN + ("int8", "int4", "int4m") + tuple(QUANT) + tuple(PRESETS) + ("auto",)


def row_multiple(dtype: str) -> int:
    """What a quantized matrix's row length K must be a multiple of."""
    _, group, bits, _ = QUANT[dtype]
    return 32 if bits == 8 else max(64, group)


def _align64(n: int) -> int:
    return (n + 63) // 64 * 64


TILE_ROWS = 16  # rows are stored in tiles of 16 (docs/flm_format.md); the last one is padded


def _tiles(n: int) -> int:
    return -(-n // TILE_ROWS)


def _supers(k: int) -> int:
    return -(-k // SUPER)


def tensor_bytes(dtype: str, shape) -> int:
    n, k = shape
    _, group, bits, has_min = QUANT[dtype]
    rows = _tiles(n) * TILE_ROWS
    if dtype in K_FORMATS:  # 8-bit codes per group, f16 factors per super-block
        scales = rows * (k // group + 2 * _supers(k)) * (2 if has_min else 1)
    else:
        scales = rows * (k // group) * 2 * (2 if has_min else 1)
    return _align64(scales) + rows * k * bits // 8


def _codes(g, d, offset, lo, hi):
    """round(g / d) + offset clipped to [lo, hi], 0 + offset where d is 0: one division by the
    broadcast scales (d = 0 divides by inf, giving 0) and the rest in place, where a division
    under a mask and a temporary per step took 40% of a K-format conversion (110M shape)."""
    # into g's dtype, as before: d may be float64 (a scale divided by a numpy float64 step), and the
    # quotient is rounded to float32 before rint
    q = np.divide(g, np.where(d != 0, d, np.float32(np.inf)), out=np.empty_like(g))
    np.rint(q, out=q)
    if offset:
        q += offset
    return np.clip(q, lo, hi, out=q)


def _search_symmetric(g: np.ndarray, neg: int, pos: int):
    """Per group, the scale d with the least squared error for codes in [-neg, pos]: candidates
    around extreme / -neg (the largest magnitude on the code -neg), each refined by a least-squares
    refit of d to its codes. Returns the f16 scales [N, n_groups]."""
    idx = np.abs(g).argmax(axis=2)[..., None]
    extreme = np.take_along_axis(g, idx, axis=2)
    best_err = np.full(g.shape[:2], np.inf, dtype=np.float32)
    best_d = np.zeros(g.shape[:2], dtype=np.float32)
    for step in np.linspace(-1.0, 1.5, 11) * (neg / 8.0):
        d = extreme / (-neg + step)
        q = _codes(g, d, 0, -neg, pos)
        qq = (q * q).sum(axis=2, keepdims=True)
        d = np.divide((g * q).sum(axis=2, keepdims=True), qq, out=d.copy(), where=qq > 0)
        d = d.astype(np.float16).astype(np.float32)  # judge the scale that will be stored
        q = _codes(g, d, 0, -neg, pos)
        err = ((g - d * q) ** 2).sum(axis=2)
        better = err < best_err
        best_err = np.where(better, err, best_err)
        best_d = np.where(better, d[..., 0], best_d)
    return best_d.astype(np.float16)


def _search_q4m(g: np.ndarray):
    """Per group, (scale, minimum) with the least squared error among ranges shrunk from
    [min, max], each refined by a least-squares refit. Returns (f16 scales, f16 minimums)."""
    lo0, hi0 = g.min(axis=2, keepdims=True), g.max(axis=2, keepdims=True)
    best_err = np.full(g.shape[:2], np.inf, dtype=np.float32)
    best_d = np.zeros(g.shape[:2], dtype=np.float32)
    best_m = np.zeros(g.shape[:2], dtype=np.float32)
    span = hi0 - lo0
    for a in (0.0, 0.05, 0.1):
        for b in (0.0, 0.05, 0.1):
            lo, d = lo0 + a * span, (span * (1 - a - b)) / 15
            q = _codes(g - lo, d, 0, 0, 15)
            # least squares for w ~ d * q + m over the group
            n = g.shape[2]
            sq, sw, sqq, sqw = q.sum(2, keepdims=True), g.sum(2, keepdims=True), (q * q).sum(2, keepdims=True), \
                (q * g).sum(2, keepdims=True)
            det = n * sqq - sq * sq
            d = np.divide(n * sqw - sq * sw, det, out=d.copy(), where=det > 0)
            m = np.divide(sw - d * sq, n, out=lo.copy())
            d16, m16 = d.astype(np.float16).astype(np.float32), m.astype(np.float16).astype(np.float32)
            q = _codes(g - m16, d16, 0, 0, 15)
            err = ((g - (d16 * q + m16)) ** 2).sum(axis=2)
            better = err < best_err
            best_err = np.where(better, err, best_err)
            best_d = np.where(better, d16[..., 0], best_d)
            best_m = np.where(better, m16[..., 0], best_m)
    return best_d.astype(np.float16), best_m.astype(np.float16)


@dataclass
class KScales:
    """A K format's stored scales: 8-bit codes per group [N, K // G] and f16 factors per super-block
    [N, ceil(K / SUPER)]; a group's scale is factor * code (its minimum likewise, q4k)."""
    scale_code: np.ndarray
    scale_factor: np.ndarray
    min_code: np.ndarray | None = None
    min_factor: np.ndarray | None = None

    @staticmethod
    def concat(parts, axis: int) -> "KScales":
        """Parts joined along rows (axis 0) or groups and super-blocks (axis 1)."""
        cat = lambda f: None if getattr(parts[0], f) is None else np.concatenate([getattr(p, f) for p in parts], axis=axis)
        return KScales(*(cat(f) for f in KScales.__dataclass_fields__))

    def values(self):
        """(scales, minimums or None) per group as float32, as the kernels compute them."""
        per = SUPER // 32
        expand = lambda f, c: np.repeat(f.astype(np.float32), per, axis=1)[:, :c.shape[1]] * c.astype(np.float32)
        return (expand(self.scale_factor, self.scale_code),
                None if self.min_code is None else expand(self.min_factor, self.min_code))


@dataclass
class Grid:
    """Per-group scales (and minimums, q4m / q4k) of a matrix: [N, K // G] each; f16 values, or for
    the K formats the float32 values of `k`, the codes and factors that are stored."""
    scale: np.ndarray
    mins: np.ndarray | None = None
    k: KScales | None = None

    @staticmethod
    def of_k(k: KScales) -> "Grid":
        return Grid(*k.values(), k=k)

    def map_rows(self, fn) -> "Grid":
        """The grid with fn (a selection or reordering of rows) applied to each of its arrays."""
        f = lambda a: None if a is None else fn(a)
        k = None if self.k is None else KScales(*(f(getattr(self.k, n)) for n in KScales.__dataclass_fields__))
        return Grid(f(self.scale), f(self.mins), k)

    def rows(self, r0: int, r1: int) -> "Grid":
        """The grid of rows [r0, r1) (a fused matrix's part)."""
        return self.map_rows(lambda a: a[r0:r1])

    @staticmethod
    def stack(grids) -> "Grid":
        """The grid of matrices stacked row-wise (fused)."""
        cat = lambda items: None if items[0] is None else np.concatenate(items)
        k = None if grids[0].k is None else KScales.concat([g.k for g in grids], axis=0)
        return Grid(cat([g.scale for g in grids]), cat([g.mins for g in grids]), k)


def _k_codes(values: np.ndarray, n_groups: int):
    """8-bit codes and f16 factors for per-group values [N, n_groups] of one sign (scales >= 0,
    minimums <= 0): per super-block, the value of largest magnitude on code 255."""
    per = SUPER // 32
    pad = -n_groups % per
    v = np.pad(values.astype(np.float32), ((0, 0), (0, pad))).reshape(values.shape[0], -1, per)
    ext = np.take_along_axis(v, np.abs(v).argmax(axis=2)[..., None], axis=2)
    factor = (ext / 255).astype(np.float16)
    f = factor.astype(np.float32)
    code = np.clip(np.rint(np.divide(v, f, out=np.zeros_like(v), where=f != 0)), 0, 255).astype(np.uint8)
    return code.reshape(values.shape[0], -1)[:, :n_groups], factor[..., 0]


def _importance(g: np.ndarray, importance: np.ndarray | None) -> np.ndarray:
    """Weights of each weight's squared error in the scale search: |w| + the group's RMS (large
    weights matter more, none counts for nothing), times the input channel's importance when
    calibration measured it (mean x^2 of the channel)."""
    w = np.abs(g) + np.sqrt((g * g).mean(axis=2, keepdims=True))
    return w if importance is None else w * importance


def _search_k(g: np.ndarray, bits: int, has_min: bool, importance: np.ndarray | None = None) -> KScales:
    """The K formats' search, per group of g [N, n_groups, G]: candidate scales around the range
    divided by the code range, each refitted by weighted least squares (scale and minimum for q4k,
    the minimum kept <= 0) to the codes it gives, keeping the one of least weighted squared error;
    then the groups' scales and minimums become 8-bit codes of their super-block's factors."""
    w = _importance(g, importance).astype(np.float32)
    n_max = (1 << bits) - 1
    best_err = np.full(g.shape[:2] + (1,), np.inf, dtype=np.float32)
    best_d = np.zeros_like(best_err)
    best_m = np.zeros_like(best_err)
    sw, swx, swxx = w.sum(2, keepdims=True), (w * g).sum(2, keepdims=True), (w * g * g).sum(2, keepdims=True)
    if has_min:
        lo, hi = np.minimum(g.min(axis=2, keepdims=True), 0), g.max(axis=2, keepdims=True)
        span, shifted = hi - lo, g - lo
        wq, tmp = np.empty_like(g), np.empty_like(g)  # the steps' products, without a temporary each
        for step in np.linspace(-1.0, 1.0, 21):
            d0 = np.divide(span, n_max + step, out=np.zeros_like(span), where=span > 0)
            q = _codes(shifted, d0, 0, 0, n_max)
            np.multiply(w, q, out=wq)
            swq = wq.sum(2, keepdims=True)
            swqq = np.multiply(wq, q, out=tmp).sum(2, keepdims=True)
            swqx = np.multiply(wq, g, out=tmp).sum(2, keepdims=True)
            det = sw * swqq - swq * swq
            d = np.divide(sw * swqx - swq * swx, det, out=d0.copy(), where=det > 0)
            m = np.divide(swx - d * swq, sw, out=lo.copy(), where=sw > 0)
            pos = m > 0  # a minimum above 0 cannot be stored: refit the scale alone
            m = np.where(pos, 0, m)
            d = np.where(pos, np.divide(swqx, swqq, out=d0.copy(), where=swqq > 0), d)
            # sum w (x - d q - m)^2, expanded over the sums already taken
            err = swxx - 2 * d * swqx - 2 * m * swx + d * d * swqq + 2 * d * m * swq + m * m * sw
            better = (err < best_err) & (d > 0)
            best_err, best_d, best_m = np.where(better, err, best_err), np.where(better, d, best_d), np.where(better, m, best_m)
    else:
        lo_code = -(1 << (bits - 1))
        amax = np.abs(g).max(axis=2, keepdims=True)
        wq, tmp = np.empty_like(g), np.empty_like(g)
        for step in np.linspace(-1.0, 1.0, 21):
            d0 = amax / (-lo_code + step)
            q = _codes(g, d0, 0, lo_code, -lo_code - 1)
            np.multiply(w, q, out=wq)
            swqq = np.multiply(wq, q, out=tmp).sum(2, keepdims=True)
            swqx = np.multiply(wq, g, out=tmp).sum(2, keepdims=True)
            d = np.divide(swqx, swqq, out=d0.copy(), where=swqq > 0)
            err = swxx - 2 * d * swqx + d * d * swqq
            better = (err < best_err) & (d > 0)
            best_err, best_d = np.where(better, err, best_err), np.where(better, d, best_d)
    ng = g.shape[1]
    sc, sf = _k_codes(best_d[..., 0], ng)
    if not has_min:
        return KScales(sc, sf)
    mc, mf = _k_codes(best_m[..., 0], ng)
    return KScales(sc, sf, mc, mf)


@dataclass
class OnGrid:
    """Float weights already rounded onto a grid chosen elsewhere (calibrate.py's GPTQ): the
    writer stores their codes on that grid instead of searching scales again."""
    weights: np.ndarray  # [N, K] float32
    grid: Grid


def choose_grid(g: np.ndarray, dtype: str, importance: np.ndarray | None = None) -> Grid:
    """The scale search for groups g [N, n_groups, G] (least squared weight error per group;
    weighted for the K formats, by `importance` [n_groups, G] too where calibration gives it).
    A K format's groups g must start at the row's super-blocks (whole rows, or one super-block)."""
    _, _, bits, has_min = QUANT[dtype]
    # A few rows at a time: each search step makes several passes over its arrays, which then
    # stay in the core's L2 cache (64K values an array: 110M shape to q4_k_m 29.1 s with 4096 rows
    # at a time, 24.0 s with 64). Rows are searched independently: the chunks change no result.
    rows = max(1, (1 << 16) // (g.shape[1] * g.shape[2]))
    chunks = [g[i:i + rows] for i in range(0, len(g), rows)]
    if dtype in K_FORMATS:
        parts = [_search_k(c, bits, has_min, importance) for c in chunks]
        return Grid.of_k(KScales.concat(parts, axis=0))
    if has_min:
        parts = [_search_q4m(c) for c in chunks]
        return Grid(np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]))
    lo, hi = RANGE[bits]
    return Grid(np.concatenate([_search_symmetric(c, -lo, hi) for c in chunks]))


def round_to_grid(g: np.ndarray, grid: Grid, dtype: str) -> np.ndarray:
    """Codes (as stored: unsigned) of groups g [N, n_groups, G] on the grid, round to nearest."""
    bits = QUANT[dtype][2]
    d = grid.scale.astype(np.float32)[..., None]
    if grid.mins is not None:
        return _codes(g - grid.mins.astype(np.float32)[..., None], d, 0, 0, (1 << bits) - 1)
    return _codes(g, d, 0, *RANGE[bits]) + ZERO[bits]


def from_codes(codes: np.ndarray, grid: Grid, dtype: str) -> np.ndarray:
    """Float weights of stored codes [N, n_groups, G] on their grid."""
    d = grid.scale.astype(np.float32)[..., None]
    if grid.mins is not None:
        return codes * d + grid.mins.astype(np.float32)[..., None]
    return (codes - ZERO[QUANT[dtype][2]]) * d


def round_trip(w: np.ndarray, dtype: str) -> np.ndarray:
    """[N, K] float32 -> the weights quantize() stores, as float32 (dequantize(quantize(w))
    without the tile packing)."""
    _, group, _, _ = QUANT[dtype]
    n, k = w.shape
    g = w.astype(np.float32).reshape(n, k // group, group)
    grid = choose_grid(g, dtype)
    return from_codes(round_to_grid(g, grid, dtype), grid, dtype).reshape(n, k)


LIBRARY_ABI = 13  # include/fastllm.h's FASTLLM_ABI_VERSION that fastllm_quantize below is bound for

# bfloat16 weights as a checkpoint holds them: their bits, under a dtype of their own (numpy has no
# bfloat16), so that quantize() tells them from integers and the library widens them as it goes.
BF16 = np.dtype([("bf16", "<u2")])


def bf16_to_f32(bits: np.ndarray) -> np.ndarray:
    """bf16 bit patterns (uint16, int16 or BF16) -> float32 values (exact)."""
    bits = np.asarray(bits)
    return ((bits.view("<u2") if bits.dtype == BF16 else bits).astype(np.uint32) << 16).view(np.float32)


def as_float32(a: np.ndarray) -> np.ndarray:
    """a as float32 (exact for float16 and BF16 bits)."""
    return bf16_to_f32(a) if a.dtype == BF16 else a.astype(np.float32, copy=False)


@lru_cache(maxsize=None)
def native():
    """libfastllm's fastllm_quantize (ctypes), or None. It gives the same bytes as the numpy search
    below, its reference twin, much faster (1.1B shape to q4_k_m: 28 s where numpy's took 158 s on
    two cores; docs/quantization.md). Looked
    for as the Python package looks for the library: FASTLLM_LIBRARY, this checkout's build/, then
    an installed `fastllm` package's bundled copy. FASTLLM_CONVERTER_NATIVE=0 keeps to numpy."""
    if os.environ.get("FASTLLM_CONVERTER_NATIVE", "1") == "0":
        return None
    name = "fastllm.dll" if sys.platform in ("win32", "cygwin") else \
        "libfastllm.dylib" if sys.platform == "darwin" else "libfastllm.so"
    places = [Path(os.environ["FASTLLM_LIBRARY"])] if os.environ.get("FASTLLM_LIBRARY") else []
    places.append(Path(__file__).resolve().parent.parent / "build" / name)
    spec = importlib.util.find_spec("fastllm")
    if spec is not None and spec.origin:
        places.append(Path(spec.origin).parent / name)
    for path in places:
        if not path.is_file():
            continue
        try:
            lib = ctypes.CDLL(str(path))
            fn = lib.fastllm_quantize
            if lib.fastllm_abi_version() != LIBRARY_ABI:  # fastllm_quantize's arguments are this ABI's
                continue
        except (OSError, AttributeError):  # not loadable here, or a library from before the function
            continue
        fn.restype = ctypes.c_int
        fn.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,
                       ctypes.c_int32, ctypes.c_void_p, ctypes.c_size_t]
        # 16-bit weights as they lie (fastllm_quantize_f16 and _bf16, the same arguments), where
        # the library has them: with a library of this ABI from before them, they are widened here
        lib.f16 = getattr(lib, "fastllm_quantize_f16", None)
        lib.bf16 = getattr(lib, "fastllm_quantize_bf16", None)
        for f in (lib.f16, lib.bf16):
            if f is not None:
                f.restype, f.argtypes = fn.restype, fn.argtypes
        lib.fastllm_last_error.restype = ctypes.c_char_p
        return lib
    return None


def takes_f16() -> bool:
    """Whether quantize() takes float16 weights as they are (the library's fastllm_quantize_f16);
    otherwise they are better widened by the caller (torch widens with F16C, numpy value by value)."""
    lib = native()
    return lib is not None and lib.f16 is not None


def takes_bf16() -> bool:
    """Whether quantize() takes BF16 weights as they are (the library's fastllm_quantize_bf16)."""
    lib = native()
    return lib is not None and lib.bf16 is not None


class RowBlocks:
    """A matrix given as blocks of rows (a fused tensor's parts: q, k, v), which the library
    quantizes where they lie, without joining them first (copying a 1.1B model's fused tensors cost
    a tenth of its conversion)."""

    def __init__(self, blocks):
        self.blocks = [np.asarray(b) for b in blocks]
        self.shape = (sum(b.shape[0] for b in self.blocks), self.blocks[0].shape[1])
        self.dtype = self.blocks[0].dtype

    def joined(self) -> np.ndarray:
        return np.concatenate([as_float32(b) for b in self.blocks])


def _quantize_native(lib, w, dtype: str, out: np.ndarray | None) -> np.ndarray:
    n, k = w.shape
    size = tensor_bytes(dtype, w.shape)
    out = np.empty(size, dtype=np.uint8) if out is None or out.size < size else out[:size]
    blocks = w.blocks if isinstance(w, RowBlocks) else [w]
    starts = np.cumsum([0] + [b.shape[0] for b in blocks])
    if any(s % TILE_ROWS for s in starts[1:-1]):  # parts that share a tile: joined
        blocks, starts = [w.joined()], [0, n]
    for b, r0 in zip(blocks, starts):
        # (BF16 is little-endian bits, the library reads this machine's order)
        fn = lib.f16 if b.dtype == np.float16 else lib.bf16 if b.dtype == BF16 and sys.byteorder == "little" else None
        if fn is None:
            b, fn = np.ascontiguousarray(as_float32(b)), lib.fastllm_quantize
        else:
            b = np.ascontiguousarray(b)
        status = fn(dtype.encode(), b.ctypes.data, n, k, int(r0), b.shape[0], 0, out.ctypes.data, size)
        if status != 0:
            raise ConversionError(f"fastllm_quantize ({dtype}, {[n, k]}): {lib.fastllm_last_error().decode()}")
    return out


def quantize(w, dtype: str, grid: Grid | None = None, use_native: bool = True,
             out: np.ndarray | None = None) -> np.ndarray:
    """[N, K] float32, float16 or BF16 (an array, or RowBlocks) -> the dtype's bytes (uint8), round to nearest with
    f16 scales (searched per group, or those of grid). Without a grid, libfastllm does it where
    found (native()), unless use_native is False: the same bytes either way. out: a buffer of at
    least the tensor's bytes to write into (the result is then a view of it), else a new one."""
    _, group, bits, has_min = QUANT[dtype]
    n, k = w.shape
    if k % row_multiple(dtype):
        raise ConversionError(f"{dtype} needs rows of a multiple of {row_multiple(dtype)} weights, not {k}")
    if grid is None and use_native and native() is not None:
        return _quantize_native(native(), w, dtype, out)
    if isinstance(w, RowBlocks):
        w = w.joined()
    g = as_float32(w).reshape(n, k // group, group)
    if grid is None:
        grid = choose_grid(g, dtype)
    if dtype not in K_FORMATS:
        grid = Grid(grid.scale.astype(np.float16), None if grid.mins is None else grid.mins.astype(np.float16))
    if grid.scale.shape != g.shape[:2] or (grid.mins is None) == has_min or (grid.k is None) == (dtype in K_FORMATS):
        raise ConversionError(f"a {dtype} grid for [{n}, {k}] needs scales of shape {list(g.shape[:2])}"
                              f"{' and minimums' if has_min else ''}{' as K codes' if dtype in K_FORMATS else ''}")
    # codes: q8 w/d + 128 in [1, 255]; q6 w/d + 32 in [0, 63]; q4 w/d + 8 in [0, 15]; q4m (w - m)/d in [0, 15]
    scale, mins, codes = grid.scale, grid.mins, round_to_grid(g, grid, dtype)
    # Tiles of 16 rows, laid out for the kernels: per group, the 16 rows' scales side by side; per
    # block of 32 columns, 8 chunks of 64 bytes, each 4 consecutive codes of the 16 rows (q8), or,
    # for q4, the chunks of blocks 2p and 2p + 1 in the low and high nibbles of the same bytes; q6
    # stores its low 4 bits as q4 does, followed per pair of blocks by 4 chunks of the top 2 bits.
    t, ng = _tiles(n), k // group
    pad = t * TILE_ROWS - n
    codes = np.pad(codes.astype(np.uint8).reshape(n, k), ((0, pad), (0, 0)))
    tiled = lambda a: np.pad(a.reshape(n, ng), ((0, pad), (0, 0))).reshape(t, TILE_ROWS, ng).transpose(0, 2, 1)
    if bits == 8:
        codes = codes.reshape(t, TILE_ROWS, k // 32, 8, 4).transpose(0, 2, 3, 1, 4)
    elif bits == 3:  # per pair, u = 8 * block + chunk: 2 low bits at 2 (u // 4) of chunk u % 4, the top bit u // 2 of chunk 4 + u % 2
        c = codes.reshape(t, TILE_ROWS, k // 64, 16, 4)
        low = sum((c[:, :, :, kk * 4:kk * 4 + 4] & 3) << (2 * kk) for kk in range(4))
        top = sum(((c[:, :, :, v * 2:v * 2 + 2] >> 2) & 1) << v for v in range(8))
        codes = np.concatenate([low, top], axis=3).transpose(0, 2, 3, 1, 4)
    else:
        c = codes.reshape(t, TILE_ROWS, k // 64, 2, 8, 4)  # [tile, row, pair, block in pair, chunk, 4]
        low = c & 15
        codes = (low[:, :, :, 0] | (low[:, :, :, 1] << 4)).transpose(0, 2, 3, 1, 4)
        if bits == 5:  # top chunk h (0..1), bit b + 2s: block b of the pair, chunk 4h + s
            top = (c >> 4).reshape(t, TILE_ROWS, k // 64, 2, 2, 4, 4)
            top = sum(top[:, :, :, b, :, s_] << (b + 2 * s_) for b in range(2) for s_ in range(4))
            codes = np.concatenate([codes, top.transpose(0, 2, 3, 1, 4)], axis=2)
        if bits == 6:
            # top-bits chunk h (0..3), bits 2b + 4s: block b of the pair, chunk 2h + s
            top = (c >> 4).reshape(t, TILE_ROWS, k // 64, 2, 4, 2, 4)
            top = top[:, :, :, 0, :, 0] | top[:, :, :, 1, :, 0] << 2 | top[:, :, :, 0, :, 1] << 4 | top[:, :, :, 1, :, 1] << 6
            codes = np.concatenate([codes, top.transpose(0, 2, 3, 1, 4)], axis=2)
    if grid.k is not None:  # codes [tile][group][row], then factors [tile][super-block][row]
        kk, ns = grid.k, _supers(k)
        tiled_s = lambda a: np.pad(a.reshape(n, ns), ((0, pad), (0, 0))).reshape(t, TILE_ROWS, ns).transpose(0, 2, 1)
        head = tiled(kk.scale_code).tobytes() + (tiled(kk.min_code).tobytes() if has_min else b"")
        head += tiled_s(kk.scale_factor.astype(np.float16)).tobytes()
        head += tiled_s(kk.min_factor.astype(np.float16)).tobytes() if has_min else b""
    else:
        head = tiled(scale).tobytes() + (tiled(mins).tobytes() if mins is not None else b"")
    out = np.zeros(tensor_bytes(dtype, (n, k)), dtype=np.uint8)
    out[: len(head)] = np.frombuffer(head, dtype=np.uint8)
    out[_align64(len(head)):] = codes.reshape(-1)
    return out


def dequantize(data: np.ndarray, dtype: str, shape) -> np.ndarray:
    """The inverse view of quantize (for tests and inspection): [N, K] float32."""
    _, group, bits, has_min = QUANT[dtype]
    n, k = shape
    t, ng = _tiles(n), k // group
    rows = t * TILE_ROWS
    untile = lambda a, c=ng: a.reshape(t, c, TILE_ROWS).transpose(0, 2, 1).reshape(rows, c)[:n]
    if dtype in K_FORMATS:
        ns, kinds = _supers(k), 2 if has_min else 1
        codes = data[: kinds * rows * ng]
        factors = data[kinds * rows * ng: kinds * rows * (ng + 2 * ns)].view(np.float16)
        kk = KScales(untile(codes[: rows * ng]), untile(factors[: rows * ns], ns))
        if has_min:
            kk.min_code, kk.min_factor = untile(codes[rows * ng:]), untile(factors[rows * ns:], ns)
        scale, mins = kk.values()
    else:
        scale = untile(data[: rows * ng * 2].view(np.float16).astype(np.float32))
        mins = untile(data[rows * ng * 2: rows * ng * 4].view(np.float16).astype(np.float32)) if has_min else None
    q = data[tensor_bytes(dtype, (n, k)) - rows * k * bits // 8:]
    if bits == 8:
        q = q.reshape(t, k // 32, 8, TILE_ROWS, 4).transpose(0, 3, 1, 2, 4).reshape(rows, k)
    elif bits == 3:
        b = q.reshape(t, k // 64, 6, TILE_ROWS, 4).transpose(0, 3, 1, 2, 4)  # [tile, row, pair, chunk, 4]
        u = np.arange(16)
        q = ((b[:, :, :, u % 4] >> (2 * (u // 4))[:, None]) & 3) | (((b[:, :, :, 4 + u % 2] >> (u // 2)[:, None]) & 1) << 2)
        q = q.reshape(rows, k)
    else:
        per_pair = 2 * bits
        b = q.reshape(t, k // 64, per_pair, TILE_ROWS, 4).transpose(0, 3, 1, 2, 4)  # [tile, row, pair, chunk, 4]
        low = np.stack([b[:, :, :, :8] & 15, b[:, :, :, :8] >> 4], axis=3)  # [.., pair, block in pair, chunk, 4]
        if bits == 5:
            j = np.arange(8)
            top = np.stack([(b[:, :, :, 8 + j // 4] >> (blk + 2 * (j % 4))[:, None]) & 1 for blk in range(2)], axis=3)
            low = low | (top << 4)
        if bits == 6:
            top = b[:, :, :, 8:]  # [.., pair, h, 4]
            shifts = np.array([[0, 4], [2, 6]])  # [block in pair, s]
            bits_ = (top[:, :, :, None, :, None, :] >> shifts[None, None, None, :, None, :, None]) & 3
            low = low | (bits_.reshape(low.shape) << 4)
        q = low.reshape(rows, k)
    return from_codes(q[:n].reshape(n, ng, group).astype(np.float32), Grid(scale, mins), dtype).reshape(n, k)


def tell_policy(policy, n_layers: int, tied: bool, precise: tuple = ()) -> None:
    """What a DtypePolicy learns from the model before its tensors are declared (the families'
    add_tensors call this): the layer count, whether the embedding is the head, and the layer
    matrices (by kind: "attn_qkv") that get one step more precision, as the head does."""
    if isinstance(policy, DtypePolicy):
        policy.n_layers, policy.tied, policy.precise = n_layers, tied, tuple(precise)


class DtypePolicy:
    """Chooses each tensor's dtype. Vectors (norms, biases) stay f32. With a quantized request,
    matrices get it where their row length allows (else the nearest format that fits: a smaller
    q4 group, q8, f16); the output head and the
    embedding (often the same tensor) get one step more precision: f16 with int8, q8 with int4.
    --dtype_config PATTERN=DTYPE overrides by tensor-name glob; the last matching pattern wins."""

    def __init__(self, request: str, group_size: int = 32, overrides=(), n_layers: int | None = None):
        """n_layers: the model's layer count (a _m preset's layer choice needs it; the converter
        sets it once it has read the config)."""
        self.preset = PRESETS.get(request)
        self.default = "auto" if request == "auto" else self.preset.base if self.preset else self._name(request, group_size)
        self.native = {}  # --dtype auto (GGUF files): each tensor's dtype, set by gguf_import
        self.n_layers = n_layers
        self.tied = True  # whether the embedding is the output head (tell_policy)
        self.precise = ()  # layer matrix kinds with one step more precision (tell_policy)
        self.overrides = []
        for item in overrides:
            pattern, sep, dtype = item.partition("=")
            if not sep or not pattern:
                raise ConversionError(f"--dtype_config {item!r}: expected PATTERN=DTYPE")
            self.overrides.append((pattern, self._name(dtype, group_size)))

    @staticmethod
    def _name(request: str, group_size: int) -> str:
        if request in ("int4", "int4m"):
            if request == "int4m" and group_size != 32:
                raise ConversionError("int4m exists with groups of 32 only")
            if group_size not in (32, 64, 128):
                raise ConversionError(f"group size {group_size}: choose 32, 64 or 128")
            return "q4m" if request == "int4m" else {32: "q4", 64: "q4_g64", 128: "q4_g128"}[group_size]
        if request == "int8":
            return "q8"
        if request in PLAIN or request in QUANT:
            return request
        raise ConversionError(f"unknown dtype {request!r} (choose {', '.join(PLAIN)}, int8, int4, int4m, "
                              f"a .flm quantized type: {', '.join(QUANT)}, or a preset: {', '.join(PRESETS)})")

    def _preset_dtype(self, name: str) -> str:
        p = self.preset
        if name == "output.weight" or (name == "token_embd.weight" and self.tied):
            return p.head
        parts = name.split(".")
        if len(parts) == 4 and parts[0] == "blk":
            for kinds, dtype, layers in p.rules:
                if parts[2] not in kinds:
                    continue
                if layers == "all":
                    return dtype
                if self.n_layers is None:
                    raise ConversionError("a _m preset needs the model's layer count (DtypePolicy.n_layers)")
                if use_more_bits(int(parts[1]), self.n_layers):
                    return dtype
        return p.base


    def _is_precise(self, name: str) -> bool:
        parts = name.split(".")
        return len(parts) == 4 and parts[0] == "blk" and parts[2] in self.precise

    def __call__(self, name: str, shape) -> str:
        if len(shape) != 2:
            return "f32"
        dtype = self.default
        if dtype == "auto":
            if name not in self.native:
                raise ConversionError("--dtype auto keeps a GGUF file's own quantization; it needs a .gguf input")
            dtype = self.native[name]
        elif self.preset is not None:
            dtype = self._preset_dtype(name)
        elif dtype in QUANT and (name in ("token_embd.weight", "output.weight", "position_embd.weight", "token_types.weight")
                                 or self._is_precise(name)):
            dtype = "q8" if dtype.startswith("q4") else "f16"  # the head shapes every logit, the tables every input
        forced = None
        for pattern, d in self.overrides:
            if fnmatch.fnmatchcase(name, pattern):
                forced = d
        if forced is not None:
            if forced in QUANT and shape[1] % row_multiple(forced):
                raise ConversionError(f"--dtype_config: {name} has rows of {shape[1]} weights, {forced} needs a "
                                      f"multiple of {row_multiple(forced)}")
            return forced
        # Rows whose length the format cannot take fall back to the nearest format that can:
        # q4_g128 -> q4_g64 -> q8 -> f16 (q4, q4m, q4k, q6, q6k -> q8).
        while dtype in QUANT and shape[1] % row_multiple(dtype):
            dtype = {"q4_g128": "q4_g64", "q8": "f16"}.get(dtype, "q8")
        return dtype
