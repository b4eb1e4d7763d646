// The chat-template renderer on any template and conversation: the input is NUL-separated
// fields — template text (empty: the model's own), then role / content pairs; the first byte's
// bits choose add_generation_prompt, enable_thinking, whether messages carry reasoning_content and
// (16) whether the tool-call parser, run on the last message's content, is given a tool list.
#include <cstdint>
#include <string>
#include <vector>

#include "fuzz_common.h"

static fastllm_model *g_model;

extern "C" int LLVMFuzzerInitialize(int *, char ***) {
    g_model = fuzz_model("FASTLLM_FUZZ_SPM");
    return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    const uint8_t flags = data[0];
    std::vector<std::string> fields(1);
    for (size_t i = 1; i < size; i++) {
        if (data[i] == 0) fields.emplace_back();
        else fields.back() += (char)data[i];
    }
    std::vector<fastllm_chat_message> messages;
    std::vector<const char *> reasoning;
    for (size_t i = 1; i + 1 < fields.size() && messages.size() < 64; i += 2) {
        messages.push_back({fields[i].c_str(), fields[i + 1].c_str()});
        reasoning.push_back((flags & 8) && (i & 2) ? fields[i + 1].c_str() : nullptr);
    }
    fastllm_chat_params p = fastllm_chat_default_params();
    p.add_generation_prompt = flags & 1;
    p.enable_thinking = (int)((flags >> 1) & 3) - 1;  // -1, 0, 1 and the invalid 2
    p.reasoning_content = (flags & 8) ? reasoning.data() : nullptr;
    const char *tmpl = fields[0].empty() ? nullptr : fields[0].c_str();
    std::string out(256, '\0');
    size_t len = 0;
    fastllm_status st = fastllm_chat_apply_template_v2(g_model, tmpl, messages.data(), messages.size(), &p, out.data(),
                                                       out.size(), &len);
    if (st == FASTLLM_ERR_BUFFER_TOO_SMALL) {
        out.resize(len + 1);
        st = fastllm_chat_apply_template_v2(g_model, tmpl, messages.data(), messages.size(), &p, out.data(),
                                            out.size(), &len);
        if (st != FASTLLM_OK || out[len] != '\0') __builtin_trap();  // the size it asked for must do
    }
    // The tool-call parser of the template's format on text: the last message's content as a reply.
    if (!messages.empty()) {
        std::string parsed(256, '\0');
        size_t n = 0;
        const char *reply = messages.back().content;
        const char *tools = (flags & 16) ? "[{\"type\": \"function\", \"function\": {\"name\": \"f\"}}]" : nullptr;
        st = fastllm_chat_parse_tool_calls(g_model, tmpl ? tmpl : "", reply, tools, parsed.data(), parsed.size(), &n);
        if (st == FASTLLM_ERR_BUFFER_TOO_SMALL) {
            parsed.resize(n + 1);
            st = fastllm_chat_parse_tool_calls(g_model, tmpl ? tmpl : "", reply, tools, parsed.data(), parsed.size(), &n);
        }
        if (st != FASTLLM_OK) __builtin_trap();  // a reply is text or calls, never an error
    }
    return 0;
}
