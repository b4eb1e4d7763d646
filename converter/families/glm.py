"""GLM-4 (GlmForCausalLM, e.g. glm-4-9b-chat-hf) and THUDM's own ChatGLM2 / ChatGLM3 /
glm-4-9b checkpoints (remote code: `ChatGLMModel` / `ChatGLMForConditionalGeneration`,
model_type "chatglm"), which compute the same decoder:

  q/k/v biases (attention_bias / add_qkv_bias), none on the output or the MLP; multi-query
  groups (num_key_value_heads / multi_query_group_num); gate|up fused (mlp.gate_up_proj /
  mlp.dense_h_to_4h: gate rows first, the MLP chunks it in two); RMSNorm; RoPE over the first
  half of each head (partial_rotary_factor, GlmConfig's default 0.5; ChatGLM: rotary_dim
  kv_channels // 2) in interleaved pairs (2i, 2i + 1) -- the pairing is the C++ family's
  (arch/glm.cpp), not a key.

THUDM's layout is mapped onto GlmForCausalLM's names (CHATGLM_NAMES, ChatGlmCheckpoint) and its
config onto GlmConfig's fields (chatglm_config); transformers' GlmForCausalLM is the reference
for both. What THUDM's modeling_chatglm.py does that GLM does not is refused by name.
"""

from __future__ import annotations

import re

from ..errors import ConversionError
from . import common

ARCH = "glm"
HF_ARCHITECTURES = ("GlmForCausalLM", "ChatGLMModel", "ChatGLMForConditionalGeneration")
MODEL_TYPE = "glm"
CHATGLM_MODEL_TYPE = "chatglm"
MODEL_TYPES = (MODEL_TYPE, CHATGLM_MODEL_TYPE)  # a config.json without `architectures`
GGUF_ARCH = "chatglm"  # llama.cpp writes GlmForCausalLM and THUDM's checkpoints as chatglm
ADD_BOS_DEFAULT = False  # GLM prompts start with [gMASK]<sop> (ChatGLM3: [gMASK]sop), from the template
# GlmConfig's defaults (transformers 5.24)
DEFAULTS = dict(num_key_value_heads=2, head_dim=128, max_position_embeddings=131072,
                rms_norm_eps=1.5625e-07)
PARTIAL_ROTARY_DEFAULT = 0.5  # GlmConfig.__post_init__: partial_rotary_factor when none is given
ROPE = dict(types=("default",), partial_rotary=True)

add_metadata = common.add_metadata


def is_chatglm(config: dict) -> bool:
    archs = config.get("architectures") or []
    return config.get("model_type") == CHATGLM_MODEL_TYPE or any(
        a in ("ChatGLMModel", "ChatGLMForConditionalGeneration") for a in archs)


def read_hparams(config: dict) -> common.HParams:
    if is_chatglm(config):
        config = chatglm_config(config)
    rope_params = config.get("rope_scaling") or config.get("rope_parameters") or {}
    if (isinstance(rope_params, dict) and "partial_rotary_factor" not in rope_params
            and "partial_rotary_factor" not in config):
        config = dict(config, partial_rotary_factor=PARTIAL_ROTARY_DEFAULT)
    return common.read_hparams(config, ARCH, DEFAULTS, rope_options=ROPE,
                               qkv_bias=common.flag(config, "attention_bias", True))


# THUDM's tokenization_chatglm.py (ChatGLM3): SPTokenizer appends these after the SentencePiece
# pieces, in this order, and (encode_special_tokens, as its apply_chat_template path uses) finds
# any of them in text and encodes the text between them piece by piece. ChatGLM2's code has the
# first five only (and no role tokens to find in text).
CHATGLM_SPECIAL = ("[MASK]", "[gMASK]", "[sMASK]", "sop", "eop",
                   "<|system|>", "<|user|>", "<|assistant|>", "<|observation|>")


def spm_code_tokens(ckpt, n_pieces: int) -> dict:
    """{id: text} of the tokens THUDM's tokenizer code adds (none for GlmForCausalLM folders,
    whose tokenizer.json declares its own): ChatGLM3's nine, or ChatGLM2's five when the config
    names a chatglm2 checkpoint (`_name_or_path`, which THUDM's configs carry)."""
    if not is_chatglm(ckpt.config):
        return {}
    chatglm2 = "chatglm2" in str(ckpt.config.get("_name_or_path", "")).lower()
    tokens = CHATGLM_SPECIAL[:5] if chatglm2 else CHATGLM_SPECIAL
    return {n_pieces + k: t for k, t in enumerate(tokens)}


