"""Raw ctypes layer: mirrors include/fastllm.h one to one (structs, enums, prototypes).

Nothing Pythonic lives here; the classes in model.py build on it. Keep this file in step with the
header: FASTLLM_ABI_VERSION below must equal the header's.
"""
from __future__ import annotations

import ctypes
import os
import sys
from ctypes import (CFUNCTYPE, POINTER, Structure, c_char, c_char_p, c_double, c_float, c_int, c_int32, c_int64, c_size_t,
                    c_uint32, c_uint64, c_void_p)
from pathlib import Path

FASTLLM_ABI_VERSION = 13

# fastllm_status
OK = 0
ERR_INVALID_ARGUMENT = 1
ERR_IO = 2
ERR_BAD_FORMAT = 3
ERR_UNSUPPORTED = 4
ERR_OUT_OF_MEMORY = 5
ERR_CONTEXT_FULL = 6
ERR_BUFFER_TOO_SMALL = 7
ERR_TOKEN_OUT_OF_RANGE = 8
ERR_INTERNAL = 9
ERR_CANCELLED = 10

# fastllm_kv_type
KV_TYPES = {"f32": 0, "f16": 1, "q8": 2}

# fastllm_logits_mode
LOGITS_NONE, LOGITS_LAST, LOGITS_ALL = 0, 1, 2

# fastllm_stop_reason
STOP_REASONS = {0: "eos", 1: "max_tokens", 2: "stop_string", 3: "callback", 4: "context_full", 5: "cancelled",
                6: "grammar"}


class ModelParams(Structure):
    _fields_ = [("n_threads", c_int32), ("use_mmap", c_int32), ("device", c_char_p), ("n_gpu_layers", c_int32)]


class ModelInfo(Structure):
    _fields_ = [
        ("architecture", c_char_p), ("name", c_char_p), ("vocab_size", c_int32), ("context_length", c_int32),
        ("hidden_size", c_int32), ("num_layers", c_int32), ("num_heads", c_int32), ("num_kv_heads", c_int32),
        ("head_dim", c_int32), ("bos_id", c_int32), ("eos_id", c_int32), ("weight_dtype", c_char_p),
        ("n_params", c_uint64), ("backend", c_char_p), ("device_weight_bytes", c_uint64),
    ]


class DeviceInfo(Structure):
    _fields_ = [
        ("index", c_int32), ("usable", c_int32), ("name", c_char * 256), ("vendor", c_char * 32), ("type", c_char * 16),
        ("missing", c_char * 128), ("memory_bytes", c_uint64), ("api_version", c_uint32),
    ]


class SessionParams(Structure):
    _fields_ = [("n_ctx", c_int32), ("n_batch", c_int32), ("n_threads", c_int32), ("type_k", c_int32),
                ("type_v", c_int32), ("context_shift", c_int32), ("n_keep", c_int32), ("n_discard", c_int32),
                ("swa_full", c_int32)]


class SessionMemoryInfo(Structure):
    _fields_ = [("kv_bytes", c_uint64), ("kv_shared_bytes", c_uint64), ("kv_bytes_per_token", c_uint64),
                ("kv_capacity_bytes", c_uint64), ("session_bytes", c_uint64), ("compute_bytes", c_uint64)]


class SpeculativeParams(Structure):
    _fields_ = [("draft_model", c_void_p), ("n_draft", c_int32), ("ngram_min", c_int32), ("ngram_max", c_int32),
                ("p_min", c_float)]


class SamplingParams(Structure):
    _fields_ = [
        ("max_new_tokens", c_int32), ("temperature", c_float), ("top_k", c_int32), ("top_p", c_float),
        ("min_p", c_float), ("repetition_penalty", c_float), ("repeat_last_n", c_int32), ("seed", c_uint64),
        ("stop", POINTER(c_char_p)), ("n_stop", c_int32), ("ignore_eos", c_int32), ("grammar", c_char_p),
        ("json_schema", c_char_p), ("grammar_triggers", POINTER(c_char_p)), ("n_grammar_triggers", c_int32),
    ]


class GenerationResult(Structure):
    _fields_ = [
        ("n_prompt_tokens", c_int32), ("n_generated_tokens", c_int32), ("stop_reason", c_int),
        ("prompt_ms", c_double), ("generate_ms", c_double),
    ]


class ChatMessage(Structure):
    _fields_ = [("role", c_char_p), ("content", c_char_p)]


# fastllm_chat_params.enable_thinking
THINKING_UNSET, THINKING_OFF, THINKING_ON = -1, 0, 1


class ChatParams(Structure):
    _fields_ = [("add_generation_prompt", c_int32), ("enable_thinking", c_int32),
                ("reasoning_content", POINTER(c_char_p))]


StreamCallback = CFUNCTYPE(c_int, POINTER(c_char), c_size_t, c_void_p)
class StepParams(Structure):
    _fields_ = [("max_prompt_tokens", c_int32)]


class EmbedParams(Structure):
    _fields_ = [("pooling", c_int32), ("normalize", c_int32), ("truncate", c_int32), ("add_special", c_int32),
                ("n_threads", c_int32), ("n_batch", c_int32)]


