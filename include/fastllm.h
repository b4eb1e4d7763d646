/*
 * fastllm.h — the public C API of libfastllm.
 *
 * Conventions (after sqlite3.h and llama.h):
 *  - Every name starts with fastllm_ / FASTLLM_. Handles are opaque pointers.
 *  - Functions that can fail return a fastllm_status; FASTLLM_OK is 0. After a failure,
 *    fastllm_last_error() gives a readable message for the calling thread.
 *  - Objects are created by *_load / *_create, which the caller owns, and released by the matching
 *    *_free. *_free(NULL) does nothing.
 *  - Params structs are filled by *_default_params() first, then changed field by field, so that
 *    new fields can be added without breaking callers.
 *  - No function calls exit() or abort(); C++ exceptions never cross this boundary.
 *
 * Threads: a fastllm_model is immutable after loading and may be shared by any number of threads
 * and sessions. A fastllm_session is used by one thread at a time (the caller serialises), but
 * fastllm_session_cancel may come from any thread. What runs in parallel: calls on different
 * sessions from different threads, and everything else (tokenizing, templates, sampling); what is
 * serialised: the forward passes of sessions of one model with the same n_threads, which take
 * turns on the model's one set of worker threads and working memory (each pass uses all of them,
 * so two at once would only compete for the cores).
 * What is tested (tests/cpp/test_threads.cpp, under ThreadSanitizer on every CI run): one model,
 * 8 threads each generating, truncating and resetting its own session (of 1 or 2 compute threads),
 * 2 threads tokenizing and detokenizing and 1 rendering chat templates on the same model, 4 of the
 * 8 forking their sessions from one shared persona session at once, 1 thread cancelling another's
 * generation, and a log callback receiving all their messages: no race reported, every output equal to the same
 * work done on one thread, no message lost. fastllm_generate_step over several sessions counts as
 * using each of them. Not covered: fastllm_log_set racing with messages in flight (it is locked,
 * but untested).
 */
#ifndef FASTLLM_H
#define FASTLLM_H

#include <stddef.h>
#include <stdint.h>

/* Windows: consumers of fastllm.dll see dllimport; a program linking the static library defines
 * FASTLLM_STATIC (the CMake target fastllm::fastllm_static does it). */
#if defined(_WIN32)
#  if defined(FASTLLM_BUILD)
#    define FASTLLM_API __declspec(dllexport)
#  elif defined(FASTLLM_STATIC)
#    define FASTLLM_API
#  else
#    define FASTLLM_API __declspec(dllimport)
#  endif
#else
#  define FASTLLM_API __attribute__((visibility("default")))
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* Library version (of this header; CMake and the Python package read it from here) and ABI
 * version. The ABI version changes whenever a struct layout or a function signature changes, or a
 * function that the bindings need is added; bindings compare it with fastllm_abi_version(). */
#define FASTLLM_VERSION_MAJOR 0
#define FASTLLM_VERSION_MINOR 6
#define FASTLLM_VERSION_PATCH 0
#define FASTLLM_ABI_VERSION 13

typedef enum fastllm_status {
    FASTLLM_OK = 0,
    FASTLLM_ERR_INVALID_ARGUMENT = 1, /* NULL handle, bad parameter value */
    FASTLLM_ERR_IO = 2,               /* file cannot be opened, read or mapped */
    FASTLLM_ERR_BAD_FORMAT = 3,       /* not a .flm file, truncated, corrupted, wrong version */
    FASTLLM_ERR_UNSUPPORTED = 4,      /* valid file but an architecture/dtype this build lacks */
    FASTLLM_ERR_OUT_OF_MEMORY = 5,
    FASTLLM_ERR_CONTEXT_FULL = 6,     /* the tokens do not fit into the session's context */
    FASTLLM_ERR_BUFFER_TOO_SMALL = 7, /* output buffer too small; the needed size is returned */
    FASTLLM_ERR_TOKEN_OUT_OF_RANGE = 8,
    FASTLLM_ERR_INTERNAL = 9,
    FASTLLM_ERR_CANCELLED = 10        /* fastllm_session_cancel stopped an evaluation (see there) */
} fastllm_status;

/* Version string such as "0.1.0" (static storage; do not free). */
FASTLLM_API const char *fastllm_version(void);
/* ABI version of the loaded library; compare with FASTLLM_ABI_VERSION. */
FASTLLM_API int fastllm_abi_version(void);
/* Static name of a status code, e.g. "FASTLLM_ERR_BAD_FORMAT". */
FASTLLM_API const char *fastllm_status_name(fastllm_status status);
/* Message of the last failure on the calling thread ("" if none). Valid until the next call into
 * the library from the same thread. */
FASTLLM_API const char *fastllm_last_error(void);
/* Instruction set the kernels use (static storage): "amx", "avx512", "avxvnni", "avx2" or "scalar" on x86-64;
 * "neon_dotprod", "neon" or "scalar" on aarch64; "scalar" elsewhere. The environment variable
 * FASTLLM_ISA, set to one of these names of the machine's architecture, forces a lower level than
 * the CPU supports (a level the CPU lacks gives the best one below it; other names are ignored). */
FASTLLM_API const char *fastllm_isa(void);

/* Diagnostics. The library never prints to stdout. Its messages (model loaded, session created,
 * failures, generation timings) go to the callback set here; with no callback they are dropped,
 * unless the environment variable FASTLLM_LOG=error|warn|info|debug sends that level and the more
 * severe ones to stderr. The callback is process-wide and receives every level; it is called from
 * the thread that called into the library, one message at a time, and must not call fastllm
 * functions. `message` has no trailing newline and is valid only during the call. Passing NULL
 * restores the default. */
typedef enum fastllm_log_level {
    FASTLLM_LOG_ERROR = 0,
    FASTLLM_LOG_WARN = 1,
    FASTLLM_LOG_INFO = 2,
    FASTLLM_LOG_DEBUG = 3
} fastllm_log_level;
typedef void (*fastllm_log_callback)(fastllm_log_level level, const char *message, void *user_data);
FASTLLM_API void fastllm_log_set(fastllm_log_callback callback, void *user_data);

/* ------------------------------------------------------------------------------------------ */
/* Model: the weights, the config and the tokenizer of one .flm file.                          */

typedef struct fastllm_model fastllm_model;

typedef struct fastllm_model_params {
    int32_t n_threads; /* default threads for this model's sessions; 0 = all cores */
    int32_t use_mmap;  /* 1 (default): map the file and use the weights in place; 0: read it */
    /* What runs the model (docs/gpu.md): NULL or "cpu" (the default), "vulkan" (the best usable
     * Vulkan device), "vulkan:N" (device N of fastllm_devices), or "auto" (a Vulkan GPU if one is
     * usable, else the CPU, with the reason logged; a CPU-type Vulkan device such as Mesa's
     * lavapipe is never chosen automatically). A device that cannot be used fails the load with a
     * status and a message naming it and what is missing. Copied during the load. */
    const char *device;
    /* Layers on the device: -1 (the default) or at least the layer count: all; 0: none (the CPU
     * runs the model); n: the last n layers and the output head on the device, the embeddings and
     * the first layers on the CPU (as llama.cpp's n_gpu_layers), the hidden state copied once per
     * pass between them. Ignored on the CPU. */
    int32_t n_gpu_layers;
} fastllm_model_params;

