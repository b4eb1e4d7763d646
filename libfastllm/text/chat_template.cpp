#include "text/chat_template.h"

#include "api/error.h"

namespace fastllm {

namespace {

bool contains(const std::string &s, const char *what) { return s.find(what) != std::string::npos; }

// Jinja's trim / Python's str.strip() on ASCII whitespace.
std::string strip(const std::string &s) {
    const char *ws = " \t\n\r\f\v";
    size_t b = s.find_first_not_of(ws);
    if (b == std::string::npos) return "";
    return s.substr(b, s.find_last_not_of(ws) - b + 1);
}

// ChatML templates (SmolLM2, Qwen2.5) may insert a fixed system message when the conversation
// has none: the literal text between "<|im_start|>system\n" and "<|im_end|>" in the template.
std::string chatml_default_system(const std::string &tmpl) {
    const std::string open = "<|im_start|>system";
    for (size_t pos = tmpl.find(open); pos != std::string::npos; pos = tmpl.find(open, pos + 1)) {
        size_t start = pos + open.size();
        if (tmpl.compare(start, 2, "\\n") == 0) start += 2;
        else if (tmpl.compare(start, 1, "\n") == 0) start += 1;
        else continue;
        size_t end = tmpl.find("<|im_end|>", start);
        if (end == std::string::npos) continue;
        std::string text = tmpl.substr(start, end - start);
        if (text.find_first_of("'\"{}+") != std::string::npos) continue;  // not a literal
        std::string out;
        for (size_t i = 0; i < text.size(); i++) {  // a Jinja string literal may spell newlines as \n
            if (text[i] == '\\' && i + 1 < text.size() && text[i + 1] == 'n') {
                out += '\n';
                i++;
            } else {
                out += text[i];
            }
        }
        return out;
    }
    return "";
}

void require_alternating(const std::vector<ChatMessage> &msgs, size_t first) {
    for (size_t i = first; i < msgs.size(); i++)
        if ((msgs[i].role == "user") != ((i - first) % 2 == 0))
            fail(FASTLLM_ERR_INVALID_ARGUMENT, "conversation roles must alternate user/assistant/user/... (message %zu is '%s')",
                 i, msgs[i].role.c_str());
}

}  // namespace

const char *chat_family_name(ChatFamily f) {
    switch (f) {
    case ChatFamily::ChatML: return "chatml";
    case ChatFamily::Llama2: return "llama2";
    case ChatFamily::Llama3: return "llama3";
    case ChatFamily::Zephyr: return "zephyr";
    case ChatFamily::Gemma: return "gemma";
    }
    return "?";
}

ChatFamily detect_chat_family(const std::string &t) {
    if (contains(t, "<|im_start|>")) return ChatFamily::ChatML;
    if (contains(t, "<|start_header_id|>") && contains(t, "<|eot_id|>")) {
        if (contains(t, "Cutting Knowledge Date"))
            fail(FASTLLM_ERR_UNSUPPORTED, "the Llama 3.1+ chat template (tools, dated system block) is not supported");
        return ChatFamily::Llama3;
    }
    if (contains(t, "<start_of_turn>")) return ChatFamily::Gemma;
    if (contains(t, "<|user|>") && contains(t, "<|assistant|>")) return ChatFamily::Zephyr;
    if (contains(t, "[INST]") && contains(t, "<<SYS>>")) return ChatFamily::Llama2;
    fail(FASTLLM_ERR_UNSUPPORTED, "unknown chat template (supported families: chatml, llama2, llama3, zephyr, gemma): %.80s%s",
         t.c_str(), t.size() > 80 ? "..." : "");
}

std::string apply_chat_template(const std::string &tmpl, const std::vector<ChatMessage> &msgs, bool add_generation_prompt,
                                const std::string &bos, const std::string &eos) {
    std::string out;
    switch (detect_chat_family(tmpl)) {
    case ChatFamily::ChatML: {
        std::string system = chatml_default_system(tmpl);
        if (!system.empty() && (msgs.empty() || msgs[0].role != "system"))
            out += "<|im_start|>system\n" + system + "<|im_end|>\n";
        for (const auto &m : msgs) out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
        if (add_generation_prompt) out += "<|im_start|>assistant\n";
        break;
    }
    case ChatFamily::Llama2: {  // a system message is folded into the first user turn
        size_t first = (!msgs.empty() && msgs[0].role == "system") ? 1 : 0;
        require_alternating(msgs, first);
        for (size_t i = first; i < msgs.size(); i++) {
            std::string content = msgs[i].content;
            if (i == first && first == 1) content = "<<SYS>>\n" + msgs[0].content + "\n<</SYS>>\n\n" + content;
            if (msgs[i].role == "user") out += bos + "[INST] " + strip(content) + " [/INST]";
            else out += " " + strip(content) + " " + eos;
        }
        break;
    }
    case ChatFamily::Llama3: {
        for (size_t i = 0; i < msgs.size(); i++) {
            if (i == 0) out += bos;
            out += "<|start_header_id|>" + msgs[i].role + "<|end_header_id|>\n\n" + strip(msgs[i].content) + "<|eot_id|>";
        }
        if (add_generation_prompt) out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
        break;
    }
    case ChatFamily::Zephyr: {
        for (const auto &m : msgs)
            if (m.role == "user" || m.role == "system" || m.role == "assistant")
                out += "<|" + m.role + "|>\n" + m.content + eos + "\n";
        if (add_generation_prompt && !msgs.empty()) out += "<|assistant|>\n";
        break;
    }
    case ChatFamily::Gemma: {
        if (!msgs.empty() && msgs[0].role == "system")
            fail(FASTLLM_ERR_INVALID_ARGUMENT, "this chat template does not support a system role");
        require_alternating(msgs, 0);
        out += bos;
        for (const auto &m : msgs)
            out += "<start_of_turn>" + std::string(m.role == "assistant" ? "model" : m.role) + "\n" + strip(m.content) +
                   "<end_of_turn>\n";
        if (add_generation_prompt) out += "<start_of_turn>model\n";
        break;
    }
    }
    return out;
}

}  // namespace fastllm
