"""The tokenizer of a HuggingFace folder -> `tokenizer.*` metadata (docs/flm_format.md).

The tokenizer files, in order of preference:
  tokenizer.model          SentencePiece (see spm_tokenizer.py)            -> `spm` keys
  tokenizer.json           byte-level BPE (see bpe_tokenizer.py)           -> `bpe` keys
  vocab.json + merges.txt  GPT-2's byte-level BPE files                    -> `bpe` keys
plus the HF side files:
  tokenizer_config.json    add_bos_token, chat_template (a string, or a list of named templates),
                           bos_token / eos_token / unk_token / pad_token, added_tokens_decoder
  special_tokens_map.json  bos_token / eos_token / unk_token / pad_token (when the config has none)
  added_tokens.json        added tokens of older SentencePiece folders (text -> id)
  chat_template.jinja      the chat template, where newer transformers versions keep it
  config.json / generation_config.json   eos_token_id (an int or a list), bos_token_id

For BPE, add_bos is tokenizer_config's add_bos_token when it says, else whether tokenizer.json's
post-processor starts a sequence with a special token (Llama 3 does; GPT-2 and SmolLM do not).

SentencePiece folders may add tokens beyond (or over) the model's pieces, as Phi-3 does
(`<|user|>`, `<|end|>`, ... at 32000+): from tokenizer.json's added_tokens, tokenizer_config's
added_tokens_decoder and added_tokens.json (tokenizer.json wins, as for llama.cpp's converter),
each is stored at its id as a control token (type 3) when special, else user-defined (type 4),
so that the tokenizer can match them in text as transformers does. Their lstrip / rstrip flags
become the id lists tokenizer.added_lstrip / added_rstrip (BPE folders too), and how transformers
gives the text after an added token its dummy prefix becomes tokenizer.prefix_after_added:
  the folder's tokenizer.json as is (transformers does so for model types whose hub tokenizer
  class it distrusts: phi3)    a Prepend("▁") normalizer -> always; a Metaspace pre-tokenizer
                               with prepend_scheme always -> unless_space, first / never -> never
  otherwise LlamaTokenizer     legacy=true -> unless_space, legacy=false (its default) -> never;
                               add_prefix_space=false -> never
"""

from __future__ import annotations

from dataclasses import dataclass, field

from . import bpe_tokenizer, wordpiece_tokenizer
from .bpe_tokenizer import BpeTokenizerInfo, bpe_tokenizer_info
from .checkpoint import Checkpoint, read_json
from .errors import ConversionError
from .spm_tokenizer import CONTROL, UNUSED, USER_DEFINED, load_spm

TOKENIZER_MODEL = "tokenizer.model"
TOKENIZER_JSON = "tokenizer.json"
VOCAB_JSON = "vocab.json"
MERGES_TXT = "merges.txt"


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
    added_lstrip: list = field(default_factory=list)  # ids of added tokens that eat the spaces before
    added_rstrip: list = field(default_factory=list)  # ... and after them
    prefix_after_added: str = "never"                 # never / always / unless_space


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


def _eos_ids(ckpt: Checkpoint, vocab_size: int, tokenizer_eos) -> list:
    """Every id that ends generation: config.json's, generation_config.json's, the tokenizer's."""
    eos_ids = []
    sources = [(ckpt.config.get("eos_token_id"), "config.json")]
    if ckpt.generation_config:
        sources.append((ckpt.generation_config.get("eos_token_id"), "generation_config.json"))
    sources.append(tokenizer_eos)
    for value, where in sources:
        for i in _ids(value, where):
            if i < 0:
                continue
            if i >= vocab_size:
                raise ConversionError(f"{where}: eos_token_id {i} is outside the vocabulary "
                                      f"(vocab_size {vocab_size})")
            if i not in eos_ids:
                eos_ids.append(i)
    return eos_ids


