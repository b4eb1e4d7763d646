'use strict';
// fastllm.js: a small Node.js client for libfastllm over its C ABI (include/fastllm.h), through
// koffi, a foreign function interface with prebuilt binaries: no native compile step.
//
//   const { Model } = require('./fastllm');
//   const model = Model.load('model.flm', { threads: 4 });
//   const session = model.createSession();
//   const r = session.generate('Once upon a time', { maxNewTokens: 40, temperature: 0,
//                                                   onToken: (piece) => { process.stdout.write(piece); } });
//   session.free(); model.free();
//
// Calls are synchronous: a generation blocks the event loop until it returns (the stream callback
// runs on the calling thread, between tokens). Free what you create: nothing is freed by the
// garbage collector.

const fs = require('node:fs');
const path = require('node:path');
const koffi = require('koffi');

// FASTLLM_ABI_VERSION of the include/fastllm.h this file mirrors. Keep the structs and prototypes
// below in step with the header, and change this number with them.
const ABI_VERSION = 13;

// ---------------------------------------------------------------------------------------------
// The library: FASTLLM_LIBRARY, else a source checkout's build/, else the system loader's search.

function libraryCandidates() {
    const out = [];
    if (process.env.FASTLLM_LIBRARY) out.push(process.env.FASTLLM_LIBRARY);
    const built = path.resolve(__dirname, '..', '..', '..', 'build', 'libfastllm.so');
    if (fs.existsSync(built)) out.push(built);
    out.push('libfastllm.so'); // e.g. an installed prefix on the loader's path
    return out;
}

function loadLibrary() {
    const candidates = libraryCandidates();
    // An explicit FASTLLM_LIBRARY is the only one tried: a wrong path should not silently fall back.
    const tries = process.env.FASTLLM_LIBRARY ? candidates.slice(0, 1) : candidates;
    const failures = [];
    for (const candidate of tries) {
        try {
            return { lib: koffi.load(candidate), path: candidate };
        } catch (e) {
            failures.push(`${candidate}: ${e.message}`);
        }
    }
    throw new Error('cannot load libfastllm (build it with `cmake -S . -B build && cmake --build build`, '
        + 'or set FASTLLM_LIBRARY to its path). Tried:\n  ' + failures.join('\n  '));
}

const { lib, path: libraryPath } = loadLibrary();

// The ABI version first: a library of another version may lack the functions bound below.
const abiVersion = lib.func('int fastllm_abi_version(void)')();
if (abiVersion !== ABI_VERSION) {
    throw new Error(`${libraryPath}: library ABI version ${abiVersion}, but fastllm.js was written for ABI `
        + `version ${ABI_VERSION}`);
}

// ---------------------------------------------------------------------------------------------
// Types, field by field as in include/fastllm.h (koffi applies the platform's C alignment rules).

// C enums are int-sized on the platforms koffi supports.
koffi.alias('fastllm_status', 'int');
koffi.alias('fastllm_stop_reason', 'int');

koffi.opaque('fastllm_model');
koffi.opaque('fastllm_session');
koffi.opaque('fastllm_adapter');

