// Request parsing: JSON bodies of the OpenAI-style endpoints, validated into typed requests.
// Every problem becomes an ApiError (HTTP 4xx) naming the offending field; nothing here touches
// the model, so the checks that need it (token ids, prompt length) live in the routes.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace fastllm_server {

using json = nlohmann::ordered_json;

// An error answered in OpenAI's shape: {"error": {"message", "type", "param", "code"}}.
// Thrown by the parsers and the routes, caught by the route wrapper.
struct ApiError {
    int status = 400;
    std::string message;
    std::string type = "invalid_request_error";
    std::string param;  // "" -> null
    std::string code;   // "" -> null
};

ApiError bad_request(std::string message, std::string param = "", std::string code = "");

enum class Endpoint { Completions, ChatCompletions };

// A request's constrained output: GBNF ("" for none) and its triggers (fastllm_sampling_params).
struct Constraint {
    std::string grammar;
    std::vector<std::string> triggers;
};

// One entry of a request's "lora": an adapter by name (id < 0) or by id, and its scale if given.
struct LoraRequest {
    std::string name;
    int64_t id = -1;
    std::optional<float> scale;
};

// A /v1/completions or /v1/chat/completions request, fields checked for type and range.
struct GenerationRequest {
    Endpoint endpoint = Endpoint::Completions;
    std::string model;  // "" when the request names none

    // /v1/completions: a text prompt, or token ids.
    std::string prompt;
    std::vector<int32_t> prompt_tokens;
    bool prompt_is_tokens = false;

    // /v1/chat/completions: the messages as the chat template reads them: role "system" ("developer"
    // is taken as it), "user", "assistant" (content may be absent beside tool_calls, whose
    // arguments are given to the template as objects) or "tool"; content as text (text parts joined).
    json messages;
    json tools = json::array();         // OpenAI's tools: [{"type": "function", "function": {...}}]
    std::string tool_choice = "auto";   // "auto", "none", "required", or the function's name
    bool parallel_tool_calls = true;

    std::optional<int64_t> max_tokens;  // >= 1 when given
    float temperature = 1.0f;           // OpenAI's defaults: plain sampling from the whole distribution
    float top_p = 1.0f;
    int32_t top_k = 0;                  // extension (0 = off)
    float min_p = 0.0f;                 // extension (0 = off)
    float repetition_penalty = 1.0f;    // extension (1 = off)
    std::optional<uint64_t> seed;
    std::vector<std::string> stop;
    bool ignore_eos = false;            // extension
    bool stream = false;
    bool include_usage = false;         // stream_options.include_usage
    // Extensions: speculative decoding for this request, "off", "lookup" (prompt lookup) or "draft"
    // (the server's --draft-model); "" = the server's --speculative. n_draft: 1 to 16.
    std::string speculative;
    std::optional<int32_t> n_draft;
    // Extension (llama.cpp's server, docs/lora.md): LoRA adapters the server loaded with --lora,
    // each by its "name" or by "id" (its place among the --lora flags, from 0), with a "scale"
    // (default: the one given with --lora). The routes resolve them against the loaded adapters.
    std::vector<LoraRequest> lora;

    // Constrained output: response_format {"type": "json_object"} (any JSON object; llama.cpp's
    // server also reads a "schema" beside the type), {"type": "json_schema", "json_schema":
    // {"name", "schema", "strict"}}, or llama.cpp's "grammar" field (GBNF). The routes turn the
    // schema into a grammar and check it (the library is not linked here).
    std::string grammar;      // GBNF as given
    std::string json_schema;  // the schema's JSON text; "" for none
};

// Parses a request body into a JSON object (400 for malformed JSON or a non-object).
json parse_body(const std::string &body);
// JSON text the library wrote (its tool calls, a grammar's triggers); throws json::exception. The
// server's one parser is here: each file calling nlohmann's parse compiled its own (6 s of an ASan
// build's compile each).
json parse_json(const std::string &text);

GenerationRequest parse_completion_request(const json &body);
GenerationRequest parse_chat_request(const json &body);

// POST /tokenize {"content": "...", "add_special": false}
struct TokenizeRequest {
    std::string content;
    bool add_special = false;
};
TokenizeRequest parse_tokenize_request(const json &body);

// POST /detokenize {"tokens": [...]}
std::vector<int32_t> parse_detokenize_request(const json &body);

}  // namespace fastllm_server
