#include "responses.h"

#include <cmath>
#include <ctime>
#include <random>

namespace fastllm_server {

const char *const kSseDone = "data: [DONE]\n\n";

namespace {

std::string random_hex(size_t n) {
    thread_local std::mt19937_64 rng(std::random_device{}());
    static const char *digits = "0123456789abcdef";
    std::string s;
    for (size_t i = 0; i < n; i++) s += digits[rng() & 15];
    return s;
}

json null_or(const std::string &s) { return s.empty() ? json(nullptr) : json(s); }

json choice_base() { return json{{"index", 0}, {"logprobs", nullptr}}; }

}  // namespace

ResponseMeta make_meta(Endpoint endpoint, const std::string &model) {
    ResponseMeta m;
    m.endpoint = endpoint;
    m.id = (endpoint == Endpoint::ChatCompletions ? "chatcmpl-" : "cmpl-") + random_hex(24);
    m.created = (int64_t)std::time(nullptr);
    m.model = model;
    return m;
}

// OpenAI's usage, with prompt_tokens_details.cached_tokens: the prompt's prefix the server found
// in a session and did not evaluate again.
json usage_json(const JobResult &r) {
    return json{{"prompt_tokens", r.n_prompt_tokens},
                {"completion_tokens", r.n_generated_tokens},
                {"total_tokens", r.n_prompt_tokens + r.n_generated_tokens},
                {"prompt_tokens_details", {{"cached_tokens", r.n_cached_tokens}}}};
}

json timings_json(const JobTimings &t) {
    auto ms = [](double v) { return v < 0 ? json(nullptr) : json(std::round(v * 1000.0) / 1000.0); };
    return json{{"queued_ms", ms(t.queued_ms)},
                {"prompt_ms", ms(t.prompt_ms)},
                {"first_token_ms", ms(t.first_token_ms)},
                {"total_ms", ms(t.total_ms)}};
}

json tool_calls_json(const json &calls, bool indexed) {
    json out = json::array();
    for (size_t i = 0; i < calls.size(); i++) {
        json c = json::object();
        if (indexed) c["index"] = i;
        c["id"] = "call_" + random_hex(24);
        c["type"] = "function";
        c["function"] = {{"name", calls[i]["name"]}, {"arguments", calls[i]["arguments"]}};
        out.push_back(std::move(c));
    }
    return out;
}

json tool_calls_chunk(const ResponseMeta &meta, const json &tool_calls) {
    json chunk = stream_chunk(meta, "", false, {});
    chunk["choices"][0]["delta"] = json{{"tool_calls", tool_calls}};
    return chunk;
}

json completion_body(const ResponseMeta &meta, const std::string &text, const JobResult &result,
                     const json &tool_calls) {
    json choice = choice_base();
    choice["finish_reason"] = tool_calls.empty() ? finish_reason_name(result.reason) : "tool_calls";
    const bool chat = meta.endpoint == Endpoint::ChatCompletions;
    if (chat && !tool_calls.empty())
        choice["message"] = json{{"role", "assistant"}, {"content", null_or(text)}, {"tool_calls", tool_calls}};
    else if (chat)
        choice["message"] = json{{"role", "assistant"}, {"content", text}};
    else
        choice["text"] = text;
    return json{{"id", meta.id},
                {"object", chat ? "chat.completion" : "text_completion"},
                {"created", meta.created},
                {"model", meta.model},
                {"system_fingerprint", nullptr},
                {"choices", json::array({choice})},
                {"usage", usage_json(result)},
                {"timings", timings_json(result.timings)}};
}

json stream_chunk(const ResponseMeta &meta, const std::string &text, bool role,
                  const std::optional<std::string> &finish, const JobTimings *timings) {
    json choice = choice_base();
    choice["finish_reason"] = finish ? json(*finish) : json(nullptr);
    const bool chat = meta.endpoint == Endpoint::ChatCompletions;
    if (chat) {
        json delta = json::object();
        if (role) delta["role"] = "assistant";
        if (!text.empty() || role) delta["content"] = text;
        choice["delta"] = delta;
    } else {
        choice["text"] = text;
    }
    json chunk{{"id", meta.id},
               {"object", chat ? "chat.completion.chunk" : "text_completion"},
               {"created", meta.created},
               {"model", meta.model},
               {"system_fingerprint", nullptr},
               {"choices", json::array({choice})}};
    if (timings) chunk["timings"] = timings_json(*timings);
    return chunk;
}

json usage_chunk(const ResponseMeta &meta, const JobResult &result) {
    const bool chat = meta.endpoint == Endpoint::ChatCompletions;
    return json{{"id", meta.id},
                {"object", chat ? "chat.completion.chunk" : "text_completion"},
                {"created", meta.created},
                {"model", meta.model},
                {"system_fingerprint", nullptr},
                {"choices", json::array()},
                {"usage", usage_json(result)}};
}

json error_json(const ApiError &e) {
    return json{{"error",
                 {{"message", e.message}, {"type", e.type}, {"param", null_or(e.param)}, {"code", null_or(e.code)}}}};
}

std::string dump(const json &j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

std::string sse_event(const json &j) { return "data: " + dump(j) + "\n\n"; }

}  // namespace fastllm_server
