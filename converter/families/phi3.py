"""Phi-3, Phi-3.5, Phi-4-mini (Phi3ForCausalLM): q/k/v stored fused (self_attn.qkv_proj, q rows
then k then v) and gate/up too (mlp.gate_up_proj, gate rows first: the MLP chunks it in two),
no biases; RoPE over the first int(head_dim * partial_rotary_factor) dims of each head, default
or LongRoPE (rope_type longrope, legacy "su" / "yarn": short factors up to
original_max_position_embeddings, long ones past it); an optional sliding window in every
layer (Phi3Config: sliding_window, default none)."""

from __future__ import annotations

from . import common

ARCH = "phi3"
HF_ARCHITECTURES = ("Phi3ForCausalLM",)
MODEL_TYPE = "phi3"
GGUF_ARCH = "phi3"
ADD_BOS_DEFAULT = True  # its tokenizer class is LlamaTokenizer; Phi-3's tokenizer_config says false
DEFAULTS = dict(num_key_value_heads=None, max_position_embeddings=4096, rms_norm_eps=1e-5)
ROPE = dict(types=("default", "longrope"), aliases={"su": "longrope", "yarn": "longrope"},
            partial_rotary=True, original_context_default=4096)

add_metadata = common.add_metadata


def read_hparams(config: dict) -> common.HParams:
    return common.read_hparams(config, ARCH, DEFAULTS, rope_options=ROPE,
                               sliding_window=common.sliding_window(config, None))


def layer_tensors(hp: common.HParams, i: int) -> list:
    return common.decoder_layer(hp, i, qkv=("qkv_proj",), gate_up=("gate_up_proj",))


def add_tensors(writer, ckpt, hp: common.HParams, dtype: str) -> bool:
    return common.add_tensors(writer, ckpt, hp, dtype, layer_tensors)
