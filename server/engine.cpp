#include "engine.h"

namespace fastllm_server {

ApiError library_error(fastllm_status status, const std::string &what) {
    ApiError e;
    std::string message = what + ": " + fastllm_last_error();
    switch (status) {
    case FASTLLM_ERR_INVALID_ARGUMENT:
    case FASTLLM_ERR_TOKEN_OUT_OF_RANGE:
    case FASTLLM_ERR_CONTEXT_FULL:
    case FASTLLM_ERR_UNSUPPORTED:
        e = bad_request(message);
        break;
    default:
        e.status = 500;
        e.type = "server_error";
        e.message = message;
    }
    e.code = fastllm_status_name(status);
    return e;
}

std::unique_ptr<Engine> Engine::load(const std::string &path, int n_threads, const std::string &device, int gpu_layers,
                                     std::string &error) {
    std::unique_ptr<Engine> e(new Engine());
    fastllm_model_params p = fastllm_model_default_params();
    p.n_threads = n_threads;
    p.device = device.empty() ? nullptr : device.c_str();
    p.n_gpu_layers = gpu_layers;
    fastllm_status s = fastllm_model_load(path.c_str(), &p, &e->model_);
    if (s != FASTLLM_OK) {
        error = fastllm_last_error();
        return nullptr;
    }
    s = fastllm_model_get_info(e->model_, &e->info_);
    if (s != FASTLLM_OK) {
        error = fastllm_last_error();
        return nullptr;
    }
    return e;
}

namespace {

// Calls f(buf, capacity, &n) with a buffer that grows until the text fits.
template <typename F>
fastllm_status text_call(std::string &out, size_t capacity, F f) {
    out.assign(capacity, '\0');
    size_t n = 0;
    fastllm_status s = f(out.data(), out.size(), &n);
    if (s == FASTLLM_ERR_BUFFER_TOO_SMALL) {
        out.assign(n + 1, '\0');
        s = f(out.data(), out.size(), &n);
    }
    out.resize(s == FASTLLM_OK ? n : 0);
    return s;
}

}  // namespace

Engine::~Engine() {
    for (auto &a : adapters_) fastllm_adapter_free(a.adapter);
    fastllm_model_free(model_);
}

bool Engine::load_adapter(const std::string &name, const std::string &path, float scale, std::string &error) {
    if (find_adapter(name)) {
        error = "two adapters are named '" + name + "'";
        return false;
    }
    NamedAdapter a{name, path, scale, nullptr};
    if (fastllm_adapter_load(model_, path.c_str(), &a.adapter) != FASTLLM_OK) {
        error = fastllm_last_error();
        return false;
    }
    adapters_.push_back(std::move(a));
    return true;
}

const NamedAdapter *Engine::find_adapter(const std::string &name) const {
    for (const auto &a : adapters_)
        if (a.name == name) return &a;
    return nullptr;
}

AdapterSet Engine::adapter_set(const GenerationRequest &r) const {
    std::vector<float> scales(adapters_.size());
    std::vector<bool> given(adapters_.size(), false);
    for (size_t i = 0; i < r.lora.size(); i++) {
        const LoraRequest &l = r.lora[i];
        const std::string item = "lora[" + std::to_string(i) + "]";
        size_t k = adapters_.size();
        if (l.id >= 0) {
            if ((uint64_t)l.id >= adapters_.size())
                throw bad_request("'" + item + ".id' is " + std::to_string(l.id) + ", but the server has " +
                                      std::to_string(adapters_.size()) + " LoRA adapters (--lora)", item, "lora_not_found");
            k = (size_t)l.id;
        } else {
            const NamedAdapter *a = find_adapter(l.name);
            if (!a) throw bad_request("the server has no LoRA adapter named '" + l.name + "'", item, "lora_not_found");
            k = (size_t)(a - adapters_.data());
        }
        if (given[k]) throw bad_request("'" + item + "' names adapter '" + adapters_[k].name + "' again", item, "invalid_value");
        given[k] = true;
        scales[k] = l.scale ? *l.scale : adapters_[k].scale;
    }
    if (const NamedAdapter *a = find_adapter(r.model)) {
        const size_t k = (size_t)(a - adapters_.data());
        if (!given[k]) given[k] = true, scales[k] = a->scale;
    }
    AdapterSet set;
    for (size_t k = 0; k < adapters_.size(); k++)
        if (given[k] && scales[k] != 0.0f) set.emplace_back(adapters_[k].adapter, scales[k]);
    return set;
}

bool Engine::has_chat_template() const { return fastllm_model_chat_template(model_) != nullptr; }

std::vector<int32_t> Engine::tokenize(std::string_view text, int add_bos) const {
    std::vector<int32_t> ids(text.size() + 8);
    size_t n = 0;
    fastllm_status s = fastllm_tokenize(model_, text.data(), text.size(), add_bos, ids.data(), ids.size(), &n);
    if (s == FASTLLM_ERR_BUFFER_TOO_SMALL) {
        ids.resize(n);
        s = fastllm_tokenize(model_, text.data(), text.size(), add_bos, ids.data(), ids.size(), &n);
    }
    if (s != FASTLLM_OK) throw library_error(s, "tokenize");
    ids.resize(n);
    return ids;
}

json Engine::parse_tool_calls(const std::string &reply, const json &tools) const {
    const std::string tools_text = tools.dump();
    std::string out;
    fastllm_status s = text_call(out, 2 * reply.size() + 1024, [&](char *b, size_t c, size_t *n) {
        return fastllm_chat_parse_tool_calls(model_, nullptr, reply.c_str(), tools_text.c_str(), b, c, n);
    });
    if (s != FASTLLM_OK) throw library_error(s, "tool calls");
    return parse_json(out);
}

size_t Engine::tool_text_safe(const std::string &text) const {
    size_t n = 0;
    fastllm_status s = fastllm_chat_tool_text_safe(model_, nullptr, text.c_str(), 0, &n);
    if (s != FASTLLM_OK) throw library_error(s, "tool calls");
    return n;
}

Constraint Engine::constraint_of(const GenerationRequest &r) const {
    // auto: the calls' grammar made lazy (free text until a call begins), unless the request has
    // its own grammar; required / named: the calls' grammar from the first token.
    const bool lazy = r.tool_choice == "auto", own = !r.grammar.empty() || !r.json_schema.empty();
    if (!r.tools.empty() && r.tool_choice != "none" && !(lazy && own)) {
        if (own)
            throw bad_request("tool_choice '" + r.tool_choice + "' constrains the reply; it cannot be combined with a "
                              "grammar or a JSON response_format", "tool_choice", "invalid_value");
        if (!has_chat_template()) {
            if (lazy) return {};
            throw bad_request("this model has no chat template, so it has no tool-call format", "tool_choice",
                              "no_chat_template");
        }
        Constraint c;
        std::string triggers;
        const std::string tools_text = r.tools.dump();
        fastllm_status s = !lazy ? FASTLLM_OK : text_call(triggers, 256, [&](char *b, size_t cap, size_t *n) {
            return fastllm_chat_tool_triggers(model_, nullptr, b, cap, n);
        });
        if (s == FASTLLM_OK)
            s = text_call(c.grammar, 8 * tools_text.size() + 4096, [&](char *b, size_t cap, size_t *n) {
                return fastllm_chat_tool_grammar(model_, nullptr, tools_text.c_str(),
                                                 lazy || r.tool_choice == "required" ? nullptr : r.tool_choice.c_str(),
                                                 r.parallel_tool_calls ? 1 : 0, b, cap, n);
            });
        if (s == FASTLLM_ERR_UNSUPPORTED || s == FASTLLM_ERR_INVALID_ARGUMENT) {
            if (lazy) return {};  // a format, or a tool schema, without a grammar: free text, as before grammars
            throw bad_request(std::string("tool_choice: ") + fastllm_last_error(), "tool_choice",
                              s == FASTLLM_ERR_UNSUPPORTED ? "unsupported_tool_choice" : "invalid_value");
        }
        if (s != FASTLLM_OK) throw library_error(s, "tool_choice");
        if (lazy) c.triggers = parse_json(triggers).get<std::vector<std::string>>();
        return c;
    }
    std::string grammar = r.grammar;
    if (!r.json_schema.empty()) {
        fastllm_status s = text_call(grammar, 4096 + 4 * r.json_schema.size(), [&](char *b, size_t c, size_t *n) {
            return fastllm_json_schema_to_grammar(r.json_schema.c_str(), b, c, n);
        });
        if (s == FASTLLM_ERR_UNSUPPORTED || s == FASTLLM_ERR_INVALID_ARGUMENT)
            throw bad_request(std::string("response_format: ") + fastllm_last_error(), "response_format",
                              s == FASTLLM_ERR_UNSUPPORTED ? "unsupported_json_schema" : "invalid_json_schema");
        if (s != FASTLLM_OK) throw library_error(s, "response_format");
    } else if (!grammar.empty()) {
        if (fastllm_grammar_check(grammar.c_str()) != FASTLLM_OK)
            throw bad_request(fastllm_last_error(), "grammar", "invalid_grammar");
    }
    return {grammar, {}};
}

void Engine::check_tokens(const std::vector<int32_t> &tokens, const std::string &param) const {
    for (size_t i = 0; i < tokens.size(); i++)
        if (tokens[i] < 0 || tokens[i] >= info_.vocab_size)
            throw bad_request("token id " + std::to_string(tokens[i]) + " at " + param + "[" + std::to_string(i) +
                                  "] is outside the vocabulary [0, " + std::to_string(info_.vocab_size) + ")",
                              param, "token_out_of_range");
}

std::string Engine::detokenize(const std::vector<int32_t> &tokens) const {
    std::string out;
    fastllm_status s = text_call(out, tokens.size() * 8 + 16, [&](char *b, size_t c, size_t *n) {
        return fastllm_detokenize(model_, tokens.data(), tokens.size(), b, c, n);
    });
    if (s != FASTLLM_OK) throw library_error(s, "detokenize");
    return out;
}

std::string Engine::apply_chat_template(const GenerationRequest &r) const {
    if (!has_chat_template())
        throw bad_request("this model has no chat template, so /v1/chat/completions cannot format a conversation "
                          "for it; use /v1/completions with a plain prompt",
                          "messages", "no_chat_template");
    json vars = {{"messages", r.messages}, {"add_generation_prompt", true}};
    if (!r.tools.empty()) vars["tools"] = r.tools;
    const std::string text = vars.dump();
    std::string out;
    fastllm_status s = text_call(out, 2 * text.size() + 4096, [&](char *b, size_t c, size_t *n) {
        return fastllm_chat_apply_template_json(model_, nullptr, text.c_str(), b, c, n);
    });
    if (s != FASTLLM_OK) {
        ApiError e = library_error(s, "chat template");
        e.param = "messages";
        throw e;
    }
    return out;
}

}  // namespace fastllm_server
