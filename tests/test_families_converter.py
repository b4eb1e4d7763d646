"""The converter on every family (converter/families/): HF folders of LLaMA, Mistral, Qwen2, Qwen3
and Phi-3 -> .flm, checked against what transformers makes of the same folder, and each family's
GGUF file (as llama.cpp's converter writes it, tests/gguf_models.py) against its HF folder.

The reference for the metadata is the loaded transformers model: its config after its own
defaults, its rotary embedding's inv_freq (bit for bit; LongRoPE's long frequencies are what the
buffer holds after a forward pass past the original context), its attention_scaling, and where
its attention layers put a sliding window. The tensors are its state_dict, fused the way
docs/flm_format.md says. No C++ is needed.
"""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import torch

from conftest import REPO
from converter.convert import ConversionError, convert
from converter.families import FAMILIES
from converter.flm_reader import load_flm
from gguf_models import write_gguf
import hf_models
from hf_models import PHI3_ADDED, QWEN_ADDED, QWEN_BPE_SIZE, edit_config, load_model, make_model

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

LONGROPE = dict(rope_type="longrope", long_factor=[1.0 + 0.75 * i for i in range(6)],
                short_factor=[1.0 + 0.125 * i for i in range(6)])

# name -> (family, make_model overrides)
CASES = {
    "llama_bias_gqa": ("llama", dict(num_key_value_heads=2, attention_bias=True, mlp_bias=True)),
    "mistral_window": ("mistral", dict(sliding_window=8, head_dim=32, num_key_value_heads=2)),
    "mistral_no_window": ("mistral", dict(sliding_window=None)),
    "qwen2": ("qwen2", dict(num_key_value_heads=2)),
    "qwen2_tied_v4": ("qwen2", dict(tie_word_embeddings=True, rope_theta=1000000.0, config_style="v4")),
    "qwen2_window": ("qwen2", dict(use_sliding_window=True, sliding_window=8, max_window_layers=1)),
    "qwen2_window_off": ("qwen2", dict(use_sliding_window=False, sliding_window=8, max_window_layers=0)),
    "qwen3": ("qwen3", dict(num_key_value_heads=2)),
    "qwen3_bias_linear": ("qwen3", dict(attention_bias=True,
                                        rope_scaling=dict(rope_type="linear", factor=2.0))),
    "phi3": ("phi3", dict(num_key_value_heads=2)),
    "phi3_partial_longrope": ("phi3", dict(partial_rotary_factor=0.75, max_position_embeddings=256,
                                           original_max_position_embeddings=32,
                                           rope_scaling=LONGROPE)),
    "phi3_partial": ("phi3", dict(partial_rotary_factor=0.5, tie_word_embeddings=True,
                                  sliding_window=8)),
}


# ---- the references -----------------------------------------------------------------------------

def expected_tensors(model) -> dict:
    """.flm name -> float32 tensor, from the transformers model's state_dict."""
    sd = {k: v.detach().float() for k, v in model.state_dict().items()}
    exp = {"token_embd.weight": sd["model.embed_tokens.weight"]}

    def cat(*names):
        return torch.cat([sd[n] for n in names])

    for i in range(model.config.num_hidden_layers):
        p, b = f"model.layers.{i}.", f"blk.{i}."
        a, m = p + "self_attn.", p + "mlp."
        exp[b + "attn_norm.weight"] = sd[p + "input_layernorm.weight"]
        exp[b + "attn_qkv.weight"] = sd[a + "qkv_proj.weight"] if a + "qkv_proj.weight" in sd else \
            cat(a + "q_proj.weight", a + "k_proj.weight", a + "v_proj.weight")
        if a + "q_proj.bias" in sd:
            exp[b + "attn_qkv.bias"] = cat(a + "q_proj.bias", a + "k_proj.bias", a + "v_proj.bias")
        for x in "qk":
            if f"{a}{x}_norm.weight" in sd:
                exp[f"{b}attn_{x}_norm.weight"] = sd[f"{a}{x}_norm.weight"]
        exp[b + "attn_output.weight"] = sd[a + "o_proj.weight"]
        if a + "o_proj.bias" in sd:
            exp[b + "attn_output.bias"] = sd[a + "o_proj.bias"]
        exp[b + "ffn_norm.weight"] = sd[p + "post_attention_layernorm.weight"]
        exp[b + "ffn_gate_up.weight"] = sd[m + "gate_up_proj.weight"] if m + "gate_up_proj.weight" in sd \
            else cat(m + "gate_proj.weight", m + "up_proj.weight")
        if m + "gate_proj.bias" in sd:
            exp[b + "ffn_gate_up.bias"] = cat(m + "gate_proj.bias", m + "up_proj.bias")
            exp[b + "ffn_down.bias"] = sd[m + "down_proj.bias"]
        exp[b + "ffn_down.weight"] = sd[m + "down_proj.weight"]
    exp["output_norm.weight"] = sd["model.norm.weight"]
    if not model.config.tie_word_embeddings:
        exp["output.weight"] = sd["lm_head.weight"]
    return exp