FASTLLM_API fastllm_model_params fastllm_model_default_params(void);

/* Loads a .flm file. On success *out_model owns the model; free it with fastllm_model_free after
 * every session that uses it is freed. params may be NULL (defaults). */
FASTLLM_API fastllm_status fastllm_model_load(const char *path, const fastllm_model_params *params,
                                              fastllm_model **out_model);
/* Loads a .flm model from the size bytes at data (a file inside a game's asset pack, say), with
 * the same checks as fastllm_model_load; messages call it "<memory>". The bytes are copied into
 * memory the model owns, so data may be freed as soon as this returns (a file path with mmap
 * avoids the copy); params->use_mmap is ignored. */
FASTLLM_API fastllm_status fastllm_model_load_from_memory(const void *data, size_t size,
                                                          const fastllm_model_params *params,
                                                          fastllm_model **out_model);
FASTLLM_API void fastllm_model_free(fastllm_model *model);

typedef struct fastllm_model_info {
    const char *architecture; /* e.g. "llama"; owned by the model */
    const char *name;         /* owned by the model */
    int32_t vocab_size;
    int32_t context_length;
    int32_t hidden_size;
    int32_t num_layers;
    int32_t num_heads;
    int32_t num_kv_heads;
    int32_t head_dim;
    int32_t bos_id; /* -1 if none */
    int32_t eos_id; /* -1 if none */
    const char *weight_dtype; /* the first layer's attn_qkv (f32 f16 bf16 q8 q6 q4 q4_g64 q4_g128 q4m q3k q4k q5k q6k; presets mix them); owned by the model */
    uint64_t n_params;
    const char *backend;          /* what runs it, e.g. "cpu avx512, 8 threads" or "vulkan NVIDIA H200 (NVIDIA discrete)"; owned by the model */
    uint64_t device_weight_bytes; /* weights copied to a device's memory (0 on the CPU, which reads the file in place) */
} fastllm_model_info;

/* One Vulkan device of this machine, as fastllm_devices lists it. */
typedef struct fastllm_device_info {
    int32_t index;         /* N of "vulkan:N" */
    int32_t usable;        /* 1 if fastllm can run on it */
    char name[256];
    char vendor[32];       /* "NVIDIA", "AMD", "Intel", "Mesa", ... */
    char type[16];         /* "discrete", "integrated", "virtual", "cpu" or "other" */
    char missing[128];     /* what it lacks when not usable */
    uint64_t memory_bytes; /* its largest device-local memory heap */
    uint32_t api_version;  /* Vulkan version, VK_MAKE_API_VERSION's packing */
} fastllm_device_info;

/* A game's own Vulkan device, for fastllm to run on instead of opening a second one (docs/gpu.md).
 * The handles are Vulkan's, as void pointers so that this header needs no Vulkan header. The
 * device must have been created with Vulkan 1.2's bufferDeviceAddress and the core shaderInt64
 * features enabled, and the queue must not be used from another thread while fastllm runs a
 * pass on it (give fastllm a queue of its own where the family has more than one). fastllm never
 * destroys any of them: they must outlive every model that uses them. */
typedef struct fastllm_vulkan_handles {
    void *instance;               /* VkInstance (Vulkan 1.2 or later) */
    void *physical_device;        /* VkPhysicalDevice */
    void *device;                 /* VkDevice */
    uint32_t queue_family;        /* a queue family with compute */
    uint32_t queue_index;
    void *get_instance_proc_addr; /* PFN_vkGetInstanceProcAddr; NULL: the Vulkan loader's */
} fastllm_vulkan_handles;

/* Makes these handles the process's Vulkan device: models loaded with device "vulkan" (or
 * "auto") afterwards run on it. Call it before any model uses Vulkan; once one has,
 * FASTLLM_ERR_INVALID_ARGUMENT. FASTLLM_ERR_UNSUPPORTED when the physical device lacks what
 * fastllm needs (the message says what) or the build has no Vulkan backend. */
FASTLLM_API fastllm_status fastllm_vulkan_set_device(const fastllm_vulkan_handles *handles);

/* The machine's Vulkan devices: writes at most capacity entries, *out_n receives how many there
 * are. No Vulkan on this machine (or a build without it) is not an error: *out_n is 0, and the
 * reason is the thread's message (fastllm_last_error). */
FASTLLM_API fastllm_status fastllm_devices(fastllm_device_info *out, int32_t capacity, int32_t *out_n);

FASTLLM_API fastllm_status fastllm_model_get_info(const fastllm_model *model, fastllm_model_info *out_info);

/* Chat template text stored in the model, or NULL if it has none. Owned by the model. */
FASTLLM_API const char *fastllm_model_chat_template(const fastllm_model *model);

/* ------------------------------------------------------------------------------------------ */
/* Tokenizer (part of the model; thread-safe).                                                 */

/* Encodes text_len bytes of UTF-8 into token ids. add_bos: 1 prepend BOS, 0 don't, -1 the model's
 * default. Writes at most out_capacity ids; *out_n_tokens receives the number of ids of the full
 * encoding. If it exceeds out_capacity, returns FASTLLM_ERR_BUFFER_TOO_SMALL (call again with a
 * buffer of *out_n_tokens). */
FASTLLM_API fastllm_status fastllm_tokenize(const fastllm_model *model, const char *text, size_t text_len,
                                            int add_bos, int32_t *out_tokens, size_t out_capacity,
                                            size_t *out_n_tokens);

/* Decodes ids to UTF-8 text as the reference tokenizer's decode does (control tokens such as BOS
 * give no text). Writes a NUL-terminated string; *out_len receives its length without the NUL.
 * Needs out_capacity >= *out_len + 1, else FASTLLM_ERR_BUFFER_TOO_SMALL. */
FASTLLM_API fastllm_status fastllm_detokenize(const fastllm_model *model, const int32_t *tokens, size_t n_tokens,
                                              char *out_text, size_t out_capacity, size_t *out_len);

/* The raw bytes of one token as it contributes to a stream of text (a leading space is kept,
 * byte pieces give their byte, control tokens give nothing). Not NUL-terminated; same buffer
 * convention as fastllm_detokenize but without room for a NUL. */
FASTLLM_API fastllm_status fastllm_token_to_piece(const fastllm_model *model, int32_t token, char *out,
                                                  size_t out_capacity, size_t *out_len);

/* ------------------------------------------------------------------------------------------ */
/* Embeddings (docs/embeddings.md): an encoder's (BERT) or a decoder's hidden states, pooled.    */

