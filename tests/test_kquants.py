"""The K formats (q3k, q4k, q5k, q6k), their presets and the GGUF files whose blocks they hold.

The library's kernels read a file the converter wrote: a model in a K format must give the logits
of the same model with the file's weights decoded to f32 (converter/quantize.py's dequantize, an
independent reading of the layout), up to the int8 rounding of the activations; GGUF Q4_K / Q4_0 /
Q4_1 / Q8_0 tensors go over without re-rounding (equal to the gguf package's dequantization)."""
from __future__ import annotations

import gguf
import numpy as np
import pytest

import fastllm
from conftest import convert
from converter import gguf_import, quantize
from converter.errors import ConversionError
from converter.flm_reader import load_flm
from converter.flm_writer import FlmWriter
from gguf_models import write_gguf
from hf_models import make_llama

K_DTYPES = ("q3k", "q4k", "q5k", "q6k")


def decoded_copy(src, dst):
    """src with every quantized matrix replaced by its f32 decoding."""
    f = load_flm(src)
    w = FlmWriter(dst)
    for key, value in f.metadata.items():
        getattr(w, "add_" + f.meta_types[key].replace(" ", "_"))(key, value)
    for name, t in f.tensors.items():
        if t.dtype in quantize.QUANT:
            w.add_tensor(name, "f32", t.shape, lambda t=t: quantize.dequantize(np.asarray(t.data), t.dtype, t.shape))
        else:
            w.add_tensor(name, t.dtype, t.shape, lambda t=t: np.asarray(t.data))
    w.write(progress=False)
    return dst


def rel(a, b):
    return float(np.abs(a - b).max() / np.abs(b).max())


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    # rows of 320 (a super-block and a short one of 64) and 192; 2 layers
    return make_llama(tmp_path_factory.mktemp("kq") / "hf", hidden_size=320, intermediate_size=192,
                      num_hidden_layers=2, num_attention_heads=5, num_key_value_heads=1, seed=11)


@pytest.mark.parametrize("dtype", K_DTYPES + ("q4",))
def test_kernels_read_what_the_converter_wrote(hf_dir, tmp_path, dtype):
    """Logits of a K-format file = logits of its weights decoded to f32, within the int8
    activation rounding that q4 (an older format) shows as well; a misread layout is off by ~100%."""
    path = convert(hf_dir, tmp_path / f"{dtype}.flm", dtype)
    assert {t.dtype for n, t in load_flm(path).tensors.items() if n.startswith("blk.") and len(t.shape) == 2} == {dtype}
    ids = np.random.default_rng(0).integers(3, 500, size=48).tolist()
    with fastllm.Model(path) as q, fastllm.Model(decoded_copy(path, tmp_path / "decoded.flm")) as d:
        got, want = q.forward(ids), d.forward(ids)
        step = q.session()
        step_logits = [step.eval([t]) for t in ids[:8]]
    assert rel(got, want) < 0.03, rel(got, want)  # the prompt path (several tokens a pass)
    assert rel(np.stack(step_logits), want[:8]) < 0.03  # the decode path (one token)


@pytest.mark.parametrize("dtype", K_DTYPES)
def test_more_bits_less_error(dtype):
    """Each format's weight error: q3k > q4k > q5k > q6k, and the K formats are at least as good as
    the f16-scale formats of the same bits (q4m, q6) though their scales take fewer bytes."""
    w = np.random.default_rng(1).standard_normal((64, 512)).astype(np.float32)
    err = lambda dt: float(np.sqrt(((quantize.round_trip(w, dt) - w) ** 2).mean()))
    bound = {"q3k": 0.16, "q4k": 0.075, "q5k": 0.036, "q6k": 0.022}[dtype]
    assert err(dtype) < bound, err(dtype)
    if dtype == "q4k":
        assert err("q4k") < 1.01 * err("q4m") and quantize.tensor_bytes("q4k", w.shape) < quantize.tensor_bytes("q4m", w.shape)


def test_weighted_search_beats_plain_rounding():
    """The K search (weighted least squares over candidate scales) has less weighted error than
    rounding with the plain min/max range."""
    g = np.random.default_rng(2).standard_normal((256, 8, 32)).astype(np.float32) ** 3  # heavy tails
    grid = quantize.choose_grid(g, "q4k")
    codes = quantize.round_to_grid(g, grid, "q4k")
    searched = quantize.from_codes(codes, grid, "q4k")
    lo, hi = g.min(2, keepdims=True), g.max(2, keepdims=True)
    plain = np.rint((g - lo) / ((hi - lo) / 15)) * ((hi - lo) / 15) + lo
    w = np.abs(g) + np.sqrt((g * g).mean(2, keepdims=True))
    assert (w * (searched - g) ** 2).sum() < 0.8 * (w * (plain - g) ** 2).sum()