class RerankParams(Structure):
    _fields_ = [("normalize", c_int32), ("truncate", c_int32), ("n_threads", c_int32), ("n_batch", c_int32),
                ("instruction", c_char_p)]


# fastllm_pooling
POOLING_MODEL, POOLING_NONE, POOLING_MEAN, POOLING_CLS, POOLING_LAST = -1, 0, 1, 2, 3


LogCallback = CFUNCTYPE(None, c_int, c_char_p, c_void_p)

# fastllm_log_level
LOG_ERROR, LOG_WARN, LOG_INFO, LOG_DEBUG = 0, 1, 2, 3

_PROTOTYPES = {
    "fastllm_version": (c_char_p, []),
    "fastllm_abi_version": (c_int, []),
    "fastllm_status_name": (c_char_p, [c_int]),
    "fastllm_last_error": (c_char_p, []),
    "fastllm_isa": (c_char_p, []),
    "fastllm_log_set": (None, [LogCallback, c_void_p]),
    "fastllm_model_default_params": (ModelParams, []),
    "fastllm_model_load": (c_int, [c_char_p, POINTER(ModelParams), POINTER(c_void_p)]),
    "fastllm_model_load_from_memory": (c_int, [c_char_p, c_size_t, POINTER(ModelParams), POINTER(c_void_p)]),
    "fastllm_model_free": (None, [c_void_p]),
    "fastllm_model_get_info": (c_int, [c_void_p, POINTER(ModelInfo)]),
    "fastllm_devices": (c_int, [POINTER(DeviceInfo), c_int32, POINTER(c_int32)]),
    "fastllm_model_chat_template": (c_char_p, [c_void_p]),
    "fastllm_tokenize": (c_int, [c_void_p, c_char_p, c_size_t, c_int, POINTER(c_int32), c_size_t, POINTER(c_size_t)]),
    "fastllm_detokenize": (c_int, [c_void_p, POINTER(c_int32), c_size_t, c_char_p, c_size_t, POINTER(c_size_t)]),
    "fastllm_token_to_piece": (c_int, [c_void_p, c_int32, c_char_p, c_size_t, POINTER(c_size_t)]),
    "fastllm_embed_default_params": (EmbedParams, []),
    "fastllm_embed": (c_int, [c_void_p, POINTER(c_char_p), c_size_t, POINTER(EmbedParams), POINTER(c_float), c_size_t,
                              POINTER(c_size_t)]),
    "fastllm_embed_tokens": (c_int, [c_void_p, POINTER(POINTER(c_int32)), POINTER(c_size_t), c_size_t,
                                     POINTER(EmbedParams), POINTER(c_float), c_size_t, POINTER(c_size_t)]),
    "fastllm_rerank_default_params": (RerankParams, []),
    "fastllm_rerank": (c_int, [c_void_p, c_char_p, POINTER(c_char_p), c_size_t, POINTER(RerankParams), POINTER(c_float)]),
    "fastllm_chat_apply_template": (c_int, [c_void_p, c_char_p, POINTER(ChatMessage), c_size_t, c_int, c_char_p,
                                            c_size_t, POINTER(c_size_t)]),
    "fastllm_chat_default_params": (ChatParams, []),
    "fastllm_chat_apply_template_v2": (c_int, [c_void_p, c_char_p, POINTER(ChatMessage), c_size_t, POINTER(ChatParams),
                                               c_char_p, c_size_t, POINTER(c_size_t)]),
    "fastllm_chat_apply_template_json": (c_int, [c_void_p, c_char_p, c_char_p, c_char_p, c_size_t, POINTER(c_size_t)]),
    "fastllm_chat_parse_tool_calls": (c_int, [c_void_p, c_char_p, c_char_p, c_char_p, c_char_p, c_size_t,
                                              POINTER(c_size_t)]),
    "fastllm_chat_tool_text_safe": (c_int, [c_void_p, c_char_p, c_char_p, c_int, POINTER(c_size_t)]),
    "fastllm_chat_tool_grammar": (c_int, [c_void_p, c_char_p, c_char_p, c_char_p, c_int, c_char_p, c_size_t,
                                          POINTER(c_size_t)]),
    "fastllm_chat_tool_triggers": (c_int, [c_void_p, c_char_p, c_char_p, c_size_t, POINTER(c_size_t)]),
    "fastllm_template_render": (c_int, [c_char_p, c_char_p, c_char_p, c_size_t, POINTER(c_size_t)]),
    "fastllm_session_truncate": (c_int, [c_void_p, c_int32]),
    "fastllm_session_default_params": (SessionParams, []),
    "fastllm_session_create": (c_int, [c_void_p, POINTER(SessionParams), POINTER(c_void_p)]),
    "fastllm_session_free": (None, [c_void_p]),
    "fastllm_session_reset": (c_int, [c_void_p]),
    "fastllm_session_n_tokens": (c_int32, [c_void_p]),
    "fastllm_session_n_cached": (c_int32, [c_void_p]),
    "fastllm_session_n_ctx": (c_int32, [c_void_p]),
    "fastllm_session_get_tokens": (c_int, [c_void_p, POINTER(c_int32), c_size_t, POINTER(c_size_t)]),
    "fastllm_session_eval": (c_int, [c_void_p, POINTER(c_int32), c_size_t, c_int, POINTER(c_float)]),
    "fastllm_sampling_default_params": (SamplingParams, []),
    "fastllm_session_generate": (c_int, [c_void_p, POINTER(c_int32), c_size_t, POINTER(SamplingParams), StreamCallback,
                                         c_void_p, POINTER(GenerationResult)]),
    "fastllm_session_begin_generation": (c_int, [c_void_p, POINTER(c_int32), c_size_t, POINTER(SamplingParams),
                                                 StreamCallback, c_void_p]),
    "fastllm_generate_step": (c_int, [POINTER(c_void_p), c_size_t, POINTER(c_int32)]),
    "fastllm_session_begin_generation_deferred": (c_int, [c_void_p, POINTER(c_int32), c_size_t,
                                                          POINTER(SamplingParams), StreamCallback, c_void_p]),
    "fastllm_step_default_params": (StepParams, []),
    "fastllm_generate_step_ex": (c_int, [POINTER(c_void_p), c_size_t, POINTER(StepParams), POINTER(c_int32)]),
    "fastllm_session_is_generating": (c_int, [c_void_p]),
    "fastllm_session_generation_result": (c_int, [c_void_p, POINTER(GenerationResult)]),
    "fastllm_session_cancel_generation": (c_int, [c_void_p]),
    # fastllm_status fastllm_json_schema_to_grammar(const char *schema, char *out, size_t out_capacity, size_t *out_len)
    "fastllm_json_schema_to_grammar": (c_int, [c_char_p, c_char_p, c_size_t, POINTER(c_size_t)]),
    # fastllm_status fastllm_grammar_check(const char *grammar)
    "fastllm_grammar_check": (c_int, [c_char_p]),
    "fastllm_session_cancel": (c_int, [c_void_p]),
    "fastllm_speculative_default_params": (SpeculativeParams, []),
    "fastllm_session_set_speculative": (c_int, [c_void_p, POINTER(SpeculativeParams)]),
    "fastllm_session_speculative_stats": (c_int, [c_void_p, POINTER(c_int64), POINTER(c_int64)]),
    "fastllm_adapter_load": (c_int, [c_void_p, c_char_p, POINTER(c_void_p)]),
    "fastllm_adapter_free": (None, [c_void_p]),
    "fastllm_session_set_adapters": (c_int, [c_void_p, POINTER(c_void_p), POINTER(c_float), c_size_t]),
    "fastllm_session_fork": (c_int, [c_void_p, c_int32, POINTER(SessionParams), POINTER(c_void_p)]),
    "fastllm_session_memory": (c_int, [c_void_p, POINTER(SessionMemoryInfo)]),
    "fastllm_session_save_state": (c_int, [c_void_p, c_void_p, c_size_t, POINTER(c_size_t)]),
    "fastllm_session_load_state": (c_int, [c_void_p, c_char_p, c_size_t, StreamCallback, c_void_p]),
    "fastllm_session_save_state_file": (c_int, [c_void_p, c_char_p]),
    "fastllm_session_load_state_file": (c_int, [c_void_p, c_char_p, StreamCallback, c_void_p]),
}


