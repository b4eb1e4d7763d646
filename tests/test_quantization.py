"""int8 / int4 quality against the f32 model (each test fails if quantization breaks), the
dtype rules of the converter, and the perplexity tool.

Measured (stories260K, 40 validation stories = 4,099 positions; ppl on the first 300 stories):
  dtype   top-1 agreement   mean KL     perplexity (f32 4.2047)
  int8    98.98%            4.1e-4      4.2099 (+0.12%)
  q6      97.4%             3.5e-3      4.2124 (+0.18%)
  int4    87.2%             0.069       4.4832 (+6.6%)
  int4m   90.2%             0.046       4.3943 (+4.5%)
llama.cpp's own quantizations of the same model, evaluated with the same code (its GGUF imported at
f32): Q8_0 99.07% / 3.4e-4 / 4.2088, Q4_0 87.7% / 0.072 / 4.4617 (+6.1%). int8's shortfall from
99% is the 8-bit format on this 64-wide model (weights and activations both rounded), not the
kernels; with --calib (GPTQ rounding) int8 agrees 99.19% (tests/test_calibration.py). On the
random model (near-flat next-token distributions, so many near-ties) int8 agrees 96.9% with mean
KL 9e-6, int4 73%; llama.cpp's Q8_0 arithmetic, simulated exactly, 96.6% (bench/int8_agreement.py)."""
import numpy as np
import pytest
import torch

import fastllm
from conftest import STORIES, convert
from converter import quantize
from converter.flm_reader import read_flm
from fastllm.perplexity import perplexity
from hf_models import load_model, make_llama

VALID = (STORIES / "text" / "tinystories_valid_head.txt").read_text(encoding="utf-8")
DOCS = [d for d in VALID.split("\n\n") if d.strip()][:40]


def log_softmax(x):
    x = x.astype(np.float64)
    m = x.max(axis=1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=1, keepdims=True))


def agreement_and_kl(ref, q):
    lp, lq = log_softmax(ref), log_softmax(q)
    return float((ref.argmax(1) == q.argmax(1)).mean()), float((np.exp(lp) * (lp - lq)).sum(1).mean())