def read_tokenizer(ckpt: Checkpoint, vocab_size: int, add_bos_default: bool, spm_code_tokens=None):
    """TokenizerInfo (SentencePiece) or BpeTokenizerInfo (byte-level BPE) of the folder.
    add_bos_default applies to SentencePiece only (BPE says it in its own files).
    spm_code_tokens(ckpt, n_pieces): the tokens a family's remote tokenizer code (not its files)
    adds after the SentencePiece pieces, {id: text}, stored as control tokens; text between
    them gets the dummy prefix (prefix_after_added "always"), as that code encodes each piece
    of text on its own (ChatGLM3's SPTokenizer)."""
    if ckpt.file(TOKENIZER_MODEL).is_file():
        return _read_spm(ckpt, vocab_size, add_bos_default, spm_code_tokens)
    if ckpt.file(TOKENIZER_JSON).is_file():
        data = read_json(ckpt.file(TOKENIZER_JSON), required=True)
        if wordpiece_tokenizer.is_wordpiece(data):
            tok = wordpiece_tokenizer.read_wordpiece(data, vocab_size, TOKENIZER_JSON)
            tok.chat_template = _chat_template(ckpt)
            return tok
        return _read_bpe(ckpt, vocab_size, bpe_tokenizer.read_tokenizer_json(data, TOKENIZER_JSON),
                         TOKENIZER_JSON)
    if ckpt.file(VOCAB_JSON).is_file() and ckpt.file(MERGES_TXT).is_file():
        hf = bpe_tokenizer.read_vocab_merges(ckpt.file(VOCAB_JSON), ckpt.file(MERGES_TXT))
        return _read_bpe(ckpt, vocab_size, hf, f"{VOCAB_JSON} + {MERGES_TXT}")
    raise ConversionError(f"no tokenizer in {ckpt.path}: it needs {TOKENIZER_MODEL} "
                          f"(SentencePiece), {TOKENIZER_JSON} (byte-level BPE) or {VOCAB_JSON} + "
                          f"{MERGES_TXT}")


def _special_token_texts(ckpt: Checkpoint) -> dict:
    """bos / eos / unk / pad -> token text, from tokenizer_config.json, else
    special_tokens_map.json."""
    out = {}
    stm = read_json(ckpt.file("special_tokens_map.json"), required=False) or {}
    for source in (stm, ckpt.tokenizer_config or {}):
        for name in ("bos", "eos", "unk", "pad"):
            v = source.get(f"{name}_token")
            if isinstance(v, dict):
                v = v.get("content")
            if isinstance(v, str):
                out[name] = v
    return out


def _read_bpe(ckpt: Checkpoint, vocab_size: int, hf, where: str) -> BpeTokenizerInfo:
    tc = ckpt.tokenizer_config or {}
    if not hf.added:
        # vocab.json + merges.txt: the added tokens are in tokenizer_config.json, or, for GPT-2's
        # own files, the special tokens (tokenizer config and config.json) are the added ones.
        decoder = tc.get("added_tokens_decoder")
        if isinstance(decoder, dict) and decoder:
            for k, v in decoder.items():
                if not (str(k).isdigit() and isinstance(v, dict) and isinstance(v.get("content"), str)):
                    raise ConversionError(f"tokenizer_config.json: bad added_tokens_decoder entry "
                                          f"{k!r}: {v!r}")
                hf.added[int(k)] = (v["content"], bool(v.get("special", False)))
        else:
            for text in _special_token_texts(ckpt).values():
                if text in hf.vocab:
                    hf.added[hf.vocab[text]] = (text, True)
            for key in ("bos_token_id", "eos_token_id"):
                for i in _ids(ckpt.config.get(key), "config.json"):
                    if i in hf.vocab.values():
                        text = next(t for t, j in hf.vocab.items() if j == i)
                        hf.added[i] = (text, True)
    tokens, types = hf.tokens_and_types()

    ids = {}
    for name, text in _special_token_texts(ckpt).items():
        i = hf.token_id(text)
        if i is None:
            raise ConversionError(f"{where}: the {name} token {text!r} is not in the vocabulary")
        ids[name] = i
    for name in ("bos", "eos"):
        if name not in ids:
            found = _ids(ckpt.config.get(f"{name}_token_id"), "config.json")
            if found:
                ids[name] = found[0]
    add_bos = tc.get("add_bos_token")
    if not isinstance(add_bos, bool):
        add_bos = hf.template_bos is not None
    if hf.template_bos is not None and "bos" not in ids:
        ids["bos"] = hf.token_id(hf.template_bos)
        if ids["bos"] is None:
            raise ConversionError(f"{where}: the post-processor's first token "
                                  f"{hf.template_bos!r} is not in the vocabulary")
    eos = ids.get("eos", -1)
    eos_ids = _eos_ids(ckpt, vocab_size, (eos if eos >= 0 else None, where))
    info = bpe_tokenizer_info(
        tokens, types, hf.merges, hf.pre, vocab_size,
        bos_id=ids.get("bos", -1), eos_id=eos, unk_id=ids.get("unk", -1),
        pad_id=ids.get("pad", -1), eos_ids=eos_ids, add_bos=add_bos,
        ignore_merges=hf.ignore_merges, chat_template=_chat_template(ckpt), where=where)
    info.added_lstrip, info.added_rstrip = sorted(hf.lstrip), sorted(hf.rstrip)
    return info


