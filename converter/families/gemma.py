"""Gemma (GemmaForCausalLM): the LLaMA layout with Gemma's arithmetic, and what Gemma 2 and 3
(gemma2.py, gemma3.py) share:

- RMSNorm computes x / rms(x) * (1 + w): the 1 is added to every norm weight here, in float32 as
  transformers adds it (llama.cpp's converter stores its GGUF norms the same way), so the decoder's
  plain RMSNorm computes it;
- the GLU activation is GELU's tanh approximation (hidden_act, legacy "gelu" meaning it, as
  transformers reads it);
- embeddings are multiplied by sqrt(hidden_size), rounded to float32 and then to the checkpoint's
  dtype (config.json `dtype` / `torch_dtype`): transformers multiplies by the scale cast to the
  weights' dtype, so a bfloat16 Gemma-3-1B (hidden 1152) runs with 34.0, not 33.94;
- head_dim 256 by default, tied embeddings by default, BOS added.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from ..errors import ConversionError
from . import common

ARCH = "gemma"
HF_ARCHITECTURES = ("GemmaForCausalLM",)
MODEL_TYPE = "gemma"
GGUF_ARCH = "gemma"
ADD_BOS_DEFAULT = True
DEFAULTS = dict(num_key_value_heads=16, head_dim=256, max_position_embeddings=8192, rms_norm_eps=1e-6)
NORM_SHIFT = 1.0

add_metadata = common.add_metadata

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def embedding_scale(hidden: int, config: dict) -> float:
    """sqrt(hidden) as float32, then in the checkpoint's dtype (see the module docstring)."""
    scale = torch.tensor(math.sqrt(hidden), dtype=torch.float32)
    dtype = config.get("dtype") or config.get("torch_dtype") or "float32"
    if dtype not in _DTYPES:
        raise ConversionError(f"config.json: dtype {dtype!r} is not one of {', '.join(_DTYPES)}")
    return float(scale.to(_DTYPES[dtype]).to(torch.float32))


def activation(config: dict, key: str) -> str:
    """The transformers activation name; "gelu" is Gemma's legacy name for the tanh approximation."""
    act = config.get(key) or config.get("hidden_act") or "gelu_pytorch_tanh"
    return "gelu_pytorch_tanh" if act == "gelu" else act


def refuse_bidirectional(config: dict) -> None:
    if config.get("use_bidirectional_attention"):
        raise ConversionError("config.json: use_bidirectional_attention is set (an embedding model such "
                              "as EmbeddingGemma); only causal language models are supported")


def gemma_hparams(config: dict, arch: str, defaults: dict, act_key: str, **kw) -> common.HParams:
    """What every Gemma generation reads: Gemma's norms, activation and embedding scale."""
    refuse_bidirectional(config)
    config = dict(config)
    config.setdefault("tie_word_embeddings", True)  # GemmaConfig's default
    hp = common.read_hparams(config, arch, defaults, activation=activation(config, act_key),
                             norm_shift=NORM_SHIFT, **kw)
    hp.embedding_scale = embedding_scale(hp.hidden_size, config)
    bias = common.flag(config, "attention_bias")
    hp.qkv_bias = hp.o_bias = bias
    return hp


def read_hparams(config: dict) -> common.HParams:
    # GemmaConfig 5.x reads hidden_act; 4.x read hidden_activation first (None: the tanh GELU)
    return gemma_hparams(config, ARCH, DEFAULTS, "hidden_activation")


def layer_tensors(hp: common.HParams, i: int) -> list:
    return common.decoder_layer(hp, i)


def add_tensors(writer, ckpt, hp: common.HParams, dtype: str) -> bool:
    return common.add_tensors(writer, ckpt, hp, dtype, layer_tensors)