def long_inv_freq(model, original: int) -> np.ndarray:
    """The frequencies transformers rotates with once a pass reaches past the original context."""
    rotary = model.model.rotary_emb
    x = torch.zeros(1, original + 1, model.config.hidden_size)
    rotary(x, torch.arange(original + 1)[None])
    inv = rotary.inv_freq.detach().clone().numpy()
    rotary(x[:, :1], torch.arange(1)[None])  # back to the short ones
    return inv


def expected_metadata(model, arch: str) -> dict:
    """Every `arch.*` key the file must hold, from the loaded transformers model."""
    cfg = model.config
    a = arch + "."
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    rotary = model.model.rotary_emb
    inv = rotary.inv_freq.detach().numpy().copy()
    md = {
        a + "vocab_size": cfg.vocab_size, a + "hidden_size": cfg.hidden_size,
        a + "intermediate_size": cfg.intermediate_size, a + "num_layers": cfg.num_hidden_layers,
        a + "num_heads": cfg.num_attention_heads, a + "num_kv_heads": cfg.num_key_value_heads,
        a + "head_dim": head_dim, a + "context_length": cfg.max_position_embeddings,
        a + "rms_norm_eps": cfg.rms_norm_eps, a + "tie_word_embeddings": int(cfg.tie_word_embeddings),
        a + "rope.type": cfg.rope_parameters["rope_type"],
        a + "rope.theta": cfg.rope_parameters["rope_theta"],
        a + "rope.inv_freq": inv, a + "rope.attention_factor": rotary.attention_scaling,
    }
    if 2 * len(inv) != head_dim:
        md[a + "rope.dim"] = 2 * len(inv)
    if cfg.rope_parameters["rope_type"] == "longrope":
        original = cfg.rope_parameters["original_max_position_embeddings"]
        md[a + "rope.long_inv_freq"] = long_inv_freq(model, original)
        md[a + "rope.original_context_length"] = original
    if hasattr(model.model.layers[0].self_attn, "sliding_window"):  # per layer (Qwen2, Qwen3)
        windows = [layer.self_attn.sliding_window or 0 for layer in model.model.layers]
        if any(windows):
            md[a + "sliding_window_layers"] = windows
    elif getattr(cfg, "sliding_window", None) is not None:  # every layer (Mistral, Phi-3)
        md[a + "sliding_window"] = cfg.sliding_window
    return md


def assert_same_value(key, got, want):
    if isinstance(want, np.ndarray):
        assert isinstance(got, np.ndarray) and got.dtype == np.float32, key
        assert np.array_equal(got.view(np.uint32), want.astype(np.float32).view(np.uint32)), (key, got, want)
    elif isinstance(want, list):
        assert got.tolist() == want, (key, got, want)
    else:
        assert got == want, (key, got, want)


@pytest.fixture(scope="module", params=sorted(CASES))
def case(request, tmp_path_factory):
    family, overrides = CASES[request.param]
    tmp = tmp_path_factory.mktemp(request.param)
    hf_dir = make_model(tmp, family, name="hf", seed=5, **overrides)
    return request.param, family, hf_dir


# ---- HF folders ---------------------------------------------------------------------------------

