// The loaded model, reached only through libfastllm's public C API: tokenizer, chat template and
// metadata. A fastllm_model is immutable and thread-safe, so every HTTP thread may use it at once;
// sessions (and so generation) belong to the Scheduler.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "fastllm.h"
#include "request.h"

namespace fastllm_server {

// The LoRA adapters a session applies, as fastllm_session_set_adapters takes them: ordered as the
// server loaded them, none with scale 0 (which would change nothing), so that one set has one
// spelling and the prefix cache can compare sets.
using AdapterSet = std::vector<std::pair<const fastllm_adapter *, float>>;

// An adapter loaded with --lora NAME=PATH[:SCALE]; requests name it (docs/lora.md).
struct NamedAdapter {
    std::string name, path;
    float scale = 1.0f;  // a request's scale when it gives none
    fastllm_adapter *adapter = nullptr;
};

class Engine {
public:
    // Loads path with n_threads (0 = all cores) as the sessions' default; nullptr and a message on failure.
    static std::unique_ptr<Engine> load(const std::string &path, int n_threads, const std::string &device, int gpu_layers,
                                        std::string &error);
    ~Engine();
    Engine(const Engine &) = delete;
    Engine &operator=(const Engine &) = delete;

    // Loads an adapter for the model under name; false and a message on failure.
    bool load_adapter(const std::string &name, const std::string &path, float scale, std::string &error);
    const std::vector<NamedAdapter> &adapters() const { return adapters_; }
    const NamedAdapter *find_adapter(const std::string &name) const;
    // The adapters a request asks for: its "lora" entries, and the adapter its "model" names (at
    // its default scale, unless "lora" lists it too). Throws 400 for an unknown adapter or one
    // listed twice.
    AdapterSet adapter_set(const GenerationRequest &r) const;

    fastllm_model *model() const { return model_; }
    const fastllm_model_info &info() const { return info_; }
    bool has_chat_template() const;

    // The calls below throw ApiError: 400 for input the library rejects, 500 for anything else.
    std::vector<int32_t> tokenize(std::string_view text, int add_bos) const;
    std::string detokenize(const std::vector<int32_t> &tokens) const;
    // Throws 400 when a token id lies outside the vocabulary (param names the field).
    void check_tokens(const std::vector<int32_t> &tokens, const std::string &param) const;
    // The request's conversation (and tools) rendered with the model's own chat template, ending
    // with the assistant's turn.
    std::string apply_chat_template(const GenerationRequest &r) const;
    // The grammar a request asks for (its grammar, its response_format's schema converted, or
    // its tool_choice "required" / named: the calls' grammar in the template's format; for
    // tool_choice "auto" without another grammar, the same made lazy by the format's triggers,
    // where the format has a grammar), "" for none. Throws 400 for a schema, grammar or
    // tool_choice the library refuses, naming the field.
    Constraint constraint_of(const GenerationRequest &r) const;
    // The tool calls in a reply: {"format", "content", "tool_calls": [{"name", "arguments"}]}.
    json parse_tool_calls(const std::string &reply, const json &tools) const;
    // How many bytes of a reply so far can be streamed as text: not (yet) part of a tool call.
    size_t tool_text_safe(const std::string &text) const;

private:
    Engine() = default;
    fastllm_model *model_ = nullptr;
    fastllm_model_info info_{};
    std::vector<NamedAdapter> adapters_;
};

// An ApiError for a failed library call: 400 for bad input statuses, 500 otherwise.
ApiError library_error(fastllm_status status, const std::string &what);

}  // namespace fastllm_server
