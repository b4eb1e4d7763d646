// fastllm.hpp — a header-only C++17 wrapper over the C API in fastllm.h.
//
//   fastllm::Model model("model.flm", /*threads=*/4);
//   fastllm::Session session(model, {/*n_ctx=*/1024});
//   fastllm::SamplingParams sp;
//   sp.max_new_tokens = 64;
//   auto r = session.generate("Once upon a time", sp, [](std::string_view piece) {
//       std::cout << piece << std::flush;
//       return true;  // false stops the generation
//   });
//
// Handles are move-only and freed by their destructors; a moved-from handle is empty (get() is
// nullptr). Failures throw fastllm::Error, which keeps the C status code. Text goes in as
// std::string_view and comes out as std::string. The library itself is plain C: no exception
// crosses into it (see Session::generate).
#ifndef FASTLLM_HPP
#define FASTLLM_HPP

#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "fastllm.h"

namespace fastllm {

// A failed C call: what() is "FASTLLM_ERR_x: <message>", status() the code to branch on.
class Error : public std::runtime_error {
public:
    Error(fastllm_status status, const std::string &message)
        : std::runtime_error(std::string(fastllm_status_name(status)) + ": " + message), status_(status) {}
    fastllm_status status() const noexcept { return status_; }

private:
    fastllm_status status_;
};

namespace detail {

// fastllm_last_error() is per thread and overwritten by the next call, so it is read at once.
inline void check(fastllm_status status) {
    if (status != FASTLLM_OK) throw Error(status, fastllm_last_error());
}

// The C API's output convention: write into the caller's buffer, report the needed length, and
// answer FASTLLM_ERR_BUFFER_TOO_SMALL if it did not fit. Try a buffer of `guess` elements, then
// once more with the reported size. `extra` is 1 where the C side also writes a NUL.
template <class T, class Call>
std::vector<T> read_sized(size_t guess, size_t extra, Call &&call) {
    std::vector<T> out(guess + extra);
    size_t n = 0;
    fastllm_status st = call(out.data(), out.size(), &n);
    if (st == FASTLLM_ERR_BUFFER_TOO_SMALL) {
        out.resize(n + extra);
        st = call(out.data(), out.size(), &n);
    }
    check(st);
    out.resize(n);
    return out;
}

// add_bos: 1, 0, or -1 for the model's default.
inline std::vector<int32_t> tokenize(const fastllm_model *model, std::string_view text, int add_bos) {
    // Rarely more ids than bytes (plus BOS and a leading-space piece): one call in practice.
    const char *data = text.data() ? text.data() : "";  // an empty view may hold nullptr
    return read_sized<int32_t>(text.size() + 2, 0, [&](int32_t *out, size_t cap, size_t *n) {
        return fastllm_tokenize(model, data, text.size(), add_bos, out, cap, n);
    });
}

template <class Call>
std::string read_string(size_t guess, size_t extra, Call &&call) {
    std::vector<char> buf = read_sized<char>(guess, extra, std::forward<Call>(call));
    return std::string(buf.data(), buf.size());
}

}  // namespace detail

inline std::string version() { return fastllm_version(); }

// The GBNF grammar of a JSON Schema (its JSON text), as SamplingParams::json_schema uses it;
// throws Error (FASTLLM_ERR_UNSUPPORTED naming the keyword, FASTLLM_ERR_INVALID_ARGUMENT).
inline std::string json_schema_to_grammar(const std::string &schema) {
    return detail::read_string(schema.size() * 4 + 4096, 1, [&](char *out, size_t cap, size_t *n) {
        return fastllm_json_schema_to_grammar(schema.c_str(), out, cap, n);
    });
}

// Names as the Python binding spells them.
inline const char *stop_reason_name(fastllm_stop_reason reason) noexcept {
    switch (reason) {
        case FASTLLM_STOP_EOS: return "eos";
        case FASTLLM_STOP_MAX_TOKENS: return "max_tokens";
        case FASTLLM_STOP_STRING: return "stop_string";
        case FASTLLM_STOP_CALLBACK: return "callback";
        case FASTLLM_STOP_CONTEXT_FULL: return "context_full";
        case FASTLLM_STOP_CANCELLED: return "cancelled";
        case FASTLLM_STOP_GRAMMAR: return "grammar";
    }
    return "?";
}

struct ChatMessage {
    std::string role;  // "system", "user" or "assistant"
    std::string content;
};

class Model {
public:
    Model() noexcept = default;  // empty; assign a loaded one later
    // threads: the default for this model's sessions, 0 = all cores. device: "cpu" (empty, the
    // default), "vulkan", "vulkan:N" or "auto"; gpu_layers: layers on the device (-1: all, 0: none).
    explicit Model(std::string_view path, int threads = 0, bool use_mmap = true, std::string_view device = {},
                   int gpu_layers = -1) {
        // A header compiled against one ABI and a library of another would misread the structs.
        if (fastllm_abi_version() != FASTLLM_ABI_VERSION)
            throw Error(FASTLLM_ERR_UNSUPPORTED, "fastllm.hpp expects ABI " + std::to_string(FASTLLM_ABI_VERSION) +
                                                     ", the library has " + std::to_string(fastllm_abi_version()));
        fastllm_model_params p = fastllm_model_default_params();
        p.n_threads = threads;
        p.use_mmap = use_mmap ? 1 : 0;
        const std::string device_z(device);
        p.device = device_z.empty() ? nullptr : device_z.c_str();
        p.n_gpu_layers = gpu_layers;
        const std::string path_z(path);  // the C side wants a NUL-terminated path
        detail::check(fastllm_model_load(path_z.c_str(), &p, &model_));
    }
    static Model load(std::string_view path, int threads = 0) { return Model(path, threads); }

