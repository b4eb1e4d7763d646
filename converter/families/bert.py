"""BERT encoders (BertModel: sentence-transformers' all-MiniLM, bge, e5 and the like): learned
absolute positions and token types added to the word embeddings, then LayerNorm; per layer
bidirectional attention with biases, LayerNorm after each residual add (post-norm), a non-gated
MLP with the exact (erf) GELU. No output head: the model embeds (docs/embeddings.md); with a
sequence classifier (BertForSequenceClassification: a cross-encoder reranker), its pooler and
classifier become `cls.weight` / `cls.bias` and `cls.output.weight` / `cls.output.bias`. Its
metadata names each of these knobs, which the core reads generally (bert.causal 0, post_norm 1,
ffn_gated 0, position_embedding learned, layer_norm_eps). The pooling comes from the folder's
sentence-transformers config (sentence_transformers.py), not from here."""

from __future__ import annotations

from dataclasses import dataclass

from .. import quantize
from ..errors import ConversionError
from . import common

ARCH = "bert"
HF_ARCHITECTURES = ("BertModel", "BertForSequenceClassification")
MODEL_TYPE = "bert"
GGUF_ARCH = "bert"  # read by gguf_bert.py
ADD_BOS_DEFAULT = True  # [CLS] ... [SEP]

# transformers' BERT activation names -> the core's
ACTIVATIONS = {"gelu": "gelu_erf", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh"}


@dataclass
class HParams:
    arch: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    head_dim: int
    context_length: int           # inputs up to this long (the position table's first rows)
    max_positions: int            # rows of the checkpoint's position table
    layer_norm_eps: float
    token_types: int
    activation: str


def read_hparams(config: dict) -> HParams:
    hidden = common.positive_int(config, "hidden_size")
    heads = common.positive_int(config, "num_attention_heads")
    if hidden % heads:
        raise ConversionError(f"config.json: hidden_size ({hidden}) is not a multiple of num_attention_heads ({heads})")
    kind = config.get("position_embedding_type", "absolute")
    if kind != "absolute":
        raise ConversionError(f"config.json: position_embedding_type {kind!r} is not supported (absolute)")
    act = config.get("hidden_act", "gelu")
    if act not in ACTIVATIONS:
        raise ConversionError(f"config.json: hidden_act {act!r} is not supported for bert "
                              f"(supported: {', '.join(ACTIVATIONS)})")
    eps = config.get("layer_norm_eps", 1e-12)
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not 0 < eps < 1:
        raise ConversionError(f"config.json: invalid layer_norm_eps {eps!r}")
    return HParams(
        arch=ARCH,
        vocab_size=common.positive_int(config, "vocab_size"),
        hidden_size=hidden,
        intermediate_size=common.positive_int(config, "intermediate_size"),
        num_layers=common.positive_int(config, "num_hidden_layers"),
        num_heads=heads,
        head_dim=hidden // heads,
        context_length=common.positive_int(config, "max_position_embeddings", 512),
        max_positions=common.positive_int(config, "max_position_embeddings", 512),
        layer_norm_eps=float(eps),
        token_types=common.positive_int(config, "type_vocab_size", 2),
        activation=ACTIVATIONS[act],
    )


def add_metadata(writer, hp: HParams, tied: bool) -> None:
    a = hp.arch + "."
    for key, v in (("vocab_size", hp.vocab_size), ("hidden_size", hp.hidden_size),
                   ("intermediate_size", hp.intermediate_size), ("num_layers", hp.num_layers),
                   ("num_heads", hp.num_heads), ("num_kv_heads", hp.num_heads), ("head_dim", hp.head_dim),
                   ("context_length", hp.context_length), ("tie_word_embeddings", 0), ("causal", 0),
                   ("post_norm", 1), ("ffn_gated", 0), ("token_type_count", hp.token_types)):
        writer.add_i64(a + key, v)
    writer.add_f64(a + "layer_norm_eps", hp.layer_norm_eps)
    writer.add_string(a + "position_embedding", "learned")
    writer.add_string(a + "ffn_activation", hp.activation)


def tensor_specs(hp: HParams) -> list:
    """(.flm name, ((HF name, shape), ...)) in file order; HF names under the model's prefix."""
    H, I, V = hp.hidden_size, hp.intermediate_size, hp.vocab_size
    e = "embeddings."
    specs = [("token_embd.weight", ((e + "word_embeddings.weight", (V, H)),)),
             ("position_embd.weight", ((e + "position_embeddings.weight", (hp.max_positions, H)),)),
             ("token_types.weight", ((e + "token_type_embeddings.weight", (hp.token_types, H)),)),
             ("token_embd_norm.weight", ((e + "LayerNorm.weight", (H,)),)),
             ("token_embd_norm.bias", ((e + "LayerNorm.bias", (H,)),))]
    for i in range(hp.num_layers):
        p, b = f"encoder.layer.{i}.", f"blk.{i}."
        for suffix, shape in ((".weight", lambda n: (n, H)), (".bias", lambda n: (n,))):
            specs.append((b + "attn_qkv" + suffix, tuple((p + f"attention.self.{x}{suffix}", shape(H))
                                                         for x in ("query", "key", "value"))))
            specs.append((b + "attn_output" + suffix, ((p + "attention.output.dense" + suffix, shape(H)),)))
        specs.append((b + "attn_output_norm.weight", ((p + "attention.output.LayerNorm.weight", (H,)),)))
        specs.append((b + "attn_output_norm.bias", ((p + "attention.output.LayerNorm.bias", (H,)),)))
        specs.append((b + "ffn_up.weight", ((p + "intermediate.dense.weight", (I, H)),)))
        specs.append((b + "ffn_up.bias", ((p + "intermediate.dense.bias", (I,)),)))
        specs.append((b + "ffn_down.weight", ((p + "output.dense.weight", (H, I)),)))
        specs.append((b + "ffn_down.bias", ((p + "output.dense.bias", (H,)),)))
        specs.append((b + "layer_output_norm.weight", ((p + "output.LayerNorm.weight", (H,)),)))
        specs.append((b + "layer_output_norm.bias", ((p + "output.LayerNorm.bias", (H,)),)))
    return specs


# One step more precision when quantizing (f16 with int8, q8 with int4): q|k|v and the MLP's up
# projection read the normed residual stream, whose outlier channels coarsen the rounding of the
# rest of their blocks. all-MiniLM-L6-v2, 200 inputs, lowest cosine to sentence-transformers:
# int8 0.9983 with q8 everywhere, 0.9992 with q|k|v in f16, 0.9998 with up too (file 35.7 -> 41 MB);
# int4 0.949 with q|k|v in q8, 0.978 with up too (20.7 -> 22.5 MB).
PRECISE = ("attn_qkv", "ffn_up")

# Left out on purpose: the pooler (a BertModel's dense + tanh over [CLS], which sentence-transformers'
# pooling does not use) and the position ids buffer.
UNUSED = ("pooler.", "embeddings.position_ids")


def add_tensors(writer, ckpt, hp: HParams, dtype: str) -> bool:
    names = set(ckpt.names())
    prefix = next((p for p in ("", "bert.", "model.") if p + "embeddings.word_embeddings.weight" in names), None)
    if prefix is None:
        raise ConversionError(f"{ckpt.path}: no embeddings.word_embeddings.weight in the weights; is this a BERT checkpoint?")
    quantize.tell_policy(writer.dtype_policy, hp.num_layers, False, PRECISE)
    used = set()
    for name, parts in tensor_specs(hp):
        full = []
        for hf, shape in parts:
            n = prefix + hf
            if not ckpt.has(n):
                raise ConversionError(f"missing tensor {n} in the weights of {ckpt.path}")
            if tuple(ckpt.shape(n)) != tuple(shape):
                raise ConversionError(f"tensor {n} has shape {list(ckpt.shape(n))}, the config implies {list(shape)}")
            full.append(n)
            used.add(n)
        shape = list(parts[0][1])
        shape[0] = sum(s[0] for _, s in parts)
        if name == "position_embd.weight":  # the positions an input may use
            shape[0] = hp.context_length

        def produce(full=full, name=name, rows=shape[0]):
            import torch
            ts = [ckpt.get(n) for n in full]
            return common.to_numpy((ts[0] if len(ts) == 1 else torch.cat(ts, dim=0))[:rows], "f32", name)

        writer.add_tensor(name, dtype if len(shape) == 2 else "f32", tuple(shape), produce)
    if "classifier.weight" in names:  # a sequence classifier: the pooler (dense + tanh), then the labels
        labels = ckpt.shape("classifier.weight")[0]
        H = hp.hidden_size
        head = (("cls.weight", prefix + "pooler.dense.weight", (H, H)), ("cls.bias", prefix + "pooler.dense.bias", (H,)),
                ("cls.output.weight", "classifier.weight", (labels, H)), ("cls.output.bias", "classifier.bias", (labels,)))
        for name, n, shape in head:
            if not ckpt.has(n) or tuple(ckpt.shape(n)) != shape:
                raise ConversionError(f"the classifier needs {n} of shape {list(shape)}")
            used.add(n)
            writer.add_tensor(name, "f32", shape,
                              lambda n=n, name=name: common.to_numpy(ckpt.get(n), "f32", name))
    extra = [n for n in names if n not in used and not n[len(prefix):].startswith(UNUSED)]
    if extra:
        shown = ", ".join(sorted(extra)[:5]) + (f" and {len(extra) - 5} more" if len(extra) > 5 else "")
        raise ConversionError(f"the weights have tensors this bert config does not use: {shown}")
    return False
