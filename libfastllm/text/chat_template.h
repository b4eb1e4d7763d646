// chat_template.h — renders a conversation into the prompt text a chat model was trained on.
//
// Chat templates are Jinja programs; instead of embedding a Jinja interpreter we recognise the
// common template families from the template's text and render each family natively, exactly as
// transformers' apply_chat_template does for that family. An unrecognised template is an error
// (FASTLLM_ERR_UNSUPPORTED), never a silently wrong prompt; so is a recognised template asked to
// render something we do not render (a tool message, say), never a different prompt.
#pragma once

#include <string>
#include <vector>

namespace fastllm {

struct ChatMessage {
    std::string role, content;
    bool has_reasoning = false;     // the message has a `reasoning_content` field (Qwen3 reads it)
    std::string reasoning_content;  // its value when has_reasoning
};

struct ChatOptions {
    bool add_generation_prompt = true;
    // The template variable `enable_thinking`: -1 undefined (apply_chat_template without the
    // keyword), 0 false, 1 true. Only Qwen3's template reads it; the others ignore it, as they do
    // in transformers.
    int enable_thinking = -1;
};

// Name of the family the template is recognised as ("chatml", "qwen2.5", "qwen3", "llama2",
// "llama3", "zephyr", "gemma", "gemma3", "mistral", "phi3", "chatglm3", "glm4"). Throws FASTLLM_ERR_UNSUPPORTED when it matches
// none, or matches a family in a variant that is not rendered.
const char *detect_chat_family(const std::string &tmpl);

// bos / eos: the text of the model's BOS and EOS tokens (templates write them as text).
// Throws FASTLLM_ERR_INVALID_ARGUMENT for conversations transformers or the template itself
// rejects (an empty one, roles that do not alternate, a system message for Gemma, ...), and
// FASTLLM_ERR_UNSUPPORTED for messages the template would render in a way we do not (tool
// messages of Qwen and Mistral templates).
std::string apply_chat_template(const std::string &tmpl, const std::vector<ChatMessage> &messages,
                                const ChatOptions &options, const std::string &bos, const std::string &eos);

}  // namespace fastllm