def _spm_added_tokens(ckpt: Checkpoint, data: dict) -> tuple[dict, set, set]:
    """id -> (text, special) of the tokens a SentencePiece folder adds to its model's pieces, and
    the ids of those that lstrip / rstrip. data: the folder's tokenizer.json ({} without one)."""
    added, flags = {}, {}
    legacy = read_json(ckpt.file("added_tokens.json"), required=False) or {}
    if not isinstance(legacy, dict):
        raise ConversionError("added_tokens.json: expected an object of token -> id")
    for text, i in legacy.items():
        added[i] = (text, False)
    decoder = (ckpt.tokenizer_config or {}).get("added_tokens_decoder") or {}
    if not isinstance(decoder, dict):
        raise ConversionError("tokenizer_config.json: added_tokens_decoder must be an object")
    for k, v in decoder.items():
        if not (str(k).isdigit() and isinstance(v, dict) and isinstance(v.get("content"), str)):
            raise ConversionError(f"tokenizer_config.json: bad added_tokens_decoder entry {k!r}: {v!r}")
        added[int(k)] = (v["content"], bool(v.get("special", False)))
        flags[int(k)] = v
    for a in (data.get("added_tokens") or []) if isinstance(data, dict) else []:
        if not (isinstance(a, dict) and isinstance(a.get("content"), str) and isinstance(a.get("id"), int)):
            raise ConversionError(f"{TOKENIZER_JSON}: bad added token {a!r}")
        added[a["id"]] = (a["content"], bool(a.get("special", False)))
        flags[a["id"]] = a
    for i, (text, _) in added.items():
        if isinstance(i, bool) or not isinstance(i, int) or i < 0 or not text:
            raise ConversionError(f"added token {text!r} has a bad id {i!r}")
    lstrip = {i for i, a in flags.items() if a.get("lstrip")}
    rstrip = {i for i, a in flags.items() if a.get("rstrip")}
    return added, lstrip, rstrip


# model types whose tokenizer.json transformers loads as is, whatever tokenizer_class says
# (transformers' MODELS_WITH_INCORRECT_HUB_TOKENIZER_CLASS, the SentencePiece families here)
TOKENIZER_JSON_AS_IS = {"phi3"}


def _prefix_after_added(ckpt: Checkpoint, data: dict) -> str:
    """How transformers prefixes the text after an added token (see the module docstring)."""
    tc = ckpt.tokenizer_config or {}
    if ckpt.config.get("model_type") in TOKENIZER_JSON_AS_IS and data:
        normalizers = [data.get("normalizer") or {}]
        normalizers += normalizers[0].get("normalizers") or []
        if any(isinstance(n, dict) and n.get("type") == "Prepend" for n in normalizers):
            return "always"
        pre = [data.get("pre_tokenizer") or {}]
        pre += pre[0].get("pretokenizers") or []
        for p in pre:
            if isinstance(p, dict) and p.get("type") == "Metaspace":
                return "unless_space" if p.get("prepend_scheme", "always") == "always" else "never"
        return "never"
    if tc.get("add_prefix_space") is False:
        return "never"
    return "unless_space" if tc.get("legacy") is True else "never"


