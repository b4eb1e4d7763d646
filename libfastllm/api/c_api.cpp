// c_api.cpp — the extern "C" surface (include/fastllm.h). Each entry point validates its
// arguments, runs the C++ core inside guard(), and turns any exception into a status code plus
// the thread's last-error message. Nothing here exits or aborts.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "text/chat_template.h"
#include "text/tool_calls.h"
#include "base/error.h"
#include "fastllm.h"
#include "backends/backends.h"
#include "base/log.h"
#include "runtime/embedding.h"
#include "runtime/model.h"
#include "runtime/session.h"
#include "text/grammar.h"
#include "text/json_schema.h"
#include "text/json_text.h"
#include "format/quantize.h"
#include "platform/platform.h"

struct fastllm_model {
    fastllm::Model impl;
    template <typename... A>
    explicit fastllm_model(A &&...a) : impl(std::forward<A>(a)...) {}
    // The model's own chat template, parsed on first use (then shared by every thread).
    std::once_flag template_once;
    std::unique_ptr<fastllm::jinja::Template> own_template;
};
struct fastllm_adapter {
    std::shared_ptr<const fastllm::LoraAdapter> impl;
};
struct fastllm_session {
    fastllm::Session impl;
    fastllm_session(const fastllm::Model &m, const fastllm::SessionOptions &o) : impl(m, o) {}
    fastllm_session(const fastllm::Session &src, size_t n, const fastllm::SessionOptions &o) : impl(src, n, o) {}
};

namespace {

thread_local std::string g_last_error;

fastllm_status set_error(fastllm_status s, const std::string &msg) {
    g_last_error = msg;
    return s;
}

// A failure inside the core is also logged (argument checks and size queries are not: callers
// expect those and handle them).
fastllm_status fail_logged(fastllm_status s, const std::string &msg) {
    if (s != FASTLLM_ERR_BUFFER_TOO_SMALL && s != FASTLLM_ERR_CANCELLED) fastllm::log(FASTLLM_LOG_ERROR, "%s: %s", fastllm_status_name(s), msg.c_str());
    return set_error(s, msg);
}

template <typename F>
fastllm_status guard(F &&f) {
    g_last_error.clear();
    try {
        f();
        return FASTLLM_OK;
    } catch (const fastllm::Error &e) {
        return fail_logged(e.status(), e.what());
    } catch (const std::bad_alloc &) {
        return fail_logged(FASTLLM_ERR_OUT_OF_MEMORY, "out of memory");
    } catch (const std::exception &e) {
        return fail_logged(FASTLLM_ERR_INTERNAL, std::string("internal error: ") + e.what());
    } catch (...) {
        return fail_logged(FASTLLM_ERR_INTERNAL, "internal error: unknown exception");
    }
}

#define REQUIRE(cond, what)                                                        \
    do {                                                                           \
        if (!(cond)) return set_error(FASTLLM_ERR_INVALID_ARGUMENT, what " is NULL"); \
    } while (0)

// Copies bytes into a caller buffer with the size-query convention of the header.
fastllm_status copy_out(const std::string &s, char *out, size_t capacity, size_t *out_len, bool nul) {
    *out_len = s.size();
    if (capacity < s.size() + (nul ? 1 : 0) || (!out && (s.size() || nul)))
        return set_error(FASTLLM_ERR_BUFFER_TOO_SMALL,
                         "output buffer of " + std::to_string(capacity) + " bytes is too small: " +
                             std::to_string(s.size() + (nul ? 1 : 0)) + " needed");
    if (!s.empty()) std::memcpy(out, s.data(), s.size());
    if (nul) out[s.size()] = '\0';
    return FASTLLM_OK;
}

// The C params -> the core's options (throws for a bad stop list).
fastllm::SamplingOptions sampling_options(const fastllm_sampling_params *params) {
    const fastllm_sampling_params p = params ? *params : fastllm_sampling_default_params();
    fastllm::SamplingOptions o;
    o.max_new_tokens = p.max_new_tokens, o.temperature = p.temperature, o.top_k = p.top_k, o.top_p = p.top_p;
    o.min_p = p.min_p, o.repetition_penalty = p.repetition_penalty, o.repeat_last_n = p.repeat_last_n;
    o.seed = p.seed, o.ignore_eos = p.ignore_eos != 0;
    if (p.n_stop < 0 || (p.n_stop > 0 && !p.stop)) fastllm::fail(FASTLLM_ERR_INVALID_ARGUMENT, "invalid stop list");
    for (int i = 0; i < p.n_stop; i++) {
        if (!p.stop[i]) fastllm::fail(FASTLLM_ERR_INVALID_ARGUMENT, "stop string %d is NULL", i);
        o.stop.emplace_back(p.stop[i]);
    }
    if (p.grammar && p.json_schema)
        fastllm::fail(FASTLLM_ERR_INVALID_ARGUMENT, "grammar and json_schema are both set; give one of them");
    if (p.grammar && !*p.grammar) fastllm::fail(FASTLLM_ERR_INVALID_ARGUMENT, "grammar is empty (it needs a rule 'root')");
    if (p.grammar) o.grammar = p.grammar;
    if (p.json_schema) o.grammar = fastllm::json_schema_to_grammar(p.json_schema);
    if (p.n_grammar_triggers < 0 || (p.n_grammar_triggers > 0 && !p.grammar_triggers))
        fastllm::fail(FASTLLM_ERR_INVALID_ARGUMENT, "invalid grammar_triggers list");
    if (p.n_grammar_triggers > 0 && o.grammar.empty())
        fastllm::fail(FASTLLM_ERR_INVALID_ARGUMENT, "grammar_triggers without a grammar or json_schema");
    for (int i = 0; i < p.n_grammar_triggers; i++) {
        if (!p.grammar_triggers[i]) fastllm::fail(FASTLLM_ERR_INVALID_ARGUMENT, "grammar trigger %d is NULL", i);
        o.grammar_triggers.emplace_back(p.grammar_triggers[i]);
    }
    return o;
}

fastllm_generation_result to_c(const fastllm::GenerationResult &r) {
    fastllm_generation_result c{};
    c.n_prompt_tokens = r.n_prompt_tokens, c.n_generated_tokens = r.n_generated_tokens, c.stop_reason = r.stop_reason;
    c.prompt_ms = r.prompt_ms, c.generate_ms = r.generate_ms;
    return c;
}

}  // namespace