@pytest.fixture(scope="module")
def stories_models(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("quant")
    return {dt: convert(STORIES / "hf", tmp / f"{dt}.flm", dt)
            for dt in ("f32", "int8", "int4", "int4m", "q6", "q4_k_m", "q5_k_m")}


def stories_logits(path):
    with fastllm.Model(path, threads=2) as m:
        return np.concatenate([m.forward(m.tokenize(d)) for d in DOCS])


@pytest.mark.parametrize("dtype,min_agree,max_kl", [("int8", 0.985, 1e-3), ("q6", 0.965, 5e-3), ("int4", 0.85, 0.1),
                                                    ("int4m", 0.88, 0.07)])
def test_stories_agreement(stories_models, dtype, min_agree, max_kl):
    agree, kl = agreement_and_kl(stories_logits(stories_models["f32"]), stories_logits(stories_models[dtype]))
    assert agree >= min_agree and kl <= max_kl, (agree, kl)


@pytest.fixture(scope="module")
def random_model(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("rand")
    hf = make_llama(tmp / "hf", hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2, max_position_embeddings=512, seed=5)
    return {dt: convert(hf, tmp / f"{dt}.flm", dt) for dt in ("f32", "int8", "int4")}


@pytest.mark.parametrize("dtype,min_agree,max_kl", [("int8", 0.96, 1e-4), ("int4", 0.60, 5e-3)])
def test_random_model_agreement(random_model, dtype, min_agree, max_kl):
    ids = np.random.default_rng(0).integers(3, 512, size=(6, 256)).tolist()
    with fastllm.Model(random_model["f32"]) as f, fastllm.Model(random_model[dtype]) as q:
        ref = np.concatenate([f.forward(x) for x in ids])
        got = np.concatenate([q.forward(x) for x in ids])
    agree, kl = agreement_and_kl(ref, got)
    assert agree >= min_agree and kl <= max_kl, (agree, kl)


def test_stories_perplexity(stories_models):
    ppl = {dt: perplexity(fastllm.Model(p, threads=2), VALID, max_documents=300).perplexity
           for dt, p in stories_models.items()}
    assert abs(ppl["f32"] / 4.20 - 1) < 0.01, ppl   # transformers measured 4.20 (PROVENANCE.md)
    assert ppl["int8"] / ppl["f32"] - 1 < 0.01, ppl
    assert ppl["q6"] / ppl["f32"] - 1 < 0.01, ppl
    assert ppl["int4m"] / ppl["f32"] - 1 < 0.05, ppl
    assert ppl["int4"] / ppl["f32"] - 1 < 0.08, ppl
    # the K presets without calibration (measured +4.0% and +1.1%): within 5% at 4 bits (issue 16)
    assert ppl["q4_k_m"] / ppl["f32"] - 1 < 0.05 and ppl["q4_k_m"] < ppl["int4m"] < ppl["int4"], ppl
    assert ppl["q5_k_m"] / ppl["f32"] - 1 < 0.02, ppl


def test_perplexity_command(stories_models, tmp_path):
    import subprocess
    import sys
    from test_cli import ENV
    r = subprocess.run([sys.executable, "-m", "fastllm", "perplexity", str(stories_models["f32"]),
                        str(STORIES / "text" / "tinystories_valid_head.txt"), "--max-documents", "20"],
                       capture_output=True, text=True, env=ENV, timeout=120)
    assert r.returncode == 0, r.stderr
    expected = perplexity(fastllm.Model(stories_models["f32"]), VALID, max_documents=20).perplexity
    assert f"perplexity {expected:.4f}" in r.stdout


def test_file_holds_what_the_quantizer_made(stories_models):
    """The .flm bytes of a quantized tensor decode to the quantizer's own dequantization, and the
    stored dtypes follow the rules (head one step more precise; rows of 172 fall back)."""
    meta, tensors = read_flm(stories_models["int4"])
    dtypes = {name: t[0] for name, t in tensors.items()}
    assert dtypes["blk.0.attn_qkv.weight"] == "q4" and dtypes["token_embd.weight"] == "q8"
    assert dtypes["blk.0.ffn_down.weight"] == "f16" and dtypes["blk.0.attn_norm.weight"] == "f32"
    _, tensors8 = read_flm(stories_models["int8"])
    assert tensors8["token_embd.weight"][0] == "f16" and tensors8["blk.0.ffn_gate_up.weight"][0] == "q8"
    hf = load_model(STORIES / "hf").state_dict()
    w = torch.cat([hf[f"model.layers.0.self_attn.{p}_proj.weight"] for p in "qkv"]).numpy()
    dtype, shape, data = tensors["blk.0.attn_qkv.weight"]
    stored = quantize.dequantize(np.asarray(data), "q4", shape)
    np.testing.assert_array_equal(stored, quantize.dequantize(quantize.quantize(w, "q4"), "q4", w.shape))
    assert np.abs(stored - w).max() < 0.6 * np.abs(w).max() / 7


@pytest.mark.parametrize("dtype", sorted(quantize.QUANT))
def test_quantize_round_trip_error(dtype):
    w = np.random.default_rng(1).standard_normal((8, 256)).astype(np.float32)
    err = quantize.dequantize(quantize.quantize(w, dtype), dtype, w.shape) - w
    rms = float(np.sqrt((err ** 2).mean()))
    assert rms < {"q8": 0.006, "q6": 0.025, "q6k": 0.025, "q5k": 0.04, "q3k": 0.16}.get(dtype, 0.11), rms


def test_dtype_policy_rules_and_overrides():
    p = quantize.DtypePolicy("int4", 128, ["blk.0.*=f16", "blk.1.attn_qkv.weight=q8"])
    assert p("blk.0.attn_qkv.weight", (64, 256)) == "f16"
    assert p("blk.1.attn_qkv.weight", (64, 256)) == "q8"
    assert p("blk.2.attn_qkv.weight", (64, 256)) == "q4_g128"
    assert p("blk.2.attn_qkv.weight", (64, 192)) == "q4_g64"  # 192 is not a multiple of 128, but of 64
    assert p("blk.2.attn_qkv.weight", (64, 96)) == "q8"  # nor of 64
    assert p("blk.2.ffn_down.weight", (64, 172)) == "f16"
    assert p("output.weight", (512, 256)) == "q8" and p("blk.2.attn_norm.weight", (256,)) == "f32"
    assert quantize.DtypePolicy("int8")("token_embd.weight", (512, 64)) == "f16"
    assert quantize.DtypePolicy("f16")("blk.0.attn_qkv.weight", (64, 64)) == "f16"
    assert quantize.DtypePolicy("int4", 32, ["output.weight=q6"])("output.weight", (512, 256)) == "q6"
    for bad in (("int4", 48, ()), ("int3", 32, ()), ("int8", 32, ["nonsense"]), ("int4m", 64, ())):
        with pytest.raises(quantize.ConversionError):
            quantize.DtypePolicy(*bad)
    with pytest.raises(quantize.ConversionError, match="multiple of 64"):
        quantize.DtypePolicy("f32", 32, ["*=q4"])("blk.0.ffn_down.weight", (64, 172))


def test_int4_with_a_q6_head(stories_models, tmp_path):
    """A q6 head (llama.cpp's Q4_0 files keep theirs at 6 bits; stories260K's head is its embedding,
    token_embd.weight): stored as the quantizer made it, and the model scores about as well as
    int4 with its q8 head."""
    from converter.convert import convert as run
    path = tmp_path / "int4-q6head.flm"
    run(str(STORIES / "hf"), str(path), dtype="int4", dtype_config=["token_embd.weight=q6"], progress=False)
    _, tensors = read_flm(path)
    dtype, shape, data = tensors["token_embd.weight"]
    head = load_model(STORIES / "hf").state_dict()["lm_head.weight"].numpy()
    assert dtype == "q6" and tensors["blk.0.attn_qkv.weight"][0] == "q4"
    np.testing.assert_array_equal(np.asarray(data), quantize.quantize(head, "q6"))
    ppl = {name: perplexity(fastllm.Model(p, threads=2), VALID, max_documents=100).perplexity
           for name, p in (("q8 head", stories_models["int4"]), ("q6 head", path))}
    assert abs(ppl["q6 head"] / ppl["q8 head"] - 1) < 0.01, ppl


def test_version1_quantized_files_are_refused(stories_models, tmp_path):
    """.flm version 1 stored quantized rows one after another; reading them as tiles would be garbage."""
    import struct
    data = bytearray(stories_models["int8"].read_bytes())
    assert struct.unpack_from("<I", data, 8)[0] == 3
    struct.pack_into("<I", data, 8, 1)
    old = tmp_path / "v1.flm"
    old.write_bytes(bytes(data))
    with pytest.raises(fastllm.FastLLMError, match="version 1 layout; convert the model again") as e:
        fastllm.Model(old)
    assert e.value.status_name == "FASTLLM_ERR_UNSUPPORTED"
    with pytest.raises(ValueError, match="version 1 layout"):
        read_flm(old)


def test_codes_are_the_masked_division():
    """quantize._codes (one division by the broadcast scales, the rest in place) gives exactly the
    codes of the plain formula it replaced, for float32 and float64 scales and zero ones: the
    files' bytes depend on it."""
    import numpy as np
    from converter import quantize
    rng = np.random.default_rng(7)
    g = rng.standard_normal((64, 8, 32)).astype(np.float32)
    for d in (np.abs(g).max(axis=2, keepdims=True) / 7.3, np.abs(g).max(axis=2, keepdims=True) / np.float64(7.3)):
        d[3, 2] = 0
        for offset, lo, hi in ((0, -8, 7), (8, 0, 15), (0, 0, 15)):
            want = np.clip(np.rint(np.divide(g, d, out=np.zeros_like(g), where=d != 0)) + offset, lo, hi)
            got = quantize._codes(g, d, offset, lo, hi)
            assert got.dtype == want.dtype and np.array_equal(got, want)
