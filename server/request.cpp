#include "request.h"

#include <cmath>
#include <limits>

namespace fastllm_server {

ApiError bad_request(std::string message, std::string param, std::string code) {
    ApiError e;
    e.status = 400;
    e.message = std::move(message);
    e.param = std::move(param);
    e.code = std::move(code);
    return e;
}

namespace {

constexpr size_t kMaxStops = 16;

// The field, or nullptr when it is absent or null (OpenAI clients send null for "not given").
const json *field(const json &body, const char *name) {
    auto it = body.find(name);
    if (it == body.end() || it->is_null()) return nullptr;
    return &*it;
}

ApiError wrong_type(const std::string &name, const char *expected, const json &v) {
    return bad_request("'" + name + "' must be " + expected + ", not " + v.type_name(), name, "invalid_type");
}

ApiError out_of_range(const std::string &name, const std::string &what) {
    return bad_request("'" + name + "' must be " + what, name, "invalid_value");
}

ApiError unsupported(const std::string &name, const std::string &what) {
    return bad_request(what, name, "unsupported_parameter");
}

int64_t as_integer(const std::string &name, const json &v) {
    if (!v.is_number_integer()) throw wrong_type(name, "an integer", v);
    if (v.is_number_unsigned()) {
        uint64_t u = v.get<uint64_t>();
        return u > (uint64_t)std::numeric_limits<int64_t>::max() ? std::numeric_limits<int64_t>::max() : (int64_t)u;
    }
    return v.get<int64_t>();
}

double as_number(const std::string &name, const json &v) {
    if (!v.is_number()) throw wrong_type(name, "a number", v);
    return v.get<double>();
}

bool as_bool(const std::string &name, const json &v) {
    if (!v.is_boolean()) throw wrong_type(name, "a boolean", v);
    return v.get<bool>();
}

std::string as_string(const std::string &name, const json &v) {
    if (!v.is_string()) throw wrong_type(name, "a string", v);
    return v.get<std::string>();
}

// Strings handed to the C API as NUL-terminated char* must not hold a NUL themselves.
void require_no_nul(const std::string &name, const std::string &s) {
    if (s.find('\0') != std::string::npos) throw bad_request("'" + name + "' must not contain NUL characters", name);
}

std::vector<int32_t> as_token_ids(const std::string &name, const json &v) {
    if (!v.is_array()) throw wrong_type(name, "an array of token ids", v);
    std::vector<int32_t> ids;
    ids.reserve(v.size());
    for (size_t i = 0; i < v.size(); i++) {
        const std::string item = name + "[" + std::to_string(i) + "]";
        int64_t id = as_integer(item, v[i]);
        if (id < 0 || id > std::numeric_limits<int32_t>::max()) throw out_of_range(item, "a token id (>= 0)");
        ids.push_back((int32_t)id);
    }
    return ids;
}

// Fields that OpenAI defines but this server does not implement: accepted only at their neutral values.
void reject_unsupported(const json &body, Endpoint endpoint) {
    if (const json *v = field(body, "n"); v && as_integer("n", *v) != 1)
        throw unsupported("n", "only n = 1 is supported");
    if (const json *v = field(body, "best_of"); v && as_integer("best_of", *v) != 1)
        throw unsupported("best_of", "only best_of = 1 is supported");
    if (const json *v = field(body, "echo"); v && as_bool("echo", *v))
        throw unsupported("echo", "echo is not supported");
    if (const json *v = field(body, "logprobs")) {
        bool wanted = endpoint == Endpoint::ChatCompletions ? as_bool("logprobs", *v) : true;
        if (wanted) throw unsupported("logprobs", "logprobs are not supported");
    }
    if (field(body, "top_logprobs")) throw unsupported("top_logprobs", "logprobs are not supported");
    if (const json *v = field(body, "suffix"); v && !as_string("suffix", *v).empty())
        throw unsupported("suffix", "suffix is not supported");
    if (const json *v = field(body, "logit_bias")) {
        if (!v->is_object()) throw wrong_type("logit_bias", "an object", *v);
        if (!v->empty()) throw unsupported("logit_bias", "logit_bias is not supported");
    }
    for (const char *name : {"presence_penalty", "frequency_penalty"}) {
        if (const json *v = field(body, name); v && as_number(name, *v) != 0.0)
            throw unsupported(name, std::string(name) + " is not supported (use repetition_penalty)");
    }
    if (const json *v = field(body, "functions")) {  // the deprecated form of tools
        if (!v->is_array()) throw wrong_type("functions", "an array", *v);
        if (!v->empty()) throw unsupported("functions", "functions is not supported (use tools)");
    }
}

// tools, tool_choice, parallel_tool_calls (see GenerationRequest).
void parse_tools(const json &body, GenerationRequest &r) {
    if (const json *v = field(body, "tools")) {
        if (!v->is_array()) throw wrong_type("tools", "an array", *v);
        for (size_t i = 0; i < v->size(); i++) {
            const json &t = (*v)[i];
            const std::string name = "tools[" + std::to_string(i) + "]";
            if (!t.is_object()) throw wrong_type(name, "an object", t);
            const json *type = field(t, "type");
            if (type && (!type->is_string() || *type != "function"))
                throw bad_request("'" + name + ".type' must be 'function'", name + ".type", "invalid_value");
            const json *fn = field(t, "function");
            if (!fn || !fn->is_object()) throw bad_request("'" + name + ".function' is required", name + ".function",
                                                           "missing_required_parameter");
            const json *fname = field(*fn, "name");
            if (!fname || !fname->is_string() || fname->get<std::string>().empty())
                throw bad_request("'" + name + ".function.name' is required", name + ".function.name",
                                  "missing_required_parameter");
            if (const json *params = field(*fn, "parameters"); params && !params->is_object())
                throw wrong_type(name + ".function.parameters", "a JSON Schema (an object)", *params);
        }
        r.tools = *v;
    }
    if (const json *v = field(body, "tool_choice")) {
        if (v->is_string()) {
            r.tool_choice = v->get<std::string>();
            if (r.tool_choice != "auto" && r.tool_choice != "none" && r.tool_choice != "required")
                throw bad_request("'tool_choice' must be 'auto', 'none', 'required' or {\"type\": \"function\", "
                                  "\"function\": {\"name\": ...}}", "tool_choice", "invalid_value");
        } else if (v->is_object()) {
            const json *fn = field(*v, "function");
            const json *fname = fn && fn->is_object() ? field(*fn, "name") : nullptr;
            if (!fname || !fname->is_string())
                throw bad_request("'tool_choice.function.name' is required", "tool_choice.function.name",
                                  "missing_required_parameter");
            r.tool_choice = fname->get<std::string>();
            bool known = false;
            for (const auto &t : r.tools) known = known || t["function"]["name"] == r.tool_choice;
            if (!known)
                throw bad_request("'tool_choice' names '" + r.tool_choice + "', which is not in tools", "tool_choice",
                                  "invalid_value");
        } else {
            throw wrong_type("tool_choice", "a string or an object", *v);
        }
        if (r.tools.empty() && r.tool_choice != "none" && r.tool_choice != "auto")
            throw bad_request("'tool_choice' needs tools", "tool_choice", "invalid_value");
    }
    if (const json *v = field(body, "parallel_tool_calls")) r.parallel_tool_calls = as_bool("parallel_tool_calls", *v);
}

// response_format and grammar (see GenerationRequest).
void parse_constraints(const json &body, GenerationRequest &r) {
    if (const json *v = field(body, "grammar")) {
        r.grammar = as_string("grammar", *v);
        require_no_nul("grammar", r.grammar);
    }
    const json *v = field(body, "response_format");
    if (!v) return;
    if (!v->is_object()) throw wrong_type("response_format", "an object", *v);
    const json *type = field(*v, "type");
    if (!type) throw bad_request("'response_format.type' is required", "response_format.type", "missing_required_parameter");
    const std::string kind = as_string("response_format.type", *type);
    if (kind == "text") return;
    if (kind == "json_object") {
        const json *schema = field(*v, "schema");  // llama.cpp's extension
        if (schema && !schema->is_object() && !schema->is_boolean())
            throw wrong_type("response_format.schema", "a JSON Schema (an object)", *schema);
        r.json_schema = schema ? schema->dump() : R"({"type": "object"})";
    } else if (kind == "json_schema") {
        const json *spec = field(*v, "json_schema");
        if (!spec) throw bad_request("'response_format.json_schema' is required", "response_format.json_schema",
                                     "missing_required_parameter");
        if (!spec->is_object()) throw wrong_type("response_format.json_schema", "an object", *spec);
        if (const json *name = field(*spec, "name")) as_string("response_format.json_schema.name", *name);
        if (const json *strict = field(*spec, "strict")) as_bool("response_format.json_schema.strict", *strict);
        const json *schema = field(*spec, "schema");
        if (schema && !schema->is_object() && !schema->is_boolean())
            throw wrong_type("response_format.json_schema.schema", "a JSON Schema (an object)", *schema);
        r.json_schema = schema ? schema->dump() : "{}";  // no schema: any JSON value
    } else {
        throw bad_request("response_format type '" + kind + "' is not supported (text, json_object, json_schema)",
                          "response_format.type", "unsupported_parameter");
    }
    if (!r.grammar.empty())
        throw bad_request("'grammar' and a JSON response_format cannot be combined", "grammar", "invalid_value");
}

void parse_common(const json &body, GenerationRequest &r) {
    reject_unsupported(body, r.endpoint);
    parse_constraints(body, r);
    if (const json *v = field(body, "model")) r.model = as_string("model", *v);

    const char *max_name = "max_tokens";
    const json *max = field(body, "max_tokens");
    if (!max && r.endpoint == Endpoint::ChatCompletions && (max = field(body, "max_completion_tokens")))
        max_name = "max_completion_tokens";
    if (max) {
        int64_t n = as_integer(max_name, *max);
        if (n < 1) throw out_of_range(max_name, "at least 1");
        r.max_tokens = n;
    }
    if (const json *v = field(body, "temperature")) {
        double t = as_number("temperature", *v);
        if (!(t >= 0.0 && t <= 2.0)) throw out_of_range("temperature", "between 0 and 2");
        r.temperature = (float)t;
    }
    if (const json *v = field(body, "top_p")) {
        double p = as_number("top_p", *v);
        if (!(p > 0.0 && p <= 1.0)) throw out_of_range("top_p", "greater than 0 and at most 1");
        r.top_p = (float)p;
    }
    if (const json *v = field(body, "top_k")) {
        int64_t k = as_integer("top_k", *v);
        if (k < 0) throw out_of_range("top_k", "at least 0 (0 = off)");
        r.top_k = (int32_t)std::min<int64_t>(k, std::numeric_limits<int32_t>::max());
    }
    if (const json *v = field(body, "min_p")) {
        double p = as_number("min_p", *v);
        if (!(p >= 0.0 && p <= 1.0)) throw out_of_range("min_p", "between 0 and 1");
        r.min_p = (float)p;
    }
    if (const json *v = field(body, "repetition_penalty")) {
        double p = as_number("repetition_penalty", *v);
        if (!(p > 0.0 && p <= 10.0)) throw out_of_range("repetition_penalty", "greater than 0 and at most 10");
        r.repetition_penalty = (float)p;
    }
    if (const json *v = field(body, "seed")) {
        if (!v->is_number_integer()) throw wrong_type("seed", "an integer", *v);
        r.seed = v->is_number_unsigned() ? v->get<uint64_t>() : (uint64_t)v->get<int64_t>();
    }
    if (const json *v = field(body, "stop")) {
        std::vector<std::string> stops;
        if (v->is_string()) {
            stops.push_back(v->get<std::string>());
        } else if (v->is_array()) {
            if (v->size() > kMaxStops) throw out_of_range("stop", "at most " + std::to_string(kMaxStops) + " strings");
            for (size_t i = 0; i < v->size(); i++) stops.push_back(as_string("stop[" + std::to_string(i) + "]", (*v)[i]));
        } else {
            throw wrong_type("stop", "a string or an array of strings", *v);
        }
        for (auto &s : stops) {
            require_no_nul("stop", s);
            if (!s.empty()) r.stop.push_back(std::move(s));  // an empty stop string would match at once
        }
    }
    if (const json *v = field(body, "ignore_eos")) r.ignore_eos = as_bool("ignore_eos", *v);
    if (const json *v = field(body, "speculative")) {
        r.speculative = as_string("speculative", *v);
        if (r.speculative != "off" && r.speculative != "lookup" && r.speculative != "draft")
            throw bad_request("'speculative' must be \"off\", \"lookup\" or \"draft\", not '" + r.speculative + "'",
                              "speculative", "invalid_value");
    }
    if (const json *v = field(body, "n_draft")) {
        if (!v->is_number_integer()) throw wrong_type("n_draft", "an integer", *v);
        const int64_t n = v->get<int64_t>();
        if (n < 1 || n > 16) throw out_of_range("n_draft", "between 1 and 16");
        r.n_draft = (int32_t)n;
    }
    if (const json *v = field(body, "lora")) {
        if (!v->is_array()) throw wrong_type("lora", "an array of {\"name\" or \"id\", \"scale\"} objects", *v);
        for (size_t i = 0; i < v->size(); i++) {
            const std::string item = "lora[" + std::to_string(i) + "]";
            const json &e = (*v)[i];
            if (!e.is_object()) throw wrong_type(item, "an object", e);
            LoraRequest l;
            const json *name = field(e, "name"), *id = field(e, "id");
            if (!name == !id) throw bad_request("'" + item + "' needs either \"name\" or \"id\"", item, "invalid_value");
            if (name) l.name = as_string(item + ".name", *name);
            if (id) {
                l.id = as_integer(item + ".id", *id);
                if (l.id < 0) throw out_of_range(item + ".id", "at least 0");
            }
            if (const json *s = field(e, "scale")) {
                const double x = as_number(item + ".scale", *s);
                if (!(std::fabs(x) <= 1e6)) throw out_of_range(item + ".scale", "a number between -1e6 and 1e6");
                l.scale = (float)x;
            }
            r.lora.push_back(std::move(l));
        }
    }
    if (const json *v = field(body, "stream")) r.stream = as_bool("stream", *v);
    if (const json *v = field(body, "stream_options")) {
        if (!v->is_object()) throw wrong_type("stream_options", "an object", *v);
        if (const json *u = field(*v, "include_usage")) r.include_usage = as_bool("stream_options.include_usage", *u);
    }
}

std::string message_content(size_t i, const json &m, const std::string &role) {
    const std::string name = "messages[" + std::to_string(i) + "].content";
    const json *content = field(m, "content");
    std::string text;
    if (!content || content->is_null()) {
        if (role != "assistant") throw bad_request("'" + name + "' is required", name, "missing_required_parameter");
    } else if (content->is_string()) {
        text = content->get<std::string>();
    } else if (content->is_array()) {
        for (size_t j = 0; j < content->size(); j++) {
            const json &part = (*content)[j];
            const std::string pname = name + "[" + std::to_string(j) + "]";
            if (!part.is_object()) throw wrong_type(pname, "an object", part);
            const json *type = field(part, "type");
            if (!type || !type->is_string() || type->get<std::string>() != "text")
                throw bad_request("'" + pname + "': only content parts of type 'text' are supported", pname,
                                  "unsupported_parameter");
            const json *t = field(part, "text");
            if (!t) throw bad_request("'" + pname + ".text' is required", pname + ".text", "missing_required_parameter");
            text += as_string(pname + ".text", *t);
        }
    } else {
        throw wrong_type(name, "a string or an array of content parts", *content);
    }
    require_no_nul(name, text);
    return text;
}

}  // namespace

json parse_json(const std::string &text) { return json::parse(text); }

json parse_body(const std::string &body) {
    json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) {
        // Parse again with exceptions for the position and reason of the first error.
        std::string why = "malformed JSON";
        try {
            json again = json::parse(body);
        } catch (const json::exception &e) {  // parse_error, or out_of_range for a number like 1e999
            why = e.what();
        }
        throw bad_request("the request body is not valid JSON: " + why, "", "invalid_json");
    }
    if (!j.is_object()) throw bad_request(std::string("the request body must be a JSON object, not ") + j.type_name());
    return j;
}

