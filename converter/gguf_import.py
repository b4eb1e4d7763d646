"""A llama.cpp GGUF file (v2 or v3) -> `.flm` file (docs/flm_format.md).

    python converter/convert.py --model_path MODEL.gguf --out_path OUT.flm [--dtype f32|f16|bf16]

or, with the repository root on sys.path:

    from converter.gguf_import import convert_gguf
    convert_gguf("model.gguf", "model.flm", dtype="f16")

The file is read with the `gguf` package (PyPI). The architectures (general.architecture) are
those of llama.cpp's converter for our families: `llama` (LLaMA 1/2/3, SmolLM, TinyLlama,
Mistral, ...), `qwen2`, `qwen3`, `phi3`, `chatglm` and `glm4`; any other is refused with a
ConversionError that names it and lists these. A `llama` file converts as the llama family;
`--model_type mistral` writes it as mistral instead (llama.cpp writes Mistral as `llama`); a
`chatglm` file (llama.cpp's name for GlmForCausalLM and THUDM's ChatGLM checkpoints) converts as
glm.

Hyperparameters: the `A.*` GGUF keys are turned into a HuggingFace-style config dict, which goes
through the family's own read_hparams, as a config.json would, so the RoPE inverse frequencies
are computed exactly as for an HF checkpoint. Per architecture, as llama.cpp's converter writes
them:
  llama   a `rope_freqs.weight` tensor (Llama 3.1-style scaling: one divisor per frequency)
          divides the frequencies; `attention.sliding_window` (Mistral) is kept
  qwen2   q/k/v biases; `attention.sliding_window` (+ `sliding_window_pattern`) if written
  qwen3   attn_q_norm / attn_k_norm; `attention.key_length` is head_dim
  chatglm (glm) and glm4: `rope.dimension_count` (half of each head); q/k/v biases; ffn_up
          holds gate|up; attn_qkv (THUDM's layout, q, k, v rows) or attn_q / attn_k / attn_v;
          glm4's post_attention_norm / post_ffw_norm
  phi3    `rope.dimension_count` (the rotated dims), `rope.scaling.original_context_length`,
          `rope_factors_long.weight` / `rope_factors_short.weight` (LongRoPE's factors),
          `rope.scaling.attn_factor`, `attention.sliding_window` (0: none)

Weights: every tensor is dequantized to float32 (F32/F16/F64 directly, everything else with
`gguf.quants.dequantize`: BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, the K-quants, the IQ types, ...),
then rounded to the requested dtype (norms and biases stay f32). GGUF lists dims innermost
first; the reader's arrays are already [out, in]. For the `llama` architecture only, llama.cpp's
converter reorders the rows of attn_q and attn_k inside each head so that its RoPE can rotate
adjacent pairs (x[2i], x[2i+1]); our RoPE rotates halves (x[i], x[i + hd/2]) as HF's does, so the
reordering is undone here. The tensors are then laid out as the family lays out its HF tensors
(GGUF_NAMES maps the names): Q, K, V fused into attn_qkv (phi3 files hold attn_qkv already) and
gate, up into ffn_gate_up (phi3 files hold both in ffn_up, 2 x intermediate rows). Without
`output.weight` the output head is tied to the embedding.

Tokenizer: `tokenizer.ggml.model` "llama" (SentencePiece) becomes our `spm` keys, "gpt2"
(byte-level BPE) our `bpe` keys; see read_tokenizer.
"""

from __future__ import annotations

import math
import re
import sys
import warnings
from pathlib import Path

import numpy as np
import torch

from . import bpe_tokenizer, hf_tokenizer, quantize
from .errors import ConversionError
from .families import FAMILIES, common
from .flm_writer import FlmWriter
from .gguf_file import GGUF_MAGIC, GgufFile

# general.architecture -> the family it converts as: the family of that name (Mistral's files
# say llama), else the one whose files have it (chatglm: glm)
GGUF_FAMILIES = {m.GGUF_ARCH: m for m in FAMILIES.values() if m.GGUF_ARCH == m.ARCH}
for _m in FAMILIES.values():
    GGUF_FAMILIES.setdefault(_m.GGUF_ARCH, _m)
SUPPORTED_ARCHITECTURES = tuple(GGUF_FAMILIES)
# llama.cpp reorders the q / k rows for its RoPE only when it writes these architectures
PERMUTED_ARCHITECTURES = ("llama",)

# HF tensor names (without `model.`, after `layers.N.`) -> llama.cpp's (after `blk.N.`), as
# gguf-py's TensorNameMap maps them; Phi-3's gate_up_proj becomes ffn_up (2 x intermediate rows)
GGUF_NAMES = {
    "embed_tokens.weight": "token_embd.weight",
    "norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.qkv_proj.weight": "attn_qkv.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.o_proj.bias": "attn_output.bias",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "post_self_attn_layernorm.weight": "post_attention_norm.weight",
    "post_mlp_layernorm.weight": "post_ffw_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.gate_up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
    "mlp.gate_proj.bias": "ffn_gate.bias",
    "mlp.up_proj.bias": "ffn_up.bias",
    "mlp.down_proj.bias": "ffn_down.bias",
}

# tokenizer.ggml.pre -> our tokenizer.pre (docs/flm_format.md)
BPE_PRE = {
    "gpt2": "gpt2",
    "llama-bpe": "llama3",
    "llama3": "llama3",
    "qwen2": "qwen2",
    "smollm": "smollm",
    "chatglm-bpe": "llama3",  # glm-4-9b-chat: llama.cpp's CHATGLM4 regex is Llama 3's
    "glm4": "llama3",         # GLM-4-0414: the same regex, with ignore_merges
}

# GGUF token types (llama.cpp's llama_token_type) -> our `bpe` token types
GGUF_NORMAL, GGUF_UNKNOWN, GGUF_CONTROL, GGUF_USER_DEFINED, GGUF_UNUSED, GGUF_BYTE = 1, 2, 3, 4, 5, 6
BPE_NORMAL, BPE_SPECIAL, BPE_ADDED, BPE_UNUSED = (bpe_tokenizer.NORMAL, bpe_tokenizer.SPECIAL,
                                                  bpe_tokenizer.ADDED, bpe_tokenizer.UNUSED)
