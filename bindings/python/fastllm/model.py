"""Pythonic layer over the raw ctypes API (_lib.py): Model and Session."""
from __future__ import annotations

import ctypes
import json
import os
import queue
import threading
import weakref
from dataclasses import dataclass
from typing import Iterator, Sequence

import numpy as np

from . import _lib as raw
from ._lib import lib


class FastLLMError(RuntimeError):
    """A failure reported by libfastllm; .status is the fastllm_status code, .status_name its name."""

    def __init__(self, status: int, message: str):
        self.status = status
        self.status_name = lib.fastllm_status_name(status).decode()
        super().__init__(f"{message} ({self.status_name})")


def _check(status: int) -> None:
    if status != raw.OK:
        raise FastLLMError(status, lib.fastllm_last_error().decode(errors="replace"))


def _ids_array(ids: Sequence[int]):
    ids = [int(i) for i in ids]
    return (ctypes.c_int32 * max(len(ids), 1))(*ids), len(ids)


@dataclass
class GenerationResult:
    """What the last generate() call did."""
    n_prompt_tokens: int
    n_generated_tokens: int
    stop_reason: str  # "eos", "max_tokens", "stop_string", "callback", "context_full", "cancelled" or "grammar"
    prompt_ms: float
    generate_ms: float


def json_schema_to_grammar(schema: str | dict) -> str:
    """The GBNF grammar of a JSON Schema (a dict, or its JSON text), as generation's json_schema=
    uses it. FastLLMError: status ERR_UNSUPPORTED naming a keyword it does not implement and where,
    ERR_INVALID_ARGUMENT for a malformed schema or one that matches nothing."""
    text = (schema if isinstance(schema, str) else json.dumps(schema)).encode()
    n = ctypes.c_size_t()
    capacity = 4 * len(text) + 4096
    while True:
        buf = ctypes.create_string_buffer(capacity)
        status = lib.fastllm_json_schema_to_grammar(text, buf, capacity, ctypes.byref(n))
        if status != raw.ERR_BUFFER_TOO_SMALL:
            _check(status)
            return buf.raw[: n.value].decode()
        capacity = n.value + 1


def _text_out(call, size_hint: int) -> str:
    """Calls call(buf, capacity, out_len) until the buffer is large enough; the NUL-terminated text."""
    n = ctypes.c_size_t()
    capacity = size_hint
    while True:
        buf = ctypes.create_string_buffer(capacity)
        status = call(buf, capacity, ctypes.byref(n))
        if status != raw.ERR_BUFFER_TOO_SMALL:
            _check(status)
            return buf.raw[: n.value].decode()
        capacity = n.value + 1


def render_template(template: str, messages: Sequence[dict] | None = None, *, tools: Sequence[dict] | None = None,
                    add_generation_prompt: bool = False, **variables) -> str:
    """Renders a Jinja chat template with the library's engine, no model needed: messages, tools
    (when given), add_generation_prompt and every other keyword (bos_token, eos_token,
    enable_thinking, ...) are the template's variables, as transformers' apply_chat_template passes
    them. A template error, or the template's raise_exception, raises FastLLMError
    (ERR_INVALID_ARGUMENT) with the engine's message (line and column)."""
    values = dict(variables)
    if messages is not None:
        values["messages"] = list(messages)
    if tools is not None:
        values["tools"] = list(tools)
    values["add_generation_prompt"] = bool(add_generation_prompt)
    text = json.dumps(values, ensure_ascii=False).encode()
    tmpl = template.encode()
    return _text_out(lambda buf, cap, n: lib.fastllm_template_render(tmpl, text, buf, cap, n),
                     2 * (len(text) + len(tmpl)) + 1024)


def devices() -> list[dict]:
    """The machine's Vulkan devices (index, name, vendor, type, memory_bytes, api_version, usable,
    missing); empty without Vulkan."""
    n = ctypes.c_int32()
    _check(lib.fastllm_devices(None, 0, ctypes.byref(n)))
    arr = (raw.DeviceInfo * max(n.value, 1))()
    _check(lib.fastllm_devices(arr, n.value, ctypes.byref(n)))
    out = []
    for d in arr[:n.value]:
        v = d.api_version
        out.append({"index": d.index, "name": d.name.decode(), "vendor": d.vendor.decode(), "type": d.type.decode(),
                    "memory_bytes": d.memory_bytes, "api_version": f"{v >> 22 & 0x7f}.{v >> 12 & 0x3ff}.{v & 0xfff}",
                    "usable": bool(d.usable), "missing": d.missing.decode()})
    return out


def check_grammar(grammar: str) -> None:
    """Raises FastLLMError (ERR_INVALID_ARGUMENT, "grammar: line L col C: ...") for a GBNF grammar
    that generation's grammar= would refuse."""
    _check(lib.fastllm_grammar_check(grammar.encode()))


