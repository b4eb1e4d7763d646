#include "text/jinja.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <ctime>
#include <functional>
#include <unordered_map>
#include <vector>

#include "base/error.h"
#include "text/unicode.h"

namespace fastllm {
namespace jinja {

using json = nlohmann::ordered_json;

namespace {

// ---------------------------------------------------------------------------------------------
// Values: Python's, as jinja2 sees them.

struct Value;
struct DictData;
struct Args;
class Renderer;
using ListPtr = std::shared_ptr<std::vector<Value>>;
using DictPtr = std::shared_ptr<DictData>;
using Native = std::function<Value(Renderer &, Args &)>;

struct Value {
    enum Kind : uint8_t { UNDEFINED, NONE, BOOL, INT, FLOAT, STRING, LIST, DICT, FUNC };
    Kind kind = UNDEFINED;
    bool b = false;
    int64_t i = 0;
    double f = 0;
    std::string s;  // STRING; for UNDEFINED, what was looked up (for the error a use of it gives)
    ListPtr list;
    DictPtr dict;
    std::shared_ptr<Native> fn;
    bool tuple = false;  // a LIST that Python would hold as a tuple (prints as (a, b))
    bool safe = false;   // a STRING that is markupsafe's Markup (|safe, |escape): what it is added to is escaped
    uint16_t depth = 0;  // a LIST's or DICT's nesting as made (Renderer::seal)

    static Value none() { Value v; v.kind = NONE; return v; }
    static Value boolean(bool x) { Value v; v.kind = BOOL; v.b = x; return v; }
    static Value integer(int64_t x) { Value v; v.kind = INT; v.i = x; return v; }
    static Value number(double x) { Value v; v.kind = FLOAT; v.f = x; return v; }
    static Value string(std::string x) { Value v; v.kind = STRING; v.s = std::move(x); return v; }
    static Value undefined(std::string what) { Value v; v.s = std::move(what); return v; }
    static Value new_list(std::vector<Value> items = {}) {
        Value v; v.kind = LIST; v.list = std::make_shared<std::vector<Value>>(std::move(items)); return v;
    }
    static Value new_dict(bool ns = false);
    static Value pair(Value a, Value b) {
        Value v = new_list({std::move(a), std::move(b)});
        v.tuple = true;
        return v;
    }
    static Value func(Native f) { Value v; v.kind = FUNC; v.fn = std::make_shared<Native>(std::move(f)); return v; }