const types = {
    fastllm_model_params: koffi.struct('fastllm_model_params', {
        n_threads: 'int32_t',
        use_mmap: 'int32_t',
        device: 'const char *',
        n_gpu_layers: 'int32_t',
    }),
    fastllm_model_info: koffi.struct('fastllm_model_info', {
        architecture: 'const char *',
        name: 'const char *',
        vocab_size: 'int32_t',
        context_length: 'int32_t',
        hidden_size: 'int32_t',
        num_layers: 'int32_t',
        num_heads: 'int32_t',
        num_kv_heads: 'int32_t',
        head_dim: 'int32_t',
        bos_id: 'int32_t',
        eos_id: 'int32_t',
        weight_dtype: 'const char *',
        n_params: 'uint64_t',
        backend: 'const char *',
        device_weight_bytes: 'uint64_t',
    }),
    fastllm_session_params: koffi.struct('fastllm_session_params', {
        n_ctx: 'int32_t',
        n_batch: 'int32_t',
        n_threads: 'int32_t',
        type_k: 'int32_t',
        type_v: 'int32_t',
        context_shift: 'int32_t',
        n_keep: 'int32_t',
        n_discard: 'int32_t',
        swa_full: 'int32_t',
    }),
    fastllm_session_memory_info: koffi.struct('fastllm_session_memory_info', {
        kv_bytes: 'uint64_t',
        kv_shared_bytes: 'uint64_t',
        kv_bytes_per_token: 'uint64_t',
        kv_capacity_bytes: 'uint64_t',
        session_bytes: 'uint64_t',
        compute_bytes: 'uint64_t',
    }),
    fastllm_sampling_params: koffi.struct('fastllm_sampling_params', {
        max_new_tokens: 'int32_t',
        temperature: 'float',
        top_k: 'int32_t',
        top_p: 'float',
        min_p: 'float',
        repetition_penalty: 'float',
        repeat_last_n: 'int32_t',
        seed: 'uint64_t',
        stop: 'const char **', // const char *const *: a JS array of strings, or null
        n_stop: 'int32_t',
        ignore_eos: 'int32_t',
        grammar: 'const char *',     // GBNF, or null
        json_schema: 'const char *', // a JSON Schema's text, or null
        grammar_triggers: 'const char **', // a JS array of strings, or null
        n_grammar_triggers: 'int32_t',
    }),
    fastllm_embed_params: koffi.struct('fastllm_embed_params', {
        pooling: 'int32_t', // fastllm_pooling: -1 the model's, 0 none, 1 mean, 2 cls, 3 last
        normalize: 'int32_t',
        truncate: 'int32_t',
        add_special: 'int32_t',
        n_threads: 'int32_t',
        n_batch: 'int32_t',
    }),
    fastllm_rerank_params: koffi.struct('fastllm_rerank_params', {
        normalize: 'int32_t',
        truncate: 'int32_t',
        n_threads: 'int32_t',
        n_batch: 'int32_t',
        instruction: 'const char *', // a decoder reranker's task, or null: the file's
    }),
    fastllm_generation_result: koffi.struct('fastllm_generation_result', {
        n_prompt_tokens: 'int32_t',
        n_generated_tokens: 'int32_t',
        stop_reason: 'fastllm_stop_reason',
        prompt_ms: 'double',
        generate_ms: 'double',
    }),
};

// typedef int (*fastllm_stream_callback)(const char *text, size_t text_len, void *user_data);
// text is declared as a byte pointer: it is not NUL-terminated, so it must not be read as a C string.
// The callback then receives the address, and reads exactly text_len bytes from it.
const StreamCallback = koffi.proto('int fastllm_stream_callback(const uint8_t *text, size_t text_len, void *user_data)');

