"""RoPE parameters of a HuggingFace config -> the inverse frequencies stored in `.flm` files.

Two config styles exist:
  transformers 4.x: top-level `rope_theta` (default 10000) and `rope_scaling`
                    (null, or a dict with `rope_type` -- older files say `type` -- and its fields);
  transformers 5.x: a `rope_parameters` dict holding `rope_theta`, `rope_type` and the fields.
When both are present (files written to be readable by both), `rope_parameters` wins and the
top-level `rope_theta` only fills in a missing theta.

The inverse frequencies are computed with the same float32 torch operations, in the same order,
as transformers' LlamaRotaryEmbedding, so they are bit-identical to its `inv_freq` buffer. The
order matters: e.g. `tensor / python_float` in torch is not the same float32 operation as numpy's
division, and the llama3 blend rounds after every step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch

from .errors import ConversionError

SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")
DEFAULT_THETA = 10000.0


@dataclass
class RopeConfig:
    rope_type: str
    theta: float
    params: dict = field(default_factory=dict)   # the scaling fields (factor, ...)
    attention_factor: float = 1.0                # multiplies cos and sin; 1 for the types above


def _per_layer(params: dict) -> bool:
    return bool(params) and all(isinstance(v, dict) or v is None for v in params.values())


def read_rope_config(config: dict) -> RopeConfig:
    """Reads the rope type, theta and scaling fields from either config style."""
    top_theta = config.get("rope_theta")
    params = config.get("rope_parameters")
    if params is None:
        params = config.get("rope_scaling")
    if params is None:
        params = {}
    if not isinstance(params, dict):
        raise ConversionError(f"config.json: rope parameters must be an object, got {params!r}")
    if _per_layer(params):
        raise ConversionError(f"config.json: per-layer rope parameters "
                              f"({', '.join(params)}) are not supported for this model")
    params = dict(params)
    rope_type = params.pop("rope_type", None)
    legacy_type = params.pop("type", None)
    rope_type = rope_type or legacy_type or "default"
    theta = params.pop("rope_theta", None)
    if theta is None:
        theta = top_theta if top_theta is not None else DEFAULT_THETA
    if isinstance(theta, bool) or not isinstance(theta, (int, float)) or not theta > 0:
        raise ConversionError(f"config.json: invalid rope_theta {theta!r}")
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise ConversionError(f"unsupported rope type {rope_type!r} (supported: "
                              f"{', '.join(SUPPORTED_ROPE_TYPES)})")
    prf = params.pop("partial_rotary_factor", config.get("partial_rotary_factor", 1.0))
    if prf not in (None, 1, 1.0):
        raise ConversionError(f"partial_rotary_factor {prf} is not supported")
    return RopeConfig(rope_type=rope_type, theta=theta, params=params)


def _field(rope: RopeConfig, name: str, default=None):
    v = rope.params.get(name, default)
    if v is None:
        raise ConversionError(f"rope type {rope.rope_type!r} needs {name!r} in the rope "
                              f"parameters of config.json")
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ConversionError(f"rope parameter {name!r} must be a number, got {v!r}")
    return v


def compute_inv_freq(rope: RopeConfig, head_dim: int, max_position_embeddings: int) -> np.ndarray:
    """The head_dim/2 inverse frequencies (float32) with the rope type's scaling applied."""
    if head_dim <= 0 or head_dim % 2:
        raise ConversionError(f"head_dim must be a positive even number for RoPE, got {head_dim}")
    dim = head_dim
    exponents = torch.arange(0, dim, 2, dtype=torch.int64).to(dtype=torch.float32) / dim
    inv_freq = 1.0 / (rope.theta ** exponents)

    if rope.rope_type == "linear":
        factor = _field(rope, "factor")
        inv_freq = inv_freq / factor
    elif rope.rope_type == "llama3":
        factor = _field(rope, "factor")
        low = _field(rope, "low_freq_factor")
        high = _field(rope, "high_freq_factor")
        orig_ctx = _field(rope, "original_max_position_embeddings", max_position_embeddings)
        if not high > low:
            raise ConversionError(f"llama3 rope: high_freq_factor ({high}) must be greater than "
                                  f"low_freq_factor ({low})")
        # Wavelengths longer than orig_ctx/low: frequency divided by factor; shorter than
        # orig_ctx/high: unchanged; in between: blend linearly in orig_ctx/wavelength.
        long_wavelen = orig_ctx / low
        short_wavelen = orig_ctx / high
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > long_wavelen, inv_freq / factor, inv_freq)
        smooth = (orig_ctx / wavelen - low) / (high - low)
        blended = (1 - smooth) * scaled / factor + smooth * scaled
        in_between = ~(wavelen < short_wavelen) & ~(wavelen > long_wavelen)
        inv_freq = torch.where(in_between, blended, scaled)

    return inv_freq.to(torch.float32).numpy().copy()