extern "C" {

#define FASTLLM_STR2(x) #x
#define FASTLLM_STR(x) FASTLLM_STR2(x)
const char *fastllm_version(void) {
    return FASTLLM_STR(FASTLLM_VERSION_MAJOR) "." FASTLLM_STR(FASTLLM_VERSION_MINOR) "." FASTLLM_STR(FASTLLM_VERSION_PATCH);
}
void fastllm_log_set(fastllm_log_callback callback, void *user_data) { fastllm::set_log_callback(callback, user_data); }
int fastllm_abi_version(void) { return FASTLLM_ABI_VERSION; }
const char *fastllm_last_error(void) { return g_last_error.c_str(); }
const char *fastllm_isa(void) { return fastllm::cpu_kernels_name(); }

const char *fastllm_status_name(fastllm_status s) {
    switch (s) {
    case FASTLLM_OK: return "FASTLLM_OK";
    case FASTLLM_ERR_INVALID_ARGUMENT: return "FASTLLM_ERR_INVALID_ARGUMENT";
    case FASTLLM_ERR_IO: return "FASTLLM_ERR_IO";
    case FASTLLM_ERR_BAD_FORMAT: return "FASTLLM_ERR_BAD_FORMAT";
    case FASTLLM_ERR_UNSUPPORTED: return "FASTLLM_ERR_UNSUPPORTED";
    case FASTLLM_ERR_OUT_OF_MEMORY: return "FASTLLM_ERR_OUT_OF_MEMORY";
    case FASTLLM_ERR_CONTEXT_FULL: return "FASTLLM_ERR_CONTEXT_FULL";
    case FASTLLM_ERR_BUFFER_TOO_SMALL: return "FASTLLM_ERR_BUFFER_TOO_SMALL";
    case FASTLLM_ERR_TOKEN_OUT_OF_RANGE: return "FASTLLM_ERR_TOKEN_OUT_OF_RANGE";
    case FASTLLM_ERR_INTERNAL: return "FASTLLM_ERR_INTERNAL";
    case FASTLLM_ERR_CANCELLED: return "FASTLLM_ERR_CANCELLED";
    }
    return "FASTLLM_UNKNOWN_STATUS";
}

fastllm_model_params fastllm_model_default_params(void) {
    fastllm_model_params p;
    p.n_threads = 0;
    p.use_mmap = 1;
    p.device = nullptr;
    p.n_gpu_layers = -1;
    return p;
}

namespace {
fastllm::ModelOptions options(const fastllm_model_params &p) {
    fastllm::ModelOptions o;
    o.n_threads = p.n_threads, o.device = p.device, o.n_gpu_layers = p.n_gpu_layers;
    return o;
}
}  // namespace

fastllm_status fastllm_model_load(const char *path, const fastllm_model_params *params, fastllm_model **out_model) {
    REQUIRE(out_model, "out_model");
    *out_model = nullptr;
    REQUIRE(path, "path");
    fastllm_model_params p = params ? *params : fastllm_model_default_params();
    if (p.n_threads < 0) return set_error(FASTLLM_ERR_INVALID_ARGUMENT, "n_threads must not be negative");
    if (p.n_gpu_layers < -1) return set_error(FASTLLM_ERR_INVALID_ARGUMENT, "n_gpu_layers must be -1 (all) or more");
    return guard([&] {
        *out_model = new fastllm_model(std::make_unique<fastllm::FlmFile>(path, p.use_mmap != 0), options(p));
    });
}

fastllm_status fastllm_model_load_from_memory(const void *data, size_t size, const fastllm_model_params *params,
                                              fastllm_model **out_model) {
    REQUIRE(out_model, "out_model");
    *out_model = nullptr;
    REQUIRE(data, "data");
    fastllm_model_params p = params ? *params : fastllm_model_default_params();
    if (p.n_threads < 0) return set_error(FASTLLM_ERR_INVALID_ARGUMENT, "n_threads must not be negative");
    if (p.n_gpu_layers < -1) return set_error(FASTLLM_ERR_INVALID_ARGUMENT, "n_gpu_layers must be -1 (all) or more");
    return guard([&] {
        *out_model = new fastllm_model(std::make_unique<fastllm::FlmFile>("<memory>", data, (uint64_t)size), options(p));
    });
}

void fastllm_model_free(fastllm_model *model) { delete model; }

fastllm_status fastllm_model_get_info(const fastllm_model *model, fastllm_model_info *info) {
    REQUIRE(model, "model");
    REQUIRE(info, "out_info");
    const auto &c = model->impl.config();
    info->architecture = model->impl.architecture().c_str();
    info->name = model->impl.name().c_str();
    info->vocab_size = c.vocab_size;
    info->context_length = c.context_length;
    info->hidden_size = c.hidden_size;
    info->num_layers = c.num_layers;
    info->num_heads = c.num_heads;
    info->num_kv_heads = c.num_kv_heads;
    info->head_dim = c.head_dim;
    info->bos_id = model->impl.tokenizer().bos_id();
    info->eos_id = model->impl.tokenizer().eos_id();
    info->weight_dtype = fastllm::dtype_name(model->impl.decoder().weight_dtype());
    info->n_params = model->impl.decoder().n_params();
    info->backend = model->impl.backend_name().c_str();
    info->device_weight_bytes = model->impl.device_weight_bytes();
    return FASTLLM_OK;
}

fastllm_status fastllm_vulkan_set_device(const fastllm_vulkan_handles *h) {
    REQUIRE(h, "handles");
    return guard([&] {
        fastllm::use_host_vulkan_device(fastllm::HostVulkanDevice{h->instance, h->physical_device, h->device, h->queue_family,
                                                                  h->queue_index, h->get_instance_proc_addr});
    });
}

fastllm_status fastllm_devices(fastllm_device_info *out, int32_t capacity, int32_t *out_n) {
    REQUIRE(out_n, "out_n");
    *out_n = 0;
    if (capacity < 0 || (capacity > 0 && !out)) return set_error(FASTLLM_ERR_INVALID_ARGUMENT, "out must hold capacity entries");
    return guard([&] {
        std::string why;
        const std::vector<fastllm::DeviceInfo> list = fastllm::list_devices(&why);
        auto put = [](char *dst, size_t n, const std::string &src) {
            std::snprintf(dst, n, "%s", src.c_str());
        };
        for (size_t i = 0; i < list.size() && (int32_t)i < capacity; i++) {
            const fastllm::DeviceInfo &d = list[i];
            fastllm_device_info &o = out[i];
            std::memset(&o, 0, sizeof o);
            o.index = d.index, o.usable = d.usable, o.memory_bytes = d.memory_bytes, o.api_version = d.api_version;
            put(o.name, sizeof o.name, d.name), put(o.vendor, sizeof o.vendor, d.vendor), put(o.type, sizeof o.type, d.type);
            put(o.missing, sizeof o.missing, d.missing);
        }
        *out_n = (int32_t)list.size();
        set_error(FASTLLM_OK, list.empty() ? why : "");
    });
}

const char *fastllm_model_chat_template(const fastllm_model *model) {
    if (!model || !model->impl.has_chat_template()) return nullptr;
    return model->impl.chat_template().c_str();
}

fastllm_status fastllm_tokenize(const fastllm_model *model, const char *text, size_t text_len, int add_bos,
                                int32_t *out_tokens, size_t out_capacity, size_t *out_n_tokens) {
    REQUIRE(model, "model");
    REQUIRE(out_n_tokens, "out_n_tokens");
    REQUIRE(text || text_len == 0, "text");
    return guard([&] {
        const auto &tok = model->impl.tokenizer();
        bool bos = add_bos < 0 ? tok.add_bos_default() : add_bos != 0;
        std::vector<int32_t> ids = tok.encode(std::string_view(text ? text : "", text_len), bos);
        *out_n_tokens = ids.size();
        if (ids.size() > out_capacity || (!out_tokens && !ids.empty()))
            fastllm::fail(FASTLLM_ERR_BUFFER_TOO_SMALL, "token buffer holds %zu ids, %zu needed", out_capacity, ids.size());
        if (!ids.empty()) std::memcpy(out_tokens, ids.data(), ids.size() * sizeof(int32_t));
    });
}

fastllm_status fastllm_detokenize(const fastllm_model *model, const int32_t *tokens, size_t n_tokens, char *out_text,
                                  size_t out_capacity, size_t *out_len) {
    REQUIRE(model, "model");
    REQUIRE(out_len, "out_len");
    REQUIRE(tokens || n_tokens == 0, "tokens");
    fastllm_status s = FASTLLM_OK;
    fastllm_status g = guard([&] {
        model->impl.check_token_ids(tokens, n_tokens);
        s = copy_out(model->impl.tokenizer().decode(tokens, n_tokens), out_text, out_capacity, out_len, true);
    });
    return g ? g : s;
}

fastllm_status fastllm_token_to_piece(const fastllm_model *model, int32_t token, char *out, size_t out_capacity,
                                      size_t *out_len) {
    REQUIRE(model, "model");
    REQUIRE(out_len, "out_len");
    fastllm_status s = FASTLLM_OK;
    fastllm_status g = guard([&] {
        model->impl.check_token_ids(&token, 1);
        s = copy_out(model->impl.tokenizer().piece_bytes(token), out, out_capacity, out_len, false);
    });
    return g ? g : s;
}

fastllm_embed_params fastllm_embed_default_params(void) {
    fastllm_embed_params p;
    p.pooling = FASTLLM_POOLING_MODEL;
    p.normalize = 1;
    p.truncate = 1;
    p.add_special = -1;
    p.n_threads = 0;
    p.n_batch = 0;
    return p;
}

namespace {
// Checks the params, then embeds the inputs `make` gives (called once its checks passed).
using MakeInputs = std::function<std::vector<std::vector<int32_t>>(const fastllm_embed_params &)>;
fastllm_status embed_inputs(const fastllm_model *model, const fastllm_embed_params *params, float *out,
                            size_t out_capacity, size_t *out_n_vectors, const MakeInputs &make) {
    REQUIRE(model, "model");
    const fastllm_embed_params p = params ? *params : fastllm_embed_default_params();
    if (p.pooling < FASTLLM_POOLING_MODEL || p.pooling > FASTLLM_POOLING_LAST)
        return set_error(FASTLLM_ERR_INVALID_ARGUMENT, "unknown pooling " + std::to_string(p.pooling));
    if (p.n_threads < 0 || p.n_batch < 0)
        return set_error(FASTLLM_ERR_INVALID_ARGUMENT, "n_threads and n_batch must not be negative");
    if (out_n_vectors) *out_n_vectors = 0;
    return guard([&] {
        const fastllm::Model &m = model->impl;
        fastllm::EmbedOptions o;
        o.pooling = p.pooling == FASTLLM_POOLING_MODEL ? fastllm::model_pooling(m) : (fastllm::Pooling)p.pooling;
        o.normalize = p.normalize != 0;
        o.n_threads = p.n_threads, o.n_batch = p.n_batch;
        const std::vector<std::vector<int32_t>> inputs = make(p);
        if (inputs.empty()) fastllm::fail(FASTLLM_ERR_INVALID_ARGUMENT, "no inputs to embed");
        size_t n = inputs.size();
        if (o.pooling == fastllm::Pooling::None) {
            n = 0;
            for (const auto &in : inputs) n += in.size();
        }
        if (out_n_vectors) *out_n_vectors = n;
        const size_t H = (size_t)m.config().hidden_size;
        if (!out || out_capacity < n * H)
            fastllm::fail(FASTLLM_ERR_BUFFER_TOO_SMALL, "the output holds %zu floats, %zu vectors of %zu need %zu",
                          out ? out_capacity : 0, n, H, n * H);
        fastllm::embed(m, inputs, o, out);
    });
}
}  // namespace

fastllm_status fastllm_embed(const fastllm_model *model, const char *const *texts, size_t n_texts,
                             const fastllm_embed_params *params, float *out, size_t out_capacity, size_t *out_n_vectors) {
    REQUIRE(texts || n_texts == 0, "texts");
    return embed_inputs(model, params, out, out_capacity, out_n_vectors, [&](const fastllm_embed_params &p) {
        const fastllm::Model &m = model->impl;
        const bool special = p.add_special < 0 ? m.tokenizer().add_bos_default() : p.add_special != 0;
        std::vector<std::vector<int32_t>> inputs;
        for (size_t i = 0; i < n_texts; i++) {
            if (!texts[i]) fastllm::fail(FASTLLM_ERR_INVALID_ARGUMENT, "texts[%zu] is NULL", i);
            inputs.push_back(fastllm::embed_tokens_of(m, texts[i], std::strlen(texts[i]), special, p.truncate != 0));
            if (inputs.back().empty())
                fastllm::fail(FASTLLM_ERR_INVALID_ARGUMENT, "texts[%zu] gives no tokens (an empty text without special tokens)", i);
        }
        return inputs;
    });
}

fastllm_status fastllm_embed_tokens(const fastllm_model *model, const int32_t *const *tokens, const size_t *n_tokens,
                                    size_t n_inputs, const fastllm_embed_params *params, float *out,
                                    size_t out_capacity, size_t *out_n_vectors) {
    REQUIRE((tokens && n_tokens) || n_inputs == 0, "tokens");
    return embed_inputs(model, params, out, out_capacity, out_n_vectors, [&](const fastllm_embed_params &p) {
        const size_t max = (size_t)model->impl.config().context_length;
        std::vector<std::vector<int32_t>> inputs;
        for (size_t i = 0; i < n_inputs; i++) {
            if (!tokens[i] && n_tokens[i]) fastllm::fail(FASTLLM_ERR_INVALID_ARGUMENT, "tokens[%zu] is NULL", i);
            if (n_tokens[i] == 0) fastllm::fail(FASTLLM_ERR_INVALID_ARGUMENT, "input %zu has no tokens", i);
            if (n_tokens[i] > max && !p.truncate)
                fastllm::fail(FASTLLM_ERR_CONTEXT_FULL, "input %zu has %zu tokens, more than the model's context (%zu)", i,
                              n_tokens[i], max);
            inputs.emplace_back(tokens[i], tokens[i] + std::min(n_tokens[i], max));
        }
        return inputs;
    });
}

fastllm_rerank_params fastllm_rerank_default_params(void) {
    fastllm_rerank_params p;
    p.normalize = 1;
    p.truncate = 1;
    p.n_threads = 0;
    p.n_batch = 0;
    p.instruction = nullptr;
    return p;
}

fastllm_status fastllm_rerank(const fastllm_model *model, const char *query, const char *const *documents,
                              size_t n_documents, const fastllm_rerank_params *params, float *out_scores) {
    REQUIRE(model, "model");
    REQUIRE(query, "query");
    REQUIRE(documents || n_documents == 0, "documents");
    REQUIRE(out_scores || n_documents == 0, "out_scores");
    const fastllm_rerank_params p = params ? *params : fastllm_rerank_default_params();
    if (p.n_threads < 0 || p.n_batch < 0)
        return set_error(FASTLLM_ERR_INVALID_ARGUMENT, "n_threads and n_batch must not be negative");
    return guard([&] {
        std::vector<std::string_view> docs;
        for (size_t i = 0; i < n_documents; i++) {
            if (!documents[i]) fastllm::fail(FASTLLM_ERR_INVALID_ARGUMENT, "documents[%zu] is NULL", i);
            docs.emplace_back(documents[i]);
        }
        fastllm::RerankOptions o;
        o.normalize = p.normalize != 0, o.truncate = p.truncate != 0;
        o.n_threads = p.n_threads, o.n_batch = p.n_batch;
        o.instruction = p.instruction;
        fastllm::rerank(model->impl, query, docs, o, out_scores);
    });
}

fastllm_chat_params fastllm_chat_default_params(void) {
    fastllm_chat_params p;
    p.add_generation_prompt = 1;
    p.enable_thinking = FASTLLM_THINKING_UNSET;
    p.reasoning_content = nullptr;
    return p;
}

namespace {

// The model's chat template or the caller's, over variables (the model's BOS / EOS text added).
std::string render_chat(const fastllm_model *model, const char *tmpl, nlohmann::ordered_json variables) {
    fastllm_model *m = const_cast<fastllm_model *>(model);
    const fastllm::Model &impl = model->impl;
    const auto &tok = impl.tokenizer();
    std::string bos = tok.bos_id() >= 0 ? tok.piece(tok.bos_id()) : "";
    std::string eos = tok.eos_id() >= 0 ? tok.piece(tok.eos_id()) : "";
    if (tmpl) return fastllm::apply_chat_template(fastllm::jinja::Template(tmpl), std::move(variables), bos, eos);
    if (!impl.has_chat_template())
        fastllm::fail(FASTLLM_ERR_UNSUPPORTED, "the model has no chat template; pass one");
    std::call_once(m->template_once, [&] {
        try {
            m->own_template = std::make_unique<fastllm::jinja::Template>(impl.chat_template());
        } catch (const fastllm::Error &) {  // parsed again (and the error given) at each call
        }
    });
    if (!m->own_template) {  // throws its parse error
        fastllm::jinja::Template again(impl.chat_template());
        return fastllm::apply_chat_template(again, std::move(variables), bos, eos);
    }
    return fastllm::apply_chat_template(*m->own_template, std::move(variables), bos, eos);
}

// A JSON argument (what: its name in messages), discarded when it does not parse. The engine converts values
// recursively and writes them out again: deeper JSON is refused while parsing (no conversation or
// tool schema comes near 256 levels).
nlohmann::ordered_json parse_json_arg(const char *text, const char *what) {
    nlohmann::ordered_json v;
    const fastllm::JsonParse r = fastllm::parse_json(text, 256, v);
    if (r == fastllm::JsonParse::TooDeep) fastllm::fail(FASTLLM_ERR_INVALID_ARGUMENT, "%s: nested deeper than 256 levels", what);
    return r == fastllm::JsonParse::Ok ? v : nlohmann::ordered_json(nlohmann::ordered_json::value_t::discarded);
}

nlohmann::ordered_json parse_variables(const char *variables_json) {
    nlohmann::ordered_json v = parse_json_arg(variables_json, "the template's variables");
    if (v.is_discarded()) fastllm::fail(FASTLLM_ERR_INVALID_ARGUMENT, "the template's variables are not valid JSON");
    if (!v.is_object()) fastllm::fail(FASTLLM_ERR_INVALID_ARGUMENT, "the template's variables must be a JSON object");
    return v;
}

}  // namespace

fastllm_status fastllm_chat_apply_template_v2(const fastllm_model *model, const char *tmpl,
                                              const fastllm_chat_message *messages, size_t n_messages,
                                              const fastllm_chat_params *params, char *out_text, size_t out_capacity,
                                              size_t *out_len) {
    REQUIRE(model, "model");
    REQUIRE(out_len, "out_len");
    REQUIRE(messages || n_messages == 0, "messages");
    const fastllm_chat_params p = params ? *params : fastllm_chat_default_params();
    if (p.enable_thinking < FASTLLM_THINKING_UNSET || p.enable_thinking > FASTLLM_THINKING_ON)
        return set_error(FASTLLM_ERR_INVALID_ARGUMENT,
                         "enable_thinking is " + std::to_string(p.enable_thinking) +
                             "; expected FASTLLM_THINKING_UNSET (-1), _OFF (0) or _ON (1)");
    fastllm_status s = FASTLLM_OK;
    fastllm_status g = guard([&] {
        nlohmann::ordered_json vars = nlohmann::ordered_json::object();
        nlohmann::ordered_json &msgs = vars["messages"] = nlohmann::ordered_json::array();
        for (size_t i = 0; i < n_messages; i++) {
            if (!messages[i].role || !messages[i].content)
                fastllm::fail(FASTLLM_ERR_INVALID_ARGUMENT, "message %zu has a NULL role or content", i);
            nlohmann::ordered_json m = {{"role", messages[i].role}, {"content", messages[i].content}};
            if (p.reasoning_content && p.reasoning_content[i]) m["reasoning_content"] = p.reasoning_content[i];
            msgs.push_back(std::move(m));
        }
        vars["add_generation_prompt"] = p.add_generation_prompt != 0;
        if (p.enable_thinking != FASTLLM_THINKING_UNSET) vars["enable_thinking"] = p.enable_thinking == FASTLLM_THINKING_ON;
        s = copy_out(render_chat(model, tmpl, std::move(vars)), out_text, out_capacity, out_len, true);
    });
    return g ? g : s;
}

fastllm_status fastllm_chat_apply_template_json(const fastllm_model *model, const char *tmpl,
                                                const char *variables_json, char *out_text, size_t out_capacity,
                                                size_t *out_len) {
    REQUIRE(model, "model");
    REQUIRE(variables_json, "variables_json");
    REQUIRE(out_len, "out_len");
    fastllm_status s = FASTLLM_OK;
    fastllm_status g = guard([&] {
        nlohmann::ordered_json vars = parse_variables(variables_json);
        if (!vars.contains("add_generation_prompt")) vars["add_generation_prompt"] = true;
        s = copy_out(render_chat(model, tmpl, std::move(vars)), out_text, out_capacity, out_len, true);
    });
    return g ? g : s;
}

namespace {

// The tool-call format of tmpl, else of the model's own template.
const fastllm::ToolFormat &tool_format(const fastllm_model *model, const char *tmpl) {
    if (tmpl) return fastllm::tool_format_of(tmpl);
    if (!model) fastllm::fail(FASTLLM_ERR_INVALID_ARGUMENT, "model and tmpl are both NULL");
    if (!model->impl.has_chat_template()) fastllm::fail(FASTLLM_ERR_UNSUPPORTED, "the model has no chat template; pass one");
    return fastllm::tool_format_of(model->impl.chat_template());
}

nlohmann::ordered_json parse_tools(const char *tools_json) {
    if (!tools_json) return nlohmann::ordered_json::array();
    nlohmann::ordered_json t = parse_json_arg(tools_json, "tools");
    if (t.is_discarded() || !t.is_array()) fastllm::fail(FASTLLM_ERR_INVALID_ARGUMENT, "tools: expected a JSON list");
    return t;
}

}  // namespace

fastllm_status fastllm_chat_parse_tool_calls(const fastllm_model *model, const char *tmpl, const char *reply,
                                             const char *tools_json, char *out_json, size_t out_capacity,
                                             size_t *out_len) {
    REQUIRE(reply, "reply");
    REQUIRE(out_len, "out_len");
    fastllm_status s = FASTLLM_OK;
    fastllm_status g = guard([&] {
        const fastllm::ToolFormat &f = tool_format(model, tmpl);
        fastllm::ToolReply r = fastllm::parse_tool_calls(f, reply, parse_tools(tools_json));
        nlohmann::ordered_json out = {{"format", fastllm::tool_format_name(f)}, {"content", r.content},
                                      {"tool_calls", nlohmann::ordered_json::array()}};
        for (const auto &c : r.calls) out["tool_calls"].push_back({{"name", c.name}, {"arguments", c.arguments}});
        s = copy_out(out.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace), out_json,
                     out_capacity, out_len, true);
    });
    return g ? g : s;
}

