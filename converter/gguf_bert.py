"""A llama.cpp `bert` GGUF file (convert_hf_to_gguf.py's BertModel: all-MiniLM, bge, e5, nomic's
BERTs) -> the `.flm` bert family (families/bert.py), the GGUF counterpart of an HF folder.

What llama.cpp changed is undone here:
- q, k and v are fused back into attn_qkv.
- Its vocabulary is "phantom space": a word-start piece gets "▁" in front, and a continuation
  piece loses its "##". Control tokens stay as they are. The WordPiece vocabulary is the reverse.
- The normalizer keeps only `tokenizer.ggml.normalizer.lowercase`. Accent stripping follows
  lowercasing, as BertNormalizer's unset strip_accents does; CJK splitting and text cleaning are on.
- The activation is not in the file. It is taken to be the exact GELU, BERT's `hidden_act` "gelu".
- The pooling is `bert.pooling_type`: 0 none, 1 mean, 2 cls, 3 last. 4 (rank) is refused: llama.cpp
  drops a cross-encoder's pooler, so its score cannot be computed as the reference computes it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from . import hf_tokenizer, quantize
from .errors import ConversionError
from .families import bert, common
from .flm_writer import FlmWriter
from .wordpiece_tokenizer import NORMAL, SPECIAL, WordPieceTokenizerInfo

POOLING = {0: "none", 1: "mean", 2: "cls", 3: "last"}
PHANTOM = "\u2581"
CONTROL = 3  # llama.cpp's TokenType.CONTROL


def read_hparams(g) -> bert.HParams:
    a = "bert"
    if g.get_bool(f"{a}.attention.causal", False):
        raise ConversionError(f"{g.path}: bert.attention.causal is true; a BERT encoder's attention is bidirectional")
    hidden = g.get_positive(f"{a}.embedding_length", None)
    heads = g.get_positive(f"{a}.attention.head_count", None)
    layers = g.get_positive(f"{a}.block_count", None)
    ffn = g.get_positive(f"{a}.feed_forward_length", None)
    context = g.get_positive(f"{a}.context_length", None)
    if None in (hidden, heads, layers, ffn, context):
        raise ConversionError(f"{g.path}: a bert file needs embedding_length, attention.head_count, block_count, "
                              f"feed_forward_length and context_length")
    if "token_embd.weight" not in g.tensors or "token_types.weight" not in g.tensors:
        raise ConversionError(f"{g.path}: a bert file needs token_embd.weight and token_types.weight")
    config = {
        "hidden_size": hidden, "num_attention_heads": heads, "num_hidden_layers": layers, "intermediate_size": ffn,
        "max_position_embeddings": context, "vocab_size": g.shape("token_embd.weight")[0],
        "type_vocab_size": g.shape("token_types.weight")[0],
        "layer_norm_eps": g.get_float(f"{a}.attention.layer_norm_epsilon", 1e-12), "hidden_act": "gelu",
    }
    return bert.read_hparams(config)


def pooling(g) -> str:
    kind = g.get_int("bert.pooling_type", 2)
    if kind not in POOLING:
        raise ConversionError(f"{g.path}: bert.pooling_type {kind} is not supported (0 none, 1 mean, 2 cls, 3 last; "
                              f"a reranker's 4 needs the pooler llama.cpp's files leave out: convert its HF folder)")
    return POOLING[kind]


def read_tokenizer(g, vocab_size: int) -> WordPieceTokenizerInfo:
    if g.get_str("tokenizer.ggml.model") != "bert":
        raise ConversionError(f"{g.path}: a bert file needs tokenizer.ggml.model 'bert' (WordPiece)")
    tokens = g.value("tokenizer.ggml.tokens")
    types = g.value("tokenizer.ggml.token_type")
    if not isinstance(tokens, list) or len(tokens) != vocab_size or not isinstance(types, list) or len(types) != vocab_size:
        raise ConversionError(f"{g.path}: tokenizer.ggml.tokens and token_type must list {vocab_size} tokens")
    pieces, kinds = [], []
    for tok, kind in zip(tokens, types):
        if int(kind) == CONTROL:
            pieces.append(tok)
            kinds.append(SPECIAL)
        else:
            pieces.append(tok[1:] if tok.startswith(PHANTOM) else "##" + tok)
            kinds.append(NORMAL)
    if len(set(pieces)) != len(pieces):
        raise ConversionError(f"{g.path}: the vocabulary has duplicate pieces once llama.cpp's phantom spaces are undone")

    def special(key: str, required: bool) -> int:
        v = g.get_int(key, -1)
        if v is None or v < -1 or v >= vocab_size or (required and v < 0):
            raise ConversionError(f"{g.path}: {key} is {'missing or ' if required else ''}out of range")
        return v

    unk, cls = special("tokenizer.ggml.unknown_token_id", True), special("tokenizer.ggml.bos_token_id", False)
    cls = special("tokenizer.ggml.cls_token_id", False) if g.has("tokenizer.ggml.cls_token_id") else cls
    sep = special("tokenizer.ggml.seperator_token_id", False)  # llama.cpp's spelling
    lowercase = bool(g.get_bool("tokenizer.ggml.normalizer.lowercase", True))
    return WordPieceTokenizerInfo(tokens=pieces, types=kinds, unk_id=unk, bos_id=cls, sep_id=sep,
                                  pad_id=special("tokenizer.ggml.padding_token_id", False), lowercase=lowercase,
                                  strip_accents=lowercase, clean_text=True, chinese_chars=True)


def tensor_parts(hp: bert.HParams) -> list:
    """(.flm name, [GGUF names]) in the order of families/bert.py's tensor_specs."""
    out = []
    for name, parts in bert.tensor_specs(hp):
        if ".attn_qkv." in name:
            b, suffix = name.split("attn_qkv")
            out.append((name, [f"{b}attn_{x}{suffix}" for x in "qkv"]))
        else:
            out.append((name, [name]))
    return out


