"""LLaMA (LlamaForCausalLM: LLaMA 1/2/3, TinyLlama, SmolLM, ...): the reference layout the
other families vary. q/k/v/o biases with `attention_bias`, gate/up/down biases with `mlp_bias`;
rope default, linear or llama3."""

from __future__ import annotations

from . import common

ARCH = "llama"
HF_ARCHITECTURES = ("LlamaForCausalLM",)
MODEL_TYPE = "llama"
GGUF_ARCH = "llama"
ADD_BOS_DEFAULT = True  # LlamaTokenizer's default
DEFAULTS = dict(num_key_value_heads=None, max_position_embeddings=2048, rms_norm_eps=1e-6)

add_metadata = common.add_metadata


def read_hparams(config: dict) -> common.HParams:
    bias = common.flag(config, "attention_bias")
    return common.read_hparams(config, ARCH, DEFAULTS, qkv_bias=bias, o_bias=bias,
                               mlp_bias=common.flag(config, "mlp_bias"))


def layer_tensors(hp: common.HParams, i: int) -> list:
    return common.decoder_layer(hp, i)


def add_tensors(writer, ckpt, hp: common.HParams, dtype: str) -> bool:
    return common.add_tensors(writer, ckpt, hp, dtype, layer_tensors)