fastllm_status fastllm_chat_tool_text_safe(const fastllm_model *model, const char *tmpl, const char *text, int done,
                                          size_t *out_safe) {
    REQUIRE(text, "text");
    REQUIRE(out_safe, "out_safe");
    return guard([&] {
        *out_safe = fastllm::tool_text_safe(tool_format(model, tmpl), text, done != 0);
    });
}

fastllm_status fastllm_chat_tool_grammar(const fastllm_model *model, const char *tmpl, const char *tools_json,
                                         const char *tool_name, int parallel, char *out_grammar, size_t out_capacity,
                                         size_t *out_len) {
    REQUIRE(tools_json, "tools_json");
    REQUIRE(out_len, "out_len");
    fastllm_status s = FASTLLM_OK;
    fastllm_status g = guard([&] {
        std::string grammar = fastllm::tool_call_grammar(tool_format(model, tmpl), parse_tools(tools_json), tool_name ? tool_name : "", parallel != 0);
        s = copy_out(grammar, out_grammar, out_capacity, out_len, true);
    });
    return g ? g : s;
}

fastllm_status fastllm_chat_tool_triggers(const fastllm_model *model, const char *tmpl, char *out_json,
                                          size_t out_capacity, size_t *out_len) {
    REQUIRE(out_len, "out_len");
    fastllm_status s = FASTLLM_OK;
    fastllm_status g = guard([&] {
        const nlohmann::ordered_json triggers = fastllm::tool_call_triggers(tool_format(model, tmpl));
        s = copy_out(triggers.dump(), out_json, out_capacity, out_len, true);
    });
    return g ? g : s;
}

