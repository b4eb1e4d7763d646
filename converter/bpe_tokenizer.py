"""Byte-level BPE tokenizers (GPT-2, Llama 3, Qwen2, SmolLM) -> the `bpe` keys of
docs/flm_format.md.

Two ways in:

  bpe_tokenizer_info(tokens, types, merges, pre, ...)   from plain Python lists (any source:
        the GGUF importer, tests); validates them and pads the vocabulary to the model's size.
  read_tokenizer_json(data, where) / read_vocab_merges(vocab_path, merges_path)
        parse HuggingFace's files into a HfBpe (vocabulary, merges, added tokens, pre-tokenizer),
        which hf_tokenizer.py turns into a BpeTokenizerInfo with the folder's special tokens.

What fastllm's tokenizer implements (libfastllm/text/tokenizer_bpe.cpp), and so what is accepted
from a tokenizer.json:
  model          BPE without dropout, continuing_subword_prefix, end_of_word_suffix or
                 byte_fallback; `ignore_merges` is kept (`tokenizer.ignore_merges`)
  pre_tokenizer  ByteLevel(add_prefix_space=False, use_regex=True)              -> gpt2
                 Sequence[Split(LLAMA3_PATTERN or QWEN2_PATTERN, Isolated),
                          ByteLevel(add_prefix_space=False, use_regex=False)]     -> llama3 / qwen2
                 Sequence[Digits(individual_digits=True),
                          ByteLevel(add_prefix_space=False, use_regex=True)]      -> smollm
  decoder        ByteLevel
  normalizer     none; NFC is accepted with a warning (fastllm does not normalize, so text
                 that is not already NFC may tokenize differently)
  added_tokens   special -> type 3, others -> type 4; lstrip / rstrip -> the id lists
                 tokenizer.added_lstrip / added_rstrip; single_word is not implemented (a
                 warning names the tokens that set it)
"""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from .errors import ConversionError

# token types of the `bpe` keys
NORMAL, SPECIAL, ADDED, UNUSED = 1, 3, 4, 5
TOKEN_TYPES = (NORMAL, SPECIAL, ADDED, UNUSED)
PRE_TOKENIZERS = ("gpt2", "llama3", "qwen2", "smollm")

GPT2_PATTERN = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                  r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
                 r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
SPLIT_PATTERNS = {LLAMA3_PATTERN: "llama3", QWEN2_PATTERN: "qwen2"}


def bytes_to_unicode() -> dict:
    """GPT-2's byte alphabet: byte -> the character that stands for it in tokens."""
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table, extra = {}, 256
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(extra)
            extra += 1
    return table


@dataclass
class BpeTokenizerInfo:
    """The `bpe` keys of docs/flm_format.md; written by hf_tokenizer.add_tokenizer_metadata."""
    tokens: list            # vocab_size strings, in the byte alphabet
    types: list             # vocab_size ints: NORMAL, SPECIAL, ADDED, UNUSED
    merges: list            # "left right" strings in rank order
    pre: str                # one of PRE_TOKENIZERS
    bos_id: int
    eos_id: int
    unk_id: int
    pad_id: int
    eos_ids: list
    add_bos: bool
    chat_template: str | None
    n_padded: int           # ids added to reach vocab_size (type UNUSED, `<extra_N>`)
    ignore_merges: bool = False
    added_lstrip: list = field(default_factory=list)  # added tokens that take the spaces before them
    added_rstrip: list = field(default_factory=list)  # ... and after them


