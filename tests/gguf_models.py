"""Writes HF checkpoints (tests/hf_models.py) as GGUF files, the way llama.cpp's converter lays
them out for each architecture, with the `gguf` package:

    path = write_gguf(hf_dir, tmp_path / "m.gguf")                          # F32 tensors
    path = write_gguf(hf_dir, tmp_path / "q.gguf", types={"attn_q.weight": Q.Q4_0})
    path = write_gguf(hf_dir, tmp_path / "x.gguf", arch="gemma")            # another architecture

  llama (LLaMA; Mistral too: llama.cpp writes it as llama, here with attention.sliding_window)
          attn_q / attn_k rows reordered for llama.cpp's RoPE, rope_freqs.weight for llama3 scaling
  qwen2   separate attn_q / attn_k / attn_v with biases, no reordering
  qwen3   attn_q_norm / attn_k_norm, attention.key_length
  chatglm (glm: GlmForCausalLM) attn_q / attn_k / attn_v with biases, ffn_up = gate_up_proj,
          the keys ChatGLMModel writes (see _chatglm_hparams)
  glm4    the same tensors plus post_attention_norm / post_ffw_norm, TextModel's keys,
          rope.dimension_count = head_dim * partial_rotary_factor
  phi3    attn_qkv and ffn_up (gate rows then up rows) as the checkpoint fuses them,
          rope.dimension_count = int(partial_rotary_factor * hidden) // heads,
          rope.scaling.original_context_length, rope_factors_long / rope_factors_short and
          rope.scaling.attn_factor for LongRoPE, attention.sliding_window (0: none)
The tokenizer: SentencePiece (`llama`, with the folder's added tokens at their ids, as control or
user-defined tokens scored -1000, the rest of the vocabulary [PADn] unused) or byte-level BPE
(`gpt2`, pre-tokenizer qwen2), from the folder's files.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import gguf
import numpy as np
import torch

from converter.spm_tokenizer import load_spm
from hf_models import rope_of

Q = gguf.GGMLQuantizationType

# HF tensor name (without "model." and the layer prefix) -> GGUF name (gguf-py's TensorNameMap)
LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.qkv_proj.weight": "attn_qkv.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.o_proj.bias": "attn_output.bias",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "post_self_attn_layernorm.weight": "post_attention_norm.weight",
    "post_mlp_layernorm.weight": "post_ffw_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.gate_up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
    "mlp.gate_proj.bias": "ffn_gate.bias",
    "mlp.up_proj.bias": "ffn_up.bias",
    "mlp.down_proj.bias": "ffn_down.bias",
}
TOP_NAMES = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}
# HF model_type -> llama.cpp's architecture
GGUF_ARCH = {"llama": "llama", "mistral": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "phi3": "phi3",
             "gemma": "gemma", "gemma2": "gemma2", "gemma3_text": "gemma3", "glm": "chatglm", "glm4": "glm4"}
# Gemma 2 / 3's norms around attention and MLP (gguf-py's TensorNameMap for those architectures)
SANDWICH_NAMES = {
    "post_attention_layernorm.weight": "post_attention_norm.weight",
    "pre_feedforward_layernorm.weight": "ffn_norm.weight",
    "post_feedforward_layernorm.weight": "post_ffw_norm.weight",
}
# the window pattern llama.cpp assumes without sliding_window_pattern (every n-th layer full)
GEMMA_PATTERN = {"gemma2": 2, "gemma3_text": 6}
# llama.cpp's pre-tokenizer names for the BPE tokenizers of these model types (its
# convert_hf_to_gguf_update.py hashes: glm-4-9b-chat -> chatglm-bpe, GLM-4-0414 -> glm4)
BPE_PRE = {"glm": "chatglm-bpe", "glm4": "glm4"}

# K-quant and IQ blocks have no quantizer in the gguf package: random blocks are written
# instead, any bit pattern being a valid block once its f16 scale fields are finite.
# type -> byte offsets of the f16 scale fields (d, dmin) in one block (gguf/quants.py layouts)
RANDOM_BLOCK_SCALES = {
    Q.Q2_K: (80, 82), Q.Q3_K: (108,), Q.Q4_K: (0, 2), Q.Q5_K: (0, 2), Q.Q6_K: (208,),
    Q.IQ4_NL: (0,), Q.IQ4_XS: (0,),
}


def permute_rope_rows(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's reordering of q/k rows: in each head, row j*hd/2 + i of HF becomes row 2i + j
    (the pairs RoPE rotates together become adjacent)."""
    half = w.shape[0] // n_head // 2
    return w.reshape(n_head, 2, half, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def llama3_rope_divisors(theta, head_dim, factor, low, high, orig_ctx) -> np.ndarray:
    """The rope_freqs.weight llama.cpp's converter writes for rope_type llama3: per frequency,
    the number the base frequency is divided by."""
    base = 1.0 / (theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim))
    out = []
    for f in base:
        wavelen = 2 * math.pi / f
        if wavelen < orig_ctx / high:
            out.append(1.0)
        elif wavelen > orig_ctx / low:
            out.append(factor)
        else:
            smooth = (orig_ctx / wavelen - low) / (high - low)
            out.append(1.0 / ((1 - smooth) / factor + smooth))
    return np.asarray(out, dtype=np.float32)


