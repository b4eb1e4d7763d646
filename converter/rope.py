"""RoPE parameters of a HuggingFace config -> the inverse frequencies stored in `.flm` files.

Two config styles exist:
  transformers 4.x: top-level `rope_theta` (default 10000) and `rope_scaling`
                    (null, or a dict with `rope_type` -- older files say `type` -- and its fields);
  transformers 5.x: a `rope_parameters` dict holding `rope_theta`, `rope_type` and the fields.
When both are present, a non-empty `rope_scaling` wins, as in transformers 5.24
(`convert_rope_params_to_dict`), and the top-level `rope_theta` and `partial_rotary_factor` only
fill in what the dict lacks.

The inverse frequencies are computed with the same float32 torch operations, in the same order,
as transformers' rotary embeddings and modeling_rope_utils.py, so they are bit-identical to its
`inv_freq` buffers. The order matters: e.g. `tensor / python_float` in torch is not the same
float32 operation as numpy's division, and the llama3 blend rounds after every step.

    rc = read_rope_config(config)                   # what the config says
    rope = compute_rope(rc, head_dim, max_position_embeddings)   # what the .flm file stores
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch

from .errors import ConversionError

SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "longrope")
DEFAULT_THETA = 10000.0
# types whose original (pretraining) context is a parameter; a top-level
# original_max_position_embeddings overrides the dict's (transformers' standardize_rope_params)
_ORIGINAL_CONTEXT_TYPES = ("llama3", "longrope")


@dataclass
class RopeConfig:
    rope_type: str
    theta: float
    params: dict = field(default_factory=dict)   # the scaling fields (factor, long_factor, ...)
    partial_rotary_factor: float = 1.0
    original_context_length: int | None = None   # for llama3 / longrope


@dataclass
class Rope:
    """The `A.rope.*` keys of a .flm file (docs/flm_format.md)."""
    rope_type: str
    theta: float
    dim: int                     # rotated dimensions per head (the first `dim` of head_dim)
    inv_freq: np.ndarray         # dim/2 float32, scaling applied (longrope: the short factors)
    attention_factor: float = 1.0
    long_inv_freq: np.ndarray | None = None       # longrope: past original_context_length
    original_context_length: int | None = None    # longrope


def _per_layer(params: dict) -> bool:
    return bool(params) and all(isinstance(v, dict) or v is None for v in params.values())


def read_rope_config(config: dict, types=("default", "linear", "llama3"), aliases=None,
                     partial_rotary: bool = False, original_context_default=None) -> RopeConfig:
    """Reads the rope type, theta and scaling fields from either config style.
    types: the rope types the family's model class accepts; aliases: legacy type names (Phi-3's
    "su" -> "longrope"); partial_rotary: whether the family rotates part of each head
    (partial_rotary_factor); original_context_default: the family's default for a missing
    top-level original_max_position_embeddings (Phi3Config: 4096)."""
    top_theta = config.get("rope_theta")
    params = config.get("rope_scaling") or config.get("rope_parameters") or {}
    if not isinstance(params, dict):
        raise ConversionError(f"config.json: rope parameters must be an object, got {params!r}")
    if _per_layer(params):
        raise ConversionError(f"config.json: per-layer rope parameters "
                              f"({', '.join(params)}) are not supported for this model")
    params = dict(params)
    rope_type = params.pop("rope_type", None)
    legacy_type = params.pop("type", None)
    rope_type = rope_type or legacy_type or "default"
    rope_type = (aliases or {}).get(rope_type, rope_type)
    theta = params.pop("rope_theta", None)
    if theta is None:
        theta = top_theta if top_theta is not None else DEFAULT_THETA
    if isinstance(theta, bool) or not isinstance(theta, (int, float)) or not theta > 0:
        raise ConversionError(f"config.json: invalid rope_theta {theta!r}")
    if rope_type not in types:
        raise ConversionError(f"unsupported rope type {rope_type!r} (supported for this model: "
                              f"{', '.join(types)})")
    prf = params.pop("partial_rotary_factor", None)
    if prf is None:
        prf = config.get("partial_rotary_factor")
    if prf is None:
        prf = 1.0
    if isinstance(prf, bool) or not isinstance(prf, (int, float)) or not 0 < prf <= 1:
        raise ConversionError(f"config.json: invalid partial_rotary_factor {prf!r}")
    if prf != 1 and not partial_rotary:
        raise ConversionError(f"partial_rotary_factor {prf} is not supported for this model "
                              f"(its transformers class rotates whole heads)")
    original = None
    if rope_type in _ORIGINAL_CONTEXT_TYPES:
        original = config.get("original_max_position_embeddings", original_context_default)
        if original is None:
            original = params.get("original_max_position_embeddings")
        params.pop("original_max_position_embeddings", None)
        if original is None:
            original = config.get("max_position_embeddings")
        if isinstance(original, float) and original.is_integer():
            original = int(original)
        if isinstance(original, bool) or not isinstance(original, int) or original <= 0:
            raise ConversionError(f"config.json: rope type {rope_type!r} needs a positive integer "
                                  f"original_max_position_embeddings, got {original!r}")
    return RopeConfig(rope_type=rope_type, theta=theta, params=params,
                      partial_rotary_factor=float(prf), original_context_length=original)


def _field(rope: RopeConfig, name: str, default=None):
    v = rope.params.get(name, default)
    if v is None:
        raise ConversionError(f"rope type {rope.rope_type!r} needs {name!r} in the rope "
                              f"parameters of config.json")
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ConversionError(f"rope parameter {name!r} must be a number, got {v!r}")
    return v


def _factors(rope: RopeConfig, name: str, n: int) -> torch.Tensor:
    v = rope.params.get(name)
    if not (isinstance(v, list) and len(v) == n
            and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in v)):
        raise ConversionError(f"rope type {rope.rope_type!r} needs {name!r}: a list of {n} numbers "
                              f"(rotary dims / 2), got {v!r}")
    return torch.tensor(v, dtype=torch.float32)


def compute_rope(rope: RopeConfig, head_dim: int, max_position_embeddings: int) -> Rope:
    """The rope_dim/2 inverse frequencies (float32) with the rope type's scaling applied;
    rope_dim = int(head_dim * partial_rotary_factor), as transformers' Phi3 computes it."""
    if head_dim <= 0 or head_dim % 2:
        raise ConversionError(f"head_dim must be a positive even number for RoPE, got {head_dim}")
    dim = int(head_dim * rope.partial_rotary_factor)
    if dim <= 0 or dim % 2:
        raise ConversionError(f"the rotated part of a head (head_dim {head_dim} x "
                              f"partial_rotary_factor {rope.partial_rotary_factor} = {dim}) must be "
                              f"a positive even number")
    exponents = torch.arange(0, dim, 2, dtype=torch.int64).to(dtype=torch.float32) / dim
    out = Rope(rope.rope_type, rope.theta, dim, None)

    if rope.rope_type == "longrope":
        # modeling_rope_utils._compute_longrope_parameters: the short factors up to the original
        # context, the long ones past it; the attention factor from the context ratio
        original = rope.original_context_length
        factor = rope.params.get("factor")
        if factor is None:
            factor = max_position_embeddings / original
        attention_factor = rope.params.get("attention_factor")
        if attention_factor is None:
            attention_factor = (1.0 if factor <= 1.0 else
                                math.sqrt(1 + math.log(factor) / math.log(original)))
        scaled = rope.theta ** exponents
        short = 1.0 / (_factors(rope, "short_factor", dim // 2) * scaled)
        long = 1.0 / (_factors(rope, "long_factor", dim // 2) * scaled)
        out.inv_freq = short.to(torch.float32).numpy().copy()
        out.long_inv_freq = long.to(torch.float32).numpy().copy()
        out.attention_factor = float(attention_factor)
        out.original_context_length = original
        return out

    inv_freq = 1.0 / (rope.theta ** exponents)
    if rope.rope_type == "linear":
        factor = _field(rope, "factor")
        inv_freq = inv_freq / factor
    elif rope.rope_type == "llama3":
        factor = _field(rope, "factor")
        low = _field(rope, "low_freq_factor")
        high = _field(rope, "high_freq_factor")
        orig_ctx = rope.original_context_length
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
    out.inv_freq = inv_freq.to(torch.float32).numpy().copy()
    return out