def _sampling(max_new_tokens, temperature, top_k, top_p, min_p, repetition_penalty, repeat_last_n, seed, stop,
              ignore_eos, grammar=None, json_schema=None, grammar_triggers=None):
    p = lib.fastllm_sampling_default_params()
    p.max_new_tokens = max_new_tokens
    optional = dict(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                    repetition_penalty=repetition_penalty, repeat_last_n=repeat_last_n)
    for name, value in optional.items():  # None keeps the library's default
        if value is not None:
            setattr(p, name, value)
    p.seed = seed
    p.ignore_eos = int(bool(ignore_eos))
    if isinstance(stop, str):
        stop = [stop]
    stop = [s.encode() for s in (stop or [])]
    keep = (ctypes.c_char_p * max(len(stop), 1))(*stop)
    p.stop = ctypes.cast(keep, ctypes.POINTER(ctypes.c_char_p)) if stop else None
    p.n_stop = len(stop)
    triggers = [t.encode() for t in (grammar_triggers or [])]
    keep = (keep, (ctypes.c_char_p * max(len(triggers), 1))(*triggers))
    p.grammar_triggers = ctypes.cast(keep[1], ctypes.POINTER(ctypes.c_char_p)) if triggers else None
    p.n_grammar_triggers = len(triggers)
    # grammar: GBNF text; json_schema: a dict or its JSON text (the structure keeps the bytes alive)
    p.grammar = grammar.encode() if grammar is not None else None
    if json_schema is not None:
        p.json_schema = (json_schema if isinstance(json_schema, str) else json.dumps(json_schema)).encode()
    return p, keep  # keep: the stop strings and triggers must outlive the call


class _Handle:
    """An owned C handle: freed by close() (harmless twice), by `with`, or when collected."""
    _what = "object"
    _handle = None

    @staticmethod
    def _free(handle) -> None:
        raise NotImplementedError

    def close(self) -> None:
        if self._handle:
            self._free(self._handle)
            self._handle = None

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        self.close()

    @property
    def handle(self):
        if not self._handle:
            raise FastLLMError(raw.ERR_INVALID_ARGUMENT, f"the {self._what} is closed")
        return self._handle