    Model(Model &&other) noexcept : model_(std::exchange(other.model_, nullptr)) {}
    Model &operator=(Model &&other) noexcept {
        if (this != &other) {
            fastllm_model_free(model_);
            model_ = std::exchange(other.model_, nullptr);
        }
        return *this;
    }
    Model(const Model &) = delete;
    Model &operator=(const Model &) = delete;
    // Sessions hold the raw pointer: free them before the model.
    ~Model() { fastllm_model_free(model_); }

    fastllm_model *get() const noexcept { return model_; }
    explicit operator bool() const noexcept { return model_ != nullptr; }

    // The strings in it are owned by the model.
    fastllm_model_info info() const {
        fastllm_model_info out{};
        detail::check(fastllm_model_get_info(model_, &out));
        return out;
    }
    std::optional<std::string> chat_template() const {
        const char *t = fastllm_model_chat_template(model_);
        return t ? std::optional<std::string>(t) : std::nullopt;
    }

    // Embeddings of texts (docs/embeddings.md): one vector of info().hidden_size floats per text,
    // or (FASTLLM_POOLING_NONE) per token of every text in order.
    std::vector<std::vector<float>> embed(const std::vector<std::string> &texts,
                                          const fastllm_embed_params &params = fastllm_embed_default_params()) const {
        std::vector<const char *> ptrs;
        for (const std::string &t : texts) ptrs.push_back(t.c_str());
        size_t n = 0;
        const fastllm_status s = fastllm_embed(model_, ptrs.data(), ptrs.size(), &params, nullptr, 0, &n);
        if (s != FASTLLM_ERR_BUFFER_TOO_SMALL) detail::check(s);
        const size_t dim = (size_t)info().hidden_size;
        std::vector<float> flat(n * dim);
        detail::check(fastllm_embed(model_, ptrs.data(), ptrs.size(), &params, flat.data(), flat.size(), &n));
        std::vector<std::vector<float>> out;
        for (size_t i = 0; i < n; i++) out.emplace_back(flat.begin() + i * dim, flat.begin() + (i + 1) * dim);
        return out;
    }

    // A cross-encoder's score of each document for the query (docs/embeddings.md).
    std::vector<float> rerank(const std::string &query, const std::vector<std::string> &documents,
                              const fastllm_rerank_params &params = fastllm_rerank_default_params()) const {
        std::vector<const char *> ptrs;
        for (const std::string &d : documents) ptrs.push_back(d.c_str());
        std::vector<float> scores(documents.size());
        detail::check(fastllm_rerank(model_, query.c_str(), ptrs.data(), ptrs.size(), &params, scores.data()));
        return scores;
    }