    bool is_number() const { return kind == BOOL || kind == INT || kind == FLOAT; }
    double as_double() const { return kind == FLOAT ? f : kind == INT ? double(i) : b ? 1.0 : 0.0; }
    int64_t as_int() const { return kind == INT ? i : kind == BOOL ? int64_t(b) : int64_t(f); }
};

bool values_equal(const Value &a, const Value &b);

struct DictData {
    std::vector<std::pair<Value, Value>> items;  // in insertion order, as Python's dict; keys str, int, ...
    bool is_namespace = false;
    const Value *find(const Value &k) const {
        for (auto &kv : items)
            if (values_equal(kv.first, k)) return &kv.second;
        return nullptr;
    }
    const Value *find(const std::string &k) const {
        for (auto &kv : items)
            if (kv.first.kind == Value::STRING && kv.first.s == k) return &kv.second;
        return nullptr;
    }
    void set(const Value &k, Value v) {
        for (auto &kv : items)
            if (values_equal(kv.first, k)) { kv.second = std::move(v); return; }
        items.emplace_back(k, std::move(v));
    }
    void set(const std::string &k, Value v) { set(Value::string(k), std::move(v)); }
    void add(const char *k, Value v) { items.emplace_back(Value::string(k), std::move(v)); }
};

Value Value::new_dict(bool ns) {
    Value v;
    v.kind = DICT;
    v.dict = std::make_shared<DictData>();
    v.dict->is_namespace = ns;
    return v;
}

const char *type_name(const Value &v) {
    switch (v.kind) {
        case Value::UNDEFINED: return "undefined";
        case Value::NONE: return "NoneType";
        case Value::BOOL: return "bool";
        case Value::INT: return "int";
        case Value::FLOAT: return "float";
        case Value::STRING: return "str";
        case Value::LIST: return "list";
        case Value::DICT: return v.dict->is_namespace ? "Namespace" : "dict";
        case Value::FUNC: return "function";
    }
    return "?";
}

bool truthy(const Value &v) {
    switch (v.kind) {
        case Value::UNDEFINED: case Value::NONE: return false;
        case Value::BOOL: return v.b;
        case Value::INT: return v.i != 0;
        case Value::FLOAT: return v.f != 0;
        case Value::STRING: return !v.s.empty();
        case Value::LIST: return !v.list->empty();
        case Value::DICT: return !v.dict->items.empty();
        case Value::FUNC: return true;
    }
    return false;
}

Value from_json(const json &j) {
    switch (j.type()) {
        case json::value_t::null: return Value::none();
        case json::value_t::boolean: return Value::boolean(j.get<bool>());
        case json::value_t::number_integer: return Value::integer(j.get<int64_t>());
        case json::value_t::number_unsigned: {
            uint64_t u = j.get<uint64_t>();
            return u > uint64_t(INT64_MAX) ? Value::number(double(u)) : Value::integer(int64_t(u));
        }
        case json::value_t::number_float: return Value::number(j.get<double>());
        case json::value_t::string: return Value::string(j.get<std::string>());
        case json::value_t::array: {
            Value v = Value::new_list();
            for (auto &e : j) v.list->push_back(from_json(e));
            return v;
        }
        case json::value_t::object: {
            Value v = Value::new_dict();
            for (auto it = j.begin(); it != j.end(); ++it) v.dict->items.emplace_back(Value::string(it.key()), from_json(it.value()));
            return v;
        }
        default: return Value::none();
    }
}

// ---- text helpers (UTF-8; strings index by code point as Python's do)

std::vector<std::string> code_points(const std::string &s) {
    std::vector<std::string> out;
    for (size_t i = 0; i < s.size();) {
        size_t at = i;
        unicode::decode_utf8(s, i);
        out.push_back(s.substr(at, i - at));
    }
    return out;
}

size_t py_len(const std::string &s) {
    size_t n = 0;
    for (unsigned char c : s) n += (c & 0xC0) != 0x80;
    return n;
}

// Python's str.isspace(): Unicode White_Space plus the separators U+001C..U+001F.
bool py_isspace(uint32_t c) {
    return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

// str.strip / lstrip / rstrip: of whitespace when chars is null, else of the code points in chars.
std::string py_strip(const std::string &s, const std::string *chars, bool left, bool right) {
    std::vector<uint32_t> set;
    if (chars)
        for (size_t i = 0; i < chars->size();) set.push_back(unicode::decode_utf8(*chars, i));
    auto strip = [&](uint32_t c) {
        return chars ? std::find(set.begin(), set.end(), c) != set.end() : py_isspace(c);
    };
    size_t begin = 0, end = s.size();
    if (left) {
        while (begin < end) {
            size_t i = begin;
            if (!strip(unicode::decode_utf8(s, i))) break;
            begin = i;
        }
    }
    if (right) {
        while (end > begin) {
            size_t start = end - 1;
            while (start > begin && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) start--;
            size_t i = start;
            if (!strip(unicode::decode_utf8(s, i))) break;
            end = start;
        }
    }
    return s.substr(begin, end - begin);
}

// Case mapping: ASCII only (templates upper- and lower-case role names and keywords).
std::string ascii_lower(std::string s) {
    for (char &c : s)
        if (c >= 'A' && c <= 'Z') c = char(c - 'A' + 'a');
    return s;
}
std::string ascii_upper(std::string s) {
    for (char &c : s)
        if (c >= 'a' && c <= 'z') c = char(c - 'a' + 'A');
    return s;
}
bool ascii_alpha(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }

// Python's repr(float): the shortest digits that read back as x, fixed notation for exponents
// -4..15, else d.ddde+XX.
std::string py_float(double x) {
    if (std::isnan(x)) return "nan";
    if (std::isinf(x)) return x < 0 ? "-inf" : "inf";
    char buf[40];
    int prec = 1;
    for (; prec < 17; prec++) {
        std::snprintf(buf, sizeof buf, "%.*e", prec - 1, x);
        if (std::strtod(buf, nullptr) == x) break;
    }
    std::snprintf(buf, sizeof buf, "%.*e", prec - 1, x);
    std::string m(buf);
    size_t e = m.find('e');
    int exp = std::atoi(m.c_str() + e + 1);
    std::string digits;
    bool neg = m[0] == '-';
    for (size_t k = neg; k < e; k++)
        if (m[k] != '.') digits += m[k];
    std::string out = neg ? "-" : "";
    if (exp >= -4 && exp < 16) {
        if (exp < 0) {
            out += "0." + std::string(size_t(-exp - 1), '0') + digits;
        } else {
            if (digits.size() <= size_t(exp) + 1) digits += std::string(size_t(exp) + 1 - digits.size(), '0');
            out += digits.substr(0, size_t(exp) + 1) + ".";
            std::string frac = digits.substr(size_t(exp) + 1);
            out += frac.empty() ? "0" : frac;
        }
    } else {
        out += digits.substr(0, 1);
        if (digits.size() > 1) out += "." + digits.substr(1);
        char eb[16];
        std::snprintf(eb, sizeof eb, "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
        out += eb;
    }
    return out;
}

std::string py_repr_string(const std::string &s) {
    char q = (s.find('\'') != std::string::npos && s.find('"') == std::string::npos) ? '"' : '\'';
    std::string out(1, q);
    for (size_t i = 0; i < s.size();) {
        size_t at = i;
        uint32_t c = unicode::decode_utf8(s, i);
        if (c == uint32_t(q) || c == '\\') { out += '\\'; out += char(c); }
        else if (c == '\n') out += "\\n";
        else if (c == '\r') out += "\\r";
        else if (c == '\t') out += "\\t";
        else if (c < 0x20 || (c >= 0x7F && c <= 0xA0) || c == unicode::kInvalid) {
            char b[8];
            std::snprintf(b, sizeof b, "\\x%02x", c == unicode::kInvalid ? unsigned(static_cast<unsigned char>(s[at])) : c);
            out += b;
        } else out.append(s, at, i - at);
    }
    return out + q;
}

std::string to_str(const Value &v, bool repr = false);

std::string to_str(const Value &v, bool repr) {
    switch (v.kind) {
        case Value::UNDEFINED: return "";
        case Value::NONE: return "None";
        case Value::BOOL: return v.b ? "True" : "False";
        case Value::INT: return std::to_string(v.i);
        case Value::FLOAT: return py_float(v.f);
        case Value::STRING: return repr ? py_repr_string(v.s) : v.s;
        case Value::LIST: {
            std::string out = v.tuple ? "(" : "[";
            for (size_t k = 0; k < v.list->size(); k++) out += (k ? ", " : "") + to_str((*v.list)[k], true);
            if (v.tuple && v.list->size() == 1) out += ",";
            return out + (v.tuple ? ")" : "]");
        }
        case Value::DICT: {
            std::string out = v.dict->is_namespace ? "<Namespace {" : "{";
            bool first = true;
            for (auto &kv : v.dict->items) {
                out += (first ? "" : ", ") + to_str(kv.first, true) + ": " + to_str(kv.second, true);
                first = false;
            }
            return out + (v.dict->is_namespace ? "}>" : "}");
        }
        case Value::FUNC: return "<function>";
    }
    return "";
}

// Python's json.dumps(..., ensure_ascii=False): the escapes it writes, non-ASCII as is.
void json_string(std::string &out, const std::string &s) {
    out += '"';
    for (unsigned char c : s) {
        switch (c) {
            case '"': out += "\\\""; break;
            case '\\': out += "\\\\"; break;
            case '\n': out += "\\n"; break;
            case '\r': out += "\\r"; break;
            case '\t': out += "\\t"; break;
            case '\b': out += "\\b"; break;
            case '\f': out += "\\f"; break;
            default:
                if (c < 0x20) {
                    char b[8];
                    std::snprintf(b, sizeof b, "\\u%04x", c);
                    out += b;
                } else out += char(c);
        }
    }
    out += '"';
}

bool values_equal(const Value &a, const Value &b) {
    if (a.is_number() && b.is_number()) {
        if (a.kind == Value::FLOAT || b.kind == Value::FLOAT) return a.as_double() == b.as_double();
        return a.as_int() == b.as_int();
    }
    if (a.kind != b.kind) return false;
    switch (a.kind) {
        case Value::UNDEFINED: case Value::NONE: return true;
        case Value::STRING: return a.s == b.s;
        case Value::LIST:
            if (a.list->size() != b.list->size()) return false;
            for (size_t k = 0; k < a.list->size(); k++)
                if (!values_equal((*a.list)[k], (*b.list)[k])) return false;
            return true;
        case Value::DICT: {
            if (a.dict->items.size() != b.dict->items.size()) return false;
            for (auto &kv : a.dict->items) {
                const Value *o = b.dict->find(kv.first);
                if (!o || !values_equal(kv.second, *o)) return false;
            }
            return true;
        }
        case Value::FUNC: return a.fn == b.fn;
        default: return false;
    }
}

// ---------------------------------------------------------------------------------------------
// Lexer

enum TokKind : uint8_t { T_TEXT, T_VAR_BEGIN, T_VAR_END, T_BLOCK_BEGIN, T_BLOCK_END, T_NAME, T_STRING, T_INT, T_FLOAT,
                         T_OP, T_EOF };

struct Token {
    TokKind kind;
    std::string text;  // TEXT, NAME, STRING (unescaped), OP
    int64_t ival = 0;
    double fval = 0;
    size_t at = 0;     // offset in the source
};

[[noreturn]] void fail_at(const std::string &src, size_t at, const std::string &msg) {
    size_t line = 1, col = 1;
    for (size_t k = 0; k < at && k < src.size(); k++) {
        if (src[k] == '\n') { line++; col = 1; }
        else if ((static_cast<unsigned char>(src[k]) & 0xC0) != 0x80) col++;
    }
    throw Error(FASTLLM_ERR_INVALID_ARGUMENT,
                "chat template line " + std::to_string(line) + ", column " + std::to_string(col) + ": " + msg);
}

bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

// Python's str.rstrip(): whitespace including Unicode's (what jinja2's `-` strips)
std::string rstrip_ws(const std::string &s) { return py_strip(s, nullptr, false, true); }

std::string unescape(const std::string &src, size_t at, const std::string &body) {
    std::string out;
    for (size_t k = 0; k < body.size(); k++) {
        char c = body[k];
        if (c != '\\' || k + 1 >= body.size()) { out += c; continue; }
        char e = body[++k];
        auto hex = [&](int n) {
            uint32_t v = 0;
            for (int d = 0; d < n; d++) {
                if (k + 1 >= body.size() || !std::isxdigit(static_cast<unsigned char>(body[k + 1])))
                    fail_at(src, at, "truncated \\x, \\u or \\U escape in a string");
                char h = body[++k];
                v = v * 16 + uint32_t(h <= '9' ? h - '0' : (h | 0x20) - 'a' + 10);
            }
            if (v >= 0x110000) fail_at(src, at, "escape out of the Unicode range");
            unicode::append_utf8(out, v);
        };
        switch (e) {
            case '\n': break;  // a line continuation
            case '\\': out += '\\'; break;
            case '\'': out += '\''; break;
            case '"': out += '"'; break;
            case 'a': out += '\a'; break;
            case 'b': out += '\b'; break;
            case 'f': out += '\f'; break;
            case 'n': out += '\n'; break;
            case 'r': out += '\r'; break;
            case 't': out += '\t'; break;
            case 'v': out += '\v'; break;
            case 'x': hex(2); break;
            case 'u': hex(4); break;
            case 'U': hex(8); break;
            default:
                if (e >= '0' && e <= '7') {
                    uint32_t v = uint32_t(e - '0');
                    for (int d = 0; d < 2 && k + 1 < body.size() && body[k + 1] >= '0' && body[k + 1] <= '7'; d++)
                        v = v * 8 + uint32_t(body[++k] - '0');
                    unicode::append_utf8(out, v);
                } else {
                    out += '\\';
                    out += e;
                }
        }
    }
    return out;
}

class Lexer {
public:
    explicit Lexer(const std::string &src) : src_(src) {}

    std::vector<Token> run() {
        size_t n = src_.size(), pos = 0;
        bool line_starting = true;
        while (pos < n) {
            size_t t = pos;
            while (true) {
                t = src_.find('{', t);
                if (t == std::string::npos || t + 1 >= n) { t = std::string::npos; break; }
                char k = src_[t + 1];
                if (k == '{' || k == '%' || k == '#') break;
                t++;
            }
            if (t == std::string::npos) {
                push_text(src_.substr(pos), pos);
                break;
            }
            std::string text = src_.substr(pos, t - pos);
            char kind = src_[t + 1];
            size_t p = t + 2;
            char sign = (p < n && (src_[p] == '-' || src_[p] == '+')) ? src_[p] : 0;
            if (sign == '-') {
                text = rstrip_ws(text);
            } else if (sign != '+' && kind != '{') {  // lstrip_blocks
                size_t l = text.rfind('\n');
                l = l == std::string::npos ? 0 : l + 1;
                if (l > 0 || line_starting) {
                    bool blank = true;
                    for (size_t k = l; k < text.size(); k++) blank = blank && is_ws(text[k]);
                    if (blank) text.resize(l);
                }
            }
            push_text(text, pos);
            if (sign) p++;
            if (kind == '#') {
                size_t e = src_.find("#}", p);
                if (e == std::string::npos) fail_at(src_, t, "unclosed comment");
                pos = end_of_tag(e, e + 2, true);
            } else {
                size_t begin = toks_.size();
                toks_.push_back({kind == '{' ? T_VAR_BEGIN : T_BLOCK_BEGIN, "", 0, 0, t});
                pos = lex_tag(p, kind == '{');
                // {% raw %} ... {% endraw %}: the text between as it is
                if (kind == '%' && toks_.size() == begin + 3 && toks_[begin + 1].kind == T_NAME &&
                    toks_[begin + 1].text == "raw") {
                    toks_.resize(begin);
                    pos = lex_raw(pos, t);
                }
            }
            line_starting = pos > 0 && src_[pos - 1] == '\n';
        }
        toks_.push_back({T_EOF, "", 0, 0, n});
        return std::move(toks_);
    }

private:
    const std::string &src_;
    std::vector<Token> toks_;

    void push_text(const std::string &text, size_t at) {
        if (!text.empty()) toks_.push_back({T_TEXT, text, 0, 0, at});
    }

    // After a block or comment closes at close_at (its last char before close_end): `-` strips
    // all following whitespace, else trim_blocks drops one line break (`+` keeps it).
    size_t end_of_tag(size_t close_at, size_t close_end, bool block) {
        char before = close_at > 0 ? src_[close_at - 1] : 0;
        size_t pos = close_end;
        if (before == '-') {
            size_t i = pos;
            while (i < src_.size()) {
                size_t j = i;
                if (!py_isspace(unicode::decode_utf8(src_, j))) break;
                i = j;
            }
            pos = i;
        } else if (block && before != '+' && pos < src_.size() && src_[pos] == '\n') {
            pos++;
        }
        return pos;
    }

    size_t lex_tag(size_t p, bool var) {
        const char *close = var ? "}}" : "%}";
        size_t n = src_.size();
        int depth = 0;
        while (true) {
            while (p < n && is_ws(src_[p])) p++;
            if (p >= n) fail_at(src_, toks_.back().at, var ? "unclosed '{{'" : "unclosed '{%'");
            if (depth == 0) {
                bool signed_close = (src_[p] == '-' || src_[p] == '+') && src_.compare(p + 1, 2, close) == 0;
                if (signed_close || src_.compare(p, 2, close) == 0) {
                    size_t c = signed_close ? p + 1 : p;
                    toks_.push_back({var ? T_VAR_END : T_BLOCK_END, "", 0, 0, p});
                    if (var) {
                        size_t pos = c + 2;
                        if (signed_close && src_[p] == '-') pos = end_of_tag(c, c + 2, false);
                        return pos;
                    }
                    return end_of_tag(c, c + 2, true);
                }
            }
            char c = src_[p];
            size_t at = p;
            if (std::isdigit(static_cast<unsigned char>(c))) {
                size_t q = p;
                std::string digits;
                auto run = [&] {
                    while (q < n && (std::isdigit(static_cast<unsigned char>(src_[q])) ||
                                     (src_[q] == '_' && q + 1 < n && std::isdigit(static_cast<unsigned char>(src_[q + 1])))))
                        if (src_[q++] != '_') digits += src_[q - 1];
                };
                run();
                bool is_float = false;
                if (q + 1 < n && src_[q] == '.' && std::isdigit(static_cast<unsigned char>(src_[q + 1]))) {
                    digits += src_[q++];
                    run();
                    is_float = true;
                }
                if (q < n && (src_[q] == 'e' || src_[q] == 'E')) {
                    size_t r = q + 1;
                    if (r < n && (src_[r] == '+' || src_[r] == '-')) r++;
                    if (r < n && std::isdigit(static_cast<unsigned char>(src_[r]))) {
                        digits += 'e';
                        digits.append(src_, q + 1, r - q - 1);
                        q = r;
                        run();
                        is_float = true;
                    }
                }
                Token t{is_float ? T_FLOAT : T_INT, digits, 0, 0, at};
                if (is_float) t.fval = std::strtod(digits.c_str(), nullptr);
                else {
                    errno = 0;
                    t.ival = std::strtoll(digits.c_str(), nullptr, 10);
                    if (errno == ERANGE) fail_at(src_, at, "integer literal out of range");
                }
                toks_.push_back(t);
                p = q;
            } else if (ascii_alpha(c) || c == '_') {
                size_t q = p;
                while (q < n && (ascii_alpha(src_[q]) || src_[q] == '_' || std::isdigit(static_cast<unsigned char>(src_[q]))))
                    q++;
                toks_.push_back({T_NAME, src_.substr(p, q - p), 0, 0, at});
                p = q;
            } else if (c == '\'' || c == '"') {
                size_t q = p + 1;
                while (q < n && src_[q] != c) q += src_[q] == '\\' ? 2 : 1;
                if (q >= n) fail_at(src_, at, "unterminated string");
                toks_.push_back({T_STRING, unescape(src_, at, src_.substr(p + 1, q - p - 1)), 0, 0, at});
                p = q + 1;
            } else {
                static const char *two[] = {"//", "**", "==", "!=", "<=", ">="};
                std::string op;
                for (const char *t2 : two)
                    if (src_.compare(p, 2, t2) == 0) op = t2;
                if (op.empty()) {
                    if (!std::strchr("+-/*%~[](){}<>=.:|,;", c) || c == 0)
                        fail_at(src_, at, std::string("unexpected character '") + c + "'");
                    op = std::string(1, c);
                }
                if (op == "(" || op == "[" || op == "{") depth++;
                if (op == ")" || op == "]" || op == "}") depth = std::max(0, depth - 1);
                toks_.push_back({T_OP, op, 0, 0, at});
                p += op.size();
            }
        }
    }

    // After {% raw %}: the text up to {% endraw %} verbatim.
    size_t lex_raw(size_t pos, size_t tag_at) {
        size_t n = src_.size();
        for (size_t s = src_.find("{%", pos); s != std::string::npos; s = src_.find("{%", s + 2)) {
            size_t q = s + 2;
            char sign = (q < n && (src_[q] == '-' || src_[q] == '+')) ? src_[q++] : 0;
            while (q < n && is_ws(src_[q])) q++;
            if (src_.compare(q, 6, "endraw") != 0) continue;
            q += 6;
            while (q < n && is_ws(src_[q])) q++;
            size_t c = q;
            if (q < n && (src_[q] == '-' || src_[q] == '+')) c = q + 1;
            if (src_.compare(c, 2, "%}") != 0) continue;
            std::string text = src_.substr(pos, s - pos);
            if (sign == '-') text = rstrip_ws(text);
            push_text(text, pos);
            return end_of_tag(c, c + 2, true);
        }
        fail_at(src_, tag_at, "{% raw %} without {% endraw %}");
    }
};

// ---------------------------------------------------------------------------------------------
// Syntax tree

struct Expr;
using ExprP = std::unique_ptr<Expr>;

struct Expr {
    enum Kind : uint8_t { LITERAL, NAME, LIST, DICT, ATTR, ITEM, SLICE, CALL, FILTER, TEST, NEG, POS, NOT, BINARY,
                          AND, OR, COMPARE, COND } kind;
    size_t at = 0;
    Value value;                              // LITERAL
    std::string name;                         // NAME; ATTR's attribute; FILTER / TEST name; BINARY / COMPARE op
    std::vector<ExprP> args;                  // operands, items, or [callee/operand, positional args...]
    std::vector<std::pair<std::string, ExprP>> kwargs;
    bool negated = false;                     // `is not`, `not in`; a LIST that is a tuple
};

struct Stmt;
using StmtP = std::unique_ptr<Stmt>;
using Body = std::vector<StmtP>;

struct Stmt {
    enum Kind : uint8_t { TEXT, OUTPUT, IF, FOR, SET, SET_BLOCK, MACRO, CALL_BLOCK, FILTER_BLOCK, BREAK, CONTINUE,
                          PLAIN_BLOCK } kind;
    size_t at = 0;
    std::string text;                   // TEXT; SET / SET_BLOCK / MACRO name
    std::string attr;                   // SET ns.attr
    std::vector<std::string> names;     // FOR targets; MACRO / CALL_BLOCK parameters
    std::vector<ExprP> exprs;           // OUTPUT [e]; IF conditions; FOR [iter, cond or null]; SET [value];
                                        // MACRO / CALL_BLOCK defaults per parameter (null: none), CALL_BLOCK's call last;
                                        // FILTER_BLOCK [filters applied to the name kBlockText]
    std::vector<Body> bodies;           // IF branches (+ else); FOR [body, else]; others [body]
};

// The name a {% filter %} block's text is bound to while its filters run (no template can spell it).
const char *const kBlockText = "\x01block";

class Parser {
public:
    Parser(const std::string &src, std::vector<Token> toks, int max_depth)
        : src_(src), toks_(std::move(toks)), max_depth_(max_depth) {}

    Body parse_template() {
        std::string end;
        Body b = parse_body({}, &end);
        return b;
    }

private:
    const std::string &src_;
    std::vector<Token> toks_;
    size_t p_ = 0;
    int depth_ = 0, max_depth_;

    struct DepthGuard {
        Parser &p;
        explicit DepthGuard(Parser &parser) : p(parser) {
            if (++p.depth_ > p.max_depth_) fail_at(p.src_, p.peek().at, "nested too deeply");
        }
        ~DepthGuard() { p.depth_--; }
    };

    const Token &peek(size_t k = 0) const { return toks_[std::min(p_ + k, toks_.size() - 1)]; }
    const Token &next() { const Token &t = toks_[p_]; if (p_ + 1 < toks_.size()) p_++; return t; }
    bool is_op(const char *op, size_t k = 0) const { return peek(k).kind == T_OP && peek(k).text == op; }
    bool is_name(const char *n, size_t k = 0) const { return peek(k).kind == T_NAME && peek(k).text == n; }
    [[noreturn]] void fail(const std::string &msg) const { fail_at(src_, peek().at, msg); }
    std::string describe(const Token &t) const {
        switch (t.kind) {
            case T_EOF: return "the end of the template";
            case T_VAR_END: return "'}}'";
            case T_BLOCK_END: return "'%}'";
            case T_TEXT: return "text";
            default: return "'" + t.text + "'";
        }
    }
    void expect_op(const char *op) {
        if (!is_op(op)) fail(std::string("expected '") + op + "', found " + describe(peek()));
        next();
    }
    std::string expect_name() {
        if (peek().kind != T_NAME) fail("expected a name, found " + describe(peek()));
        return next().text;
    }
    void expect_block_end() {
        if (peek().kind != T_BLOCK_END) fail("expected '%}', found " + describe(peek()));
        next();
    }

    // Statements up to one of end_tags ({% tag %} consumed up to the tag's name); *which is the tag.
    Body parse_body(std::initializer_list<const char *> end_tags, std::string *which) {
        DepthGuard g(*this);
        Body body;
        while (true) {
            const Token &t = peek();
            if (t.kind == T_EOF) {
                if (end_tags.size()) fail(std::string("missing {% ") + *end_tags.begin() + " %}");
                *which = "";
                return body;
            }
            if (t.kind == T_TEXT) {
                auto s = std::make_unique<Stmt>();
                s->kind = Stmt::TEXT;
                s->at = t.at;
                s->text = t.text;
                body.push_back(std::move(s));
                next();
            } else if (t.kind == T_VAR_BEGIN) {
                auto s = std::make_unique<Stmt>();
                s->kind = Stmt::OUTPUT;
                s->at = next().at;
                s->exprs.push_back(parse_expr());
                if (peek().kind != T_VAR_END) fail("expected '}}', found " + describe(peek()));
                next();
                body.push_back(std::move(s));
            } else if (t.kind == T_BLOCK_BEGIN) {
                next();
                const Token &name = peek();
                if (name.kind != T_NAME) fail("expected a statement name, found " + describe(name));
                for (const char *e : end_tags)
                    if (name.text == e) {
                        *which = e;
                        next();
                        return body;
                    }
                body.push_back(parse_statement());
            } else {
                fail("unexpected " + describe(t));
            }
        }
    }

    StmtP parse_statement() {
        const Token &tag = next();
        auto s = std::make_unique<Stmt>();
        s->at = tag.at;
        const std::string &n = tag.text;
        std::string which;
        if (n == "if") {
            s->kind = Stmt::IF;
            s->exprs.push_back(parse_expr());
            expect_block_end();
            while (true) {
                s->bodies.push_back(parse_body({"endif", "elif", "else"}, &which));
                if (which == "elif") {
                    s->exprs.push_back(parse_expr());
                    expect_block_end();
                } else if (which == "else") {
                    expect_block_end();
                    s->bodies.push_back(parse_body({"endif"}, &which));
                    expect_block_end();
                    break;
                } else {
                    expect_block_end();
                    break;
                }
            }
        } else if (n == "for") {
            s->kind = Stmt::FOR;
            s->names.push_back(expect_name());
            while (is_op(",")) {
                next();
                s->names.push_back(expect_name());
            }
            if (!is_name("in")) fail("expected 'in', found " + describe(peek()));
            next();
            s->exprs.push_back(parse_or());
            if (is_name("if")) {
                next();
                s->exprs.push_back(parse_or());
            } else s->exprs.push_back(nullptr);
            if (is_name("recursive")) fail("recursive loops are not supported");
            expect_block_end();
            s->bodies.push_back(parse_body({"endfor", "else"}, &which));
            expect_block_end();
            if (which == "else") {
                s->bodies.push_back(parse_body({"endfor"}, &which));
                expect_block_end();
            }
        } else if (n == "set") {
            s->text = expect_name();
            if (is_op(".")) {
                next();
                s->attr = expect_name();
            }
            if (is_op("=")) {
                next();
                s->kind = Stmt::SET;
                s->exprs.push_back(parse_expr());
                expect_block_end();
            } else {
                if (!s->attr.empty()) fail("expected '='");
                s->kind = Stmt::SET_BLOCK;
                expect_block_end();
                s->bodies.push_back(parse_body({"endset"}, &which));
                expect_block_end();
            }
        } else if (n == "macro" || n == "call") {
            s->kind = n == "macro" ? Stmt::MACRO : Stmt::CALL_BLOCK;
            if (n == "macro") s->text = expect_name();
            if (n == "macro" || is_op("(")) {
                expect_op("(");
                while (!is_op(")")) {
                    s->names.push_back(expect_name());
                    if (is_op("=")) {
                        next();
                        s->exprs.push_back(parse_expr());
                    } else s->exprs.push_back(nullptr);
                    if (!is_op(",")) break;
                    next();
                }
                expect_op(")");
            }
            if (n == "call") {
                ExprP call = parse_expr();
                if (call->kind != Expr::CALL) fail_at(src_, call->at, "{% call %} needs a call");
                s->exprs.push_back(std::move(call));
            }
            expect_block_end();
            s->bodies.push_back(parse_body({n == "macro" ? "endmacro" : "endcall"}, &which));
            if (n == "macro" && peek().kind == T_NAME) next();  // {% endmacro name %}
            expect_block_end();
        } else if (n == "filter") {
            s->kind = Stmt::FILTER_BLOCK;
            auto placeholder = std::make_unique<Expr>();  // the block's text, bound when it runs
            placeholder->kind = Expr::NAME;
            placeholder->name = kBlockText;
            placeholder->at = tag.at;
            ExprP f = make(Expr::FILTER, peek().at);  // {% filter name(args) | more %}
            f->name = expect_name();
            f->args.push_back(std::move(placeholder));
            if (is_op("(")) parse_call_args(*f);
            s->exprs.push_back(parse_filter(std::move(f)));
            expect_block_end();
            s->bodies.push_back(parse_body({"endfilter"}, &which));
            expect_block_end();
        } else if (n == "break" || n == "continue") {
            s->kind = n == "break" ? Stmt::BREAK : Stmt::CONTINUE;
            expect_block_end();
        } else if (n == "generation") {  // transformers' tag marking the assistant's text: renders its body
            s->kind = Stmt::PLAIN_BLOCK;
            expect_block_end();
            s->bodies.push_back(parse_body({"endgeneration"}, &which));
            expect_block_end();
        } else {
            fail_at(src_, tag.at, "unknown statement '" + n + "'");
        }
        return s;
    }

    ExprP make(Expr::Kind k, size_t at) {
        auto e = std::make_unique<Expr>();
        e->kind = k;
        e->at = at;
        return e;
    }

    // expr: or-expression [if or-expression [else expr]]
    ExprP parse_expr() {
        DepthGuard g(*this);
        ExprP e = parse_or();
        if (is_name("if")) {
            size_t at = next().at;
            ExprP c = make(Expr::COND, at);
            ExprP cond = parse_or();
            ExprP other;
            if (is_name("else")) {
                next();
                other = parse_expr();
            }
            c->args.push_back(std::move(e));
            c->args.push_back(std::move(cond));
            c->args.push_back(std::move(other));
            return c;
        }
        return e;
    }

    ExprP parse_or() {
        ExprP e = parse_and();
        while (is_name("or")) {
            ExprP o = make(Expr::OR, next().at);
            o->args.push_back(std::move(e));
            o->args.push_back(parse_and());
            e = std::move(o);
        }
        return e;
    }
    ExprP parse_and() {
        ExprP e = parse_not();
        while (is_name("and")) {
            ExprP o = make(Expr::AND, next().at);
            o->args.push_back(std::move(e));
            o->args.push_back(parse_not());
            e = std::move(o);
        }
        return e;
    }
    ExprP parse_not() {
        if (is_name("not")) {
            DepthGuard g(*this);
            ExprP o = make(Expr::NOT, next().at);
            o->args.push_back(parse_not());
            return o;
        }
        return parse_compare();
    }
    ExprP parse_compare() {
        ExprP e = parse_binary(0);
        while (true) {
            std::string op;
            bool negated = false;
            size_t at = peek().at;
            if (peek().kind == T_OP && (peek().text == "==" || peek().text == "!=" || peek().text == "<" ||
                                        peek().text == "<=" || peek().text == ">" || peek().text == ">=")) {
                op = next().text;
            } else if (is_name("in")) {
                next();
                op = "in";
            } else if (is_name("not") && is_name("in", 1)) {
                next();
                next();
                op = "in";
                negated = true;
            } else break;
            ExprP c = make(Expr::COMPARE, at);
            c->name = op;
            c->negated = negated;
            c->args.push_back(std::move(e));
            c->args.push_back(parse_binary(0));
            e = std::move(c);
        }
        return e;
    }
    // The binary operators from the loosest level to the tightest, each left-associative:
    // ~, then + -, then * / // %, then **.
    static constexpr int kBinaryLevels = 4;
    bool binary_op_at(int level) const {
        static const std::vector<std::vector<std::string>> ops = {{"~"}, {"+", "-"}, {"*", "/", "//", "%"}, {"**"}};
        if (peek().kind != T_OP) return false;
        for (const auto &o : ops[size_t(level)])
            if (peek().text == o) return true;
        return false;
    }
    ExprP parse_binary(int level) {
        if (level == kBinaryLevels) return parse_unary(true);
        ExprP e = parse_binary(level + 1);
        while (binary_op_at(level)) {
            const Token &t = next();
            ExprP b = make(Expr::BINARY, t.at);
            b->name = t.text;
            b->args.push_back(std::move(e));
            b->args.push_back(parse_binary(level + 1));
            e = std::move(b);
        }
        return e;
    }
    ExprP parse_unary(bool with_filter) {
        DepthGuard g(*this);
        ExprP e;
        if (is_op("-") || is_op("+")) {
            const Token &t = next();
            e = make(t.text == "-" ? Expr::NEG : Expr::POS, t.at);
            e->args.push_back(parse_unary(false));
        } else {
            e = parse_primary();
        }
        e = parse_postfix(std::move(e));
        if (with_filter) e = parse_filter(std::move(e));
        return e;
    }
    ExprP parse_primary() {
        const Token &t = peek();
        if (t.kind == T_NAME) {
            next();
            if (t.text == "true" || t.text == "True") return literal(Value::boolean(true), t.at);
            if (t.text == "false" || t.text == "False") return literal(Value::boolean(false), t.at);
            if (t.text == "none" || t.text == "None") return literal(Value::none(), t.at);
            ExprP e = make(Expr::NAME, t.at);
            e->name = t.text;
            return e;
        }
        if (t.kind == T_STRING) {
            std::string s;
            size_t at = t.at;
            while (peek().kind == T_STRING) s += next().text;  // adjacent literals join, as in Python
            return literal(Value::string(s), at);
        }
        if (t.kind == T_INT) { next(); return literal(Value::integer(t.ival), t.at); }
        if (t.kind == T_FLOAT) { next(); return literal(Value::number(t.fval), t.at); }
        if (is_op("(")) {
            size_t at = next().at;
            if (is_op(")")) {
                next();
                ExprP l = make(Expr::LIST, at);  // () is an empty tuple
                l->negated = true;
                return l;
            }
            ExprP e = parse_expr();
            if (is_op(",")) {  // a tuple
                ExprP l = make(Expr::LIST, at);
                l->negated = true;  // (marks the tuple)
                l->args.push_back(std::move(e));
                while (is_op(",")) {
                    next();
                    if (is_op(")")) break;
                    l->args.push_back(parse_expr());
                }
                e = std::move(l);
            }
            expect_op(")");
            return e;
        }
        if (is_op("[")) {
            ExprP l = make(Expr::LIST, next().at);
            while (!is_op("]")) {
                l->args.push_back(parse_expr());
                if (!is_op(",")) break;
                next();
            }
            expect_op("]");
            return l;
        }
        if (is_op("{")) {
            ExprP d = make(Expr::DICT, next().at);
            while (!is_op("}")) {
                d->args.push_back(parse_expr());
                expect_op(":");
                d->args.push_back(parse_expr());
                if (!is_op(",")) break;
                next();
            }
            expect_op("}");
            return d;
        }
        fail("unexpected " + describe(t));
    }
    ExprP literal(Value v, size_t at) {
        ExprP e = make(Expr::LITERAL, at);
        e->value = std::move(v);
        return e;
    }
    void parse_call_args(Expr &e) {
        expect_op("(");
        while (!is_op(")")) {
            if (peek().kind == T_NAME && is_op("=", 1)) {
                std::string k = next().text;
                next();
                e.kwargs.emplace_back(k, parse_expr());
            } else {
                if (!e.kwargs.empty()) fail("a positional argument follows a keyword argument");
                e.args.push_back(parse_expr());
            }
            if (!is_op(",")) break;
            next();
        }
        expect_op(")");
    }
    ExprP parse_postfix(ExprP e) {
        while (true) {
            if (is_op(".")) {
                size_t at = next().at;
                ExprP a = make(Expr::ATTR, at);
                if (peek().kind == T_INT) {  // x.0: an item
                    a->kind = Expr::ITEM;
                    a->args.push_back(std::move(e));
                    a->args.push_back(literal(Value::integer(next().ival), at));
                } else {
                    a->name = expect_name();
                    a->args.push_back(std::move(e));
                }
                e = std::move(a);
            } else if (is_op("[")) {
                size_t at = next().at;
                ExprP idx[3];
                bool slice = false;
                for (int k = 0; k < 3; k++) {
                    if (!is_op(":") && !is_op("]")) idx[k] = parse_expr();
                    if (k < 2 && is_op(":")) {
                        next();
                        slice = true;
                    } else break;
                }
                expect_op("]");
                ExprP s = make(slice ? Expr::SLICE : Expr::ITEM, at);
                s->args.push_back(std::move(e));
                if (!slice && !idx[0]) fail_at(src_, at, "empty subscript");
                for (int k = 0; k < (slice ? 3 : 1); k++) s->args.push_back(std::move(idx[k]));
                e = std::move(s);
            } else if (is_op("(")) {
                ExprP c = make(Expr::CALL, peek().at);
                c->args.push_back(std::move(e));
                parse_call_args(*c);
                e = std::move(c);
            } else return e;
        }
    }
    ExprP parse_filter(ExprP e) {
        while (true) {
            if (is_op("|")) {
                size_t at = next().at;
                ExprP f = make(Expr::FILTER, at);
                f->name = expect_name();
                while (is_op(".")) {  // a dotted filter name
                    next();
                    f->name += "." + expect_name();
                }
                f->args.push_back(std::move(e));
                if (is_op("(")) parse_call_args(*f);
                e = std::move(f);
            } else if (is_name("is")) {
                size_t at = next().at;
                ExprP t = make(Expr::TEST, at);
                if (is_name("not")) {
                    next();
                    t->negated = true;
                }
                t->name = expect_name();
                t->args.push_back(std::move(e));
                if (is_op("(")) parse_call_args(*t);
                else if (peek().kind == T_STRING || peek().kind == T_INT || peek().kind == T_FLOAT ||
                         (peek().kind == T_NAME && !is_name("and") && !is_name("or") && !is_name("else") &&
                          !is_name("if") && !is_name("in") && !is_name("not") && !is_name("is")))
                    t->args.push_back(parse_primary());  // `is divisibleby 3`, `is sameas none`
                e = std::move(t);
            } else return e;
        }
    }
};

// ---------------------------------------------------------------------------------------------
// Evaluation

struct Args {
    std::vector<Value> pos;
    std::vector<std::pair<std::string, Value>> kw;
    size_t at = 0;

    // Argument i by position or by name, or the default (UNDEFINED when none given).
    Value get(size_t i, const char *name, Value dflt = Value()) const {
        if (i < pos.size()) return pos[i];
        for (auto &kv : kw)
            if (kv.first == name) return kv.second;
        return dflt;
    }
};

class Renderer {
public:
    Renderer(const std::string &src, const Limits &lim) : src_(src), lim_(lim) {}

    [[noreturn]] void fail(size_t at, const std::string &msg) const { fail_at(src_, at, msg); }

    void step(size_t at, uint64_t n = 1) {
        steps_ += n;
        if (steps_ > lim_.max_steps)
            fail(at, "the template ran past " + std::to_string(lim_.max_steps) + " steps (a loop without end?)");
    }
    // A string of n bytes made by copying costs a step per 256 bytes, so that copying a large string
    // over and over ends at the step limit too.
    void charge(size_t at, size_t n) { step(at, n >> 8); }
    // Containers nest at most kMaxNesting levels: printing, comparing, writing JSON and freeing a
    // value recurse over it, and a hostile template could otherwise nest a value a million deep.
    // seal() records a new container's depth from its items' records; a namespace, the one
    // mutable container, has what is assigned into it measured in full (check_nesting), which
    // also refuses cycles (ns.x = [ns]).
    static constexpr int kMaxNesting = 256;
    void seal(Value &v, size_t at) {
        int d = 0;
        if (v.kind == Value::LIST)
            for (const auto &x : *v.list) d = std::max<int>(d, x.depth);
        else if (v.kind == Value::DICT)
            for (const auto &kv : v.dict->items) d = std::max<int>(d, kv.second.depth);
        else return;
        if (d + 1 > kMaxNesting) fail(at, "values nested deeper than " + std::to_string(kMaxNesting) + " levels");
        v.depth = uint16_t(d + 1);
    }
    int check_nesting(const Value &v, size_t at, int level = 0) {
        if (level > kMaxNesting)
            fail(at, "values nested deeper than " + std::to_string(kMaxNesting) + " levels (or a namespace that holds itself)");
        int d = 0;
        if (v.kind == Value::LIST)
            for (const auto &x : *v.list) { step(at); d = std::max(d, check_nesting(x, at, level + 1)); }
        else if (v.kind == Value::DICT)
            for (const auto &kv : v.dict->items) { step(at); d = std::max(d, check_nesting(kv.second, at, level + 1)); }
        else return 0;
        return d + 1;
    }
    // A width (indent, center) as a size, refused past the output limit.
    size_t width(int64_t w, size_t at) const {
        if (w > 0 && uint64_t(w) > lim_.max_output) check_size(at, SIZE_MAX);
        return size_t(std::max<int64_t>(0, w));
    }
    void check_size(size_t at, size_t n) const {
        if (n > lim_.max_output)
            fail(at, "the output would pass " + std::to_string(lim_.max_output) + " bytes");
    }

    std::string render(const Body &body, const json &variables);

    // frames_[0]: the globals and the variables; a loop iteration or a macro call pushes one.
    // A macro's body sees its own frames and frame 0, not its caller's (as jinja2's macros).
    std::vector<std::unordered_map<std::string, Value>> frames_;
    std::vector<size_t> bases_{0};
    int depth_ = 0;
    std::string *out_ = nullptr;

    Value lookup(const std::string &name) const {
        for (size_t k = frames_.size(); k-- > bases_.back();) {
            auto it = frames_[k].find(name);
            if (it != frames_[k].end()) return it->second;
        }
        if (bases_.back() > 0) {
            auto it = frames_[0].find(name);
            if (it != frames_[0].end()) return it->second;
        }
        return Value::undefined("'" + name + "' is undefined");
    }

    Value eval(const Expr &e);
    // The arguments of a call, filter or test: e.args[1:] by position, e.kwargs by name.
    Args eval_args(const Expr &e) {
        Args args;
        for (size_t k = 1; k < e.args.size(); k++) args.pos.push_back(eval(*e.args[k]));
        for (auto &kv : e.kwargs) args.kw.emplace_back(kv.first, eval(*kv.second));
        return args;
    }
    Value call(const Value &f, Args &args, size_t at) {
        if (f.kind != Value::FUNC) {
            if (f.kind == Value::UNDEFINED) fail(at, f.s.empty() ? "call of an undefined value" : f.s);
            fail(at, std::string("'") + type_name(f) + "' object is not callable");
        }
        args.at = at;
        return (*f.fn)(*this, args);
    }

    enum Flow { NORMAL, BREAK, CONTINUE };
    Flow exec(const Body &body);
    std::string capture(const Body &body) {
        std::string buf, *saved = out_;
        out_ = &buf;
        struct Restore {
            Renderer &r;
            std::string *saved;
            ~Restore() { r.out_ = saved; }
        } restore{*this, saved};
        exec(body);
        return buf;
    }
    void write(const std::string &s, size_t at) {
        check_size(at, out_->size() + s.size());
        charge(at, s.size());
        out_->append(s);
    }

    Value apply_filter(const std::string &name, Value v, Args &args, size_t at);
    bool apply_test(const std::string &name, const Value &v, Args &args, size_t at);
    Value call_method(const Value &obj, const std::string &name, Args &args, size_t at, bool *found);
    Value getattr(const Value &obj, const std::string &name, size_t at);
    Value getitem(const Value &obj, const Value &key, size_t at);
    std::vector<Value> iterate(const Value &v, size_t at);
    std::string tojson(const Value &v, const Value &indent, const std::string &item_sep, const std::string &key_sep,
                       bool sort_keys, int level, size_t at);
    int compare(const Value &a, const Value &b, size_t at, bool case_sensitive = true);

    const std::string &src_;
    const Limits &lim_;
    uint64_t steps_ = 0;
};

// A macro (or a call block's caller) as a callable value.
Value make_macro(const Stmt &s);

std::vector<Value> Renderer::iterate(const Value &v, size_t at) {
    switch (v.kind) {
        case Value::UNDEFINED: return {};
        case Value::LIST: return *v.list;
        case Value::DICT: {
            std::vector<Value> keys;
            for (auto &kv : v.dict->items) keys.push_back(kv.first);
            return keys;
        }
        case Value::STRING: {
            std::vector<Value> cs;
            for (auto &c : code_points(v.s)) cs.push_back(Value::string(c));
            return cs;
        }
        default: fail(at, std::string("'") + type_name(v) + "' object is not iterable");
    }
}

Value Renderer::getattr(const Value &obj, const std::string &name, size_t at) {
    if (obj.kind == Value::UNDEFINED) fail(at, obj.s.empty() ? "attribute '" + name + "' of an undefined value" : obj.s);
    if (obj.kind == Value::DICT) {
        if (const Value *v = obj.dict->find(name)) return *v;
        return Value::undefined("'dict object' has no attribute '" + name + "'");
    }
    if (obj.kind == Value::LIST || obj.kind == Value::STRING) {
        // a method used as a value (x.items without a call) is rare; calls go through call_method
        return Value::undefined(std::string("'") + type_name(obj) + " object' has no attribute '" + name + "'");
    }
    return Value::undefined(std::string("'") + type_name(obj) + " object' has no attribute '" + name + "'");
}

Value Renderer::getitem(const Value &obj, const Value &key, size_t at) {
    if (obj.kind == Value::UNDEFINED) fail(at, obj.s.empty() ? "subscript of an undefined value" : obj.s);
    if (obj.kind == Value::DICT) {
        if (const Value *v = obj.dict->find(key)) return *v;
        return Value::undefined("'dict object' has no attribute " + to_str(key, true));
    }
    if ((obj.kind == Value::LIST || obj.kind == Value::STRING) && (key.kind == Value::INT || key.kind == Value::BOOL)) {
        int64_t i = key.as_int();
        if (obj.kind == Value::LIST) {
            int64_t n = int64_t(obj.list->size());
            if (i < 0) i += n;
            if (i < 0 || i >= n) return Value::undefined("list object has no element " + std::to_string(key.as_int()));
            return (*obj.list)[size_t(i)];
        }
        auto cs = code_points(obj.s);
        int64_t n = int64_t(cs.size());
        if (i < 0) i += n;
        if (i < 0 || i >= n) return Value::undefined("str object has no element " + std::to_string(key.as_int()));
        return Value::string(cs[size_t(i)]);
    }
    if (obj.kind == Value::LIST || obj.kind == Value::STRING)
        return Value::undefined(std::string(type_name(obj)) + " object has no element " + to_str(key, true));
    return Value::undefined(std::string("'") + type_name(obj) + " object' has no attribute " + to_str(key, true));
}

int Renderer::compare(const Value &a, const Value &b, size_t at, bool case_sensitive) {
    if (a.is_number() && b.is_number()) {
        double x = a.as_double(), y = b.as_double();
        if (a.kind != Value::FLOAT && b.kind != Value::FLOAT) {
            int64_t p = a.as_int(), q = b.as_int();
            return p < q ? -1 : p > q ? 1 : 0;
        }
        return x < y ? -1 : x > y ? 1 : 0;
    }
    if (a.kind == Value::STRING && b.kind == Value::STRING) {
        int c = case_sensitive ? a.s.compare(b.s) : ascii_lower(a.s).compare(ascii_lower(b.s));
        return c < 0 ? -1 : c > 0 ? 1 : 0;
    }
    if (a.kind == Value::LIST && b.kind == Value::LIST) {
        for (size_t k = 0; k < a.list->size() && k < b.list->size(); k++) {
            int c = compare((*a.list)[k], (*b.list)[k], at, case_sensitive);
            if (c) return c;
        }
        return a.list->size() < b.list->size() ? -1 : a.list->size() > b.list->size() ? 1 : 0;
    }
    fail(at, std::string("'<' not supported between instances of '") + type_name(a) + "' and '" + type_name(b) + "'");
}

// json.dumps writes a dict's keys as strings: str as is, numbers, true / false and null spelled out.
std::string json_key(const Value &k) {
    switch (k.kind) {
        case Value::STRING: return k.s;
        case Value::BOOL: return k.b ? "true" : "false";
        case Value::NONE: return "null";
        case Value::FLOAT: return py_float(k.f);
        default: return to_str(k);
    }
}

std::string Renderer::tojson(const Value &v, const Value &indent, const std::string &item_sep,
                             const std::string &key_sep, bool sort_keys, int level, size_t at) {
    step(at);
    if (level > 512) fail(at, "tojson: nested too deeply");
    std::string ind;
    bool has_indent = indent.kind != Value::UNDEFINED && indent.kind != Value::NONE;
    if (has_indent) ind = indent.kind == Value::STRING ? indent.s : std::string(width(indent.as_int(), at), ' ');
    auto newline = [&](int l) {
        std::string s = "\n";
        for (int k = 0; k < l; k++) s += ind;
        return s;
    };
    switch (v.kind) {
        case Value::NONE: return "null";
        case Value::BOOL: return v.b ? "true" : "false";
        case Value::INT: return std::to_string(v.i);
        case Value::FLOAT:
            if (std::isnan(v.f)) return "NaN";
            if (std::isinf(v.f)) return v.f < 0 ? "-Infinity" : "Infinity";
            return py_float(v.f);
        case Value::STRING: {
            std::string s;
            json_string(s, v.s);
            return s;
        }
        case Value::LIST: {
            if (v.list->empty()) return "[]";
            std::string s = "[";
            for (size_t k = 0; k < v.list->size(); k++) {
                if (k) s += item_sep;
                if (has_indent) s += newline(level + 1);
                s += tojson((*v.list)[k], indent, item_sep, key_sep, sort_keys, level + 1, at);
                check_size(at, s.size());
            }
            if (has_indent) s += newline(level);
            return s + "]";
        }
        case Value::DICT: {
            if (v.dict->items.empty()) return "{}";
            std::vector<const std::pair<Value, Value> *> items;
            for (auto &kv : v.dict->items) items.push_back(&kv);
            if (sort_keys)
                std::stable_sort(items.begin(), items.end(), [&](auto *a, auto *b) { return json_key(a->first) < json_key(b->first); });
            std::string s = "{";
            bool first = true;
            for (auto *kv : items) {
                if (!first) s += item_sep;
                first = false;
                if (has_indent) s += newline(level + 1);
                json_string(s, json_key(kv->first));
                s += key_sep;
                s += tojson(kv->second, indent, item_sep, key_sep, sort_keys, level + 1, at);
                check_size(at, s.size());
            }
            if (has_indent) s += newline(level);
            return s + "}";
        }
        default: fail(at, std::string("Object of type ") + type_name(v) + " is not JSON serializable");
    }
}

Value slice(Renderer &r, const Value &obj, const Value &start, const Value &stop, const Value &stepv, size_t at) {
    std::vector<Value> items;
    std::vector<std::string> cs;
    int64_t n;
    if (obj.kind == Value::LIST) n = int64_t(obj.list->size());
    else if (obj.kind == Value::STRING) {
        cs = code_points(obj.s);
        n = int64_t(cs.size());
    } else r.fail(at, std::string("'") + type_name(obj) + "' object is not subscriptable");
    auto num = [&](const Value &v, int64_t d) {
        if (v.kind == Value::UNDEFINED || v.kind == Value::NONE) return d;
        if (v.kind != Value::INT && v.kind != Value::BOOL) r.fail(at, "slice indices must be integers or None");
        return v.as_int();
    };
    int64_t step = num(stepv, 1);
    if (step == 0) r.fail(at, "slice step cannot be zero");
    int64_t lo, hi;
    if (step > 0) {
        lo = num(start, 0);
        hi = num(stop, n);
        if (lo < 0) lo = std::max<int64_t>(0, lo + n);
        if (hi < 0) hi = std::max<int64_t>(0, hi + n);
        lo = std::min(lo, n);
        hi = std::min(hi, n);
    } else {
        lo = num(start, n - 1);
        hi = num(stop, -n - 1);
        if (lo < 0) lo += n;
        if (hi < 0) hi += n;
        lo = std::min(lo, n - 1);
        hi = std::max<int64_t>(hi, -1);
    }
    std::string s;
    Value out = Value::new_list();
    for (int64_t k = lo; step > 0 ? k < hi : k > hi; k += step) {
        if (obj.kind == Value::LIST) out.list->push_back((*obj.list)[size_t(k)]);
        else s += cs[size_t(k)];
    }
    return obj.kind == Value::LIST ? out : Value::string(s);
}

std::string html_escape(const std::string &s) {
    std::string out;
    for (char c : s) {
        switch (c) {
            case '&': out += "&amp;"; break;
            case '<': out += "&lt;"; break;
            case '>': out += "&gt;"; break;
            case '"': out += "&#34;"; break;
            case '\'': out += "&#39;"; break;
            default: out += c;
        }
    }
    return out;
}

Value arithmetic(Renderer &r, const std::string &op, const Value &a, const Value &b, size_t at) {
    auto bad = [&]() -> Value {
        r.fail(at, "unsupported operand type(s) for " + op + ": '" + type_name(a) + "' and '" + type_name(b) + "'");
    };
    if (a.kind == Value::UNDEFINED || b.kind == Value::UNDEFINED) {
        const Value &u = a.kind == Value::UNDEFINED ? a : b;
        r.fail(at, u.s.empty() ? "an undefined value in an expression" : u.s);
    }
    if (op == "+") {
        if (a.kind == Value::STRING && b.kind == Value::STRING) {
            r.check_size(at, a.s.size() + b.s.size());
            r.charge(at, a.s.size() + b.s.size());
            if (!a.safe && !b.safe) return Value::string(a.s + b.s);
            // Markup + str escapes the str (markupsafe), and the sum is Markup
            Value m = Value::string((a.safe ? a.s : html_escape(a.s)) + (b.safe ? b.s : html_escape(b.s)));
            r.check_size(at, m.s.size());
            m.safe = true;
            return m;
        }
        if (a.kind == Value::LIST && b.kind == Value::LIST) {
            r.step(at, b.list->size());
            std::vector<Value> items = *a.list;
            items.insert(items.end(), b.list->begin(), b.list->end());
            return Value::new_list(std::move(items));
        }
    }
    if (op == "*" && ((a.kind == Value::STRING && (b.kind == Value::INT || b.kind == Value::BOOL)) ||
                      (b.kind == Value::STRING && (a.kind == Value::INT || a.kind == Value::BOOL)))) {
        const Value &s = a.kind == Value::STRING ? a : b;
        int64_t n = (a.kind == Value::STRING ? b : a).as_int();
        if (n <= 0) return Value::string("");
        if (uint64_t(n) > r.lim_.max_output || s.s.size() * uint64_t(n) > r.lim_.max_output) r.check_size(at, SIZE_MAX);
        r.charge(at, s.s.size() * size_t(n));
        std::string out;
        for (int64_t k = 0; k < n; k++) out += s.s;
        return Value::string(out);
    }
    if (!a.is_number() || !b.is_number()) return bad();
    bool ints = a.kind != Value::FLOAT && b.kind != Value::FLOAT;
    if (ints) {
        int64_t x = a.as_int(), y = b.as_int(), z = 0;
        if (op == "+") { if (__builtin_add_overflow(x, y, &z)) r.fail(at, "integer overflow"); return Value::integer(z); }
        if (op == "-") { if (__builtin_sub_overflow(x, y, &z)) r.fail(at, "integer overflow"); return Value::integer(z); }
        if (op == "*") { if (__builtin_mul_overflow(x, y, &z)) r.fail(at, "integer overflow"); return Value::integer(z); }
        if (op == "//" || op == "%") {
            if (y == 0) r.fail(at, "integer division or modulo by zero");
            int64_t q = x / y, m = x % y;
            if (m != 0 && ((m < 0) != (y < 0))) { q--; m += y; }
            return Value::integer(op == "//" ? q : m);
        }
        if (op == "**" && y >= 0) {  // by squaring: 1 ** 10**15 must not loop 10**15 times
            int64_t p = 1, b = x;
            for (int64_t e = y; e > 0; e >>= 1) {
                if ((e & 1) && __builtin_mul_overflow(p, b, &p)) r.fail(at, "integer overflow");
                if (e > 1 && __builtin_mul_overflow(b, b, &b)) r.fail(at, "integer overflow");
            }
            return Value::integer(p);
        }
    }
    double x = a.as_double(), y = b.as_double();
    if (op == "+") return Value::number(x + y);
    if (op == "-") return Value::number(x - y);
    if (op == "*") return Value::number(x * y);
    if (op == "/") {
        if (y == 0) r.fail(at, "division by zero");
        return Value::number(x / y);
    }
    if (op == "//" || op == "%") {
        if (y == 0) r.fail(at, "float division or modulo by zero");
        double m = std::fmod(x, y);
        if (m != 0 && ((m < 0) != (y < 0))) m += y;
        return op == "%" ? Value::number(m) : Value::number(std::floor((x - m) / y + 0.5));
    }
    if (op == "**") return Value::number(std::pow(x, y));
    return bad();
}

bool contains(Renderer &r, const Value &container, const Value &item, size_t at) {
    switch (container.kind) {
        case Value::STRING:
            if (item.kind != Value::STRING) r.fail(at, "'in <string>' requires string as left operand");
            return container.s.find(item.s) != std::string::npos;
        case Value::LIST:
            for (auto &v : *container.list)
                if (values_equal(v, item)) return true;
            return false;
        case Value::DICT: return container.dict->find(item) != nullptr;
        case Value::UNDEFINED: return false;
        default: r.fail(at, std::string("argument of type '") + type_name(container) + "' is not iterable");
    }
}

Value Renderer::eval(const Expr &e) {
    switch (e.kind) {
        case Expr::LITERAL: return e.value;
        case Expr::NAME: return lookup(e.name);
        case Expr::LIST: {
            Value l = Value::new_list();
            l.tuple = e.negated;
            for (auto &a : e.args) l.list->push_back(eval(*a));
            seal(l, e.at);
            return l;
        }
        case Expr::DICT: {
            Value d = Value::new_dict();
            for (size_t k = 0; k + 1 < e.args.size(); k += 2) {
                Value key = eval(*e.args[k]);
                if (key.kind == Value::LIST || key.kind == Value::DICT || key.kind == Value::UNDEFINED)
                    fail(e.args[k]->at, std::string("unhashable type: '") + type_name(key) + "'");
                d.dict->set(key, eval(*e.args[k + 1]));
            }
            seal(d, e.at);
            return d;
        }
        case Expr::ATTR: return getattr(eval(*e.args[0]), e.name, e.at);
        case Expr::ITEM: return getitem(eval(*e.args[0]), eval(*e.args[1]), e.at);
        case Expr::SLICE: {
            Value obj = eval(*e.args[0]);
            Value parts[3];
            for (int k = 0; k < 3; k++)
                if (e.args[size_t(k) + 1]) parts[k] = eval(*e.args[size_t(k) + 1]);
            return slice(*this, obj, parts[0], parts[1], parts[2], e.at);
        }
        case Expr::CALL: {
            Args args = eval_args(e);
            const Expr &callee = *e.args[0];
            if (callee.kind == Expr::ATTR) {  // a method of a str, list or dict, or a callable member
                Value obj = eval(*callee.args[0]);
                bool found = false;
                Value r = call_method(obj, callee.name, args, e.at, &found);
                if (found) return r;
                return call(getattr(obj, callee.name, callee.at), args, e.at);
            }
            return call(eval(callee), args, e.at);
        }
        case Expr::FILTER: {
            Value v = eval(*e.args[0]);
            Args args = eval_args(e);
            return apply_filter(e.name, std::move(v), args, e.at);
        }
        case Expr::TEST: {
            Value v = eval(*e.args[0]);
            Args args = eval_args(e);
            return Value::boolean(apply_test(e.name, v, args, e.at) != e.negated);
        }
        case Expr::NEG: case Expr::POS: {
            Value v = eval(*e.args[0]);
            if (!v.is_number()) fail(e.at, std::string("bad operand type for unary ") + (e.kind == Expr::NEG ? "-" : "+") +
                                               ": '" + type_name(v) + "'");
            if (e.kind == Expr::POS) return v.kind == Value::BOOL ? Value::integer(v.as_int()) : v;
            if (v.kind == Value::FLOAT) return Value::number(-v.f);
            if (v.as_int() == INT64_MIN) fail(e.at, "integer overflow");
            return Value::integer(-v.as_int());
        }
        case Expr::NOT: return Value::boolean(!truthy(eval(*e.args[0])));
        case Expr::AND: {
            Value a = eval(*e.args[0]);
            return truthy(a) ? eval(*e.args[1]) : a;
        }
        case Expr::OR: {
            Value a = eval(*e.args[0]);
            return truthy(a) ? a : eval(*e.args[1]);
        }
        case Expr::BINARY: {
            Value a = eval(*e.args[0]), b = eval(*e.args[1]);
            if (e.name == "~") {
                std::string s = to_str(a), t = to_str(b);
                check_size(e.at, s.size() + t.size());
                charge(e.at, s.size() + t.size());
                return Value::string(s + t);
            }
            return arithmetic(*this, e.name, a, b, e.at);
        }
        case Expr::COMPARE: {
            Value a = eval(*e.args[0]), b = eval(*e.args[1]);
            const std::string &op = e.name;
            if (op == "in") return Value::boolean(contains(*this, b, a, e.at) != e.negated);
            if (op == "==") return Value::boolean(values_equal(a, b));
            if (op == "!=") return Value::boolean(!values_equal(a, b));
            int c = compare(a, b, e.at);
            if (op == "<") return Value::boolean(c < 0);
            if (op == "<=") return Value::boolean(c <= 0);
            if (op == ">") return Value::boolean(c > 0);
            return Value::boolean(c >= 0);
        }
        case Expr::COND: {
            if (truthy(eval(*e.args[1]))) return eval(*e.args[0]);
            return e.args[2] ? eval(*e.args[2]) : Value::undefined("");
        }
    }
    return Value();
}

// The `loop` object: one dict per loop whose fields are updated in place at each iteration (a
// fresh dict per iteration made a loop step 3x slower).
Value loop_value(const std::vector<Value> &items, const Value &cycle) {
    Value l = Value::new_dict();
    auto &d = *l.dict;
    for (const char *k : {"index", "index0", "revindex", "revindex0", "first", "last", "length", "depth", "depth0",
                          "previtem", "nextitem"})
        d.add(k, Value());
    d.items[6].second = Value::integer(int64_t(items.size()));
    d.items[7].second = Value::integer(1);
    d.items[8].second = Value::integer(0);
    d.add("cycle", cycle);
    return l;
}

void loop_step(Value &l, const std::vector<Value> &items, size_t k) {
    auto &it = l.dict->items;
    int64_t n = int64_t(items.size()), i = int64_t(k);
    it[0].second = Value::integer(i + 1);
    it[1].second = Value::integer(i);
    it[2].second = Value::integer(n - i);
    it[3].second = Value::integer(n - i - 1);
    it[4].second = Value::boolean(i == 0);
    it[5].second = Value::boolean(i == n - 1);
    it[9].second = k > 0 ? items[k - 1] : Value::undefined("there is no previous item");
    it[10].second = k + 1 < items.size() ? items[k + 1] : Value::undefined("there is no next item");
}

void assign_targets(Renderer &r, const Stmt &s, std::unordered_map<std::string, Value> &frame, const Value &item) {
    if (s.names.size() == 1) {
        frame[s.names[0]] = item;
        return;
    }
    std::vector<Value> parts = r.iterate(item, s.at);
    if (parts.size() != s.names.size())
        r.fail(s.at, "cannot unpack " + std::to_string(parts.size()) + " values into " + std::to_string(s.names.size()));
    for (size_t k = 0; k < parts.size(); k++) frame[s.names[k]] = parts[k];
}

Renderer::Flow Renderer::exec(const Body &body) {
    for (auto &sp : body) {
        const Stmt &s = *sp;
        switch (s.kind) {
            case Stmt::TEXT: write(s.text, s.at); break;
            case Stmt::OUTPUT: {
                Value v = eval(*s.exprs[0]);
                write(to_str(v), s.at);
                break;
            }
            case Stmt::IF: {
                size_t k = 0;
                for (; k < s.exprs.size(); k++)
                    if (truthy(eval(*s.exprs[k]))) break;
                if (k < s.bodies.size()) {
                    Flow f = exec(s.bodies[k]);
                    if (f != NORMAL) return f;
                }
                break;
            }
            case Stmt::FOR: {
                Value seq = eval(*s.exprs[0]);
                std::vector<Value> all = iterate(seq, s.exprs[0]->at), items;
                if (s.exprs[1]) {  // for x in xs if cond: the loop runs over the items that pass
                    for (auto &v : all) {
                        step(s.at);
                        frames_.emplace_back();
                        assign_targets(*this, s, frames_.back(), v);
                        bool keep = truthy(eval(*s.exprs[1]));
                        frames_.pop_back();
                        if (keep) items.push_back(v);
                    }
                } else items = std::move(all);
                if (items.empty()) {
                    if (s.bodies.size() > 1) {
                        Flow f = exec(s.bodies[1]);
                        if (f != NORMAL) return f;
                    }
                    break;
                }
                auto index = std::make_shared<size_t>(0);
                Value cycle = Value::func([index](Renderer &r, Args &a) -> Value {
                    if (a.pos.empty()) r.fail(a.at, "loop.cycle needs at least one item");
                    return a.pos[*index % a.pos.size()];
                });
                Value loop = loop_value(items, cycle);
                frames_.emplace_back();  // the iteration's scope, emptied at each one
                struct Pop {
                    Renderer &r;
                    ~Pop() { r.frames_.pop_back(); }
                } pop{*this};
                for (size_t k = 0; k < items.size(); k++) {
                    step(s.at);
                    *index = k;
                    auto &frame = frames_.back();
                    frame.clear();
                    loop_step(loop, items, k);
                    frame["loop"] = loop;
                    assign_targets(*this, s, frame, items[k]);
                    Flow f = exec(s.bodies[0]);
                    if (f == BREAK) break;
                }
                break;
            }
            case Stmt::SET: {
                Value v = eval(*s.exprs[0]);
                if (!s.attr.empty()) {
                    Value ns = lookup(s.text);
                    if (ns.kind != Value::DICT || !ns.dict->is_namespace)
                        fail(s.at, "cannot assign attribute on non-namespace object");
                    ns.dict->set(s.attr, std::move(v));
                    check_nesting(ns, s.at);  // after: a cycle through ns shows as endless depth
                } else frames_.back()[s.text] = std::move(v);
                break;
            }
            case Stmt::SET_BLOCK: frames_.back()[s.text] = Value::string(capture(s.bodies[0])); break;
            case Stmt::MACRO: frames_.back()[s.text] = make_macro(s); break;
            case Stmt::CALL_BLOCK: {
                const Expr &c = *s.exprs.back();
                Value caller = make_macro(s);
                Args args = eval_args(c);
                args.kw.emplace_back("caller", caller);
                Value r = call(eval(*c.args[0]), args, c.at);
                write(to_str(r), s.at);
                break;
            }
            case Stmt::FILTER_BLOCK: {
                // the filter expression, whose operand is the name kBlockText, over the block's text
                Value text = Value::string(capture(s.bodies[0]));
                frames_.emplace_back();
                struct Pop {
                    Renderer &r;
                    ~Pop() { r.frames_.pop_back(); }
                } pop{*this};
                frames_.back()[kBlockText] = text;
                write(to_str(eval(*s.exprs[0])), s.at);
                break;
            }
            case Stmt::BREAK: return BREAK;
            case Stmt::CONTINUE: return CONTINUE;
            case Stmt::PLAIN_BLOCK: {
                Flow f = exec(s.bodies[0]);
                if (f != NORMAL) return f;
                break;
            }
        }
    }
    return NORMAL;
}

Value make_macro(const Stmt &s) {
    const Stmt *def = &s;
    return Value::func([def](Renderer &r, Args &a) -> Value {
        if (++r.depth_ > r.lim_.max_depth) {
            r.depth_--;
            r.fail(a.at, "macro calls nested deeper than " + std::to_string(r.lim_.max_depth));
        }
        r.step(a.at);
        std::unordered_map<std::string, Value> frame;
        size_t n = def->names.size();
        if (a.pos.size() > n && def->kind == Stmt::MACRO) {
            r.depth_--;
            r.fail(a.at, "macro '" + def->text + "' takes not more than " + std::to_string(n) + " argument(s)");
        }
        Value caller;
        for (auto &kv : a.kw)
            if (kv.first == "caller") caller = kv.second;
        // parameters: positional, then by name, then their defaults (evaluated in the macro's frame)
        r.frames_.emplace_back();
        r.bases_.push_back(r.frames_.size() - 1);
        struct Pop {
            Renderer &r;
            ~Pop() {
                r.frames_.pop_back();
                r.bases_.pop_back();
                r.depth_--;
            }
        } pop{r};
        for (size_t k = 0; k < n; k++) {
            Value v = a.get(k, def->names[k].c_str());
            if (v.kind == Value::UNDEFINED && k < def->exprs.size() && def->exprs[k])
                v = r.eval(*def->exprs[k]);
            else if (v.kind == Value::UNDEFINED)
                v = Value::undefined("parameter '" + def->names[k] + "' was not provided");
            r.frames_.back()[def->names[k]] = v;
        }
        if (caller.kind == Value::FUNC) r.frames_.back()["caller"] = caller;
        std::string text = r.capture(def->bodies[0]);
        return Value::string(text);
    });
}

// ---- str / list / dict methods

Value Renderer::call_method(const Value &obj, const std::string &name, Args &a, size_t at, bool *found) {
    *found = true;
    auto arg_str = [&](size_t i, const char *n) -> const Value {
        Value v = a.get(i, n);
        if (v.kind != Value::STRING) fail(at, name + "() argument must be a str, not " + type_name(v));
        return v;
    };
    if (obj.kind == Value::STRING) {
        const std::string &s = obj.s;
        if (name == "strip" || name == "lstrip" || name == "rstrip") {
            Value c = a.get(0, "chars");
            bool has = c.kind == Value::STRING;
            return Value::string(py_strip(s, has ? &c.s : nullptr, name != "rstrip", name != "lstrip"));
        }
        if (name == "upper") return Value::string(ascii_upper(s));
        if (name == "lower") return Value::string(ascii_lower(s));
        if (name == "title" || name == "capitalize") {
            std::string out = s;
            bool prev_letter = false;
            for (size_t k = 0; k < out.size(); k++) {
                char &c = out[k];
                bool up = name == "title" ? !prev_letter : k == 0;
                if (ascii_alpha(c)) c = up ? char(std::toupper(static_cast<unsigned char>(c))) : char(std::tolower(static_cast<unsigned char>(c)));
                prev_letter = ascii_alpha(c);
            }
            return Value::string(out);
        }
        if (name == "startswith" || name == "endswith") {
            Value p = a.get(0, "prefix");
            std::vector<Value> options = p.kind == Value::LIST ? *p.list : std::vector<Value>{p};
            for (auto &o : options) {
                if (o.kind != Value::STRING) fail(at, name + " first arg must be str or a tuple of str");
                bool hit = name == "startswith" ? s.compare(0, o.s.size(), o.s) == 0
                                                : s.size() >= o.s.size() && s.compare(s.size() - o.s.size(), o.s.size(), o.s) == 0;
                if (hit) return Value::boolean(true);
            }
            return Value::boolean(false);
        }
        if (name == "split" || name == "rsplit") {
            Value sep = a.get(0, "sep");
            int64_t maxsplit = a.get(1, "maxsplit", Value::integer(-1)).as_int();
            Value out = Value::new_list();
            if (sep.kind == Value::UNDEFINED || sep.kind == Value::NONE) {
                // runs of whitespace; leading and trailing whitespace gives no empty strings
                std::vector<std::string> cs = code_points(s);
                std::vector<std::pair<size_t, size_t>> words;  // code point ranges
                size_t k = 0;
                while (k < cs.size()) {
                    auto space = [&](size_t j) { size_t i = 0; return py_isspace(unicode::decode_utf8(cs[j], i)); };
                    while (k < cs.size() && space(k)) k++;
                    if (k >= cs.size()) break;
                    size_t b = k;
                    while (k < cs.size() && !space(k)) k++;
                    words.emplace_back(b, k);
                }
                if (name == "rsplit" && maxsplit >= 0 && int64_t(words.size()) > maxsplit + 1) {
                    std::string head;
                    size_t keep = words.size() - size_t(maxsplit);
                    for (size_t j = 0; j < words[keep - 1].second; j++) head += cs[j];
                    out.list->push_back(Value::string(py_strip(head, nullptr, true, true)));
                    for (size_t w = keep; w < words.size(); w++) {
                        std::string t;
                        for (size_t j = words[w].first; j < words[w].second; j++) t += cs[j];
                        out.list->push_back(Value::string(t));
                    }
                    return out;
                }
                for (size_t w = 0; w < words.size(); w++) {
                    std::string t;
                    bool last = maxsplit >= 0 && int64_t(w) == maxsplit;
                    size_t end = last ? cs.size() : words[w].second;
                    for (size_t j = words[w].first; j < end; j++) t += cs[j];
                    out.list->push_back(Value::string(last ? py_strip(t, nullptr, false, true) : t));
                    if (last) break;
                }
                return out;
            }
            if (sep.kind != Value::STRING) fail(at, "must be str or None");
            if (sep.s.empty()) fail(at, "empty separator");
            std::vector<std::string> parts;
            size_t b = 0;
            while (true) {
                size_t e = s.find(sep.s, b);
                if (e == std::string::npos) break;
                parts.push_back(s.substr(b, e - b));
                b = e + sep.s.size();
            }
            parts.push_back(s.substr(b));
            if (maxsplit >= 0 && int64_t(parts.size()) > maxsplit + 1) {
                std::vector<std::string> merged;
                if (name == "split") {
                    merged.assign(parts.begin(), parts.begin() + maxsplit);
                    std::string rest;
                    for (size_t k = size_t(maxsplit); k < parts.size(); k++) rest += (k > size_t(maxsplit) ? sep.s : "") + parts[k];
                    merged.push_back(rest);
                } else {
                    size_t head = parts.size() - size_t(maxsplit);
                    std::string rest;
                    for (size_t k = 0; k < head; k++) rest += (k ? sep.s : "") + parts[k];
                    merged.push_back(rest);
                    merged.insert(merged.end(), parts.begin() + long(head), parts.end());
                }
                parts = merged;
            }
            for (auto &p : parts) out.list->push_back(Value::string(p));
            return out;
        }
        if (name == "replace") {
            Value o = arg_str(0, "old"), n = arg_str(1, "new");
            int64_t count = a.get(2, "count", Value::integer(-1)).as_int();
            std::string out;
            if (o.s.empty()) {  // Python inserts new between every code point
                auto cs = code_points(s);
                int64_t done = 0;
                for (size_t k = 0; k <= cs.size(); k++) {
                    if (count < 0 || done < count) { out += n.s; done++; }
                    if (k < cs.size()) out += cs[k];
                    check_size(at, out.size());
                }
                return Value::string(out);
            }
            size_t b = 0;
            int64_t done = 0;
            while (count < 0 || done < count) {
                size_t e = s.find(o.s, b);
                if (e == std::string::npos) break;
                out.append(s, b, e - b);
                out += n.s;
                check_size(at, out.size());
                b = e + o.s.size();
                done++;
            }
            out.append(s, b, std::string::npos);
            return Value::string(out);
        }
        if (name == "find" || name == "rfind" || name == "index" || name == "count") {
            Value sub = arg_str(0, "sub");
            if (name == "count") {
                if (sub.s.empty()) return Value::integer(int64_t(py_len(s)) + 1);
                int64_t c = 0;
                for (size_t b = s.find(sub.s); b != std::string::npos; b = s.find(sub.s, b + sub.s.size())) c++;
                return Value::integer(c);
            }
            size_t e = name == "rfind" ? s.rfind(sub.s) : s.find(sub.s);
            if (e == std::string::npos) {
                if (name == "index") fail(at, "substring not found");
                return Value::integer(-1);
            }
            return Value::integer(int64_t(py_len(s.substr(0, e))));
        }
        if (name == "join") {
            Value items = a.get(0, "iterable");
            std::string out;
            bool first = true;
            for (auto &v : iterate(items, at)) {
                if (v.kind != Value::STRING) fail(at, std::string("sequence item: expected str instance, ") + type_name(v) + " found");
                if (!first) out += s;
                first = false;
                out += v.s;
                check_size(at, out.size());
            }
            return Value::string(out);
        }
        if (name == "splitlines") {
            Value out = Value::new_list();
            size_t b = 0;
            for (size_t k = 0; k < s.size(); k++) {
                if (s[k] == '\n' || s[k] == '\r') {
                    out.list->push_back(Value::string(s.substr(b, k - b)));
                    if (s[k] == '\r' && k + 1 < s.size() && s[k + 1] == '\n') k++;
                    b = k + 1;
                }
            }
            if (b < s.size()) out.list->push_back(Value::string(s.substr(b)));
            return out;
        }
        if (name == "isdigit" || name == "isspace" || name == "isalpha" || name == "isalnum" || name == "islower" ||
            name == "isupper") {
            if (s.empty()) return Value::boolean(false);
            bool all = true, cased = false;
            for (size_t i = 0; i < s.size();) {
                uint32_t c = unicode::decode_utf8(s, i);
                bool lower = c >= 'a' && c <= 'z', upper = c >= 'A' && c <= 'Z';
                cased = cased || lower || upper;
                if (name == "isdigit") all = all && c >= '0' && c <= '9';
                else if (name == "isspace") all = all && py_isspace(c);
                else if (name == "isalpha") all = all && (unicode::is_letter(c));
                else if (name == "isalnum") all = all && (unicode::is_letter(c) || unicode::is_number(c));
                else if (name == "islower") all = all && !upper;
                else all = all && !lower;
            }
            if (name == "islower" || name == "isupper") all = all && cased;
            return Value::boolean(all);
        }
        if (name == "format") {  // "{}" and "{0}" fields only
            std::string out;
            size_t auto_index = 0;
            for (size_t k = 0; k < s.size(); k++) {
                if (s[k] == '{' && k + 1 < s.size() && s[k + 1] == '{') { out += '{'; k++; continue; }
                if (s[k] == '}' && k + 1 < s.size() && s[k + 1] == '}') { out += '}'; k++; continue; }
                if (s[k] == '{') {
                    size_t e = s.find('}', k);
                    if (e == std::string::npos) fail(at, "Single '{' encountered in format string");
                    std::string field = s.substr(k + 1, e - k - 1);
                    Value v;
                    if (field.empty()) v = a.get(auto_index++, "");
                    else if (std::isdigit(static_cast<unsigned char>(field[0]))) v = a.get(size_t(std::atoi(field.c_str())), "");
                    else v = a.get(SIZE_MAX, field.c_str());
                    if (v.kind == Value::UNDEFINED) fail(at, "format: no argument for {" + field + "}");
                    out += to_str(v);
                    k = e;
                    continue;
                }
                out += s[k];
            }
            return Value::string(out);
        }
    } else if (obj.kind == Value::DICT && !obj.dict->is_namespace) {
        if (name == "items") {
            Value out = Value::new_list();
            for (auto &kv : obj.dict->items) out.list->push_back(Value::pair(kv.first, kv.second));
            return out;
        }
        if (name == "keys" || name == "values") {
            Value out = Value::new_list();
            for (auto &kv : obj.dict->items) out.list->push_back(name == "keys" ? kv.first : kv.second);
            return out;
        }
        if (name == "get") {
            Value k = a.get(0, "key");
            const Value *v = obj.dict->find(k);
            if (v) return *v;
            Value d = a.get(1, "default");
            return d.kind == Value::UNDEFINED ? Value::none() : d;
        }
    } else if (obj.kind == Value::LIST) {
        if (name == "index" || name == "count") {
            Value x = a.get(0, "x");
            int64_t c = 0;
            for (size_t k = 0; k < obj.list->size(); k++)
                if (values_equal((*obj.list)[k], x)) {
                    if (name == "index") return Value::integer(int64_t(k));
                    c++;
                }
            if (name == "index") fail(at, to_str(x, true) + " is not in list");
            return Value::integer(c);
        }
        if (name == "append" || name == "pop" || name == "insert" || name == "extend" || name == "remove" ||
            name == "clear" || name == "sort" || name == "reverse")
            fail(at, "access to attribute '" + name + "' of 'list' object is unsafe (the sandbox is immutable)");
    }
    *found = false;
    return Value();
}

// ---- filters

// Jinja's map/select helpers: an attribute path "a.b" or an index.
Value attr_path(Renderer &r, const Value &v, const Value &attr, size_t at) {
    if (attr.kind == Value::INT) return r.getitem(v, attr, at);
    std::string path = to_str(attr);
    Value cur = v;
    size_t b = 0;
    while (true) {
        size_t e = path.find('.', b);
        std::string part = path.substr(b, e == std::string::npos ? std::string::npos : e - b);
        bool digits = !part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); });
        if (cur.kind == Value::UNDEFINED) return cur;
        cur = digits && cur.kind == Value::LIST ? r.getitem(cur, Value::integer(std::atoll(part.c_str())), at)
                                                : (cur.kind == Value::DICT ? r.getattr(cur, part, at) : r.getitem(cur, Value::string(part), at));
        if (e == std::string::npos) return cur;
        b = e + 1;
    }
}

Value sorted_list(Renderer &r, std::vector<Value> items, const Value &attr, bool reverse, bool case_sensitive, size_t at) {
    std::vector<std::pair<Value, Value>> keyed;
    for (auto &v : items) keyed.emplace_back(attr.kind == Value::UNDEFINED || attr.kind == Value::NONE ? v : attr_path(r, v, attr, at), v);
    std::stable_sort(keyed.begin(), keyed.end(), [&](const auto &x, const auto &y) {
        int c = r.compare(x.first, y.first, at, case_sensitive);
        return reverse ? c > 0 : c < 0;
    });
    Value out = Value::new_list();
    for (auto &kv : keyed) out.list->push_back(kv.second);
    return out;
}

Value Renderer::apply_filter(const std::string &name, Value v, Args &a, size_t at) {
    step(at);
    a.at = at;
    auto str_of = [&](const Value &x) { return to_str(x); };
    if (name == "safe" || name == "string" || name == "e" || name == "escape" || name == "forceescape") {
        if (name == "string") return v.kind == Value::STRING ? v : Value::string(str_of(v));
        if (v.kind == Value::STRING && v.safe && name != "forceescape") return v;
        Value m = Value::string(name == "safe" ? str_of(v) : html_escape(str_of(v)));
        m.safe = true;
        return m;
    }
    if (name == "tojson") {
        Value indent = a.get(0, "indent");
        Value seps = a.get(1, "separators");
        bool sort_keys = truthy(a.get(2, "sort_keys"));
        bool has_indent = indent.kind != Value::UNDEFINED && indent.kind != Value::NONE;
        std::string item_sep = has_indent ? "," : ", ", key_sep = ": ";
        if (seps.kind == Value::LIST && seps.list->size() == 2) {
            item_sep = str_of((*seps.list)[0]);
            key_sep = str_of((*seps.list)[1]);
        }
        return Value::string(tojson(v, indent, item_sep, key_sep, sort_keys, 0, at));
    }
    if (name == "trim") {
        if (v.kind == Value::UNDEFINED) return Value::string("");
        Value c = a.get(0, "chars");
        std::string s = str_of(v);
        return Value::string(py_strip(s, c.kind == Value::STRING ? &c.s : nullptr, true, true));
    }
    if (name == "length" || name == "count") {
        switch (v.kind) {
            case Value::UNDEFINED: return Value::integer(0);
            case Value::STRING: return Value::integer(int64_t(py_len(v.s)));
            case Value::LIST: return Value::integer(int64_t(v.list->size()));
            case Value::DICT: return Value::integer(int64_t(v.dict->items.size()));
            default: fail(at, std::string("object of type '") + type_name(v) + "' has no len()");
        }
    }
    if (name == "default" || name == "d") {
        bool boolean = truthy(a.get(1, "boolean"));
        if (v.kind == Value::UNDEFINED || (boolean && !truthy(v))) {
            Value d = a.get(0, "default_value");
            return d.kind == Value::UNDEFINED ? Value::string("") : d;
        }
        return v;
    }
    if (name == "upper") return Value::string(ascii_upper(str_of(v)));
    if (name == "lower") return Value::string(ascii_lower(str_of(v)));
    if (name == "capitalize") {
        std::string s = ascii_lower(str_of(v));
        if (!s.empty() && ascii_alpha(s[0])) s[0] = char(std::toupper(static_cast<unsigned char>(s[0])));
        return Value::string(s);
    }
    if (name == "title") {  // jinja2: words begin after whitespace, '-', '(', '{', '[' or '<'
        std::string s = str_of(v);
        bool start = true;
        for (char &c : s) {
            if (ascii_alpha(c)) c = start ? char(std::toupper(static_cast<unsigned char>(c))) : char(std::tolower(static_cast<unsigned char>(c)));
            start = is_ws(c) || c == '-' || c == '(' || c == '{' || c == '[' || c == '<';
        }
        return Value::string(s);
    }
    if (name == "replace") {
        Args m;
        m.pos = a.pos;
        m.kw = a.kw;
        bool found;
        return call_method(Value::string(str_of(v)), "replace", m, at, &found);
    }
    if (name == "join") {
        Value sep = a.get(0, "d", Value::string(""));
        Value attr = a.get(1, "attribute");
        std::string out;
        bool first = true;
        for (auto &x : iterate(v, at)) {
            if (!first) out += str_of(sep);
            first = false;
            out += str_of(attr.kind == Value::UNDEFINED ? x : attr_path(*this, x, attr, at));
            check_size(at, out.size());
        }
        return Value::string(out);
    }
    if (name == "first" || name == "last") {
        std::vector<Value> items = iterate(v, at);
        if (items.empty()) return Value::undefined("No " + name + " item, sequence was empty.");
        return name == "first" ? items.front() : items.back();
    }
    if (name == "list") return Value::new_list(iterate(v, at));
    if (name == "items") {
        if (v.kind == Value::UNDEFINED) return Value::new_list();
        if (v.kind != Value::DICT) fail(at, "Can only get item pairs from a mapping.");
        bool found;
        return call_method(v, "items", a, at, &found);
    }
    if (name == "reverse") {
        if (v.kind == Value::STRING) {
            auto cs = code_points(v.s);
            std::string out;
            for (size_t k = cs.size(); k-- > 0;) out += cs[k];
            return Value::string(out);
        }
        std::vector<Value> items = iterate(v, at);
        std::reverse(items.begin(), items.end());
        return Value::new_list(items);
    }
    if ((name == "map" || name == "select" || name == "reject" || name == "selectattr" || name == "rejectattr") &&
        !truthy(v))
        return Value::new_list();  // jinja2 iterates only `if seq`
    if (name == "map") {
        Value out = Value::new_list();
        Value attr;
        for (auto &kv : a.kw)
            if (kv.first == "attribute") attr = kv.second;
        if (attr.kind != Value::UNDEFINED) {
            Value dflt = a.get(SIZE_MAX, "default");
            for (auto &x : iterate(v, at)) {
                Value y = attr_path(*this, x, attr, at);
                out.list->push_back(y.kind == Value::UNDEFINED && dflt.kind != Value::UNDEFINED ? dflt : y);
            }
            return out;
        }
        if (a.pos.empty()) fail(at, "map needs a filter name or attribute=");
        std::string f = str_of(a.pos[0]);
        Args rest;
        rest.pos.assign(a.pos.begin() + 1, a.pos.end());
        rest.kw = a.kw;
        for (auto &x : iterate(v, at)) {
            Args copy = rest;
            out.list->push_back(apply_filter(f, x, copy, at));
        }
        return out;
    }
    if (name == "select" || name == "reject" || name == "selectattr" || name == "rejectattr") {
        bool attr_mode = name == "selectattr" || name == "rejectattr";
        bool want = name == "select" || name == "selectattr";
        size_t first_arg = attr_mode ? 1 : 0;
        Value attr = attr_mode ? a.get(0, "attribute") : Value();
        if (attr_mode && attr.kind == Value::UNDEFINED) fail(at, name + " needs an attribute");
        std::string test = a.pos.size() > first_arg ? str_of(a.pos[first_arg]) : "";
        Args test_args;
        if (a.pos.size() > first_arg + 1) test_args.pos.assign(a.pos.begin() + long(first_arg) + 1, a.pos.end());
        Value out = Value::new_list();
        for (auto &x : iterate(v, at)) {
            Value subject = attr_mode ? attr_path(*this, x, attr, at) : x;
            Args copy = test_args;
            bool ok = test.empty() ? truthy(subject) : apply_test(test, subject, copy, at);
            if (ok == want) out.list->push_back(x);
        }
        return out;
    }
    if (name == "unique") {
        bool cs = truthy(a.get(0, "case_sensitive"));
        Value attr = a.get(1, "attribute");
        Value out = Value::new_list();
        std::vector<Value> seen;
        for (auto &x : iterate(v, at)) {
            Value key = attr.kind == Value::UNDEFINED ? x : attr_path(*this, x, attr, at);
            if (!cs && key.kind == Value::STRING) key = Value::string(ascii_lower(key.s));
            bool dup = false;
            for (auto &s : seen) dup = dup || values_equal(s, key);
            if (!dup) {
                seen.push_back(key);
                out.list->push_back(x);
            }
            step(at);
        }
        return out;
    }
    if (name == "sort") {
        bool reverse = truthy(a.get(0, "reverse"));
        bool cs = truthy(a.get(1, "case_sensitive"));
        return sorted_list(*this, iterate(v, at), a.get(2, "attribute"), reverse, cs, at);
    }
    if (name == "dictsort") {
        if (v.kind != Value::DICT) fail(at, "dictsort needs a mapping");
        bool cs = truthy(a.get(0, "case_sensitive"));
        std::string by = str_of(a.get(1, "by", Value::string("key")));
        bool reverse = truthy(a.get(2, "reverse"));
        std::vector<Value> pairs;
        for (auto &kv : v.dict->items) pairs.push_back(Value::pair(kv.first, kv.second));
        return sorted_list(*this, pairs, Value::integer(by == "value" ? 1 : 0), reverse, cs, at);
    }
    if (name == "batch") {
        int64_t n = a.get(0, "linecount").as_int();
        if (n <= 0) fail(at, "batch needs a positive count");
        Value fill = a.get(1, "fill_with");
        Value out = Value::new_list(), cur = Value::new_list();
        for (auto &x : iterate(v, at)) {
            cur.list->push_back(x);
            if (int64_t(cur.list->size()) == n) {
                seal(cur, at);
                out.list->push_back(cur);
                cur = Value::new_list();
            }
        }
        if (!cur.list->empty()) {
            if (fill.kind != Value::UNDEFINED)
                while (int64_t(cur.list->size()) < n) cur.list->push_back(fill);
            seal(cur, at);
            out.list->push_back(cur);
        }
        seal(out, at);
        return out;
    }
    if (name == "indent") {
        Value w = a.get(0, "width", Value::integer(4));
        bool first = truthy(a.get(1, "first")), blank = truthy(a.get(2, "blank"));
        std::string ind = w.kind == Value::STRING ? w.s : std::string(width(w.as_int(), at), ' ');
        std::string s = str_of(v) + "\n";
        std::vector<std::string> lines;
        size_t b = 0;
        for (size_t k = 0; k < s.size(); k++)
            if (s[k] == '\n' || s[k] == '\r') {
                lines.push_back(s.substr(b, k - b));
                if (s[k] == '\r' && k + 1 < s.size() && s[k + 1] == '\n') k++;
                b = k + 1;
            }
        std::string out;
        for (size_t k = 0; k < lines.size(); k++) {
            if (k) out += "\n";
            if (k && (blank || !lines[k].empty())) out += ind;
            out += lines[k];
            check_size(at, out.size());
        }
        if (first) out = ind + out;
        return Value::string(out);
    }
    if (name == "int") {
        Value d = a.get(0, "default", Value::integer(0));
        if (v.kind == Value::INT || v.kind == Value::BOOL || v.kind == Value::FLOAT) return Value::integer(v.as_int());
        if (v.kind == Value::STRING) {
            std::string s = py_strip(v.s, nullptr, true, true);
            char *end = nullptr;
            errno = 0;
            long long x = std::strtoll(s.c_str(), &end, 10);
            if (!s.empty() && end && *end == 0 && errno == 0) return Value::integer(x);
            double f = std::strtod(s.c_str(), &end);
            if (!s.empty() && end && *end == 0 && std::isfinite(f)) return Value::integer(int64_t(f));
        }
        return d;
    }
    if (name == "float") {
        Value d = a.get(0, "default", Value::number(0.0));
        if (v.is_number()) return Value::number(v.as_double());
        if (v.kind == Value::STRING) {
            std::string s = py_strip(v.s, nullptr, true, true);
            char *end = nullptr;
            double f = std::strtod(s.c_str(), &end);
            if (!s.empty() && end && *end == 0) return Value::number(f);
        }
        return d;
    }
    if (name == "abs") {
        if (!v.is_number()) fail(at, std::string("bad operand type for abs(): '") + type_name(v) + "'");
        return v.kind == Value::FLOAT ? Value::number(std::fabs(v.f)) : Value::integer(std::llabs(v.as_int()));
    }
    if (name == "round") {
        int64_t prec = a.get(0, "precision", Value::integer(0)).as_int();
        std::string method = str_of(a.get(1, "method", Value::string("common")));
        double x = v.as_double(), m = std::pow(10.0, double(prec));
        // Python's round(): halves to even
        double y = method == "ceil" ? std::ceil(x * m) / m : method == "floor" ? std::floor(x * m) / m : std::nearbyint(x * m) / m;
        return Value::number(y);
    }
    if (name == "sum") {
        Value attr = a.get(0, "attribute");
        Value total = a.get(1, "start", Value::integer(0));
        for (auto &x : iterate(v, at)) total = arithmetic(*this, "+", total, attr.kind == Value::UNDEFINED ? x : attr_path(*this, x, attr, at), at);
        return total;
    }
    if (name == "max" || name == "min") {
        bool cs = truthy(a.get(0, "case_sensitive"));
        Value attr = a.get(1, "attribute");
        std::vector<Value> items = iterate(v, at);
        if (items.empty()) return Value::undefined("No aggregated item, sequence was empty.");
        Value best = items[0];
        for (auto &x : items) {
            Value kx = attr.kind == Value::UNDEFINED ? x : attr_path(*this, x, attr, at);
            Value kb = attr.kind == Value::UNDEFINED ? best : attr_path(*this, best, attr, at);
            int c = compare(kx, kb, at, cs);
            if (name == "max" ? c > 0 : c < 0) best = x;
        }
        return best;
    }
    if (name == "wordcount") {
        Args none;
        bool found;
        Value words = call_method(Value::string(str_of(v)), "split", none, at, &found);
        return Value::integer(int64_t(words.list->size()));
    }
    if (name == "attr") return getattr(v, str_of(a.get(0, "name")), at);
    if (name == "center") {
        int64_t w = int64_t(width(a.get(0, "width", Value::integer(80)).as_int(), at));
        std::string s = str_of(v);
        int64_t n = int64_t(py_len(s));
        if (w <= n) return Value::string(s);
        int64_t pad = w - n, left = pad / 2 + (pad & w & 1);
        return Value::string(std::string(size_t(left), ' ') + s + std::string(size_t(pad - left), ' '));
    }
    fail(at, "no filter named '" + name + "'");
}

bool Renderer::apply_test(const std::string &name, const Value &v, Args &a, size_t at) {
    auto arg = [&]() {
        if (a.pos.empty() && a.kw.empty()) fail(at, "the test '" + name + "' needs an argument");
        return a.pos.empty() ? a.kw[0].second : a.pos[0];
    };
    if (name == "defined") return v.kind != Value::UNDEFINED;
    if (name == "undefined") return v.kind == Value::UNDEFINED;
    if (name == "none") return v.kind == Value::NONE;
    if (name == "boolean") return v.kind == Value::BOOL;
    if (name == "true") return v.kind == Value::BOOL && v.b;
    if (name == "false") return v.kind == Value::BOOL && !v.b;
    if (name == "integer") return v.kind == Value::INT;
    if (name == "float") return v.kind == Value::FLOAT;
    if (name == "number") return v.is_number();
    if (name == "string") return v.kind == Value::STRING;
    if (name == "mapping") return v.kind == Value::DICT;
    if (name == "sequence") return v.kind == Value::LIST || v.kind == Value::STRING || v.kind == Value::DICT;
    if (name == "iterable") return v.kind == Value::LIST || v.kind == Value::STRING || v.kind == Value::DICT;
    if (name == "callable") return v.kind == Value::FUNC;
    if (name == "lower") return v.kind == Value::STRING && ascii_lower(v.s) == v.s;
    if (name == "upper") return v.kind == Value::STRING && ascii_upper(v.s) == v.s;
    if (name == "even" || name == "odd") {
        if (v.kind != Value::INT && v.kind != Value::BOOL) fail(at, "the test '" + name + "' needs an integer");
        return (v.as_int() % 2 == 0) == (name == "even");
    }
    if (name == "divisibleby") {
        int64_t d = arg().as_int();
        if (d == 0) fail(at, "integer division or modulo by zero");
        return v.as_int() % d == 0;
    }
    if (name == "eq" || name == "equalto" || name == "==") return values_equal(v, arg());
    if (name == "ne" || name == "!=") return !values_equal(v, arg());
    if (name == "sameas") {
        Value o = arg();
        if (v.kind != o.kind) return false;
        if (v.kind == Value::NONE || v.kind == Value::UNDEFINED) return true;
        if (v.kind == Value::BOOL) return v.b == o.b;
        if (v.kind == Value::LIST) return v.list == o.list;
        if (v.kind == Value::DICT) return v.dict == o.dict;
        return false;
    }
    if (name == "lt" || name == "lessthan" || name == "<") return compare(v, arg(), at) < 0;
    if (name == "le" || name == "<=") return compare(v, arg(), at) <= 0;
    if (name == "gt" || name == "greaterthan" || name == ">") return compare(v, arg(), at) > 0;
    if (name == "ge" || name == ">=") return compare(v, arg(), at) >= 0;
    if (name == "in") return contains(*this, arg(), v, at);
    if (name == "filter" || name == "test") return false;
    fail(at, "no test named '" + name + "'");
}

// ---- globals

std::string strftime_now(const std::string &fmt) {
    std::time_t t = std::time(nullptr);
    std::tm tm{};
#if defined(_WIN32)
    localtime_s(&tm, &t);
#else
    localtime_r(&t, &tm);
#endif
    char buf[512];
    size_t n = std::strftime(buf, sizeof buf, fmt.c_str(), &tm);
    return std::string(buf, n);
}

void add_globals(std::unordered_map<std::string, Value> &g) {
    g["raise_exception"] = Value::func([](Renderer &, Args &a) -> Value {
        // the template rejects the conversation: its message is the error's, as transformers raises it
        throw Error(FASTLLM_ERR_INVALID_ARGUMENT, to_str(a.get(0, "message")));
    });
    g["strftime_now"] = Value::func([](Renderer &, Args &a) -> Value { return Value::string(strftime_now(to_str(a.get(0, "format")))); });
    g["range"] = Value::func([](Renderer &r, Args &a) -> Value {
        int64_t start = 0, stop, step = 1;
        for (auto &v : a.pos)
            if (v.kind != Value::INT && v.kind != Value::BOOL) r.fail(a.at, "range() takes integers");
        if (a.pos.size() == 1) stop = a.pos[0].as_int();
        else if (a.pos.size() >= 2) {
            start = a.pos[0].as_int();
            stop = a.pos[1].as_int();
            if (a.pos.size() > 2) step = a.pos[2].as_int();
        } else r.fail(a.at, "range expected at least 1 argument");
        if (step == 0) r.fail(a.at, "range() arg 3 must not be zero");
        Value out = Value::new_list();
        for (int64_t k = start; step > 0 ? k < stop : k > stop; k += step) {
            r.step(a.at);
            out.list->push_back(Value::integer(k));
        }
        return out;
    });
    g["namespace"] = Value::func([](Renderer &r, Args &a) -> Value {
        Value ns = Value::new_dict(true);
        for (auto &p : a.pos) {
            if (p.kind != Value::DICT) r.fail(a.at, "namespace() takes a mapping or keywords");
            for (auto &kv : p.dict->items) ns.dict->set(kv.first, kv.second);
        }
        for (auto &kv : a.kw) ns.dict->set(kv.first, kv.second);
        r.check_nesting(ns, a.at);
        return ns;
    });
    g["dict"] = Value::func([](Renderer &r, Args &a) -> Value {
        Value d = Value::new_dict();
        for (auto &p : a.pos) {
            if (p.kind != Value::DICT) r.fail(a.at, "dict() takes a mapping or keywords");
            for (auto &kv : p.dict->items) d.dict->set(kv.first, kv.second);
        }
        for (auto &kv : a.kw) d.dict->set(kv.first, kv.second);
        r.seal(d, a.at);
        return d;
    });
}

std::string Renderer::render(const Body &body, const json &variables) {
    frames_.clear();
    frames_.emplace_back();
    add_globals(frames_[0]);
    if (!variables.is_object()) throw Error(FASTLLM_ERR_INVALID_ARGUMENT, "the template's variables must be a JSON object");
    for (auto it = variables.begin(); it != variables.end(); ++it) frames_[0][it.key()] = from_json(it.value());
    std::string out;
    out_ = &out;
    exec(body);
    return out;
}

}  // namespace

struct Template::Impl {
    std::string source;
    Limits limits;
    Body body;
};

Template::Template(const std::string &source, const Limits &limits) : impl_(std::make_unique<Impl>()) {
    // jinja2 reads every line break as \n and drops one at the very end (keep_trailing_newline=False)
    std::string &src = impl_->source;
    src.reserve(source.size());
    for (size_t k = 0; k < source.size(); k++) {
        if (source[k] == '\r') {
            src += '\n';
            if (k + 1 < source.size() && source[k + 1] == '\n') k++;
        } else src += source[k];
    }
    if (!src.empty() && src.back() == '\n') src.pop_back();
    impl_->limits = limits;
    Lexer lexer(src);
    Parser parser(src, lexer.run(), limits.max_depth * 2);
    impl_->body = parser.parse_template();
}

Template::~Template() = default;

std::string Template::render(const json &variables) const {
    Renderer r(impl_->source, impl_->limits);
    return r.render(impl_->body, variables);
}

}  // namespace jinja
}  // namespace fastllm