def convert_bert_gguf(g, out_path: Path, dtype: str, dtype_policy, progress: bool) -> str:
    if isinstance(dtype_policy, quantize.DtypePolicy) and dtype_policy.default == "auto":
        raise ConversionError(f"{g.path}: --dtype auto is not supported for bert files; give f32, f16, int8, ...")
    hp = read_hparams(g)
    tok = read_tokenizer(g, hp.vocab_size)
    pool = pooling(g)
    if any(n.startswith("cls") for n in g.tensors):
        raise ConversionError(f"{g.path}: a classifier head (a reranker) in a GGUF file is not supported: llama.cpp "
                              f"leaves out its pooler; convert the HF folder")
    writer = FlmWriter(out_path, dtype_policy=dtype_policy)
    quantize.tell_policy(writer.dtype_policy, hp.num_layers, False, bert.PRECISE)
    used = set()
    specs = dict(bert.tensor_specs(hp))
    for name, gnames in tensor_parts(hp):
        want = specs[name]
        for gname, (_, shape) in zip(gnames, want):
            if gname not in g.tensors:
                raise ConversionError(f"{g.path}: missing tensor {gname}")
            if g.shape(gname) != tuple(shape):
                raise ConversionError(f"{g.path}: tensor {gname} has shape {list(g.shape(gname))}, the metadata implies "
                                      f"{list(shape)}")
            g.check_type(gname)
            used.add(gname)
        shape = (sum(s[0] for _, s in want), *want[0][1][1:])

        def produce(gnames=gnames, name=name):
            arrays = [g.dequantize(n) for n in gnames]
            a = arrays[0] if len(arrays) == 1 else np.concatenate(arrays, axis=0)
            return common.to_numpy(torch.from_numpy(np.ascontiguousarray(a)), "f32", name)

        writer.add_tensor(name, "f32", shape, produce)
    extra = [n for n in g.tensors if n not in used]
    if extra:
        raise ConversionError(f"{g.path}: tensors this bert model does not use: {', '.join(extra[:5])}")
    writer.add_string("general.architecture", bert.ARCH)
    writer.add_string("general.name", g.get_str("general.name") or Path(g.path).stem)
    writer.add_string("general.source", "gguf")
    bert.add_metadata(writer, hp, False)
    writer.add_string(f"{bert.ARCH}.pooling", pool)
    hf_tokenizer.add_tokenizer_metadata(writer, tok)
    writer.write(progress=progress, desc=f"{Path(out_path).name} ({dtype})")
    return str(out_path)