    // add_bos: true / false, or nullopt for the model's default.
    std::vector<int32_t> tokenize(std::string_view text, std::optional<bool> add_bos = std::nullopt) const {
        return detail::tokenize(model_, text, add_bos ? (*add_bos ? 1 : 0) : -1);
    }
    std::string detokenize(const int32_t *tokens, size_t n_tokens) const {
        return detail::read_string(n_tokens * 8 + 16, 1, [&](char *out, size_t cap, size_t *n) {
            return fastllm_detokenize(model_, tokens, n_tokens, out, cap, n);
        });
    }
    std::string detokenize(const std::vector<int32_t> &tokens) const { return detokenize(tokens.data(), tokens.size()); }
    std::string token_to_piece(int32_t token) const {
        return detail::read_string(32, 0, [&](char *out, size_t cap, size_t *n) {
            return fastllm_token_to_piece(model_, token, out, cap, n);
        });
    }

    // Renders a conversation with the model's own template, or with tmpl when given. Tokenize the
    // result with add_bos = false (templates write BOS as text).
    std::string apply_chat_template(const std::vector<ChatMessage> &messages, bool add_generation_prompt = true,
                                    std::optional<std::string_view> tmpl = std::nullopt) const {
        std::vector<fastllm_chat_message> c_messages;
        c_messages.reserve(messages.size());
        size_t guess = 64;
        for (const ChatMessage &m : messages) {
            c_messages.push_back({m.role.c_str(), m.content.c_str()});
            guess += m.role.size() + m.content.size() + 32;
        }
        const std::string tmpl_z = tmpl ? std::string(*tmpl) : std::string();
        return detail::read_string(guess, 1, [&](char *out, size_t cap, size_t *n) {
            return fastllm_chat_apply_template(model_, tmpl ? tmpl_z.c_str() : nullptr, c_messages.data(),
                                               c_messages.size(), add_generation_prompt ? 1 : 0, out, cap, n);
        });
    }
    // The chat template over variables (a JSON object's text: "messages" with tool_calls, tool
    // messages, content parts, "tools", any other variable), as fastllm_chat_apply_template_json.
    std::string apply_chat_template_json(const std::string &variables_json,
                                         std::optional<std::string_view> tmpl = std::nullopt) const {
        const std::string tmpl_z = tmpl ? std::string(*tmpl) : std::string();
        return detail::read_string(variables_json.size() * 2 + 1024, 1, [&](char *out, size_t cap, size_t *n) {
            return fastllm_chat_apply_template_json(model_, tmpl ? tmpl_z.c_str() : nullptr, variables_json.c_str(),
                                                    out, cap, n);
        });
    }

    // Tool calls (docs/templates.md#tool-calls) in the format of the model's chat template, or, for
    // a model without one, the generic JSON object. tools_json: OpenAI's tool list as JSON text.
    // A GBNF grammar (SamplingParams::grammar) whose matches are a call to one of the tools (to
    // `only` when given) with arguments matching its schema.
    std::string tool_call_grammar(const std::string &tools_json, const std::string &only = "",
                                  bool parallel = false) const {
        return detail::read_string(tools_json.size() * 8 + 4096, 1, [&](char *out, size_t cap, size_t *n) {
            return fastllm_chat_tool_grammar(model_, tool_template(), tools_json.c_str(),
                                             only.empty() ? nullptr : only.c_str(), parallel ? 1 : 0, out, cap, n);
        });
    }
    // For tool_choice "auto": SamplingParams::grammar_triggers that make tool_call_grammar's grammar
    // lazy (free text until a call begins). Throws Error (FASTLLM_ERR_UNSUPPORTED) for a format
    // without a grammar.
    std::vector<std::string> tool_call_triggers() const {
        const std::string text = detail::read_string(256, 1, [&](char *out, size_t cap, size_t *n) {
            return fastllm_chat_tool_triggers(model_, tool_template(), out, cap, n);
        });
        std::vector<std::string> out;  // a JSON array of strings without escapes: ["<tool_call>"], ["^{", "^["]
        for (size_t q = text.find('"'); q != std::string::npos; q = text.find('"', q + 1)) {
            const size_t e = text.find('"', q + 1);
            if (e == std::string::npos) break;
            out.push_back(text.substr(q + 1, e - q - 1));
            q = e;
        }
        return out;
    }
    // The calls in a reply, as the library's JSON text: {"format", "content", "tool_calls":
    // [{"name", "arguments"}]} (no calls, and the whole reply as content, when they do not parse).
    std::string parse_tool_calls(const std::string &reply, const std::string &tools_json) const {
        return detail::read_string(reply.size() * 2 + 1024, 1, [&](char *out, size_t cap, size_t *n) {
            return fastllm_chat_parse_tool_calls(model_, tool_template(), reply.c_str(), tools_json.c_str(), out, cap, n);
        });
    }

private:
    // nullptr: the model's own template; "" (no template): the generic format
    const char *tool_template() const { return fastllm_model_chat_template(model_) ? nullptr : ""; }

