"""What every family shares: the hyperparameters (HParams), the `A.*` metadata keys, and the
tensor declarations that fuse HF tensors into `.flm` ones (docs/flm_format.md).

A family module gives the family's config defaults and flags to `read_hparams`, and lists each
decoder layer's tensors with `layer_tensors` (usually `decoder_layer` with its HF names);
`add_tensors` then declares them all on the writer, checking every shape against the config
and that no checkpoint tensor is left over.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch

from .. import quantize
from ..errors import ConversionError
from ..rope import Rope, compute_rope, read_rope_config

TORCH_DTYPES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}


@dataclass
class HParams:
    arch: str                     # the family's ARCH: general.architecture and the key prefix
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
    rope: Rope
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False         # RMSNorm over head_dim of each q and k head (Qwen3)
    sliding_window: int | None = None            # every layer sees the last N positions
    sliding_window_layers: list | None = None    # per layer: N, or 0 for full attention
    ffn_activation: str = "silu"  # the GLU's activation: silu, gelu_tanh (Gemma)
    norm_shift: float = 0.0       # added to every norm weight (Gemma's x * (1 + w), folded in)
    embedding_scale: float | None = None   # embeddings times this (Gemma: sqrt(hidden))
    attention_scale: float | None = None   # of q . k; None: 1 / sqrt(head_dim)
    attn_softcap: float | None = None      # scores -> cap * tanh(scores / cap) (Gemma 2)
    final_softcap: float | None = None     # the same for the logits
    local_rope: Rope | None = None         # a second RoPE set (Gemma 3's sliding layers)
    rope_layer_sets: list | None = None    # per layer: 0 rope, 1 local_rope


# ---- config.json ----------------------------------------------------------------------------

def positive_int(config: dict, key: str, default=None) -> int:
    v = config.get(key)
    if v is None:
        v = default
    if v is None:
        raise ConversionError(f"config.json: missing {key}")
    if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
        raise ConversionError(f"config.json: {key} must be a positive integer, got {v!r}")
    return v


def flag(config: dict, key: str, default: bool = False) -> bool:
    v = config.get(key)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise ConversionError(f"config.json: {key} must be true or false, got {v!r}")
    return v


# transformers' activation names -> the GLU activations the decoder has
ACTIVATIONS = {"silu": "silu", "gelu_pytorch_tanh": "gelu_tanh"}


def read_hparams(config: dict, arch: str, defaults: dict, rope_options=None, rope=None,
                 activation=None, **flags) -> HParams:
    """The hyperparameters every family has. The sizes (vocab, hidden, intermediate, layers,
    heads) are required; for the rest `defaults` holds the family's transformers config defaults
    (num_key_value_heads: None means num_attention_heads; head_dim: None means hidden / heads).
    rope_options go to rope.read_rope_config (or `rope(head_dim, context)` computes the Rope);
    activation: the transformers activation name, when the family reads it from its own key
    (default: hidden_act, silu); flags (qkv_bias, ...) to HParams."""
    hidden = positive_int(config, "hidden_size")
    heads = positive_int(config, "num_attention_heads")
    kv_heads = positive_int(config, "num_key_value_heads", defaults.get("num_key_value_heads") or heads)
    if heads % kv_heads:
        raise ConversionError(f"config.json: num_key_value_heads ({kv_heads}) does not divide "
                              f"num_attention_heads ({heads})")
    head_dim = config.get("head_dim")
    if head_dim is None:
        head_dim = defaults.get("head_dim")
    if head_dim is not None:
        head_dim = positive_int({"head_dim": head_dim}, "head_dim")
    else:
        if hidden % heads:
            raise ConversionError(f"config.json: hidden_size ({hidden}) is not a multiple of "
                                  f"num_attention_heads ({heads}) and there is no head_dim")
        head_dim = hidden // heads
    act = activation or config.get("hidden_act", "silu")
    if act not in ACTIVATIONS:
        raise ConversionError(f"config.json: activation {act!r} is not supported for {arch} "
                              f"(supported: {', '.join(ACTIVATIONS)})")
    eps = config.get("rms_norm_eps", defaults["rms_norm_eps"])
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not eps > 0:
        raise ConversionError(f"config.json: invalid rms_norm_eps {eps!r}")
    context = positive_int(config, "max_position_embeddings", defaults["max_position_embeddings"])
    rope = (rope(head_dim, context) if rope is not None else
            compute_rope(read_rope_config(config, **(rope_options or {})), head_dim, context))
    return HParams(
        arch=arch,
        vocab_size=positive_int(config, "vocab_size"),
        hidden_size=hidden,
        intermediate_size=positive_int(config, "intermediate_size"),
        num_layers=positive_int(config, "num_hidden_layers"),
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        context_length=context,
        rms_norm_eps=float(eps),
        tie_word_embeddings=flag(config, "tie_word_embeddings", False),
        rope=rope,
        ffn_activation=ACTIVATIONS[act],
        **flags,
    )


def sliding_window(config: dict, default=None):
    """config.json's sliding_window (null: none), or the family default when the key is absent."""
    v = config["sliding_window"] if "sliding_window" in config else default
    if v is None:
        return None
    return positive_int({"sliding_window": v}, "sliding_window")


