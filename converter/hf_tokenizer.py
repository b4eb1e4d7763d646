"""The tokenizer of a HuggingFace folder -> `tokenizer.*` metadata (docs/flm_format.md).

Reads tokenizer.model (SentencePiece, see spm_tokenizer.py) plus the HF side files:
  tokenizer_config.json    add_bos_token, chat_template (a string, or a list of named templates)
  chat_template.jinja      the chat template, where newer transformers versions keep it
  config.json / generation_config.json   eos_token_id (an int or a list)
"""

from __future__ import annotations

from dataclasses import dataclass

from checkpoint import Checkpoint
from errors import ConversionError
from spm_tokenizer import UNUSED, load_spm

TOKENIZER_MODEL = "tokenizer.model"


@dataclass
class TokenizerInfo:
    tokens: list
    scores: list
    types: list
    bos_id: int
    eos_id: int
    unk_id: int
    pad_id: int
    eos_ids: list
    add_bos: bool
    add_dummy_prefix: bool
    remove_extra_whitespaces: bool
    byte_fallback: bool
    chat_template: str | None
    n_padded: int  # pieces added to reach vocab_size


def _ids(value, where: str) -> list:
    if value is None:
        return []
    values = value if isinstance(value, list) else [value]
    for v in values:
        if isinstance(v, bool) or not isinstance(v, int):
            raise ConversionError(f"{where}: eos_token_id must be an int or a list of ints, "
                                  f"got {value!r}")
    return values


def _chat_template(ckpt: Checkpoint):
    tc = ckpt.tokenizer_config or {}
    t = tc.get("chat_template")
    if isinstance(t, list):
        named = {e.get("name"): e.get("template") for e in t if isinstance(e, dict)}
        t = named.get("default")
    if isinstance(t, str):
        return t
    if t is not None:
        raise ConversionError(f"tokenizer_config.json: chat_template must be a string or a list "
                              f"of named templates")
    jinja = ckpt.file("chat_template.jinja")
    if jinja.is_file():
        return jinja.read_text(encoding="utf-8")
    return None


def read_tokenizer(ckpt: Checkpoint, vocab_size: int, add_bos_default: bool) -> TokenizerInfo:
    path = ckpt.file(TOKENIZER_MODEL)
    if not path.is_file():
        raise ConversionError(f"missing {TOKENIZER_MODEL}: {path} does not exist (only "
                              f"SentencePiece tokenizers are supported)")
    spm = load_spm(path)
    n = len(spm)
    if n > vocab_size:
        raise ConversionError(f"{TOKENIZER_MODEL} has {n} pieces, more than the model's "
                              f"vocab_size {vocab_size}")
    tokens, scores, types = list(spm.pieces), list(spm.scores), list(spm.types)
    existing = set(tokens)
    k = 0
    while len(tokens) < vocab_size:
        piece = f"<extra_{k}>"
        k += 1
        if piece in existing:
            continue
        tokens.append(piece)
        scores.append(0.0)
        types.append(UNUSED)

    eos_ids = []
    sources = [(ckpt.config.get("eos_token_id"), "config.json")]
    if ckpt.generation_config:
        sources.append((ckpt.generation_config.get("eos_token_id"), "generation_config.json"))
    sources.append((spm.eos_id if spm.eos_id >= 0 else None, TOKENIZER_MODEL))
    for value, where in sources:
        for i in _ids(value, where):
            if i < 0:
                continue
            if i >= vocab_size:
                raise ConversionError(f"{where}: eos_token_id {i} is outside the vocabulary "
                                      f"(vocab_size {vocab_size})")
            if i not in eos_ids:
                eos_ids.append(i)

    tc = ckpt.tokenizer_config or {}
    add_bos = tc.get("add_bos_token", add_bos_default)
    if add_bos is None:
        add_bos = add_bos_default

    return TokenizerInfo(
        tokens=tokens, scores=scores, types=types,
        bos_id=spm.bos_id, eos_id=spm.eos_id, unk_id=spm.unk_id, pad_id=spm.pad_id,
        eos_ids=eos_ids, add_bos=bool(add_bos),
        add_dummy_prefix=spm.add_dummy_prefix,
        remove_extra_whitespaces=spm.remove_extra_whitespaces,
        byte_fallback=spm.byte_fallback,
        chat_template=_chat_template(ckpt),
        n_padded=vocab_size - n,
    )


def add_tokenizer_metadata(writer, tok: TokenizerInfo) -> None:
    writer.add_string("tokenizer.model", "spm")
    writer.add_string_array("tokenizer.tokens", tok.tokens)
    writer.add_f32_array("tokenizer.scores", tok.scores)
    writer.add_i64_array("tokenizer.token_types", tok.types)
    writer.add_i64("tokenizer.bos_id", tok.bos_id)
    writer.add_i64("tokenizer.eos_id", tok.eos_id)
    writer.add_i64("tokenizer.unk_id", tok.unk_id)
    writer.add_i64("tokenizer.pad_id", tok.pad_id)
    writer.add_i64_array("tokenizer.eos_ids", tok.eos_ids)
    writer.add_i64("tokenizer.add_bos", int(tok.add_bos))
    writer.add_i64("tokenizer.add_dummy_prefix", int(tok.add_dummy_prefix))
    writer.add_i64("tokenizer.remove_extra_whitespaces", int(tok.remove_extra_whitespaces))
    writer.add_i64("tokenizer.byte_fallback", int(tok.byte_fallback))
    if tok.chat_template is not None:
        writer.add_string("tokenizer.chat_template", tok.chat_template)
