#include "text/chat_template.h"

#include "base/error.h"
#include "text/unicode.h"

namespace fastllm {

namespace {

bool contains(const std::string &s, const char *what) { return s.find(what) != std::string::npos; }

bool contains_all(const std::string &s, std::initializer_list<const char *> what) {
    for (const char *w : what)
        if (!contains(s, w)) return false;
    return true;
}

// Python's str.isspace(): what Jinja's `trim` and the templates' `.strip()` remove (Unicode
// White_Space plus the separators U+001C..U+001F).
bool py_isspace(uint32_t c) {
    return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

// Python's str.strip() without arguments.
std::string py_strip(const std::string &s) {
    size_t begin = s.size(), end = 0;
    for (size_t i = 0; i < s.size();) {
        size_t at = i;
        if (!py_isspace(unicode::decode_utf8(s, i))) {
            if (begin == s.size()) begin = at;
            end = i;
        }
    }
    return begin < end ? s.substr(begin, end - begin) : "";
}

// str.lstrip('\n'), str.rstrip('\n'), str.strip('\n').
std::string lstrip_nl(const std::string &s) {
    size_t b = s.find_first_not_of('\n');
    return b == std::string::npos ? "" : s.substr(b);
}
std::string rstrip_nl(const std::string &s) {
    size_t e = s.find_last_not_of('\n');
    return e == std::string::npos ? "" : s.substr(0, e + 1);
}
std::string strip_nl(const std::string &s) { return lstrip_nl(rstrip_nl(s)); }

// The template spelled as the markers below are: double quotes made single and line breaks
// written as Jinja's escape \n, so that a marker matches either spelling of a string literal
// (no marker spans a line of the template).
std::string normalized(const std::string &t) {
    std::string out;
    out.reserve(t.size());
    for (char c : t) {
        if (c == '"') out += '\'';
        else if (c == '\n') out += "\\n";
        else out += c;
    }
    return out;
}

struct Chat {
    const std::string &tmpl;  // as given
    const std::string &norm;  // normalized(tmpl)
    const std::vector<ChatMessage> &msgs;
    const ChatOptions &opt;
    const std::string &bos, &eos;
};

// ---------------------------------------------------------------------------------------------
// ChatML (SmolLM2, Qwen2) and its Qwen2.5 / Qwen3 extensions

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

std::string chatml_turn(const std::string &role, const std::string &content) {
    return "<|im_start|>" + role + "\n" + content + "<|im_end|>\n";
}

void refuse_tool_messages(const Chat &c) {
    for (size_t i = 0; i < c.msgs.size(); i++)
        if (c.msgs[i].role == "tool")
            fail(FASTLLM_ERR_UNSUPPORTED, "message %zu: tool messages are not supported with this chat template", i);
}

bool is_chatml(const std::string &t) {
    if (!contains(t, "<|im_start|>")) return false;
    // Templates that do more than concatenate turns (tools, thinking, a turn left open, BOS/EOS,
    // Phi-4's <|im_sep|>) are not plain ChatML; Qwen2.5's and Qwen3's are recognised before.
    for (const char *feature : {"tools", "think", "loop.last", "bos_token", "eos_token", "<|im_sep|>"})
        if (contains(t, feature))
            fail(FASTLLM_ERR_UNSUPPORTED, "a ChatML chat template that uses '%s' is not supported (only Qwen2.5's and "
                 "Qwen3's are)", feature);
    return true;
}

std::string render_chatml(const Chat &c) {
    std::string out, system = chatml_default_system(c.tmpl);
    if (!system.empty() && c.msgs[0].role != "system") out += chatml_turn("system", system);
    for (const auto &m : c.msgs) out += chatml_turn(m.role, m.content);
    if (c.opt.add_generation_prompt) out += "<|im_start|>assistant\n";
    return out;
}

// Qwen2.5: ChatML with a default system message and a tools branch (taken only when tools are
// passed, which they never are here); tool messages and assistant tool calls have their own
// shapes, so tool messages are refused; other roles render nothing.
bool is_qwen25(const std::string &t) {
    return contains(t, "<|im_start|>") &&
           contains_all(t, {"(message.role == 'user') or (message.role == 'system' and not loop.first) or "
                            "(message.role == 'assistant' and not message.tool_calls)",
                            "{%- if tools %}", "<tool_response>"}) &&
           !chatml_default_system(t).empty();
}

std::string render_qwen25(const Chat &c) {
    refuse_tool_messages(c);
    std::string out, system = chatml_default_system(c.tmpl);
    if (c.msgs[0].role != "system") out += chatml_turn("system", system);
    for (const auto &m : c.msgs)
        if (m.role == "user" || m.role == "system" || m.role == "assistant") out += chatml_turn(m.role, m.content);
    if (c.opt.add_generation_prompt) out += "<|im_start|>assistant\n";
    return out;
}

// Qwen3: ChatML whose assistant turns after the last user query carry their reasoning in a
// <think> block (from `reasoning_content`, else cut out of the content), earlier ones only their
// answer; enable_thinking=false opens the generation with an empty <think> block.
bool is_qwen3(const std::string &t) {
    return contains(t, "<|im_start|>") &&
           contains_all(t, {"last_query_index", "message.content.startswith('<tool_response>')",
                            R"(message.content.split('</think>')[-1].lstrip('\n'))",
                            R"(message.content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n'))",
                            "loop.last or (not loop.last and reasoning_content)",
                            R"('\n<think>\n' + reasoning_content.strip('\n') + '\n</think>\n\n' + content.lstrip('\n'))",
                            "enable_thinking is defined and enable_thinking is false",
                            R"('<think>\n\n</think>\n\n')"});
}

bool starts_with(const std::string &s, const std::string &p) { return s.compare(0, p.size(), p) == 0; }
bool ends_with(const std::string &s, const std::string &p) {
    return s.size() >= p.size() && s.compare(s.size() - p.size(), p.size(), p) == 0;
}

std::string render_qwen3(const Chat &c) {
    refuse_tool_messages(c);
    const auto &msgs = c.msgs;
    std::string out;
    if (msgs[0].role == "system") out += chatml_turn("system", msgs[0].content);
    // The last user message that is not a wrapped tool response (the last message if none).
    size_t last_query = msgs.size() - 1;
    for (size_t i = msgs.size(); i-- > 0;)
        if (msgs[i].role == "user" &&
            !(starts_with(msgs[i].content, "<tool_response>") && ends_with(msgs[i].content, "</tool_response>"))) {
            last_query = i;
            break;
        }
    for (size_t i = 0; i < msgs.size(); i++) {
        const ChatMessage &m = msgs[i];
        if (m.role == "user" || (m.role == "system" && i > 0)) {
            out += chatml_turn(m.role, m.content);
        } else if (m.role == "assistant") {
            std::string content = m.content, reasoning;
            if (m.has_reasoning) {
                reasoning = m.reasoning_content;
            } else if (size_t end = m.content.find("</think>"); end != std::string::npos) {
                content = lstrip_nl(m.content.substr(m.content.rfind("</think>") + 8));
                std::string before = rstrip_nl(m.content.substr(0, end));
                size_t open = before.rfind("<think>");
                reasoning = lstrip_nl(open == std::string::npos ? before : before.substr(open + 7));
            }
            out += "<|im_start|>assistant\n";
            if (i > last_query && (i + 1 == msgs.size() || !reasoning.empty()))
                out += "<think>\n" + strip_nl(reasoning) + "\n</think>\n\n" + lstrip_nl(content);
            else
                out += content;
            out += "<|im_end|>\n";
        }
    }
    if (c.opt.add_generation_prompt) {
        out += "<|im_start|>assistant\n";
        if (c.opt.enable_thinking == 0) out += "<think>\n\n</think>\n\n";
    }
    return out;
}

// ---------------------------------------------------------------------------------------------
// Llama 2, Llama 3, Zephyr, Gemma

void require_alternating(const std::vector<ChatMessage> &msgs, size_t first, const char *message) {
    for (size_t i = first; i < msgs.size(); i++)
        if ((msgs[i].role == "user") != ((i - first) % 2 == 0))
            fail(FASTLLM_ERR_INVALID_ARGUMENT, "%s (message %zu is '%s')", message, i, msgs[i].role.c_str());
}
const char *kAlternate = "conversation roles must alternate user/assistant/user/assistant/...";

bool is_llama3(const std::string &t) {
    if (!contains(t, "<|start_header_id|>") || !contains(t, "<|eot_id|>")) return false;
    if (contains(t, "Cutting Knowledge Date"))
        fail(FASTLLM_ERR_UNSUPPORTED, "the Llama 3.1+ chat template (tools, dated system block) is not supported");
    return true;
}

std::string render_llama3(const Chat &c) {
    std::string out = c.bos;
    for (const auto &m : c.msgs)
        out += "<|start_header_id|>" + m.role + "<|end_header_id|>\n\n" + py_strip(m.content) + "<|eot_id|>";
    if (c.opt.add_generation_prompt) out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
    return out;
}

bool is_gemma(const std::string &t) { return contains(t, "<start_of_turn>"); }

// Gemma 3: no system role either, but its content (as it is, not stripped) and a separator go
// before the first turn's; the separator is the template's literal, "\n\n" in google's.
bool is_gemma3(const std::string &t) { return is_gemma(t) && contains(t, "first_user_prefix"); }

std::string render_gemma3(const Chat &c) {
    const std::string mark = "set first_user_prefix = messages[0]['content'] + '";
    const size_t at = c.norm.find(mark), end = at == std::string::npos ? at : c.norm.find('\'', at + mark.size());
    std::string sep = end == std::string::npos ? "?" : c.norm.substr(at + mark.size(), end - at - mark.size());
    for (size_t i = 0; i < sep.size(); i++)  // the literal's \n escapes
        if (sep.compare(i, 2, "\\n") != 0) fail(FASTLLM_ERR_UNSUPPORTED, "a Gemma 3 chat template with this system prefix");
        else sep.replace(i, 2, "\n");
    const bool system = c.msgs[0].role == "system";
    const std::string prefix = system ? c.msgs[0].content + sep : "";
    require_alternating(c.msgs, system ? 1 : 0, kAlternate);
    std::string out = c.bos;
    for (size_t i = system ? 1 : 0; i < c.msgs.size(); i++) {
        const ChatMessage &m = c.msgs[i];
        out += "<start_of_turn>" + std::string(m.role == "assistant" ? "model" : m.role) + "\n" +
               (i == (system ? 1u : 0u) ? prefix : "") + py_strip(m.content) + "<end_of_turn>\n";
    }
    if (c.opt.add_generation_prompt) out += "<start_of_turn>model\n";
    return out;
}

std::string render_gemma(const Chat &c) {
    if (c.msgs[0].role == "system") fail(FASTLLM_ERR_INVALID_ARGUMENT, "this chat template does not support a system role");
    require_alternating(c.msgs, 0, kAlternate);
    std::string out = c.bos;
    for (const auto &m : c.msgs)
        out += "<start_of_turn>" + std::string(m.role == "assistant" ? "model" : m.role) + "\n" + py_strip(m.content) +
               "<end_of_turn>\n";
    if (c.opt.add_generation_prompt) out += "<start_of_turn>model\n";
    return out;
}

// Zephyr: <|user|> turns closed by EOS (Phi-3's, closed by <|end|>, are recognised before).
bool is_zephyr(const std::string &t) { return contains(t, "<|user|>") && contains(t, "<|assistant|>"); }

std::string render_zephyr(const Chat &c) {
    std::string out;
    for (const auto &m : c.msgs)
        if (m.role == "user" || m.role == "system" || m.role == "assistant")
            out += "<|" + m.role + "|>\n" + m.content + c.eos + "\n";
    if (c.opt.add_generation_prompt) out += "<|assistant|>\n";
    return out;
}

bool is_llama2(const std::string &t) { return contains(t, "[INST]") && contains(t, "<<SYS>>"); }

std::string render_llama2(const Chat &c) {  // a system message is folded into the first user turn
    const auto &msgs = c.msgs;
    size_t first = msgs[0].role == "system" ? 1 : 0;
    require_alternating(msgs, first, kAlternate);
    std::string out;
    for (size_t i = first; i < msgs.size(); i++) {
        std::string content = msgs[i].content;
        if (i == first && first == 1) content = "<<SYS>>\n" + msgs[0].content + "\n<</SYS>>\n\n" + content;
        if (msgs[i].role == "user") out += c.bos + "[INST] " + py_strip(content) + " [/INST]";
        else if (msgs[i].role == "assistant") out += " " + py_strip(content) + " " + c.eos;
    }
    return out;
}

// ---------------------------------------------------------------------------------------------
// Mistral [INST] templates (no <<SYS>>), in the variants Mistral has shipped:
//   first: Mistral-7B-Instruct v0.1 and v0.2 as released (and Mixtral-8x7B-Instruct): no system
//          role, '[INST] ' + content + ' [/INST]', content + EOS (+ ' ' in v0.1);
//   v1:    v0.1 and v0.2 as shipped now: a system message joins the first user turn,
//          ' [INST] ' + content + ' [/INST]', ' ' + content + EOS;
//   v3:    v0.3: a system message joins the *last* user turn (dropped when the conversation does
//          not end with one), '[INST] ' + content + '[/INST]', ' ' + trimmed content + EOS.
struct MistralStyle {
    enum Kind { First, V1, V3 } kind;
    bool space_after_eos;  // first-release v0.1
};

MistralStyle mistral_style(const std::string &t) {
    if (contains_all(t, {"loop.last and system_message is defined",
                         R"('[INST] ' + system_message + '\n\n' + message['content'] + '[/INST]')",
                         "'[INST] ' + message['content'] + '[/INST]'", "' ' + message['content']|trim + eos_token"}))
        return {MistralStyle::V3, false};
    if (contains_all(t, {"loop.first and system_message is defined",
                         R"(' [INST] ' + system_message + '\n\n' + message['content'] + ' [/INST]')",
                         "' [INST] ' + message['content'] + ' [/INST]'", "' ' + message['content'] + eos_token"}))
        return {MistralStyle::V1, false};
    if (!contains(t, "system_message") && !contains(t, "' ' + message['content']") &&
        contains_all(t, {"(message['role'] == 'user') != (loop.index0 % 2 == 0)",
                         "'[INST] ' + message['content'] + ' [/INST]'"})) {
        if (contains(t, "message['content'] + eos_token + ' '")) return {MistralStyle::First, true};
        if (contains(t, "message['content'] + eos_token}}") || contains(t, "message['content'] + eos_token }}"))
            return {MistralStyle::First, false};
    }
    fail(FASTLLM_ERR_UNSUPPORTED, "this Mistral [INST] chat template variant is not supported (supported: "
         "Mistral-7B-Instruct v0.1 / v0.2 as released and as shipped now, and v0.3)");
}

bool is_mistral(const std::string &t) {
    if (!contains(t, "[INST]")) return false;
    mistral_style(t);  // refuses variants we do not render
    return true;
}

std::string render_mistral(const Chat &c) {
    const MistralStyle style = mistral_style(c.norm);
    const auto &msgs = c.msgs;
    const char *only_user_assistant = "only user and assistant roles are supported, with the exception of an initial "
                                      "optional system message";
    std::string out = c.bos;
    if (style.kind == MistralStyle::First) {
        for (size_t i = 0; i < msgs.size(); i++) {
            const ChatMessage &m = msgs[i];
            if ((m.role == "user") != (i % 2 == 0))
                fail(FASTLLM_ERR_INVALID_ARGUMENT, "%s (message %zu is '%s')", kAlternate, i, m.role.c_str());
            if (m.role == "user") out += "[INST] " + m.content + " [/INST]";
            else if (m.role == "assistant") out += m.content + c.eos + (style.space_after_eos ? " " : "");
            else fail(FASTLLM_ERR_INVALID_ARGUMENT, "message %zu: only user and assistant roles are supported", i);
        }
        return out;
    }
    const bool has_system = msgs[0].role == "system";
    const size_t first = has_system ? 1 : 0;
    const std::string system = has_system ? msgs[0].content + "\n\n" : "";
    const char *alternate = "after the optional system message, conversation roles must alternate "
                            "user/assistant/user/assistant/...";
    if (style.kind == MistralStyle::V1) {
        for (size_t i = first; i < msgs.size(); i++) {
            const ChatMessage &m = msgs[i];
            if ((m.role == "user") != ((i - first) % 2 == 0))
                fail(FASTLLM_ERR_INVALID_ARGUMENT, "%s (message %zu is '%s')", alternate, i, m.role.c_str());
            if (m.role == "user") out += " [INST] " + (i == first ? system : "") + m.content + " [/INST]";
            else if (m.role == "assistant") out += " " + m.content + c.eos;
            else fail(FASTLLM_ERR_INVALID_ARGUMENT, "message %zu: %s", i, only_user_assistant);
        }
        return out;
    }
    // v3: the alternation is checked first, over the messages that are not tool results.
    size_t k = 0;
    for (size_t i = first; i < msgs.size(); i++) {
        if (msgs[i].role == "tool" || msgs[i].role == "tool_results") continue;
        if ((msgs[i].role == "user") != (k++ % 2 == 0))
            fail(FASTLLM_ERR_INVALID_ARGUMENT, "%s (message %zu is '%s')", alternate, i, msgs[i].role.c_str());
    }
    for (size_t i = first; i < msgs.size(); i++) {
        const ChatMessage &m = msgs[i];
        if (m.role == "user") out += "[INST] " + (i + 1 == msgs.size() ? system : "") + m.content + "[/INST]";
        else if (m.role == "assistant") out += " " + py_strip(m.content) + c.eos;
        else if (m.role == "tool" || m.role == "tool_results")
            fail(FASTLLM_ERR_UNSUPPORTED, "message %zu: tool messages are not supported with this chat template", i);
        else fail(FASTLLM_ERR_INVALID_ARGUMENT, "message %zu: %s", i, only_user_assistant);
    }
    return out;
}

// ---------------------------------------------------------------------------------------------
// Phi-3 family: turns closed by <|end|> (Zephyr's are closed by EOS), then '<|assistant|>' with
// a generation prompt, else EOS. Variants:
//   Phi-3-mini:   '<|system|>\n', '<|user|>\n', '<|assistant|>\n' turns, other roles give nothing;
//   Phi-3.5-mini: the same, an empty system message gives nothing;
//   Phi-3-small:  BOS, then '<|' + role + '|>\n' for any role;
//   Phi-4-mini:   '<|' + role + '|>' for any role, no newlines (its tools branch needs a
//                 message field fastllm has not).
struct PhiStyle {
    bool any_role;           // '<|' + role + '|>' for every role
    bool system_if_content;  // an empty system message gives nothing
    bool bos;
    const char *nl;  // after each role tag and each <|end|>: "\n" or ""
};

PhiStyle phi_style(const std::string &t) {
    PhiStyle s{};
    bool explicit_roles = contains_all(t, {R"({{'<|system|>\n' + message['content'] + '<|end|>\n'}})",
                                           R"({{'<|user|>\n' + message['content'] + '<|end|>\n'}})",
                                           R"({{'<|assistant|>\n' + message['content'] + '<|end|>\n'}})"});
    if (explicit_roles) {
        s = {false, contains(t, "message['role'] == 'system' and message['content']"), false, "\n"};
    } else if (contains(t, R"({{'<|' + message['role'] + '|>' + '\n' + message['content'] + '<|end|>\n' }})")) {
        s = {true, false, false, "\n"};
    } else if (contains(t, "{{ '<|' + message['role'] + '|>' + message['content'] + '<|end|>' }}")) {
        s = {true, false, false, ""};
    } else {
        fail(FASTLLM_ERR_UNSUPPORTED, "this <|end|> (Phi-3) chat template variant is not supported (supported: "
             "Phi-3-mini, Phi-3.5-mini, Phi-3-small, Phi-4-mini)");
    }
    std::string ending = std::string("{% if add_generation_prompt %}{{ '<|assistant|>") + (*s.nl ? "\\n" : "") +
                         "' }}{% else %}{{ eos_token }}{% endif %}";
    size_t bos_at = t.find("bos_token");
    s.bos = bos_at != std::string::npos;
    if (!contains(t, ending.c_str()) || (s.bos && !starts_with(t, "{{ bos_token }}")) ||
        (s.bos && t.find("bos_token", bos_at + 1) != std::string::npos))
        fail(FASTLLM_ERR_UNSUPPORTED, "this <|end|> (Phi-3) chat template variant is not supported (supported: "
             "Phi-3-mini, Phi-3.5-mini, Phi-3-small, Phi-4-mini)");
    return s;
}

bool is_phi3(const std::string &t) {
    if (!contains(t, "<|end|>") || !(contains(t, "<|user|>") || contains(t, "'<|' + message['role'] + '|>'"))) return false;
    phi_style(t);
    return true;
}

std::string render_phi3(const Chat &c) {
    const PhiStyle s = phi_style(c.norm);
    std::string out = s.bos ? c.bos : "";
    for (const auto &m : c.msgs) {
        bool known = m.role == "system" || m.role == "user" || m.role == "assistant";
        if (!s.any_role && (!known || (m.role == "system" && s.system_if_content && m.content.empty()))) continue;
        out += "<|" + m.role + "|>" + s.nl + m.content + "<|end|>" + s.nl;
    }
    out += c.opt.add_generation_prompt ? std::string("<|assistant|>") + s.nl : c.eos;
    return out;
}

// ---------------------------------------------------------------------------------------------
// GLM. ChatGLM3-6B: '[gMASK]sop' before the first turn, '<|' + role + '|>\n ' + content for any
// role (the space stands for the SentencePiece prefix its build_chat_input gets by encoding the
// content apart), then '<|assistant|>'. glm-4-9b-chat: '[gMASK]<sop>', then '<|' + role + '|>' +
// metadata + '\n' + content for every message with content (fastllm's messages have no metadata
// or tools), then '<|assistant|>\n'.
bool is_chatglm3(const std::string &t) {
    if (!contains(t, "[gMASK]sop")) return false;
    if (!contains_all(t, {"{% if loop.first %}[gMASK]sop<|{{ message['role'] }}|>\\n {{ message['content'] }}"
                          "{% else %}<|{{ message['role'] }}|>\\n {{ message['content'] }}{% endif %}",
                          "{% if add_generation_prompt %}<|assistant|>{% endif %}"}))
        fail(FASTLLM_ERR_UNSUPPORTED, "this [gMASK]sop (ChatGLM3) chat template variant is not supported (supported: "
             "ChatGLM3-6B's)");
    return true;
}

std::string render_chatglm3(const Chat &c) {
    std::string out = "[gMASK]sop";
    for (const auto &m : c.msgs) out += "<|" + m.role + "|>\n " + m.content;
    if (c.opt.add_generation_prompt) out += "<|assistant|>";
    return out;
}

bool is_glm4(const std::string &t) {
    if (!contains(t, "[gMASK]<sop>")) return false;
    if (!(starts_with(t, "[gMASK]<sop>{% for item in messages %}{% if item['tools'] is defined %}") &&
          contains_all(t, {"{% if item['content'] %}<|{{ item['role'] }}|>{{ item['metadata'] }}\\n"
                           "{{ item['content'] }}{% endif %}{% endfor %}",
                           "{% if add_generation_prompt %}<|assistant|>\\n{% endif %}"})))
        fail(FASTLLM_ERR_UNSUPPORTED, "this [gMASK]<sop> (GLM-4) chat template variant is not supported (supported: "
             "glm-4-9b-chat's)");
    return true;
}

std::string render_glm4(const Chat &c) {
    std::string out = "[gMASK]<sop>";
    for (const auto &m : c.msgs)
        if (!m.content.empty()) out += "<|" + m.role + "|>\n" + m.content;
    if (c.opt.add_generation_prompt) out += "<|assistant|>\n";
    return out;
}

// ---------------------------------------------------------------------------------------------

struct Family {
    const char *name;
    bool (*recognises)(const std::string &normalized_template);  // may refuse a variant (throws)
    std::string (*render)(const Chat &chat);
};

// In the order they are tried: extensions before the family they extend, Phi-3 and GLM before
// Zephyr (all have <|user|>), Llama 2 (<<SYS>>) before Mistral.
const Family kFamilies[] = {
    {"qwen3", is_qwen3, render_qwen3},    {"qwen2.5", is_qwen25, render_qwen25}, {"chatml", is_chatml, render_chatml},
    {"llama3", is_llama3, render_llama3}, {"gemma3", is_gemma3, render_gemma3},  {"gemma", is_gemma, render_gemma},
    {"phi3", is_phi3, render_phi3},       {"chatglm3", is_chatglm3, render_chatglm3}, {"glm4", is_glm4, render_glm4},
    {"zephyr", is_zephyr, render_zephyr}, {"llama2", is_llama2, render_llama2},  {"mistral", is_mistral, render_mistral},
};

const Family &find_family(const std::string &norm, const std::string &tmpl) {
    for (const Family &f : kFamilies)
        if (f.recognises(norm)) return f;
    fail(FASTLLM_ERR_UNSUPPORTED, "unknown chat template (supported families: chatml, qwen2.5, qwen3, llama2, llama3, "
         "zephyr, gemma, gemma3, mistral, phi3, chatglm3, glm4): %.80s%s", tmpl.c_str(), tmpl.size() > 80 ? "..." : "");
}

}  // namespace

const char *detect_chat_family(const std::string &tmpl) { return find_family(normalized(tmpl), tmpl).name; }

std::string apply_chat_template(const std::string &tmpl, const std::vector<ChatMessage> &msgs, const ChatOptions &opt,
                                const std::string &bos, const std::string &eos) {
    const std::string norm = normalized(tmpl);
    const Family &family = find_family(norm, tmpl);
    if (msgs.empty())  // as transformers' apply_chat_template
        fail(FASTLLM_ERR_INVALID_ARGUMENT, "cannot apply a chat template to an empty conversation");
    return family.render(Chat{tmpl, norm, msgs, opt, bos, eos});
}

}  // namespace fastllm