def bpe_tokenizer_info(tokens, types, merges, pre: str, vocab_size: int, *,
                       bos_id: int = -1, eos_id: int = -1, unk_id: int = -1, pad_id: int = -1,
                       eos_ids=(), add_bos: bool = False, ignore_merges: bool = False,
                       chat_template: str | None = None, where: str = "tokenizer"
                       ) -> BpeTokenizerInfo:
    """A checked BpeTokenizerInfo from plain lists; pass it to
    hf_tokenizer.add_tokenizer_metadata(writer, info).

    tokens      token strings by id, in GPT-2's byte alphabet ("Ġ" for a space byte); entries
                may be None for ids that have no token (they become padding)
    types       one per token: 1 normal, 3 special (control) added token, 4 non-special added
                token, 5 unused
    merges      "left right" strings (or (left, right) pairs) in rank order; each side and their
                concatenation must be tokens
    pre         "gpt2", "llama3", "qwen2" or "smollm" (see docs/flm_format.md)
    vocab_size  the model's embedding rows: the list is padded with `<extra_N>` tokens (type 5)
                up to it; more tokens than that is an error
    bos_id, eos_id, unk_id, pad_id   -1 when absent
    eos_ids     every id that ends generation (eos_id is added when it is not in it)
    add_bos     prompts start with bos_id by default
    ignore_merges   a pre-token that is itself a token is not merged (tokenizers' BPE option;
                Llama 3 sets it, and llama.cpp applies it for its "llama-bpe" pre-tokenizer)
    chat_template   Jinja text or None
    where       names the source in error messages

    Raises ConversionError naming the first problem found.
    """
    tokens = list(tokens)
    types = [int(t) for t in types]
    if len(types) != len(tokens):
        raise ConversionError(f"{where}: {len(tokens)} tokens but {len(types)} token types")
    if len(tokens) > vocab_size:
        raise ConversionError(f"{where}: {len(tokens)} tokens, more than the model's vocab_size "
                              f"{vocab_size}")
    if pre not in PRE_TOKENIZERS:
        raise ConversionError(f"{where}: unknown pre-tokenizer {pre!r} (supported: "
                              f"{', '.join(PRE_TOKENIZERS)})")
    for i, (tok, t) in enumerate(zip(tokens, types)):
        if tok is None:
            continue
        if not isinstance(tok, str):
            raise ConversionError(f"{where}: token {i} is not a string: {tok!r}")
        if t not in TOKEN_TYPES:
            raise ConversionError(f"{where}: token {i} ({tok!r}) has type {t} (a bpe vocabulary "
                                  f"has types 1 normal, 3 special, 4 added, 5 unused)")
        if t in (SPECIAL, ADDED) and tok == "":
            raise ConversionError(f"{where}: added token {i} is empty")

    # Padding: ids without a token, then up to vocab_size.
    existing = {t for t in tokens if t is not None}
    k = 0

    def pad_name():
        nonlocal k
        while f"<extra_{k}>" in existing:
            k += 1
        k += 1
        return f"<extra_{k - 1}>"
    n_padded = 0
    for i, tok in enumerate(tokens):
        if tok is None:
            tokens[i], types[i] = pad_name(), UNUSED
            n_padded += 1
    while len(tokens) < vocab_size:
        tokens.append(pad_name())
        types.append(UNUSED)
        n_padded += 1

    ids = {}
    for i, (tok, t) in enumerate(zip(tokens, types)):
        if t != UNUSED:
            ids.setdefault(tok, i)
    out_merges = []
    for rank, m in enumerate(merges):
        if isinstance(m, str):
            parts = m.split(" ")
        else:
            parts = list(m)
        if len(parts) != 2 or not all(isinstance(p, str) and p and " " not in p for p in parts):
            raise ConversionError(f"{where}: merge {rank} {m!r} is not two tokens (without "
                                  f"spaces) separated by one space")
        for piece in (parts[0], parts[1], parts[0] + parts[1]):
            if piece not in ids:
                raise ConversionError(f"{where}: merge {rank} {m!r} names {piece!r}, which is "
                                      f"not a token")
        out_merges.append(f"{parts[0]} {parts[1]}")

    def check_id(name, v):
        if isinstance(v, bool) or not isinstance(v, int) or not -1 <= v < vocab_size:
            raise ConversionError(f"{where}: {name} {v!r} is outside the vocabulary "
                                  f"(vocab_size {vocab_size})")
        return v
    bos_id, eos_id = check_id("bos id", bos_id), check_id("eos id", eos_id)
    unk_id, pad_id = check_id("unk id", unk_id), check_id("pad id", pad_id)
    eos_list = []
    for v in list(eos_ids) + ([eos_id] if eos_id >= 0 else []):
        if check_id("eos id", v) >= 0 and v not in eos_list:
            eos_list.append(v)
    return BpeTokenizerInfo(tokens=tokens, types=types, merges=out_merges, pre=pre,
                            bos_id=bos_id, eos_id=eos_id, unk_id=unk_id, pad_id=pad_id,
                            eos_ids=eos_list, add_bos=bool(add_bos), chat_template=chat_template,
                            n_padded=n_padded, ignore_merges=bool(ignore_merges))


def add_bpe_metadata(writer, tok: BpeTokenizerInfo) -> None:
    """Writes the keys only `bpe` has (hf_tokenizer.add_tokenizer_metadata calls this for bpe infos
    and writes the keys every tokenizer shares)."""
    writer.add_string("tokenizer.model", "bpe")
    writer.add_string_array("tokenizer.tokens", tok.tokens)
    writer.add_i64_array("tokenizer.token_types", tok.types)
    writer.add_string_array("tokenizer.merges", tok.merges)
    writer.add_string("tokenizer.pre", tok.pre)
    if getattr(tok, "ignore_merges", False):
        writer.add_i64("tokenizer.ignore_merges", 1)