def test_metadata_and_tensors_are_what_transformers_makes_of_the_folder(case, tmp_path):
    name, family, hf_dir = case
    f = load_flm(convert(hf_dir, tmp_path / "m.flm", progress=False))
    model = load_model(hf_dir).eval()
    arch = FAMILIES[family].ARCH
    assert f.version == 3
    assert f.metadata["general.architecture"] == arch and f.metadata["general.source"] == "hf"
    want = expected_metadata(model, arch)
    got = {k: v for k, v in f.metadata.items() if k.startswith(arch + ".")}
    assert sorted(got) == sorted(want)
    for key in want:
        assert_same_value(key, got[key], want[key])
    for key in ("vocab_size", "num_layers", "rope.dim", "sliding_window", "rope.original_context_length"):
        if arch + "." + key in got:
            assert f.meta_types[arch + "." + key] == "i64", key
    assert f.meta_types[arch + ".rope.inv_freq"] == "f32 array"

    exp = expected_tensors(model)
    assert sorted(f.tensors) == sorted(exp)
    for t, ref in exp.items():
        assert f.tensors[t].dtype == "f32" and f.tensors[t].shape == tuple(ref.shape), t
        assert np.array_equal(np.asarray(f.tensors[t].data), ref.numpy()), t


def test_the_cases_cover_what_they_are_named_for(case, tmp_path):
    """The keys each kind of case exists for are really there."""
    name, family, hf_dir = case
    md = load_flm(convert(hf_dir, tmp_path / "m.flm", progress=False)).metadata
    a = FAMILIES[family].ARCH + "."
    assert (a + "rope.long_inv_freq" in md) == ("longrope" in name)
    assert (a + "rope.dim" in md) == ("partial" in name)
    windows = md.get(a + "sliding_window_layers")
    assert (windows is not None) == (name == "qwen2_window")
    if windows is not None:
        assert windows.tolist() == [0, 8]
    assert (a + "sliding_window" in md) == (name in ("mistral_window", "phi3_partial"))
    if "longrope" in name:
        assert not np.array_equal(md[a + "rope.long_inv_freq"], md[a + "rope.inv_freq"])
        assert md[a + "rope.attention_factor"] > 1.0


def test_mistral_window_defaults_to_4096_when_config_json_has_none(tmp_path):
    """MistralConfig's default applies to a config.json without the key (null means none)."""
    path = make_model(tmp_path, "mistral")
    cfg = json.loads((path / "config.json").read_text())
    cfg.pop("sliding_window")
    (path / "config.json").write_text(json.dumps(cfg))
    assert load_model(path).config.sliding_window == 4096
    md = load_flm(convert(path, tmp_path / "m.flm", progress=False)).metadata
    assert md["mistral.sliding_window"] == 4096


def test_qwen2_layer_types_decide_the_windows(tmp_path):
    path = make_model(tmp_path, "qwen2", num_hidden_layers=3, use_sliding_window=True,
                      sliding_window=16, layer_types=["sliding_attention", "full_attention",
                                                      "sliding_attention"])
    model = load_model(path)
    assert [layer.self_attn.sliding_window for layer in model.model.layers] == [16, None, 16]
    md = load_flm(convert(path, tmp_path / "m.flm", progress=False)).metadata
    assert md["qwen2.sliding_window_layers"].tolist() == [16, 0, 16]
    edit_config(path, use_sliding_window=False)  # sliding layers without a window: transformers fails
    with pytest.raises(ConversionError, match="layer 0 is sliding_attention but there is no sliding window"):
        convert(path, tmp_path / "m.flm", progress=False)


