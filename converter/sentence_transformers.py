"""What a sentence-transformers folder says about embedding: the pooling (modules.json -> its
Pooling module's config.json), stored as `{arch}.pooling`, and the longest input
(sentence_bert_config.json's max_seq_length), which becomes the context length, so that
fastllm_embed pools and truncates as the reference does."""

from __future__ import annotations

import json
from pathlib import Path

from .errors import ConversionError

# Pooling config keys -> the core's pooling names; the modes it has no pooling for are refused.
MODES = {"pooling_mode_mean_tokens": "mean", "pooling_mode_cls_token": "cls", "pooling_mode_lasttoken": "last"}
UNSUPPORTED = ("pooling_mode_max_tokens", "pooling_mode_mean_sqrt_len_tokens", "pooling_mode_weightedmean_tokens")


def read_pooling(folder: Path):
    """"mean", "cls" or "last"; None for a folder without sentence-transformers modules."""
    modules_path = Path(folder) / "modules.json"
    if not modules_path.is_file():
        return None
    try:
        modules = json.loads(modules_path.read_text(encoding="utf-8"))
        kinds = [(m["type"].rsplit(".", 1)[-1], m.get("path", "")) for m in modules]
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise ConversionError(f"{modules_path}: not a sentence-transformers modules list ({e})") from None
    known = ("Transformer", "Pooling", "Normalize")
    other = [k for k, _ in kinds if k not in known]
    if other:
        raise ConversionError(f"{modules_path}: module {other[0]} is not supported (only {', '.join(known)})")
    pooling = [p for k, p in kinds if k == "Pooling"]
    if not pooling:
        return None
    config_path = Path(folder) / pooling[0] / "config.json"
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ConversionError(f"{config_path}: cannot read the pooling config ({e})") from None
    on = [k for k, v in config.items() if k.startswith("pooling_mode_") and v is True]
    for k in on:
        if k in UNSUPPORTED:
            raise ConversionError(f"{config_path}: {k} is not supported (mean, cls or last token)")
    modes = [MODES[k] for k in on if k in MODES]
    if len(modes) != 1:
        raise ConversionError(f"{config_path}: needs exactly one pooling mode, has {on or 'none'}")
    return modes[0]


def read_max_seq_length(folder: Path):
    """sentence_bert_config.json's max_seq_length, or None."""
    path = Path(folder) / "sentence_bert_config.json"
    if not path.is_file():
        return None
    try:
        v = json.loads(path.read_text(encoding="utf-8")).get("max_seq_length")
    except (OSError, ValueError, AttributeError) as e:
        raise ConversionError(f"{path}: cannot read it ({e})") from None
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
        raise ConversionError(f"{path}: max_seq_length must be a positive integer, got {v!r}")
    return v