# ---- HuggingFace files ------------------------------------------------------------------------

@dataclass
class HfBpe:
    """What a tokenizer.json (or vocab.json + merges.txt) says."""
    vocab: dict                       # token -> id (the BPE model's vocabulary)
    merges: list                      # "left right"
    pre: str
    ignore_merges: bool = False
    added: dict = field(default_factory=dict)   # id -> (content, special)
    lstrip: set = field(default_factory=set)    # ids of added tokens with lstrip / rstrip
    rstrip: set = field(default_factory=set)
    template_bos: str | None = None   # token the post-processor puts first, if any

    def tokens_and_types(self) -> tuple[list, list]:
        """Tokens by id (None where an id has no token) and their types."""
        n = max([*self.vocab.values(), *self.added, -1]) + 1
        tokens, types = [None] * n, [UNUSED] * n
        for tok, i in self.vocab.items():
            tokens[i], types[i] = tok, NORMAL
        for i, (content, special) in self.added.items():
            tokens[i], types[i] = content, SPECIAL if special else ADDED
        return tokens, types

    def token_id(self, text: str):
        for i, (content, _) in self.added.items():
            if content == text:
                return i
        return self.vocab.get(text)


def _describe(obj) -> str:
    s = json.dumps(obj, ensure_ascii=False)
    return s if len(s) <= 300 else s[:300] + "..."


def _byte_level(p: dict, use_regex: bool, where: str) -> bool:
    """Whether p is ByteLevel with the given use_regex; add_prefix_space must be off."""
    if not isinstance(p, dict) or p.get("type") != "ByteLevel":
        return False
    if p.get("use_regex", True) != use_regex:
        return False
    if p.get("add_prefix_space", False):
        raise ConversionError(f"{where}: ByteLevel pre-tokenizer with add_prefix_space=true is "
                              f"not supported")
    return True


def detect_pre(pre_tokenizer, where: str) -> str:
    """tokenizer.json's pre_tokenizer -> gpt2 / llama3 / qwen2 / smollm."""
    p = pre_tokenizer
    if _byte_level(p, True, where):
        return "gpt2"
    if isinstance(p, dict) and p.get("type") == "Sequence":
        seq = p.get("pretokenizers") or []
        if len(seq) == 2 and _byte_level(seq[1], False, where):
            split = seq[0]
            if (isinstance(split, dict) and split.get("type") == "Split"
                    and isinstance(split.get("pattern"), dict)
                    and split.get("behavior") == "Isolated" and not split.get("invert", False)):
                pattern = split["pattern"].get("Regex")
                if pattern in SPLIT_PATTERNS:
                    return SPLIT_PATTERNS[pattern]
                raise ConversionError(f"{where}: unsupported Split pattern {pattern!r} (supported: "
                                      f"the Llama 3 and Qwen2 patterns)")
        if (len(seq) == 2 and isinstance(seq[0], dict) and seq[0].get("type") == "Digits"
                and seq[0].get("individual_digits") is True and _byte_level(seq[1], True, where)):
            return "smollm"
    raise ConversionError(f"{where}: unsupported pre_tokenizer {_describe(p)} (supported: "
                          f"ByteLevel (gpt2); Split with the Llama 3 or Qwen2 pattern + ByteLevel; "
                          f"Digits(individual_digits) + ByteLevel (smollm))")


def _merges(raw, where: str) -> list:
    if not isinstance(raw, list):
        raise ConversionError(f"{where}: model.merges is not a list")
    out = []
    for rank, m in enumerate(raw):
        parts = m.split(" ") if isinstance(m, str) else m
        if (not isinstance(parts, list) or len(parts) != 2
                or not all(isinstance(x, str) and x and " " not in x for x in parts)):
            raise ConversionError(f"{where}: merge {rank} {m!r} is not two tokens without spaces")
        out.append(f"{parts[0]} {parts[1]}")
    return out


def _template_bos(post):
    """The token a TemplateProcessing post-processor puts before a single sequence, if any."""
    if not isinstance(post, dict):
        return None
    if post.get("type") == "Sequence":
        for p in post.get("processors") or []:
            t = _template_bos(p)
            if t is not None:
                return t
        return None
    if post.get("type") != "TemplateProcessing":
        return None
    single = post.get("single") or []
    if single and isinstance(single[0], dict) and "SpecialToken" in single[0]:
        return single[0]["SpecialToken"].get("id")
    return None