@pytest.mark.parametrize("legacy_type", ["longrope", "su"])
def test_phi3_legacy_rope_config(tmp_path, legacy_type):
    """Phi-3's config.json style: rope_scaling {"type": "longrope"} (earlier "su", which
    transformers 5.24 loads only with the original context inside), partial_rotary_factor and
    original_max_position_embeddings at the top level."""
    path = make_model(tmp_path, "phi3", partial_rotary_factor=0.75, max_position_embeddings=256,
                      original_max_position_embeddings=32, rope_scaling=LONGROPE)
    cfg = json.loads((path / "config.json").read_text())
    cfg.pop("rope_parameters")
    scaling = {"type": legacy_type, "long_factor": LONGROPE["long_factor"],
               "short_factor": LONGROPE["short_factor"]}
    if legacy_type == "su":
        scaling["original_max_position_embeddings"] = 32
    cfg.update(rope_theta=10000.0, partial_rotary_factor=0.75, rope_scaling=scaling)
    (path / "config.json").write_text(json.dumps(cfg))
    model = load_model(path)
    assert model.config.rope_parameters["rope_type"] == "longrope"
    md = load_flm(convert(path, tmp_path / "m.flm", progress=False)).metadata
    want = expected_metadata(model, "phi3")
    for key in ("phi3.rope.type", "phi3.rope.inv_freq", "phi3.rope.long_inv_freq", "phi3.rope.dim",
                "phi3.rope.attention_factor", "phi3.rope.original_context_length"):
        assert_same_value(key, md[key], want[key])


def test_phi3_added_tokens_are_control_tokens(tmp_path):
    """<|user|>, <|end|>, ... (tokenizer.json / tokenizer_config.json added tokens beyond the
    SentencePiece model) are stored at their ids as control tokens; eos and pad are <|endoftext|>."""
    from transformers import AutoTokenizer
    path = make_model(tmp_path, "phi3")
    md = load_flm(convert(path, tmp_path / "m.flm", progress=False)).metadata
    tok = AutoTokenizer.from_pretrained(path)
    tokens, types = md["tokenizer.tokens"], md["tokenizer.token_types"].tolist()
    assert md["tokenizer.model"] == "spm" and len(tokens) == 520
    for text in PHI3_ADDED:
        i = tok.convert_tokens_to_ids(text)
        assert tokens[i] == text and types[i] == 3, text
    assert tokens[517:] == ["<extra_0>", "<extra_1>", "<extra_2>"] and types[517:] == [5, 5, 5]
    assert types[:3] == [2, 3, 3]  # <unk> <s> </s>: the model's own types stand
    assert md["tokenizer.eos_id"] == tok.eos_token_id == 512
    assert md["tokenizer.pad_id"] == tok.pad_token_id == 512
    assert md["tokenizer.bos_id"] == tok.bos_token_id == 1
    assert md["tokenizer.add_bos"] == 0 and md["tokenizer.eos_ids"].tolist() == [512]
    assert md["tokenizer.chat_template"] == tok.chat_template

    # a non-special added token is user-defined; one outside the vocabulary is refused
    tc = json.loads((path / "tokenizer_config.json").read_text())
    data = json.loads((path / "tokenizer.json").read_text())
    data["added_tokens"].append({"id": 518, "content": "<tool>", "single_word": False, "lstrip": False,
                                 "rstrip": False, "normalized": False, "special": False})
    (path / "tokenizer.json").write_text(json.dumps(data))
    md = load_flm(convert(path, tmp_path / "m.flm", progress=False)).metadata
    assert md["tokenizer.tokens"][518] == "<tool>" and md["tokenizer.token_types"][518] == 4
    tc["added_tokens_decoder"]["600"] = dict(tc["added_tokens_decoder"]["512"], content="<far>")
    (path / "tokenizer_config.json").write_text(json.dumps(tc))
    with pytest.raises(ConversionError, match="'<far>' has id 600, outside the model's vocab_size 520"):
        convert(path, tmp_path / "m.flm", progress=False)


def test_qwen_tokenizer_json_is_byte_level_bpe(tmp_path):
    path = make_model(tmp_path, "qwen3")
    data = json.loads((path / "tokenizer.json").read_text())
    md = load_flm(convert(path, tmp_path / "m.flm", progress=False)).metadata
    tokens, types = md["tokenizer.tokens"], md["tokenizer.token_types"].tolist()
    assert md["tokenizer.model"] == "bpe" and md["tokenizer.pre"] == "qwen2"
    assert tokens[:QWEN_BPE_SIZE] == sorted(data["model"]["vocab"], key=data["model"]["vocab"].get)
    assert tokens[QWEN_BPE_SIZE:QWEN_BPE_SIZE + 3] == QWEN_ADDED
    assert types[QWEN_BPE_SIZE:] == [3, 3, 3] + [5] * 13
    assert md["tokenizer.eos_id"] == QWEN_BPE_SIZE + 2 and md["tokenizer.pad_id"] == QWEN_BPE_SIZE
    assert md["tokenizer.add_bos"] == 0