    fastllm_model *model_ = nullptr;
};

// Each default is read from the C library, so the wrapper cannot drift from it; being an
// aggregate, SessionOptions{1024} sets n_ctx alone.
struct SessionOptions {
    int32_t n_ctx = fastllm_session_default_params().n_ctx;      // 0 = 4096 (or the model's, if shorter)
    int32_t threads = fastllm_session_default_params().n_threads;  // 0 = the model's default
    int32_t n_batch = fastllm_session_default_params().n_batch;
    fastllm_kv_type type_k = static_cast<fastllm_kv_type>(fastllm_session_default_params().type_k);  // f16
    fastllm_kv_type type_v = static_cast<fastllm_kv_type>(fastllm_session_default_params().type_v);
    bool context_shift = fastllm_session_default_params().context_shift != 0;  // drop old tokens when full
    int32_t n_keep = fastllm_session_default_params().n_keep;        // tokens a shift keeps at the start
    int32_t n_discard = fastllm_session_default_params().n_discard;  // 0 = half of those after n_keep
    bool swa_full = fastllm_session_default_params().swa_full != 0;   // sliding-window layers keep everything

    fastllm_session_params to_c() const {
        fastllm_session_params p = fastllm_session_default_params();
        p.n_ctx = n_ctx, p.n_threads = threads, p.n_batch = n_batch;
        p.type_k = type_k, p.type_v = type_v;
        p.context_shift = context_shift ? 1 : 0, p.n_keep = n_keep, p.n_discard = n_discard;
        p.swa_full = swa_full ? 1 : 0;
        return p;
    }
};

struct SamplingParams {
    int32_t max_new_tokens = fastllm_sampling_default_params().max_new_tokens;
    float temperature = fastllm_sampling_default_params().temperature;  // <= 0: greedy
    int32_t top_k = fastllm_sampling_default_params().top_k;
    float top_p = fastllm_sampling_default_params().top_p;
    float min_p = fastllm_sampling_default_params().min_p;
    float repetition_penalty = fastllm_sampling_default_params().repetition_penalty;
    int32_t repeat_last_n = fastllm_sampling_default_params().repeat_last_n;
    uint64_t seed = fastllm_sampling_default_params().seed;
    std::vector<std::string> stop;  // not included in the output
    bool ignore_eos = fastllm_sampling_default_params().ignore_eos != 0;
    // Constrained output (docs/grammar.md), empty for none; at most one of the two:
    std::string grammar;      // GBNF (llama.cpp's syntax)
    std::string json_schema;  // a JSON Schema's text; the output is an instance of it
    // The grammar applies from the first of these in the output on (none: from the start);
    // "^x": x at the output's start, after whitespace (docs/grammar.md#lazy-grammars)
    std::vector<std::string> grammar_triggers;
};

struct GenerationResult {
    std::string text;  // everything the generation streamed
    int n_prompt_tokens = 0;
    int n_generated_tokens = 0;
    fastllm_stop_reason stop_reason = FASTLLM_STOP_EOS;
    double prompt_ms = 0;
    double generate_ms = 0;
    const char *stop_reason_name() const noexcept { return fastllm::stop_reason_name(stop_reason); }
};

// A LoRA adapter file loaded for a model (docs/lora.md); the model must outlive it. Sessions that
// have it set keep it alive after this object is gone.
class Adapter {
public:
    Adapter() noexcept = default;
    Adapter(const Model &model, const std::string &path) {
        detail::check(fastllm_adapter_load(model.get(), path.c_str(), &adapter_));
    }
    Adapter(Adapter &&other) noexcept : adapter_(std::exchange(other.adapter_, nullptr)) {}
    Adapter &operator=(Adapter &&other) noexcept {
        if (this != &other) {
            fastllm_adapter_free(adapter_);
            adapter_ = std::exchange(other.adapter_, nullptr);
        }
        return *this;
    }
    Adapter(const Adapter &) = delete;
    Adapter &operator=(const Adapter &) = delete;
    ~Adapter() { fastllm_adapter_free(adapter_); }
    fastllm_adapter *get() const noexcept { return adapter_; }

private:
    fastllm_adapter *adapter_ = nullptr;
};

// Receives each piece of text as it is generated (valid UTF-8, valid only during the call);
// returning false stops the generation.
using PieceCallback = std::function<bool(std::string_view piece)>;

class Session {
public:
    Session() noexcept = default;  // empty
    // The model must outlive the session. Moving the Model object is fine: the session keeps the
    // C handle, not the wrapper.
    explicit Session(const Model &model, const SessionOptions &options = {}) : model_(model.get()) {
        const fastllm_session_params p = options.to_c();
        detail::check(fastllm_session_create(model_, &p, &session_));
    }

