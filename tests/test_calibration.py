"""convert.py --calib: activation-aware scaling of input channels and GPTQ rounding
(converter/calibrate.py)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from conftest import STORIES
from converter import calibrate, hf_tokenizer, quantize
from converter.checkpoint import Checkpoint
from converter.convert import ConversionError, convert, main
from converter.families import llama
from converter.flm_reader import read_flm
from converter.flm_writer import FlmWriter
from hf_models import load_model, make_llama, make_model

CALIB_TEXT = STORIES / "text" / "tinystories_sample.txt"
EVAL_TEXT = STORIES / "text" / "tinystories_valid_head.txt"


def _force_alpha(monkeypatch, alpha=0.5):
    """Every searched group takes `alpha` (the search could keep some unscaled)."""
    def search(stat, x, w, dtype, alphas, tie=None):
        return alpha, calibrate._scales(stat, alpha, tie), 0.0, 1.0
    monkeypatch.setattr(calibrate, "_search", search)


def _write_f32(ckpt, hp, out):
    """What convert() writes, from a (scaled) checkpoint, every tensor at f32."""
    writer = FlmWriter(out, dtype_policy=quantize.DtypePolicy("f32"))
    tied = llama.add_tensors(writer, ckpt, hp, "f32")
    writer.add_string("general.architecture", "llama")
    writer.add_string("general.name", "scaled")
    writer.add_string("general.source", "hf")
    llama.add_metadata(writer, hp, tied)
    hf_tokenizer.add_tokenizer_metadata(
        writer, hf_tokenizer.read_tokenizer(ckpt, hp.vocab_size, llama.ADD_BOS_DEFAULT))
    writer.write()
    return out


@pytest.mark.parametrize("bias", [False, True], ids=["plain", "bias"])
def test_folding_keeps_the_function(tmp_path, monkeypatch, bias):
    """Scales chosen for int4 (forced to alpha 0.5 everywhere), not rounded, written at f32: the
    model is the same function (GQA: 4 query heads on 2 KV heads; intermediate 128 so down_proj
    is int4 too)."""
    import fastllm
    path = make_llama(tmp_path, num_attention_heads=4, num_key_value_heads=2, hidden_size=64,
                      intermediate_size=128, attention_bias=bias, mlp_bias=bias)
    ckpt = Checkpoint(path)
    hp = llama.read_hparams(ckpt.config)
    _force_alpha(monkeypatch)
    monkeypatch.setattr(calibrate, "_gptq_layers", lambda *args: None)  # rounding changes it
    scaled, report = calibrate.calibrate(ckpt, hp, quantize.DtypePolicy("int4"), CALIB_TEXT,
                                         n_tokens=300)
    assert report.n_tokens == 300
    assert [g.name for g in report.groups] == [f"blk.{i}.{n}.weight" for i in range(2) for n in
                                               ("attn_qkv", "attn_output", "ffn_gate_up", "ffn_down")]
    p = "model.layers.0."
    expect = {p + n for n in ("input_layernorm.weight", "post_attention_layernorm.weight",
                              "self_attn.q_proj.weight", "self_attn.v_proj.weight",
                              "self_attn.o_proj.weight", "mlp.up_proj.weight",
                              "mlp.down_proj.weight")}
    if bias:
        expect |= {p + "self_attn.v_proj.bias", p + "mlp.up_proj.bias"}
    assert expect <= set(scaled.overrides)
    for name in expect:  # really changed
        assert not torch.allclose(scaled.get(name), ckpt.get(name).float(), rtol=1e-3, atol=0)

    ref = load_model(path).eval()
    ids = [1] + list(np.random.default_rng(0).integers(3, hp.vocab_size, 40))
    with torch.no_grad():
        expected = ref(torch.tensor([ids])).logits[0].numpy()
        # the same in transformers with the scaled weights
        ref.load_state_dict({**ref.state_dict(), **scaled.overrides})
        folded = ref(torch.tensor([ids])).logits[0].numpy()
    scale = np.abs(expected).max()
    assert np.abs(folded - expected).max() <= 1e-5 * scale

    flm = _write_f32(scaled, hp, tmp_path / "scaled.flm")
    with fastllm.Model(flm, threads=2) as m:
        got = m.forward(ids)
    assert np.abs(got - expected).max() <= 1e-4 * scale


@pytest.mark.parametrize("family", ["qwen2", "qwen3", "phi3", "gemma2"])
def test_folding_keeps_the_function_in_every_family(tmp_path, monkeypatch, family):
    """As above, on transformers alone: the family's layout says which rows absorb 1/s (Qwen2's
    v rows carry a bias; Qwen3 normalises q and k per head; Phi-3's v rows are the last rows of
    its fused qkv_proj and its up rows the second half of gate_up_proj; Gemma 2's norms scale by
    1 + w and its MLP input norm is pre_feedforward_layernorm)."""
    from converter.families import FAMILIES
    extra = dict(attention_bias=True) if family == "qwen3" else {}
    path = make_model(tmp_path, family, num_attention_heads=4, num_key_value_heads=2,
                      intermediate_size=128, **extra)
    ckpt = Checkpoint(path)
    hp = FAMILIES[family].read_hparams(ckpt.config)
    _force_alpha(monkeypatch)
    monkeypatch.setattr(calibrate, "_gptq_layers", lambda *args: None)
    scaled, report = calibrate.calibrate(ckpt, hp, quantize.DtypePolicy("int4"), CALIB_TEXT,
                                         n_tokens=200)
    assert len(report.groups) == 4 * hp.num_layers
    ref = load_model(path).eval()
    ids = list(np.random.default_rng(0).integers(3, hp.vocab_size - 20, 40))
    with torch.no_grad():
        expected = ref(torch.tensor([ids])).logits[0].numpy()
        ref.load_state_dict({**ref.state_dict(), **scaled.overrides})
        folded = ref(torch.tensor([ids])).logits[0].numpy()
    for name in scaled.overrides:  # every override really changed its tensor
        assert not torch.allclose(scaled.get(name), ckpt.get(name).float(), rtol=1e-3, atol=0), name
    assert np.abs(folded - expected).max() <= 1e-5 * np.abs(expected).max()


def test_alpha_zero_is_a_candidate():
    """The search cannot do worse than no scaling on its own rows."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((64, 128)).astype(np.float32) * np.linspace(0.1, 3, 128, dtype=np.float32)
    w = rng.standard_normal((32, 128)).astype(np.float32)
    stat = np.abs(x).mean(axis=0)
    alpha, s, err, err0 = calibrate._search(stat, x, w, "q4", (0.25, 0.5, 1.0))
    assert err <= err0
    if alpha == 0:
        assert np.all(s == 1)
    assert abs(np.sqrt(s.max() * s.min()) - 1) < 1e-5