@pytest.mark.parametrize("family", sorted(hf_models.FAMILIES))  # bert's: tests/test_embeddings.py
def test_model_type_without_architectures(tmp_path, family):
    """A config.json naming only its model_type converts as that family."""
    path = make_model(tmp_path, family)
    edit_config(path, architectures=None)
    md = load_flm(convert(path, tmp_path / "m.flm", progress=False)).metadata
    assert md["general.architecture"] == FAMILIES[family].ARCH
    with pytest.raises(ConversionError, match="does not match"):
        convert(path, tmp_path / "m.flm", progress=False,
                model_type="llama" if family != "llama" else "qwen2")


def test_unsupported_architecture_fails_the_command_line(tmp_path):
    path = make_model(tmp_path, "llama")
    edit_config(path, architectures=["GPT2LMHeadModel"], model_type="gpt2")
    out = tmp_path / "m.flm"
    r = subprocess.run([sys.executable, str(REPO / "converter" / "convert.py"), "--model_path", str(path),
                        "--out_path", str(out)], capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and not out.exists()
    assert r.stderr.startswith("error: ") and "Traceback" not in r.stderr
    assert "GPT2LMHeadModel" in r.stderr
    for family in FAMILIES.values():
        for arch in family.HF_ARCHITECTURES:
            assert arch in r.stderr, arch


def test_model_type_choices_are_the_families():
    r = subprocess.run([sys.executable, str(REPO / "converter" / "convert.py"), "--help"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0
    assert "{bert,gemma,gemma2,gemma3,glm,glm4,llama,mistral,phi3,qwen2,qwen3}" in r.stdout.replace("\n", "").replace(" ", "")


# ---- GGUF files ---------------------------------------------------------------------------------

def _compare_files(a, b, arch_a: str, arch_b: str):
    """The GGUF's file against the HF folder's: the same tensors, the same architecture keys
    (under each file's prefix), the same tokenizer but for unused padding and added tokens'
    scores (llama.cpp writes [PADn] and -1000)."""
    assert sorted(a.tensors) == sorted(b.tensors)
    for t in a.tensors:
        assert b.tensors[t].dtype == a.tensors[t].dtype, t
        assert np.array_equal(np.asarray(b.tensors[t].data), np.asarray(a.tensors[t].data)), t
    ka = {k[len(arch_a) + 1:]: v for k, v in a.metadata.items() if k.startswith(arch_a + ".")}
    kb = {k[len(arch_b) + 1:]: v for k, v in b.metadata.items() if k.startswith(arch_b + ".")}
    assert sorted(ka) == sorted(kb)
    for k, va in ka.items():
        if isinstance(va, np.ndarray):
            assert np.array_equal(va, kb[k]), k
        else:
            assert va == kb[k], k
    ta, tb = a.metadata, b.metadata
    types = ta["tokenizer.token_types"]
    assert np.array_equal(types, tb["tokenizer.token_types"])
    used = [i for i, t in enumerate(types.tolist()) if t != 5]
    assert [ta["tokenizer.tokens"][i] for i in used] == [tb["tokenizer.tokens"][i] for i in used]
    if "tokenizer.scores" in ta:
        plain = [i for i, t in enumerate(types.tolist()) if t in (1, 2, 6)]
        assert np.array_equal(ta["tokenizer.scores"][plain], tb["tokenizer.scores"][plain])
    # a GGUF's text after an added token follows llama.cpp (always the dummy prefix); the HF
    # folder's, the tokenizer transformers builds for it
    compared = ("tokenizer.tokens", "tokenizer.scores", "tokenizer.token_types", "tokenizer.prefix_after_added")
    if tb["tokenizer.model"] == "spm":
        assert tb["tokenizer.prefix_after_added"] == "always"
    for k in ta:
        if k.startswith("tokenizer.") and k not in compared:
            va, vb = ta[k], tb[k]
            assert (np.array_equal(va, vb) if isinstance(va, np.ndarray) else va == vb), k


@pytest.mark.parametrize("name", ["llama_bias_gqa", "qwen2", "qwen2_window", "qwen3", "qwen3_bias_linear",
                                  "phi3", "phi3_partial_longrope", "phi3_partial", "mistral_window"])
def test_gguf_of_each_family_converts_to_its_hf_file(tmp_path, name):
    family, overrides = CASES[name]
    hf_dir = make_model(tmp_path, family, name="hf", seed=9, **overrides)
    gguf_path = write_gguf(hf_dir, tmp_path / "m.gguf")
    a = load_flm(convert(hf_dir, tmp_path / "hf.flm", progress=False))
    arch = FAMILIES[family].ARCH
    if family == "mistral":  # llama.cpp writes Mistral as llama: so it converts, window and all
        b = load_flm(convert(gguf_path, tmp_path / "gguf.flm", progress=False))
        assert b.metadata["general.architecture"] == "llama"
        assert b.metadata["llama.sliding_window"] == 8
        _compare_files(a, b, "mistral", "llama")
        b = load_flm(convert(gguf_path, tmp_path / "gguf.flm", progress=False, model_type="mistral"))
    else:
        b = load_flm(convert(gguf_path, tmp_path / "gguf.flm", progress=False))
    assert b.metadata["general.architecture"] == arch and b.metadata["general.source"] == "gguf"
    _compare_files(a, b, arch, arch)


def test_gguf_with_split_phi3_matrices(tmp_path):
    """A phi3 GGUF holding q / k / v and gate / up apart (llama.cpp's loader takes either) gives
    the same fused tensors."""
    import gguf
    hf_dir = make_model(tmp_path, "phi3", name="hf", num_key_value_heads=2)
    fused = write_gguf(hf_dir, tmp_path / "fused.gguf")
    reader = gguf.GGUFReader(str(fused))
    w = gguf.GGUFWriter(str(tmp_path / "split.gguf"), "phi3")
    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or field.name == "general.architecture":
            continue
        value = field.contents()
        vtype = field.types[0]
        if vtype == gguf.GGUFValueType.ARRAY:
            w.add_key_value(field.name, value, vtype, sub_type=field.types[-1])
        else:
            w.add_key_value(field.name, value, vtype)
    q, kv, inter = 64, 32, 96
    for t in reader.tensors:
        data = np.array(t.data)
        if t.name.endswith("attn_qkv.weight"):
            b = t.name[:-len("attn_qkv.weight")]
            for part, rows in (("attn_q", data[:q]), ("attn_k", data[q:q + kv]), ("attn_v", data[q + kv:])):
                w.add_tensor(b + part + ".weight", np.ascontiguousarray(rows))
        elif t.name.endswith("ffn_up.weight"):
            b = t.name[:-len("ffn_up.weight")]
            w.add_tensor(b + "ffn_gate.weight", np.ascontiguousarray(data[:inter]))
            w.add_tensor(b + "ffn_up.weight", np.ascontiguousarray(data[inter:]))
        else:
            w.add_tensor(t.name, data)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    a = load_flm(convert(fused, tmp_path / "a.flm", progress=False))
    b = load_flm(convert(tmp_path / "split.gguf", tmp_path / "b.flm", progress=False))
    assert sorted(a.tensors) == sorted(b.tensors)
    for t in a.tensors:
        assert np.array_equal(np.asarray(a.tensors[t].data), np.asarray(b.tensors[t].data)), t


def test_unsupported_gguf_architecture_is_refused(tmp_path):
    hf_dir = make_model(tmp_path, "llama", name="hf")
    path = write_gguf(hf_dir, tmp_path / "falcon.gguf", arch="falcon")
    out = tmp_path / "out.flm"
    with pytest.raises(ConversionError, match=r"unsupported GGUF architecture 'falcon' \(supported: "
                                              r"llama, qwen2, qwen3, phi3, gemma, gemma2, gemma3, glm4, bert, chatglm\)"):
        convert(path, out, progress=False)
    assert not out.exists()
    with pytest.raises(ConversionError, match="--model_type qwen2 does not fit .* architecture is llama"):
        convert(write_gguf(hf_dir, tmp_path / "llama.gguf"), out, progress=False, model_type="qwen2")