const C = {
    version: lib.func('const char *fastllm_version(void)'),
    statusName: lib.func('const char *fastllm_status_name(fastllm_status status)'),
    lastError: lib.func('const char *fastllm_last_error(void)'),
    isa: lib.func('const char *fastllm_isa(void)'),

    modelDefaultParams: lib.func('fastllm_model_params fastllm_model_default_params(void)'),
    modelLoad: lib.func('fastllm_status fastllm_model_load(const char *path, const fastllm_model_params *params, '
        + '_Out_ fastllm_model **out_model)'),
    modelFree: lib.func('void fastllm_model_free(fastllm_model *model)'),
    modelGetInfo: lib.func('fastllm_status fastllm_model_get_info(const fastllm_model *model, '
        + '_Out_ fastllm_model_info *out_info)'),
    modelChatTemplate: lib.func('const char *fastllm_model_chat_template(const fastllm_model *model)'),

    // The text and output buffers are passed as Buffers / Int32Arrays (byte counts, not JS string lengths).
    tokenize: lib.func('fastllm_status fastllm_tokenize(const fastllm_model *model, const uint8_t *text, '
        + 'size_t text_len, int add_bos, int32_t *out_tokens, size_t out_capacity, _Out_ size_t *out_n_tokens)'),
    detokenize: lib.func('fastllm_status fastllm_detokenize(const fastllm_model *model, const int32_t *tokens, '
        + 'size_t n_tokens, uint8_t *out_text, size_t out_capacity, _Out_ size_t *out_len)'),

    embedDefaultParams: lib.func('fastllm_embed_params fastllm_embed_default_params(void)'),
    embed: lib.func('fastllm_status fastllm_embed(const fastllm_model *model, const char **texts, size_t n_texts, '
        + 'const fastllm_embed_params *params, float *out, size_t out_capacity, _Out_ size_t *out_n_vectors)'),

    rerankDefaultParams: lib.func('fastllm_rerank_params fastllm_rerank_default_params(void)'),
    rerank: lib.func('fastllm_status fastllm_rerank(const fastllm_model *model, const char *query, const char **documents, '
        + 'size_t n_documents, const fastllm_rerank_params *params, float *out_scores)'),

    sessionDefaultParams: lib.func('fastllm_session_params fastllm_session_default_params(void)'),
    sessionCreate: lib.func('fastllm_status fastllm_session_create(const fastllm_model *model, '
        + 'const fastllm_session_params *params, _Out_ fastllm_session **out_session)'),
    sessionFree: lib.func('void fastllm_session_free(fastllm_session *session)'),
    sessionReset: lib.func('fastllm_status fastllm_session_reset(fastllm_session *session)'),
    sessionNTokens: lib.func('int32_t fastllm_session_n_tokens(const fastllm_session *session)'),
    sessionNCtx: lib.func('int32_t fastllm_session_n_ctx(const fastllm_session *session)'),
    sessionGetTokens: lib.func('fastllm_status fastllm_session_get_tokens(const fastllm_session *session, '
        + 'int32_t *out_tokens, size_t out_capacity, _Out_ size_t *out_n_tokens)'),

    sessionFork: lib.func('fastllm_status fastllm_session_fork(const fastllm_session *src, int32_t n_tokens, '
        + 'const fastllm_session_params *params, _Out_ fastllm_session **out_session)'),
    sessionMemory: lib.func('fastllm_status fastllm_session_memory(const fastllm_session *session, '
        + '_Out_ fastllm_session_memory_info *out_info)'),
    sessionSaveState: lib.func('fastllm_status fastllm_session_save_state(const fastllm_session *session, '
        + 'uint8_t *out, size_t out_capacity, _Out_ size_t *out_len)'),
    sessionLoadState: lib.func('fastllm_status fastllm_session_load_state(fastllm_session *session, '
        + 'const uint8_t *data, size_t size, void *callback, void *user_data)'),
    sessionCancel: lib.func('fastllm_status fastllm_session_cancel(fastllm_session *session)'),
    adapterLoad: lib.func('fastllm_status fastllm_adapter_load(const fastllm_model *model, const char *path, '
        + '_Out_ fastllm_adapter **out_adapter)'),
    adapterFree: lib.func('void fastllm_adapter_free(fastllm_adapter *adapter)'),
    sessionSetAdapters: lib.func('fastllm_status fastllm_session_set_adapters(fastllm_session *session, '
        + 'fastllm_adapter **adapters, const float *scales, size_t n)'),

    samplingDefaultParams: lib.func('fastllm_sampling_params fastllm_sampling_default_params(void)'),
    jsonSchemaToGrammar: lib.func('fastllm_status fastllm_json_schema_to_grammar(const char *schema, '
        + 'uint8_t *out, size_t out_capacity, _Out_ size_t *out_len)'),
    sessionGenerate: lib.func('fastllm_status fastllm_session_generate(fastllm_session *session, '
        + 'const int32_t *prompt_tokens, size_t n_prompt_tokens, const fastllm_sampling_params *params, '
        + 'fastllm_stream_callback *callback, void *user_data, _Out_ fastllm_generation_result *out_result)'),
};

// fastllm_status and fastllm_stop_reason values.
const OK = 0;
const ERR_INVALID_ARGUMENT = 1;
const ERR_BUFFER_TOO_SMALL = 7;
const STOP_REASONS = ['eos', 'max_tokens', 'stop_string', 'callback', 'context_full', 'cancelled', 'grammar'];

// ---------------------------------------------------------------------------------------------
// Errors

/** A failure reported by libfastllm: .status (the code), .statusName ("FASTLLM_ERR_IO", ...). */
class FastllmError extends Error {
    constructor(status, message) {
        const statusName = C.statusName(status);
        super(`${message || 'failed'} (${statusName})`);
        this.name = 'FastllmError';
        this.status = status;
        this.statusName = statusName;
    }
}