def sliding_window_layers(config: dict, num_layers: int, window, max_window_layers: int):
    """Per-layer windows (0 = full attention) from `layer_types`, or, without it, as Qwen2Config
    derives them: sliding from layer max_window_layers on, when there is a window. None when
    every layer attends to everything."""
    types = config.get("layer_types")
    if types is None:
        types = ["sliding_attention" if window is not None and i >= max_window_layers
                 else "full_attention" for i in range(num_layers)]
    if not isinstance(types, list) or len(types) != num_layers:
        raise ConversionError(f"config.json: layer_types must list {num_layers} layer types, got "
                              f"{types!r}")
    out = []
    for i, t in enumerate(types):
        t = {"attention": "full_attention"}.get(t, t)  # transformers' legacy name
        if t == "full_attention":
            out.append(0)
        elif t == "sliding_attention":
            if window is None:
                raise ConversionError(f"config.json: layer {i} is sliding_attention but there is no "
                                      f"sliding window (use_sliding_window false or sliding_window "
                                      f"null)")
            out.append(window)
        else:
            raise ConversionError(f"config.json: layer type {t!r} (layer {i}) is not supported "
                                  f"(full_attention, sliding_attention)")
    return out if any(out) else None


# ---- metadata -------------------------------------------------------------------------------

def add_metadata(writer, hp: HParams, tied: bool) -> None:
    """The `A.*` keys, A = hp.arch (docs/flm_format.md)."""
    a = hp.arch + "."
    writer.add_i64(a + "vocab_size", hp.vocab_size)
    writer.add_i64(a + "hidden_size", hp.hidden_size)
    writer.add_i64(a + "intermediate_size", hp.intermediate_size)
    writer.add_i64(a + "num_layers", hp.num_layers)
    writer.add_i64(a + "num_heads", hp.num_heads)
    writer.add_i64(a + "num_kv_heads", hp.num_kv_heads)
    writer.add_i64(a + "head_dim", hp.head_dim)
    writer.add_i64(a + "context_length", hp.context_length)
    writer.add_f64(a + "rms_norm_eps", hp.rms_norm_eps)
    writer.add_i64(a + "tie_word_embeddings", int(tied))
    rope = hp.rope
    writer.add_string(a + "rope.type", rope.rope_type)
    writer.add_f64(a + "rope.theta", float(rope.theta))
    writer.add_f32_array(a + "rope.inv_freq", rope.inv_freq)
    writer.add_f64(a + "rope.attention_factor", rope.attention_factor)
    if rope.dim != hp.head_dim:
        writer.add_i64(a + "rope.dim", rope.dim)
    if rope.long_inv_freq is not None:
        writer.add_f32_array(a + "rope.long_inv_freq", rope.long_inv_freq)
        writer.add_i64(a + "rope.original_context_length", rope.original_context_length)
    if hp.sliding_window is not None:
        writer.add_i64(a + "sliding_window", hp.sliding_window)
    if hp.sliding_window_layers is not None:
        writer.add_i64_array(a + "sliding_window_layers", hp.sliding_window_layers)
    if hp.local_rope is not None:
        writer.add_f32_array(a + "rope.local_inv_freq", hp.local_rope.inv_freq)
        writer.add_i64_array(a + "rope.layer_sets", hp.rope_layer_sets)
    if hp.ffn_activation != "silu":
        writer.add_string(a + "ffn_activation", hp.ffn_activation)
    for key, value in (("embedding_scale", hp.embedding_scale), ("attention.scale", hp.attention_scale),
                       ("attn_logit_softcapping", hp.attn_softcap),
                       ("final_logit_softcapping", hp.final_softcap)):
        if value is not None:
            writer.add_f64(a + key, float(value))


# ---- tensors --------------------------------------------------------------------------------

class TensorSpec(NamedTuple):
    """One .flm tensor: its HF parts (name without `model.`, shape), concatenated along dim 0."""
    name: str
    matrix: bool       # a weight matrix takes the conversion dtype; norms and biases stay f32
    parts: tuple
    shift: float = 0.0  # added to the HF values (hp.norm_shift, for norms)


