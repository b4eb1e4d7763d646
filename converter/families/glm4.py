"""GLM-4-0414 (Glm4ForCausalLM, e.g. GLM-4-9B-0414): GLM's decoder (glm.py: q/k/v biases,
fused gate|up, interleaved RoPE over half of each head) plus a norm on the attention output
(post_self_attn_layernorm -> blk.N.post_attention_norm) and on the MLP output
(post_mlp_layernorm -> blk.N.post_ffw_norm) before each residual add: the sandwich norms the
C++ family turns on (arch/glm4.cpp)."""

from __future__ import annotations

from . import common, glm

ARCH = "glm4"
HF_ARCHITECTURES = ("Glm4ForCausalLM",)
MODEL_TYPE = "glm4"
GGUF_ARCH = "glm4"
ADD_BOS_DEFAULT = False
DEFAULTS = glm.DEFAULTS  # Glm4Config's are GlmConfig's

add_metadata = common.add_metadata


def read_hparams(config: dict) -> common.HParams:
    hp = glm.read_hparams(config)
    hp.arch = ARCH
    return hp


def layer_tensors(hp: common.HParams, i: int) -> list:
    specs = glm.layer_tensors(hp, i)
    H, p, b = (hp.hidden_size,), f"layers.{i}.", f"blk.{i}."
    post_attn = common.TensorSpec(b + "post_attention_norm.weight", False, ((p + "post_self_attn_layernorm.weight", H),))
    post_ffw = common.TensorSpec(b + "post_ffw_norm.weight", False, ((p + "post_mlp_layernorm.weight", H),))
    at = next(k for k, s in enumerate(specs) if s.name == b + "ffn_norm.weight")
    return specs[:at] + [post_attn] + specs[at:] + [post_ffw]


def add_tensors(writer, ckpt, hp: common.HParams, dtype: str) -> bool:
    return common.add_tensors(writer, ckpt, hp, dtype, layer_tensors)
