"""Builds small random-weight HuggingFace checkpoints of every family for tests.

    path = make_llama(tmp_path, vocab_size=515, num_key_value_heads=2)
    path = make_llama(tmp_path, safe_serialization=False)              # pytorch_model.bin
    path = make_llama(tmp_path, max_shard_size="20KB")                 # sharded safetensors
    path = make_llama(tmp_path, rope_theta=500000.0, rope_scaling={...}, config_style="v5")
    path = make_model(tmp_path, "qwen3", num_key_value_heads=2)        # llama mistral qwen2 qwen3 phi3 gemma* glm glm4
    model = load_model(path)                                           # the HF reference (its class)

The weights are random with a fixed seed (every parameter, norms and biases included, so that a
swapped or misplaced tensor shows), saved in float32. Tokenizers (`tokenizer=`):
  "spm"   the stories260K model's in ../shared (512 SentencePiece pieces): llama, mistral;
  "phi3"  the same pieces plus Phi-3's added tokens (<|endoftext|> <|assistant|> <|system|>
          <|end|> <|user|> at 512..516, special, declared in tokenizer.json and
          tokenizer_config.json as Phi-3 declares them) and its chat template: phi3;
  "bpe"   a byte-level BPE tokenizer.json in Qwen2's layout (Qwen2 split pattern, NFC, 400
          tokens trained with `tokenizers` on TinyStories text, then <|endoftext|> <|im_start|>
          <|im_end|>) and a ChatML template: qwen2, qwen3;
  "glm"   a byte-level BPE tokenizer.json in GLM-4's layout (Llama 3 split pattern, 400 tokens
          trained as "bpe", then GLM-4's added tokens <|endoftext|> [MASK] [gMASK] [sMASK] <sop>
          <eop> <|system|> <|user|> <|assistant|> <|observation|>) and glm-4-9b-chat's
          template: glm; "glm4": the same with ignore_merges: glm4;
  None    none.

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

DEFAULTS = dict(  # vocab_size and the special ids come from the tokenizer (TOKENIZER_CONFIG)
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=None,
    max_position_embeddings=128,
    rms_norm_eps=1e-5,
    tie_word_embeddings=False,
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
    """(theta, rope_type, scaling fields) of a transformers config, for both styles."""
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
    if style == "v4":  # partial_rotary_factor and (Phi-3) original_max_position_embeddings top-level
        prf = fields.pop("partial_rotary_factor", None)
        if prf is not None and prf != 1.0:
            cfg["partial_rotary_factor"] = prf
        if "original_max_position_embeddings" in cfg:
            fields.pop("original_max_position_embeddings", None)
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
    return make_model(tmp_dir, "llama", name=name, seed=seed, safe_serialization=safe_serialization,
                      max_shard_size=max_shard_size, config_style=config_style,
                      tokenizer="spm" if tokenizer else None, **config_overrides)


# family -> (config class, model class, default tokenizer, the family's tiny-model defaults)
FAMILIES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", "spm", {}),
    "mistral": ("MistralConfig", "MistralForCausalLM", "spm", {}),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", "bpe", {}),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", "bpe", dict(head_dim=32)),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", "phi3", {}),
    "gemma": ("GemmaConfig", "GemmaForCausalLM", "spm", dict(head_dim=16)),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", "spm", dict(head_dim=16, query_pre_attn_scalar=16)),
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM", "spm", dict(head_dim=16, query_pre_attn_scalar=16)),
    "glm": ("GlmConfig", "GlmForCausalLM", "glm", dict(head_dim=16)),
    "glm4": ("Glm4Config", "Glm4ForCausalLM", "glm4", dict(head_dim=16)),
}

PHI3_ADDED = ["<|endoftext|>", "<|assistant|>", "<|system|>", "<|end|>", "<|user|>"]
PHI3_TEMPLATE = ("{% for message in messages %}{% if message['role'] == 'system' %}"
                 "{{'<|system|>\n' + message['content'] + '<|end|>\n'}}{% elif message['role'] == 'user' %}"
                 "{{'<|user|>\n' + message['content'] + '<|end|>\n'}}{% elif message['role'] == 'assistant' %}"
                 "{{'<|assistant|>\n' + message['content'] + '<|end|>\n'}}{% endif %}{% endfor %}"
                 "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% else %}{{ eos_token }}{% endif %}")
QWEN_ADDED = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
QWEN_BPE_SIZE = 400  # trained tokens; the added ones follow
CHATML_TEMPLATE = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + "
                   "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
                   "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")

# GLM-4's added tokens, in its order (151329.. in GLM-4; here after GLM_BPE_SIZE trained ones)
GLM_ADDED = ["<|endoftext|>", "[MASK]", "[gMASK]", "[sMASK]", "<sop>", "<eop>", "<|system|>",
             "<|user|>", "<|assistant|>", "<|observation|>"]
GLM_BPE_SIZE = 400
# glm-4-9b-chat's template (THUDM/glm-4-9b-chat(-hf) tokenizer_config.json, as llama.cpp's
# tests/test-chat-template.cpp quotes it)
GLM4_TEMPLATE = ("[gMASK]<sop>{% for item in messages %}{% if item['tools'] is defined %}<|system|>\n"
                 "你是一个名为 ChatGLM 的人工智能助手。你是基于智谱AI训练的语言模型 GLM-4 模型开发的，你的任务是"
                 "针对用户的问题和要求提供适当的答复和支持。\n\n# 可用工具{% set tools = item['tools'] %}"
                 "{% for tool in tools %}{% if tool['type'] == 'function' %}\n\n## {{ tool['function']['name'] }}"
                 "\n\n{{ tool['function'] | tojson(indent=4) }}\n......{% endif %}{% endfor %}{% endif %}"
                 "{% if item['content'] %}<|{{ item['role'] }}|>{{ item['metadata'] }}\n{{ item['content'] }}"
                 "{% endif %}{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}")

# tokenizer -> the config fields it implies
TOKENIZER_CONFIG = {
    "spm": dict(vocab_size=512, bos_token_id=1, eos_token_id=2),
    "phi3": dict(vocab_size=520, bos_token_id=1, eos_token_id=512, pad_token_id=512),
    "bpe": dict(vocab_size=416, bos_token_id=QWEN_BPE_SIZE, eos_token_id=QWEN_BPE_SIZE + 2),
    None: dict(vocab_size=512, bos_token_id=1, eos_token_id=2),
    # GLM-4's eos ids: <|endoftext|>, <|user|>, <|observation|>; no BOS
    "glm": dict(vocab_size=416, bos_token_id=None, pad_token_id=GLM_BPE_SIZE,
                eos_token_id=[GLM_BPE_SIZE, GLM_BPE_SIZE + 7, GLM_BPE_SIZE + 9]),
}
TOKENIZER_CONFIG["glm4"] = TOKENIZER_CONFIG["glm"]


def make_model(tmp_dir, family: str, name: str | None = None, seed: int = 0,
               tokenizer="default", safe_serialization: bool = True, max_shard_size=None,
               config_style: str | None = None, **config_overrides) -> Path:
    """Builds and saves a random model of `family` in tmp_dir/name (default: tiny-FAMILY);
    returns that folder. config_overrides go to the family's transformers config class;
    config_style: as rewrite_config ("v4", "v5"), None leaves save_pretrained's."""
    import transformers

    config_cls, model_cls, default_tok, family_defaults = FAMILIES[family]
    tokenizer = default_tok if tokenizer == "default" else tokenizer
    kwargs = dict(DEFAULTS)
    kwargs.update(TOKENIZER_CONFIG[tokenizer])
    kwargs.update(family_defaults)
    kwargs.update(config_overrides)
    if kwargs["num_key_value_heads"] is None:
        kwargs["num_key_value_heads"] = kwargs["num_attention_heads"]
    config = getattr(transformers, config_cls)(**kwargs)
    torch.manual_seed(seed)
    model = getattr(transformers, model_cls)(config).to(torch.float32).eval()
    _randomize(model, seed)
    if family.startswith("gemma"):  # Gemma's norms scale by 1 + w: the same 1 + 0.1 N(0, 1)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name.endswith("norm.weight"):
                    p.sub_(1.0)

    path = Path(tmp_dir) / (name or f"tiny-{family}")
    path.mkdir(parents=True, exist_ok=True)
    save_kwargs = {}
    if max_shard_size is not None:
        save_kwargs["max_shard_size"] = max_shard_size
    model.save_pretrained(path, **save_kwargs)
    if not safe_serialization:
        _save_bin(model, path, max_shard_size)
    if config_style is not None:
        rewrite_config(path, config_style, config)
    if tokenizer == "spm":
        for f in TOKENIZER_FILES:
            shutil.copy(STORIES_HF / f, path / f)
    elif tokenizer == "phi3":
        write_phi3_tokenizer(path)
    elif tokenizer == "bpe":
        write_qwen_tokenizer(path)
    elif tokenizer in ("glm", "glm4"):
        write_glm_tokenizer(path, ignore_merges=tokenizer == "glm4")
    elif tokenizer is not None:
        raise ValueError(f"unknown tokenizer {tokenizer!r}")
    return path