@pytest.mark.parametrize("dtype", ["q8", "q6", "q4", "q4_g64", "q4_g128", "q4m", "q4k", "q6k"])
def test_gptq_rounds_onto_its_grid_and_beats_nearest(dtype):
    """GPTQ's weights are exactly representable on the grid it returns (quantize() stores them
    unchanged), and on the inputs it was given the output error is well below rounding each
    weight to its nearest code with the usual scale search."""
    rng = np.random.default_rng(3)
    mix = rng.standard_normal((128, 128)) * 0.3 + np.eye(128)  # correlated input channels
    x = (rng.standard_normal((512, 128)) @ mix).astype(np.float32) * np.linspace(0.2, 2, 128, dtype=np.float32)
    w = rng.standard_normal((40, 128)).astype(np.float32)
    q, grid = calibrate.gptq(w, x.T.astype(np.float64) @ x, dtype)
    np.testing.assert_array_equal(quantize.dequantize(quantize.quantize(q, dtype, grid), dtype, w.shape), q)
    nearest = quantize.dequantize(quantize.quantize(w, dtype), dtype, w.shape)
    err = lambda v: float(np.square(x @ (w - v).T, dtype=np.float64).sum())
    assert err(q) < 0.85 * err(nearest), (err(q), err(nearest))
    with pytest.raises(ConversionError, match="grid"):
        quantize.quantize(q, dtype, quantize.Grid(grid.scale[:-1], grid.mins))


def test_calibrated_file_holds_the_rounded_weights(tmp_path):
    """convert --calib stores exactly the weights calibrate() rounded (the writer does not search
    scales again), for int4, int8 and the q4_k_m preset (K grids, two formats in one file)."""
    path = make_llama(tmp_path / "hf", num_attention_heads=4, num_key_value_heads=2, hidden_size=64,
                      intermediate_size=128)
    ckpt = Checkpoint(path)
    hp = llama.read_hparams(ckpt.config)
    for dtype, stored in (("int4", ("q4", "q4")), ("int8", ("q8", "q8")), ("q4_k_m", ("q6k", "q4k"))):
        out = convert(path, tmp_path / f"{dtype}.flm", dtype=dtype, progress=False, calib=CALIB_TEXT,
                      calib_tokens=300)
        policy = quantize.DtypePolicy(dtype, n_layers=hp.num_layers)
        scaled, _ = calibrate.calibrate(ckpt, hp, policy, CALIB_TEXT, n_tokens=300)
        _, tensors = read_flm(out)
        for (flm_name, parts), want in zip((("blk.1.attn_qkv.weight", ("q", "k", "v")),
                                            ("blk.0.attn_output.weight", ("o",))), stored):
            got_dtype, shape, data = tensors[flm_name]
            assert got_dtype == want
            rounded = torch.cat([scaled.get(f"model.layers.{flm_name[4]}.self_attn.{p}_proj.weight")
                                 for p in parts]).numpy()
            assert scaled.grid(f"model.layers.{flm_name[4]}.self_attn.{parts[0]}_proj.weight") is not None
            np.testing.assert_array_equal(quantize.dequantize(np.asarray(data), want, shape), rounded)