def test_presets_pick_dtypes_per_tensor():
    p = quantize.DtypePolicy("q4_k_m", n_layers=30)
    more = [i for i in range(30) if p(f"blk.{i}.ffn_down.weight", (576, 1536)) == "q6k"]
    assert more == [0, 1, 2, 5, 8, 11, 14, 17, 20, 23, 26, 27, 28, 29]  # llama.cpp's use_more_bits
    assert all(p(f"blk.{i}.attn_qkv.weight", (960, 576)) == ("q6k" if i in more else "q4k") for i in range(30))
    assert p("blk.3.attn_output.weight", (576, 576)) == "q4k" and p("blk.3.ffn_gate_up.weight", (3072, 576)) == "q4k"
    assert p("token_embd.weight", (49152, 576)) == "q6k"  # tied: the head
    quantize.tell_policy(p, 30, tied=False)
    assert p("token_embd.weight", (49152, 576)) == "q4k" and p("output.weight", (49152, 576)) == "q6k"
    assert p("blk.0.attn_norm.weight", (576,)) == "f32"
    assert p("blk.3.ffn_down.weight", (576, 96)) == "q8"  # rows of 96: no K format takes them
    o = quantize.DtypePolicy("q3_k_m", overrides=["blk.3.*=q5k"], n_layers=30)
    assert o("blk.3.ffn_gate_up.weight", (3072, 576)) == "q5k" and o("blk.4.ffn_gate_up.weight", (3072, 576)) == "q3k"
    assert o("blk.4.ffn_down.weight", (576, 1536)) == "q4k" and o("blk.4.attn_output.weight", (576, 576)) == "q4k"
    with pytest.raises(ConversionError, match="q4_k_m"):  # an unknown name lists the presets
        quantize.DtypePolicy("q4_k_x")
    with pytest.raises(ConversionError, match="layer count"):
        quantize.DtypePolicy("q4_k_m")("blk.0.ffn_down.weight", (576, 1536))
    with pytest.raises(ConversionError, match="GGUF"):
        quantize.DtypePolicy("auto")("blk.0.ffn_down.weight", (576, 1536))


def test_preset_file(hf_dir, tmp_path):
    """A q4_k_m file: the preset's dtypes, logits closer to f32's than int4's."""
    path = convert(hf_dir, tmp_path / "m.flm", "q4_k_m")
    dtypes = {n: t.dtype for n, t in load_flm(path).tensors.items()}
    # of 2 layers, use_more_bits picks the last
    assert dtypes["blk.0.ffn_down.weight"] == "q4k" and dtypes["blk.1.ffn_down.weight"] == "q6k"
    assert dtypes["blk.0.ffn_gate_up.weight"] == "q4k" and dtypes["blk.0.attn_output.weight"] == "q4k"
    f32, int4 = convert(hf_dir, tmp_path / "f32.flm"), convert(hf_dir, tmp_path / "int4.flm", "int4")
    ids = np.random.default_rng(3).integers(3, 500, size=64).tolist()
    with fastllm.Model(path) as q, fastllm.Model(f32) as f, fastllm.Model(int4) as i4:
        ref = f.forward(ids)
        assert rel(q.forward(ids), ref) < 0.8 * rel(i4.forward(ids), ref)


def test_convert_rejects_auto_for_hf(hf_dir, tmp_path):
    from converter.convert import convert as run
    with pytest.raises(ConversionError, match="GGUF"):
        run(str(hf_dir), str(tmp_path / "x.flm"), dtype="auto", progress=False)


@pytest.fixture(scope="module")
def gguf_file(tmp_path_factory):
    """A GGUF file whose matrices have the types llama.cpp's K-quant files mix (random K blocks:
    the gguf package has no K quantizer); rows of 256 and 512 as K blocks need."""
    tmp = tmp_path_factory.mktemp("g")
    hf = make_llama(tmp / "hf", hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2, tie_word_embeddings=False, seed=12)
    Q = gguf.GGMLQuantizationType
    types = {"attn_q.weight": Q.Q4_K, "attn_k.weight": Q.Q4_K, "attn_v.weight": Q.Q4_K, "attn_output.weight": Q.Q4_1,
             "ffn_gate.weight": Q.Q4_0, "ffn_up.weight": Q.Q4_0, "ffn_down.weight": Q.Q6_K,
             "token_embd.weight": Q.Q8_0, "output.weight": Q.Q5_0}
    return write_gguf(hf, tmp / "m.gguf", types=types)


