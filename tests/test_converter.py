"""Tests of converter/: HF LLaMA folder -> .flm, checked against transformers itself.

The reference for every value is what transformers does with the same folder
(LlamaForCausalLM.from_pretrained): the weights, the hyperparameters and the RoPE inverse
frequencies (`model.model.rotary_emb.inv_freq`, which must match bit for bit).
"""

from __future__ import annotations

import io
import json
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from converter import checkpoint, quantize
from converter.convert import ConversionError, convert, main
from converter.flm_reader import bf16_to_f32, load_flm, read_flm
from converter.flm_writer import FlmWriter
from converter.spm_tokenizer import load_spm
from hf_models import STORIES_HF, edit_config, load_model, make_llama, rope_of, transformers_major

ROOT = Path(__file__).resolve().parents[1]

LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 32}

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


# ---- helpers ------------------------------------------------------------------------------------

def leftovers(folder: Path) -> list:
    """Temporary files the writer may have left in `folder`."""
    return [p.name for p in Path(folder).iterdir() if p.name.endswith(".tmp")]


def as_flm(t: torch.Tensor, dtype: str) -> np.ndarray:
    """What the .flm data of `t` must be: f32 values, f16 values, or bf16 bit patterns."""
    if dtype == "f32":
        return t.to(torch.float32).numpy()
    if dtype == "f16":
        return t.half().numpy()
    return t.bfloat16().view(torch.int16).numpy().view(np.uint16)


def expected_tensors(model, tied: bool) -> dict:
    """The .flm tensors (name -> (float32 torch tensor, is_matrix)) that `model` must give."""
    sd = {k: v.detach() for k, v in model.state_dict().items()}
    cfg = model.config
    exp = {"token_embd.weight": (sd["model.embed_tokens.weight"], True)}
    for i in range(cfg.num_hidden_layers):
        p, b = f"model.layers.{i}.", f"blk.{i}."
        a, m = p + "self_attn.", p + "mlp."
        exp[b + "attn_norm.weight"] = (sd[p + "input_layernorm.weight"], False)
        exp[b + "attn_qkv.weight"] = (torch.cat([sd[a + "q_proj.weight"], sd[a + "k_proj.weight"],
                                                 sd[a + "v_proj.weight"]]), True)
        exp[b + "attn_output.weight"] = (sd[a + "o_proj.weight"], True)
        exp[b + "ffn_norm.weight"] = (sd[p + "post_attention_layernorm.weight"], False)
        exp[b + "ffn_gate_up.weight"] = (torch.cat([sd[m + "gate_proj.weight"],
                                                    sd[m + "up_proj.weight"]]), True)
        exp[b + "ffn_down.weight"] = (sd[m + "down_proj.weight"], True)
        if cfg.attention_bias:
            exp[b + "attn_qkv.bias"] = (torch.cat([sd[a + "q_proj.bias"], sd[a + "k_proj.bias"],
                                                   sd[a + "v_proj.bias"]]), False)
            exp[b + "attn_output.bias"] = (sd[a + "o_proj.bias"], False)
        if cfg.mlp_bias:
            exp[b + "ffn_gate_up.bias"] = (torch.cat([sd[m + "gate_proj.bias"],
                                                      sd[m + "up_proj.bias"]]), False)
            exp[b + "ffn_down.bias"] = (sd[m + "down_proj.bias"], False)
    exp["output_norm.weight"] = (sd["model.norm.weight"], False)
    if not tied:
        exp["output.weight"] = (sd["lm_head.weight"], True)
    return exp


def spm_reference(model_file: Path):
    """pieces, scores, types of a tokenizer.model according to the sentencepiece library."""
    import sentencepiece
    sp = sentencepiece.SentencePieceProcessor(model_file=str(model_file))
    pieces, scores, types = [], [], []
    for i in range(sp.get_piece_size()):
        pieces.append(sp.id_to_piece(i))
        scores.append(sp.get_score(i))
        if sp.is_unknown(i):
            types.append(2)
        elif sp.is_control(i):
            types.append(3)
        elif sp.is_unused(i):
            types.append(5)
        elif sp.is_byte(i):
            types.append(6)
        else:
            types.append(None)  # normal or user-defined: the processor does not tell them apart
    return sp, pieces, scores, types


