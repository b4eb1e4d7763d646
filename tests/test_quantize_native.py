"""The library's quantizer (fastllm_quantize, libfastllm/format/quantize.cpp) against its reference
twin, the converter's numpy search (converter/quantize.py): the same bytes for every quantized dtype,
on matrices that reach the searches' corners (all-zero and constant groups, signed zeros, values
near the f16 limits and far below them, a few nonzero weights in a group, rows that are not a
multiple of the tile, a short last super-block); the converter takes the library when it finds it,
and keeps to numpy with FASTLLM_CONVERTER_NATIVE=0; bad arguments get a status and a message."""
from __future__ import annotations

import ctypes

import numpy as np
import pytest

from conftest import BUILD, REPO
from converter import quantize
from converter.errors import ConversionError
from hf_models import make_llama

DTYPES = tuple(quantize.QUANT)


def matrices(cols: int, seed: int):
    rng = np.random.default_rng(seed)
    yield "normal", rng.standard_normal((37, cols)).astype(np.float32) * 0.02
    yield "heavy tails", (rng.standard_t(2, (20, cols)) * 0.1).astype(np.float32)
    yield "tiny", rng.uniform(-1, 1, (16, cols)).astype(np.float32) * 1e-30
    yield "large", rng.uniform(-1, 1, (5, cols)).astype(np.float32) * 3e4
    yield "f16 weights", rng.standard_normal((33, cols)).astype(np.float16).astype(np.float32)
    z = rng.standard_normal((17, cols)).astype(np.float32)
    z[3] = 0                    # all-zero groups: the symmetric searches keep a scale of -0
    z[5, :40] = 0
    z[6] = 1.5                  # constant
    z[7] = -0.0
    z[8, ::2], z[8, 1::2] = -0.0, 0.0
    z[9, 5:] = 0                # one group with a few weights, the rest empty
    z[10] = np.where(rng.random(cols) < 0.9, 0, z[10])
    z[11] = rng.integers(-3, 4, cols)
    z[12], z[13] = np.abs(z[12]), -np.abs(z[13])  # one sign: the minimum at 0 (K formats)
    z[14] *= 1e-42              # subnormal
    yield "corners", z
    # half-integers with a group maximum of 8 or 127: codes land on ties of rint, where the
    # library's multiplication by a reciprocal must give way to the division
    h = rng.integers(-16, 17, (8, cols)) / 2
    h[:, ::32] = 8
    h[4:, 1::32] = 127
    yield "ties", h.astype(np.float32)
    # a group's largest |x| many times over, with both signs, first negative in some groups: the
    # codes the library divides once per candidate (Divisor::pin)
    yield "extremes", (rng.choice([-1.0, 1.0, 0.3, -0.55], (8, cols)) * 0.02).astype(np.float32)


def test_the_library_is_found():
    assert quantize.native() is not None, "converter/quantize.py did not find libfastllm (FASTLLM_LIBRARY, build/)"
    header = (REPO / "include" / "fastllm.h").read_text()
    assert f"#define FASTLLM_ABI_VERSION {quantize.LIBRARY_ABI}\n" in header


