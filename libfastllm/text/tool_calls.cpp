#include "text/tool_calls.h"

#include <cstring>

#include "base/error.h"
#include "text/grammar.h"
#include "text/json_schema.h"
#include "text/json_text.h"

namespace fastllm {

using json = nlohmann::ordered_json;

namespace {

bool has(const std::string &s, const char *what) { return s.find(what) != std::string::npos; }

std::string trim(const std::string &s) {
    size_t b = s.find_first_not_of(" \t\r\n"), e = s.find_last_not_of(" \t\r\n");
    return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

// The end (one past) of the JSON value that starts at text[i] ('{' or '['), or npos when it does not close.
size_t json_end(const std::string &text, size_t i) {
    int depth = 0;
    bool in_string = false;
    for (size_t k = i; k < text.size(); k++) {
        char c = text[k];
        if (in_string) {
            if (c == '\\') k++;
            else if (c == '"') in_string = false;
        } else if (c == '"') in_string = true;
        else if (c == '{' || c == '[') depth++;
        else if (c == '}' || c == ']') {
            if (--depth == 0) return k + 1;
        }
    }
    return std::string::npos;
}

// JSON text a model wrote: false when it does not parse, or nests past 256 levels (what is
// parsed is written out again, recursively).
bool parse_json(const std::string &text, json &out) { return fastllm::parse_json(text, 256, out) == JsonParse::Ok; }

bool tool_known(const json &tools, const std::string &name) {
    if (!tools.is_array() || tools.empty()) return true;
    for (const auto &t : tools) {
        const json *f = t.contains("function") ? &t["function"] : &t;
        if (f->is_object() && f->contains("name") && (*f)["name"].is_string() && (*f)["name"] == name) return true;
    }
    return false;
}

// A call from {"name": ..., "arguments" | "parameters": {...} or its JSON text}.
bool call_from(const json &obj, const json &tools, ToolCall &out) {
    if (!obj.is_object()) return false;
    const json *o = &obj;
    if (obj.contains("function") && obj["function"].is_object()) o = &obj["function"];  // OpenAI's own shape
    if (!o->contains("name") || !(*o)["name"].is_string()) return false;
    const json *args = nullptr;
    for (const char *k : {"arguments", "parameters"})
        if (o->contains(k)) args = &(*o)[k];
    json parsed;
    if (args && args->is_string()) {
        if (!parse_json(args->get<std::string>(), parsed)) return false;
        args = &parsed;
    }
    if (args && !args->is_object()) return false;
    out.name = (*o)["name"].get<std::string>();
    if (!tool_known(tools, out.name)) return false;
    out.arguments = args ? args->dump() : "{}";
    return true;
}

bool calls_from(const json &v, const json &tools, std::vector<ToolCall> &out) {
    if (v.is_array()) {
        if (v.empty()) return false;
        for (const auto &e : v) {
            ToolCall c;
            if (!call_from(e, tools, c)) return false;
            out.push_back(std::move(c));
        }
        return true;
    }
    ToolCall c;
    if (!call_from(v, tools, c)) return false;
    out.push_back(std::move(c));
    return true;
}

// ---- parsers: the calls in a reply, or false (the reply is then text)

// <tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>, one or more
bool parse_hermes(const std::string &text, const json &tools, ToolReply &r) {
    const std::string open = "<tool_call>", close = "</tool_call>";
    size_t at = text.find(open);
    if (at == std::string::npos) return false;
    std::string content = text.substr(0, at);
    while (at != std::string::npos) {
        size_t body = at + open.size(), end = text.find(close, body);
        json v;
        if (!parse_json(trim(text.substr(body, end == std::string::npos ? std::string::npos : end - body)), v) ||
            !calls_from(v, tools, r.calls))
            return false;
        if (end == std::string::npos) break;  // the reply ended inside the last call: it parsed all the same
        size_t next = text.find(open, end + close.size());
        content += text.substr(end + close.size(), next == std::string::npos ? std::string::npos : next - end - close.size());
        at = next;
    }
    r.content = trim(content);
    return true;
}

// <tool_call>name\n<arg_key>k</arg_key>\n<arg_value>v</arg_value>...</tool_call> (GLM-4.5 / 4.6)
bool parse_glm45(const std::string &text, const json &tools, ToolReply &r) {
    const std::string open = "<tool_call>", close = "</tool_call>";
    size_t at = text.find(open);
    if (at == std::string::npos) return false;
    r.content = trim(text.substr(0, at));
    while (at != std::string::npos) {
        size_t body = at + open.size(), end = text.find(close, body);
        std::string call = text.substr(body, end == std::string::npos ? std::string::npos : end - body);
        size_t k = call.find("<arg_key>");
        ToolCall c;
        c.name = trim(call.substr(0, k));
        if (c.name.empty() || !tool_known(tools, c.name)) return false;
        json args = json::object();
        while (k != std::string::npos) {
            size_t ke = call.find("</arg_key>", k), vb = call.find("<arg_value>", k), ve = call.find("</arg_value>", k);
            if (ke == std::string::npos || vb == std::string::npos || ve == std::string::npos || vb > ve) return false;
            std::string key = call.substr(k + 9, ke - k - 9), value = call.substr(vb + 11, ve - vb - 11);
            json v;
            args[key] = parse_json(value, v) ? v : json(value);
            k = call.find("<arg_key>", ve);
        }
        c.arguments = args.dump();
        r.calls.push_back(std::move(c));
        if (end == std::string::npos) break;
        at = text.find(open, end + close.size());
    }
    return true;
}

// [TOOL_CALLS][{"name": ..., "arguments": {...}}, ...] (v0.3), or [TOOL_CALLS]name[ARGS]{...} (2507 and later)
bool parse_mistral(const std::string &text, const json &tools, ToolReply &r) {
    const std::string marker = "[TOOL_CALLS]";
    size_t at = text.find(marker);
    if (at == std::string::npos) return false;
    r.content = trim(text.substr(0, at));
    while (at != std::string::npos) {
        size_t p = at + marker.size();
        while (p < text.size() && (text[p] == ' ' || text[p] == '\n')) p++;
        if (p < text.size() && text[p] == '[') {
            size_t e = json_end(text, p);
            json v;
            if (e == std::string::npos || !parse_json(text.substr(p, e - p), v) || !calls_from(v, tools, r.calls)) return false;
        } else {
            size_t a = text.find("[ARGS]", p);
            if (a == std::string::npos) return false;
            ToolCall c;
            c.name = trim(text.substr(p, a - p));
            size_t id = c.name.find("[CALL_ID]");
            if (id != std::string::npos) c.name = trim(c.name.substr(0, id));
            size_t b = text.find('{', a), e = b == std::string::npos ? b : json_end(text, b);
            json v;
            if (e == std::string::npos || !parse_json(text.substr(b, e - b), v) || !v.is_object() || c.name.empty() ||
                !tool_known(tools, c.name))
                return false;
            c.arguments = v.dump();
            r.calls.push_back(std::move(c));
        }
        at = text.find(marker, p);
    }
    return true;
}

// Objects, or a JSON list of them, after an optional prefix: Llama 3's {"name": ..., "parameters": ...}
// (after <|python_tag|>, several joined by ';'), functools[...] (Phi-4-mini, FireFunction), the
// generic {"name": ..., "arguments": ...} / {"tool_calls": [...]}.
bool parse_json_calls(const std::string &text, const char *prefix, bool prefix_required, const json &tools, ToolReply &r) {
    size_t p = 0;
    if (prefix) {
        size_t at = text.find(prefix);
        if (at == std::string::npos) {
            if (prefix_required) return false;
        } else {
            r.content = trim(text.substr(0, at));
            p = at + std::strlen(prefix);
        }
    }
    std::string rest = trim(text.substr(p));
    if (rest.empty() || (rest[0] != '{' && rest[0] != '[')) return false;
    size_t k = 0;
    while (k < rest.size()) {
        size_t e = json_end(rest, k);
        json v;
        if (e == std::string::npos || !parse_json(rest.substr(k, e - k), v)) return false;
        if (v.is_object() && (v.contains("tool_calls") || v.contains("tool_call"))) {
            const json &inner = v.contains("tool_calls") ? v["tool_calls"] : v["tool_call"];
            if (!calls_from(inner, tools, r.calls)) return false;
            if (v.contains("content") && v["content"].is_string()) r.content = v["content"].get<std::string>();
        } else if (!calls_from(v, tools, r.calls)) {
            return false;
        }
        k = e;
        while (k < rest.size() && (rest[k] == ';' || rest[k] == ' ' || rest[k] == '\n')) k++;
        if (k < rest.size() && rest[k] != '{' && rest[k] != '[') return false;
    }
    return !r.calls.empty();
}

bool parse_llama3(const std::string &text, const json &tools, ToolReply &r) {
    return parse_json_calls(text, "<|python_tag|>", false, tools, r);
}
bool parse_functools(const std::string &text, const json &tools, ToolReply &r) {
    return parse_json_calls(text, "functools", true, tools, r);
}
bool parse_generic(const std::string &text, const json &tools, ToolReply &r) {
    return parse_json_calls(text, nullptr, false, tools, r);
}

// name\n{...} (glm-4-9b-chat)
bool parse_glm4(const std::string &text, const json &tools, ToolReply &r) {
    std::string t = trim(text);
    size_t nl = t.find('\n');
    if (nl == std::string::npos) return false;
    ToolCall c;
    c.name = trim(t.substr(0, nl));
    json v;
    if (c.name.empty() || !tool_known(tools, c.name) || !parse_json(trim(t.substr(nl + 1)), v) || !v.is_object())
        return false;
    c.arguments = v.dump();
    r.calls.push_back(std::move(c));
    return true;
}

}  // namespace

struct ToolFormat {
    const char *name;
    bool (*detect)(const std::string &tmpl);
    bool (*parse)(const std::string &text, const json &tools, ToolReply &r);
    const char *args_key;     // the call object's arguments member in a grammar
    const char *one;          // GBNF of one call around the rule `call`, or nullptr: no grammar
    const char *many;         // GBNF of one or more calls (parallel)
    // Where calls can begin, for a stream that sends text until then: after `marker` anywhere
    // (nullptr: none), or (json_start) at a reply's start with '{' or '['; anywhere (hold).
    const char *marker;
    bool json_start;
    bool hold;
    // For tool_choice "auto": where the grammar takes over (grammar.h's triggers, '\n' between),
    // at the start of what `one` and `many` match.
    const char *triggers;
};

namespace {

const ToolFormat kFormats[] = {
    {"glm4.5", [](const std::string &t) { return has(t, "<tool_call>") && has(t, "<arg_key>"); }, parse_glm45, nullptr,
     nullptr, nullptr, "<tool_call>", false, false, nullptr},
    {"hermes", [](const std::string &t) { return has(t, "<tool_call>"); }, parse_hermes, "arguments",
     "root ::= \"<tool_call>\\n\" call \"\\n</tool_call>\"",
     "root ::= one ( \"\\n\" one )*\none ::= \"<tool_call>\\n\" call \"\\n</tool_call>\"", "<tool_call>", false, false, "<tool_call>"},
    {"mistral", [](const std::string &t) { return has(t, "[TOOL_CALLS]"); }, parse_mistral, "arguments",
     "root ::= \"[TOOL_CALLS][\" call \"]\"", "root ::= \"[TOOL_CALLS][\" call ( \", \" call )* \"]\"", "[TOOL_CALLS]",
     false, false, "[TOOL_CALLS]"},
    {"functools", [](const std::string &t) { return has(t, "functools") || has(t, "<|tool|>"); }, parse_functools,
     "arguments", "root ::= \"functools[\" call \"]\"", "root ::= \"functools[\" call ( \", \" call )* \"]\"", "functools",
     false, false, "functools"},
    {"llama3", [](const std::string &t) { return has(t, "<|python_tag|>") || (has(t, "<|start_header_id|>") && has(t, "tools")); },
     parse_llama3, "parameters", "root ::= call", "root ::= call ( \"; \" call )*", "<|python_tag|>", true, false, "^{"},
    {"glm4", [](const std::string &t) { return has(t, "[gMASK]") && has(t, "observation"); }, parse_glm4, nullptr,
     nullptr, nullptr, nullptr, false, true, nullptr},
    {"generic", [](const std::string &) { return true; }, parse_generic, "arguments", "root ::= call | \"[\" call \"]\"",
     "root ::= call | \"[\" call ( \", \" call )* \"]\"", nullptr, true, false, "^{\n^["},
};

}  // namespace

const ToolFormat &tool_format_of(const std::string &chat_template) {
    for (const auto &f : kFormats)
        if (f.detect(chat_template)) return f;
    return kFormats[sizeof kFormats / sizeof kFormats[0] - 1];
}

const ToolFormat *tool_format_named(const std::string &name) {
    for (const auto &f : kFormats)
        if (name == f.name) return &f;
    return nullptr;
}

const char *tool_format_name(const ToolFormat &f) { return f.name; }

size_t tool_text_safe(const ToolFormat &f, const std::string &text, bool done) {
    if (done) return text.size();
    if (f.hold) return 0;
    size_t first = text.find_first_not_of(" \t\r\n");
    if (f.json_start && (first == std::string::npos || text[first] == '{' || text[first] == '[')) return 0;
    if (!f.marker) return text.size();
    const std::string marker = f.marker;
    size_t at = text.find(marker);
    if (at != std::string::npos) return at;
    // not past the start of a marker that the next text may complete
    for (size_t k = std::min(text.size(), marker.size() - 1); k > 0; k--)
        if (text.compare(text.size() - k, k, marker, 0, k) == 0) return text.size() - k;
    return text.size();
}

ToolReply parse_tool_calls(const ToolFormat &f, const std::string &reply, const json &tools) {
    ToolReply r;
    if (!f.parse(reply, tools, r)) {  // no calls, or calls that do not parse: the reply is text
        r = ToolReply{};
        r.content = reply;
    }
    return r;
}

std::vector<std::string> tool_call_triggers(const ToolFormat &f) {
    if (!f.triggers) fail(FASTLLM_ERR_UNSUPPORTED, "tool calls in the %s format cannot be constrained here", f.name);
    std::vector<std::string> out;
    for (const char *p = f.triggers; *p;) {
        const char *e = std::strchr(p, '\n');
        out.emplace_back(p, e ? e : p + std::strlen(p));
        p = e ? e + 1 : p + std::strlen(p);
    }
    return out;
}

std::string tool_call_grammar(const ToolFormat &f, const json &tools, const std::string &only, bool parallel) {
    if (!f.one) fail(FASTLLM_ERR_UNSUPPORTED, "tool calls in the %s format cannot be constrained here", f.name);
    if (!tools.is_array() || tools.empty()) fail(FASTLLM_ERR_INVALID_ARGUMENT, "tools: expected a non-empty list");
    json alternatives = json::array();
    for (const auto &t : tools) {
        const json *fn = t.is_object() && t.contains("function") ? &t["function"] : &t;
        if (!fn->is_object() || !fn->contains("name") || !(*fn)["name"].is_string())
            fail(FASTLLM_ERR_INVALID_ARGUMENT, "tools: every tool needs a function with a name");
        std::string name = (*fn)["name"].get<std::string>();
        if (!only.empty() && name != only) continue;
        json params = fn->contains("parameters") ? (*fn)["parameters"] : json{{"type", "object"}};
        alternatives.push_back({{"type", "object"},
                                {"properties", {{"name", {{"const", name}}}, {f.args_key, params}}},
                                {"required", {"name", f.args_key}},
                                {"additionalProperties", false}});
    }
    if (alternatives.empty()) fail(FASTLLM_ERR_INVALID_ARGUMENT, "tool_choice names '%s', which is not in tools", only.c_str());
    json schema = alternatives.size() == 1 ? alternatives[0] : json{{"anyOf", alternatives}};
    std::string grammar = std::string(parallel ? f.many : f.one) + "\n" + json_schema_to_grammar(schema.dump(), "call");
    Grammar::parse(grammar);  // a grammar the matcher can follow, or the error now
    return grammar;
}

}  // namespace fastllm