    // A new session whose context is this one's first n_tokens (-1: all), sharing their KV cache
    // blocks (a persona evaluated once for many NPCs); options' KV types must be this session's.
    Session fork(int n_tokens = -1) const { return fork_with(n_tokens, nullptr); }
    Session fork(int n_tokens, const SessionOptions &options) const {
        const fastllm_session_params p = options.to_c();
        return fork_with(n_tokens, &p);
    }

    fastllm_session_memory_info memory() const {
        fastllm_session_memory_info m{};
        detail::check(fastllm_session_memory(session_, &m));
        return m;
    }

    // The session's state (tokens, KV cache, a generation in progress) as bytes, and back; loading
    // a state of another model or a damaged one throws, leaving the session as it was.
    std::vector<uint8_t> save_state() const {
        size_t n = 0;
        const fastllm_status st = fastllm_session_save_state(session_, nullptr, 0, &n);
        if (st != FASTLLM_ERR_BUFFER_TOO_SMALL) detail::check(st);
        std::vector<uint8_t> out(n);
        detail::check(fastllm_session_save_state(session_, out.data(), out.size(), &n));
        return out;
    }
    void load_state(const std::vector<uint8_t> &state) {
        detail::check(fastllm_session_load_state(session_, state.data(), state.size(), nullptr, nullptr));
    }
    void save_state_file(const std::string &path) const {
        detail::check(fastllm_session_save_state_file(session_, path.c_str()));
    }
    void load_state_file(const std::string &path) {
        detail::check(fastllm_session_load_state_file(session_, path.c_str(), nullptr, nullptr));
    }

    // From any thread: stops the evaluation or generation in progress; false if there is none.
    bool cancel() noexcept { return fastllm_session_cancel(session_) == FASTLLM_OK; }

    // The LoRA adapters this session applies from now on, each with its scale ({}: the base model).
    void set_adapters(const std::vector<std::pair<const Adapter *, float>> &adapters) {
        std::vector<const fastllm_adapter *> handles;
        std::vector<float> scales;
        for (const auto &a : adapters) handles.push_back(a.first ? a.first->get() : nullptr), scales.push_back(a.second);
        detail::check(fastllm_session_set_adapters(session_, handles.data(), scales.data(), handles.size()));
    }

    Session(Session &&other) noexcept
        : session_(std::exchange(other.session_, nullptr)), model_(std::exchange(other.model_, nullptr)) {}
    Session &operator=(Session &&other) noexcept {
        if (this != &other) {
            fastllm_session_free(session_);
            session_ = std::exchange(other.session_, nullptr);
            model_ = std::exchange(other.model_, nullptr);
        }
        return *this;
    }
    Session(const Session &) = delete;
    Session &operator=(const Session &) = delete;
    ~Session() { fastllm_session_free(session_); }

    fastllm_session *get() const noexcept { return session_; }
    explicit operator bool() const noexcept { return session_ != nullptr; }

    int n_tokens() const noexcept { return fastllm_session_n_tokens(session_); }
    int n_cached() const noexcept { return fastllm_session_n_cached(session_); }
    int n_ctx() const noexcept { return fastllm_session_n_ctx(session_); }
    void reset() { detail::check(fastllm_session_reset(session_)); }
    void truncate(int n_keep) { detail::check(fastllm_session_truncate(session_, n_keep)); }
    std::vector<int32_t> tokens() const {
        return detail::read_sized<int32_t>(static_cast<size_t>(n_tokens() > 0 ? n_tokens() : 0), 0,
                                           [&](int32_t *out, size_t cap, size_t *n) {
                                               return fastllm_session_get_tokens(session_, out, cap, n);
                                           });
    }