def layer_tensors(hp: common.HParams, i: int) -> list:
    return common.decoder_layer(hp, i, gate_up=("gate_up_proj",))


def add_tensors(writer, ckpt, hp: common.HParams, dtype: str) -> bool:
    if is_chatglm(ckpt.config):
        ckpt = ChatGlmCheckpoint(ckpt, hp)
    return common.add_tensors(writer, ckpt, hp, dtype, layer_tensors)


# ---- THUDM's ChatGLM2 / ChatGLM3 / glm-4-9b layout --------------------------------------------

# ChatGLMConfig's defaults (THUDM's configuration_chatglm.py) for the flags read below
CHATGLM_FLAGS = dict(multi_query_attention=False, rmsnorm=True, post_layer_norm=True,
                     apply_residual_connection_post_layernorm=False, add_bias_linear=False,
                     add_qkv_bias=False, original_rope=True)
# (flag, the value GLM's decoder computes, what another value would mean)
CHATGLM_REQUIRED = (
    ("multi_query_attention", True, "per-head interleaved q|k|v rows, not in published checkpoints"),
    ("rmsnorm", True, "LayerNorm instead of RMSNorm"),
    ("post_layer_norm", True, "no final norm"),
    ("apply_residual_connection_post_layernorm", False, "residuals taken after the norms"),
    ("add_bias_linear", False, "biases on the output and MLP projections"),
    ("original_rope", True, "a RoPE variant other than THUDM's original one"),
)


def chatglm_config(config: dict) -> dict:
    """A GlmConfig-style dict for THUDM's ChatGLMConfig fields (what GlmForCausalLM computes the
    same way): multi_query_group_num -> num_key_value_heads, kv_channels -> head_dim (and
    rotary_dim = kv_channels // 2), ffn_hidden_size -> intermediate_size, num_layers ->
    num_hidden_layers, padded_vocab_size (the embedding rows) -> vocab_size, seq_length ->
    max_position_embeddings, layernorm_epsilon -> rms_norm_eps, 10000 * rope_ratio ->
    rope_theta, add_qkv_bias -> attention_bias."""
    def get(key):
        v = config.get(key, CHATGLM_FLAGS.get(key))
        if key in CHATGLM_FLAGS and not isinstance(v, bool):
            raise ConversionError(f"config.json: {key} must be true or false, got {v!r}")
        return v
    for key, needed, meaning in CHATGLM_REQUIRED:
        if get(key) != needed:
            raise ConversionError(f"config.json: ChatGLM with {key} = {str(get(key)).lower()} "
                                  f"({meaning}) is not supported")
    if config.get("quantization_bit"):
        raise ConversionError(f"config.json: quantization_bit = {config['quantization_bit']}: "
                              f"THUDM's quantized checkpoints are not supported (convert the "
                              f"float checkpoint and use --dtype int8 / int4)")
    if config.get("pre_seq_len") is not None:
        raise ConversionError("config.json: pre_seq_len is set: P-tuning v2 prefix encoders are "
                              "not supported")
    heads = common.positive_int(config, "num_attention_heads")
    hidden = common.positive_int(config, "hidden_size")
    groups = common.positive_int(config, "multi_query_group_num")
    if heads % groups:
        raise ConversionError(f"config.json: multi_query_group_num ({groups}) does not divide "
                              f"num_attention_heads ({heads})")
    ratio = config.get("rope_ratio", 1)
    if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not ratio > 0:
        raise ConversionError(f"config.json: invalid rope_ratio {ratio!r}")
    out = {
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "num_key_value_heads": groups,
        "head_dim": common.positive_int(config, "kv_channels", 128),  # ChatGLMConfig's default
        "intermediate_size": common.positive_int(config, "ffn_hidden_size"),
        "num_hidden_layers": common.positive_int(config, "num_layers"),
        "vocab_size": common.positive_int(config, "padded_vocab_size"),
        "max_position_embeddings": common.positive_int(config, "seq_length"),
        "rms_norm_eps": config.get("layernorm_epsilon", 1e-5),
        "rope_theta": 10000 * ratio,  # RotaryEmbedding.forward_impl: base * rope_ratio
        "partial_rotary_factor": 0.5,  # rotary_dim = kv_channels // 2, as GLM's 0.5
        "attention_bias": get("add_qkv_bias"),
        "tie_word_embeddings": common.flag(config, "tie_word_embeddings", False),
        "hidden_act": "silu",  # swiglu: silu(first half) * second half
    }
    return out


