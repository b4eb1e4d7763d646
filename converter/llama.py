"""The LLaMA family (LlamaForCausalLM): config.json -> `llama.*` metadata, and HF tensor names ->
`.flm` tensors (docs/flm_format.md), fusing Q/K/V and gate/up.

    hp = read_hparams(ckpt.config)                       # validated hyperparameters
    add_metadata(writer, hp)                             # llama.* keys (RoPE included)
    add_tensors(writer, ckpt, hp, dtype)                 # declares every tensor (lazy)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from . import quantize
from .checkpoint import Checkpoint
from .errors import ConversionError
from .rope import RopeConfig, compute_inv_freq, read_rope_config

ARCHITECTURES = ("LlamaForCausalLM",)
MODEL_TYPE = "llama"
ADD_BOS_DEFAULT = True

TORCH_DTYPES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}


@dataclass
class LlamaHParams:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    context_length: int
    rms_norm_eps: float
    tie_word_embeddings: bool     # from config.json; add_tensors also ties when lm_head is absent
    attention_bias: bool
    mlp_bias: bool
    rope: RopeConfig
    inv_freq: np.ndarray


def _int(config: dict, key: str, default=None) -> int:
    v = config.get(key, default)
    if v is None:
        raise ConversionError(f"config.json: missing {key}")
    if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
        raise ConversionError(f"config.json: {key} must be a positive integer, got {v!r}")
    return v


def read_hparams(config: dict) -> LlamaHParams:
    hidden = _int(config, "hidden_size")
    heads = _int(config, "num_attention_heads")
    kv_heads = heads if config.get("num_key_value_heads") is None else _int(
        config, "num_key_value_heads")
    if heads % kv_heads:
        raise ConversionError(f"config.json: num_key_value_heads ({kv_heads}) does not divide "
                              f"num_attention_heads ({heads})")
    if config.get("head_dim") is not None:
        head_dim = _int(config, "head_dim")
    else:
        if hidden % heads:
            raise ConversionError(f"config.json: hidden_size ({hidden}) is not a multiple of "
                                  f"num_attention_heads ({heads}) and there is no head_dim")
        head_dim = hidden // heads
    act = config.get("hidden_act", "silu")
    if act != "silu":
        raise ConversionError(f"config.json: hidden_act {act!r} is not supported (only silu)")
    eps = config.get("rms_norm_eps", 1e-6)
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not eps > 0:
        raise ConversionError(f"config.json: invalid rms_norm_eps {eps!r}")
    context = _int(config, "max_position_embeddings", 2048)
    rope = read_rope_config(config)
    return LlamaHParams(
        vocab_size=_int(config, "vocab_size"),
        hidden_size=hidden,
        intermediate_size=_int(config, "intermediate_size"),
        num_layers=_int(config, "num_hidden_layers"),
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        context_length=context,
        rms_norm_eps=float(eps),
        tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
        attention_bias=bool(config.get("attention_bias", False)),
        mlp_bias=bool(config.get("mlp_bias", False)),
        rope=rope,
        inv_freq=compute_inv_freq(rope, head_dim, context),
    )


def add_metadata(writer, hp: LlamaHParams, tied: bool) -> None:
    writer.add_i64("llama.vocab_size", hp.vocab_size)
    writer.add_i64("llama.hidden_size", hp.hidden_size)
    writer.add_i64("llama.intermediate_size", hp.intermediate_size)
    writer.add_i64("llama.num_layers", hp.num_layers)
    writer.add_i64("llama.num_heads", hp.num_heads)
    writer.add_i64("llama.num_kv_heads", hp.num_kv_heads)
    writer.add_i64("llama.head_dim", hp.head_dim)
    writer.add_i64("llama.context_length", hp.context_length)
    writer.add_f64("llama.rms_norm_eps", hp.rms_norm_eps)
    writer.add_i64("llama.tie_word_embeddings", int(tied))
    writer.add_string("llama.rope.type", hp.rope.rope_type)
    writer.add_f64("llama.rope.theta", float(hp.rope.theta))
    writer.add_f32_array("llama.rope.inv_freq", hp.inv_freq)
    writer.add_f64("llama.rope.attention_factor", hp.rope.attention_factor)


def to_numpy(t: torch.Tensor, dtype: str, what: str) -> np.ndarray:
    """Converts (rounding to nearest even) to the .flm dtype; bf16 becomes uint16 bit patterns.
    Other (quantized) dtypes get float32 data, which the writer quantizes."""
    if not t.is_floating_point():
        raise ConversionError(f"{what}: expected a floating-point tensor, got {t.dtype}")
    t = t.detach().to(device="cpu", dtype=TORCH_DTYPES.get(dtype, torch.float32)).contiguous()
    if dtype == "bf16":
        return t.view(torch.int16).numpy().view(np.uint16)
    return t.numpy()


class _TensorMap:
    """Finds HF tensors by their name without the `model.` prefix; tracks which were used."""

    def __init__(self, ckpt: Checkpoint):
        self.ckpt = ckpt
        names = ckpt.names()
        if "model.embed_tokens.weight" in names:
            self.prefix = "model."
        elif "embed_tokens.weight" in names:
            self.prefix = ""
        else:
            raise ConversionError(f"{ckpt.path}: no model.embed_tokens.weight in the weights; "
                                  f"is this a LLaMA checkpoint?")
        self.used = set()

    def full(self, name: str) -> str:
        return name if name == "lm_head.weight" else self.prefix + name

    def has(self, name: str) -> bool:
        return self.ckpt.has(self.full(name))

    def check(self, name: str, shape: tuple) -> str:
        full = self.full(name)
        if not self.ckpt.has(full):
            raise ConversionError(f"missing tensor {full} in the weights of {self.ckpt.path}")
        actual = tuple(self.ckpt.shape(full))
        if actual != tuple(shape):
            raise ConversionError(f"tensor {full} has shape {list(actual)}, the config implies "
                                  f"{list(shape)}")
        self.used.add(full)
        return full

    def unused(self) -> list:
        return [n for n in self.ckpt.names()
                if n not in self.used and not n.endswith("rotary_emb.inv_freq")]


def add_tensors(writer, ckpt: Checkpoint, hp: LlamaHParams, dtype: str) -> bool:
    """Declares every tensor on the writer (the data is read when the writer asks for it).
    Returns whether the output head is tied to the embedding."""
    m = _TensorMap(ckpt)
    H, I, V = hp.hidden_size, hp.intermediate_size, hp.vocab_size
    hd, nh, nkv = hp.head_dim, hp.num_heads, hp.num_kv_heads

    def declare(out_name: str, out_dtype: str, parts: list):
        """parts: [(hf name, shape)]; several parts are concatenated along dim 0."""
        full = [m.check(name, shape) for name, shape in parts]
        shape = list(parts[0][1])
        shape[0] = sum(s[0] for _, s in parts)

        def produce():
            tensors = [ckpt.get(n) for n in full]
            t = tensors[0] if len(tensors) == 1 else torch.cat(tensors, dim=0)
            arr = to_numpy(t, out_dtype, out_name)
            grids = [ckpt.grid(n) if hasattr(ckpt, "grid") else None for n in full]
            if all(g is not None for g in grids):  # rounded by calibration (calibrate.py)
                mins = None if grids[0].mins is None else np.concatenate([g.mins for g in grids])
                return quantize.OnGrid(arr, quantize.Grid(np.concatenate([g.scale for g in grids]), mins))
            return arr

        writer.add_tensor(out_name, out_dtype, tuple(shape), produce)

    declare("token_embd.weight", dtype, [("embed_tokens.weight", (V, H))])
    for i in range(hp.num_layers):
        p = f"layers.{i}."
        b = f"blk.{i}."
        declare(b + "attn_norm.weight", "f32", [(p + "input_layernorm.weight", (H,))])
        declare(b + "attn_qkv.weight", dtype, [
            (p + "self_attn.q_proj.weight", (nh * hd, H)),
            (p + "self_attn.k_proj.weight", (nkv * hd, H)),
            (p + "self_attn.v_proj.weight", (nkv * hd, H)),
        ])
        if hp.attention_bias:
            declare(b + "attn_qkv.bias", "f32", [
                (p + "self_attn.q_proj.bias", (nh * hd,)),
                (p + "self_attn.k_proj.bias", (nkv * hd,)),
                (p + "self_attn.v_proj.bias", (nkv * hd,)),
            ])
        declare(b + "attn_output.weight", dtype, [(p + "self_attn.o_proj.weight", (H, nh * hd))])
        if hp.attention_bias:
            declare(b + "attn_output.bias", "f32", [(p + "self_attn.o_proj.bias", (H,))])
        declare(b + "ffn_norm.weight", "f32", [(p + "post_attention_layernorm.weight", (H,))])
        declare(b + "ffn_gate_up.weight", dtype, [
            (p + "mlp.gate_proj.weight", (I, H)),
            (p + "mlp.up_proj.weight", (I, H)),
        ])
        if hp.mlp_bias:
            declare(b + "ffn_gate_up.bias", "f32", [
                (p + "mlp.gate_proj.bias", (I,)),
                (p + "mlp.up_proj.bias", (I,)),
            ])
        declare(b + "ffn_down.weight", dtype, [(p + "mlp.down_proj.weight", (H, I))])
        if hp.mlp_bias:
            declare(b + "ffn_down.bias", "f32", [(p + "mlp.down_proj.bias", (H,))])
    declare("output_norm.weight", "f32", [("norm.weight", (H,))])

    tied = hp.tie_word_embeddings or not m.has("lm_head.weight")
    if tied:
        if m.has("lm_head.weight"):
            m.used.add(m.full("lm_head.weight"))  # a saved copy of the embedding
    else:
        declare("output.weight", dtype, [("lm_head.weight", (V, H))])

    extra = m.unused()
    if extra:
        shown = ", ".join(extra[:5]) + (f" and {len(extra) - 5} more" if len(extra) > 5 else "")
        raise ConversionError(f"the weights have tensors this LLaMA config does not use: {shown}")
    return tied
