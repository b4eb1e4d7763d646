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

import fnmatch
from dataclasses import dataclass

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
}
# Symmetric formats, by bits per code: w / scale is an integer in RANGE, stored as w / scale + ZERO
# (q8 leaves the code 0 unused, so that -w is as exact as w).
RANGE = {8: (-127, 127), 6: (-32, 31), 4: (-8, 7)}
ZERO = {8: 128, 6: 32, 4: 8}
# --dtype names: the .flm names, plus the families int8 / int4 (int4's group from --group_size).
REQUESTS = PLAIN + ("int8", "int4", "int4m") + tuple(QUANT)


def row_multiple(dtype: str) -> int:
    """What a quantized matrix's row length K must be a multiple of."""
    _, group, bits, _ = QUANT[dtype]
    return 32 if bits == 8 else max(64, group)


def _align64(n: int) -> int:
    return (n + 63) // 64 * 64


TILE_ROWS = 16  # rows are stored in tiles of 16 (docs/flm_format.md); the last one is padded


def _tiles(n: int) -> int:
    return -(-n // TILE_ROWS)


def tensor_bytes(dtype: str, shape) -> int:
    n, k = shape
    _, group, bits, has_min = QUANT[dtype]
    rows = _tiles(n) * TILE_ROWS
    scales = rows * (k // group) * 2 * (2 if has_min else 1)
    return _align64(scales) + rows * k * bits // 8


def _codes(g, d, offset, lo, hi):
    return np.clip(np.rint(np.divide(g, d, out=np.zeros_like(g), where=d != 0)) + offset, lo, hi)


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
class Grid:
    """Per-group f16 scales (and minimums, q4m) of a matrix: [N, K // G] each."""
    scale: np.ndarray
    mins: np.ndarray | None = None


@dataclass
class OnGrid:
    """Float weights already rounded onto a grid chosen elsewhere (calibrate.py's GPTQ): the
    writer stores their codes on that grid instead of searching scales again."""
    weights: np.ndarray  # [N, K] float32
    grid: Grid


def choose_grid(g: np.ndarray, dtype: str) -> Grid:
    """The scale search for groups g [N, n_groups, G] (least squared weight error per group)."""
    _, _, bits, has_min = QUANT[dtype]
    if has_min:
        return Grid(*_search_q4m(g))
    lo, hi = RANGE[bits]
    return Grid(_search_symmetric(g, -lo, hi))


def round_to_grid(g: np.ndarray, grid: Grid, dtype: str) -> np.ndarray:
    """Codes (as stored: unsigned) of groups g [N, n_groups, G] on the grid, round to nearest."""
    bits = QUANT[dtype][2]
    d = grid.scale.astype(np.float32)[..., None]
    if grid.mins is not None:
        return _codes(g - grid.mins.astype(np.float32)[..., None], d, 0, 0, 15)
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


def quantize(w: np.ndarray, dtype: str, grid: Grid | None = None) -> np.ndarray:
    """[N, K] float32 -> the dtype's bytes (uint8), round to nearest with f16 scales (searched per
    group, or those of grid)."""
    _, group, bits, has_min = QUANT[dtype]
    n, k = w.shape
    if k % row_multiple(dtype):
        raise ConversionError(f"{dtype} needs rows of a multiple of {row_multiple(dtype)} weights, not {k}")
    g = w.astype(np.float32).reshape(n, k // group, group)
    if grid is None:
        grid = choose_grid(g, dtype)
    grid = Grid(grid.scale.astype(np.float16), None if grid.mins is None else grid.mins.astype(np.float16))
    if grid.scale.shape != g.shape[:2] or (grid.mins is None) == has_min:
        raise ConversionError(f"a {dtype} grid for [{n}, {k}] needs scales of shape {list(g.shape[:2])}"
                              f"{' and minimums' if has_min else ''}")
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
    else:
        c = codes.reshape(t, TILE_ROWS, k // 64, 2, 8, 4)  # [tile, row, pair, block in pair, chunk, 4]
        low = c & 15
        codes = (low[:, :, :, 0] | (low[:, :, :, 1] << 4)).transpose(0, 2, 3, 1, 4)
        if bits == 6:
            # top-bits chunk h (0..3), bits 2b + 4s: block b of the pair, chunk 2h + s
            top = (c >> 4).reshape(t, TILE_ROWS, k // 64, 2, 4, 2, 4)
            top = top[:, :, :, 0, :, 0] | top[:, :, :, 1, :, 0] << 2 | top[:, :, :, 0, :, 1] << 4 | top[:, :, :, 1, :, 1] << 6
            codes = np.concatenate([codes, top.transpose(0, 2, 3, 1, 4)], axis=2)
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
    untile = lambda a: a.reshape(t, ng, TILE_ROWS).transpose(0, 2, 1).reshape(rows, ng)[:n]
    scale = untile(data[: rows * ng * 2].view(np.float16).astype(np.float32))
    mins = untile(data[rows * ng * 2: rows * ng * 4].view(np.float16).astype(np.float32)) if has_min else None
    q = data[_align64(rows * ng * 2 * (2 if has_min else 1)):][: rows * k * bits // 8]
    if bits == 8:
        q = q.reshape(t, k // 32, 8, TILE_ROWS, 4).transpose(0, 3, 1, 2, 4).reshape(rows, k)
    else:
        per_pair = 12 if bits == 6 else 8
        b = q.reshape(t, k // 64, per_pair, TILE_ROWS, 4).transpose(0, 3, 1, 2, 4)  # [tile, row, pair, chunk, 4]
        low = np.stack([b[:, :, :, :8] & 15, b[:, :, :, :8] >> 4], axis=3)  # [.., pair, block in pair, chunk, 4]
        if bits == 6:
            top = b[:, :, :, 8:]  # [.., pair, h, 4]
            shifts = np.array([[0, 4], [2, 6]])  # [block in pair, s]
            bits_ = (top[:, :, :, None, :, None, :] >> shifts[None, None, None, :, None, :, None]) & 3
            low = low | (bits_.reshape(low.shape) << 4)
        q = low.reshape(rows, k)
    return from_codes(q[:n].reshape(n, ng, group).astype(np.float32), Grid(scale, mins), dtype).reshape(n, k)


class DtypePolicy:
    """Chooses each tensor's dtype. Vectors (norms, biases) stay f32. With a quantized request,
    matrices get it where their row length allows (else the nearest format that fits: a smaller
    q4 group, q8, f16); the output head and the
    embedding (often the same tensor) get one step more precision: f16 with int8, q8 with int4.
    --dtype_config PATTERN=DTYPE overrides by tensor-name glob; the last matching pattern wins."""

    def __init__(self, request: str, group_size: int = 32, overrides=()):
        self.default = self._name(request, group_size)
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
        raise ConversionError(f"unknown dtype {request!r} (choose {', '.join(REQUESTS)})")

    def __call__(self, name: str, shape) -> str:
        if len(shape) != 2:
            return "f32"
        dtype = self.default
        if dtype in QUANT and name in ("token_embd.weight", "output.weight"):
            dtype = "q8" if dtype.startswith("q4") else "f16"  # the head shapes every logit
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
        # q4_g128 -> q4_g64 -> q8 -> f16 (q4 and q4m -> q8).
        while dtype in QUANT and shape[1] % row_multiple(dtype):
            dtype = {"q4_g128": "q4_g64", "q8": "f16"}.get(dtype, "q8")
        return dtype