typedef enum fastllm_pooling {
    FASTLLM_POOLING_MODEL = -1, /* what the model's file says (its sentence-transformers pooling), else
                                 * cls for an encoder and last for a decoder */
    FASTLLM_POOLING_NONE = 0,   /* one vector per token */
    FASTLLM_POOLING_MEAN = 1,   /* the mean over every token, the special ones included */
    FASTLLM_POOLING_CLS = 2,    /* the first token's */
    FASTLLM_POOLING_LAST = 3    /* the last token's (a decoder embedding model's) */
} fastllm_pooling;

typedef struct fastllm_embed_params {
    int32_t pooling;     /* a fastllm_pooling; default FASTLLM_POOLING_MODEL */
    int32_t normalize;   /* 1 (default): every vector scaled to length 1 (L2); 0: as pooled */
    int32_t truncate;    /* 1 (default): a text longer than the model's context keeps its first
                          * tokens and its special tokens, a token list its first tokens;
                          * 0: FASTLLM_ERR_CONTEXT_FULL */
    int32_t add_special; /* texts: 1 the model's special tokens ([CLS] ... [SEP], or BOS), 0 none,
                          * -1 (default) as fastllm_tokenize's default */
    int32_t n_threads;   /* 0 (default): the model's */
    int32_t n_batch;     /* tokens per pass; 0 (default): 512. An encoder's input is never split:
                          * a pass holds at least the longest */
} fastllm_embed_params;

FASTLLM_API fastllm_embed_params fastllm_embed_default_params(void);

/* Embeds n_texts NUL-terminated UTF-8 texts, several in one pass over the weights. The vectors go
 * to out (out_capacity floats) row-major, hidden_size floats each (fastllm_model_info): one per
 * text in order, or with FASTLLM_POOLING_NONE one per token of every text in order.
 * *out_n_vectors (may be NULL) receives their number; FASTLLM_ERR_BUFFER_TOO_SMALL when they do
 * not fit (nothing is computed; call with out NULL to ask). Errors: FASTLLM_ERR_INVALID_ARGUMENT
 * for no texts or a text that gives no tokens; FASTLLM_ERR_CONTEXT_FULL for one too long without
 * truncate. Thread-safe: the passes take turns with the model's sessions' passes. */
FASTLLM_API fastllm_status fastllm_embed(const fastllm_model *model, const char *const *texts, size_t n_texts,
                                         const fastllm_embed_params *params, float *out, size_t out_capacity,
                                         size_t *out_n_vectors);
/* The same for token lists: tokens[i] holds n_tokens[i] ids, used as they are (add_special is
 * ignored). */
FASTLLM_API fastllm_status fastllm_embed_tokens(const fastllm_model *model, const int32_t *const *tokens,
                                                const size_t *n_tokens, size_t n_inputs,
                                                const fastllm_embed_params *params, float *out,
                                                size_t out_capacity, size_t *out_n_vectors);

typedef struct fastllm_rerank_params {
    int32_t normalize; /* 1 (default): each score is the sigmoid of the classifier's, in (0, 1), as
                        * sentence-transformers' CrossEncoder.predict gives it; 0: the raw score */
    int32_t truncate;  /* 1 (default): a pair past the context is cut longest first, as HuggingFace
                        * tokenizers cuts it; 0: FASTLLM_ERR_CONTEXT_FULL */
    int32_t n_threads; /* 0 (default): the model's */
    int32_t n_batch;   /* tokens per pass; 0 (default): 512 */
    const char *instruction; /* a decoder reranker's task ("Given a web search query, retrieve relevant
                              * passages that answer the query"); NULL (default): the file's */
} fastllm_rerank_params;

FASTLLM_API fastllm_rerank_params fastllm_rerank_default_params(void);

/* How well each of n_documents answers the query (docs/embeddings.md), by a cross-encoder (a BERT
 * with a one-label classifier, BertForSequenceClassification: ms-marco-MiniLM, bge-reranker): the
 * classifier over [CLS] query [SEP] document [SEP]; or by a decoder reranker (Qwen3-Reranker,
 * converted with its rerank keys): the logit of "yes" minus that of "no" after its prompt.
 * out_scores: n_documents floats, in the documents' order (higher: more relevant).
 * FASTLLM_ERR_UNSUPPORTED for a model that is neither; FASTLLM_ERR_INVALID_ARGUMENT for no documents. */
FASTLLM_API fastllm_status fastllm_rerank(const fastllm_model *model, const char *query, const char *const *documents,
                                          size_t n_documents, const fastllm_rerank_params *params, float *out_scores);

/* ------------------------------------------------------------------------------------------ */
/* Chat templates                                                                              */

typedef struct fastllm_chat_message {
    const char *role;    /* "system", "user" or "assistant" */
    const char *content; /* UTF-8 */
} fastllm_chat_message;

/* Renders messages into prompt text with a chat template: tmpl, or the model's own when tmpl is
 * NULL. The template is a Jinja program (what models ship in tokenizer_config.json's
 * chat_template, chat_template.jinja or a GGUF's tokenizer.chat_template), run by the library's
 * own engine in transformers' environment, so the text is what transformers'
 * apply_chat_template gives (docs/templates.md). bos_token and eos_token are the text of the
 * model's BOS and EOS tokens. Errors: FASTLLM_ERR_INVALID_ARGUMENT for a template error (the
 * message gives its line and column), for a conversation the template rejects (its
 * raise_exception message: roles not alternating, ...) and for an empty conversation (as
 * transformers); FASTLLM_ERR_UNSUPPORTED when tmpl is NULL and the model has no template.
 * add_generation_prompt: 1 to end with the opening of the assistant's turn. Output buffer
 * convention as fastllm_detokenize (NUL-terminated). Tokenize the result with add_bos = 0
 * (templates that want BOS write it as text). Byte-level BPE models match their special tokens
 * (<|im_start|>, ...) in text as single ids; SentencePiece models match their added tokens
 * (Phi-3's <|user|>, <|end|>, ...) too, but treat the text <s>, </s> and <unk> as plain text, as
 * sentencepiece does (so a template that writes BOS as text does not give the BOS id with them).
 * Messages with tool calls, content parts or other fields: fastllm_chat_apply_template_json.
 * Equivalent to fastllm_chat_apply_template_v2 with default params but this add_generation_prompt. */
FASTLLM_API fastllm_status fastllm_chat_apply_template(const fastllm_model *model, const char *tmpl,
                                                       const fastllm_chat_message *messages, size_t n_messages,
                                                       int add_generation_prompt, char *out_text,
                                                       size_t out_capacity, size_t *out_len);

/* enable_thinking values of fastllm_chat_params. */
#define FASTLLM_THINKING_UNSET (-1) /* the template's enable_thinking is undefined (the keyword not passed) */
#define FASTLLM_THINKING_OFF 0      /* enable_thinking=False */
#define FASTLLM_THINKING_ON 1       /* enable_thinking=True */