def _read_spm(ckpt: Checkpoint, vocab_size: int, add_bos_default: bool, code_tokens=None) -> TokenizerInfo:
    path = ckpt.file(TOKENIZER_MODEL)
    spm = load_spm(path)
    n = len(spm)
    from_code = code_tokens(ckpt, n) if code_tokens is not None else {}
    if n > vocab_size:
        raise ConversionError(f"{TOKENIZER_MODEL} has {n} pieces, more than the model's "
                              f"vocab_size {vocab_size}")
    tokens = list(spm.pieces) + [None] * (vocab_size - n)
    scores = list(spm.scores) + [0.0] * (vocab_size - n)
    types = list(spm.types) + [UNUSED] * (vocab_size - n)
    data = read_json(ckpt.file(TOKENIZER_JSON), required=False)
    data = data if isinstance(data, dict) else {}
    added, lstrip, rstrip = _spm_added_tokens(ckpt, data)
    added = {**{i: (text, True) for i, text in from_code.items()}, **added}
    for i, (text, special) in sorted(added.items()):
        if i >= vocab_size:
            raise ConversionError(f"added token {text!r} has id {i}, outside the model's "
                                  f"vocab_size {vocab_size}")
        if i < n and tokens[i] == text:
            continue  # one of the model's own pieces (<unk>, <s>, ...): its type stands
        tokens[i], scores[i], types[i] = text, 0.0, CONTROL if special else USER_DEFINED
    existing = set(tokens)
    n_padded, k = 0, 0
    for i in range(n, vocab_size):  # the ids nothing names: unused padding
        if tokens[i] is None:
            while f"<extra_{k}>" in existing:
                k += 1
            tokens[i] = f"<extra_{k}>"
            k += 1
            n_padded += 1

    # bos / eos / unk / pad: the ones the tokenizer files name (Phi-3's eos is <|endoftext|>,
    # not the model's </s>), else the trainer's
    ids = {"bos": spm.bos_id, "eos": spm.eos_id, "unk": spm.unk_id, "pad": spm.pad_id}
    for name, text in _special_token_texts(ckpt).items():
        found = [i for i, (t, _) in added.items() if t == text] or \
                [i for i, t in enumerate(tokens[:n]) if t == text]
        if found:
            ids[name] = found[0]
    eos_ids = _eos_ids(ckpt, vocab_size, (ids["eos"] if ids["eos"] >= 0 else None, TOKENIZER_MODEL))

    tc = ckpt.tokenizer_config or {}
    add_bos = tc.get("add_bos_token", add_bos_default)
    if add_bos is None:
        add_bos = add_bos_default

    return TokenizerInfo(
        tokens=tokens, scores=scores, types=types,
        bos_id=ids["bos"], eos_id=ids["eos"], unk_id=ids["unk"], pad_id=ids["pad"],
        eos_ids=eos_ids, add_bos=bool(add_bos),
        add_dummy_prefix=spm.add_dummy_prefix,
        remove_extra_whitespaces=spm.remove_extra_whitespaces,
        byte_fallback=spm.byte_fallback,
        chat_template=_chat_template(ckpt),
        n_padded=n_padded,
        added_lstrip=sorted(i for i in lstrip if i in added), added_rstrip=sorted(i for i in rstrip if i in added),
        prefix_after_added="always" if from_code else _prefix_after_added(ckpt, data),
    )


def add_tokenizer_metadata(writer, tok) -> None:
    """Writes the tokenizer keys of `tok` (docs/flm_format.md). Stable signature, for every
    source of tokenizers (HF folders, GGUF files):
      tok: TokenizerInfo                   -> the `spm` keys
           bpe_tokenizer.BpeTokenizerInfo  -> the `bpe` keys (or any object with its fields:
                tokens, types, merges, pre, bos_id, eos_id, unk_id, pad_id, eos_ids, add_bos,
                chat_template and, optionally, ignore_merges); build one from plain lists with
                bpe_tokenizer.bpe_tokenizer_info(tokens, types, merges, pre, vocab_size, ...),
                which checks them and pads the vocabulary."""
    if hasattr(tok, "merges"):
        bpe_tokenizer.add_bpe_metadata(writer, tok)
    elif hasattr(tok, "subword_prefix"):
        wordpiece_tokenizer.add_wordpiece_metadata(writer, tok)
    else:
        writer.add_string("tokenizer.model", "spm")
        writer.add_string_array("tokenizer.tokens", tok.tokens)
        writer.add_f32_array("tokenizer.scores", tok.scores)
        writer.add_i64_array("tokenizer.token_types", tok.types)
        writer.add_i64("tokenizer.add_dummy_prefix", int(tok.add_dummy_prefix))
        writer.add_i64("tokenizer.remove_extra_whitespaces", int(tok.remove_extra_whitespaces))
        writer.add_i64("tokenizer.byte_fallback", int(tok.byte_fallback))
        writer.add_string("tokenizer.prefix_after_added", getattr(tok, "prefix_after_added", "never"))
    # the keys every tokenizer shares
    writer.add_i64("tokenizer.bos_id", tok.bos_id)
    writer.add_i64("tokenizer.eos_id", tok.eos_id)
    writer.add_i64("tokenizer.unk_id", tok.unk_id)
    writer.add_i64("tokenizer.pad_id", tok.pad_id)
    writer.add_i64_array("tokenizer.eos_ids", tok.eos_ids)
    writer.add_i64("tokenizer.add_bos", int(tok.add_bos))
    for key in ("added_lstrip", "added_rstrip"):
        if getattr(tok, key, None):
            writer.add_i64_array("tokenizer." + key, list(getattr(tok, key)))
    if tok.chat_template is not None:
        writer.add_string("tokenizer.chat_template", tok.chat_template)
