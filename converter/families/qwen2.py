"""Qwen2 / Qwen2.5 (Qwen2ForCausalLM): the LLaMA layout with q/k/v biases (none on o or the MLP),
tied or untied embeddings, and, with use_sliding_window, a per-layer sliding window
(Qwen2Config: layers from max_window_layers on, or as `layer_types` says)."""

from __future__ import annotations

from ..errors import ConversionError
from . import common

ARCH = "qwen2"
HF_ARCHITECTURES = ("Qwen2ForCausalLM",)
MODEL_TYPE = "qwen2"
GGUF_ARCH = "qwen2"
ADD_BOS_DEFAULT = False  # byte-level BPE: its files say (Qwen adds no BOS)
DEFAULTS = dict(num_key_value_heads=32, max_position_embeddings=32768, rms_norm_eps=1e-6)

add_metadata = common.add_metadata


def sliding_window_layers(config: dict, num_layers: int):
    """Qwen2Config / Qwen3Config: the window exists only with use_sliding_window (default 4096)."""
    window = common.sliding_window(config, 4096) if common.flag(config, "use_sliding_window") else None
    max_window_layers = config.get("max_window_layers", 28)
    if isinstance(max_window_layers, bool) or not isinstance(max_window_layers, int):
        raise ConversionError(f"config.json: max_window_layers must be an integer, got "
                              f"{max_window_layers!r}")
    return common.sliding_window_layers(config, num_layers, window, max_window_layers)


def read_hparams(config: dict) -> common.HParams:
    hp = common.read_hparams(config, ARCH, DEFAULTS, qkv_bias=True)
    hp.sliding_window_layers = sliding_window_layers(config, hp.num_layers)
    return hp


def layer_tensors(hp: common.HParams, i: int) -> list:
    return common.decoder_layer(hp, i)


def add_tensors(writer, ckpt, hp: common.HParams, dtype: str) -> bool:
    return common.add_tensors(writer, ckpt, hp, dtype, layer_tensors)