def random_blocks(shape, qtype, rng, std=0.02) -> np.ndarray:
    """Random bytes forming valid `qtype` blocks for a float tensor of `shape` ([out, in]),
    its scale fields set so that the dequantized values have about the given std."""
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    rows, cols = shape
    assert cols % block == 0, (shape, qtype)
    data = rng.integers(0, 256, size=(rows, cols // block, size), dtype=np.uint8)
    offsets = RANDOM_BLOCK_SCALES[qtype]

    def set_scales(mult):
        for off in offsets:
            data[:, :, off:off + 2] = mult.view(np.uint8).reshape(rows, cols // block, 2)

    signs = rng.choice([-1.0, 1.0], size=(rows, cols // block))
    unit = (signs * rng.uniform(0.5, 1.5, size=(rows, cols // block))).astype(np.float16)
    set_scales(unit)
    got = gguf.quants.dequantize(data.reshape(rows, -1), qtype).std()
    set_scales((unit.astype(np.float32) * (std / got)).astype(np.float16))
    return data.reshape(rows, -1)


def encode(arr: np.ndarray, qtype, rng):
    """(data, raw_dtype) for GGUFWriter.add_tensor: arr ([out, in], float32) in GGUF type qtype."""
    if qtype == Q.F32:
        return arr.astype(np.float32), None
    if qtype == Q.F16:
        return arr.astype(np.float16), None
    if qtype in RANDOM_BLOCK_SCALES:
        return random_blocks(arr.shape, qtype, rng), qtype
    if qtype == Q.Q8_1:  # neither quantizer nor dequantizer in the gguf package: zero blocks
        block, size = gguf.GGML_QUANT_SIZES[qtype]
        return np.zeros((arr.shape[0], arr.shape[1] // block * size), dtype=np.uint8), qtype
    return gguf.quants.quantize(arr.astype(np.float32), qtype), qtype


def _json(path: Path):
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


def _hparams(w, a: str, cfg: dict, hf_config) -> None:
    """The architecture keys, as llama.cpp's converter writes them for cfg's model_type."""
    H, nh = cfg["hidden_size"], cfg["num_attention_heads"]
    nkv = cfg.get("num_key_value_heads") or nh
    hd = cfg.get("head_dim") or H // nh
    theta, rope_type, fields = rope_of(hf_config)
    if cfg["model_type"] == "glm":
        _chatglm_hparams(w, a, cfg, fields)
        return
    w.add_uint32(f"{a}.block_count", cfg["num_hidden_layers"])
    w.add_uint32(f"{a}.context_length", cfg["max_position_embeddings"])
    w.add_uint32(f"{a}.embedding_length", H)
    w.add_uint32(f"{a}.feed_forward_length", cfg["intermediate_size"])
    w.add_uint32(f"{a}.attention.head_count", nh)
    w.add_uint32(f"{a}.attention.head_count_kv", nkv)
    if not cfg["model_type"].startswith("gemma"):  # Gemma: see _gemma_hparams
        w.add_float32(f"{a}.rope.freq_base", float(theta))
    w.add_float32(f"{a}.attention.layer_norm_rms_epsilon", cfg["rms_norm_eps"])
    w.add_uint32(f"{a}.vocab_size", cfg["vocab_size"])
    if hd != H // nh:
        w.add_uint32(f"{a}.attention.key_length", hd)
        w.add_uint32(f"{a}.attention.value_length", hd)
    model_type = cfg["model_type"]
    if model_type == "phi3":
        prf = fields.get("partial_rotary_factor", 1.0)
        original = cfg.get("original_max_position_embeddings", 4096)
        w.add_uint32(f"{a}.rope.dimension_count", int(prf * H) // nh)
        w.add_uint32(f"{a}.rope.scaling.original_context_length", original)
        w.add_uint32(f"{a}.attention.sliding_window", cfg.get("sliding_window") or 0)
        if rope_type == "longrope":
            scale = cfg["max_position_embeddings"] / original
            w.add_float32(f"{a}.rope.scaling.attn_factor",
                          math.sqrt(1 + math.log(scale) / math.log(original)) if scale > 1.0 else 1.0)
            w.add_tensor("rope_factors_long.weight", np.asarray(fields["long_factor"], np.float32))
            w.add_tensor("rope_factors_short.weight", np.asarray(fields["short_factor"], np.float32))
        elif rope_type != "default":
            raise ValueError(rope_type)
        return
    if model_type.startswith("gemma"):
        _gemma_hparams(w, a, cfg, hf_config, hd)
        return
    if model_type == "glm4":  # Glm4Model: TextModel's keys (key_length always) + the rotated dims
        w.add_uint32(f"{a}.attention.key_length", hd)
        w.add_uint32(f"{a}.attention.value_length", hd)
        w.add_uint32(f"{a}.rope.dimension_count", int(hd * fields.get("partial_rotary_factor", 0.5)))
        return
    w.add_uint32(f"{a}.rope.dimension_count", hd)
    if model_type == "mistral" and cfg.get("sliding_window"):
        w.add_uint32(f"{a}.attention.sliding_window", cfg["sliding_window"])
    if model_type in ("qwen2", "qwen3") and cfg.get("use_sliding_window"):
        w.add_uint32(f"{a}.attention.sliding_window", cfg["sliding_window"])
        w.add_array(f"{a}.attention.sliding_window_pattern",
                    [t == "sliding_attention" for t in hf_config.layer_types])
    if rope_type == "linear":
        w.add_string(f"{a}.rope.scaling.type", "linear")
        w.add_float32(f"{a}.rope.scaling.factor", fields["factor"])
    elif rope_type == "llama3":
        w.add_tensor("rope_freqs.weight", llama3_rope_divisors(
            theta, hd, fields["factor"], fields["low_freq_factor"], fields["high_freq_factor"],
            fields["original_max_position_embeddings"]))
    elif rope_type != "default":
        raise ValueError(rope_type)


def _gemma_hparams(w, a: str, cfg: dict, hf_config, hd: int) -> None:
    """GemmaModel / Gemma2Model / Gemma3Model in llama.cpp's converter: key and value length always;
    Gemma 2 the soft-caps and the window; Gemma 3 the global theta and scaling, the local theta
    (freq_base_swa), the final soft-cap when set, the window. The layers' pattern is written (as
    the array llama.cpp's loader reads) only when it is not the one the loader assumes."""
    model_type = cfg["model_type"]
    w.add_uint32(f"{a}.attention.key_length", hd)
    w.add_uint32(f"{a}.attention.value_length", hd)
    if model_type == "gemma":
        return
    if model_type == "gemma2":
        for key in ("attn_logit_softcapping", "final_logit_softcapping"):
            if cfg.get(key) is not None:
                w.add_float32(f"{a}.{key}", cfg[key])
        w.add_float32(f"{a}.rope.freq_base", float(rope_of(hf_config)[0]))
    else:
        params = hf_config.rope_parameters
        full, local = params["full_attention"], params["sliding_attention"]
        w.add_float32(f"{a}.rope.freq_base", float(full["rope_theta"]))
        w.add_float32(f"{a}.rope.freq_base_swa", float(local["rope_theta"]))
        if full.get("rope_type", "default") == "linear":
            w.add_string(f"{a}.rope.scaling.type", "linear")
            w.add_float32(f"{a}.rope.scaling.factor", full["factor"])
        elif full.get("rope_type", "default") != "default":
            raise ValueError(full)
        if cfg.get("final_logit_softcapping"):
            w.add_float32(f"{a}.final_logit_softcapping", cfg["final_logit_softcapping"])
    types = hf_config.layer_types
    if cfg.get("sliding_window") is not None and "sliding_attention" in types:
        w.add_uint32(f"{a}.attention.sliding_window", cfg["sliding_window"])
        n = GEMMA_PATTERN[model_type]
        if types != ["sliding_attention" if (i + 1) % n else "full_attention" for i in range(len(types))]:
            w.add_array(f"{a}.attention.sliding_window_pattern", [t == "sliding_attention" for t in types])


def _chatglm_hparams(w, a: str, cfg: dict, fields: dict) -> None:
    """As llama.cpp's ChatGLMModel.set_gguf_parameters writes a GlmForCausalLM (or THUDM)
    config: its context length is seq_length, else hidden_size; the rotated dims are
    (hidden / heads) * partial_rotary_factor; the base 10000 * rope_ratio (rope_theta unread);
    the epsilon layernorm_epsilon, else 1e-5."""
    H = cfg.get("hidden_size")
    nh = cfg.get("num_attention_heads")
    w.add_uint32(f"{a}.context_length", cfg.get("seq_length", H))
    w.add_uint32(f"{a}.embedding_length", H)
    w.add_uint32(f"{a}.feed_forward_length", cfg.get("ffn_hidden_size", cfg.get("intermediate_size", 4 * H)))
    w.add_uint32(f"{a}.block_count", cfg.get("num_layers", cfg.get("num_hidden_layers")))
    w.add_uint32(f"{a}.attention.head_count", nh)
    w.add_uint32(f"{a}.attention.head_count_kv", cfg.get("multi_query_group_num", cfg.get("num_key_value_heads", nh)))
    w.add_float32(f"{a}.attention.layer_norm_rms_epsilon", cfg.get("layernorm_epsilon", 1e-5))
    w.add_uint32(f"{a}.rope.dimension_count", int(H // nh * fields.get("partial_rotary_factor", 0.5)))
    w.add_bool("tokenizer.ggml.add_bos_token", False)
    w.add_float32(f"{a}.rope.freq_base", 10000 * cfg.get("rope_ratio", 1))


def _added_tokens(hf_dir: Path) -> dict:
    """id -> (text, special): tokenizer_config's added_tokens_decoder, then tokenizer.json's."""
    added = {}
    tc = _json(hf_dir / "tokenizer_config.json") or {}
    for k, v in (tc.get("added_tokens_decoder") or {}).items():
        added[int(k)] = (v["content"], bool(v.get("special")))
    for a in (_json(hf_dir / "tokenizer.json") or {}).get("added_tokens") or []:
        added[a["id"]] = (a["content"], bool(a.get("special")))
    return added


def _spm_tokenizer(w, hf_dir: Path, cfg: dict) -> None:
    """As llama.cpp's converter (Phi3MiniModel.set_vocab) writes a SentencePiece vocabulary."""
    spm = load_spm(hf_dir / "tokenizer.model")
    vocab = cfg["vocab_size"]
    tokens = [f"[PAD{i}]" for i in range(vocab)]
    scores, types = [-10000.0] * vocab, [5] * vocab
    tokens[:len(spm)], scores[:len(spm)], types[:len(spm)] = spm.pieces, spm.scores, spm.types
    for i, (text, special) in _added_tokens(hf_dir).items():
        if i < len(spm) and spm.pieces[i] == text:
            continue
        tokens[i], scores[i], types[i] = text, -1000.0, 3 if special else 4
    tc = _json(hf_dir / "tokenizer_config.json") or {}
    w.add_string("tokenizer.ggml.model", "llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    eos = tokens.index(tc["eos_token"]) if isinstance(tc.get("eos_token"), str) else spm.eos_id
    pad = tokens.index(tc["pad_token"]) if isinstance(tc.get("pad_token"), str) else None
    w.add_uint32("tokenizer.ggml.bos_token_id", spm.bos_id)
    w.add_uint32("tokenizer.ggml.eos_token_id", eos)
    w.add_uint32("tokenizer.ggml.unknown_token_id", spm.unk_id)
    if pad is not None:
        w.add_uint32("tokenizer.ggml.padding_token_id", pad)
    w.add_bool("tokenizer.ggml.add_bos_token", tc.get("add_bos_token", True))
    # llama.cpp's Gemma converters write add_space_prefix false whatever the model says
    w.add_bool("tokenizer.ggml.add_space_prefix", spm.add_dummy_prefix and not cfg["model_type"].startswith("gemma"))
    w.add_bool("tokenizer.ggml.remove_extra_whitespaces", spm.remove_extra_whitespaces)


def _bpe_tokenizer(w, hf_dir: Path, cfg: dict) -> None:
    """A byte-level BPE tokenizer.json (Qwen2's pre-tokenizer) as llama.cpp writes it."""
    data = _json(hf_dir / "tokenizer.json")
    tc = _json(hf_dir / "tokenizer_config.json") or {}
    vocab = cfg["vocab_size"]
    tokens, types = [f"[PAD{i}]" for i in range(vocab)], [5] * vocab
    for t, i in data["model"]["vocab"].items():
        tokens[i], types[i] = t, 1
    for i, (text, special) in _added_tokens(hf_dir).items():
        tokens[i], types[i] = text, 3 if special else 4
    merges = [m if isinstance(m, str) else " ".join(m) for m in data["model"]["merges"]]
    w.add_string("tokenizer.ggml.model", "gpt2")
    w.add_string("tokenizer.ggml.pre", BPE_PRE.get(cfg["model_type"], "qwen2"))
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    if cfg["model_type"] in ("glm", "glm4"):
        # ChatGLMModel / Glm4Model.set_vocab: eos <|endoftext|>, eot <|user|>, unk <|endoftext|>
        # (Glm4Model: bos <|endoftext|> too)
        if cfg["model_type"] == "glm4":
            w.add_uint32("tokenizer.ggml.bos_token_id", tokens.index("<|endoftext|>"))
        w.add_uint32("tokenizer.ggml.eos_token_id", tokens.index("<|endoftext|>"))
        w.add_uint32("tokenizer.ggml.eot_token_id", tokens.index("<|user|>"))
        w.add_uint32("tokenizer.ggml.unknown_token_id", tokens.index("<|endoftext|>"))
        w.add_uint32("tokenizer.ggml.padding_token_id", tokens.index(tc["pad_token"]))
        return
    w.add_uint32("tokenizer.ggml.bos_token_id", cfg["bos_token_id"])
    w.add_uint32("tokenizer.ggml.eos_token_id", tokens.index(tc["eos_token"]))
    w.add_uint32("tokenizer.ggml.padding_token_id", tokens.index(tc["pad_token"]))
    w.add_bool("tokenizer.ggml.add_bos_token", False)


def write_gguf(hf_dir: Path, path: Path, types: dict | None = None, seed: int = 0,
               arch: str | None = None, tokenizer: str | None = "auto", edit=None) -> Path:
    """Writes the HF checkpoint hf_dir as a GGUF file.
    types: GGUF name suffix ("attn_q.weight", "token_embd.weight", ...) -> GGUF type of that
    matrix (default F32; norms and biases are always F32). arch: the architecture to write
    (default: llama.cpp's for the checkpoint's model_type; the layout stays the checkpoint's).
    tokenizer: "spm", "bpe", "auto" (from the folder's files) or None. `edit(writer)` may add
    metadata."""
    from safetensors.torch import load_file
    from transformers import AutoConfig
    types = types or {}
    rng = np.random.default_rng(seed)
    cfg = json.loads((hf_dir / "config.json").read_text())
    sd = load_file(str(hf_dir / "model.safetensors"))
    nh = cfg["num_attention_heads"]
    nkv = cfg.get("num_key_value_heads") or nh
    native = GGUF_ARCH[cfg["model_type"]]
    a = arch or native

    w = gguf.GGUFWriter(str(path), a)
    w.add_string("general.name", hf_dir.name)
    _hparams(w, a, cfg, AutoConfig.from_pretrained(hf_dir))
    if tokenizer == "auto":
        tokenizer = ("spm" if (hf_dir / "tokenizer.model").is_file() else
                     "bpe" if (hf_dir / "tokenizer.json").is_file() else None)
    if tokenizer == "spm":
        _spm_tokenizer(w, hf_dir, cfg)
    elif tokenizer == "bpe":
        _bpe_tokenizer(w, hf_dir, cfg)
    tc = _json(hf_dir / "tokenizer_config.json") or {}
    if tokenizer is not None and isinstance(tc.get("chat_template"), str):
        w.add_string("tokenizer.chat_template", tc["chat_template"])
    if edit is not None:
        edit(w)

    def add(name, t: torch.Tensor, heads=0):
        if native.startswith("gemma") and name.endswith("norm.weight"):
            t = t.float() + 1  # llama.cpp's Gemma converters store the (1 + w) of Gemma's RMSNorm
        arr = t.float().numpy()
        if heads:
            arr = permute_rope_rows(arr, heads)
        if arr.ndim == 1:
            w.add_tensor(name, arr.astype(np.float32))
            return
        suffix = name.split(".", 2)[-1] if name.startswith("blk.") else name
        data, raw = encode(arr, types.get(suffix, Q.F32), rng)
        w.add_tensor(name, data, raw_dtype=raw)

    for hf_name, t in sd.items():
        if hf_name in TOP_NAMES:
            if hf_name == "lm_head.weight" and cfg.get("tie_word_embeddings"):
                continue
            add(TOP_NAMES[hf_name], t)
            continue
        _, _, layer, rest = hf_name.split(".", 3)
        sandwich = native in ("gemma2", "gemma3") and rest in SANDWICH_NAMES
        name = f"blk.{layer}.{SANDWICH_NAMES[rest] if sandwich else LAYER_NAMES[rest]}"
        heads = 0
        if native == "llama":  # llama.cpp reorders q / k only for its llama architecture
            heads = nh if ".attn_q." in name else nkv if ".attn_k." in name else 0
        add(name, t, heads)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