def test_gguf_blocks_kept_exactly(gguf_file, tmp_path):
    """--dtype auto: Q4_K -> q4k, Q4_0 -> q4, Q4_1 -> q4m, Q8_0 -> q8 hold exactly the weights the
    gguf package dequantizes (the f32 import); Q6_K and Q5_0 are re-rounded to q6k, and the file
    says so."""
    from converter.convert import convert as run
    auto = run(str(gguf_file), str(tmp_path / "auto.flm"), dtype="auto", progress=False)
    f32 = run(str(gguf_file), str(tmp_path / "f32.flm"), dtype="f32", progress=False)
    a, f = load_flm(auto), load_flm(f32)
    summary = a.metadata["general.quantization"]
    exact, rerounded = summary.split("; re-rounded: ")
    for part in ("Q4_K->q4k 2", "Q4_1->q4m 2", "Q4_0->q4 2", "Q8_0->q8 1"):
        assert part in exact, summary
    assert "Q6_K->q6k 2" in rerounded and "Q5_0->q6k 1" in rerounded, summary
    dt = {n: t.dtype for n, t in a.tensors.items()}
    assert (dt["blk.0.attn_qkv.weight"], dt["blk.0.attn_output.weight"], dt["blk.0.ffn_gate_up.weight"],
            dt["blk.0.ffn_down.weight"], dt["token_embd.weight"], dt["output.weight"]) == \
        ("q4k", "q4m", "q4", "q6k", "q8", "q6k")
    for name, t in a.tensors.items():
        if t.dtype in quantize.QUANT:
            got = quantize.dequantize(np.asarray(t.data), t.dtype, t.shape)
            ref = np.asarray(f.tensors[name].data)
            if t.dtype == "q6k":
                assert 0 < rel(got, ref) < 0.05
            else:
                np.testing.assert_allclose(got, ref, rtol=1e-6, atol=1e-7 * np.abs(ref).max())
    ids = np.random.default_rng(4).integers(3, 500, size=32).tolist()
    with fastllm.Model(auto) as m, fastllm.Model(f32) as r:
        assert rel(m.forward(ids), r.forward(ids)) < 0.03


def test_auto_dtype_of_mixed_and_low_bit_types():
    """A fused tensor of several types takes the most precise; 2-3 bit and IQ types become q4k."""
    assert gguf_import.auto_dtype(["Q4_K", "Q6_K", "Q4_K"]) == "q6k"
    assert gguf_import.auto_dtype(["Q4_0", "Q4_K"]) == "q4k" and gguf_import.auto_dtype(["Q8_0", "Q5_0"]) == "q8"
    assert gguf_import.auto_dtype(["Q3_K"]) == "q4k" and gguf_import.auto_dtype(["IQ4_XS"]) == "q4k"
    assert gguf_import.auto_dtype(["F16"]) == "f16"


def test_gguf_q4k_to_a_preset_target(gguf_file, tmp_path):
    """A preset whose dtype for a tensor is its GGUF format keeps the blocks; the others re-round."""
    from converter.convert import convert as run
    out = run(str(gguf_file), str(tmp_path / "p.flm"), dtype="q4_k_s", progress=False)
    summary = load_flm(out).metadata["general.quantization"]
    exact, rerounded = summary.split("; re-rounded: ")
    assert "Q4_K->q4k 2" in exact and "Q4_1->q4k 2" in rerounded and "Q4_0->q4k 2" in rerounded, summary


def test_info_shows_bits_and_source(gguf_file, tmp_path):
    import subprocess
    import sys
    from converter.convert import convert as run
    from test_cli import ENV
    auto = run(str(gguf_file), str(tmp_path / "auto.flm"), dtype="auto", progress=False)
    r = subprocess.run([sys.executable, "-m", "fastllm", "info", auto], capture_output=True, text=True, env=ENV,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert "general.quantization = from GGUF: kept exactly:" in r.stdout and "Q6_K->q6k 2" in r.stdout
    assert "bits per weight over" in r.stdout