fastllm_status fastllm_template_render(const char *tmpl, const char *variables_json, char *out_text,
                                       size_t out_capacity, size_t *out_len) {
    REQUIRE(tmpl, "tmpl");
    REQUIRE(variables_json, "variables_json");
    REQUIRE(out_len, "out_len");
    fastllm_status s = FASTLLM_OK;
    fastllm_status g = guard([&] {
        std::string text = fastllm::jinja::Template(tmpl).render(parse_variables(variables_json));
        s = copy_out(text, out_text, out_capacity, out_len, true);
    });
    return g ? g : s;
}

fastllm_status fastllm_chat_apply_template(const fastllm_model *model, const char *tmpl,
                                           const fastllm_chat_message *messages, size_t n_messages,
                                           int add_generation_prompt, char *out_text, size_t out_capacity,
                                           size_t *out_len) {
    fastllm_chat_params p = fastllm_chat_default_params();
    p.add_generation_prompt = add_generation_prompt;
    return fastllm_chat_apply_template_v2(model, tmpl, messages, n_messages, &p, out_text, out_capacity, out_len);
}

fastllm_session_params fastllm_session_default_params(void) {
    fastllm_session_params p;
    std::memset(&p, 0, sizeof p);
    p.n_ctx = 0;
    p.n_batch = 256;
    p.n_threads = 0;
    p.type_k = FASTLLM_KV_F16;
    p.type_v = FASTLLM_KV_F16;
    p.context_shift = 0;
    p.n_keep = 0;
    p.n_discard = 0;
    p.swa_full = 0;
    return p;
}