def _added(i: int, text: str, special: bool = True, rstrip: bool = False) -> dict:
    """An added token as tokenizer.json lists it."""
    return {"id": i, "content": text, "single_word": False, "lstrip": False, "rstrip": rstrip,
            "normalized": False, "special": special}


def _decoder(added: list) -> dict:
    """tokenizer_config.json's added_tokens_decoder for tokenizer.json's added tokens."""
    return {str(a["id"]): {k: v for k, v in a.items() if k != "id"} for a in added}


def write_phi3_tokenizer(path: Path) -> None:
    """stories260K's SentencePiece files plus Phi-3's added tokens, as Phi-3-mini declares them
    (tokenizer.json added_tokens and tokenizer_config.json added_tokens_decoder; the role tokens
    strip the whitespace after them), its eos / pad <|endoftext|>, no BOS added, its template."""
    shutil.copy(STORIES_HF / "tokenizer.model", path / "tokenizer.model")
    data = json.loads((STORIES_HF / "tokenizer.json").read_text(encoding="utf-8"))
    data["added_tokens"] += [_added(512 + k, t, rstrip=t != "<|endoftext|>")
                             for k, t in enumerate(PHI3_ADDED)]
    # no BOS, as add_bos_token says (transformers 5.24 loads phi3 tokenizers from tokenizer.json
    # alone, whose post-processor would otherwise add one)
    data["post_processor"] = None
    (path / "tokenizer.json").write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
    config = {
        "add_bos_token": False, "add_eos_token": False, "added_tokens_decoder": _decoder(data["added_tokens"]),
        "bos_token": "<s>", "chat_template": PHI3_TEMPLATE, "clean_up_tokenization_spaces": False,
        "eos_token": "<|endoftext|>", "legacy": False, "model_max_length": 4096,
        "pad_token": "<|endoftext|>", "padding_side": "left", "sp_model_kwargs": {},
        "tokenizer_class": "LlamaTokenizer", "unk_token": "<unk>", "use_default_system_prompt": False,
    }
    (path / "tokenizer_config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
    (path / "special_tokens_map.json").write_text(json.dumps(
        {"bos_token": "<s>", "eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>",
         "unk_token": "<unk>"}, indent=2), encoding="utf-8")


_BPE_JSON = {}


def _byte_level_bpe(pattern: str, size: int, added: list, nfc: bool) -> dict:
    """A byte-level BPE tokenizer.json: text split by `pattern`, `size` tokens trained with
    `tokenizers` on TinyStories text, then the `added` special tokens (trained once per process)."""
    key = (pattern, size, tuple(added), nfc)
    if key not in _BPE_JSON:
        from tokenizers import (AddedToken, Regex, Tokenizer, decoders, models, normalizers,
                                pre_tokenizers, processors, trainers)
        tok = Tokenizer(models.BPE())
        if nfc:
            tok.normalizer = normalizers.NFC()
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)])
        tok.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
        tok.post_processor = processors.ByteLevel(add_prefix_space=False, trim_offsets=False,
                                                  use_regex=False)
        text = (STORIES_HF.parent / "text" / "tinystories_sample.txt").read_text(encoding="utf-8")
        trainer = trainers.BpeTrainer(vocab_size=size, show_progress=False,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
        tok.train_from_iterator(text.splitlines(), trainer)
        assert tok.get_vocab_size() == size
        tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in added])
        _BPE_JSON[key] = json.loads(tok.to_str())
    return json.loads(json.dumps(_BPE_JSON[key]))