typedef struct fastllm_chat_params {
    int32_t add_generation_prompt; /* 1 (default): end with the opening of the assistant's turn; 0: don't */
    /* The template variable enable_thinking, as apply_chat_template(..., enable_thinking=...) passes
     * it: FASTLLM_THINKING_UNSET (default), _OFF or _ON. Templates that do not read it ignore it
     * (as in transformers); Qwen3's opens the generation with an empty <think></think> block when
     * it is OFF. Other values: FASTLLM_ERR_INVALID_ARGUMENT. */
    int32_t enable_thinking;
    /* NULL (default), or an array of n_messages entries: entry i is message i's reasoning_content
     * field (UTF-8, NUL-terminated), NULL when the message has none. Qwen3's template puts an
     * assistant message's reasoning_content into its <think> block (without it, the block is cut
     * out of the content); templates that do not read the field ignore it. Read during the call
     * only. */
    const char *const *reasoning_content;
} fastllm_chat_params;

FASTLLM_API fastllm_chat_params fastllm_chat_default_params(void);

/* fastllm_chat_apply_template with the options of params (NULL: defaults). Same rendering,
 * errors and output buffer convention. */
FASTLLM_API fastllm_status fastllm_chat_apply_template_v2(const fastllm_model *model, const char *tmpl,
                                                          const fastllm_chat_message *messages, size_t n_messages,
                                                          const fastllm_chat_params *params, char *out_text,
                                                          size_t out_capacity, size_t *out_len);

/* The chat template (tmpl, or the model's own when NULL) over variables_json: a JSON object whose
 * members are the template's variables, as transformers' apply_chat_template(conversation,
 * tools=..., add_generation_prompt=..., **kwargs) passes them: "messages" (required, non-empty:
 * OpenAI's shape, each with "role" and "content" as a string or a list of parts, and whatever
 * else the template reads: "tool_calls", "tool_call_id", "name", "reasoning_content", ...),
 * "tools" (OpenAI's list of {"type": "function", "function": {...}}), "add_generation_prompt"
 * (true unless given, as fastllm_chat_default_params), "enable_thinking", "documents", any other
 * keyword. bos_token and eos_token are the model's unless given. Errors and output as
 * fastllm_chat_apply_template, and FASTLLM_ERR_INVALID_ARGUMENT for JSON that does not parse. */
FASTLLM_API fastllm_status fastllm_chat_apply_template_json(const fastllm_model *model, const char *tmpl,
                                                            const char *variables_json, char *out_text,
                                                            size_t out_capacity, size_t *out_len);

/* Tool calls. The format a model writes its calls in is the one its chat template teaches (tmpl,
 * or the model's own when NULL; model may be NULL when tmpl is given): "hermes"
 * (<tool_call>{"name": ..., "arguments": {...}}</tool_call>: Qwen2.5 / Qwen3, Hermes, SmolLM3...),
 * "mistral" ([TOOL_CALLS]), "llama3" ({"name": ..., "parameters": {...}}, <|python_tag|>),
 * "functools" (Phi-4-mini, FireFunction), "glm4" (name\n{...}), "glm4.5" (<arg_key> /
 * <arg_value>), else "generic" (a JSON object {"name": ..., "arguments": ...} or
 * {"tool_calls": [...]}). docs/templates.md#tool-calls.
 *
 * fastllm_chat_parse_tool_calls: the calls in reply (the generated text), as JSON:
 * {"format": "hermes", "content": "text outside the calls", "tool_calls": [{"name": ...,
 * "arguments": "<compact JSON object>"}]}. tools_json: OpenAI's tool list (NULL: any name); a
 * call to a function not in it, or one that does not parse, leaves the whole reply as content
 * with no calls (never an error). Output as fastllm_detokenize. */
FASTLLM_API fastllm_status fastllm_chat_parse_tool_calls(const fastllm_model *model, const char *tmpl,
                                                         const char *reply, const char *tools_json, char *out_json,
                                                         size_t out_capacity, size_t *out_len);

/* For a stream that sends a reply's text on while it is generated: *out_safe receives how many
 * bytes of text (the reply so far) are surely not part of a tool call in the template's format:
 * the text before a call marker ("<tool_call>", "[TOOL_CALLS]", ...) or the part of one that the
 * next text could complete; 0 while a reply that may be a JSON call ("generic", "llama3": it
 * starts with '{' or '[') or a "glm4" reply is undecided; all of it when done = 1. */
FASTLLM_API fastllm_status fastllm_chat_tool_text_safe(const fastllm_model *model, const char *tmpl, const char *text,
                                                       int done, size_t *out_safe);

/* A GBNF grammar (fastllm_sampling_params.grammar) whose matches are replies made of a tool call
 * in the template's format, to one of tools_json's functions (tool_name NULL: OpenAI's
 * tool_choice "required") or to the function tool_name (a named tool_choice), its arguments
 * matching the function's parameters schema; parallel = 1 allows one or more calls.
 * FASTLLM_ERR_UNSUPPORTED for the formats without a grammar (glm4, glm4.5) or a schema keyword the
 * JSON-schema converter lacks; FASTLLM_ERR_INVALID_ARGUMENT for malformed tools or an unknown
 * tool_name. Output as fastllm_detokenize. */
FASTLLM_API fastllm_status fastllm_chat_tool_grammar(const fastllm_model *model, const char *tmpl,
                                                     const char *tools_json, const char *tool_name, int parallel,
                                                     char *out_grammar, size_t out_capacity, size_t *out_len);

/* For tool_choice "auto": the triggers (fastllm_sampling_params.grammar_triggers) that make
 * fastllm_chat_tool_grammar's grammar lazy, so that a reply is free text until a call begins and
 * the call is then constrained, as a JSON array of strings: ["<tool_call>"] for hermes,
 * ["^{", "^["] for the generic JSON format (a reply that begins with '{' or '[' is a call).
 * FASTLLM_ERR_UNSUPPORTED for the formats without a grammar. Output as fastllm_detokenize. */
FASTLLM_API fastllm_status fastllm_chat_tool_triggers(const fastllm_model *model, const char *tmpl, char *out_json,
                                                      size_t out_capacity, size_t *out_len);

/* Renders any Jinja template tmpl, with no model: the variables are the members of variables_json
 * (a JSON object; nothing is added, not even bos_token). The same engine and environment as the
 * chat templates (trim_blocks, lstrip_blocks, tojson, raise_exception, strftime_now, loop
 * controls), bounded: a template that runs past 5 million steps, nests macro calls deeper than
 * 100 or writes more than 32 MiB fails with FASTLLM_ERR_INVALID_ARGUMENT. Output as
 * fastllm_detokenize. Safe from any thread. */
FASTLLM_API fastllm_status fastllm_template_render(const char *tmpl, const char *variables_json, char *out_text,
                                                   size_t out_capacity, size_t *out_len);

/* ------------------------------------------------------------------------------------------ */
/* Session: one conversation's state (KV cache and working memory) over a shared model.        */