function check(status) {
    if (status !== OK) throw new FastllmError(status, C.lastError());
}

// ---------------------------------------------------------------------------------------------
// Model

class Model {
    /**
     * Loads a .flm file. options.threads: default thread count of its sessions (0 = all cores);
     * options.useMmap (default true): map the weights in place instead of reading them.
     * options.device: "cpu" (default), "vulkan", "vulkan:N" or "auto"; options.gpuLayers: layers on
     * the device (-1, the default: all; 0: none).
     */
    static load(file, { threads = 0, useMmap = true, device = null, gpuLayers = -1 } = {}) {
        const params = C.modelDefaultParams();
        params.n_threads = threads;
        params.use_mmap = useMmap ? 1 : 0;
        params.device = device;
        params.n_gpu_layers = gpuLayers;
        const out = [null];
        check(C.modelLoad(String(file), params, out));
        return new Model(out[0]);
    }

    /** Wraps a fastllm_model handle; use Model.load(). */
    constructor(handle) {
        this._handle = handle;
        this._sessions = new Set(); // freed before the model, which must outlive them
        this._adapters = new Set(); // the same
        const info = {};
        check(C.modelGetInfo(handle, info));
        this.info = {
            architecture: info.architecture,
            name: info.name,
            vocabSize: info.vocab_size,
            contextLength: info.context_length,
            hiddenSize: info.hidden_size,
            numLayers: info.num_layers,
            numHeads: info.num_heads,
            numKvHeads: info.num_kv_heads,
            headDim: info.head_dim,
            bosId: info.bos_id,
            eosId: info.eos_id,
            weightDtype: info.weight_dtype,
            nParams: Number(info.n_params),
        };
        this.chatTemplate = C.modelChatTemplate(handle); // null if the model has none
    }

    /** The C handle; throws once the model is freed. */
    get handle() {
        if (this._handle === null) throw new FastllmError(ERR_INVALID_ARGUMENT, 'the model has been freed');
        return this._handle;
    }

    /** Frees the model and every session still open on it. Freeing twice does nothing. */
    free() {
        if (this._handle === null) return;
        for (const session of this._sessions) session.free();
        for (const adapter of this._adapters) adapter.close(); // they must not outlive the model
        C.modelFree(this._handle);
        this._handle = null;
    }

    /** Token ids (Int32Array) of text. addBos: true, false, or undefined for the model's default. */
    tokenize(text, { addBos } = {}) {
        const handle = this.handle;
        const bytes = Buffer.from(String(text), 'utf8');
        const flag = addBos === undefined ? -1 : (addBos ? 1 : 0);
        const n = [0];
        let ids = new Int32Array(bytes.length + 8);
        let status = C.tokenize(handle, bytes, bytes.length, flag, ids, ids.length, n);
        if (status === ERR_BUFFER_TOO_SMALL) { // the size query told us the needed length
            ids = new Int32Array(n[0]);
            status = C.tokenize(handle, bytes, bytes.length, flag, ids, ids.length, n);
        }
        check(status);
        return ids.slice(0, n[0]);
    }

    /** A LoRA adapter file (convert.py --adapter) for this model; set it with Session.setAdapters. */
    loadAdapter(file) {
        return new Adapter(this, file);
    }

    /**
     * Embeddings of texts (docs/embeddings.md): an array of Float32Arrays of info.hiddenSize, one per
     * text, or with pooling 'none' one per token of every text in order. pooling: undefined (the
     * model's own), 'mean', 'cls', 'last' or 'none'; normalize (default true): length 1; truncate
     * (default true): cut texts longer than the context, else throw.
     */
    embed(texts, { pooling, normalize = true, truncate = true } = {}) {
        const handle = this.handle;
        const list = Array.isArray(texts) ? texts.map(String) : [String(texts)];
        const poolings = { none: 0, mean: 1, cls: 2, last: 3 };
        if (pooling !== undefined && !(pooling in poolings)) throw new TypeError(`unknown pooling ${pooling}`);
        const params = C.embedDefaultParams();
        params.pooling = pooling === undefined ? -1 : poolings[pooling];
        params.normalize = normalize ? 1 : 0;
        params.truncate = truncate ? 1 : 0;
        const n = [0];
        const status = C.embed(handle, list, list.length, params, null, 0, n);
        if (status !== ERR_BUFFER_TOO_SMALL) check(status);
        const dim = this.info.hiddenSize;
        const out = new Float32Array(n[0] * dim);
        check(C.embed(handle, list, list.length, params, out, out.length, n));
        const rows = [];
        for (let i = 0; i < n[0]; i++) rows.push(out.slice(i * dim, (i + 1) * dim));
        return rows;
    }