def read_tokenizer_json(data: dict, where: str = "tokenizer.json") -> HfBpe:
    """Parses a byte-level BPE tokenizer.json (already loaded with json.load)."""
    if not isinstance(data, dict):
        raise ConversionError(f"{where}: not a JSON object")
    model = data.get("model")
    if not isinstance(model, dict):
        raise ConversionError(f"{where}: no model")
    mtype = model.get("type", "BPE" if "merges" in model else None)
    if mtype != "BPE":
        raise ConversionError(f"{where}: model type {mtype!r} is not supported (only BPE; a "
                              f"SentencePiece model needs its tokenizer.model)")
    if model.get("dropout") not in (None, 0, 0.0):
        raise ConversionError(f"{where}: BPE dropout {model['dropout']} is not supported")
    for key in ("continuing_subword_prefix", "end_of_word_suffix"):
        if model.get(key):
            raise ConversionError(f"{where}: BPE {key} {model[key]!r} is not supported")
    if model.get("byte_fallback"):
        raise ConversionError(f"{where}: BPE byte_fallback is not supported with a byte-level "
                              f"tokenizer")
    vocab = model.get("vocab")
    if not isinstance(vocab, dict) or not vocab:
        raise ConversionError(f"{where}: model.vocab is not a non-empty object")
    seen = {}
    for tok, i in vocab.items():
        if isinstance(i, bool) or not isinstance(i, int) or i < 0:
            raise ConversionError(f"{where}: token {tok!r} has id {i!r}")
        if i in seen:
            raise ConversionError(f"{where}: tokens {seen[i]!r} and {tok!r} share id {i}")
        seen[i] = tok
    merges = _merges(model.get("merges", []), where)

    pre = detect_pre(data.get("pre_tokenizer"), where)
    decoder = data.get("decoder")
    if not (isinstance(decoder, dict) and decoder.get("type") == "ByteLevel"):
        raise ConversionError(f"{where}: unsupported decoder {_describe(decoder)} (a byte-level "
                              f"BPE tokenizer needs the ByteLevel decoder)")
    normalizer = data.get("normalizer")
    if normalizer is not None:
        if isinstance(normalizer, dict) and normalizer.get("type") == "NFC":
            warnings.warn(f"{where}: the NFC normalizer is not applied by fastllm; text that is "
                          f"not already in NFC may tokenize differently", stacklevel=2)
        else:
            raise ConversionError(f"{where}: unsupported normalizer {_describe(normalizer)}")

    added, lstrip, rstrip = {}, set(), set()
    flagged = []
    for a in data.get("added_tokens") or []:
        if not isinstance(a, dict) or not isinstance(a.get("content"), str) \
                or isinstance(a.get("id"), bool) or not isinstance(a.get("id"), int) \
                or a["id"] < 0:
            raise ConversionError(f"{where}: bad added token {_describe(a)}")
        if a["content"] == "":
            raise ConversionError(f"{where}: added token {a['id']} is empty")
        if a["id"] in seen and seen[a["id"]] != a["content"]:
            raise ConversionError(f"{where}: added token {a['content']!r} has id {a['id']}, which "
                                  f"is the vocabulary's {seen[a['id']]!r}")
        added[a["id"]] = (a["content"], bool(a.get("special", False)))
        for flag, ids in (("lstrip", lstrip), ("rstrip", rstrip)):
            if a.get(flag):
                ids.add(a["id"])
        if a.get("single_word"):
            flagged.append(a["content"])
    if flagged:
        warnings.warn(f"{where}: the single_word flag of added tokens is not implemented (set on "
                      f"{', '.join(map(repr, flagged[:5]))}"
                      f"{' ...' if len(flagged) > 5 else ''})", stacklevel=2)
    hf = HfBpe(vocab=vocab, merges=merges, pre=pre, ignore_merges=bool(model.get("ignore_merges")),
               added=added, lstrip=lstrip, rstrip=rstrip)
    hf.template_bos = _template_bos(data.get("post_processor"))
    return hf


def read_vocab_merges(vocab_path: Path, merges_path: Path) -> HfBpe:
    """vocab.json + merges.txt (GPT-2's original files): the gpt2 pre-tokenizer, no added
    tokens (the caller marks the special ones)."""
    try:
        vocab = json.loads(Path(vocab_path).read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ConversionError(f"{vocab_path}: invalid JSON: {e}") from None
    data = {"model": {"type": "BPE", "vocab": vocab, "merges": []},
            "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "use_regex": True},
            "decoder": {"type": "ByteLevel"}}
    hf = read_tokenizer_json(data, str(vocab_path))
    lines = Path(merges_path).read_text(encoding="utf-8").split("\n")
    if lines and lines[0].startswith("#version"):
        lines = lines[1:]
    hf.merges = _merges([l for l in lines if l], str(merges_path))
    return hf