# The HF names of a LLaMA layer's norms, by role: before attention, before the MLP, and (Gemma 2,
# Gemma 3) on the attention and MLP outputs.
LLAMA_NORMS = dict(attn="input_layernorm", ffn="post_attention_layernorm")


def decoder_layer(hp: HParams, i: int, qkv=("q_proj", "k_proj", "v_proj"),
                  gate_up=("gate_proj", "up_proj"), norms=LLAMA_NORMS) -> list:
    """The tensors of decoder layer i in the LLaMA layout (HF names under layers.i.self_attn /
    .mlp); qkv and gate_up name the HF matrices fused into attn_qkv and ffn_gate_up (Phi-3 stores
    them fused already: qkv_proj, gate_up_proj); norms the layer's norms by role (LLAMA_NORMS,
    plus post_attn and post_ffn for sandwich norms). Biases and q/k norms as hp says."""
    H, I = hp.hidden_size, hp.intermediate_size
    q, kv = hp.num_heads * hp.head_dim, hp.num_kv_heads * hp.head_dim
    rows = {"q_proj": q, "k_proj": kv, "v_proj": kv, "qkv_proj": q + 2 * kv,
            "gate_proj": I, "up_proj": I, "gate_up_proj": 2 * I}
    p, b = f"layers.{i}.", f"blk.{i}."
    a, m = p + "self_attn.", p + "mlp."

    def fused(prefix, names, suffix):
        return tuple((prefix + n + suffix, (rows[n], H) if suffix == ".weight" else (rows[n],))
                     for n in names)

    def norm(flm, role, size=H, prefix=p):
        return TensorSpec(b + flm + ".weight", False, ((prefix + norms[role] + ".weight", (size,)),),
                          hp.norm_shift)

    specs = [norm("attn_norm", "attn"), TensorSpec(b + "attn_qkv.weight", True, fused(a, qkv, ".weight"))]
    if hp.qkv_bias:
        specs.append(TensorSpec(b + "attn_qkv.bias", False, fused(a, qkv, ".bias")))
    if hp.qk_norm:
        specs.append(TensorSpec(b + "attn_q_norm.weight", False, ((a + "q_norm.weight", (hp.head_dim,)),),
                                hp.norm_shift))
        specs.append(TensorSpec(b + "attn_k_norm.weight", False, ((a + "k_norm.weight", (hp.head_dim,)),),
                                hp.norm_shift))
    specs.append(TensorSpec(b + "attn_output.weight", True, ((a + "o_proj.weight", (H, q)),)))
    if hp.o_bias:
        specs.append(TensorSpec(b + "attn_output.bias", False, ((a + "o_proj.bias", (H,)),)))
    if "post_attn" in norms:
        specs.append(norm("post_attention_norm", "post_attn"))
    specs.append(norm("ffn_norm", "ffn"))
    specs.append(TensorSpec(b + "ffn_gate_up.weight", True, fused(m, gate_up, ".weight")))
    if hp.mlp_bias:
        specs.append(TensorSpec(b + "ffn_gate_up.bias", False, fused(m, gate_up, ".bias")))
    specs.append(TensorSpec(b + "ffn_down.weight", True, ((m + "down_proj.weight", (H, I)),)))
    if hp.mlp_bias:
        specs.append(TensorSpec(b + "ffn_down.bias", False, ((m + "down_proj.bias", (H,)),)))
    if "post_ffn" in norms:
        specs.append(norm("post_ffw_norm", "post_ffn"))
    return specs


def model_tensors(hp: HParams, layer_tensors) -> list:
    """Every .flm tensor but the output head, in file order."""
    H, V = hp.hidden_size, hp.vocab_size
    specs = [TensorSpec("token_embd.weight", True, (("embed_tokens.weight", (V, H)),))]
    for i in range(hp.num_layers):
        specs += layer_tensors(hp, i)
    specs.append(TensorSpec("output_norm.weight", False, (("norm.weight", (H,)),), hp.norm_shift))
    return specs


def output_tensor(hp: HParams) -> TensorSpec:
    """The output head, when it is not tied to the embedding."""
    return TensorSpec("output.weight", True, (("lm_head.weight", (hp.vocab_size, hp.hidden_size)),))