typedef struct fastllm_session fastllm_session;

/* Element types of the KV cache (fastllm_session_params.type_k / type_v). Per token, SmolLM2-135M
 * keeps 45 KiB of keys and values in f32, 22.5 KiB in f16, 12.7 KiB in q8 (int8 codes in blocks of
 * 32 with a float scale). f16 is the default: its logits stay within 2e-3 of f32's (relative to the
 * largest); q8 costs under 0.5% of perplexity (tests/test_kv_cache.py). */
typedef enum fastllm_kv_type {
    FASTLLM_KV_F32 = 0,
    FASTLLM_KV_F16 = 1,
    FASTLLM_KV_Q8 = 2
} fastllm_kv_type;

typedef struct fastllm_session_params {
    /* context length in tokens; 0 (default) = 4096, or the model's context length if shorter. The
     * KV cache grows with the tokens actually held (blocks of 32 positions), so n_ctx is a limit,
     * not an allocation: a session holding 1,000 tokens costs 1,024 positions of memory. */
    int32_t n_ctx;
    int32_t n_batch;   /* most tokens evaluated in one forward pass (longer inputs are split); default 256 */
    /* threads a forward pass uses; 0 = the model's default. The threads and the working memory
     * (activations) belong to the model, one set per distinct n_threads, shared by all its sessions. */
    int32_t n_threads;
    int32_t type_k;    /* fastllm_kv_type of the keys; default FASTLLM_KV_F16 */
    int32_t type_v;    /* fastllm_kv_type of the values; default FASTLLM_KV_F16 */
    /* 1: when the context is full, drop n_discard tokens after the first n_keep (the persona) and
     * go on, instead of FASTLLM_ERR_CONTEXT_FULL / FASTLLM_STOP_CONTEXT_FULL; the kept keys are
     * re-rotated to their new positions, as llama.cpp's context shift does. Default 0. */
    int32_t context_shift;
    int32_t n_keep;    /* tokens at the start a shift keeps; default 0; must be < n_ctx */
    int32_t n_discard; /* tokens a shift drops; 0 (default) = half of those after n_keep */
    /* 0 (default): a layer with a sliding window (Mistral, Gemma 2 and 3, Qwen2's, ...) keeps only
     * the positions its queries can still see, its window and 32 more (and the first n_keep with
     * context_shift): Gemma-3-1B at n_ctx 8192 holds 4.6x less. Truncating or forking further back
     * than that makes the next evaluation evaluate the kept tokens again, from the first (the layers
     * with a window need their predecessors' states). 1: every layer keeps every position, as
     * llama.cpp's --swa-full. */
    int32_t swa_full;
} fastllm_session_params;

FASTLLM_API fastllm_session_params fastllm_session_default_params(void);

/* Creates a session. Its KV cache is allocated as its context grows (FASTLLM_ERR_OUT_OF_MEMORY
 * from the evaluation that cannot get a block, leaving the context as it was). The model must
 * outlive the session. params may be NULL (defaults). */
FASTLLM_API fastllm_status fastllm_session_create(const fastllm_model *model, const fastllm_session_params *params,
                                                  fastllm_session **out_session);
/* Creates a session whose context is the first n_tokens of src's (a persona or system prompt
 * evaluated once), without evaluating them again and without copying their KV cache: the two
 * sessions share its blocks, reference counted, and a block is copied only when one of them writes
 * into it (the partly filled last one, on the first new token). params may be NULL: then src's
 * (its n_ctx may differ; the KV types must be src's). src is read during the call only and must
 * not be in use by another thread then; afterwards both sessions are independent (either may be
 * freed first). */
FASTLLM_API fastllm_status fastllm_session_fork(const fastllm_session *src, int32_t n_tokens,
                                                const fastllm_session_params *params, fastllm_session **out_session);
FASTLLM_API void fastllm_session_free(fastllm_session *session);

typedef struct fastllm_session_memory_info {
    uint64_t kv_bytes;           /* KV cache blocks the session holds (shared ones counted in full) */
    uint64_t kv_shared_bytes;    /* of kv_bytes: blocks another session also holds (a forked prefix) */
    uint64_t kv_bytes_per_token; /* in the session's KV types */
    uint64_t kv_capacity_bytes;  /* kv_bytes at a full context of n_ctx tokens */
    uint64_t session_bytes;      /* the session's other memory: logits, token list, block table */
    uint64_t compute_bytes;      /* working activations of its passes: the model's, shared by every
                                  * session with the same n_threads (count them once) */
} fastllm_session_memory_info;

/* What the session's memory costs now, so that a game can budget its NPCs. */
FASTLLM_API fastllm_status fastllm_session_memory(const fastllm_session *session,
                                                  fastllm_session_memory_info *out_info);
/* Forgets all tokens: the next evaluation starts a fresh context. */
FASTLLM_API fastllm_status fastllm_session_reset(fastllm_session *session);
/* Keeps the first n_keep tokens of the context and forgets the rest (their KV cache entries are
 * reused). To continue from a common prefix instead of recomputing it: truncate, then eval the
 * tokens that differ. n_keep larger than the context is an error. A model with sliding-window
 * layers keeps only their windows (see swa_full): truncating further back than that keeps the
 * tokens but not their KV cache, and the next evaluation evaluates them again
 * (fastllm_session_n_cached says how many are held). */
FASTLLM_API fastllm_status fastllm_session_truncate(fastllm_session *session, int32_t n_keep);
/* Of the context's tokens, how many have their KV cache held (the first ones); the rest are
 * evaluated by the next evaluation (a token sampled last, or after a truncation past a window). */
FASTLLM_API int32_t fastllm_session_n_cached(const fastllm_session *session);
/* Number of tokens in the session's context so far (evaluated or pending). */
FASTLLM_API int32_t fastllm_session_n_tokens(const fastllm_session *session);
FASTLLM_API int32_t fastllm_session_n_ctx(const fastllm_session *session);
/* Copies the ids of the session's context (prompts and generated tokens, oldest first) into
 * out_tokens; *out_n_tokens receives their number. FASTLLM_ERR_BUFFER_TOO_SMALL if it exceeds
 * out_capacity. */
FASTLLM_API fastllm_status fastllm_session_get_tokens(const fastllm_session *session, int32_t *out_tokens,
                                                      size_t out_capacity, size_t *out_n_tokens);

typedef enum fastllm_logits_mode {
    FASTLLM_LOGITS_NONE = 0, /* only fill the KV cache */
    FASTLLM_LOGITS_LAST = 1, /* logits of the last token: vocab_size floats */
    FASTLLM_LOGITS_ALL = 2   /* logits of every token: n_tokens x vocab_size floats, row-major */
} fastllm_logits_mode;

