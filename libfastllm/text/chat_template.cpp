#include "text/chat_template.h"

#include "base/error.h"

namespace fastllm {

std::string apply_chat_template(const jinja::Template &tmpl, nlohmann::ordered_json variables, const std::string &bos,
                                const std::string &eos) {
    if (!variables.is_object()) fail(FASTLLM_ERR_INVALID_ARGUMENT, "the chat variables must be a JSON object");
    auto m = variables.find("messages");
    if (m == variables.end() || !m->is_array())
        fail(FASTLLM_ERR_INVALID_ARGUMENT, "the chat variables need \"messages\", an array of messages");
    // transformers: "Cannot apply chat template to an empty conversation"
    if (m->empty()) fail(FASTLLM_ERR_INVALID_ARGUMENT, "an empty conversation: give at least one message");
    for (size_t i = 0; i < m->size(); i++)
        if (!(*m)[i].is_object() || !(*m)[i].contains("role"))
            fail(FASTLLM_ERR_INVALID_ARGUMENT, "message %zu is not an object with a \"role\"", i);
    if (!variables.contains("bos_token")) variables["bos_token"] = bos;
    if (!variables.contains("eos_token")) variables["eos_token"] = eos;
    return tmpl.render(variables);
}

}  // namespace fastllm
