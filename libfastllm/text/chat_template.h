// chat_template.h — renders a conversation into the prompt text a chat model was trained on: the
// model's own chat template (or one the caller gives), a Jinja program run by text/jinja.h with
// the variables transformers' apply_chat_template passes it.
#pragma once

#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "text/jinja.h"

namespace fastllm {

// variables: a JSON object, the template's variables: "messages" (a non-empty array, OpenAI's
// shape: role, content as a string or a list of parts, tool_calls, reasoning_content, ...),
// "tools", "add_generation_prompt", "enable_thinking" and whatever else the caller names.
// bos_token / eos_token are set to bos / eos unless variables has them. Throws
// FASTLLM_ERR_INVALID_ARGUMENT for an empty conversation (as transformers does), for a template
// error (with its line and column) and for a conversation the template rejects
// (raise_exception's message).
std::string apply_chat_template(const jinja::Template &tmpl, nlohmann::ordered_json variables, const std::string &bos,
                                const std::string &eos);

}  // namespace fastllm