@pytest.mark.parametrize("isa", ["best", "avx2", "scalar"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_same_bytes_as_the_numpy_search(dtype, isa, monkeypatch):
    """At the CPU's best level (AVX-512: 16 groups a vector; AVX2: 8), at FASTLLM_ISA=avx2 (8 where
    the CPU has AVX2, else as scalar) and at the baseline (4)."""
    if isa != "best":
        monkeypatch.setenv("FASTLLM_ISA", isa)
    # 384 = 256 + 128: a K format's last super-block is short; 320 where the group allows (q4_g128 does not)
    for cols in sorted({quantize.row_multiple(dtype) * 3, 384}):
        for seed in (0, 1):
            for what, w in matrices(cols, seed):
                ref = quantize.quantize(w, dtype, use_native=False)
                got = quantize.quantize(w, dtype)
                assert got.shape == ref.shape, (what, cols)
                diff = np.flatnonzero(got != ref)
                assert diff.size == 0, f"{what}, cols {cols}, seed {seed}: {diff.size} bytes differ, first at {diff[:4]}"


def test_converted_model_is_the_same_file(tmp_path, monkeypatch):
    """A whole conversion to a K preset with the library and without it."""
    from converter.convert import convert
    model = make_llama(tmp_path, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2)
    convert(str(model), str(tmp_path / "native.flm"), dtype="q4_k_m", progress=False)
    monkeypatch.setenv("FASTLLM_CONVERTER_NATIVE", "0")
    quantize.native.cache_clear()
    try:
        assert quantize.native() is None
        convert(str(model), str(tmp_path / "numpy.flm"), dtype="q4_k_m", progress=False)
    finally:
        monkeypatch.delenv("FASTLLM_CONVERTER_NATIVE")
        quantize.native.cache_clear()
    assert (tmp_path / "native.flm").read_bytes() == (tmp_path / "numpy.flm").read_bytes()


@pytest.fixture(scope="module")
def lib():
    lib = ctypes.CDLL(str(BUILD / "libfastllm.so"))
    lib.fastllm_quantize.restype = ctypes.c_int
    lib.fastllm_quantize.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,
                                     ctypes.c_int64, ctypes.c_int32, ctypes.c_void_p, ctypes.c_size_t]
    for f in (lib.fastllm_quantize_f16, lib.fastllm_quantize_bf16):
        f.restype, f.argtypes = ctypes.c_int, lib.fastllm_quantize.argtypes
    lib.fastllm_quantized_size.restype = ctypes.c_size_t
    lib.fastllm_quantized_size.argtypes = [ctypes.c_char_p, ctypes.c_int64, ctypes.c_int64]
    lib.fastllm_last_error.restype = ctypes.c_char_p
    return lib


def run(lib, dtype, w, threads=0, size=None, rows=None, first=0, fill=0):
    """fastllm_quantize of w as rows [first, first + len(w)) of a matrix of `rows` (default: w's),
    into a buffer filled with `fill`."""
    rows = w.shape[0] if rows is None else rows
    out = np.full(quantize.tensor_bytes(dtype, (rows, w.shape[1])) if size is None else size, fill, dtype=np.uint8)
    status = lib.fastllm_quantize(dtype.encode(), w.ctypes.data, rows, w.shape[1], first, w.shape[0], threads,
                                  out.ctypes.data, out.size)
    return status, out, lib.fastllm_last_error().decode()


@pytest.mark.parametrize("dtype", DTYPES)
def test_sizes_and_threads(lib, dtype):
    w = np.random.default_rng(3).standard_normal((70, 256)).astype(np.float32)
    assert lib.fastllm_quantized_size(dtype.encode(), 70, 256) == quantize.tensor_bytes(dtype, (70, 256))
    one = run(lib, dtype, w, threads=1)
    assert one[0] == 0, one[2]
    for threads in (2, 3, 64):  # 64 threads for 5 tiles: no more threads than tiles
        assert np.array_equal(run(lib, dtype, w, threads=threads)[1], one[1])


def half_weights(kind: str, cols: int) -> np.ndarray:
    """35 rows of 16-bit floats (float16, or bfloat16 bits as quantize.BF16) of every kind: normal,
    subnormal, zero, the largest, infinities and NaN (row 2)."""
    rng = np.random.default_rng(6)
    if kind == "f16":
        h = (rng.standard_normal((35, cols)) * 0.05).astype(np.float16)
        h[1] = rng.integers(-1023, 1024, cols).astype(np.float16) * np.float16(2.0 ** -24)  # subnormal
        h[2, :5] = [65504, -65504, np.inf, -np.inf, np.nan]
        h[3] = 0
        return h
    top = lambda f: (np.asarray(f, np.float32).view(np.uint32) >> 16).astype(np.uint16)  # truncated to bf16
    h = top(rng.standard_normal((35, cols)) * 0.05)
    sign = rng.integers(0, 2, cols).astype(np.uint16) << 15
    h[1] = rng.integers(0, 128, cols).astype(np.uint16) | sign  # subnormal
    h[2, :5] = [0x7F7F, 0xFF7F, 0x7F80, 0xFF80, 0x7FC0]  # the largest, -largest, inf, -inf, NaN
    h[3] = 0
    return h.view(quantize.BF16)


@pytest.mark.parametrize("isa", ["best", "avx2", "scalar"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", ["f16", "bf16"])
def test_16bit_weights_give_the_bytes_of_their_float32(lib, kind, dtype, isa, monkeypatch):
    """fastllm_quantize_f16 and _bf16 widen each row themselves (f16: F16C with AVX2, 16 at a time
    with AVX-512, one value at a time at the baseline): the bytes of fastllm_quantize on the widened
    matrix, for values of every kind."""
    if isa != "best":
        monkeypatch.setenv("FASTLLM_ISA", isa)
    cols = max(quantize.row_multiple(dtype) * 2, 256)
    h = half_weights(kind, cols)
    wide = quantize.as_float32(h)
    assert wide.dtype == np.float32 and np.isnan(wide[2, 4]) and np.isinf(wide[2, 2]) and wide[2, 0] > 1e4
    fn = lib.fastllm_quantize_f16 if kind == "f16" else lib.fastllm_quantize_bf16
    for threads in (1, 2):
        out = np.zeros(quantize.tensor_bytes(dtype, h.shape), np.uint8)
        assert fn(dtype.encode(), h.ctypes.data, 35, cols, 0, 35, threads, out.ctypes.data, out.size) == 0, \
            lib.fastllm_last_error()
        status, ref, msg = run(lib, dtype, wide, threads=threads)
        assert status == 0, msg
        assert np.array_equal(out, ref), f"{np.count_nonzero(out != ref)} bytes differ"
    finite = np.concatenate([h[:2], h[3:]])  # (the numpy search has no bytes of its own for inf and NaN)
    numpy_search = quantize.quantize(quantize.as_float32(finite), dtype, use_native=False)
    assert np.array_equal(quantize.quantize(finite, dtype), numpy_search)


@pytest.mark.parametrize("dtype", ["int8", "int4", "q4_k_m"])
@pytest.mark.parametrize("kind", ["f16", "bf16"])
def test_16bit_folder_quantized_as_it_lies(tmp_path, monkeypatch, kind, dtype):
    """An f16 or bf16 checkpoint's matrices go to the library as they lie in the file (no float32
    copy; int8's f16 head from an f16 folder is not widened either): the same file as when torch
    widens them first."""
    import torch
    from safetensors.torch import load_file, save_file
    from converter.convert import convert
    model = make_llama(tmp_path, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2)
    st = model / "model.safetensors"
    to = {"f16": torch.float16, "bf16": torch.bfloat16}[kind]
    save_file({k: v.to(to) for k, v in load_file(st).items()}, st, metadata={"format": "pt"})
    kept = []
    real = quantize._quantize_native
    monkeypatch.setattr(quantize, "_quantize_native", lambda lib, w, *a: kept.append(w.dtype) or real(lib, w, *a))
    convert(str(model), str(tmp_path / "kept.flm"), dtype=dtype, progress=False)
    assert kept.count(np.float16 if kind == "f16" else quantize.BF16) >= 2 * 4, kept  # 2 layers' 4 matrices at least
    monkeypatch.setattr(quantize, "takes_f16", lambda: False)
    monkeypatch.setattr(quantize, "takes_bf16", lambda: False)
    kept.clear()
    convert(str(model), str(tmp_path / "widened.flm"), dtype=dtype, progress=False)
    assert set(kept) == {np.dtype(np.float32)}, kept
    assert (tmp_path / "kept.flm").read_bytes() == (tmp_path / "widened.flm").read_bytes()


def test_bad_arguments(lib):
    w = np.ones((4, 64), dtype=np.float32)
    assert lib.fastllm_quantized_size(b"f16", 4, 64) == 0 and "not a quantized dtype: f16" in lib.fastllm_last_error().decode()
    assert lib.fastllm_quantized_size(None, 4, 64) == 0
    assert lib.fastllm_quantized_size(b"q4", 4, 96) == 0 and "multiple of 64" in lib.fastllm_last_error().decode()
    assert lib.fastllm_quantized_size(b"q8", -1, 64) == 0
    assert lib.fastllm_quantized_size(b"q8", 2**40, 2**20) == 0  # 2^60 weights: the size would overflow
    status, _, msg = run(lib, "q8", w, size=10)
    assert status == 1 and "out holds 10 bytes" in msg
    status = lib.fastllm_quantize(b"int4", w.ctypes.data, 4, 64, 0, 4, 0, w.ctypes.data, 64)
    assert status == 1 and "not a quantized dtype: int4" in lib.fastllm_last_error().decode()
    assert lib.fastllm_quantize(b"q8", None, 4, 64, 0, 4, 0, w.ctypes.data, 64) == 1
    assert "weights is NULL" in lib.fastllm_last_error().decode()
    assert lib.fastllm_quantize_f16(b"q8", None, 4, 64, 0, 4, 0, w.ctypes.data, 64) == 1
    assert "weights is NULL" in lib.fastllm_last_error().decode()
    assert lib.fastllm_quantize_f16(b"q4", w.ctypes.data, 4, 96, 0, 4, 0, w.ctypes.data, 64) == 1
    assert "multiple of 64" in lib.fastllm_last_error().decode()
    assert lib.fastllm_quantize_bf16(b"q8", None, 4, 64, 0, 4, 0, w.ctypes.data, 64) == 1
    assert "weights is NULL" in lib.fastllm_last_error().decode()
    assert lib.fastllm_quantize_bf16(b"q4", w.ctypes.data, 4, 96, 0, 4, 0, w.ctypes.data, 64) == 1
    assert "multiple of 64" in lib.fastllm_last_error().decode()
    assert lib.fastllm_quantize_bf16(b"q8", w.ctypes.data, 4, 64, 0, 4, 0, None, 64) == 1
    assert "out is NULL" in lib.fastllm_last_error().decode()
    size = quantize.tensor_bytes("q8", (4, 64))
    assert lib.fastllm_quantize(b"q8", w.ctypes.data, 4, 64, 0, 4, -1, w.ctypes.data, size) == 1
    assert "n_threads" in lib.fastllm_last_error().decode()
    big = np.ones((40, 64), dtype=np.float32)
    for first, n in ((8, 16), (0, 8), (16, 1), (32, 16), (-16, 16)):  # not at a tile, short parts, past the end
        status, _, msg = run(lib, "q8", big[:n], rows=40, first=first)
        assert status == 1 and "the first must be a multiple of 16" in msg, (first, n, msg)
    with pytest.raises(ConversionError, match="multiple of 64"):
        quantize.quantize(np.ones((4, 96), np.float32), "q4k")


@pytest.mark.parametrize("dtype", DTYPES)
def test_parts_of_a_matrix(lib, dtype):
    """Rows quantized in parts into the whole matrix's buffer give the bytes of the whole; each
    call writes its own tiles and nothing else (the buffer starts as garbage)."""
    w = np.random.default_rng(5).standard_normal((75, 256)).astype(np.float32)
    whole = run(lib, dtype, w)[1]
    out = np.full(whole.size, 0xA5, dtype=np.uint8)
    for first, n in ((48, 27), (0, 16), (16, 32)):
        part = np.ascontiguousarray(w[first:first + n])
        assert lib.fastllm_quantize(dtype.encode(), part.ctypes.data, 75, 256, first, n, 0, out.ctypes.data, out.size) == 0
    assert np.array_equal(out, whole)
    blocks = quantize.RowBlocks([w[:32], w[32:48], w[48:]])
    assert np.array_equal(quantize.quantize(blocks, dtype), whole)
    odd = quantize.RowBlocks([w[:20], w[20:]])  # parts that share a tile are joined first
    assert np.array_equal(quantize.quantize(odd, dtype), whole)
    assert np.array_equal(quantize.quantize(blocks, dtype, use_native=False), whole)


def test_non_finite_weights_do_not_crash(lib):
    """NaN and infinities have no meaningful codes; the library returns bytes and no error."""
    w = np.random.default_rng(4).standard_normal((16, 256)).astype(np.float32)
    w[0, 3], w[1, :] = np.nan, np.inf
    w[2, 7] = -np.inf
    for dtype in DTYPES:
        assert run(lib, dtype, w)[0] == 0