namespace {
fastllm::SessionOptions session_options(const fastllm_session_params &p) {
    fastllm::SessionOptions o;
    o.n_ctx = p.n_ctx, o.n_batch = p.n_batch, o.n_threads = p.n_threads;
    o.type_k = (fastllm::KvType)p.type_k, o.type_v = (fastllm::KvType)p.type_v;  // range-checked by the session
    o.context_shift = p.context_shift != 0, o.n_keep = p.n_keep, o.n_discard = p.n_discard;
    o.swa_full = p.swa_full != 0;
    return o;
}
}  // namespace

fastllm_status fastllm_session_create(const fastllm_model *model, const fastllm_session_params *params,
                                      fastllm_session **out_session) {
    REQUIRE(out_session, "out_session");
    *out_session = nullptr;
    REQUIRE(model, "model");
    const fastllm::SessionOptions o = session_options(params ? *params : fastllm_session_default_params());
    return guard([&] { *out_session = new fastllm_session(model->impl, o); });
}

fastllm_status fastllm_session_fork(const fastllm_session *src, int32_t n_tokens, const fastllm_session_params *params,
                                    fastllm_session **out_session) {
    REQUIRE(out_session, "out_session");
    *out_session = nullptr;
    REQUIRE(src, "src");
    if (n_tokens < 0) return set_error(FASTLLM_ERR_INVALID_ARGUMENT, "n_tokens must not be negative");
    const fastllm::SessionOptions o = params ? session_options(*params) : src->impl.options();
    if (params && (o.type_k != src->impl.options().type_k || o.type_v != src->impl.options().type_v))
        return set_error(FASTLLM_ERR_INVALID_ARGUMENT, "a fork keeps the KV cache types of the session it shares");
    return guard([&] { *out_session = new fastllm_session(src->impl, (size_t)n_tokens, o); });
}