def qwen_tokenizer_json() -> dict:
    """A byte-level BPE tokenizer.json in Qwen2's layout (Qwen2 split pattern, NFC)."""
    from converter.bpe_tokenizer import QWEN2_PATTERN
    return _byte_level_bpe(QWEN2_PATTERN, QWEN_BPE_SIZE, QWEN_ADDED, nfc=True)


def write_qwen_tokenizer(path: Path) -> None:
    """tokenizer.json (qwen_tokenizer_json) and a tokenizer_config.json as Qwen2.5-Instruct's:
    no BOS, eos <|im_end|>, pad <|endoftext|>, the ChatML template."""
    data = qwen_tokenizer_json()
    (path / "tokenizer.json").write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
    config = {
        "add_prefix_space": False, "added_tokens_decoder": _decoder(data["added_tokens"]),
        "bos_token": None, "chat_template": CHATML_TEMPLATE, "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>", "errors": "replace", "model_max_length": 32768,
        "pad_token": "<|endoftext|>", "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer", "unk_token": None,
    }
    (path / "tokenizer_config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")


def glm_tokenizer_json(ignore_merges: bool) -> dict:
    """A byte-level BPE tokenizer.json in GLM-4's layout: the Llama 3 split pattern (which
    llama.cpp's chatglm-bpe / glm4 pre-tokenizers use), no normalizer, GLM_BPE_SIZE tokens
    trained on TinyStories text, then GLM-4's added tokens; ignore_merges as GLM-4-0414's
    (llama.cpp sets it for its glm4 pre-tokenizer, not for glm-4-9b-chat's chatglm-bpe)."""
    from converter.bpe_tokenizer import LLAMA3_PATTERN
    data = _byte_level_bpe(LLAMA3_PATTERN, GLM_BPE_SIZE, GLM_ADDED, nfc=False)
    data["model"]["ignore_merges"] = ignore_merges
    return data


def write_glm_tokenizer(path: Path, ignore_merges: bool = False) -> None:
    """tokenizer.json (glm_tokenizer_json) and a tokenizer_config.json as glm-4-9b-chat-hf's:
    no BOS (the template writes [gMASK]<sop>), eos and pad <|endoftext|>, its chat template."""
    data = glm_tokenizer_json(ignore_merges)
    (path / "tokenizer.json").write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
    config = {
        "added_tokens_decoder": _decoder(data["added_tokens"]), "chat_template": GLM4_TEMPLATE,
        "clean_up_tokenization_spaces": False, "do_lower_case": False, "eos_token": "<|endoftext|>",
        "model_max_length": 128000, "pad_token": "<|endoftext|>", "padding_side": "left",
        "remove_space": False, "tokenizer_class": "PreTrainedTokenizerFast",
    }
    (path / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False),
                                                encoding="utf-8")


def load_model(path):
    """The HF reference: the checkpoint's own class (AutoModelForCausalLM) in float32."""
    from transformers import AutoModelForCausalLM
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32) \
        if transformers_major() >= 5 else AutoModelForCausalLM.from_pretrained(
            path, torch_dtype=torch.float32)
