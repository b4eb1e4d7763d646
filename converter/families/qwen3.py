"""Qwen3 (Qwen3ForCausalLM): the LLaMA layout with an RMSNorm over each q and k head before RoPE
(q_norm, k_norm: [head_dim], eps rms_norm_eps), an explicit head_dim (128 when config.json does
not say), q/k/v/o biases with `attention_bias`, and Qwen2's sliding window rules."""

from __future__ import annotations

from . import common, qwen2

ARCH = "qwen3"
HF_ARCHITECTURES = ("Qwen3ForCausalLM",)
MODEL_TYPE = "qwen3"
GGUF_ARCH = "qwen3"
ADD_BOS_DEFAULT = False
DEFAULTS = dict(num_key_value_heads=32, head_dim=128, max_position_embeddings=32768,
                rms_norm_eps=1e-6)

add_metadata = common.add_metadata


def read_hparams(config: dict) -> common.HParams:
    bias = common.flag(config, "attention_bias")
    hp = common.read_hparams(config, ARCH, DEFAULTS, qkv_bias=bias, o_bias=bias, qk_norm=True)
    hp.sliding_window_layers = qwen2.sliding_window_layers(config, hp.num_layers)
    return hp


def layer_tensors(hp: common.HParams, i: int) -> list:
    return common.decoder_layer(hp, i)


def add_tensors(writer, ckpt, hp: common.HParams, dtype: str) -> bool:
    return common.add_tensors(writer, ckpt, hp, dtype, layer_tensors)