class Model(_Handle):
    """A loaded .flm model. Thread-safe; many Sessions may share it.

    threads: default thread count of its sessions (0 = all cores). use_mmap: map the weights in place.
    device: what runs it: "cpu" (default), "vulkan", "vulkan:N" (N from fastllm.devices()) or "auto"
    (a Vulkan GPU if one is usable, else the CPU). gpu_layers: the last layers on the device, the
    rest on the CPU (-1: all, 0: none).
    """

    def __init__(self, path: str, threads: int = 0, use_mmap: bool = True, device: str | None = None,
                 gpu_layers: int = -1):
        params = lib.fastllm_model_default_params()
        params.n_threads = threads
        params.use_mmap = int(use_mmap)
        params.device = device.encode() if device else None
        params.n_gpu_layers = gpu_layers
        handle = ctypes.c_void_p()
        _check(lib.fastllm_model_load(str(path).encode(), ctypes.byref(params), ctypes.byref(handle)))
        self._adopt(handle)

    @classmethod
    def from_bytes(cls, data, threads: int = 0, device: str | None = None, gpu_layers: int = -1) -> "Model":
        """A model from the bytes of a .flm file (bytes, bytearray, memoryview); the library copies
        them, so data may be dropped afterwards."""
        data = data if isinstance(data, bytes) else bytes(data)
        params = lib.fastllm_model_default_params()
        params.n_threads = threads
        params.device = device.encode() if device else None
        params.n_gpu_layers = gpu_layers
        handle = ctypes.c_void_p()
        _check(lib.fastllm_model_load_from_memory(data, len(data), ctypes.byref(params), ctypes.byref(handle)))
        model = cls.__new__(cls)
        model._adopt(handle)
        return model

    def _adopt(self, handle) -> None:
        self._handle = handle
        self._sessions: weakref.WeakSet[Session] = weakref.WeakSet()
        self._adapters: weakref.WeakSet[Adapter] = weakref.WeakSet()
        info = raw.ModelInfo()
        _check(lib.fastllm_model_get_info(self._handle, ctypes.byref(info)))
        self.info = {name: getattr(info, name) for name, _ in raw.ModelInfo._fields_}
        for key in ("architecture", "name", "weight_dtype", "backend"):
            self.info[key] = self.info[key].decode()
        self.vocab_size = info.vocab_size
        self.context_length = info.context_length
        template = lib.fastllm_model_chat_template(self._handle)
        self.chat_template = template.decode() if template is not None else None

    _what = "model"
    _free = staticmethod(lambda h: lib.fastllm_model_free(h))

    def close(self) -> None:
        """Frees the model (and closes its sessions and adapters, which must not outlive it). Closing
        twice is harmless."""
        for s in list(getattr(self, "_sessions", ())):
            s.close()
        for a in list(getattr(self, "_adapters", ())):
            a.close()
        super().close()

    # -- embeddings -------------------------------------------------------------------------
    POOLINGS = {None: raw.POOLING_MODEL, "none": raw.POOLING_NONE, "mean": raw.POOLING_MEAN, "cls": raw.POOLING_CLS,
                "last": raw.POOLING_LAST}

    def embed(self, inputs, pooling: str | None = None, normalize: bool = True, truncate: bool = True,
              add_special: bool | None = None, threads: int = 0, batch: int = 0):
        """Embeddings of a text, a list of texts, or a list of token-id lists: an array of
        (n, hidden_size) float32 (one row for a single text). pooling: None (the model's own, as
        its sentence-transformers config says), "mean", "cls", "last", or "none" (a list with one
        (tokens, hidden_size) array per input). normalize: rows of length 1. truncate: cut inputs
        longer than the context (else FastLLMError). See docs/embeddings.md."""
        single = isinstance(inputs, str)
        items = [inputs] if single else list(inputs)
        if pooling not in self.POOLINGS:
            raise ValueError(f"pooling must be one of {', '.join(str(k) for k in self.POOLINGS)}, got {pooling!r}")
        params = lib.fastllm_embed_default_params()
        params.pooling = self.POOLINGS[pooling]
        params.normalize, params.truncate = int(bool(normalize)), int(bool(truncate))
        params.add_special = -1 if add_special is None else int(bool(add_special))
        params.n_threads, params.n_batch = threads, batch
        H = self.info["hidden_size"]
        n_vec = ctypes.c_size_t()
        tokens = bool(items) and not isinstance(items[0], str)
        if tokens:
            arrays = [(ctypes.c_int32 * len(ids))(*ids) for ids in items]
            ptrs = (ctypes.POINTER(ctypes.c_int32) * len(items))(*[ctypes.cast(a, ctypes.POINTER(ctypes.c_int32)) for a in arrays])
            lens = (ctypes.c_size_t * len(items))(*[len(ids) for ids in items])
            call = lambda out, cap: lib.fastllm_embed_tokens(self.handle, ptrs, lens, len(items), ctypes.byref(params),
                                                             out, cap, ctypes.byref(n_vec))
        else:
            data = (ctypes.c_char_p * len(items))(*[t.encode() for t in items])
            call = lambda out, cap: lib.fastllm_embed(self.handle, data, len(items), ctypes.byref(params), out, cap,
                                                      ctypes.byref(n_vec))
        n = len(items)
        if pooling in (None, "none"):  # the size: the inputs' token counts where the pooling is none
            status = call(None, 0)
            if status != raw.ERR_BUFFER_TOO_SMALL:
                _check(status)
            n = n_vec.value
        out = np.empty((n, H), dtype=np.float32)
        _check(call(out.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), out.size))
        if n != len(items) or pooling == "none":  # one vector per token, cut to the context as the library cuts
            counts = [min(len(ids) if tokens else len(self.tokenize(ids, add_special)), self.context_length)
                      for ids in items]
            return np.split(out, np.cumsum(counts)[:-1])
        return out[0] if single else out

    def rerank(self, query: str, documents: Sequence[str], normalize: bool = True, truncate: bool = True,
               threads: int = 0, batch: int = 0, instruction: str | None = None) -> np.ndarray:
        """Each document's score for the query (float32, the documents' order; higher: more
        relevant), by a cross-encoder or a decoder reranker (instruction: its task, None: the
        file's). With normalize, a sigmoid, in (0, 1), as sentence-transformers' CrossEncoder.predict
        and Qwen3-Reranker's p(yes) give it. See docs/embeddings.md."""
        docs = list(documents)
        params = lib.fastllm_rerank_default_params()
        params.normalize, params.truncate = int(bool(normalize)), int(bool(truncate))
        params.n_threads, params.n_batch = threads, batch
        params.instruction = instruction.encode() if instruction is not None else None
        data = (ctypes.c_char_p * max(len(docs), 1))(*[d.encode() for d in docs])
        out = np.empty(len(docs), dtype=np.float32)
        _check(lib.fastllm_rerank(self.handle, query.encode(), data, len(docs), ctypes.byref(params),
                                  out.ctypes.data_as(ctypes.POINTER(ctypes.c_float))))
        return out

    # -- tokenizer --------------------------------------------------------------------------
    def tokenize(self, text: str, add_bos: bool | None = None) -> list[int]:
        """Token ids of text; add_bos None uses the model's default."""
        data = text.encode()
        flag = -1 if add_bos is None else int(bool(add_bos))
        n = ctypes.c_size_t()
        capacity = len(data) + 8
        while True:
            buf = (ctypes.c_int32 * capacity)()
            status = lib.fastllm_tokenize(self.handle, data, len(data), flag, buf, capacity, ctypes.byref(n))
            if status != raw.ERR_BUFFER_TOO_SMALL:
                _check(status)
                return list(buf[: n.value])
            capacity = n.value

    def detokenize(self, ids: Sequence[int]) -> str:
        arr, n = _ids_array(ids)
        out_len = ctypes.c_size_t()
        capacity = 16 * n + 16
        while True:
            buf = ctypes.create_string_buffer(capacity)
            status = lib.fastllm_detokenize(self.handle, arr, n, buf, capacity, ctypes.byref(out_len))
            if status != raw.ERR_BUFFER_TOO_SMALL:
                _check(status)
                return buf.raw[: out_len.value].decode()
            capacity = out_len.value + 1

    def token_to_piece(self, token: int) -> bytes:
        """Raw bytes one token adds to a text stream (may be part of a UTF-8 character)."""
        buf = ctypes.create_string_buffer(256)
        n = ctypes.c_size_t()
        status = lib.fastllm_token_to_piece(self.handle, int(token), buf, 256, ctypes.byref(n))
        if status == raw.ERR_BUFFER_TOO_SMALL:
            buf = ctypes.create_string_buffer(n.value)
            status = lib.fastllm_token_to_piece(self.handle, int(token), buf, n.value, ctypes.byref(n))
        _check(status)
        return buf.raw[: n.value]

    # -- chat -------------------------------------------------------------------------------
    def apply_chat_template(self, messages: Sequence[dict], add_generation_prompt: bool = True,
                            template: str | None = None, enable_thinking: bool | None = None, *,
                            tools: Sequence[dict] | None = None, **variables) -> str:
        """Prompt text for messages (OpenAI's shape: role, content as a string or a list of parts,
        tool_calls, tool messages, reasoning_content, ...) rendered with the model's chat template
        (or `template`) as transformers' apply_chat_template renders it. enable_thinking: None
        leaves the template's variable undefined (as not passing the keyword to transformers);
        False / True pass it (Qwen3's template reads it). tools: OpenAI's tool list; every other
        keyword is a template variable too. bos_token / eos_token are the model's."""
        values = dict(variables)
        values["messages"] = list(messages)
        if tools is not None:
            values["tools"] = list(tools)
        values["add_generation_prompt"] = bool(add_generation_prompt)
        if enable_thinking is not None:
            values["enable_thinking"] = bool(enable_thinking)
        text = json.dumps(values, ensure_ascii=False).encode()
        tmpl = template.encode() if template is not None else None
        return _text_out(lambda buf, cap, n: lib.fastllm_chat_apply_template_json(self.handle, tmpl, text, buf, cap, n),
                         2 * len(text) + len(self.chat_template or "") + 1024)

    def parse_tool_calls(self, reply: str, tools: Sequence[dict] | None = None, *, template: str | None = None) -> dict:
        """The tool calls in a generated reply, in the format the chat template (the model's own, or
        `template`) teaches: {"format": "hermes", "content": str, "tool_calls": [{"id", "type":
        "function", "function": {"name", "arguments": JSON text}}]}. Calls that do not parse, or
        name a function not in tools, leave the whole reply as content (never an error)."""
        tools_text = json.dumps(list(tools), ensure_ascii=False).encode() if tools is not None else None
        text, tmpl = reply.encode(), template.encode() if template is not None else None
        out = json.loads(_text_out(lambda buf, cap, n: lib.fastllm_chat_parse_tool_calls(
            self.handle, tmpl, text, tools_text, buf, cap, n), 2 * len(text) + 1024))
        out["tool_calls"] = [{"id": f"call_{k}", "type": "function", "function": c} for k, c in enumerate(out["tool_calls"])]
        return out

    def tool_call_grammar(self, tools: Sequence[dict], tool_choice: str | dict = "required", *, parallel: bool = False,
                          template: str | None = None) -> str:
        """A GBNF grammar whose matches are tool calls in the template's format to tools ("required":
        any of them; a name, or OpenAI's {"type": "function", "function": {"name": ...}}: that one),
        their arguments matching the tools' parameter schemas."""
        name = None
        if isinstance(tool_choice, dict):
            name = tool_choice["function"]["name"]
        elif tool_choice != "required":
            name = tool_choice
        tools_text = json.dumps(list(tools), ensure_ascii=False).encode()
        tmpl = template.encode() if template is not None else None
        return _text_out(lambda buf, cap, n: lib.fastllm_chat_tool_grammar(
            self.handle, tmpl, tools_text, name.encode() if name else None, int(parallel), buf, cap, n),
            8 * len(tools_text) + 4096)

    def tool_call_triggers(self, *, template: str | None = None) -> list[str]:
        """For tool_choice "auto": the grammar_triggers that make tool_call_grammar's grammar lazy, so
        a reply is free text until a call begins (["<tool_call>"] for Qwen2.5's format; "^{" is a
        reply that begins with '{'). FastLLMError (ERR_UNSUPPORTED) for a format without a grammar."""
        tmpl = template.encode() if template is not None else None
        return json.loads(_text_out(lambda buf, cap, n: lib.fastllm_chat_tool_triggers(self.handle, tmpl, buf, cap, n), 256))

    def chat(self, messages: Sequence[dict], max_new_tokens: int = 256, *, stream: bool = False, **sampling):
        """The assistant's reply to messages, in a fresh context (str, or with stream=True an iterator
        of str pieces; with tools=, the assistant message as a dict, as Session.chat). For a
        multi-turn conversation that keeps its KV cache, use Session.chat."""
        session = self.session()
        if not stream:
            with session:
                return session.chat(messages, max_new_tokens, **sampling)
        return _closing_iter(session, session.chat(messages, max_new_tokens, stream=True, **sampling))

    # -- LoRA adapters ------------------------------------------------------------------------
    def load_adapter(self, path) -> "Adapter":
        """A LoRA adapter file (convert.py --adapter) for this model, checked against it; set it on
        sessions with Session.set_adapters({adapter: scale}) or Model.session(adapters=...)."""
        return Adapter(self, path)

    # -- inference --------------------------------------------------------------------------
    def session(self, n_ctx: int = 0, n_batch: int = 0, threads: int = 0, **options) -> "Session":
        """A new stateful context (its own KV cache) over this model; options as Session's."""
        return Session(self, n_ctx=n_ctx, n_batch=n_batch, threads=threads, **options)

    def forward(self, ids: Sequence[int], kv_type: str = "f32") -> np.ndarray:
        """Logits of every position, shape (len(ids), vocab_size), in a fresh context. Its KV cache is
        f32 unless kv_type says otherwise: the exact computation, which the reference checks compare
        (sessions default to f16, within 2e-3 of it)."""
        with self.session(n_ctx=max(len(ids), 1), kv_type=kv_type) as s:
            return s.eval(ids, logits="all")

    def generate(self, prompt: str | Sequence[int], max_new_tokens: int = 256, *, stream: bool = False,
                 add_bos: bool | None = None, **sampling):
        """Text continuing prompt in a fresh context (str), or with stream=True an iterator of str pieces.

        sampling: temperature (0 = greedy), top_k, top_p, min_p, repetition_penalty, repeat_last_n, seed,
        stop (str or list), ignore_eos, grammar (GBNF), json_schema (dict or JSON text), grammar_triggers
        (list of str: the grammar applies from the first of them on, see Session.generate). Defaults are the
        C library's (temperature 0.8, top_k 40, ...).
        """
        ids = self.tokenize(prompt, add_bos=add_bos) if isinstance(prompt, str) else list(prompt)
        n_ctx = min(self.context_length, len(ids) + max_new_tokens) if ids else 0
        session = self.session(n_ctx=max(n_ctx, 1))
        if not stream:
            with session:
                return session.generate(ids, max_new_tokens, **sampling)
        return _closing_iter(session, session.generate(ids, max_new_tokens, stream=True, **sampling))