_BPE_TYPES = {
    0: BPE_NORMAL,            # undefined
    GGUF_NORMAL: BPE_NORMAL,
    GGUF_UNKNOWN: BPE_SPECIAL,
    GGUF_CONTROL: BPE_SPECIAL,
    GGUF_USER_DEFINED: BPE_ADDED,
    GGUF_UNUSED: BPE_UNUSED,
}
_BYTE_PIECE = re.compile(r"<0x[0-9A-Fa-f]{2}>")

__all__ = ["convert_gguf", "is_gguf", "read_gguf", "gguf_config", "read_hparams",
           "read_tokenizer", "unpermute_rope_rows"]


def is_gguf(path) -> bool:
    """Whether `path` is a file that starts with the GGUF magic."""
    p = Path(path)
    if not p.is_file():
        return False
    with open(p, "rb") as f:
        return f.read(4) == GGUF_MAGIC


# ---- reading the file -------------------------------------------------------------------------

class GgufModel:
    """A GGUF file (gguf_file.GgufFile): typed metadata access and tensors by name."""

    def __init__(self, path):
        self.path = Path(path)
        if not self.path.exists():
            raise ConversionError(f"model file {self.path} does not exist")
        if not self.path.is_file():
            raise ConversionError(f"{self.path} is not a file")
        try:
            import gguf
        except ImportError:
            raise ConversionError("reading GGUF files needs the `gguf` package "
                                  "(pip install -r requirements.txt)") from None
        self.gguf = gguf
        with open(self.path, "rb") as f:
            magic = f.read(4)
        if magic != GGUF_MAGIC:
            raise ConversionError(f"{self.path}: not a GGUF file (magic {magic!r})")
        try:
            f = GgufFile(self.path, gguf)
        except Exception as e:  # GgufFormatError; anything else the bytes provoke is still damage, not a crash
            raise ConversionError(f"{self.path}: cannot read GGUF file: {e}") from None
        self.fields = f.fields
        self.tensors = {}
        for t in f.tensors:
            if t.name in self.tensors:
                raise ConversionError(f"{self.path}: duplicate tensor {t.name}")
            self.tensors[t.name] = t
        self.version = f.version
        self.little_endian = f.little_endian
        self.arch = self.get_str("general.architecture")

    # metadata
    def has(self, key: str) -> bool:
        return key in self.fields

    def value(self, key: str, default=None):
        """The key's value as Python objects (str, int, float, bool, or a list of those)."""
        field = self.fields.get(key)
        if field is None:
            return default
        try:
            return field.contents()
        except UnicodeDecodeError as e:
            raise ConversionError(f"{self.path}: metadata {key} is not valid UTF-8: {e}") from None
        except Exception as e:
            raise ConversionError(f"{self.path}: cannot read metadata {key}: {e}") from None

    def _scalar(self, key: str, default, kinds, what: str):
        v = self.value(key)
        if v is None:
            if default is _REQUIRED:
                raise ConversionError(f"{self.path}: missing metadata {key}")
            return default
        if isinstance(v, list):
            if len(v) and all(x == v[0] for x in v):
                v = v[0]  # a per-layer array with one value
            else:
                raise ConversionError(f"{self.path}: metadata {key} = {v!r}: per-layer values "
                                      f"are not supported")
        if not isinstance(v, kinds) or (bool not in kinds and isinstance(v, bool)):
            raise ConversionError(f"{self.path}: metadata {key} must be {what}, got {v!r}")
        return v

    def get_int(self, key: str, default=None):
        return self._scalar(key, default, (int,), "an integer")

    def get_positive(self, key: str, default=None):
        v = self.get_int(key, default)
        if v is not None and v <= 0:
            raise ConversionError(f"{self.path}: metadata {key} must be positive, got {v}")
        return v

    def get_float(self, key: str, default=None):
        """A FLOAT32 value becomes the shortest decimal that rounds to it (1e-05, not
        9.999999747378752e-06): the number the original config had."""
        v = self._scalar(key, default, (int, float), "a number")
        if v is None:
            return None
        field = self.fields.get(key)
        if field is not None and field.types and field.types[-1] == self.gguf.GGUFValueType.FLOAT32:
            return float(str(np.float32(v)))
        return float(v)

    def get_bool(self, key: str, default=None):
        v = self._scalar(key, default, (bool, int), "a boolean")
        return None if v is None else bool(v)

    def get_str(self, key: str, default=None):
        return self._scalar(key, default, (str,), "a string")

    def get_list(self, key: str, kind, what: str, default=None):
        v = self.value(key)
        if v is None:
            if default is _REQUIRED:
                raise ConversionError(f"{self.path}: missing metadata {key}")
            return default
        if not isinstance(v, list) or not all(isinstance(x, kind) and not
                                              (kind is not bool and isinstance(x, bool))
                                              for x in v):
            raise ConversionError(f"{self.path}: metadata {key} must be an array of {what}")
        return v

    # tensors
    def shape(self, name: str) -> tuple:
        """Outermost first (as torch), i.e. GGUF's ne reversed: a matrix is [out, in]."""
        return tuple(int(d) for d in reversed(self.tensors[name].shape))

    def type_name(self, name: str) -> str:
        t = self.tensors[name].tensor_type
        return getattr(t, "name", str(t))

    def check_type(self, name: str) -> None:
        qtype = self.tensors[name].tensor_type
        if not _can_dequantize(self.gguf, qtype):
            raise ConversionError(f"{self.path}: tensor {name} has GGUF type "
                                  f"{self.type_name(name)}, which the gguf package cannot "
                                  f"dequantize")

    def dequantize(self, name: str, out: np.ndarray | None = None, keep_f16: bool = False,
                   keep_bf16: bool = False) -> np.ndarray:
        """The tensor as float32, [out, in]. An F16 tensor is widened into `out` (float32, at least
        the tensor's size) when given: the converter passes the same buffer for every tensor it
        quantizes at once, where a fresh array per tensor had its pages zeroed by the kernel (a
        tenth of an int4 conversion from an f16 GGUF, 1.1B shape), and torch widens with F16C
        where numpy goes value by value. keep_f16: an F16 tensor in this machine's byte order stays
        float16, a view of the file, for a quantizer that widens each row itself
        (fastllm_quantize_f16: int4 of the 1.1B shape 12.4 s against 13.6, int8 13.6 against 15.1,
        medians of 4 alternating runs, AMD EPYC, 2 cores). keep_bf16: a BF16 tensor of a little-endian
        file stays its bits (quantize.BF16), a view of the file, for fastllm_quantize_bf16."""
        t = self.tensors[name]
        T = self.gguf.GGMLQuantizationType
        try:
            data = np.asarray(t.data)
            if t.tensor_type == T.F16 and keep_f16 and data.dtype == np.float16:
                arr = data
            elif t.tensor_type == T.BF16 and keep_bf16 and self.little_endian and sys.byteorder == "little":
                arr = data.view(quantize.BF16)  # (the file's bytes, two a value)
            elif t.tensor_type == T.F16 and out is not None and data.dtype == np.float16:
                src = data.reshape(-1)  # (a big-endian file's data takes astype below)
                arr = out[:src.size]
                with warnings.catch_warnings():  # the mapping is read-only; torch only reads it
                    warnings.simplefilter("ignore", UserWarning)
                    torch.from_numpy(arr).copy_(torch.from_numpy(src))
            elif t.tensor_type in (T.F32, T.F16, T.F64):
                arr = data.astype(np.float32)
            else:
                arr = self.gguf.quants.dequantize(t.data, t.tensor_type)
            kept = keep_f16 and arr.dtype == np.float16 or keep_bf16 and arr.dtype == quantize.BF16
            arr = np.ascontiguousarray(arr, dtype=arr.dtype if kept else np.float32)
            arr = arr.reshape(self.shape(name))
        except (ValueError, NotImplementedError, AssertionError) as e:
            raise ConversionError(f"{self.path}: cannot dequantize tensor {name} "
                                  f"({self.type_name(name)}): {e}") from None
        return arr

    def exactly_held(self, name: str) -> bool:
        """Whether on_grid can give the tensor (a Q8_0 one must not use the code -128)."""
        if self.type_name(name) not in _EXACT:
            return False
        if self.type_name(name) != "Q8_0":
            return True
        codes = np.asarray(self.tensors[name].data, dtype=np.uint8).reshape(-1, 34)[:, 2:]
        return not (codes == 0x80).any()

    def on_grid(self, name: str):
        """(.flm dtype, quantize.Grid, float32 weights [out, in]) for a tensor whose GGUF blocks a
        .flm format holds exactly (Q4_K -> q4k, Q4_0 -> q4, Q4_1 -> q4m, Q8_0 -> q8), read from
        the blocks; None for any other type (and for a Q8_0 tensor using the code -128, which q8
        does not have)."""
        t = self.tensors[name]
        kind = self.type_name(name)
        if kind not in _EXACT:
            return None
        n, k = self.shape(name)
        raw = np.asarray(t.data, dtype=np.uint8).reshape(n, -1)
        if kind == "Q8_0":
            if not self.exactly_held(name):
                return None
            b = raw.reshape(n, k // 32, 34)
            codes = b[..., 2:].view(np.int8).astype(np.float32)
            d = b[..., :2].copy().view(np.float16)[..., 0]
            return "q8", quantize.Grid(d), (d.astype(np.float32)[..., None] * codes).reshape(n, k)
        if kind in ("Q4_0", "Q4_1"):
            head = 2 if kind == "Q4_0" else 4
            b = raw.reshape(n, k // 32, head + 16)
            qs = b[..., head:]
            q = np.concatenate([qs & 15, qs >> 4], axis=2).astype(np.float32)  # weights 0-15 low, 16-31 high
            d = b[..., :2].copy().view(np.float16)[..., 0]
            if kind == "Q4_0":
                return "q4", quantize.Grid(d), (d.astype(np.float32)[..., None] * (q - 8)).reshape(n, k)
            m = b[..., 2:4].copy().view(np.float16)[..., 0]
            w = d.astype(np.float32)[..., None] * q + m.astype(np.float32)[..., None]
            return "q4m", quantize.Grid(d, m), w.reshape(n, k)
        # Q4_K: per 256 weights d, dmin (f16), 12 bytes of 6-bit scales and minimums of the 8
        # sub-blocks of 32, then 128 bytes of codes: 64 weights per 32 bytes, low nibbles first.
        # A weight is d * sc * q - dmin * m: q4k's scale factor d, minimum factor -dmin.
        b = raw.reshape(n, k // 256, 144)
        d, dmin, sc6 = b[..., 0:2].copy().view(np.float16)[..., 0], b[..., 2:4].copy().view(np.float16)[..., 0], b[..., 4:16]
        lo, hi = sc6[..., 0:4], sc6[..., 4:8]
        ext = sc6[..., 8:12]
        sc = np.concatenate([lo & 63, (ext & 15) | ((lo >> 6) << 4)], axis=2)
        mn = np.concatenate([hi & 63, (ext >> 4) | ((hi >> 6) << 4)], axis=2)
        qs = b[..., 16:].reshape(n, k // 256, 4, 32)
        q = np.stack([qs & 15, qs >> 4], axis=3).reshape(n, k // 256, 8, 32).astype(np.float32)
        kk = quantize.KScales(sc.reshape(n, -1), d, mn.reshape(n, -1), -dmin)
        grid = quantize.Grid.of_k(kk)
        w = grid.scale.reshape(n, k // 256, 8)[..., None] * q + grid.mins.reshape(n, k // 256, 8)[..., None]
        return "q4k", grid, w.reshape(n, k)


# GGUF types a .flm format holds exactly (GgufModel.on_grid), and where `--dtype auto` puts the
# others: re-rounded by the format's own search onto a format with at least their precision.
_EXACT = {"Q4_K": "q4k", "Q4_0": "q4", "Q4_1": "q4m", "Q8_0": "q8"}
_AUTO = {"F32": "f32", "F16": "f16", "BF16": "bf16", "F64": "f32", "Q6_K": "q6k", "Q5_K": "q6k",
         "Q5_0": "q6k", "Q5_1": "q6k", "Q8_1": "q8", "Q8_K": "q8", **_EXACT}
_PRECISION = ["q4", "q4m", "q4k", "q6k", "q8", "bf16", "f16", "f32"]  # least to most


def auto_dtype(types) -> str:
    """`--dtype auto`'s choice for a .flm tensor made of GGUF tensors of these types: their own
    format where one holds them, else q4k for lower-bit types (Q2_K, Q3_K, the IQ types); a
    fused tensor of several types takes the most precise."""
    return max((_AUTO.get(t, "q4k") for t in types), key=_PRECISION.index)


_REQUIRED = object()
_DEQUANT_OK: dict = {}


def _can_dequantize(gguf, qtype) -> bool:
    """Whether gguf.quants.dequantize implements qtype (tried once on one zero block)."""
    T = gguf.GGMLQuantizationType
    if qtype in (T.F32, T.F16, T.F64):
        return True
    if qtype not in _DEQUANT_OK:
        ok = False
        sizes = gguf.GGML_QUANT_SIZES.get(qtype)
        if sizes is not None:
            try:
                gguf.quants.dequantize(np.zeros((1, sizes[1]), dtype=np.uint8), qtype)
                ok = True
            except Exception:
                ok = False
        _DEQUANT_OK[qtype] = ok
    return _DEQUANT_OK[qtype]


def read_gguf(path) -> GgufModel:
    return GgufModel(path)


# ---- hyperparameters --------------------------------------------------------------------------

def check_architecture(g: GgufModel) -> str:
    arch = g.get_str("general.architecture", _REQUIRED)
    if arch not in SUPPORTED_ARCHITECTURES:
        raise ConversionError(f"{g.path}: unsupported GGUF architecture {arch!r} (supported: "
                              f"{', '.join(SUPPORTED_ARCHITECTURES)})")
    return arch


def gguf_family(g: GgufModel, model_type: str | None = None):
    """The family the file converts as: its architecture's, or `model_type` when that family's
    files have this architecture (mistral for a llama file)."""
    arch = check_architecture(g)
    if model_type is None:
        return GGUF_FAMILIES[arch]
    family = FAMILIES.get(model_type)
    if family is None or family.GGUF_ARCH != arch:
        ok = [f.ARCH for f in FAMILIES.values() if f.GGUF_ARCH == arch]
        raise ConversionError(f"--model_type {model_type} does not fit {g.path}, whose "
                              f"architecture is {arch} (it converts as: {', '.join(ok)})")
    return family


def gguf_config(g: GgufModel, family=None) -> dict:
    """An HF-style config dict for `family` (default: the file's; the keys its read_hparams
    reads) from the GGUF metadata."""
    a = check_architecture(g)
    family = family or GGUF_FAMILIES[a]
    experts = g.get_int(f"{a}.expert_count", 0)
    if experts:
        raise ConversionError(f"{g.path}: mixture-of-experts models ({a}.expert_count = "
                              f"{experts}) are not supported")
    hidden = g.get_positive(f"{a}.embedding_length", _REQUIRED)
    heads = g.get_positive(f"{a}.attention.head_count", _REQUIRED)
    kv_heads = g.get_positive(f"{a}.attention.head_count_kv", heads)
    key_len = g.get_positive(f"{a}.attention.key_length")
    value_len = g.get_positive(f"{a}.attention.value_length")
    if key_len is not None and value_len is not None and key_len != value_len:
        raise ConversionError(f"{g.path}: attention.key_length ({key_len}) differs from "
                              f"value_length ({value_len}); not supported")
    head_dim = key_len or value_len
    if head_dim is None:
        if hidden % heads:
            raise ConversionError(f"{g.path}: embedding_length ({hidden}) is not a multiple of "
                                  f"head_count ({heads}) and there is no attention.key_length")
        head_dim = hidden // heads

    vocab = g.get_positive(f"{a}.vocab_size")
    if vocab is None:
        tokens = g.value("tokenizer.ggml.tokens")
        if isinstance(tokens, list) and tokens:
            vocab = len(tokens)
        elif "token_embd.weight" in g.tensors:
            vocab = g.shape("token_embd.weight")[0]
        else:
            raise ConversionError(f"{g.path}: cannot tell the vocabulary size (no "
                                  f"{a}.vocab_size, no tokens, no token_embd.weight)")

    layers = g.get_positive(f"{a}.block_count", _REQUIRED)
    config = {
        "architectures": [family.HF_ARCHITECTURES[0]],
        "model_type": family.MODEL_TYPE,
        "vocab_size": vocab,
        "hidden_size": hidden,
        "intermediate_size": g.get_positive(f"{a}.feed_forward_length", _REQUIRED),
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "max_position_embeddings": g.get_positive(f"{a}.context_length", 2048),
        "rms_norm_eps": g.get_float(f"{a}.attention.layer_norm_rms_epsilon", 1e-5),
        "rope_theta": g.get_float(f"{a}.rope.freq_base", 10000.0),
        "rope_scaling": _rope_scaling(g, a),
        "hidden_act": "silu",
        "tie_word_embeddings": "output.weight" not in g.tensors,
        "attention_bias": "blk.0.attn_q.bias" in g.tensors or "blk.0.attn_qkv.bias" in g.tensors,
        "mlp_bias": "blk.0.ffn_down.bias" in g.tensors,
        "sliding_window": g.get_int(f"{a}.attention.sliding_window") or None,  # 0: none
    }
    rot = g.get_positive(f"{a}.rope.dimension_count", head_dim)
    if a == "phi3":
        _phi3_config(g, a, config, rot)
    elif a in ("chatglm", "glm4"):
        _partial_rotary(g, config, rot)  # GLM rotates half of each head
    elif rot != head_dim:
        raise ConversionError(f"{g.path}: rope.dimension_count ({rot}) differs from the head "
                              f"size ({head_dim}): partial rotary embeddings are not supported "
                              f"for {a}")
    if a in ("gemma", "gemma2", "gemma3"):
        _gemma_config(g, a, config)
    if a in ("qwen2", "qwen3") and config["sliding_window"]:
        # Qwen2Config: the window needs use_sliding_window; which layers use it: the pattern
        config["use_sliding_window"] = True
        types = _window_layer_types(g, a, layers)
        if types is not None:
            config["layer_types"] = types
        else:
            config["max_window_layers"] = 0
    return config


def _window_layer_types(g: GgufModel, a: str, layers: int, every: int | None = None):
    """The layers' types from `attention.sliding_window_pattern`: one flag per layer (true:
    sliding), or an integer n (every n-th layer full, as llama.cpp's set_swa_pattern), else every
    `every`-th; None when neither says."""
    pattern = g.value(f"{a}.attention.sliding_window_pattern")
    if isinstance(pattern, list):
        if len(pattern) != layers:
            raise ConversionError(f"{g.path}: {a}.attention.sliding_window_pattern has "
                                  f"{len(pattern)} entries for {layers} layers")
        return ["sliding_attention" if p else "full_attention" for p in pattern]
    n = g.get_positive(f"{a}.attention.sliding_window_pattern", every)
    if n is None:
        return None
    return ["sliding_attention" if (i + 1) % n else "full_attention" for i in range(layers)]


# llama.cpp's 27B Gemma 2 / 3 (by layer count) scale q . k by (hidden / heads)^-1/2, the others
# by head_dim^-1/2: what query_pre_attn_scalar is in those checkpoints (it is not in the file)
_GEMMA_27B_LAYERS = {"gemma2": 46, "gemma3": 62}


def _gemma_config(g: GgufModel, a: str, config: dict) -> None:
    """Gemma's keys as llama.cpp reads them: embeddings scaled by sqrtf(hidden) (float32), the
    GELU-tanh GLU; Gemma 2 / 3: the soft-caps (Gemma 2's defaults 50 and 30), the window on the
    layers `attention.sliding_window_pattern` marks (a list, or every n-th layer full: n = 2
    for Gemma 2, 6 for Gemma 3), Gemma 3's local RoPE base `rope.freq_base_swa` (default 1e4)."""
    config.update(hidden_act="gelu_pytorch_tanh", hidden_activation="gelu_pytorch_tanh", dtype="float32")
    if a == "gemma":
        return
    layers = config["num_hidden_layers"]
    config["query_pre_attn_scalar"] = (config["hidden_size"] // config["num_attention_heads"]
                                       if layers == _GEMMA_27B_LAYERS[a] else config["head_dim"])
    softcaps = (50.0, 30.0) if a == "gemma2" else (None, None)
    config["attn_logit_softcapping"] = g.get_float(f"{a}.attn_logit_softcapping", softcaps[0])
    config["final_logit_softcapping"] = g.get_float(f"{a}.final_logit_softcapping", softcaps[1]) or None
    window = config["sliding_window"] if a == "gemma3" else g.get_int(f"{a}.attention.sliding_window", 4096)
    config["sliding_window"] = window
    types = _window_layer_types(g, a, layers, 2 if a == "gemma2" else 6)
    config["layer_types"] = types if window else ["full_attention"] * layers
    if a == "gemma3":
        full = dict(config.pop("rope_scaling") or {"rope_type": "default"})
        full["rope_theta"] = config.pop("rope_theta")
        config["rope_parameters"] = {
            "full_attention": full,
            "sliding_attention": {"rope_type": "default",
                                  "rope_theta": g.get_float(f"{a}.rope.freq_base_swa", 10000.0)}}


def _partial_rotary(g: GgufModel, config: dict, rot: int) -> None:
    """rope.dimension_count -> partial_rotary_factor (always written: GLM's default is 0.5)."""
    head_dim = config["head_dim"]
    factor = rot / head_dim
    if rot > head_dim or int(head_dim * factor) != rot:
        raise ConversionError(f"{g.path}: rope.dimension_count {rot} of head size {head_dim} "
                              f"is not a partial_rotary_factor transformers can express")
    config["partial_rotary_factor"] = factor


def _phi3_config(g: GgufModel, a: str, config: dict, rot: int) -> None:
    """Phi-3's rotary dims, original context and LongRoPE factors, as llama.cpp writes them."""
    if rot != config["head_dim"]:
        _partial_rotary(g, config, rot)
    original = g.get_positive(f"{a}.rope.scaling.original_context_length")
    if original is not None:
        config["original_max_position_embeddings"] = original
    names = ("rope_factors_long.weight", "rope_factors_short.weight")
    present = [n for n in names if n in g.tensors]
    if not present:
        return
    if len(present) == 1:
        raise ConversionError(f"{g.path}: {present[0]} without its pair ({', '.join(names)})")
    factors = {}
    for n in names:
        if g.shape(n) != (rot // 2,):
            raise ConversionError(f"{g.path}: {n} has shape {list(g.shape(n))}, expected "
                                  f"[{rot // 2}] (rope.dimension_count / 2)")
        g.check_type(n)
        factors[n] = [float(x) for x in g.dequantize(n)]
    scaling = {"rope_type": "longrope", "long_factor": factors[names[0]],
               "short_factor": factors[names[1]]}
    attn = g.get_float(f"{a}.rope.scaling.attn_factor")
    if attn is not None:
        # llama.cpp stores transformers' default as float32; keep the exact default then
        orig = original or 4096
        scale = config["max_position_embeddings"] / orig
        default = 1.0 if scale <= 1.0 else math.sqrt(1 + math.log(scale) / math.log(orig))
        if np.float32(default) != np.float32(attn):
            scaling["attention_factor"] = attn
    config["rope_scaling"] = scaling


def _rope_scaling(g: GgufModel, a: str):
    """rope.scaling.* (or the older rope.scale_linear) -> an HF rope_scaling dict or None."""
    kind = g.get_str(f"{a}.rope.scaling.type")
    factor = g.get_float(f"{a}.rope.scaling.factor")
    if kind is None:
        old = g.get_float(f"{a}.rope.scale_linear")
        if old is not None and old != 1.0:
            kind, factor = "linear", old
    if kind in (None, "none"):
        return None
    if kind == "linear":
        if factor is None or not factor > 0:
            raise ConversionError(f"{g.path}: linear rope scaling needs a positive "
                                  f"{a}.rope.scaling.factor, got {factor!r}")
        if factor == 1.0:
            return None
        return {"rope_type": "linear", "factor": factor}
    raise ConversionError(f"{g.path}: rope scaling type {kind!r} is not supported (supported: "
                          f"none, linear, llama3-style rope_freqs and phi3's LongRoPE factors)")


def read_hparams(g: GgufModel, family=None) -> common.HParams:
    family = family or GGUF_FAMILIES[check_architecture(g)]
    config = gguf_config(g, family)
    hp = family.read_hparams(config)
    if config["sliding_window"] and hp.sliding_window is None and hp.sliding_window_layers is None:
        hp.sliding_window = config["sliding_window"]  # a llama file (Mistral): every layer
    if "rope_freqs.weight" in g.tensors:
        # llama.cpp stores Llama 3.1's frequency scaling as one divisor per frequency
        shape = g.shape("rope_freqs.weight")
        if shape != (hp.rope.dim // 2,):
            raise ConversionError(f"{g.path}: rope_freqs.weight has shape {list(shape)}, "
                                  f"expected [{hp.rope.dim // 2}]")
        if hp.rope.rope_type != "default":
            raise ConversionError(f"{g.path}: both rope_freqs.weight and rope scaling type "
                                  f"{hp.rope.rope_type!r}; not supported")
        g.check_type("rope_freqs.weight")
        divisors = g.dequantize("rope_freqs.weight")
        if not np.all(np.isfinite(divisors)) or not np.all(divisors > 0):
            raise ConversionError(f"{g.path}: rope_freqs.weight must be positive and finite")
        inv = torch.from_numpy(hp.rope.inv_freq) / torch.from_numpy(divisors)
        hp.rope.inv_freq = inv.to(torch.float32).numpy().copy()
        hp.rope.rope_type = "llama3"
    return hp


# ---- tensors ----------------------------------------------------------------------------------

def unpermute_rope_rows(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undoes llama.cpp's reordering of attn_q / attn_k rows (weights or biases).

    Within each head of hd rows, HF's order is [a_0 .. a_{hd/2-1}, b_0 .. b_{hd/2-1}] where
    (a_i, b_i) is the pair that RoPE rotates together; llama.cpp stores the pairs adjacent:
    [a_0, b_0, a_1, b_1, ...]. Row 2i + j of a GGUF head is row j*hd/2 + i of the HF head."""
    rows = w.shape[0]
    if rows % (2 * n_head):
        raise ConversionError(f"cannot undo the RoPE row order: {rows} rows in {n_head} heads")
    half = rows // n_head // 2
    rest = w.shape[1:]
    return np.ascontiguousarray(w.reshape(n_head, half, 2, *rest).swapaxes(1, 2).reshape(w.shape))


def _gguf_parts(g: GgufModel, hp: common.HParams, name: str, shape: tuple) -> list:
    """The GGUF tensors (name, shape, heads to un-permute or 0[, rows]) holding one HF tensor's
    rows; with `rows` (start, stop), only those rows of a tensor of that full shape."""
    if name.startswith("layers."):
        _, i, rest = name.split(".", 2)
        b = f"blk.{i}."
        gname = b + GGUF_NAMES[rest]
    else:
        b, rest, gname = "", name, GGUF_NAMES[name]
    q, kv = hp.num_heads * hp.head_dim, hp.num_kv_heads * hp.head_dim
    split = shape[1:]
    if rest == "self_attn.qkv_proj.weight" and gname not in g.tensors and b + "attn_q.weight" in g.tensors:
        # fused in the HF checkpoint, separate in this file (llama.cpp's loader takes either)
        return [(b + "attn_q.weight", (q, *split), 0), (b + "attn_k.weight", (kv, *split), 0),
                (b + "attn_v.weight", (kv, *split), 0)]
    kind = rest.rsplit(".", 1)[-1]
    if (rest.startswith(("self_attn.q_proj.", "self_attn.k_proj.", "self_attn.v_proj."))
            and gname not in g.tensors and b + "attn_qkv." + kind in g.tensors):
        # separate in the HF checkpoint, fused in this file (THUDM's ChatGLM layout: q, k, v rows)
        start = {"q": 0, "k": q, "v": q + kv}[rest[len("self_attn.")]]
        return [(b + "attn_qkv." + kind, (q + 2 * kv, *split), 0, (start, start + shape[0]))]
    if rest == "mlp.gate_up_proj.weight" and b + "ffn_gate.weight" in g.tensors:
        half = shape[0] // 2
        return [(b + "ffn_gate.weight", (half, *split), 0), (b + "ffn_up.weight", (half, *split), 0)]
    heads = 0
    if g.arch in PERMUTED_ARCHITECTURES:
        heads = {"attn_q": hp.num_heads, "attn_k": hp.num_kv_heads}.get(gname.split(".")[-2], 0)
    return [(gname, shape, heads)]


def add_tensors(writer, g: GgufModel, family, hp: common.HParams, dtype: str) -> bool:
    """Declares every `.flm` tensor on the writer, laid out as the family lays out its HF
    tensors (the data is dequantized when the writer asks for it). Returns whether the output
    head is tied to the embedding."""
    used = set()
    kept = {}  # (GGUF types, .flm dtype, exactly) -> tensors: quantization_summary's input
    tied = "output.weight" not in g.tensors
    quantize.tell_policy(writer.dtype_policy, hp.num_layers, tied)

    buffers = {}  # part -> float32 buffer for tensors widened to be quantized (GgufModel.dequantize)

    def widened(part: int, n: int) -> np.ndarray:
        if part not in buffers or buffers[part].size < n:
            buffers.pop(part, None)
            buffers[part] = np.empty(n, dtype=np.float32)
        return buffers[part]

    def check(name: str, shape: tuple) -> None:
        if name not in g.tensors:
            raise ConversionError(f"{g.path}: missing tensor {name}")
        actual = g.shape(name)
        if actual != tuple(shape):
            raise ConversionError(f"{g.path}: tensor {name} has shape {list(actual)} (outermost "
                                  f"first), the metadata implies {list(shape)}")
        g.check_type(name)
        used.add(name)

    def declare(spec: common.TensorSpec):
        if spec.name.endswith("norm.weight"):  # norms have llama.cpp's names (and its 1 + w, spec.shift)
            parts = [(spec.name, spec.parts[0][1], 0, None)]
        else:
            parts = [(*p, None)[:4] for name, shape in spec.parts for p in _gguf_parts(g, hp, name, shape)]
        for name, shape, _, _ in parts:
            check(name, shape)
        rows = [s[0] if r is None else r[1] - r[0] for _, s, _, r in parts]
        shape = list(parts[0][1])
        shape[0] = sum(rows)
        out_dtype = dtype if spec.matrix else "f32"
        types = [g.type_name(name) for name, _, _, _ in parts]
        policy = writer.dtype_policy
        if isinstance(policy, quantize.DtypePolicy) and policy.default == "auto":
            policy.native[spec.name] = auto_dtype(types) if spec.matrix else "f32"
        target = policy(spec.name, tuple(shape)) if policy is not None else out_dtype
        exact = all(_EXACT.get(t) == target and g.exactly_held(n) for t, (n, _, _, _) in zip(types, parts))
        kept[(tuple(sorted(set(types))), target, exact)] = kept.get((tuple(sorted(set(types))), target, exact), 0) + 1

        def produce():
            arrays, grids = [], []
            for i, (name, _, heads, r) in enumerate(parts):
                if exact:
                    _, grid, a = g.on_grid(name)
                elif target in quantize.QUANT:  # quantized before the next tensor is made
                    a = g.dequantize(name, out=widened(i, g.tensors[name].n_elements), keep_f16=quantize.takes_f16(),
                                     keep_bf16=quantize.takes_bf16())
                    grid = None
                else:
                    a, grid = g.dequantize(name), None
                def rows_of(x):  # the row order and range this part takes, for weights and grids alike
                    if heads:
                        x = unpermute_rope_rows(x, heads)
                    return x if r is None else np.ascontiguousarray(x[r[0]:r[1]])
                arrays.append(rows_of(a))
                if grid is not None:
                    grids.append(grid.map_rows(rows_of))
            if not exact and len(arrays) > 1 and spec.matrix and target in quantize.QUANT:
                return quantize.RowBlocks(arrays)  # quantized where they lie, not copied together
            a = arrays[0] if len(arrays) == 1 else np.concatenate(arrays, axis=0)
            if exact:
                return quantize.OnGrid(a, quantize.Grid.stack(grids))
            if a.dtype in (np.float16, quantize.BF16) and target in quantize.QUANT:  # (keep_f16, keep_bf16 above)
                return a
            return common.to_numpy(torch.from_numpy(a), out_dtype, spec.name)

        writer.add_tensor(spec.name, out_dtype, tuple(shape), produce)

    for spec in common.model_tensors(hp, family.layer_tensors):
        declare(spec)
    if not tied:
        declare(common.output_tensor(hp))

    # folded into the rope keys by read_hparams
    ignored = {"rope_freqs.weight", "rope_factors_long.weight", "rope_factors_short.weight"}
    extra = [n for n in g.tensors
             if n not in used and n not in ignored and not n.endswith(".attn_rot_embd")]
    if extra:
        shown = ", ".join(extra[:5]) + (f" and {len(extra) - 5} more" if len(extra) > 5 else "")
        raise ConversionError(f"{g.path}: tensors this {hp.arch} model does not use: {shown}")
    writer.add_string("general.quantization", quantization_summary(kept))
    return tied


def quantization_summary(kept: dict) -> str:
    """One line for `fastllm info`: which GGUF tensors went over exactly, which were re-rounded."""
    exact, other = [], []
    for (types, target, is_exact), count in sorted(kept.items()):
        src = "+".join(types)
        if is_exact or (len(types) == 1 and types[0] in ("F32", "F16", "BF16") and target == types[0].lower()):
            exact.append(f"{src}->{target} {count}")
        else:
            other.append(f"{src}->{target} {count}")
    line = "from GGUF: kept exactly: " + (", ".join(exact) or "none")
    return line + ("; re-rounded: " + ", ".join(other) if other else "")


# ---- tokenizer --------------------------------------------------------------------------------

# llama.cpp skips the merges for a pre-token that is itself a token with these pre-tokenizers
# (as `tokenizers` does with Llama 3's ignore_merges)
_IGNORE_MERGES_PRE = ("llama-bpe", "llama3", "glm4")


def _token_id(g: GgufModel, key: str, vocab: int) -> int:
    v = g.get_int(key)
    if v is None:
        return -1
    if not 0 <= v < vocab:
        # some converters write -1 (as uint32 0xFFFFFFFF) for "none"
        if v in (-1, 0xFFFFFFFF):
            return -1
        raise ConversionError(f"{g.path}: {key} = {v} is outside the vocabulary ({vocab})")
    return v


def _pad(tokens: list, vocab: int, g: GgufModel) -> int:
    """Appends `<extra_N>` tokens up to vocab; returns how many."""
    n = len(tokens)
    if n > vocab:
        raise ConversionError(f"{g.path}: {n} tokens, more than the vocabulary size {vocab}")
    existing = set(tokens)
    k = 0
    while len(tokens) < vocab:
        piece = f"<extra_{k}>"
        k += 1
        if piece not in existing:
            tokens.append(piece)
    return vocab - n


def read_tokenizer(g: GgufModel, vocab: int):
    """hf_tokenizer.TokenizerInfo (`spm`) or bpe_tokenizer.BpeTokenizerInfo (`bpe`) from
    tokenizer.ggml.*."""
    model = g.get_str("tokenizer.ggml.model")
    if model is None:
        raise ConversionError(f"{g.path}: no tokenizer (tokenizer.ggml.model is missing)")
    if model not in ("llama", "gpt2"):
        raise ConversionError(f"{g.path}: GGUF tokenizer model {model!r} is not supported "
                              f"(supported: llama (SentencePiece), gpt2 (byte-level BPE))")
    tokens = g.get_list("tokenizer.ggml.tokens", str, "strings", _REQUIRED)
    n = len(tokens)
    if not n:
        raise ConversionError(f"{g.path}: tokenizer.ggml.tokens is empty")
    gtypes = g.get_list("tokenizer.ggml.token_type", int, "integers", [GGUF_NORMAL] * n)
    if len(gtypes) != n:
        raise ConversionError(f"{g.path}: {n} tokens but {len(gtypes)} token types")
    tokens = list(tokens)

    bos = _token_id(g, "tokenizer.ggml.bos_token_id", vocab)
    eos = _token_id(g, "tokenizer.ggml.eos_token_id", vocab)
    unk = _token_id(g, "tokenizer.ggml.unknown_token_id", vocab)
    pad = _token_id(g, "tokenizer.ggml.padding_token_id", vocab)
    eos_ids = []
    for key in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id",
                "tokenizer.ggml.eom_token_id"):
        i = _token_id(g, key, vocab)
        if i >= 0 and i not in eos_ids:
            eos_ids.append(i)
    chat_template = g.get_str("tokenizer.chat_template")

    if model == "llama":
        scores = g.get_list("tokenizer.ggml.scores", (int, float), "numbers", [0.0] * n)
        if len(scores) != n:
            raise ConversionError(f"{g.path}: {n} tokens but {len(scores)} scores")
        types = []
        for i, t in enumerate(gtypes):
            if t == 0:
                t = GGUF_NORMAL
            if not GGUF_NORMAL <= t <= GGUF_BYTE:
                raise ConversionError(f"{g.path}: token {i} ({tokens[i]!r}) has unknown type {t}")
            types.append(t)  # GGUF's token types are SentencePiece's
        n_padded = _pad(tokens, vocab, g)
        scores = [float(s) for s in scores] + [0.0] * n_padded
        types += [GGUF_UNUSED] * n_padded
        info = hf_tokenizer.TokenizerInfo(
            tokens=tokens, scores=scores, types=types,
            bos_id=bos, eos_id=eos, unk_id=unk, pad_id=pad, eos_ids=eos_ids,
            add_bos=g.get_bool("tokenizer.ggml.add_bos_token", True),
            add_dummy_prefix=g.get_bool("tokenizer.ggml.add_space_prefix", True),
            remove_extra_whitespaces=g.get_bool("tokenizer.ggml.remove_extra_whitespaces", False),
            byte_fallback=any(_BYTE_PIECE.fullmatch(t) for t in tokens),
            chat_template=chat_template,
            n_padded=n_padded,
        )
        # GGUF keeps no added-token flags, so its text means what llama.cpp makes of it: text
        # after an added token gets the dummy prefix, and for phi3 every control token but
        # <unk>, <s>, </s> and <|endoftext|> takes the whitespace after it (as Phi-3's own
        # tokenizer.json says too).
        info.prefix_after_added = "always"
        if g.arch == "phi3":
            info.added_rstrip = [i for i, (t, ty) in enumerate(zip(tokens, types)) if ty == GGUF_CONTROL
                                 and t not in ("<unk>", "<s>", "</s>", "<|endoftext|>")]
        return info

    pre_name = g.get_str("tokenizer.ggml.pre")
    if pre_name is None:
        raise ConversionError(f"{g.path}: byte-level BPE tokenizer without tokenizer.ggml.pre: "
                              f"its pre-tokenizer is unknown (supported: {', '.join(BPE_PRE)})")
    if pre_name not in BPE_PRE:
        raise ConversionError(f"{g.path}: BPE pre-tokenizer {pre_name!r} is not supported "
                              f"(supported: {', '.join(BPE_PRE)})")
    merges = g.get_list("tokenizer.ggml.merges", str, "strings", _REQUIRED)
    types = []
    for i, t in enumerate(gtypes):
        if t not in _BPE_TYPES:
            raise ConversionError(f"{g.path}: token {i} ({tokens[i]!r}) has type {t}, which a "
                                  f"byte-level BPE vocabulary cannot have")
        types.append(_BPE_TYPES[t])
    return bpe_tokenizer.bpe_tokenizer_info(
        tokens, types, merges, BPE_PRE[pre_name], vocab,
        bos_id=bos, eos_id=eos, unk_id=unk, pad_id=pad, eos_ids=eos_ids,
        add_bos=g.get_bool("tokenizer.ggml.add_bos_token", False),
        ignore_merges=pre_name in _IGNORE_MERGES_PRE,
        chat_template=chat_template, where=str(g.path))


# ---- the conversion ---------------------------------------------------------------------------

def convert_gguf(model_path, out_path, dtype: str = "f32", progress: bool = True,
                 group_size: int = 32, dtype_config=(), dtype_policy=None, model_type=None) -> str:
    """Converts the GGUF file `model_path` to `out_path`; returns out_path.
    dtype, group_size, dtype_config: as for convert.convert (quantize.DtypePolicy picks each
    tensor's dtype from them), or dtype_policy: an already built policy; model_type: the family
    to write (see gguf_family). Raises ConversionError for anything wrong with the input; on any
    error nothing is written."""
    if dtype_policy is None:
        dtype_policy = quantize.DtypePolicy(dtype, group_size, dtype_config)
    out_path = Path(out_path)
    g = read_gguf(model_path)
    family = gguf_family(g, model_type)
    if family.ARCH == "bert":  # an encoder: its own layout and vocabulary (gguf_bert.py)
        from .gguf_bert import convert_bert_gguf
        return convert_bert_gguf(g, out_path, dtype, dtype_policy, progress)
    hp = read_hparams(g, family)
    tok = read_tokenizer(g, hp.vocab_size)

    writer = FlmWriter(out_path, dtype_policy=dtype_policy)
    tied = add_tensors(writer, g, family, hp, "f32")  # float data; the policy picks each dtype
    writer.add_string("general.architecture", family.ARCH)
    writer.add_string("general.name", g.get_str("general.name") or Path(model_path).stem)
    writer.add_string("general.source", "gguf")
    family.add_metadata(writer, hp, tied)
    hf_tokenizer.add_tokenizer_metadata(writer, tok)  # spm or bpe keys
    writer.write(progress=progress, desc=f"{out_path.name} ({dtype})")
    return str(out_path)