fastllm_status fastllm_session_memory(const fastllm_session *session, fastllm_session_memory_info *out_info) {
    REQUIRE(session, "session");
    REQUIRE(out_info, "out_info");
    const fastllm::SessionMemory m = session->impl.memory();
    out_info->kv_bytes = m.kv_bytes, out_info->kv_shared_bytes = m.kv_shared_bytes;
    out_info->kv_bytes_per_token = m.kv_bytes_per_token, out_info->kv_capacity_bytes = m.kv_capacity_bytes;
    out_info->session_bytes = m.session_bytes, out_info->compute_bytes = m.compute_bytes;
    g_last_error.clear();
    return FASTLLM_OK;
}

fastllm_status fastllm_session_save_state(const fastllm_session *session, void *out, size_t out_capacity,
                                          size_t *out_len) {
    REQUIRE(session, "session");
    REQUIRE(out_len, "out_len");
    std::vector<uint8_t> state;
    fastllm_status s = guard([&] { state = session->impl.save_state(); });
    if (s != FASTLLM_OK) return s;
    *out_len = state.size();
    if (!out || out_capacity < state.size())
        return set_error(FASTLLM_ERR_BUFFER_TOO_SMALL, "state buffer of " + std::to_string(out_capacity) +
                                                           " bytes is too small: " + std::to_string(state.size()) +
                                                           " needed");
    std::memcpy(out, state.data(), state.size());
    return FASTLLM_OK;
}

fastllm_status fastllm_session_load_state(fastllm_session *session, const void *data, size_t size,
                                          fastllm_stream_callback callback, void *user_data) {
    REQUIRE(session, "session");
    REQUIRE(data || size == 0, "data");
    return guard([&] { session->impl.load_state((const uint8_t *)data, size, callback, user_data); });
}

fastllm_status fastllm_session_save_state_file(const fastllm_session *session, const char *path) {
    REQUIRE(session, "session");
    REQUIRE(path, "path");
    return guard([&] {
        const std::vector<uint8_t> state = session->impl.save_state();
        const std::string tmp = std::string(path) + ".tmp";
        FILE *f = fastllm::platform::fopen_utf8(tmp.c_str(), "wb");
        if (!f) fastllm::fail(FASTLLM_ERR_IO, "%s: cannot open for writing", tmp.c_str());
        const bool ok = std::fwrite(state.data(), 1, state.size(), f) == state.size() && std::fflush(f) == 0;
        if (std::fclose(f) != 0 || !ok) {
            fastllm::platform::remove_file(tmp.c_str());
            fastllm::fail(FASTLLM_ERR_IO, "%s: write failed", tmp.c_str());
        }
        if (!fastllm::platform::replace_file(tmp.c_str(), path)) {
            fastllm::platform::remove_file(tmp.c_str());
            fastllm::fail(FASTLLM_ERR_IO, "%s: cannot rename the saved state into place", path);
        }
    });
}

fastllm_status fastllm_session_load_state_file(fastllm_session *session, const char *path,
                                               fastllm_stream_callback callback, void *user_data) {
    REQUIRE(session, "session");
    REQUIRE(path, "path");
    return guard([&] {
        FILE *f = fastllm::platform::fopen_utf8(path, "rb");
        if (!f) fastllm::fail(FASTLLM_ERR_IO, "%s: cannot open", path);
        std::vector<uint8_t> data;
        uint8_t buf[1 << 16];
        for (size_t n; (n = std::fread(buf, 1, sizeof buf, f)) > 0;) data.insert(data.end(), buf, buf + n);
        const bool err = std::ferror(f) != 0;
        std::fclose(f);
        if (err) fastllm::fail(FASTLLM_ERR_IO, "%s: read failed", path);
        session->impl.load_state(data.data(), data.size(), callback, user_data);
    });
}

void fastllm_session_free(fastllm_session *session) { delete session; }

fastllm_status fastllm_session_reset(fastllm_session *session) {
    REQUIRE(session, "session");
    session->impl.reset();
    return FASTLLM_OK;
}

int32_t fastllm_session_n_tokens(const fastllm_session *session) { return session ? session->impl.n_tokens() : 0; }
int32_t fastllm_session_n_cached(const fastllm_session *session) { return session ? session->impl.n_cached() : 0; }
int32_t fastllm_session_n_ctx(const fastllm_session *session) { return session ? session->impl.n_ctx() : 0; }

fastllm_status fastllm_session_get_tokens(const fastllm_session *session, int32_t *out_tokens, size_t out_capacity,
                                          size_t *out_n_tokens) {
    REQUIRE(session, "session");
    REQUIRE(out_n_tokens, "out_n_tokens");
    g_last_error.clear();
    const std::vector<int32_t> &ids = session->impl.tokens();
    *out_n_tokens = ids.size();
    if (ids.size() > out_capacity || (!out_tokens && !ids.empty()))
        return set_error(FASTLLM_ERR_BUFFER_TOO_SMALL, "token buffer holds " + std::to_string(out_capacity) +
                                                           " ids, " + std::to_string(ids.size()) + " needed");
    if (!ids.empty()) std::memcpy(out_tokens, ids.data(), ids.size() * sizeof(int32_t));
    return FASTLLM_OK;
}