def check_conversion(hf_path: Path, out: Path, dtype: str = "f32", expect_tied=None):
    """Converts hf_path and checks every value of the result against transformers."""
    convert(hf_path, out, dtype=dtype, progress=False)
    assert out.is_file()
    assert leftovers(out.parent) == []
    f = load_flm(out)
    meta, tensors = f.metadata, f.tensors
    model = load_model(hf_path)
    cfg = model.config

    # hyperparameters
    assert meta["general.architecture"] == "llama"
    assert meta["general.name"] == Path(hf_path).resolve().name
    assert meta["general.source"] == "hf"
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    assert meta["llama.vocab_size"] == cfg.vocab_size
    assert meta["llama.hidden_size"] == cfg.hidden_size
    assert meta["llama.intermediate_size"] == cfg.intermediate_size
    assert meta["llama.num_layers"] == cfg.num_hidden_layers
    assert meta["llama.num_heads"] == cfg.num_attention_heads
    assert meta["llama.num_kv_heads"] == cfg.num_key_value_heads
    assert meta["llama.head_dim"] == head_dim
    assert meta["llama.context_length"] == cfg.max_position_embeddings
    assert meta["llama.rms_norm_eps"] == cfg.rms_norm_eps
    for key, t in [("llama.vocab_size", "i64"), ("llama.rms_norm_eps", "f64"),
                   ("llama.rope.inv_freq", "f32 array"), ("tokenizer.tokens", "string array"),
                   ("tokenizer.token_types", "i64 array"), ("llama.rope.type", "string")]:
        assert f.meta_types[key] == t, key
    tied = bool(meta["llama.tie_word_embeddings"])
    if expect_tied is not None:
        assert tied == expect_tied

    # RoPE: bit-identical to transformers' own buffer
    theta, rope_type, _ = rope_of(cfg)
    assert meta["llama.rope.type"] == rope_type
    assert meta["llama.rope.theta"] == theta
    ref = model.model.rotary_emb.inv_freq.detach().to(torch.float32).numpy()
    inv = meta["llama.rope.inv_freq"]
    assert inv.dtype == np.float32 and inv.shape == (head_dim // 2,)
    assert np.array_equal(inv.view(np.uint32), ref.view(np.uint32)), (inv, ref)
    assert meta["llama.rope.attention_factor"] == model.model.rotary_emb.attention_scaling == 1.0

    # tensors
    exp = expected_tensors(model, tied)
    assert set(tensors) == set(exp)
    assert list(tensors)[0] == "token_embd.weight"
    for name, (t, is_matrix) in exp.items():
        want_dtype = dtype if is_matrix else "f32"
        ft = tensors[name]
        assert ft.dtype == want_dtype, name
        assert ft.shape == tuple(t.shape), name
        want = as_flm(t, want_dtype)
        assert ft.data.dtype == want.dtype, name
        assert np.array_equal(ft.data, want), name
        assert f.locations[name].offset % 64 == 0
        assert (f.data_offset + f.locations[name].offset) % 64 == 0
    assert f.data_offset % 64 == 0

    # tokenizer
    sp, pieces, scores, types = spm_reference(Path(hf_path) / "tokenizer.model")
    n = len(pieces)
    tokens = meta["tokenizer.tokens"]
    assert meta["tokenizer.model"] == "spm"
    assert len(tokens) == len(meta["tokenizer.scores"]) == len(meta["tokenizer.token_types"]) \
        == cfg.vocab_size
    assert tokens[:n] == pieces
    assert meta["tokenizer.scores"][:n].tolist() == scores
    got_types = meta["tokenizer.token_types"].tolist()
    for i, t in enumerate(types):
        assert got_types[i] == t if t is not None else got_types[i] in (1, 4), i
    assert tokens[n:] == [f"<extra_{k}>" for k in range(cfg.vocab_size - n)]
    assert got_types[n:] == [5] * (cfg.vocab_size - n)
    assert meta["tokenizer.scores"][n:].tolist() == [0.0] * (cfg.vocab_size - n)
    assert meta["tokenizer.bos_id"] == sp.bos_id()
    assert meta["tokenizer.eos_id"] == sp.eos_id()
    assert meta["tokenizer.unk_id"] == sp.unk_id()
    assert meta["tokenizer.pad_id"] == sp.pad_id()
    assert sp.eos_id() in meta["tokenizer.eos_ids"].tolist()
    return f


# ---- stories260K (a real checkpoint) -----------------------------------------------------------

@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
def test_stories260k(tmp_path, dtype):
    f = check_conversion(STORIES_HF, tmp_path / "stories.flm", dtype, expect_tied=True)
    meta = f.metadata
    assert meta["general.name"] == "hf"
    assert meta["llama.num_kv_heads"] == 4 and meta["llama.head_dim"] == 8
    assert meta["llama.rms_norm_eps"] == 1e-5
    assert meta["tokenizer.eos_ids"].tolist() == [2]
    assert meta["tokenizer.add_bos"] == 1
    # documented in shared/models/stories260K/PROVENANCE.md
    assert meta["tokenizer.add_dummy_prefix"] == 1
    assert meta["tokenizer.remove_extra_whitespaces"] == 0
    assert meta["tokenizer.byte_fallback"] == 1
    assert "tokenizer.chat_template" not in meta
    assert "output.weight" not in f.tensors


def test_stories260k_tokenizer_options_match_protobuf():
    """The hand-written protobuf decoder agrees with sentencepiece's ModelProto (when the
    protobuf package is there to run it)."""
    from sentencepiece import sentencepiece_model_pb2 as pb  # protobuf is in requirements.txt
    proto = pb.ModelProto()
    proto.ParseFromString((STORIES_HF / "tokenizer.model").read_bytes())
    m = load_spm(STORIES_HF / "tokenizer.model")
    assert m.add_dummy_prefix == proto.normalizer_spec.add_dummy_prefix
    assert m.remove_extra_whitespaces == proto.normalizer_spec.remove_extra_whitespaces
    assert m.byte_fallback == proto.trainer_spec.byte_fallback
    assert m.types == [p.type for p in proto.pieces]


# ---- random-weight configurations ---------------------------------------------------------------

CASES = {
    "mha": (dict(vocab_size=515), "f32"),
    "gqa": (dict(vocab_size=515, num_key_value_heads=2), "f16"),
    "mqa_3layers": (dict(num_key_value_heads=1, num_hidden_layers=3), "bf16"),
    "tied": (dict(vocab_size=515, tie_word_embeddings=True), "bf16"),
    "llama3_rope": (dict(rope_theta=500000.0, rope_scaling=LLAMA3, head_dim=32), "f32"),
    "llama3_rope_v5": (dict(rope_theta=500000.0, rope_scaling=LLAMA3, head_dim=32,
                            config_style="v5"), "f32"),
    "linear_rope": (dict(rope_scaling={"rope_type": "linear", "factor": 4.0}), "f32"),
    "linear_rope_v5": (dict(rope_theta=20000.0, rope_scaling={"rope_type": "linear", "factor": 2.5},
                            config_style="v5"), "f16"),
    "bias": (dict(attention_bias=True, mlp_bias=True, num_key_value_heads=2), "f32"),
    "bias_bf16": (dict(attention_bias=True, mlp_bias=True), "bf16"),
    "head_dim": (dict(head_dim=32, num_key_value_heads=2), "f32"),
    "sharded_safetensors": (dict(max_shard_size="20KB", vocab_size=515), "f32"),
    "pytorch_bin": (dict(safe_serialization=False, vocab_size=515), "f16"),
    "pytorch_bin_sharded_tied": (dict(safe_serialization=False, max_shard_size="20KB",
                                      tie_word_embeddings=True), "f32"),
    "v5_config": (dict(rope_theta=1000000.0, config_style="v5", vocab_size=515), "f32"),
    "as_saved": (dict(rope_theta=250000.0, config_style=None), "f32"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_random_config(tmp_path, case):
    overrides, dtype = CASES[case]
    path = make_llama(tmp_path, **overrides)
    cfg = json.loads((path / "config.json").read_text())
    style = overrides.get("config_style", "v4")
    if style == "v5" and transformers_major() < 5:
        pytest.skip("transformers 4.x ignores rope_parameters: no reference to compare with")
    if style == "v4":
        assert "rope_parameters" not in cfg and "rope_theta" in cfg
    elif style == "v5":
        assert "rope_parameters" in cfg and "rope_theta" not in cfg and "rope_scaling" not in cfg
    if overrides.get("max_shard_size"):
        index = "model.safetensors.index.json" if overrides.get("safe_serialization", True) \
            else "pytorch_model.bin.index.json"
        assert (path / index).is_file()
    if overrides.get("safe_serialization") is False:
        assert not list(path.glob("*.safetensors"))
    tied = overrides.get("tie_word_embeddings", False)
    check_conversion(path, tmp_path / "out.flm", dtype, expect_tied=tied)


def test_llama3_rope_covers_all_bands(tmp_path):
    """The llama3 case above has frequencies in all three bands (kept, blended, divided)."""
    path = make_llama(tmp_path, rope_theta=500000.0, rope_scaling=LLAMA3, head_dim=32)
    convert(path, tmp_path / "a.flm", progress=False)
    meta, _ = read_flm(tmp_path / "a.flm")
    inv = meta["llama.rope.inv_freq"].astype(np.float64)
    base = 1.0 / (500000.0 ** (np.arange(0, 32, 2) / 32))
    wavelen = 2 * np.pi / base
    orig = LLAMA3["original_max_position_embeddings"]
    kept = wavelen < orig / LLAMA3["high_freq_factor"]
    divided = wavelen > orig / LLAMA3["low_freq_factor"]
    blended = ~kept & ~divided
    assert kept.any() and divided.any() and blended.any()
    np.testing.assert_allclose(inv[kept], base[kept], rtol=1e-6)
    np.testing.assert_allclose(inv[divided], base[divided] / 8.0, rtol=1e-6)
    assert np.all(inv[blended] < base[blended]) and np.all(inv[blended] > base[blended] / 8.0)


def test_legacy_rope_scaling_type_key(tmp_path):
    """Old configs say rope_scaling {"type": "linear"}; transformers still reads them."""
    path = make_llama(tmp_path, rope_scaling={"rope_type": "linear", "factor": 3.0})
    edit_config(path, rope_scaling={"type": "linear", "factor": 3.0})
    f = check_conversion(path, tmp_path / "out.flm")
    assert f.metadata["llama.rope.type"] == "linear"


def test_rope_scaling_wins_over_rope_parameters(tmp_path):
    """Both styles in one config.json: transformers 5.24 takes a non-empty rope_scaling, and the
    top-level rope_theta fills in its missing theta."""
    path = make_llama(tmp_path)
    edit_config(path, rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 5000.0},
                rope_scaling={"rope_type": "linear", "factor": 3.0}, rope_theta=7000.0)
    f = check_conversion(path, tmp_path / "out.flm")
    assert f.metadata["llama.rope.theta"] == 7000.0


def test_top_level_original_context_overrides_llama3s(tmp_path):
    """A top-level original_max_position_embeddings replaces the rope dict's when the model is
    built (transformers' standardize_rope_params)."""
    path = make_llama(tmp_path, rope_theta=500000.0, rope_scaling=LLAMA3, head_dim=32)
    edit_config(path, original_max_position_embeddings=64)
    check_conversion(path, tmp_path / "out.flm")


def test_eos_ids_add_bos_and_chat_template(tmp_path):
    path = make_llama(tmp_path, vocab_size=515, eos_token_id=[2, 9])
    gen = json.loads((path / "generation_config.json").read_text())
    gen["eos_token_id"] = [9, 2, 12]
    (path / "generation_config.json").write_text(json.dumps(gen))
    tc = json.loads((path / "tokenizer_config.json").read_text())
    tc["add_bos_token"] = False
    tc["chat_template"] = [{"name": "tool_use", "template": "TOOLS"},
                           {"name": "default", "template": "{{ messages }}"}]
    (path / "tokenizer_config.json").write_text(json.dumps(tc))
    meta, _ = read_flm(convert(path, tmp_path / "out.flm", progress=False))
    assert meta["tokenizer.eos_ids"].tolist() == [2, 9, 12]
    assert meta["tokenizer.eos_id"] == 2
    assert meta["tokenizer.add_bos"] == 0
    assert meta["tokenizer.chat_template"] == "{{ messages }}"

    tc["chat_template"] = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    (path / "tokenizer_config.json").write_text(json.dumps(tc))
    meta, _ = read_flm(convert(path, tmp_path / "out.flm", progress=False))
    assert meta["tokenizer.chat_template"] == tc["chat_template"]


def test_trained_tokenizer_options(tmp_path):
    """A freshly trained sentencepiece model with non-default options (checks the decoder on
    negative-free custom ids, user-defined pieces and the normalizer flags)."""
    import sentencepiece
    from conftest import SHARED
    text = (SHARED / "models" / "corpora" / "tinyshakespeare.txt").read_text()
    buf = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(text[:50000].splitlines()), model_writer=buf, vocab_size=300,
        model_type="bpe", add_dummy_prefix=False, remove_extra_whitespaces=True,
        byte_fallback=False, unk_id=0, bos_id=1, eos_id=2, pad_id=3,
        user_defined_symbols=["<tool>"], minloglevel=2)
    path = make_llama(tmp_path, vocab_size=304)
    (path / "tokenizer.model").write_bytes(buf.getvalue())
    f = check_conversion(path, tmp_path / "out.flm")
    meta = f.metadata
    assert meta["tokenizer.pad_id"] == 3
    assert meta["tokenizer.add_dummy_prefix"] == 0
    assert meta["tokenizer.remove_extra_whitespaces"] == 1
    assert meta["tokenizer.byte_fallback"] == 0
    assert meta["tokenizer.token_types"][4] == 4  # <tool>: user-defined
    assert meta["tokenizer.tokens"][4] == "<tool>"


# ---- errors ---------------------------------------------------------------------------------------

def assert_nothing_written(out: Path):
    assert not out.exists()
    assert leftovers(out.parent) == []


def test_unsupported_architecture(tmp_path):
    path = make_llama(tmp_path)
    edit_config(path, architectures=["GPT2LMHeadModel"], model_type="gpt2")
    out = tmp_path / "out.flm"
    with pytest.raises(ConversionError, match="GPT2LMHeadModel"):
        convert(path, out, progress=False)
    assert_nothing_written(out)


def test_model_type_without_architectures(tmp_path):
    path = make_llama(tmp_path)
    edit_config(path, architectures=None, model_type="gpt2")
    with pytest.raises(ConversionError, match="gpt2"):
        convert(path, tmp_path / "out.flm", progress=False)
    edit_config(path, model_type="llama")
    convert(path, tmp_path / "out.flm", progress=False, model_type="llama")
    assert (tmp_path / "out.flm").is_file()


@pytest.mark.parametrize("missing, message", [
    ("model.safetensors", "missing weights"),
    ("config.json", "config.json"),
    ("tokenizer.model", "tokenizer.model"),
])
def test_missing_file(tmp_path, missing, message):
    path = make_llama(tmp_path)
    (path / missing).unlink()
    out = path / "out.flm"  # in the model folder itself: nothing may appear there either
    before = sorted(p.name for p in path.iterdir())
    with pytest.raises(ConversionError, match=message):
        convert(path, out, progress=False)
    assert_nothing_written(out)
    assert sorted(p.name for p in path.iterdir()) == before


def test_missing_shard(tmp_path):
    path = make_llama(tmp_path, max_shard_size="20KB")
    shard = sorted(path.glob("model-*.safetensors"))[-1]
    shard.unlink()
    with pytest.raises(ConversionError, match=shard.name):
        convert(path, tmp_path / "out.flm", progress=False)
    assert_nothing_written(tmp_path / "out.flm")


def test_unsupported_rope_type(tmp_path):
    path = make_llama(tmp_path)
    edit_config(path, rope_scaling={"rope_type": "yarn", "factor": 4.0})
    with pytest.raises(ConversionError, match="yarn"):
        convert(path, tmp_path / "out.flm", progress=False)
    assert_nothing_written(tmp_path / "out.flm")


def test_tokenizer_larger_than_vocab(tmp_path):
    path = make_llama(tmp_path, vocab_size=500)
    with pytest.raises(ConversionError, match="512 pieces"):
        convert(path, tmp_path / "out.flm", progress=False)


def test_wrong_tensor_shape(tmp_path):
    path = make_llama(tmp_path)
    edit_config(path, intermediate_size=100)
    with pytest.raises(ConversionError, match="gate_proj.weight"):
        convert(path, tmp_path / "out.flm", progress=False)
    assert_nothing_written(tmp_path / "out.flm")


@pytest.mark.parametrize("exc", [RuntimeError, KeyboardInterrupt])
def test_failure_while_writing_leaves_old_output(tmp_path, monkeypatch, exc):
    """An error (or Ctrl-C) in the middle of the data pass removes the temporary file and leaves
    an existing output file untouched."""
    path = make_llama(tmp_path)
    out = tmp_path / "out.flm"
    out.write_bytes(b"previous")
    real_get = checkpoint.Checkpoint.get
    calls = []

    def failing_get(self, name):
        calls.append(name)
        if len(calls) == 5:
            raise exc("boom")
        return real_get(self, name)

    monkeypatch.setattr(checkpoint.Checkpoint, "get", failing_get)
    with pytest.raises(exc):
        convert(path, out, progress=False)
    assert out.read_bytes() == b"previous"
    assert leftovers(tmp_path) == []


def test_main_prints_error_without_traceback(tmp_path, capsys):
    path = make_llama(tmp_path)
    edit_config(path, architectures=["GPT2LMHeadModel"], model_type="gpt2")
    capsys.readouterr()  # drop what saving the model printed
    rc = main(["--model_path", str(path), "--out_path", str(tmp_path / "o.flm")])
    err = capsys.readouterr().err
    assert rc == 1
    assert err.startswith("error: ") and "GPT2LMHeadModel" in err
    assert "Traceback" not in err
    assert_nothing_written(tmp_path / "o.flm")


def test_cli(tmp_path):
    out = tmp_path / "stories-f16.flm"
    r = subprocess.run([sys.executable, str(ROOT / "converter" / "convert.py"),
                        "--model_path", str(STORIES_HF), "--out_path", str(out), "--dtype", "f16"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "32/32" in r.stderr  # the progress bar
    meta, tensors = read_flm(out)
    assert tensors["blk.0.attn_qkv.weight"].dtype == "f16"
    assert tensors["blk.0.attn_norm.weight"].dtype == "f32"
    r = subprocess.run([sys.executable, str(ROOT / "converter" / "convert.py"),
                        "--model_path", str(tmp_path / "nope"), "--out_path", str(out)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 1
    assert r.stderr.startswith("error: ") and "Traceback" not in r.stderr


# ---- writer and reader ----------------------------------------------------------------------------

def test_writer_reader_roundtrip(tmp_path):
    w = FlmWriter(tmp_path / "t.flm")
    w.add_i64("a.int", -(1 << 62))
    w.add_f64("a.float", 1e-5)
    w.add_string("a.str", "héllo ▁")
    w.add_i64_array("a.ints", [1, -1, 1 << 40])
    w.add_f32_array("a.floats", np.array([0.1, 2.5], dtype=np.float32))
    w.add_string_array("a.strs", ["", "x", "<0x0A>"])
    w.add_i64_array("a.empty", [])
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    h = np.arange(5, dtype=np.float16)
    bf = torch.tensor([1.5, -2.0, 3.25]).bfloat16().view(torch.int16).numpy().view(np.uint16)
    w.add_tensor("x", "f32", (3, 4), lambda: x)
    w.add_tensor("h", "f16", (5,), lambda: h)
    w.add_tensor("bf", "bf16", (3,), lambda: bf)
    w.add_tensor("x4", "f32", (1, 1, 3, 4), lambda: x.reshape(1, 1, 3, 4))
    with pytest.raises(ValueError, match="duplicate"):
        w.add_i64("a.int", 1)
    with pytest.raises(ValueError, match="duplicate"):
        w.add_tensor("x", "f32", (1,), lambda: None)
    with pytest.raises(ValueError, match="dims"):
        w.add_tensor("y", "f32", (1, 1, 1, 1, 1), lambda: None)
    w.write()
    f = load_flm(tmp_path / "t.flm")
    m = f.metadata
    assert m["a.int"] == -(1 << 62) and m["a.float"] == 1e-5 and m["a.str"] == "héllo ▁"
    assert m["a.ints"].tolist() == [1, -1, 1 << 40] and m["a.empty"].tolist() == []
    assert m["a.floats"].tolist() == [np.float32(0.1), 2.5]
    assert m["a.strs"] == ["", "x", "<0x0A>"]
    assert np.array_equal(f.tensors["x"].data, x)
    assert np.array_equal(f.tensors["h"].data, h)
    assert bf16_to_f32(f.tensors["bf"].data).tolist() == [1.5, -2.0, 3.25]
    assert f.tensors["x4"].shape == (1, 1, 3, 4)
    raw = (tmp_path / "t.flm").read_bytes()
    assert raw[:8] == b"FASTLLM\0"
    assert struct.unpack_from("<IIQQQ", raw, 8) == (3, 0, 7, 4, f.data_offset)
    assert all(loc.offset % 64 == 0 for loc in f.locations.values())
    assert f.file_size == f.data_offset + f.locations["x4"].offset + 48


def test_writer_rejects_wrong_data(tmp_path):
    w = FlmWriter(tmp_path / "t.flm")
    w.add_tensor("x", "f16", (2, 2), lambda: np.zeros((2, 2), dtype=np.float32))
    with pytest.raises(ValueError, match="dtype"):
        w.write()
    assert_nothing_written(tmp_path / "t.flm")


def test_writer_producer_failing_midway(tmp_path):
    """A producer that fails while earlier tensors are still being written (by the writer's
    thread, from its two buffers) leaves no file; the same writes without it give every tensor's
    bytes."""
    rng = np.random.default_rng(0)
    ws = [rng.standard_normal((32, 64)).astype(np.float32) for _ in range(5)]

    def build(path, fail_at=None):
        w = FlmWriter(path, dtype_policy=quantize.DtypePolicy("int8"))
        for i, a in enumerate(ws):
            def produce(i=i, a=a):
                if i == fail_at:
                    raise RuntimeError("producer failed")
                return a
            w.add_tensor(f"blk.{i}.ffn_up.weight", "f32", a.shape, produce)
        return w

    out = tmp_path / "t.flm"
    with pytest.raises(RuntimeError, match="producer failed"):
        build(out, fail_at=3).write()
    assert_nothing_written(out)
    build(out).write()
    f = load_flm(out)
    for i, a in enumerate(ws):
        t = f.tensors[f"blk.{i}.ffn_up.weight"]
        assert t.dtype == "q8"
        assert np.array_equal(np.asarray(t.data).view(np.uint8).ravel(), quantize.quantize(a, "q8").ravel())


def _flm_bytes(tmp_path) -> bytes:
    w = FlmWriter(tmp_path / "ok.flm")
    w.add_string("k", "v")
    w.add_tensor("a", "f32", (4,), lambda: np.ones(4, dtype=np.float32))
    w.add_tensor("b", "f32", (2,), lambda: np.ones(2, dtype=np.float32))
    w.write()
    return (tmp_path / "ok.flm").read_bytes()


def test_reader_rejects_malformed(tmp_path):
    good = _flm_bytes(tmp_path)
    f = load_flm(tmp_path / "ok.flm")
    bad = tmp_path / "bad.flm"

    def check(data: bytes, message: str):
        bad.write_bytes(data)
        with pytest.raises(ValueError, match=message):
            load_flm(bad)

    check(b"", "shorter than")
    check(b"GGUF" + good[4:], "bad magic")
    check(good[:8] + struct.pack("<I", 4) + good[12:], "unsupported .flm version 4")
    check(good[:32] + struct.pack("<Q", f.data_offset + 1) + good[40:], "not a multiple of 64")
    check(good[:-4], "run past the end")
    # the second tensor's table entry: make its offset equal the first's -> overlap
    name_b = struct.pack("<Q", 1) + b"b"
    pos = good.index(name_b) + len(name_b) + 8 + 8  # dtype, n_dims, dims[1]
    check(good[:pos] + struct.pack("<Q", 0) + good[pos + 8:], "overlap")
    # n_bytes that does not match the dims
    check(good[:pos + 8] + struct.pack("<Q", 12) + good[pos + 16:], "n_bytes")
