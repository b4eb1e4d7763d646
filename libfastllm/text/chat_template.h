// chat_template.h — renders a conversation into the prompt text a chat model was trained on.
//
// Chat templates are Jinja programs; instead of embedding a Jinja interpreter we recognise the
// common template families from the template's text and render each family natively, exactly as
// transformers' apply_chat_template does for that family. An unrecognised template is an error
// (FASTLLM_ERR_UNSUPPORTED), never a silently wrong prompt.
#pragma once

#include <string>
#include <vector>

namespace fastllm {

struct ChatMessage {
    std::string role, content;
};

enum class ChatFamily { ChatML, Llama2, Llama3, Zephyr, Gemma };

const char *chat_family_name(ChatFamily family);

// Throws FASTLLM_ERR_UNSUPPORTED when the template matches no known family.
ChatFamily detect_chat_family(const std::string &tmpl);

// bos / eos: the text of the model's BOS and EOS tokens (templates write them as text).
// Throws FASTLLM_ERR_INVALID_ARGUMENT for conversations the template itself rejects
// (e.g. roles that do not alternate, a system message for Gemma).
std::string apply_chat_template(const std::string &tmpl, const std::vector<ChatMessage> &messages,
                                bool add_generation_prompt, const std::string &bos, const std::string &eos);

}  // namespace fastllm
