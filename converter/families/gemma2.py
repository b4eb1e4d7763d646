"""Gemma 2 (Gemma2ForCausalLM): Gemma (gemma.py) plus a norm on the attention and MLP outputs
before each residual add (post_attention_layernorm, post_feedforward_layernorm; the MLP's input
norm is pre_feedforward_layernorm), the query-key scale query_pre_attn_scalar^-1/2, tanh
soft-capping of the attention scores (attn_logit_softcapping, default 50) and of the logits
(final_logit_softcapping, default 30), and a sliding window (default 4096) on the layers
`layer_types` marks sliding_attention (by default every other one, from layer 0)."""

from __future__ import annotations

from ..errors import ConversionError
from . import common, gemma

ARCH = "gemma2"
HF_ARCHITECTURES = ("Gemma2ForCausalLM",)
MODEL_TYPE = "gemma2"
GGUF_ARCH = "gemma2"
ADD_BOS_DEFAULT = True
DEFAULTS = dict(num_key_value_heads=4, head_dim=256, max_position_embeddings=8192, rms_norm_eps=1e-6)
SANDWICH_NORMS = dict(attn="input_layernorm", post_attn="post_attention_layernorm",
                      ffn="pre_feedforward_layernorm", post_ffn="post_feedforward_layernorm")

add_metadata = common.add_metadata


def optional_number(config: dict, key: str, default):
    v = config[key] if key in config else default
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
        raise ConversionError(f"config.json: {key} must be a positive number or null, got {v!r}")
    return float(v)


def window_layers(config: dict, num_layers: int, default_window, pattern: int) -> list | None:
    """Per-layer windows: `layer_types`, or as the config class derives them from the pattern
    (every pattern-th layer, counting from 1, is full attention)."""
    window = common.sliding_window(config, default_window)
    if config.get("layer_types") is None:
        config = dict(config, layer_types=["sliding_attention" if (i + 1) % pattern else "full_attention"
                                           for i in range(num_layers)])
    return common.sliding_window_layers(config, num_layers, window, 0)


def sandwich_hparams(config: dict, arch: str, defaults: dict, softcaps: tuple, pattern: int,
                     **kw) -> common.HParams:
    """What Gemma 2 and 3 share; softcaps: the defaults of (attention, final) soft-capping, None
    for attention when the model class never applies it (Gemma 3)."""
    hp = gemma.gemma_hparams(config, arch, defaults, "hidden_activation", **kw)
    scalar = optional_number(config, "query_pre_attn_scalar", 256)
    if scalar is None:
        raise ConversionError("config.json: query_pre_attn_scalar must be a positive number, got null")
    hp.attention_scale = scalar ** -0.5
    if softcaps[0] is not None:
        hp.attn_softcap = optional_number(config, "attn_logit_softcapping", softcaps[0])
    hp.final_softcap = optional_number(config, "final_logit_softcapping", softcaps[1])
    hp.sliding_window_layers = window_layers(config, hp.num_layers, 4096, pattern)
    return hp


def read_hparams(config: dict) -> common.HParams:
    return sandwich_hparams(config, ARCH, DEFAULTS, (50.0, 30.0), 2)


def layer_tensors(hp: common.HParams, i: int) -> list:
    return common.decoder_layer(hp, i, norms=SANDWICH_NORMS)


def add_tensors(writer, ckpt, hp: common.HParams, dtype: str) -> bool:
    return common.add_tensors(writer, ckpt, hp, dtype, layer_tensors)