    // Appends tokens to the context and runs the model over them. Returns the logits the mode asks
    // for (none, the last token's vocab_size floats, or n_tokens x vocab_size row-major).
    std::vector<float> eval(const std::vector<int32_t> &tokens, fastllm_logits_mode mode = FASTLLM_LOGITS_NONE) {
        size_t rows = mode == FASTLLM_LOGITS_ALL ? tokens.size() : mode == FASTLLM_LOGITS_LAST ? 1 : 0;
        std::vector<float> logits;
        if (rows) {
            fastllm_model_info info{};
            detail::check(fastllm_model_get_info(model_, &info));
            logits.resize(rows * static_cast<size_t>(info.vocab_size));
        }
        detail::check(fastllm_session_eval(session_, tokens.data(), tokens.size(), mode,
                                           logits.empty() ? nullptr : logits.data()));
        return logits;
    }

    // A text prompt gets BOS (as the model defaults) only when the context is empty: BOS opens a
    // context, a continuation does not repeat it.
    GenerationResult generate(std::string_view prompt, const SamplingParams &params = {},
                              const PieceCallback &on_piece = {}) {
        std::vector<int32_t> ids;
        if (!prompt.empty()) ids = detail::tokenize(model_, prompt, n_tokens() > 0 ? 0 : -1);
        return generate(ids, params, on_piece);
    }

    // The generated tokens stay in the context, so the next call continues the conversation.
    GenerationResult generate(const std::vector<int32_t> &prompt_ids, const SamplingParams &params = {},
                              const PieceCallback &on_piece = {}) {
        fastllm_sampling_params sp = fastllm_sampling_default_params();
        sp.max_new_tokens = params.max_new_tokens;
        sp.temperature = params.temperature;
        sp.top_k = params.top_k;
        sp.top_p = params.top_p;
        sp.min_p = params.min_p;
        sp.repetition_penalty = params.repetition_penalty;
        sp.repeat_last_n = params.repeat_last_n;
        sp.seed = params.seed;
        sp.ignore_eos = params.ignore_eos ? 1 : 0;
        std::vector<const char *> stop;  // points into params.stop, which outlives the call
        for (const std::string &s : params.stop) stop.push_back(s.c_str());
        sp.stop = stop.empty() ? nullptr : stop.data();
        sp.n_stop = static_cast<int32_t>(stop.size());
        sp.grammar = params.grammar.empty() ? nullptr : params.grammar.c_str();
        sp.json_schema = params.json_schema.empty() ? nullptr : params.json_schema.c_str();
        std::vector<const char *> triggers;
        for (const std::string &s : params.grammar_triggers) triggers.push_back(s.c_str());
        sp.grammar_triggers = triggers.empty() ? nullptr : triggers.data();
        sp.n_grammar_triggers = static_cast<int32_t>(triggers.size());

        Stream stream{&on_piece, {}, nullptr};
        fastllm_generation_result c{};
        const fastllm_status st = fastllm_session_generate(session_, prompt_ids.data(), prompt_ids.size(), &sp,
                                                           &Session::on_text, &stream, &c);
        // The callback's own exception comes first: it is why the generation ended.
        if (stream.error) std::rethrow_exception(stream.error);
        detail::check(st);
        GenerationResult r;
        r.text = std::move(stream.text);
        r.n_prompt_tokens = c.n_prompt_tokens;
        r.n_generated_tokens = c.n_generated_tokens;
        r.stop_reason = c.stop_reason;
        r.prompt_ms = c.prompt_ms;
        r.generate_ms = c.generate_ms;
        return r;
    }

private:
    Session fork_with(int n_tokens, const fastllm_session_params *p) const {
        Session child;
        child.model_ = model_;
        detail::check(fastllm_session_fork(session_, n_tokens < 0 ? this->n_tokens() : n_tokens, p, &child.session_));
        return child;
    }

    struct Stream {
        const PieceCallback *on_piece;
        std::string text;
        std::exception_ptr error;  // what the callback threw, rethrown once the C call is over
    };

    // The C library calls this; an exception must not unwind through its frames, so it is caught
    // here, the generation is stopped, and generate() rethrows it.
    static int on_text(const char *text, size_t len, void *user) noexcept {
        Stream &s = *static_cast<Stream *>(user);
        try {
            s.text.append(text, len);
            if (*s.on_piece && !(*s.on_piece)(std::string_view(text, len))) return 1;
            return 0;
        } catch (...) {
            s.error = std::current_exception();
            return 1;
        }
    }

    fastllm_session *session_ = nullptr;
    const fastllm_model *model_ = nullptr;
};

}  // namespace fastllm

#endif  // FASTLLM_HPP