    /**
     * A cross-encoder's score of each document for the query (a Float32Array in the documents'
     * order, higher: more relevant); normalize (default true): in (0, 1), as sentence-transformers'
     * CrossEncoder gives it.
     */
    rerank(query, documents, { normalize = true } = {}) {
        const docs = documents.map(String);
        const params = C.rerankDefaultParams();
        params.normalize = normalize ? 1 : 0;
        const scores = new Float32Array(docs.length);
        check(C.rerank(this.handle, String(query), docs, docs.length, params, scores));
        return scores;
    }

    /** UTF-8 text of token ids (an array or Int32Array); control tokens such as BOS give no text. */
    detokenize(ids) {
        const handle = this.handle;
        const tokens = Int32Array.from(ids);
        const len = [0];
        let buf = Buffer.alloc(16 * tokens.length + 16);
        let status = C.detokenize(handle, tokens, tokens.length, buf, buf.length, len);
        if (status === ERR_BUFFER_TOO_SMALL) {
            buf = Buffer.alloc(len[0] + 1); // + 1: the NUL
            status = C.detokenize(handle, tokens, tokens.length, buf, buf.length, len);
        }
        check(status);
        return buf.toString('utf8', 0, len[0]);
    }

    /** A new session (its own context and KV cache) over this model; see Session. */
    createSession(options) {
        return new Session(this, options);
    }
}

// ---------------------------------------------------------------------------------------------
// Session

const KV_TYPES = { f32: 0, f16: 1, q8: 2 };

// options: nCtx (0 = 4096, or the model's context if shorter), nBatch, threads, kvType (or typeK
// and typeV: 'f16' default, 'f32', 'q8'), contextShift, nKeep, nDiscard, swaFull.
function sessionParams({ nCtx = 0, nBatch = 0, threads = 0, kvType, typeK, typeV, contextShift = false,
    nKeep = 0, nDiscard = 0, swaFull = false } = {}) {
    const params = C.sessionDefaultParams();
    params.n_ctx = nCtx;
    if (nBatch) params.n_batch = nBatch;
    params.n_threads = threads;
    for (const [field, value] of [['type_k', typeK || kvType], ['type_v', typeV || kvType]]) {
        if (value === undefined) continue;
        if (!(value in KV_TYPES)) throw new TypeError(`${field} must be one of f32, f16, q8, not ${value}`);
        params[field] = KV_TYPES[value];
    }
    params.context_shift = contextShift ? 1 : 0;
    params.n_keep = nKeep;
    params.n_discard = nDiscard;
    params.swa_full = swaFull ? 1 : 0;
    return params;
}

/** A LoRA adapter file loaded for a model (Model.loadAdapter); close() frees the handle, deferred while sessions apply it. */
class Adapter {
    constructor(model, file) {
        const out = [null];
        check(C.adapterLoad(model.handle, String(file), out));
        this._handle = out[0];
        this.model = model;
        model._adapters.add(this);
    }

    get handle() {
        if (!this._handle) throw new FastllmError(1, 'the adapter is closed');
        return this._handle;
    }

    close() {
        if (this._handle) C.adapterFree(this._handle);
        this._handle = null;
        this.model._adapters.delete(this);
    }
}

class Session {
    /**
     * options.nCtx: context length in tokens (0 = the model's); options.nBatch: most tokens per
     * forward pass (0 = the library's default); options.threads (0 = the model's default).
     */
    constructor(model, options = {}, forkOf = null, forkN = 0) {
        const params = sessionParams(options);
        const out = [null];
        if (forkOf) check(C.sessionFork(forkOf.handle, forkN, params, out));
        else check(C.sessionCreate(model.handle, params, out));
        this._handle = out[0];
        this._options = options;
        this.model = model;
        model._sessions.add(this);
    }

