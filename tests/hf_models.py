"""Builds small random-weight HuggingFace LLaMA checkpoints for tests.

    path = make_llama(tmp_path, vocab_size=515, num_key_value_heads=2)
    path = make_llama(tmp_path, safe_serialization=False)              # pytorch_model.bin
    path = make_llama(tmp_path, max_shard_size="20KB")                 # sharded safetensors
    path = make_llama(tmp_path, rope_theta=500000.0, rope_scaling={...}, config_style="v5")
    model = load_model(path)                                           # the HF reference

The weights are random with a fixed seed (every parameter, norms and biases included, so that a
swapped or misplaced tensor shows), saved in float32. The tokenizer files come from the
stories260K model in ../shared (512 SentencePiece pieces).

config.json is rewritten in one of two styles, whatever transformers version wrote it:
  "v4": rope_theta + rope_scaling (transformers 4.x),
  "v5": rope_parameters only (transformers 5.x);
None leaves it as save_pretrained wrote it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("FASTLLM_SHARED", REPO.parent / "shared"))  # data beside the checkout
STORIES_HF = SHARED / "models" / "stories260K" / "hf"
TOKENIZER_FILES = ("tokenizer.model", "tokenizer_config.json", "special_tokens_map.json")

DEFAULTS = dict(
    vocab_size=512,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=None,
    max_position_embeddings=128,
    rms_norm_eps=1e-5,
    tie_word_embeddings=False,
    bos_token_id=1,
    eos_token_id=2,
)


def transformers_major() -> int:
    import transformers
    return int(transformers.__version__.split(".")[0])


def _parse_size(size) -> int:
    if isinstance(size, int):
        return size
    m = re.fullmatch(r"\s*(\d+)\s*([KMG]?)I?B?\s*", str(size).upper())
    if not m:
        raise ValueError(f"bad size {size!r}")
    return int(m.group(1)) * {"": 1, "K": 1000, "M": 1000 ** 2, "G": 1000 ** 3}[m.group(2)]


def rope_of(config) -> tuple:
    """(theta, rope_type, scaling fields) of a LlamaConfig, for both transformers styles."""
    params = getattr(config, "rope_parameters", None)
    if isinstance(params, dict) and params:
        fields = {k: v for k, v in params.items() if k not in ("rope_theta", "rope_type", "type")}
        rope_type = params.get("rope_type", params.get("type", "default"))
        return params.get("rope_theta", getattr(config, "rope_theta", 10000.0)), rope_type, fields
    scaling = getattr(config, "rope_scaling", None) or {}
    fields = {k: v for k, v in scaling.items() if k not in ("rope_type", "type")}
    rope_type = scaling.get("rope_type", scaling.get("type", "default"))
    return getattr(config, "rope_theta", 10000.0), rope_type, fields


def rewrite_config(path: Path, style: str, config) -> None:
    """Rewrites path/config.json's RoPE fields in `style` ("v4" or "v5")."""
    cfg_path = Path(path) / "config.json"
    cfg = json.loads(cfg_path.read_text())
    theta, rope_type, fields = rope_of(config)
    for k in ("rope_theta", "rope_scaling", "rope_parameters"):
        cfg.pop(k, None)
    if style == "v4":
        cfg["rope_theta"] = theta
        cfg["rope_scaling"] = None if rope_type == "default" else {"rope_type": rope_type, **fields}
    elif style == "v5":
        cfg["rope_parameters"] = {"rope_theta": theta, "rope_type": rope_type, **fields}
    else:
        raise ValueError(f"unknown config style {style!r}")
    cfg_path.write_text(json.dumps(cfg, indent=2))


def edit_config(path, **changes) -> None:
    """Sets keys of path/config.json (a value of None is written as null)."""
    cfg_path = Path(path) / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg.update(changes)
    cfg_path.write_text(json.dumps(cfg, indent=2))


def _randomize(model, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(0.02 * torch.randn(p.shape, generator=g))


def _save_bin(model, path: Path, max_shard_size) -> None:
    """pytorch_model.bin (or shards + pytorch_model.bin.index.json), as transformers 4.x wrote
    them; transformers 5.x no longer writes .bin files at all."""
    sd = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}
    if model.config.tie_word_embeddings:
        sd.pop("lm_head.weight", None)
    for f in path.glob("model*.safetensors*"):
        f.unlink()
    if max_shard_size is None:
        torch.save(sd, path / "pytorch_model.bin")
        return
    limit = _parse_size(max_shard_size)
    shards, cur, cur_size = [], {}, 0
    for k, v in sd.items():
        n = v.numel() * v.element_size()
        if cur and cur_size + n > limit:
            shards.append(cur)
            cur, cur_size = {}, 0
        cur[k] = v
        cur_size += n
    shards.append(cur)
    weight_map = {}
    for i, shard in enumerate(shards):
        fname = f"pytorch_model-{i + 1:05d}-of-{len(shards):05d}.bin"
        torch.save(shard, path / fname)
        weight_map.update({k: fname for k in shard})
    index = {"metadata": {"total_size": sum(v.numel() * v.element_size() for v in sd.values())},
             "weight_map": weight_map}
    (path / "pytorch_model.bin.index.json").write_text(json.dumps(index, indent=2))


def make_llama(tmp_dir, name: str = "tiny-llama", seed: int = 0,
               safe_serialization: bool = True, max_shard_size=None,
               config_style: str | None = "v4", tokenizer: bool = True,
               **config_overrides) -> Path:
    """Builds and saves a random LlamaForCausalLM in tmp_dir/name; returns that folder.
    config_overrides go to transformers.LlamaConfig (rope_theta / rope_scaling are accepted by
    both 4.x and 5.x)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    kwargs = dict(DEFAULTS)
    kwargs.update(config_overrides)
    if kwargs["num_key_value_heads"] is None:
        kwargs["num_key_value_heads"] = kwargs["num_attention_heads"]
    config = LlamaConfig(**kwargs)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).to(torch.float32).eval()
    _randomize(model, seed)

    path = Path(tmp_dir) / name
    path.mkdir(parents=True, exist_ok=True)
    save_kwargs = {}
    if max_shard_size is not None:
        save_kwargs["max_shard_size"] = max_shard_size
    model.save_pretrained(path, **save_kwargs)
    if not safe_serialization:
        _save_bin(model, path, max_shard_size)
    if config_style is not None:
        rewrite_config(path, config_style, config)
    if tokenizer:
        for f in TOKENIZER_FILES:
            shutil.copy(STORIES_HF / f, path / f)
    return path


def load_model(path):
    """The HF reference: LlamaForCausalLM.from_pretrained(path) in float32."""
    from transformers import LlamaForCausalLM
    return LlamaForCausalLM.from_pretrained(path, dtype=torch.float32) \
        if transformers_major() >= 5 else LlamaForCausalLM.from_pretrained(
            path, torch_dtype=torch.float32)