/* Appends n_tokens ids to the session's context and runs the model over them. out_logits is a
 * caller buffer of the size the mode needs (may be NULL for FASTLLM_LOGITS_NONE).
 * Errors: FASTLLM_ERR_TOKEN_OUT_OF_RANGE (an id outside the vocabulary), FASTLLM_ERR_CONTEXT_FULL
 * (the tokens do not fit); on error the session's context is unchanged. */
FASTLLM_API fastllm_status fastllm_session_eval(fastllm_session *session, const int32_t *tokens, size_t n_tokens,
                                                fastllm_logits_mode mode, float *out_logits);

/* ------------------------------------------------------------------------------------------ */
/* Generation                                                                                  */

typedef struct fastllm_sampling_params {
    int32_t max_new_tokens;     /* default 256 */
    float temperature;          /* <= 0: greedy (argmax). default 0.8 */
    int32_t top_k;              /* 0 = off. default 40 */
    float top_p;                /* 1.0 = off. default 0.95 */
    float min_p;                /* 0 = off. default 0.05 */
    float repetition_penalty;   /* 1.0 = off (HF convention: divide positive logits). default 1.0 */
    int32_t repeat_last_n;      /* tokens the penalty looks back on; 0 = whole context. default 64 */
    uint64_t seed;              /* same seed, same prompt, same params: same output (within a version
                                 * of the library: a new one may draw other tokens for a seed, from the
                                 * same distribution). default 0 */
    const char *const *stop;    /* stop strings (not included in the output); may be NULL */
    int32_t n_stop;
    int32_t ignore_eos;         /* 1: do not stop at end-of-sequence tokens. default 0 */
    /* Constrained output (docs/grammar.md). A grammar in llama.cpp's GBNF syntax (rules
     * `name ::= ...` starting from `root`), NULL (default) for none: every sampled token keeps the
     * generated text a prefix of something the grammar matches (disallowed tokens get logit -inf
     * before the repetition penalty and sampling), an end-of-sequence token is allowed only where
     * the text is a complete match, and the generation stops with FASTLLM_STOP_GRAMMAR as soon as
     * the match is complete and the grammar allows nothing more. With ignore_eos, end-of-sequence
     * tokens are never allowed. The text is copied at begin; a malformed grammar is
     * FASTLLM_ERR_INVALID_ARGUMENT with "grammar: line L col C: ..." (nothing is evaluated). */
    const char *grammar;
    /* A JSON Schema (its JSON text), NULL (default) for none: converted with
     * fastllm_json_schema_to_grammar and used as grammar (its errors: see there). Setting both
     * grammar and json_schema is FASTLLM_ERR_INVALID_ARGUMENT. */
    const char *json_schema;
    /* Lazy grammar (docs/grammar.md), as tool_choice "auto" needs: n_grammar_triggers strings
     * (NULL / 0, the default: the grammar constrains from the first token). The text is then free
     * until one of them appears in it, and the grammar (or JSON schema) constrains the text from
     * that trigger's first byte on, so its matches begin with the trigger; "^x" counts only where
     * x begins the generated text after leading whitespace. Where triggers overlap, the one
     * completed first wins (of those ending at one byte, the longest). Before a trigger, only
     * the tokens that would complete one with text the grammar rejects are disallowed; a
     * generation without a trigger ends as one without a grammar. fastllm_chat_tool_triggers
     * gives a chat format's. Triggers without a grammar, an empty trigger, "^" followed by
     * whitespace, or one over 4096 bytes: FASTLLM_ERR_INVALID_ARGUMENT. */
    const char *const *grammar_triggers;
    int32_t n_grammar_triggers;
} fastllm_sampling_params;

FASTLLM_API fastllm_sampling_params fastllm_sampling_default_params(void);

typedef enum fastllm_stop_reason {
    FASTLLM_STOP_EOS = 0,          /* the model produced an end-of-sequence token */
    FASTLLM_STOP_MAX_TOKENS = 1,   /* max_new_tokens reached */
    FASTLLM_STOP_STRING = 2,       /* a stop string appeared */
    FASTLLM_STOP_CALLBACK = 3,     /* the callback asked to stop */
    FASTLLM_STOP_CONTEXT_FULL = 4, /* the session's context is full */
    FASTLLM_STOP_CANCELLED = 5,    /* fastllm_session_cancel_generation was called */
    /* the grammar (or JSON schema) is matched completely and allows nothing more; also when no
     * token of the vocabulary can continue the text (a dead end: the text is then incomplete,
     * which fastllm_sampling_params.grammar explains) */
    FASTLLM_STOP_GRAMMAR = 6
} fastllm_stop_reason;

/* Receives generated text as it is produced. text is valid UTF-8 (a character split across tokens
 * is delivered once complete), text_len bytes, not NUL-terminated, valid only during the call.
 * Text that might be the start of a stop string is held back until it is known not to be one.
 * Return 0 to continue, non-zero to stop generating. */
typedef int (*fastllm_stream_callback)(const char *text, size_t text_len, void *user_data);

typedef struct fastllm_generation_result {
    int32_t n_prompt_tokens;
    int32_t n_generated_tokens;
    fastllm_stop_reason stop_reason;
    double prompt_ms;   /* time spent evaluating the prompt */
    double generate_ms; /* time spent generating */
} fastllm_generation_result;

/* Appends the prompt ids to the session's context, then samples up to max_new_tokens new tokens,
 * streaming their text to callback (may be NULL). The generated tokens stay in the session's
 * context, so a later call continues the conversation. out_result may be NULL.
 * Errors as fastllm_session_eval (for the prompt). */
FASTLLM_API fastllm_status fastllm_session_generate(fastllm_session *session, const int32_t *prompt_tokens,
                                                    size_t n_prompt_tokens, const fastllm_sampling_params *params,
                                                    fastllm_stream_callback callback, void *user_data,
                                                    fastllm_generation_result *out_result);

/* Step-wise generation, to advance many sessions together (continuous batching: a server, or a
 * game with many NPCs). fastllm_session_begin_generation evaluates the prompt and sets up sampling
 * (params are copied; callback and user_data must stay valid until the generation ends). Then
 * fastllm_generate_step produces one token for each listed session, evaluating the new tokens of
 * all of them in one pass over the weights. Sessions may join and leave between steps.
 * fastllm_session_generate is begin + step until done. */
FASTLLM_API fastllm_status fastllm_session_begin_generation(fastllm_session *session, const int32_t *prompt_tokens,
                                                            size_t n_prompt_tokens,
                                                            const fastllm_sampling_params *params,
                                                            fastllm_stream_callback callback, void *user_data);
/* sessions: n_sessions distinct sessions of one model, each with a generation in progress, all
 * used by the calling thread only. out_done[i] is set to 1 when session i's generation has ended;
 * do not step it again before beginning a new one. */
FASTLLM_API fastllm_status fastllm_generate_step(fastllm_session *const *sessions, size_t n_sessions,
                                                 int32_t *out_done);