def library_name(platform: str | None = None) -> str:
    """The shared library's file name on a platform (sys.platform's value)."""
    platform = platform or sys.platform
    if platform in ("win32", "cygwin"):
        return "fastllm.dll"
    return "libfastllm.dylib" if platform == "darwin" else "libfastllm.so"


def library_candidates(platform: str | None = None) -> list[Path]:
    """Where the shared library is looked for, in order."""
    here = Path(__file__).resolve().parent
    name = library_name(platform)
    out = []
    if os.environ.get("FASTLLM_LIBRARY"):
        out.append(Path(os.environ["FASTLLM_LIBRARY"]))
    out.append(here / name)  # bundled next to the package (wheels)
    out.append(here.parents[2] / "build" / name)  # a source checkout's build folder
    return out


def load_library() -> ctypes.CDLL:
    tried = []
    for path in library_candidates():
        if path.is_file():
            try:
                lib = ctypes.CDLL(str(path))
            except OSError as e:  # e.g. a dependency of the library is missing
                raise ImportError(f"cannot load {path}: {e}") from e
            break
        tried.append(str(path))
    else:
        raise ImportError(f"{library_name()} not found; build it (cmake -S . -B build && cmake --build build) or set "
                          "FASTLLM_LIBRARY. Looked in: " + ", ".join(tried))
    # The ABI version first: a library of another version may lack functions bound below.
    lib.fastllm_abi_version.restype = c_int
    abi = lib.fastllm_abi_version()
    if abi != FASTLLM_ABI_VERSION:
        raise ImportError(f"{path}: library ABI version {abi}, this Python package needs {FASTLLM_ABI_VERSION}")
    for name, (restype, argtypes) in _PROTOTYPES.items():
        fn = getattr(lib, name)
        fn.restype = restype
        fn.argtypes = argtypes
    lib.path = str(path)
    return lib


lib = load_library()