def _closing_iter(session: "Session", pieces: Iterator[str]) -> Iterator[str]:
    with session:
        try:
            yield from pieces
        finally:
            pieces.close()  # see _chat_stream


class Adapter(_Handle):
    """A LoRA adapter loaded for a Model (Model.load_adapter). Closing it is deferred while sessions
    apply it: they keep its memory until they stop."""

    def __init__(self, model: Model, path):
        handle = ctypes.c_void_p()
        _check(lib.fastllm_adapter_load(model.handle, os.fsencode(path), ctypes.byref(handle)))
        self._handle = handle
        self.model = model  # the model outlives its adapters: Model.close() closes them
        self.path = os.fspath(path)
        model._adapters.add(self)

    _what = "adapter"
    _free = staticmethod(lambda h: lib.fastllm_adapter_free(h))

    def __repr__(self) -> str:
        return f"Adapter({self.path!r})"


class Session(_Handle):
    """One conversation's state over a Model: token history and KV cache. Use from one thread at a time."""

    def __init__(self, model: Model, n_ctx: int = 0, n_batch: int = 0, threads: int = 0, *,
                 kv_type: str | None = None, type_k: str | None = None, type_v: str | None = None,
                 context_shift: bool = False, n_keep: int = 0, n_discard: int = 0, swa_full: bool = False,
                 adapters: "dict | None" = None, _fork_of: "Session" = None, _fork_n: int = 0):
        """n_ctx 0: 4096 (or the model's context if shorter); the KV cache grows with the context.
        kv_type sets both type_k and type_v: "f16" (default), "f32" or "q8". context_shift: when the
        context is full, drop n_discard tokens (0: half) after the first n_keep and go on.
        swa_full: sliding-window layers keep every position instead of only their window (more
        memory; truncating or forking far back then needs no re-evaluation). adapters: {Adapter:
        scale}, as set_adapters."""
        params = lib.fastllm_session_default_params()
        params.n_ctx = n_ctx
        if n_batch:
            params.n_batch = n_batch
        params.n_threads = threads
        for field, value in (("type_k", type_k or kv_type), ("type_v", type_v or kv_type)):
            if value is not None:
                if value not in raw.KV_TYPES:
                    raise ValueError(f"{field} must be one of {sorted(raw.KV_TYPES)}, not {value!r}")
                setattr(params, field, raw.KV_TYPES[value])
        params.context_shift, params.n_keep, params.n_discard = int(bool(context_shift)), n_keep, n_discard
        params.swa_full = int(bool(swa_full))
        handle = ctypes.c_void_p()
        if _fork_of is None:
            _check(lib.fastllm_session_create(model.handle, ctypes.byref(params), ctypes.byref(handle)))
        else:
            _check(lib.fastllm_session_fork(_fork_of.handle, _fork_n, ctypes.byref(params), ctypes.byref(handle)))
        self._handle = handle
        self._options = dict(n_ctx=n_ctx, n_batch=n_batch, threads=threads, type_k=type_k or kv_type,
                             type_v=type_v or kv_type, context_shift=context_shift, n_keep=n_keep,
                             n_discard=n_discard, swa_full=swa_full)
        self.model = model  # keeps the model alive while the session is
        model._sessions.add(self)
        self.last_result: GenerationResult | None = None
        self.messages: list[dict] = []  # the conversation so far, for chat()
        self._stops: set = set()  # of the streams whose worker may still be generating
        self._adapters: dict = dict(_fork_of._adapters) if _fork_of is not None else {}
        if adapters:
            self.set_adapters(adapters)

    _what = "session"
    _free = staticmethod(lambda h: lib.fastllm_session_free(h))

    def close(self) -> None:
        """Frees the session, after stopping any stream still generating on it (its iterator then
        ends). Closing twice is harmless."""
        for stop in list(getattr(self, "_stops", ())):
            stop()
        super().close()

    @property
    def n_tokens(self) -> int:
        return lib.fastllm_session_n_tokens(self.handle)

    @property
    def n_cached(self) -> int:
        """Of n_tokens, how many have their KV cache held (the rest are evaluated by the next call)."""
        return lib.fastllm_session_n_cached(self.handle)

    @property
    def n_ctx(self) -> int:
        return lib.fastllm_session_n_ctx(self.handle)

    @property
    def tokens(self) -> list[int]:
        """Ids of the context so far: prompts and generated tokens, oldest first."""
        n = self.n_tokens
        buf = (ctypes.c_int32 * max(n, 1))()
        got = ctypes.c_size_t()
        _check(lib.fastllm_session_get_tokens(self.handle, buf, n, ctypes.byref(got)))
        return list(buf[: got.value])

    def fork(self, n_tokens: int | None = None, **options) -> "Session":
        """A new session whose context is this one's first n_tokens (default: all), sharing their KV
        cache blocks instead of evaluating or copying them (a persona prompt evaluated once for many
        NPCs). options as the constructor's (default: this session's); the KV types stay this one's."""
        opts = {**self._options, **options}
        child = Session(self.model, _fork_of=self, _fork_n=self.n_tokens if n_tokens is None else n_tokens, **opts)
        child.messages = [dict(m) for m in self.messages] if n_tokens is None else []
        return child

    def memory(self) -> dict:
        """What the session's memory costs now (bytes): kv_bytes, kv_shared_bytes (of them, blocks
        shared with other sessions), kv_bytes_per_token, kv_capacity_bytes (at a full n_ctx),
        session_bytes, compute_bytes (the model's working memory, shared by sessions)."""
        info = raw.SessionMemoryInfo()
        _check(lib.fastllm_session_memory(self.handle, ctypes.byref(info)))
        return {name: getattr(info, name) for name, _ in raw.SessionMemoryInfo._fields_}

    def save_state(self) -> bytes:
        """The session's state (tokens, KV cache, a generation in progress) as bytes; see load_state."""
        size = ctypes.c_size_t()
        status = lib.fastllm_session_save_state(self.handle, None, 0, ctypes.byref(size))
        if status != raw.ERR_BUFFER_TOO_SMALL:
            _check(status)
        buf = ctypes.create_string_buffer(size.value)
        _check(lib.fastllm_session_save_state(self.handle, buf, size.value, ctypes.byref(size)))
        return buf.raw[: size.value]

    def load_state(self, data: bytes) -> None:
        """Replaces the context with a saved state of the same model (else FastLLMError, the session
        unchanged). The chat conversation (messages) is not part of it."""
        data = bytes(data)
        _check(lib.fastllm_session_load_state(self.handle, data, len(data), ctypes.cast(None, raw.StreamCallback), None))

    def save_state_file(self, path) -> None:
        _check(lib.fastllm_session_save_state_file(self.handle, os.fsencode(path)))

    def load_state_file(self, path) -> None:
        _check(lib.fastllm_session_load_state_file(self.handle, os.fsencode(path), ctypes.cast(None, raw.StreamCallback),
                                                   None))

    def cancel(self) -> bool:
        """From any thread: stops the evaluation or generation in progress (eval raises FastLLMError
        with ERR_CANCELLED; a generation ends with stop reason "cancelled"). False if none was."""
        return lib.fastllm_session_cancel(self.handle) == raw.OK

    def set_adapters(self, adapters: dict) -> None:
        """The LoRA adapters this session's evaluations apply from now on: {Adapter: scale} (1.0: as
        trained, 0: off; {}: the base model). Tokens already evaluated keep their KV cache (reset()
        to evaluate them again); a fork takes this session's adapters."""
        items = list(adapters.items())
        for a, _ in items:
            if not isinstance(a, Adapter):
                raise TypeError(f"adapters maps Adapter objects to scales, not {type(a).__name__}")
        handles = (ctypes.c_void_p * max(len(items), 1))(*[a.handle for a, _ in items])
        scales = (ctypes.c_float * max(len(items), 1))(*[float(s) for _, s in items])
        _check(lib.fastllm_session_set_adapters(self.handle, handles, scales, len(items)))
        self._adapters = dict(items)  # keeps the Adapter objects (and so their handles) alive

    @property
    def adapters(self) -> dict:
        return dict(self._adapters)

    def speculative(self, draft: "Model | None" = None, n_draft: int = 5, ngram: tuple[int, int] = (1, 3),
                    p_min: float = 0.0) -> None:
        """Speculative decoding for the generations that follow: each step drafts up to n_draft
        tokens (fewer after steps whose drafts failed) and keeps those this model would have
        produced. Drafts come from the draft model (same vocabulary, smaller; it stops at a token it
        gives less than p_min), or without one from the context (prompt lookup of its last
        ngram[1] .. ngram[0] tokens). Greedy text is identical; sampled text has the same
        distribution. speculative_stats() tells how many were drafted and kept. Off: speculative_off()."""
        params = lib.fastllm_speculative_default_params()
        params.draft_model = draft.handle if draft is not None else None
        params.n_draft = n_draft
        params.ngram_min, params.ngram_max = ngram
        params.p_min = p_min
        _check(lib.fastllm_session_set_speculative(self.handle, ctypes.byref(params)))
        self._draft = draft  # kept alive while this session may draft with it

    def speculative_off(self) -> None:
        _check(lib.fastllm_session_set_speculative(self.handle, None))
        self._draft = None

    def speculative_stats(self) -> dict:
        """Of the current or last generation: {"drafted": n, "accepted": m}."""
        drafted, accepted = ctypes.c_int64(), ctypes.c_int64()
        _check(lib.fastllm_session_speculative_stats(self.handle, ctypes.byref(drafted), ctypes.byref(accepted)))
        return {"drafted": drafted.value, "accepted": accepted.value}

    def reset(self) -> None:
        """Forgets the context (and the chat conversation)."""
        _check(lib.fastllm_session_reset(self.handle))
        self.messages = []

    def truncate(self, n_keep: int) -> None:
        """Keeps the first n_keep tokens of the context and forgets the rest."""
        _check(lib.fastllm_session_truncate(self.handle, n_keep))

    def chat(self, message: str | dict | Sequence[dict], max_new_tokens: int = 256, *, stream: bool = False,
             tools: Sequence[dict] | None = None, tool_choice: str | dict = "auto", parallel_tool_calls: bool = True,
             **sampling):
        """Multi-turn chat: adds message (a user message as str, a message dict, or a list of them) to
        this session's conversation and returns the assistant's reply (str, or an iterator of str
        pieces with stream=True), which joins the conversation.

        The whole conversation is rendered with the chat template, and only the tokens after the
        part already in the KV cache are evaluated: earlier turns are not recomputed.

        tools (OpenAI's list): the template shows them to the model, and the reply is returned as
        the assistant message dict {"role": "assistant", "content": str or None, "tool_calls":
        [...]} (tool_calls only when there are calls; add the results as {"role": "tool", ...}
        messages). tool_choice: "auto" (the model decides; once a call begins in the template's
        format, sampling is constrained as for "required"), "none" (tools shown, calls not
        parsed), "required" or a function's name / OpenAI's {"type": "function", "function":
        {"name": ...}}: sampling is constrained to calls whose arguments match the schema
        (parallel_tool_calls: one or more)."""
        if isinstance(message, str):
            message = {"role": "user", "content": message}
        new = [message] if isinstance(message, dict) else list(message)
        messages = self.messages + [dict(m) for m in new]
        if tools is not None:
            if stream:
                raise ValueError("chat(stream=True) with tools is not supported; stream=False returns the calls")
            if tool_choice == "auto" and "grammar" not in sampling and "json_schema" not in sampling:
                try:  # calls constrained once one begins (formats without a grammar: unconstrained)
                    sampling["grammar_triggers"] = self.model.tool_call_triggers()
                    sampling["grammar"] = self.model.tool_call_grammar(tools, parallel=parallel_tool_calls)
                except FastLLMError as e:  # no grammar for the format or the schemas: free, as the server
                    if e.status_name not in ("FASTLLM_ERR_UNSUPPORTED", "FASTLLM_ERR_INVALID_ARGUMENT"):
                        raise
                    sampling.pop("grammar_triggers", None)
                    sampling.pop("grammar", None)
            elif tool_choice != "none":
                sampling["grammar"] = self.model.tool_call_grammar(tools, tool_choice, parallel=parallel_tool_calls)
            prompt = self.model.apply_chat_template(messages, add_generation_prompt=True, tools=tools)
        else:
            prompt = self.model.apply_chat_template(messages, add_generation_prompt=True)
        ids = self.model.tokenize(prompt, add_bos=False)
        old = self.tokens
        keep = 0
        while keep < min(len(old), len(ids)) and old[keep] == ids[keep]:
            keep += 1
        self.truncate(keep)
        pieces = self.generate(ids[keep:], max_new_tokens, stream=stream, **sampling)
        if tools is not None:
            reply = {"role": "assistant", "content": pieces}
            if tool_choice != "none":
                parsed = self.model.parse_tool_calls(pieces, tools)
                if parsed["tool_calls"]:
                    reply = {"role": "assistant", "content": parsed["content"] or None, "tool_calls": parsed["tool_calls"]}
            self.messages = messages + [reply]
            return reply
        if not stream:
            self.messages = messages + [{"role": "assistant", "content": pieces}]
            return pieces
        return self._chat_stream(messages, pieces)

    def _chat_stream(self, messages, pieces) -> Iterator[str]:
        reply = []
        try:
            for piece in pieces:
                reply.append(piece)
                yield piece
        finally:
            # A KeyboardInterrupt raised in this frame (not in pieces') would leave pieces
            # suspended, kept alive by the traceback, and its worker generating on: stop it now.
            pieces.close()
        self.messages = messages + [{"role": "assistant", "content": "".join(reply)}]

    def eval(self, ids: Sequence[int], logits: str | None = "last") -> np.ndarray | None:
        """Appends ids to the context. logits: "last" -> (vocab,), "all" -> (len(ids), vocab), None -> None."""
        arr, n = _ids_array(ids)
        vocab = self.model.vocab_size
        if logits == "all":
            out = np.empty((n, vocab), dtype=np.float32)
            mode = raw.LOGITS_ALL
        elif logits == "last":
            out = np.empty((vocab,), dtype=np.float32)
            mode = raw.LOGITS_LAST
        elif logits is None:
            out, mode = None, raw.LOGITS_NONE
        else:
            raise ValueError(f"logits must be 'last', 'all' or None, not {logits!r}")
        ptr = out.ctypes.data_as(ctypes.POINTER(ctypes.c_float)) if out is not None else None
        _check(lib.fastllm_session_eval(self.handle, arr, n, mode, ptr))
        return out

    def generate(self, prompt: str | Sequence[int] = (), max_new_tokens: int = 256, *, stream: bool = False,
                 add_bos: bool | None = None, temperature: float | None = None, top_k: int | None = None,
                 top_p: float | None = None, min_p: float | None = None, repetition_penalty: float | None = None,
                 repeat_last_n: int | None = None, seed: int = 0, stop: str | Sequence[str] | None = None,
                 ignore_eos: bool = False, grammar: str | None = None, json_schema: str | dict | None = None,
                 grammar_triggers: Sequence[str] | None = None):
        """Continues the conversation: appends prompt, then generates. Returns str, or with stream=True an
        iterator of str pieces. A str prompt gets BOS only when the session is empty (add_bos=None).

        grammar: a GBNF grammar (llama.cpp's syntax) the output must follow; json_schema: a JSON Schema
        (dict or JSON text) the output must be an instance of (see json_schema_to_grammar). Generation
        then ends with stop reason "grammar" once the output is complete (docs/grammar.md).
        grammar_triggers: makes the grammar lazy: the output is free until one of these strings
        appears in it, and follows the grammar from there ("^x": x at the start, after whitespace)."""
        if isinstance(prompt, str):
            if add_bos is None and self.n_tokens > 0:
                add_bos = False  # BOS opens a context; a continuation does not repeat it
            ids = self.model.tokenize(prompt, add_bos=add_bos)
        else:
            ids = list(prompt)
        params, keep = _sampling(max_new_tokens, temperature, top_k, top_p, min_p, repetition_penalty, repeat_last_n,
                                 seed, stop, ignore_eos, grammar, json_schema, grammar_triggers)
        if stream:
            return self._stream(ids, params, keep)
        pieces: list[bytes] = []

        def on_text(text, length, _user):
            pieces.append(ctypes.string_at(text, length))
            return 0

        self._run(ids, params, raw.StreamCallback(on_text))
        return b"".join(pieces).decode()

    def _run(self, ids, params, callback) -> None:
        arr, n = _ids_array(ids)
        result = raw.GenerationResult()
        status = lib.fastllm_session_generate(self.handle, arr, n, ctypes.byref(params), callback, None,
                                              ctypes.byref(result))
        self.last_result = GenerationResult(result.n_prompt_tokens, result.n_generated_tokens,
                                            raw.STOP_REASONS.get(result.stop_reason, "?"), result.prompt_ms,
                                            result.generate_ms)
        _check(status)

    def _stream(self, ids, params, keep) -> Iterator[str]:
        # The C call runs in a worker thread (ctypes releases the GIL); pieces come back through a small
        # queue, so generation keeps pace with the reader. Closing the iterator early makes the
        # callback ask the library to stop.
        pieces: queue.Queue = queue.Queue(maxsize=4)
        cancelled = threading.Event()
        done = object()

        def on_text(text, length, _user):
            pieces.put(ctypes.string_at(text, length).decode())
            return 1 if cancelled.is_set() else 0

        callback = raw.StreamCallback(on_text)
        error: list[BaseException] = []

        def work():
            try:
                self._run(ids, params, callback)
            except BaseException as e:  # re-raised in the consumer's thread
                error.append(e)
            finally:
                pieces.put(done)

        worker = threading.Thread(target=work, daemon=True)

        def stop():  # from this generator's end, or from close() while it is suspended
            cancelled.set()
            while worker.is_alive():  # let a worker blocked on the full queue finish
                try:
                    pieces.get(timeout=0.01)
                except queue.Empty:
                    pass
            worker.join()
            pieces.put(done)  # what a later next() finds (the drain may have taken the first)
            self._stops.discard(stop)

        self._stops.add(stop)
        worker.start()
        try:
            while (item := pieces.get()) is not done:
                yield item
        finally:
            stop()
            del keep
        if error:
            raise error[0]
