"""Mistral (MistralForCausalLM): the LLaMA layout without biases, an explicit head_dim in newer
configs, and a sliding window over the last `sliding_window` positions in every layer (4096
when config.json does not say, as MistralConfig defaults; null: none)."""

from __future__ import annotations

from . import common

ARCH = "mistral"
HF_ARCHITECTURES = ("MistralForCausalLM",)
MODEL_TYPE = "mistral"
GGUF_ARCH = "llama"  # llama.cpp writes Mistral as `llama` (see gguf_import.py)
ADD_BOS_DEFAULT = True
DEFAULTS = dict(num_key_value_heads=8, max_position_embeddings=4096 * 32, rms_norm_eps=1e-6)
DEFAULT_SLIDING_WINDOW = 4096

add_metadata = common.add_metadata


def read_hparams(config: dict) -> common.HParams:
    return common.read_hparams(config, ARCH, DEFAULTS,
                               sliding_window=common.sliding_window(config, DEFAULT_SLIDING_WINDOW))


def layer_tensors(hp: common.HParams, i: int) -> list:
    return common.decoder_layer(hp, i)


def add_tensors(writer, ckpt, hp: common.HParams, dtype: str) -> bool:
    return common.add_tensors(writer, ckpt, hp, dtype, layer_tensors)