def to_numpy(t: torch.Tensor, dtype: str, what: str, quantized: bool = False) -> np.ndarray:
    """Converts (rounding to nearest even) to the .flm dtype; bf16 becomes uint16 bit patterns.
    Other (quantized) dtypes get float32 data, which the writer quantizes. quantized: the writer
    quantizes this tensor (whatever dtype says: a policy's); float16 and bfloat16 (as quantize.BF16
    bits) then stay as they are where the library widens them row by row as it quantizes (a bf16
    folder's int4 conversion of the 1.1B shape: docs/quantization.md)."""
    if not t.is_floating_point():
        raise ConversionError(f"{what}: expected a floating-point tensor, got {t.dtype}")
    if quantized and (t.dtype == torch.float16 and quantize.takes_f16()
                      or t.dtype == torch.bfloat16 and quantize.takes_bf16()):
        t = t.detach().to(device="cpu").contiguous()
        return t.numpy() if t.dtype == torch.float16 else t.view(torch.int16).numpy().view(quantize.BF16)
    t = t.detach().to(device="cpu", dtype=TORCH_DTYPES.get(dtype, torch.float32)).contiguous()
    if dtype == "bf16":
        return t.view(torch.int16).numpy().view(np.uint16)
    return t.numpy()


class TensorMap:
    """Finds HF tensors by their name without the `model.` prefix (or a multimodal checkpoint's
    `language_model.model.`); tracks which were used. Tensors under `skipped` prefixes (a vision
    tower) are left out on purpose."""

    PREFIXES = ("model.", "", "language_model.model.")

    def __init__(self, ckpt, arch: str = "this", skipped: tuple = ()):
        self.ckpt = ckpt
        names = ckpt.names()
        self.prefix = next((p for p in self.PREFIXES if p + "embed_tokens.weight" in names), None)
        if self.prefix is None:
            raise ConversionError(f"{ckpt.path}: no model.embed_tokens.weight in the weights; "
                                  f"is this a {arch} checkpoint?")
        self.head = "language_model.lm_head.weight" if self.prefix == "language_model.model." else "lm_head.weight"
        self.skipped = skipped
        self.used = set()

    def full(self, name: str) -> str:
        return self.head if name == "lm_head.weight" else self.prefix + name

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
                if n not in self.used and not n.endswith("rotary_emb.inv_freq") and not n.startswith(self.skipped)]


def add_tensors(writer, ckpt, hp: HParams, dtype: str, layer_tensors, skipped: tuple = ()) -> bool:
    """Declares every tensor on the writer (the data is read when the writer asks for it); those
    under `skipped` prefixes are left out. Returns whether the output head is tied to the embedding."""
    m = TensorMap(ckpt, hp.arch, skipped)
    tied = hp.tie_word_embeddings or not m.has("lm_head.weight")
    quantize.tell_policy(writer.dtype_policy, hp.num_layers, tied)

    def declare(spec: TensorSpec):
        full = [m.check(name, shape) for name, shape in spec.parts]
        shape = list(spec.parts[0][1])
        shape[0] = sum(s[0] for _, s in spec.parts)
        out_dtype = dtype if spec.matrix else "f32"
        target = writer.dtype_policy(spec.name, tuple(shape)) if writer.dtype_policy is not None else out_dtype
        # made in the dtype the writer stores where it is a plain one (an int8 preset's f16 head from
        # an f16 folder: as it lies, not widened here and rounded again by the writer)
        as_dtype = target if target in TORCH_DTYPES else out_dtype

        def produce():
            tensors = [ckpt.get(n) for n in full]
            grids = [ckpt.grid(n) if hasattr(ckpt, "grid") else None for n in full]
            quantized = target in quantize.QUANT and all(g is None for g in grids) and not spec.shift
            if len(tensors) > 1 and spec.matrix and not spec.shift \
                    and (out_dtype == "f32" or out_dtype in quantize.QUANT) and all(g is None for g in grids):
                # a fused matrix in float32, most often for the writer to quantize (its dtype policy
                # decides): its parts as they are (RowBlocks), not copied together
                return quantize.RowBlocks([to_numpy(t, as_dtype, spec.name, quantized) for t in tensors])
            t = tensors[0] if len(tensors) == 1 else torch.cat(tensors, dim=0)
            if spec.shift:  # in float32, as transformers computes 1.0 + weight.float()
                t = t.to(torch.float32) + spec.shift
            arr = to_numpy(t, as_dtype, spec.name, quantized)
            if all(g is not None for g in grids):  # rounded by calibration (calibrate.py)
                return quantize.OnGrid(arr, quantize.Grid.stack(grids))
            return arr

        writer.add_tensor(spec.name, out_dtype, tuple(shape), produce)

    for spec in model_tensors(hp, layer_tensors):
        declare(spec)
    if tied:
        if m.has("lm_head.weight"):
            m.used.add(m.full("lm_head.weight"))  # a saved copy of the embedding
    else:
        declare(output_tensor(hp))

    extra = m.unused()
    if extra:
        shown = ", ".join(extra[:5]) + (f" and {len(extra) - 5} more" if len(extra) > 5 else "")
        raise ConversionError(f"the weights have tensors this {hp.arch} config does not use: {shown}")
    return tied
