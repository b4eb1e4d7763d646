"""BERT's WordPiece tokenizer (tokenizer.json with a WordPiece model, BertNormalizer and
BertPreTokenizer: all-MiniLM, bge, e5, cross-encoders) into the `wordpiece` keys of a .flm file
(docs/flm_format.md); libfastllm/text/tokenizer_wordpiece.cpp reads them."""

from __future__ import annotations

from dataclasses import dataclass, field

from .errors import ConversionError

NORMAL, SPECIAL = 1, 3


@dataclass
class WordPieceTokenizerInfo:
    tokens: list
    types: list
    unk_id: int
    bos_id: int  # [CLS], put first by add_bos (BERT's add_special_tokens)
    sep_id: int  # [SEP], put last
    pad_id: int
    lowercase: bool
    strip_accents: bool
    clean_text: bool
    chinese_chars: bool
    subword_prefix: str = "##"
    max_word_chars: int = 100
    eos_id: int = -1
    eos_ids: list = field(default_factory=list)
    add_bos: bool = True
    chat_template: str | None = None
    added_lstrip: list = field(default_factory=list)
    added_rstrip: list = field(default_factory=list)


def is_wordpiece(data: dict) -> bool:
    return (data.get("model") or {}).get("type") == "WordPiece"


def read_wordpiece(data: dict, vocab_size: int, where: str) -> WordPieceTokenizerInfo:
    """The tokenizer of a tokenizer.json whose model is WordPiece; vocab_size is the model's."""
    model = data["model"]
    vocab = model.get("vocab") or {}
    if not vocab:
        raise ConversionError(f"{where}: the WordPiece model has no vocabulary")
    n = max(vocab.values()) + 1
    if n != vocab_size or len(vocab) != n:
        raise ConversionError(f"{where}: the WordPiece vocabulary has {len(vocab)} tokens (ids up to {n - 1}); "
                              f"the model's vocabulary is {vocab_size}")
    tokens = [""] * n
    for text, i in vocab.items():
        tokens[i] = text
    types = [NORMAL] * n

    norm = data.get("normalizer") or {}
    if norm.get("type") != "BertNormalizer":
        raise ConversionError(f"{where}: normalizer {norm.get('type')!r} is not supported with WordPiece "
                              "(BertNormalizer is)")
    pre = data.get("pre_tokenizer") or {}
    if pre.get("type") != "BertPreTokenizer":
        raise ConversionError(f"{where}: pre_tokenizer {pre.get('type')!r} is not supported with WordPiece "
                              "(BertPreTokenizer is)")
    lowercase = bool(norm.get("lowercase", True))
    strip = norm.get("strip_accents")
    strip = lowercase if strip is None else bool(strip)  # BertNormalizer: unset follows lowercase

    lstrip, rstrip = [], []
    for t in data.get("added_tokens") or []:
        i, text = t["id"], t["content"]
        if not 0 <= i < n or tokens[i] != text:
            raise ConversionError(f"{where}: added token {text!r} (id {i}) is not the vocabulary's token {i}")
        if not t.get("special", False) or t.get("normalized", False) or t.get("single_word", False):
            raise ConversionError(f"{where}: added token {text!r} is not special, or normalized, or single_word: "
                                  "only special tokens matched in the raw text are supported with WordPiece")
        types[i] = SPECIAL
        if t.get("lstrip"):
            lstrip.append(i)
        if t.get("rstrip"):
            rstrip.append(i)

    def special(name_or_none, what):
        if name_or_none is None:
            return -1
        if name_or_none not in vocab:
            raise ConversionError(f"{where}: {what} {name_or_none!r} is not in the vocabulary")
        return vocab[name_or_none]

    unk = special(model.get("unk_token"), "unk_token")
    if unk < 0:
        raise ConversionError(f"{where}: the WordPiece model has no unk_token")
    cls, sep = _cls_sep(data.get("post_processor"), vocab, where)
    pad = special(((data.get("padding") or {}).get("pad_token")), "pad_token") if data.get("padding") else \
        vocab.get("[PAD]", -1)
    return WordPieceTokenizerInfo(
        tokens=tokens, types=types, unk_id=unk, bos_id=cls, sep_id=sep, pad_id=pad, lowercase=lowercase,
        strip_accents=strip, clean_text=bool(norm.get("clean_text", True)),
        chinese_chars=bool(norm.get("handle_chinese_chars", True)),
        subword_prefix=model.get("continuing_subword_prefix") or "##",
        max_word_chars=int(model.get("max_input_chars_per_word", 100)), added_lstrip=lstrip, added_rstrip=rstrip)


def _cls_sep(post: dict | None, vocab: dict, where: str) -> tuple[int, int]:
    """The tokens a single sequence gets before and after it: TemplateProcessing "[CLS] $A [SEP]"
    or BertProcessing; none without a post-processor."""
    if not post:
        return -1, -1
    kind = post.get("type")
    if kind == "BertProcessing":
        return post["cls"][1], post["sep"][1]
    if kind == "TemplateProcessing":
        single = post.get("single") or []
        names = [next(iter(p.values()))["id"] if "SpecialToken" in p else None for p in single]
        if names.count(None) != 1 or len(names) > 3 or (len(names) == 3 and names[1] is not None):
            raise ConversionError(f"{where}: post_processor template {names} is not '[CLS] $A [SEP]'-shaped")
        first = names[0] if names[0] is not None else None
        last = names[-1] if names[-1] is not None else None
        ids = {name: spec["ids"] for name, spec in (post.get("special_tokens") or {}).items()}
        pick = lambda name: -1 if name is None else (ids.get(name) or [vocab.get(name, -1)])[0]
        return pick(first), pick(last)
    raise ConversionError(f"{where}: post_processor {kind!r} is not supported with WordPiece")


def add_wordpiece_metadata(writer, tok: WordPieceTokenizerInfo) -> None:
    writer.add_string("tokenizer.model", "wordpiece")
    writer.add_string_array("tokenizer.tokens", tok.tokens)
    writer.add_i64_array("tokenizer.token_types", tok.types)
    writer.add_i64("tokenizer.sep_id", tok.sep_id)
    writer.add_i64("tokenizer.lowercase", int(tok.lowercase))
    writer.add_i64("tokenizer.strip_accents", int(tok.strip_accents))
    writer.add_i64("tokenizer.clean_text", int(tok.clean_text))
    writer.add_i64("tokenizer.chinese_chars", int(tok.chinese_chars))
    writer.add_string("tokenizer.subword_prefix", tok.subword_prefix)
    writer.add_i64("tokenizer.max_word_chars", tok.max_word_chars)
