// tool_calls.h — the tool calls in a chat model's reply, in the format its chat template taught it.
//
// Each format is a table entry (tool_calls.cpp): how the template reveals it, how a reply's calls
// are found, and the grammar that makes a reply one call (or several) whose arguments match the
// tools' JSON schemas (tool_choice "required" or a named function). A reply whose calls do not
// parse is text: never an error.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace fastllm {

struct ToolCall {
    std::string name;
    std::string arguments;  // compact JSON text of an object, as OpenAI's function.arguments
};

struct ToolReply {
    std::string content;           // the text outside the calls (the whole reply when there are none)
    std::vector<ToolCall> calls;
};

struct ToolFormat;

// The format a chat template's text implies: "hermes" (<tool_call>{...}</tool_call>: Qwen2.5 / 3,
// Hermes, SmolLM3, ...), "glm4.5" (<tool_call>name<arg_key>...), "mistral" ([TOOL_CALLS]),
// "llama3" ({"name": ..., "parameters": ...}, <|python_tag|>), "functools" (Phi-4-mini,
// FireFunction: functools[...]), "glm4" (name\n{...}), else "generic" (a JSON object).
const ToolFormat &tool_format_of(const std::string &chat_template);
const ToolFormat *tool_format_named(const std::string &name);  // nullptr for an unknown name
const char *tool_format_name(const ToolFormat &f);

// How much of a reply generated so far (text) can be sent on as plain text: the bytes before where
// a call may begin in format f (text.size() when done).
size_t tool_text_safe(const ToolFormat &f, const std::string &text, bool done);

// The calls in reply. tools: OpenAI's tool list; a call must name one of them.
ToolReply parse_tool_calls(const ToolFormat &f, const std::string &reply, const nlohmann::ordered_json &tools);

// A GBNF grammar (grammar.h) whose matches are replies of one call (parallel: one or more) to a
// tool of tools, or to the tool named `only` when it is not empty, with arguments matching its
// parameters schema. Throws FASTLLM_ERR_INVALID_ARGUMENT for an unknown tool name or bad tools,
// FASTLLM_ERR_UNSUPPORTED for a format or schema without a grammar here.
std::string tool_call_grammar(const ToolFormat &f, const nlohmann::ordered_json &tools, const std::string &only,
                              bool parallel);

// For tool_choice "auto": the triggers (grammar.h) that make tool_call_grammar's grammar lazy, so
// a reply is free text until a call begins and the call is then constrained. Throws
// FASTLLM_ERR_UNSUPPORTED where the format has no grammar.
std::vector<std::string> tool_call_triggers(const ToolFormat &f);

}  // namespace fastllm