# THUDM's tensor names -> GlmForCausalLM's (the state dict transformers' GlmForCausalLM loads).
# query_key_value holds q rows, then k, then v (multi_query_attention); its bias too. A test
# (tests/test_families_glm.py) builds a ChatGLM3-layout checkpoint from a GlmForCausalLM with
# the inverse of this table and checks the conversion against transformers on the original.
CHATGLM_NAMES = (
    (r"transformer\.embedding\.word_embeddings\.weight", "model.embed_tokens.weight"),
    (r"transformer\.encoder\.layers\.(\d+)\.input_layernorm\.weight", r"model.layers.\1.input_layernorm.weight"),
    (r"transformer\.encoder\.layers\.(\d+)\.self_attention\.query_key_value\.(weight|bias)",
     r"model.layers.\1.self_attn.{q,k,v}_proj.\2"),
    (r"transformer\.encoder\.layers\.(\d+)\.self_attention\.dense\.weight", r"model.layers.\1.self_attn.o_proj.weight"),
    (r"transformer\.encoder\.layers\.(\d+)\.post_attention_layernorm\.weight",
     r"model.layers.\1.post_attention_layernorm.weight"),
    (r"transformer\.encoder\.layers\.(\d+)\.mlp\.dense_h_to_4h\.weight", r"model.layers.\1.mlp.gate_up_proj.weight"),
    (r"transformer\.encoder\.layers\.(\d+)\.mlp\.dense_4h_to_h\.weight", r"model.layers.\1.mlp.down_proj.weight"),
    (r"transformer\.encoder\.final_layernorm\.weight", "model.norm.weight"),
    (r"transformer\.output_layer\.weight", "lm_head.weight"),
)
CHATGLM_IGNORED = re.compile(r"transformer\.rotary_pos_emb\.inv_freq")  # a buffer, recomputed


class ChatGlmCheckpoint:
    """A THUDM-layout checkpoint seen with GlmForCausalLM's tensor names: query_key_value is
    split into q_proj / k_proj / v_proj rows. Names the table does not know keep their own, so
    that add_tensors reports them as unused."""

    def __init__(self, ckpt, hp: common.HParams):
        self.ckpt, self.path, self.config = ckpt, ckpt.path, ckpt.config
        q, kv = hp.num_heads * hp.head_dim, hp.num_kv_heads * hp.head_dim
        rows = {"q": (0, q), "k": (q, q + kv), "v": (q + kv, q + 2 * kv)}
        self._map = {}  # GLM name -> (THUDM name, row range or None)
        for name in ckpt.names():
            if CHATGLM_IGNORED.fullmatch(name):
                continue
            for pattern, target in CHATGLM_NAMES:
                m = re.fullmatch(pattern, name)
                if m:
                    glm = m.expand(target)
                    if "{q,k,v}" in glm:
                        total = ckpt.shape(name)[0]
                        if total != q + 2 * kv:
                            raise ConversionError(f"tensor {name} has {total} rows, the config "
                                                  f"implies q + k + v = {q} + {kv} + {kv}")
                        for part, span in rows.items():
                            self._map[glm.replace("{q,k,v}", part)] = (name, span)
                    else:
                        self._map[glm] = (name, None)
                    break
            else:
                self._map[name] = (name, None)

    def names(self) -> list:
        return list(self._map)

    def has(self, name: str) -> bool:
        return name in self._map

    def shape(self, name: str) -> tuple:
        src, span = self._map[name]
        shape = tuple(self.ckpt.shape(src))
        return shape if span is None else (span[1] - span[0], *shape[1:])

    def get(self, name: str):
        src, span = self._map[name]
        t = self.ckpt.get(src)
        return t if span is None else t[span[0]:span[1]]
