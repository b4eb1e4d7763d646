// The OpenAI response shapes: completion and chat completion objects, their streaming chunks,
// usage, errors, and Server-Sent Events framing.
#pragma once

#include <optional>
#include <string>

#include "request.h"
#include "scheduler.h"

namespace fastllm_server {

// What every response and chunk of one request repeats.
struct ResponseMeta {
    Endpoint endpoint = Endpoint::Completions;
    std::string id;  // "cmpl-..." or "chatcmpl-..."
    int64_t created = 0;
    std::string model;
};

ResponseMeta make_meta(Endpoint endpoint, const std::string &model);

json usage_json(const JobResult &result);
// Extension field "timings" (as llama.cpp's server has): queued_ms, prompt_ms, first_token_ms, total_ms.
json timings_json(const JobTimings &t);

// A finished non-streaming request: text_completion or chat.completion. tool_calls: the calls the
// reply made (OpenAI's shape, tool_calls_json), which become the message's with finish_reason
// "tool_calls" and text the content beside them (null when empty).
json completion_body(const ResponseMeta &meta, const std::string &text, const JobResult &result,
                     const json &tool_calls = json::array());
// OpenAI's tool_calls from the library's parsed calls [{"name", "arguments"}]: ids "call_...",
// and with indexed = true the "index" a streamed delta carries.
json tool_calls_json(const json &calls, bool indexed);
// A streamed chunk whose delta carries tool calls (and no finish_reason).
json tool_calls_chunk(const ResponseMeta &meta, const json &tool_calls);

// One streaming chunk. text: new text (for chat: the delta's content); role: the chat delta's role
// (first chunk only); finish: the finish_reason of the last chunk (which then carries "timings").
json stream_chunk(const ResponseMeta &meta, const std::string &text, bool role,
                  const std::optional<std::string> &finish, const JobTimings *timings = nullptr);
// The extra last chunk of stream_options.include_usage: no choices, the usage.
json usage_chunk(const ResponseMeta &meta, const JobResult &result);

json error_json(const ApiError &e);

// JSON text (invalid UTF-8 replaced, never thrown on).
std::string dump(const json &j);
// "data: <json>\n\n"
std::string sse_event(const json &j);
extern const char *const kSseDone;  // "data: [DONE]\n\n"

}  // namespace fastllm_server