    /**
     * A new session whose context is this one's first nTokens (default: all), sharing their KV
     * cache blocks (a persona evaluated once for many NPCs). options as the constructor's (default:
     * this session's); the KV types stay this one's.
     */
    fork(nTokens = this.nTokens, options = this._options) {
        return new Session(this.model, options, this, nTokens);
    }

    /**
     * The LoRA adapters this session applies from now on: a Map (or array of [adapter, scale]
     * pairs) from Adapter (Model.loadAdapter) to scale; empty: the base model.
     */
    setAdapters(adapters) {
        const pairs = [...(adapters instanceof Map ? adapters.entries() : adapters)];
        const handles = pairs.map(([a]) => a.handle), scales = pairs.map(([, s]) => s);
        check(C.sessionSetAdapters(this.handle, handles, scales, pairs.length));
        this._adapters = pairs;  // keeps the Adapter objects alive while set
    }

    /** What the session's memory costs now, in bytes (fastllm_session_memory_info's fields). */
    memory() {
        const info = {};
        check(C.sessionMemory(this.handle, info));
        return info;
    }

    /** The session's state (tokens, KV cache, a generation in progress) as a Buffer. */
    saveState() {
        const n = [0];
        const status = C.sessionSaveState(this.handle, null, 0, n);
        if (status !== ERR_BUFFER_TOO_SMALL) check(status);
        const out = Buffer.alloc(Number(n[0]));
        check(C.sessionSaveState(this.handle, out, out.length, n));
        return out;
    }

    /** Replaces the context with a saved state (of this model; else a FastllmError, nothing changed). */
    loadState(state) {
        check(C.sessionLoadState(this.handle, state, state.length, null, null));
    }

    /** Stops the evaluation or generation in progress; false if there is none. */
    cancel() {
        return C.sessionCancel(this.handle) === OK;
    }

    get handle() {
        if (this._handle === null) throw new FastllmError(ERR_INVALID_ARGUMENT, 'the session has been freed');
        return this._handle;
    }

    /** Frees the session. Freeing twice does nothing. */
    free() {
        if (this._handle === null) return;
        C.sessionFree(this._handle);
        this._handle = null;
        this.model._sessions.delete(this);
    }

    /** Forgets the context: the next generate() starts afresh. */
    reset() {
        check(C.sessionReset(this.handle));
    }

    /** Number of tokens in the context so far. */
    get nTokens() {
        return C.sessionNTokens(this.handle);
    }

    get nCtx() {
        return C.sessionNCtx(this.handle);
    }

    /** Ids of the context (prompts and generated tokens, oldest first), an Int32Array. */
    get tokens() {
        const ids = new Int32Array(Math.max(this.nTokens, 1));
        const n = [0];
        check(C.sessionGetTokens(this.handle, ids, this.nTokens, n));
        return ids.slice(0, n[0]);
    }

