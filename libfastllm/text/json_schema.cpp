#include "text/json_schema.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <deque>
#include <functional>
#include <map>
#include <set>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/error.h"
#include "text/grammar.h"
#include "text/json_text.h"

namespace fastllm {

namespace {

using json = nlohmann::ordered_json;  // keeps the order of "properties"

constexpr int64_t kMaxCount = 10000;          // minLength, maxItems, ...: the grammar's repetition limit
constexpr int kMaxDepth = 64;                 // schemas nested deeper are refused
constexpr int64_t kMaxInt = 9999999999999999;  // integers have at most 16 digits

// The rules every schema grammar builds on, with the primitives each one uses. Whitespace between
// tokens is at most one space, or a newline and an indent of up to 20 spaces or tabs; numbers have
// at most 16 digits before and after the point and 3 in the exponent: bounded, so that sampling
// at temperature 1 cannot run on forever inside one token.
struct Primitive {
    const char *name, *body;
    std::vector<const char *> uses;
};
const Primitive kPrimitives[] = {
    {"ws", R"(( " " | "\n" [ \t]{0,20} )?)", {}},
    {"json-char", R"([^"\\\x00-\x1F] | "\\" ( ["\\/bfnrt] | "u" [0-9a-fA-F]{4} ))", {}},
    {"json-string", R"("\"" json-char* "\"")", {"json-char"}},
    {"json-int", R"("-"? ( "0" | [1-9] [0-9]{0,15} ))", {}},
    {"json-number", R"(json-int ( "." [0-9]{1,16} )? ( [eE] [-+]? [0-9]{1,3} )?)", {"json-int"}},
    {"json-bool", R"("true" | "false")", {}},
    {"json-null", R"("null")", {}},
    {"json-value", R"(json-object | json-array | json-string | json-number | json-bool | json-null)",
     {"json-object", "json-array", "json-string", "json-number", "json-bool", "json-null"}},
    {"json-object", R"("{" ws ( json-kv ( "," ws json-kv )* ws )? "}")", {"ws", "json-kv"}},
    {"json-kv", R"(json-string ":" ws json-value)", {"json-string", "ws", "json-value"}},
    {"json-array", R"("[" ws ( json-value ( "," ws json-value )* ws )? "]")", {"ws", "json-value"}},
    {"json-date", R"([0-9]{4} "-" ( "0" [1-9] | "1" [0-2] ) "-" ( "0" [1-9] | [12] [0-9] | "3" [01] ))", {}},
    {"json-time",
     R"(( [01] [0-9] | "2" [0-3] ) ":" [0-5] [0-9] ":" [0-5] [0-9] ( "." [0-9]{1,6} )? ( "Z" | [+-] ( [01] [0-9] | "2" [0-3] ) ":" [0-5] [0-9] ))",
     {}},
    {"json-date-time", R"(json-date "T" json-time)", {"json-date", "json-time"}},
    {"json-uuid", R"([0-9a-fA-F]{8} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{12})", {}},
};

// Keywords that change nothing about which texts match (annotations), and the ones converted.
const std::set<std::string> kIgnored = {"description", "title", "$schema", "$id", "$comment", "$anchor", "default",
                                        "examples", "deprecated", "readOnly", "writeOnly"};
const std::set<std::string> kHandled = {
    "type", "properties", "required", "additionalProperties", "enum", "const", "items", "prefixItems", "minItems",
    "maxItems", "minLength", "maxLength", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "anyOf",
    "oneOf", "allOf", "$ref", "$defs", "definitions", "format", "uniqueItems"};
const std::set<std::string> kTypes = {"string", "number", "integer", "boolean", "null", "object", "array"};

// A GBNF string literal of the bytes s (UTF-8 passes through).
std::string literal(const std::string &s) {
    std::string out = "\"";
    for (unsigned char c : s) {
        if (c == '"') out += "\\\"";
        else if (c == '\\') out += "\\\\";
        else if (c == '\n') out += "\\n";
        else if (c == '\r') out += "\\r";
        else if (c == '\t') out += "\\t";
        else if (c < 0x20 || c == 0x7F) {
            char buf[8];
            std::snprintf(buf, sizeof buf, "\\x%02X", c);
            out += buf;
        } else {
            out += (char)c;
        }
    }
    return out + "\"";
}

// A code point as an escape inside a GBNF character class.
std::string class_char(uint32_t cp) {
    char buf[16];
    if (cp < 0x100) std::snprintf(buf, sizeof buf, "\\x%02X", cp);
    else if (cp < 0x10000) std::snprintf(buf, sizeof buf, "\\u%04X", cp);
    else std::snprintf(buf, sizeof buf, "\\U%08X", cp);
    return buf;
}

std::vector<uint32_t> code_points(const std::string &s) {  // s is valid UTF-8 (nlohmann checked it)
    std::vector<uint32_t> out;
    for (size_t i = 0; i < s.size();) {
        unsigned char c = (unsigned char)s[i];
        int len = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : 4;
        uint32_t cp = len == 1 ? c : len == 2 ? c & 0x1F : len == 3 ? c & 0x0F : c & 0x07;
        for (int k = 1; k < len && i + k < s.size(); k++) cp = cp << 6 | ((unsigned char)s[i + k] & 0x3F);
        out.push_back(cp);
        i += (size_t)len;
    }
    return out;
}

std::string pointer_token(const std::string &key) {  // RFC 6901 escaping
    std::string out;
    for (char c : key) {
        if (c == '~') out += "~0";
        else if (c == '/') out += "~1";
        else out += c;
    }
    return out;
}

std::string repeat(int64_t min, int64_t max) {  // max -1: unbounded
    if (max < 0) return min == 0 ? "*" : min == 1 ? "+" : "{" + std::to_string(min) + ",}";
    if (min == 0 && max == 1) return "?";
    if (min == max) return "{" + std::to_string(min) + "}";
    return "{" + std::to_string(min) + "," + std::to_string(max) + "}";
}

std::string join(const std::vector<std::string> &parts, const char *sep) {
    std::string out;
    for (size_t i = 0; i < parts.size(); i++) out += (i ? sep : "") + parts[i];
    return out;
}

// Integers in a range: one alternative per digit count, each split digit by digit.
std::string digit_class(char lo, char hi) {
    return lo == hi ? std::string("\"") + lo + "\"" : std::string("[") + lo + "-" + hi + "]";
}

// The digit strings of one length from a to b (a <= b, leading zeros allowed).
std::string fixed_range(const std::string &a, const std::string &b) {
    if (a == b) return a.empty() ? "" : "\"" + a + "\"";
    const size_t k = a.size() - 1;
    if (a[0] == b[0]) return "\"" + a.substr(0, 1) + "\" " + fixed_range(a.substr(1), b.substr(1));
    const std::string any = k == 0 ? "" : k == 1 ? " [0-9]" : " [0-9]{" + std::to_string(k) + "}";
    const bool a_low = a.find_first_not_of('0', 1) == std::string::npos;
    const bool b_high = b.find_first_not_of('9', 1) == std::string::npos;
    char lo = a[0], hi = b[0];
    std::vector<std::string> alts;
    if (!a_low) alts.push_back("\"" + a.substr(0, 1) + "\" " + fixed_range(a.substr(1), std::string(k, '9'))), lo++;
    if (!b_high) hi--;
    if (lo <= hi) alts.push_back(digit_class(lo, hi) + any);
    if (!b_high) alts.push_back("\"" + b.substr(0, 1) + "\" " + fixed_range(std::string(k, '0'), b.substr(1)));
    return alts.size() == 1 ? alts[0] : "( " + join(alts, " | ") + " )";
}

std::string unsigned_range(int64_t lo, int64_t hi) {  // 0 <= lo <= hi, no leading zeros
    std::vector<std::string> alts;
    int64_t low = 0, high = 9;  // the numbers of d digits
    for (int d = 1; d <= 16 && low <= hi; d++) {
        int64_t a = std::max(lo, low), b = std::min(hi, high);
        if (a <= b) alts.push_back(fixed_range(std::to_string(a), std::to_string(b)));
        low = high + 1;
        high = high * 10 + 9;
    }
    return alts.size() == 1 ? alts[0] : "( " + join(alts, " | ") + " )";
}

std::string integer_range(int64_t lo, int64_t hi) {
    std::vector<std::string> alts;
    if (lo < 0) alts.push_back("\"-\" " + unsigned_range(-std::min<int64_t>(hi, -1), -lo));
    if (hi >= 0) alts.push_back(unsigned_range(std::max<int64_t>(lo, 0), hi));
    return join(alts, " | ");
}

class Converter {
public:
    Converter(const json &root, const std::string &root_name) : root_(root), root_name_(root_name) {
        taken_.insert(root_name);
        refs_[""] = root_name;  // "$ref": "#"
    }

    std::string run() {
        std::string out = root_name_ + " ::= " + body_of(root_, "", root_name_, 0) + "\n";
        for (const auto &[name, body] : rules_) out += name + " ::= " + body + "\n";
        return out;
    }

private:
    [[noreturn]] static void unsupported(const std::string &keyword, const std::string &path, const std::string &why = "") {
        fail(FASTLLM_ERR_UNSUPPORTED, "json_schema: unsupported keyword '%s' at %s%s", keyword.c_str(),
             path.empty() ? "/" : path.c_str(), why.empty() ? "" : (" (" + why + ")").c_str());
    }
    [[noreturn]] static void invalid(const std::string &path, const std::string &what) {
        fail(FASTLLM_ERR_INVALID_ARGUMENT, "json_schema: %s at %s", what.c_str(), path.empty() ? "/" : path.c_str());
    }

    std::string use(const std::string &name) {
        if (used_.insert(name).second)
            for (const Primitive &p : kPrimitives)
                if (name == p.name) {
                    for (const char *u : p.uses) use(u);
                    taken_.insert(p.name);
                    rules_.emplace_back(p.name, p.body);
                }
        return name;
    }

    std::string fresh_name(const std::string &hint) {
        std::string base;
        for (char c : hint.substr(0, 48)) {
            bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
            if (ok) base += c;
            else if (!base.empty() && base.back() != '-') base += '-';
        }
        if (base.empty()) base = "rule";
        std::string name = base;
        for (int i = 2; taken_.count(name) || name.compare(0, 5, "json-") == 0 || name == "ws"; i++)
            name = base + "-" + std::to_string(i);
        taken_.insert(name);
        return name;
    }

    // A rule for body (a new one, or the one that already has this body), or body itself when it
    // already is a single rule name.
    std::string rule(const std::string &hint, const std::string &body) {
        if (!body.empty() && body.find_first_of(" \"[(|") == std::string::npos) return body;
        auto it = by_body_.find(body);
        if (it != by_body_.end()) return it->second;
        std::string name = fresh_name(hint);
        rules_.emplace_back(name, body);
        by_body_.emplace(body, name);
        return name;
    }

    std::string rule_of(const json &s, const std::string &path, const std::string &hint, int depth) {
        return rule(hint, body_of(s, path, hint, depth));
    }

    // The GBNF alternatives that match what schema s accepts.
    std::string body_of(const json &s, const std::string &path, const std::string &hint, int depth) {
        if (depth > kMaxDepth) fail(FASTLLM_ERR_UNSUPPORTED, "json_schema: the schema nests deeper than %d levels at %s",
                                    kMaxDepth, path.c_str());
        if (s.is_boolean()) {
            if (s.get<bool>()) return use("json-value");
            invalid(path, "the schema 'false' matches nothing");
        }
        if (!s.is_object()) invalid(path, std::string("a schema must be an object or a boolean, not ") + s.type_name());
        std::vector<std::string> constraints;  // the handled keywords present, but for $defs
        for (const auto &[key, value] : s.items()) {
            if (kIgnored.count(key)) continue;
            if (!kHandled.count(key)) unsupported(key, path);
            if (key == "uniqueItems") {
                if (!value.is_boolean()) invalid(path, "'uniqueItems' must be a boolean");
                if (value.get<bool>()) unsupported(key, path, "true is not enforced");
                continue;
            }
            if (key != "$defs" && key != "definitions") constraints.push_back(key);
        }
        auto alone = [&](const char *keyword) {  // keywords that cannot be combined with others here
            for (const std::string &k : constraints)
                if (k != keyword) unsupported(k, path, std::string("next to '") + keyword + "'");
        };
        if (s.contains("$ref")) {
            alone("$ref");
            return ref(s["$ref"], path + "/$ref", depth);
        }
        if (s.contains("allOf")) return body_of(merge_all_of(s, path), path, hint, depth + 1);
        for (const char *key : {"anyOf", "oneOf"}) {
            if (!s.contains(key)) continue;
            alone(key);
            const json &list = s[key];
            if (!list.is_array() || list.empty()) invalid(path, std::string("'") + key + "' must be a non-empty array");
            std::vector<std::string> alts;
            for (size_t i = 0; i < list.size(); i++) {
                if (list[i].is_boolean() && !list[i].get<bool>()) continue;  // matches nothing: no alternative
                alts.push_back(rule_of(list[i], path + "/" + key + "/" + std::to_string(i), hint + "-" + std::to_string(i),
                                       depth + 1));
            }
            if (alts.empty()) invalid(path, std::string("no alternative of '") + key + "' can match");
            return join(alts, " | ");
        }
        std::vector<std::string> types = types_of(s, path);
        if (s.contains("const")) return literal(s["const"].dump());
        if (s.contains("enum")) {
            const json &values = s["enum"];
            if (!values.is_array() || values.empty()) invalid(path, "'enum' must be a non-empty array");
            std::vector<std::string> alts;
            for (const json &v : values)
                if (types.empty() || std::any_of(types.begin(), types.end(), [&](const std::string &t) { return is_a(v, t); }))
                    alts.push_back(literal(v.dump()));
            if (alts.empty()) invalid(path, "no value of 'enum' has the schema's type");
            return join(alts, " | ");
        }
        if (types.empty()) return use("json-value");
        std::vector<std::string> alts;
        for (const std::string &t : types) {
            std::string body = typed_body(s, t, path, types.size() > 1 ? hint + "-" + t : hint, depth);
            alts.push_back(types.size() > 1 ? rule(hint + "-" + t, body) : body);
        }
        return join(alts, " | ");
    }

    static bool is_a(const json &v, const std::string &type) {
        if (type == "integer") return v.is_number_integer() || (v.is_number_float() && std::floor(v.get<double>()) == v.get<double>());
        if (type == "number") return v.is_number();
        if (type == "string") return v.is_string();
        if (type == "boolean") return v.is_boolean();
        if (type == "null") return v.is_null();
        if (type == "object") return v.is_object();
        return v.is_array();
    }

    // The schema's types: "type" (a name or a list of names), else what its keywords imply.
    std::vector<std::string> types_of(const json &s, const std::string &path) {
        std::vector<std::string> types;
        if (s.contains("type")) {
            const json &t = s["type"];
            std::vector<json> names = t.is_array() ? std::vector<json>(t.begin(), t.end()) : std::vector<json>{t};
            if (names.empty()) invalid(path, "'type' must not be an empty list");
            for (const json &n : names) {
                if (!n.is_string() || !kTypes.count(n.get<std::string>()))
                    invalid(path, "'type' must be one of string, number, integer, boolean, null, object, array (or a list "
                                  "of them), not " + n.dump());
                if (std::find(types.begin(), types.end(), n.get<std::string>()) == types.end())
                    types.push_back(n.get<std::string>());
            }
            return types;
        }
        auto has = [&](std::initializer_list<const char *> keys) {
            return std::any_of(keys.begin(), keys.end(), [&](const char *k) { return s.contains(k); });
        };
        if (has({"properties", "required", "additionalProperties"})) types.push_back("object");
        if (has({"items", "prefixItems", "minItems", "maxItems"})) types.push_back("array");
        if (has({"minLength", "maxLength", "format"})) types.push_back("string");
        if (has({"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"})) types.push_back("number");
        return types;
    }

    std::string typed_body(const json &s, const std::string &type, const std::string &path, const std::string &hint,
                           int depth) {
        if (type == "string") return string_body(s, path);
        if (type == "integer") return integer_body(s, path);
        if (type == "number") {
            for (const char *k : {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"})
                if (s.contains(k)) unsupported(k, path, "bounds are supported for type integer only");
            return use("json-number");
        }
        if (type == "boolean") return use("json-bool");
        if (type == "null") return use("json-null");
        if (type == "object") return object_body(s, path, hint, depth);
        return array_body(s, path, hint, depth);
    }

    // A non-negative count keyword (minLength, maxItems, ...), or dflt when absent.
    static int64_t count_of(const json &s, const char *key, const std::string &path, int64_t dflt) {
        if (!s.contains(key)) return dflt;
        const json &v = s[key];
        double d = v.is_number() ? v.get<double>() : -1;
        if (!(d >= 0) || std::floor(d) != d) invalid(path, std::string("'") + key + "' must be a non-negative integer");
        if (d > (double)kMaxCount) unsupported(key, path, "values above " + std::to_string(kMaxCount));
        return (int64_t)d;
    }

    std::string string_body(const json &s, const std::string &path) {
        if (s.contains("format")) {
            const json &f = s["format"];
            if (!f.is_string()) invalid(path, "'format' must be a string");
            const std::string name = f.get<std::string>();
            if (name != "date" && name != "time" && name != "date-time" && name != "uuid")
                unsupported("format", path, "'" + name + "'; supported: date, time, date-time, uuid");
            for (const char *k : {"minLength", "maxLength"})
                if (s.contains(k)) unsupported(k, path, "next to 'format'");
            return "\"\\\"\" " + use("json-" + name) + " \"\\\"\"";
        }
        const int64_t min = count_of(s, "minLength", path, 0), max = count_of(s, "maxLength", path, -1);
        if (max >= 0 && max < min) invalid(path, "'maxLength' is below 'minLength': nothing matches");
        if (min == 0 && max < 0) return use("json-string");
        use("json-char");
        return "\"\\\"\" json-char" + repeat(min, max) + " \"\\\"\"";
    }

    std::string integer_body(const json &s, const std::string &path) {
        double lo = -(double)kMaxInt, hi = (double)kMaxInt;
        bool bounded = false;
        auto number = [&](const char *key) {
            if (!s[key].is_number()) invalid(path, std::string("'") + key + "' must be a number");
            bounded = true;
            return s[key].get<double>();
        };
        // draft 4 wrote exclusiveMinimum / exclusiveMaximum as booleans that modify minimum / maximum
        auto exclusive_flag = [&](const char *key) { return s.contains(key) && s[key].is_boolean() && s[key].get<bool>(); };
        if (s.contains("minimum")) {
            double v = number("minimum");
            lo = std::max(lo, exclusive_flag("exclusiveMinimum") ? std::floor(v) + 1 : std::ceil(v));
        }
        if (s.contains("maximum")) {
            double v = number("maximum");
            hi = std::min(hi, exclusive_flag("exclusiveMaximum") ? std::ceil(v) - 1 : std::floor(v));
        }
        if (s.contains("exclusiveMinimum") && !s["exclusiveMinimum"].is_boolean())
            lo = std::max(lo, std::floor(number("exclusiveMinimum")) + 1);
        if (s.contains("exclusiveMaximum") && !s["exclusiveMaximum"].is_boolean())
            hi = std::min(hi, std::ceil(number("exclusiveMaximum")) - 1);
        if (!bounded) return use("json-int");
        lo = std::max(lo, -(double)kMaxInt);  // an integer of more than 16 digits is not generated
        hi = std::min(hi, (double)kMaxInt);
        if (lo > hi) invalid(path, "the bounds leave no integer of at most 16 digits");
        return integer_range((int64_t)lo, (int64_t)hi);
    }

    std::string object_body(const json &s, const std::string &path, const std::string &hint, int depth) {
        static const json kEmpty = json::object();
        const json &props = s.contains("properties") ? s["properties"] : kEmpty;
        if (!props.is_object()) invalid(path, "'properties' must be an object");
        std::vector<std::string> required;
        if (s.contains("required")) {
            const json &r = s["required"];
            if (!r.is_array()) invalid(path, "'required' must be an array of strings");
            for (const json &n : r) {
                if (!n.is_string()) invalid(path, "'required' must be an array of strings");
                if (std::find(required.begin(), required.end(), n.get<std::string>()) == required.end())
                    required.push_back(n.get<std::string>());
            }
        }
        // Extra properties: what additionalProperties says; unsaid, none when "properties" is there
        // (llama.cpp's choice, and what OpenAI's strict mode requires), any when it is not.
        const json *extra = nullptr;  // the schema of extra values; nullptr: none allowed
        static const json kAny = true;
        if (s.contains("additionalProperties")) {
            const json &a = s["additionalProperties"];
            if (!a.is_boolean() && !a.is_object()) invalid(path, "'additionalProperties' must be a boolean or a schema");
            if (!(a.is_boolean() && !a.get<bool>())) extra = &a;
        } else if (!s.contains("properties")) {
            extra = &kAny;
        }
        struct Prop {
            std::string kv;
            bool required;
        };
        std::vector<Prop> list;
        std::vector<std::string> names;
        auto add = [&](const std::string &name, const std::string &value, bool req) {
            names.push_back(name);
            list.push_back({rule(hint + "-" + name + "-kv", literal(json(name).dump()) + " \":\" " + use("ws") + " " + value),
                            req});
        };
        for (const auto &[name, sub] : props.items()) {
            const std::string at = path + "/properties/" + pointer_token(name);
            const bool req = std::find(required.begin(), required.end(), name) != required.end();
            if (sub.is_boolean() && !sub.get<bool>()) {  // the property must not appear
                if (req) invalid(at, "a required property whose schema is 'false': nothing matches");
                names.push_back(name);
                continue;
            }
            add(name, rule_of(sub, at, hint + "-" + name, depth + 1), req);
        }
        for (const std::string &name : required) {
            if (props.contains(name)) continue;
            if (!extra)
                invalid(path, "required property '" + name + "' is not in 'properties' and additionalProperties is "
                              "false: nothing matches");
            add(name, rule_of(*extra, path + "/additionalProperties", hint + "-additional", depth + 1), true);
        }
        std::string extra_kv;
        if (extra) {
            std::string value = rule_of(*extra, path + "/additionalProperties", hint + "-additional", depth + 1);
            extra_kv = rule(hint + "-additional-kv", key_excluding(names, hint) + " \":\" " + use("ws") + " " + value);
        }
        // From property i on: rest(i) when something came before (each one then starts with a
        // comma), first(i) when nothing did and something must follow ("" stands for nothing).
        // Made on demand, from the end.
        const size_t n = list.size();
        std::vector<std::string> rest_of(n + 1), first_of(n + 1);
        std::vector<char> have_rest(n + 1, 0), have_first(n + 1, 0);
        std::function<std::string(size_t)> rest = [&](size_t i) -> std::string {
            if (!have_rest[i]) {
                have_rest[i] = 1;
                if (i == n) {
                    rest_of[i] = extra ? rule(hint + "-rest", "( \",\" ws " + extra_kv + " )*") : "";
                } else {
                    const std::string next = rest(i + 1);
                    const std::string with = "\",\" ws " + list[i].kv + (next.empty() ? "" : " " + next);
                    rest_of[i] = rule(hint + "-rest", list[i].required ? with
                                                      : next.empty()   ? "( " + with + " )?"
                                                                       : with + " | " + next);
                }
            }
            return rest_of[i];
        };
        std::function<std::string(size_t)> first = [&](size_t i) -> std::string {
            if (!have_first[i]) {
                have_first[i] = 1;
                if (i == n) {
                    first_of[i] = extra ? rule(hint + "-first", extra_kv + " " + rest(n)) : "";
                } else {
                    const std::string next = rest(i + 1);
                    const std::string with = list[i].kv + (next.empty() ? "" : " " + next);
                    const std::string later = list[i].required ? "" : first(i + 1);
                    first_of[i] = rule(hint + "-first", later.empty() ? with : with + " | " + later);
                }
            }
            return first_of[i];
        };
        const std::string f0 = first(0);
        const bool any_required = std::any_of(list.begin(), list.end(), [](const Prop &p) { return p.required; });
        if (f0.empty()) return "\"{\" " + use("ws") + " \"}\"";
        if (any_required) return "\"{\" " + use("ws") + " " + f0 + " ws \"}\"";
        return "\"{\" " + use("ws") + " ( " + f0 + " ws )? \"}\"";
    }

    // Arrays: prefixItems first (all of them: a shorter tuple is not generated), then items up to
    // the counts. Without items, a tuple has no more elements and a plain array takes any values.
    std::string array_body(const json &s, const std::string &path, const std::string &hint, int depth) {
        std::vector<std::string> prefix;
        const json *items = nullptr;  // nullptr: no further elements
        static const json kAny = true;
        const char *prefix_key = s.contains("prefixItems") ? "prefixItems" : nullptr;
        if (s.contains("items") && s["items"].is_array()) {  // draft 7's tuple form
            if (prefix_key) invalid(path, "'items' as a list next to 'prefixItems'");
            prefix_key = "items";
        } else if (s.contains("items")) {
            const json &i = s["items"];
            if (!i.is_boolean() && !i.is_object()) invalid(path, "'items' must be a schema");
            if (!(i.is_boolean() && !i.get<bool>())) items = &i;
        } else if (!prefix_key) {
            items = &kAny;
        }
        if (prefix_key) {
            const json &list = s[prefix_key];
            if (!list.is_array()) invalid(path, std::string("'") + prefix_key + "' must be an array of schemas");
            for (size_t i = 0; i < list.size(); i++)
                prefix.push_back(rule_of(list[i], path + "/" + prefix_key + "/" + std::to_string(i),
                                         hint + "-" + std::to_string(i), depth + 1));
        }
        const int64_t min = count_of(s, "minItems", path, 0), max = count_of(s, "maxItems", path, -1);
        if (max >= 0 && max < min) invalid(path, "'maxItems' is below 'minItems': nothing matches");
        const int64_t n_prefix = (int64_t)prefix.size();
        if (max >= 0 && max < n_prefix) unsupported("maxItems", path, "below the number of prefixItems");
        const std::string item = items ? rule_of(*items, path + "/items", hint + "-item", depth + 1) : "";
        const std::string ws = use("ws");
        if (n_prefix > 0) {
            std::string body = "\"[\" ws " + join(prefix, " \",\" ws ");
            const int64_t extra_min = std::max<int64_t>(0, min - n_prefix), extra_max = max < 0 ? -1 : max - n_prefix;
            if (item.empty() && extra_min > 0) invalid(path, "'minItems' asks for more elements than the tuple has");
            if (!item.empty() && extra_max != 0) body += " ( \",\" ws " + item + " )" + repeat(extra_min, extra_max);
            return body + " ws \"]\"";
        }
        if (item.empty() || max == 0) {
            if (min > 0) invalid(path, "'minItems' asks for elements that 'items' forbids");
            return "\"[\" " + ws + " \"]\"";
        }
        const std::string more = max == 1 ? "" : " ( \",\" ws " + item + " )" + repeat(std::max<int64_t>(min - 1, 0), max < 0 ? -1 : max - 1);
        const std::string elems = item + more;
        return min == 0 ? "\"[\" ws ( " + elems + " ws )? \"]\"" : "\"[\" ws " + elems + " ws \"]\"";
    }

    // A JSON string that is none of names. Along the names' characters the key is followed in a
    // trie (no escapes there: an escape could spell a name's character); one character off every
    // name, anything may follow.
    std::string key_excluding(const std::vector<std::string> &names, const std::string &hint) {
        if (names.empty()) return use("json-string");
        struct Node {
            std::map<uint32_t, size_t> next;
            bool end = false;
        };
        std::vector<Node> trie(1);
        for (const std::string &name : names) {
            size_t at = 0;
            for (uint32_t cp : code_points(name)) {
                auto it = trie[at].next.find(cp);
                if (it == trie[at].next.end()) {
                    trie.emplace_back();
                    it = trie[at].next.emplace(cp, trie.size() - 1).first;
                }
                at = it->second;
            }
            trie[at].end = true;
        }
        use("json-char");
        const std::string tail = rule(hint + "-key-tail", "json-char* \"\\\"\"");
        std::vector<std::string> node_rule(trie.size());
        for (size_t k = trie.size(); k-- > 0;) {  // children were added after their parents
            std::vector<std::string> alts;
            if (!trie[k].end) alts.push_back("\"\\\"\"");
            std::string other = "[^\"\\\\\\x00-\\x1F";
            for (const auto &[cp, child] : trie[k].next) {
                if (cp < 0x20 || cp == '"' || cp == '\\') continue;  // only escaped in a key: never along the trie
                other += class_char(cp);
                alts.push_back("[" + class_char(cp) + "] " + node_rule[child]);
            }
            alts.push_back(other + "] " + tail);
            node_rule[k] = fresh_name(hint + "-key");
            rules_.emplace_back(node_rule[k], join(alts, " | "));
        }
        return rule(hint + "-key", "\"\\\"\" " + node_rule[0]);
    }

    // allOf of object schemas (and the schema's own keywords beside it): one object schema with
    // every property and every required name.
    struct Merged {
        json props = json::object(), required = json::array();
        bool no_extra = false;
    };
    const json &merge_all_of(const json &s, const std::string &path) {
        Merged m;
        merge_part(s, path, m, 0);
        json merged = {{"type", "object"}, {"properties", m.props}, {"required", m.required}};
        if (m.no_extra) merged["additionalProperties"] = false;
        owned_.push_back(std::move(merged));
        return owned_.back();
    }

    void merge_part(const json &part, const std::string &at, Merged &m, int depth) {
        if (depth > kMaxDepth) invalid(at, "'allOf' nests or refers too deep (or in a circle)");
        const json *p = &part;
        if (p->is_object() && p->contains("$ref")) {
            for (const auto &[key, value] : p->items())
                if (key != "$ref" && !kIgnored.count(key) && key != "$defs" && key != "definitions")
                    unsupported(key, at, "next to '$ref'");
            return merge_part(resolve((*p)["$ref"], at + "/$ref"), at + "/$ref", m, depth + 1);
        }
        if (p->is_boolean() && p->get<bool>()) return;
        if (!p->is_object()) invalid(at, "'allOf' parts must be object schemas");
        for (const auto &[key, value] : p->items()) {
            if (kIgnored.count(key) || key == "$defs" || key == "definitions") continue;
            if (key == "allOf") {
                if (!value.is_array() || value.empty()) invalid(at, "'allOf' must be a non-empty array");
                for (size_t i = 0; i < value.size(); i++) merge_part(value[i], at + "/allOf/" + std::to_string(i), m, depth + 1);
            } else if (key == "type") {
                if (value != "object") unsupported("allOf", at, "only parts of type object are merged");
            } else if (key == "properties") {
                if (!value.is_object()) invalid(at, "'properties' must be an object");
                for (const auto &[name, sub] : value.items()) {
                    if (m.props.contains(name)) unsupported("allOf", at, "property '" + name + "' in two parts");
                    m.props[name] = sub;
                }
            } else if (key == "required") {
                if (!value.is_array()) invalid(at, "'required' must be an array of strings");
                for (const json &n : value) m.required.push_back(n);
            } else if (key == "additionalProperties") {
                if (value.is_boolean() && !value.get<bool>()) m.no_extra = true;
                else unsupported("additionalProperties", at, "inside 'allOf' only false is merged");
            } else {
                unsupported(key, at, "inside 'allOf' only object properties are merged");
            }
        }
    }

    const json &resolve(const json &ref, const std::string &path) {
        if (!ref.is_string()) invalid(path, "'$ref' must be a string");
        const std::string r = ref.get<std::string>();
        if (r.empty() || r[0] != '#')
            unsupported("$ref", path, "only references into this schema ('#/$defs/...') are supported, not '" + r + "'");
        try {
            return root_.at(json::json_pointer(r.substr(1)));
        } catch (const json::exception &) {
            invalid(path, "'$ref' '" + r + "' points at nothing in this schema");
        }
    }

    std::string ref(const json &ref, const std::string &path, int depth) {
        const json &target = resolve(ref, path);
        const std::string pointer = ref.get<std::string>().substr(1);
        auto it = refs_.find(pointer);
        if (it != refs_.end()) return it->second;
        const std::string name = fresh_name("ref-" + pointer.substr(pointer.rfind('/') + 1));
        refs_.emplace(pointer, name);  // before the body: the schema may refer to itself
        size_t slot = rules_.size();
        rules_.emplace_back(name, "");
        std::string body = body_of(target, pointer, name, depth + 1);
        rules_[slot].second = body;
        return name;
    }

    const json &root_;
    std::string root_name_;
    std::vector<std::pair<std::string, std::string>> rules_;  // name, body, in the order written
    std::unordered_map<std::string, std::string> by_body_;
    std::set<std::string> taken_, used_;
    std::unordered_map<std::string, std::string> refs_;  // JSON pointer -> its rule
    std::deque<json> owned_;                             // merged allOf schemas
};

}  // namespace

std::string json_schema_to_grammar(std::string_view text) { return json_schema_to_grammar(text, "root"); }

std::string json_schema_to_grammar(std::string_view text, const std::string &root_name) {
    json schema;
    // Deeper JSON is refused while parsing: the walks over it (dump() of a const, the converter)
    // recurse, and a schema never needs that much.
    std::string why;
    switch (parse_json(text, 4 * kMaxDepth, schema, &why)) {
    case JsonParse::TooDeep:
        fail(FASTLLM_ERR_UNSUPPORTED, "json_schema: JSON nested deeper than %d levels", 4 * kMaxDepth);
    case JsonParse::Invalid:
        fail(FASTLLM_ERR_INVALID_ARGUMENT, "json_schema: not valid JSON: %s", why.c_str());
    case JsonParse::Ok:
        break;
    }
    std::string grammar;
    try {
        grammar = Converter(schema, root_name).run();
    } catch (const json::exception &e) {
        fail(FASTLLM_ERR_INVALID_ARGUMENT, "json_schema: %s", e.what());
    }
    try {
        Grammar::parse(root_name == "root" ? grammar : "root ::= " + root_name + "\n" + grammar);
    } catch (const Error &e) {  // e.g. a schema that refers to itself before anything else
        fail(FASTLLM_ERR_INVALID_ARGUMENT, "json_schema: the schema has no grammar the matcher can follow: %s", e.what());
    }
    return grammar;
}

}  // namespace fastllm