GenerationRequest parse_completion_request(const json &body) {
    GenerationRequest r;
    r.endpoint = Endpoint::Completions;
    parse_common(body, r);
    const json *p = field(body, "prompt");
    if (!p) throw bad_request("'prompt' is required", "prompt", "missing_required_parameter");
    if (p->is_string()) {
        r.prompt = p->get<std::string>();
    } else if (p->is_array()) {
        if (p->empty()) throw bad_request("'prompt' must not be an empty array", "prompt");
        const json &first = (*p)[0];
        if (first.is_number()) {
            r.prompt_tokens = as_token_ids("prompt", *p);
            r.prompt_is_tokens = true;
        } else if (p->size() > 1) {
            throw unsupported("prompt", "only one prompt per request is supported");
        } else if (first.is_string()) {
            r.prompt = first.get<std::string>();
        } else if (first.is_array()) {
            r.prompt_tokens = as_token_ids("prompt[0]", first);
            r.prompt_is_tokens = true;
        } else {
            throw wrong_type("prompt", "a string, an array of token ids, or an array of one of those", *p);
        }
    } else {
        throw wrong_type("prompt", "a string or an array of token ids", *p);
    }
    return r;
}

GenerationRequest parse_chat_request(const json &body) {
    GenerationRequest r;
    r.endpoint = Endpoint::ChatCompletions;
    r.messages = json::array();
    parse_common(body, r);
    parse_tools(body, r);
    const json *msgs = field(body, "messages");
    if (!msgs) throw bad_request("'messages' is required", "messages", "missing_required_parameter");
    if (!msgs->is_array()) throw wrong_type("messages", "an array", *msgs);
    if (msgs->empty()) throw bad_request("'messages' must not be empty", "messages");
    for (size_t i = 0; i < msgs->size(); i++) {
        const json &m = (*msgs)[i];
        const std::string name = "messages[" + std::to_string(i) + "]";
        if (!m.is_object()) throw wrong_type(name, "an object", m);
        const json *role = field(m, "role");
        if (!role) throw bad_request("'" + name + ".role' is required", name + ".role", "missing_required_parameter");
        std::string rname = as_string(name + ".role", *role);
        if (rname == "developer") rname = "system";
        if (rname != "system" && rname != "user" && rname != "assistant" && rname != "tool")
            throw bad_request("'" + name + ".role' must be 'system', 'user', 'assistant' or 'tool', not '" + rname + "'",
                              name + ".role", "invalid_value");
        json msg = {{"role", rname}, {"content", message_content(i, m, rname)}};
        for (const char *k : {"name", "tool_call_id", "reasoning_content"})
            if (const json *v = field(m, k)) msg[k] = as_string(name + "." + k, *v);
        if (const json *calls = field(m, "tool_calls"); calls && !calls->is_null()) {
            if (rname != "assistant" || !calls->is_array())
                throw bad_request("'" + name + ".tool_calls' must be a list, on an assistant message", name + ".tool_calls",
                                  "invalid_value");
            json out = json::array();
            for (size_t j = 0; j < calls->size(); j++) {
                const json &c = (*calls)[j];
                const std::string cname = name + ".tool_calls[" + std::to_string(j) + "]";
                const json *fn = c.is_object() ? field(c, "function") : nullptr;
                const json *fname = fn && fn->is_object() ? field(*fn, "name") : nullptr;
                if (!fname || !fname->is_string())
                    throw bad_request("'" + cname + ".function.name' is required", cname + ".function.name",
                                      "missing_required_parameter");
                json f = {{"name", *fname}};
                // OpenAI sends arguments as JSON text; templates expect the object (transformers'
                // convention), so text that parses is given as what it encodes
                json args = json::object();
                if (const json *a = field(*fn, "arguments")) {
                    if (a->is_string()) {
                        json parsed = json::parse(a->get<std::string>(), nullptr, false);
                        args = parsed.is_discarded() ? *a : parsed;
                    } else args = *a;
                }
                f["arguments"] = args;
                json call = {{"type", "function"}, {"function", f}};
                if (const json *id = field(c, "id")) call["id"] = as_string(cname + ".id", *id);
                out.push_back(call);
            }
            msg["tool_calls"] = out;
        }
        r.messages.push_back(std::move(msg));
    }
    return r;
}

TokenizeRequest parse_tokenize_request(const json &body) {
    TokenizeRequest r;
    const json *c = field(body, "content");
    if (!c) throw bad_request("'content' is required", "content", "missing_required_parameter");
    r.content = as_string("content", *c);
    if (const json *v = field(body, "add_special")) r.add_special = as_bool("add_special", *v);
    return r;
}

std::vector<int32_t> parse_detokenize_request(const json &body) {
    const json *t = field(body, "tokens");
    if (!t) throw bad_request("'tokens' is required", "tokens", "missing_required_parameter");
    return as_token_ids("tokens", *t);
}

}  // namespace fastllm_server
