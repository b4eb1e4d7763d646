"""Gemma 3 text models (Gemma3ForCausalLM, model_type gemma3_text, e.g. gemma-3-1b-it): Gemma 2's
layout (gemma2.py) plus a (1 + w) RMSNorm of every q and k head (q_norm, k_norm), no
soft-capping unless configured, the sliding window on 5 of every 6 layers (`layer_types`, or
sliding_window_pattern, default 6), and two RoPE sets: the full-attention layers rotate with
rope_theta (default 1e6) and the config's scaling, the sliding ones with rope_local_base_freq
(default 1e4) and no scaling — `rope_parameters` {full_attention: ..., sliding_attention: ...}
in transformers 5.x configs. attn_logit_softcapping is ignored with a warning (transformers'
Gemma 3 never applies it).

The multimodal checkpoints (Gemma3ForConditionalGeneration: gemma-3-4b/12b/27b-it) convert as
their language model, with a warning: config.json's text_config, the tensors under
language_model.model., the vision tower and projector left out (fastllm reads text only; a
prompt's image tokens are plain ids to it)."""

from __future__ import annotations

import warnings

from ..errors import ConversionError
from ..rope import compute_rope, read_rope_config
from . import common, gemma2

ARCH = "gemma3"
HF_ARCHITECTURES = ("Gemma3ForCausalLM", "Gemma3ForConditionalGeneration")
MODEL_TYPE = "gemma3_text"
GGUF_ARCH = "gemma3"
ADD_BOS_DEFAULT = True
DEFAULTS = dict(num_key_value_heads=4, head_dim=256, max_position_embeddings=131072, rms_norm_eps=1e-6)
ROPE_TYPES = ("default", "linear", "llama3")
VISION = ("vision_tower.", "multi_modal_projector.")  # a multimodal checkpoint's, left out

add_metadata = common.add_metadata


def rope_params(config: dict) -> tuple:
    """(full-attention, sliding-attention) rope parameter dicts, from either config style."""
    params = config.get("rope_parameters")
    if isinstance(params, dict) and ("full_attention" in params or "sliding_attention" in params):
        full = dict(params.get("full_attention") or {})
        local = dict(params.get("sliding_attention") or {})
    else:
        full = dict(config.get("rope_scaling") or params or {})
        local = {}
    full.setdefault("rope_theta", config.get("rope_theta", 1_000_000.0))
    local.setdefault("rope_theta", config.get("rope_local_base_freq", 10_000.0))
    local.setdefault("rope_type", "default")
    return full, local


def read_hparams(config: dict) -> common.HParams:
    if "text_config" in config:  # Gemma3ForConditionalGeneration: its language model
        warnings.warn("a multimodal Gemma 3 checkpoint: its language model is converted, the vision tower "
                      "and projector are left out")
        if not isinstance(config["text_config"], dict):
            raise ConversionError("config.json: text_config must be an object")
        text = dict(config["text_config"])
        for key in ("dtype", "torch_dtype", "tie_word_embeddings"):  # the top level's hold for it
            if key in config and key not in text:
                text[key] = config[key]
        config = text
    full, local = rope_params(config)

    def rope(params):
        return lambda head_dim, context: compute_rope(
            read_rope_config({"rope_parameters": params}, types=ROPE_TYPES), head_dim, context)

    if config.get("attn_logit_softcapping") is not None:
        # Gemma3Config documents it, Gemma3Attention never applies it (transformers 5.24), llama.cpp's
        # converter refuses it: the model computes without it, and so does fastllm
        warnings.warn(f"config.json: attn_logit_softcapping {config['attn_logit_softcapping']} is "
                      f"ignored, as transformers' Gemma 3 ignores it")
    hp = gemma2.sandwich_hparams(config, ARCH, DEFAULTS, (None, None),
                                 common.positive_int(config, "sliding_window_pattern", 6), rope=rope(full),
                                 qk_norm=True)
    if hp.sliding_window_layers is not None:
        hp.local_rope = rope(local)(hp.head_dim, hp.context_length)
        hp.rope_layer_sets = [1 if w else 0 for w in hp.sliding_window_layers]
    return hp


def layer_tensors(hp: common.HParams, i: int) -> list:
    return common.decoder_layer(hp, i, norms=gemma2.SANDWICH_NORMS)


def add_tensors(writer, ckpt, hp: common.HParams, dtype: str) -> bool:
    return common.add_tensors(writer, ckpt, hp, dtype, layer_tensors, skipped=VISION)