fastllm_status fastllm_session_truncate(fastllm_session *session, int32_t n_keep) {
    REQUIRE(session, "session");
    if (n_keep < 0) return set_error(FASTLLM_ERR_INVALID_ARGUMENT, "n_keep must not be negative");
    return guard([&] { session->impl.truncate((size_t)n_keep); });
}

fastllm_status fastllm_session_eval(fastllm_session *session, const int32_t *tokens, size_t n_tokens,
                                    fastllm_logits_mode mode, float *out_logits) {
    REQUIRE(session, "session");
    // A C caller can pass any int; loading an enum outside its values is undefined in C++
    // (UBSan found it), so the value is read as the int it is passed as.
    static_assert(sizeof mode == sizeof(int), "enums are ints in this ABI");
    int m;
    std::memcpy(&m, &mode, sizeof m);
    if (m != FASTLLM_LOGITS_NONE && m != FASTLLM_LOGITS_LAST && m != FASTLLM_LOGITS_ALL)
        return set_error(FASTLLM_ERR_INVALID_ARGUMENT, "unknown logits mode " + std::to_string(m));
    return guard([&] { session->impl.eval(tokens, n_tokens, (fastllm_logits_mode)m, out_logits); });
}

fastllm_sampling_params fastllm_sampling_default_params(void) {
    fastllm_sampling_params p;
    std::memset(&p, 0, sizeof p);
    p.max_new_tokens = 256;
    p.temperature = 0.8f;
    p.top_k = 40;
    p.top_p = 0.95f;
    p.min_p = 0.05f;
    p.repetition_penalty = 1.0f;
    p.repeat_last_n = 64;
    p.seed = 0;
    p.stop = nullptr;
    p.n_stop = 0;
    p.ignore_eos = 0;
    p.grammar = nullptr;
    p.json_schema = nullptr;
    p.grammar_triggers = nullptr;
    p.n_grammar_triggers = 0;
    return p;
}

fastllm_status fastllm_json_schema_to_grammar(const char *schema, char *out, size_t out_capacity, size_t *out_len) {
    REQUIRE(out_len, "out_len");
    REQUIRE(schema, "schema");
    fastllm_status s = FASTLLM_OK;
    fastllm_status g = guard([&] { s = copy_out(fastllm::json_schema_to_grammar(schema), out, out_capacity, out_len, true); });
    return g ? g : s;
}

fastllm_status fastllm_grammar_check(const char *grammar) {
    REQUIRE(grammar, "grammar");
    return guard([&] { fastllm::Grammar::parse(grammar); });
}

fastllm_status fastllm_session_generate(fastllm_session *session, const int32_t *prompt_tokens, size_t n_prompt_tokens,
                                        const fastllm_sampling_params *params, fastllm_stream_callback callback,
                                        void *user_data, fastllm_generation_result *out_result) {
    REQUIRE(session, "session");
    fastllm::GenerationResult result;
    fastllm_status s = guard([&] {
        session->impl.generate(prompt_tokens, n_prompt_tokens, sampling_options(params), callback, user_data, result);
    });
    if (out_result) *out_result = to_c(result);
    return s;
}

fastllm_status fastllm_session_begin_generation(fastllm_session *session, const int32_t *prompt_tokens,
                                                size_t n_prompt_tokens, const fastllm_sampling_params *params,
                                                fastllm_stream_callback callback, void *user_data) {
    REQUIRE(session, "session");
    return guard([&] {
        session->impl.begin_generation(prompt_tokens, n_prompt_tokens, sampling_options(params), callback, user_data);
    });
}

fastllm_status fastllm_session_begin_generation_deferred(fastllm_session *session, const int32_t *prompt_tokens,
                                                         size_t n_prompt_tokens, const fastllm_sampling_params *params,
                                                         fastllm_stream_callback callback, void *user_data) {
    REQUIRE(session, "session");
    return guard([&] {
        session->impl.begin_generation(prompt_tokens, n_prompt_tokens, sampling_options(params), callback, user_data,
                                       true);
    });
}

fastllm_step_params fastllm_step_default_params(void) {
    fastllm_step_params p;
    // 256 prompt tokens add about one 256-token prompt pass to a step (SmolLM2-135M on 2 cores:
    // ~0.2 s), the stall a running stream sees while a long prompt is admitted.
    p.max_prompt_tokens = 256;
    return p;
}

fastllm_status fastllm_generate_step_ex(fastllm_session *const *sessions, size_t n_sessions,
                                        const fastllm_step_params *params, int32_t *out_done) {
    REQUIRE(sessions || n_sessions == 0, "sessions");
    REQUIRE(out_done || n_sessions == 0, "out_done");
    const fastllm_step_params p = params ? *params : fastllm_step_default_params();
    return guard([&] {
        // fastllm_session wraps Session as its only member, so the impl pointers are looked up once.
        std::vector<fastllm::Session *> impls(n_sessions);
        for (size_t i = 0; i < n_sessions; i++) impls[i] = sessions[i] ? &sessions[i]->impl : nullptr;
        fastllm::Session::step(impls.data(), n_sessions, out_done, p.max_prompt_tokens);
    });
}

fastllm_status fastllm_generate_step(fastllm_session *const *sessions, size_t n_sessions, int32_t *out_done) {
    return fastllm_generate_step_ex(sessions, n_sessions, nullptr, out_done);
}

int fastllm_session_is_generating(const fastllm_session *session) { return session && session->impl.generating(); }

fastllm_status fastllm_session_generation_result(const fastllm_session *session, fastllm_generation_result *out_result) {
    REQUIRE(session, "session");
    REQUIRE(out_result, "out_result");
    *out_result = to_c(session->impl.generation_result());
    return FASTLLM_OK;
}

fastllm_status fastllm_session_cancel_generation(fastllm_session *session) {
    REQUIRE(session, "session");
    return guard([&] { session->impl.cancel_generation(); });
}

fastllm_speculative_params fastllm_speculative_default_params(void) {
    const fastllm::SpeculativeOptions d;
    fastllm_speculative_params p;
    p.draft_model = nullptr;
    p.n_draft = d.n_draft;
    p.ngram_min = d.ngram_min;
    p.ngram_max = d.ngram_max;
    p.p_min = d.p_min;
    return p;
}