    /**
     * Appends prompt (a string, or token ids) to the context and generates a continuation.
     *
     * options: maxNewTokens (default 256), temperature (0 = greedy), topK, topP, minP,
     * repetitionPenalty, repeatLastN, seed, stop (a string or an array of strings, not included in
     * the output), ignoreEos, addBos (for a string prompt; by default only an empty session gets
     * BOS), grammar (a GBNF grammar the output must follow) or jsonSchema (a JSON Schema, as an
     * object or its JSON text, the output must be an instance of; stop reason "grammar" when the
     * output is complete), and onToken(piece): called with each piece of text as it is produced.
     * **onToken returning `false` stops the generation** (stop reason "callback"); any other return
     * value, undefined included, continues. Beware of arrow functions that return a value by
     * accident: `p => process.stdout.write(p)` returns false when stdout's buffer is full.
     * An exception thrown by onToken stops the generation and is rethrown here.
     *
     * Unset sampling options keep the library's defaults (temperature 0.8, topK 40, ...).
     * Returns { text, nTokens, nPromptTokens, stopReason, promptMs, generateMs }; stopReason is
     * "eos", "max_tokens", "stop_string", "callback", "context_full", "cancelled" or "grammar". The
     * generated tokens stay in the context, so a later call continues the conversation.
     */
    generate(prompt, options = {}) {
        const handle = this.handle;
        let ids;
        if (typeof prompt === 'string') {
            let addBos = options.addBos;
            if (addBos === undefined && this.nTokens > 0) addBos = false; // BOS opens a context only
            ids = this.model.tokenize(prompt, { addBos });
        } else {
            ids = Int32Array.from(prompt);
        }
        const params = samplingParams(options);

        const pieces = [];
        const decoder = new TextDecoder('utf-8'); // stream mode: no character is split across pieces
        const onToken = options.onToken;
        let callbackError = null;
        const stream = (text, textLen) => {
            try {
                // Copy: the bytes are valid only during this call.
                const n = Number(textLen);
                const bytes = n ? new Uint8Array(koffi.view(text, n)).slice() : new Uint8Array(0);
                const piece = decoder.decode(bytes, { stream: true });
                pieces.push(piece);
                if (onToken && onToken(piece) === false) return 1;
                return 0;
            } catch (e) { // do not let an exception unwind through C frames
                callbackError = e;
                return 1;
            }
        };
        const callback = koffi.register(stream, koffi.pointer(StreamCallback));
        const result = {};
        let status;
        try {
            status = C.sessionGenerate(handle, ids, ids.length, params, callback, null, result);
        } finally {
            koffi.unregister(callback);
        }
        if (callbackError) throw callbackError;
        check(status);
        return {
            text: pieces.join('') + decoder.decode(),
            nTokens: result.n_generated_tokens,
            nPromptTokens: result.n_prompt_tokens,
            stopReason: STOP_REASONS[result.stop_reason] ?? String(result.stop_reason),
            promptMs: result.prompt_ms,
            generateMs: result.generate_ms,
        };
    }
}

// fastllm_sampling_params from generate()'s options: the library's defaults, then what is given.
function samplingParams(options) {
    const p = C.samplingDefaultParams();
    const fields = {
        maxNewTokens: 'max_new_tokens', temperature: 'temperature', topK: 'top_k', topP: 'top_p', minP: 'min_p',
        repetitionPenalty: 'repetition_penalty', repeatLastN: 'repeat_last_n', seed: 'seed',
    };
    for (const [option, field] of Object.entries(fields)) {
        if (options[option] !== undefined && options[option] !== null) p[field] = options[option];
    }
    p.ignore_eos = options.ignoreEos ? 1 : 0;
    let stop = options.stop ?? [];
    if (typeof stop === 'string') stop = [stop];
    stop = stop.map(String);
    p.stop = stop.length ? stop : null; // koffi copies the strings for the duration of the call
    p.n_stop = stop.length;
    p.grammar = options.grammar ?? null;
    const schema = options.jsonSchema ?? null;
    p.json_schema = schema === null || typeof schema === 'string' ? schema : JSON.stringify(schema);
    const triggers = (options.grammarTriggers ?? []).map(String);
    p.grammar_triggers = triggers.length ? triggers : null;
    p.n_grammar_triggers = triggers.length;
    return p;
}

/**
 * The GBNF grammar of a JSON Schema (an object or its JSON text), as generate()'s jsonSchema uses
 * it. Throws FastllmError: statusName FASTLLM_ERR_UNSUPPORTED naming a keyword it does not
 * implement, FASTLLM_ERR_INVALID_ARGUMENT for a malformed schema.
 */
function jsonSchemaToGrammar(schema) {
    const text = typeof schema === 'string' ? schema : JSON.stringify(schema);
    const len = [0];
    let buf = Buffer.alloc(Buffer.byteLength(text) * 4 + 4096);
    let status = C.jsonSchemaToGrammar(text, buf, buf.length, len);
    if (status === ERR_BUFFER_TOO_SMALL) {
        buf = Buffer.alloc(len[0] + 1);
        status = C.jsonSchemaToGrammar(text, buf, buf.length, len);
    }
    check(status);
    return buf.toString('utf8', 0, len[0]);
}

module.exports = {
    ABI_VERSION,
    Model,
    Session,
    Adapter,
    FastllmError,
    STOP_REASONS,
    jsonSchemaToGrammar,
    libraryPath,
    version: C.version(),
    isa: () => C.isa(),
    types, // the koffi struct types, for layout checks
};