/* Batched prompt admission. As fastllm_session_begin_generation, but the prompt is only checked and
 * queued (out of memory and a full context fail here): the following steps evaluate it, a chunk
 * at a time, in the same passes as the other sessions' new tokens, so that a long prompt does not
 * stall them. Its first token comes from the step after its last chunk (until then a step reports
 * it not done and produces no token for it). While the prompt is queued, fastllm_session_eval and
 * fastllm_session_save_state refuse (FASTLLM_ERR_INVALID_ARGUMENT); a cancel keeps the part
 * evaluated. docs/api.md "Batched prompt admission". */
FASTLLM_API fastllm_status fastllm_session_begin_generation_deferred(fastllm_session *session,
                                                                     const int32_t *prompt_tokens,
                                                                     size_t n_prompt_tokens,
                                                                     const fastllm_sampling_params *params,
                                                                     fastllm_stream_callback callback,
                                                                     void *user_data);
typedef struct fastllm_step_params {
    /* Most tokens of deferred prompts one step evaluates, over all its sessions, given out in the
     * order listed (default 256; at least 1). fastllm_generate_step uses the default. */
    int32_t max_prompt_tokens;
} fastllm_step_params;
FASTLLM_API fastllm_step_params fastllm_step_default_params(void);
/* fastllm_generate_step with params (NULL: the defaults). */
FASTLLM_API fastllm_status fastllm_generate_step_ex(fastllm_session *const *sessions, size_t n_sessions,
                                                    const fastllm_step_params *params, int32_t *out_done);
/* 1 while the session has a generation in progress, else 0. */
FASTLLM_API int fastllm_session_is_generating(const fastllm_session *session);
/* The session's last generation's result (final once it has ended). */
FASTLLM_API fastllm_status fastllm_session_generation_result(const fastllm_session *session,
                                                             fastllm_generation_result *out_result);
/* Converts a JSON Schema (schema: its JSON text) into a GBNF grammar for
 * fastllm_sampling_params.grammar, matching compact JSON with bounded whitespace. Supported:
 * type (one or a list), properties, required, additionalProperties (false when unsaid and
 * "properties" is given, as llama.cpp does), enum, const, items, prefixItems, minItems, maxItems,
 * minLength, maxLength, minimum / maximum / exclusiveMinimum / exclusiveMaximum for integers,
 * anyOf, oneOf (as anyOf), allOf of object schemas, $ref into the schema (#/$defs/..., recursion
 * allowed), format date, time, date-time and uuid; annotations (title, description, default,
 * examples, $schema, ...) are ignored. docs/grammar.md has the details. Errors:
 * FASTLLM_ERR_UNSUPPORTED naming the first keyword it does not implement and where
 * ("json_schema: unsupported keyword 'pattern' at /properties/name"); FASTLLM_ERR_INVALID_ARGUMENT
 * for text that is not JSON or a schema that is malformed or matches nothing. Output buffer
 * convention as fastllm_detokenize (NUL-terminated; *out_len without the NUL). */
FASTLLM_API fastllm_status fastllm_json_schema_to_grammar(const char *schema, char *out, size_t out_capacity,
                                                          size_t *out_len);
/* Checks a GBNF grammar as fastllm_sampling_params.grammar would (FASTLLM_OK, or
 * FASTLLM_ERR_INVALID_ARGUMENT with the message), without a model or a session: for a server that
 * answers a bad grammar before queueing the request. */
FASTLLM_API fastllm_status fastllm_grammar_check(const char *grammar);

/* Ends a generation in progress (stop reason FASTLLM_STOP_CANCELLED); harmless when there is none.
 * Called by the thread that uses the session, between steps; from another thread, use
 * fastllm_session_cancel. */
FASTLLM_API fastllm_status fastllm_session_cancel_generation(fastllm_session *session);
/* From any thread: stops the evaluation or generation the session is in. A prompt being evaluated
 * (fastllm_session_eval, _generate, _begin_generation) stops between two layers of the pass, within
 * one layer's time (SmolLM2-135M, 256-token batches on 2 cores: a layer takes 17 ms, the call
 * returned 9 ms after the cancel); the context keeps the tokens of the batches evaluated before
 * and drops the rest (fastllm_session_n_tokens says how many stayed). fastllm_session_eval then returns FASTLLM_ERR_CANCELLED; a generation ends with
 * stop reason FASTLLM_STOP_CANCELLED (fastllm_session_generate returns FASTLLM_OK), before its next
 * token. FASTLLM_ERR_INVALID_ARGUMENT when the session is neither evaluating nor generating (then
 * nothing is left pending for a later call). */
FASTLLM_API fastllm_status fastllm_session_cancel(fastllm_session *session);

/* ------------------------------------------------------------------------------------------ */
/* Speculative decoding                                                                        */

/* Each generation step drafts up to n_draft tokens after the sampled one, evaluates them in the
 * same pass and keeps those the model would have produced itself: a draft is kept with the
 * probability the sampling params give it (greedy: when it is the argmax), and after a rejection
 * the next token is drawn from the rest. Greedy output is identical to decoding without drafts, and
 * sampled output has the same distribution (not the same tokens for a seed). The drafts come from
 * a draft model (a smaller model of the same vocabulary, greedy, in a session of its own), or
 * without one from the context itself (prompt lookup: the tokens that followed the latest earlier
 * occurrence of the context's last ngram_max .. ngram_min tokens). The draft length adapts (up to
 * n_draft: longer after a step that kept every draft, shorter otherwise), and after a step whose
 * drafts all failed the next steps draft nothing (4, 16, 64, 128 with a draft model; 2, 4, .. 128
 * with prompt lookup). Works with stop strings, grammars,
 * fastllm_generate_step and fastllm_session_generate. docs/api.md "Speculative decoding". */
typedef struct fastllm_speculative_params {
    const fastllm_model *draft_model; /* NULL (default): prompt lookup; else must outlive the session */
    int32_t n_draft;                  /* most tokens drafted a step, 1 to 16 (default 5) */
    int32_t ngram_min, ngram_max;     /* prompt lookup: 1 <= min <= max <= 16 (default 1, 3) */
    float p_min;                      /* draft model: drafting stops at a token it gives a probability
                                         below this, 0 to 1 (default 0: never) */
} fastllm_speculative_params;

FASTLLM_API fastllm_speculative_params fastllm_speculative_default_params(void);
/* Turns speculative decoding on for the session's next generations (params NULL: off). Errors:
 * FASTLLM_ERR_INVALID_ARGUMENT for n_draft or n-grams out of range, a draft model of another
 * vocabulary or tokenizer, the session's own model, or a draft context shorter than n_ctx. */
FASTLLM_API fastllm_status fastllm_session_set_speculative(fastllm_session *session,
                                                           const fastllm_speculative_params *params);
/* Of the current or last generation: tokens drafted and those kept (either may be NULL). */
FASTLLM_API fastllm_status fastllm_session_speculative_stats(const fastllm_session *session, int64_t *n_drafted,
                                                             int64_t *n_accepted);