def _log_softmax(x):
    x = x.astype(np.float64)
    m = x.max(axis=1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=1, keepdims=True))


def test_stories260k_calibrated(tmp_path):
    """stories260K calibrated on tinystories_sample.txt (1882 tokens; not in the evaluation text).
    Perplexity on the first 300 documents of tinystories_valid_head.txt (29302 scored tokens;
    f32 4.2047), top-1 agreement and mean KL from the f32 model over the positions of the first
    40 (4099):

                     perplexity        top-1     KL
        int8         4.2099 (+0.12%)   98.98%    4.1e-4
        int8 + calib 4.2038 (-0.02%)   99.19%    3.1e-4
        int4         4.4838 (+6.6%)    87.1%     0.069
        int4 + calib 4.3327 (+3.0%)    90.6%     0.042

    (int4m 4.3946 -> 4.3530, +3.5%; int4 --group_size 64 + calib 4.4141, +5.0%, where llama.cpp's
    Q4_0 gives 4.4617. Scaling with clipping and no GPTQ gave int4 4.4418, +5.6%. int8 + calib
    agreement with FASTLLM_ISA=avx2: 99.07%, scalar: 99.27%.) The issue's bounds are int8
    top-1 >= 99% and int4 within 5% of f32; only calibrated rounding meets them on this model."""
    import fastllm
    from fastllm.perplexity import perplexity
    text = EVAL_TEXT.read_text(encoding="utf-8")
    docs = [d for d in text.split("\n\n") if d.strip()][:40]
    ppl, logits = {}, {}
    for name, dtype, calib in (("f32", "f32", None), ("int4", "int4", None),
                               ("int4+calib", "int4", CALIB_TEXT), ("int8+calib", "int8", CALIB_TEXT)):
        out = convert(STORIES / "hf", tmp_path / f"{name}.flm", dtype=dtype, progress=False,
                      calib=calib)
        with fastllm.Model(out, threads=2) as m:
            logits[name] = np.concatenate([m.forward(m.tokenize(d)) for d in docs])
            ppl[name] = perplexity(m, text, max_documents=300).perplexity
    ref = _log_softmax(logits["f32"])
    kl = {name: float((np.exp(ref) * (ref - _log_softmax(logits[name]))).sum(1).mean())
          for name in ppl}
    top1 = {name: float((logits[name].argmax(1) == logits["f32"].argmax(1)).mean()) for name in ppl}
    assert ppl["int4+calib"] < ppl["f32"] * 1.05 and ppl["int4+calib"] < ppl["int4"], ppl
    assert kl["int4+calib"] < 0.75 * kl["int4"], kl
    assert top1["int8+calib"] >= 0.99 and ppl["int8+calib"] < ppl["f32"] * 1.005, (top1, ppl)


def test_errors(tmp_path, capsys):
    hf = STORIES / "hf"
    out = tmp_path / "out.flm"
    with pytest.raises(ConversionError, match="int4"):
        convert(hf, out, dtype="f16", calib=CALIB_TEXT, progress=False)
    with pytest.raises(ConversionError, match="int4"):
        convert(hf, out, dtype="bf16", calib=CALIB_TEXT, progress=False)
    with pytest.raises(ConversionError, match="does not exist"):
        convert(hf, out, dtype="int4", calib=tmp_path / "missing.txt", progress=False)
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF" + b"\0" * 60)
    with pytest.raises(ConversionError, match="calibration needs an HF checkpoint"):
        convert(gguf, out, dtype="int4", calib=CALIB_TEXT, progress=False)
    renamed = tmp_path / "model.bin"
    renamed.write_bytes(b"GGUF" + b"\0" * 60)
    with pytest.raises(ConversionError, match="calibration needs an HF checkpoint"):
        convert(renamed, out, dtype="int4", calib=CALIB_TEXT, progress=False)
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n  \n")
    with pytest.raises(ConversionError, match="empty"):
        convert(hf, out, dtype="int4", calib=empty, progress=False)
    # every q4 matrix forced to f16: nothing to calibrate
    with pytest.raises(ConversionError, match="nothing to calibrate"):
        convert(hf, out, dtype="int4", calib=CALIB_TEXT, dtype_config=["blk.*=f16"],
                progress=False)
    assert not out.exists()
    assert main(["--model_path", str(hf), "--out_path", str(out), "--dtype", "f16",
                 "--calib", str(CALIB_TEXT), "--quiet"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "--calib" in err and "Traceback" not in err