fastllm_status fastllm_adapter_load(const fastllm_model *model, const char *path, fastllm_adapter **out_adapter) {
    REQUIRE(out_adapter, "out_adapter");
    *out_adapter = nullptr;
    REQUIRE(model, "model");
    REQUIRE(path, "path");
    return guard([&] {
        auto a = std::make_shared<const fastllm::LoraAdapter>(std::make_unique<fastllm::FlmFile>(path, true),
                                                              model->impl.decoder());
        *out_adapter = new fastllm_adapter{std::move(a)};
    });
}

void fastllm_adapter_free(fastllm_adapter *adapter) { delete adapter; }

fastllm_status fastllm_session_set_adapters(fastllm_session *session, const fastllm_adapter *const *adapters,
                                            const float *scales, size_t n) {
    REQUIRE(session, "session");
    if (n > 0 && (!adapters || !scales)) return set_error(FASTLLM_ERR_INVALID_ARGUMENT, "adapters and scales must not be NULL when n > 0");
    return guard([&] {
        std::vector<std::pair<std::shared_ptr<const fastllm::LoraAdapter>, float>> set;
        for (size_t i = 0; i < n; i++) {
            if (!adapters[i]) fastllm::fail(FASTLLM_ERR_INVALID_ARGUMENT, "adapter %zu is NULL", i);
            set.emplace_back(adapters[i]->impl, scales[i]);
        }
        session->impl.set_adapters(set);
    });
}

fastllm_status fastllm_session_set_speculative(fastllm_session *session, const fastllm_speculative_params *params) {
    REQUIRE(session, "session");
    return guard([&] {
        if (!params) return session->impl.set_speculative(nullptr);
        fastllm::SpeculativeOptions o;
        o.draft_model = params->draft_model ? &params->draft_model->impl : nullptr;
        o.n_draft = params->n_draft;
        o.ngram_min = params->ngram_min;
        o.ngram_max = params->ngram_max;
        o.p_min = params->p_min;
        session->impl.set_speculative(&o);
    });
}

fastllm_status fastllm_session_speculative_stats(const fastllm_session *session, int64_t *n_drafted, int64_t *n_accepted) {
    REQUIRE(session, "session");
    if (n_drafted) *n_drafted = session->impl.n_drafted();
    if (n_accepted) *n_accepted = session->impl.n_accepted();
    return FASTLLM_OK;
}

fastllm_status fastllm_session_cancel(fastllm_session *session) {
    REQUIRE(session, "session");
    // No guard(): it may run beside another thread's call on this session, and touches only atomics
    // and this thread's last-error message.
    if (!session->impl.request_cancel())
        return set_error(FASTLLM_ERR_INVALID_ARGUMENT, "the session is neither evaluating nor generating");
    g_last_error.clear();
    return FASTLLM_OK;
}

}  // extern "C"

namespace {
// A quantized dtype by its .flm name, for a shape it can store (whose byte count cannot overflow);
// false (and the message set) otherwise.
bool quantized_dtype(const char *name, int64_t rows, int64_t cols, fastllm::DType *t) {
    for (const fastllm::DTypeTraits &d : fastllm::kDTypes)
        if (name && d.quantized && std::strcmp(d.name, name) == 0) {
            *t = d.type;
            if (rows > 0 && cols > 0 && cols % d.row_multiple == 0 && rows <= ((int64_t)1 << 48) / cols) return true;
            set_error(FASTLLM_ERR_INVALID_ARGUMENT, std::string(name) + " needs rows of a multiple of " +
                                                        std::to_string(d.row_multiple) + " weights, not [" +
                                                        std::to_string(rows) + ", " + std::to_string(cols) + "]");
            return false;
        }
    set_error(FASTLLM_ERR_INVALID_ARGUMENT, std::string("not a quantized dtype: ") + (name ? name : "NULL"));
    return false;
}

// fastllm_quantize (float32 weights), fastllm_quantize_f16 and fastllm_quantize_bf16.
fastllm_status quantize_weights(const char *dtype, fastllm::WeightBits bits, const void *weights, int64_t rows,
                                int64_t cols, int64_t first_row, int64_t n_rows, int32_t n_threads, void *out,
                                size_t out_size) {
    REQUIRE(weights, "weights");
    REQUIRE(out, "out");
    fastllm::DType t;
    if (!quantized_dtype(dtype, rows, cols, &t)) return FASTLLM_ERR_INVALID_ARGUMENT;
    const uint64_t need = fastllm::tensor_bytes(t, (uint64_t)rows, (uint64_t)cols);
    if (out_size != need)
        return set_error(FASTLLM_ERR_INVALID_ARGUMENT, "out holds " + std::to_string(out_size) + " bytes; " + dtype +
                                                           " [" + std::to_string(rows) + ", " + std::to_string(cols) +
                                                           "] takes " + std::to_string(need));
    if (n_threads < 0) return set_error(FASTLLM_ERR_INVALID_ARGUMENT, "n_threads must not be negative");
    const int threads = n_threads > 0 ? n_threads : (int)std::max(1u, std::thread::hardware_concurrency());
    return guard(
        [&] { fastllm::quantize_matrix(t, bits, weights, rows, cols, first_row, n_rows, threads, (uint8_t *)out); });
}

}  // namespace

extern "C" {

size_t fastllm_quantized_size(const char *dtype, int64_t rows, int64_t cols) {
    fastllm::DType t;
    if (!quantized_dtype(dtype, rows, cols, &t)) return 0;
    g_last_error.clear();
    return (size_t)fastllm::tensor_bytes(t, (uint64_t)rows, (uint64_t)cols);
}

fastllm_status fastllm_quantize(const char *dtype, const float *weights, int64_t rows, int64_t cols, int64_t first_row,
                                int64_t n_rows, int32_t n_threads, void *out, size_t out_size) {
    return quantize_weights(dtype, fastllm::WeightBits::F32, weights, rows, cols, first_row, n_rows, n_threads, out,
                            out_size);
}

fastllm_status fastllm_quantize_f16(const char *dtype, const uint16_t *weights, int64_t rows, int64_t cols,
                                    int64_t first_row, int64_t n_rows, int32_t n_threads, void *out, size_t out_size) {
    return quantize_weights(dtype, fastllm::WeightBits::F16, weights, rows, cols, first_row, n_rows, n_threads, out,
                            out_size);
}

fastllm_status fastllm_quantize_bf16(const char *dtype, const uint16_t *weights, int64_t rows, int64_t cols,
                                     int64_t first_row, int64_t n_rows, int32_t n_threads, void *out, size_t out_size) {
    return quantize_weights(dtype, fastllm::WeightBits::BF16, weights, rows, cols, first_row, n_rows, n_threads, out,
                            out_size);
}

}  // extern "C"