/* ------------------------------------------------------------------------------------------ */
/* LoRA adapters                                                                               */

/* A LoRA adapter (docs/lora.md): small matrices that change a model's layers, y = W x + s B (A x),
 * applied at run time without touching the base weights (of any dtype), so that one model serves
 * characters with adapters of their own. Made from a PEFT adapter folder with
 * `convert.py --adapter PEFT_DIR --model_path BASE_HF_DIR --out_path ADAPTER.flm`. */
typedef struct fastllm_adapter fastllm_adapter;

/* Loads an adapter file for model, checked against it: its architecture and the shape of every
 * part (FASTLLM_ERR_BAD_FORMAT for a model file, another architecture, a part that does not fit;
 * FASTLLM_ERR_UNSUPPORTED for a rank the pass cannot take, an encoder). Loaded once, it serves
 * every session of model that sets it; model must outlive it. */
FASTLLM_API fastllm_status fastllm_adapter_load(const fastllm_model *model, const char *path,
                                                fastllm_adapter **out_adapter);
/* Frees the handle. Sessions that have the adapter set keep applying it: its memory goes with the
 * last of them (the free is deferred, never refused). */
FASTLLM_API void fastllm_adapter_free(fastllm_adapter *adapter);
/* Sets the adapters the session's evaluations apply from now on: scales[i] multiplies adapter i's
 * own alpha / r (1.0: as trained; 0: off); n = 0 (adapters and scales may then be NULL): the base
 * model. Every row of a pass gets its own session's adapters, so sessions with different adapters
 * step together over one pass of the base weights. The tokens already evaluated keep the KV they
 * were computed with (reset or truncate the session to evaluate them again); a fork takes its
 * source's adapters. Errors, with nothing changed: FASTLLM_ERR_INVALID_ARGUMENT for a NULL adapter,
 * an adapter of another model, the same adapter twice, a scale that is not finite, a generation in
 * progress; FASTLLM_ERR_UNSUPPORTED when layers run on a device (adapters run on the CPU). */
FASTLLM_API fastllm_status fastllm_session_set_adapters(fastllm_session *session, const fastllm_adapter *const *adapters,
                                                        const float *scales, size_t n);

/* ------------------------------------------------------------------------------------------ */
/* Saved sessions                                                                              */

/* Saved state: a session's tokens, its KV cache (in its own types) and a generation in progress
 * (sampling params, random state, held-back text, the last logits) as bytes, so that a game can
 * save a conversation and go on with it later, in this process or another. Restoring and going
 * on gives the same tokens as never having stopped. The bytes name the model they belong to (a
 * fingerprint of its weights, config and vocabulary), are versioned and checksummed: a state of
 * another model, a truncated or damaged one is FASTLLM_ERR_BAD_FORMAT, and the session is left as
 * it was. A state names the session's LoRA adapters (and scales) when it is saved: only a session
 * with the same ones loads it (else FASTLLM_ERR_BAD_FORMAT). Loading into a session with other KV
 * types converts the rows (q8 is then approximate);
 * the context must fit its n_ctx.
 * save: writes at most out_capacity bytes; *out_len receives the size of the state; out may be
 * NULL to ask for the size (FASTLLM_ERR_BUFFER_TOO_SMALL when it does not fit). */
FASTLLM_API fastllm_status fastllm_session_save_state(const fastllm_session *session, void *out, size_t out_capacity,
                                                      size_t *out_len);
/* Replaces the session's context with a saved state. A generation saved in progress continues
 * with fastllm_generate_step, streaming to callback / user_data (may be NULL; ignored when the
 * state has no generation). */
FASTLLM_API fastllm_status fastllm_session_load_state(fastllm_session *session, const void *data, size_t size,
                                                      fastllm_stream_callback callback, void *user_data);
/* The same to and from a file. Saving writes a temporary file next to path and renames it over
 * path, so a crash never leaves a half-written save. */
FASTLLM_API fastllm_status fastllm_session_save_state_file(const fastllm_session *session, const char *path);
FASTLLM_API fastllm_status fastllm_session_load_state_file(fastllm_session *session, const char *path,
                                                           fastllm_stream_callback callback, void *user_data);

/* ------------------------------------------------------------------------------------------ */
/* Quantizing weights (what the converter calls)                                              */

/* The bytes of a float32 matrix [rows][cols] stored as a quantized .flm dtype, named as in
 * docs/flm_format.md ("q8", "q4", "q4_g64", "q4_g128", "q4m", "q6", "q3k", "q4k", "q5k", "q6k"):
 * each group's scale (and minimum) chosen by a least-squares search, the weights rounded onto it,
 * rows in the file's tiles of 16. The same bytes as the converter's own search in Python
 * (converter/quantize.py), which calls this when it finds the library.
 * weights holds rows [first_row, first_row + n_rows) of the matrix, and only their tiles' bytes are
 * written in out, which holds the whole matrix (exactly fastllm_quantized_size(dtype, rows, cols)
 * bytes), so that a matrix made of parts (fused q, k and v) needs no copy: first_row must be a
 * multiple of 16, and n_rows too unless the rows end the matrix. Runs on n_threads threads (0: one
 * per core). An unknown or unquantized dtype, cols not a multiple of the dtype's row multiple (32,
 * or 64 and the group for 4/3/5/6-bit codes), more than 2^48 weights, rows out of those bounds or
 * out of another size is FASTLLM_ERR_INVALID_ARGUMENT; fastllm_quantized_size returns 0 for the
 * first three. */
FASTLLM_API size_t fastllm_quantized_size(const char *dtype, int64_t rows, int64_t cols);
FASTLLM_API fastllm_status fastllm_quantize(const char *dtype, const float *weights, int64_t rows, int64_t cols,
                                            int64_t first_row, int64_t n_rows, int32_t n_threads, void *out,
                                            size_t out_size);
/* fastllm_quantize with the weights as IEEE half-precision floats (their bits, as an f16 GGUF or
 * safetensors file holds them): each row is widened to float32, exactly, as it is quantized, so the
 * bytes are fastllm_quantize's of the widened matrix, with no float32 copy of it made. The same
 * arguments and errors. (The converter takes it where the library has it.) */
FASTLLM_API fastllm_status fastllm_quantize_f16(const char *dtype, const uint16_t *weights, int64_t rows,
                                                int64_t cols, int64_t first_row, int64_t n_rows, int32_t n_threads,
                                                void *out, size_t out_size);
/* The same with the weights as bfloat16 bits (the top half of a float32, as most HuggingFace
 * checkpoints hold them): the bytes are fastllm_quantize's of the widened matrix. */
FASTLLM_API fastllm_status fastllm_quantize_bf16(const char *dtype, const uint16_t *weights, int64_t rows,
                                                 int64_t cols, int64_t first_row, int64_t n_rows, int32_t n_threads,
                                                 void *out, size_t out_size);

#ifdef __cplusplus
}
#endif

#endif /* FASTLLM_H */
