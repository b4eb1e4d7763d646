#include "text/grammar.h"

#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <cstring>
#include <map>

#include "base/error.h"
#include "text/token_trie.h"

namespace fastllm {

namespace {

constexpr uint32_t kMaxCodepoint = 0x10FFFF;
constexpr long kMaxRepeat = 10000;          // the largest m or n of {m,n}
constexpr size_t kMaxSymbols = 1u << 20;    // the grammar once repetitions are expanded
constexpr size_t kMaxStacks = 10000;        // parse stacks after one character: "too ambiguous" beyond
constexpr size_t kMaxExpansion = 1u << 20;  // expansion steps for one character
constexpr size_t kMaxStates = 1u << 14;     // cached DFA states (1 KiB of transitions each) before a reset
constexpr size_t kMaxTrigger = 4096;         // bytes of a lazy grammar's trigger
constexpr int kMaxNesting = 256;            // groups inside groups

constexpr size_t npos = std::string::npos;

bool is_name_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
}

}  // namespace

bool Grammar::CharClass::contains(uint32_t cp) const {
    if (cp < 128) return (ascii[cp >> 6] >> (cp & 63)) & 1;
    auto it = std::upper_bound(ranges.begin(), ranges.end(), cp,
                               [](uint32_t c, const std::pair<uint32_t, uint32_t> &r) { return c < r.first; });
    return it != ranges.begin() && cp <= std::prev(it)->second;
}

bool Grammar::CharClass::intersects(uint32_t lo, uint32_t hi) const {
    // the first range that ends at or after lo
    auto it = std::lower_bound(ranges.begin(), ranges.end(), lo,
                               [](const std::pair<uint32_t, uint32_t> &r, uint32_t c) { return r.second < c; });
    return it != ranges.end() && it->first <= hi;
}

// ---------------------------------------------------------------------------------------------
// Parsing. Rules are read into sequences of symbols; groups and repetitions become rules of their
// own (`x*` -> `R ::= x R |`, `x{2,4}` -> `x x O1`, `O1 ::= x O2 |`, `O2 ::= x |`), then checked
// and flattened into Grammar's element array.

class GrammarParser {
public:
    explicit GrammarParser(std::string_view src) : src_(src) {}
    std::shared_ptr<Grammar> run();

private:
    struct Sym {
        bool rule;
        uint32_t id;  // a rule, or a character class
        bool operator==(const Sym &o) const { return rule == o.rule && id == o.id; }
    };
    using Seq = std::vector<Sym>;
    struct RuleDef {
        std::string name;  // "" for the rules made for groups and repetitions
        std::vector<Seq> alts;
        size_t pos = npos;      // the definition, or the group / operator of a made rule
        size_t ref_pos = npos;  // its first reference
        bool defined = false;
        bool loop = false;  // made for `*`, `+` or `{m,}`: what it repeats must not match empty text
    };

    [[noreturn]] FASTLLM_PRINTF(3, 4) void error(size_t at, const char *fmt, ...) const;
    void line_col(size_t at, int &line, int &col) const;
    std::string describe_rule(uint32_t r) const;
    std::string describe_here() const;

    bool at_end() const { return pos_ >= src_.size(); }
    void skip_space();
    std::string read_name();
    bool rule_definition_follows();  // at a name followed by "::=" (leaves pos_ where it was)
    uint32_t rule_named(const std::string &name, size_t ref_pos);
    uint32_t new_rule(size_t pos);
    void count(size_t n, size_t at);

    std::vector<Seq> parse_alternatives(bool nested);
    Seq parse_sequence(bool nested);
    void parse_literal(Seq &seq);
    Sym parse_class();
    uint32_t read_char();
    uint32_t read_hex(int digits, size_t esc);
    long read_count();
    void parse_repetition(Seq &seq, size_t item_begin);
    Sym class_of(std::vector<std::pair<uint32_t, uint32_t>> ranges, bool negate, size_t at);

    void check_and_flatten(Grammar &g);

    std::string_view src_;
    size_t pos_ = 0;
    std::vector<RuleDef> rules_;
    std::unordered_map<std::string, uint32_t> by_name_;
    std::vector<Grammar::CharClass> classes_;
    std::map<std::vector<std::pair<uint32_t, uint32_t>>, uint32_t> class_ids_;
    size_t n_syms_ = 0;
    int depth_ = 0;  // of groups
};

void GrammarParser::line_col(size_t at, int &line, int &col) const {
    line = 1, col = 1;
    for (size_t i = 0; i < at && i < src_.size(); i++) {
        if (src_[i] == '\n') line++, col = 1;
        else if (((unsigned char)src_[i] & 0xC0) != 0x80) col++;  // columns count characters
    }
}

void GrammarParser::error(size_t at, const char *fmt, ...) const {
    char what[768];
    va_list ap;
    va_start(ap, fmt);
    std::vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    int line, col;
    line_col(at, line, col);
    fail(FASTLLM_ERR_INVALID_ARGUMENT, "grammar: line %d col %d: %s", line, col, what);
}

std::string GrammarParser::describe_rule(uint32_t r) const {
    if (!rules_[r].name.empty()) return "'" + rules_[r].name + "'";
    int line, col;
    line_col(rules_[r].pos, line, col);
    return "(the group or repetition at line " + std::to_string(line) + " col " + std::to_string(col) + ")";
}

std::string GrammarParser::describe_here() const {
    if (at_end()) return "the end of the grammar";
    unsigned char c = (unsigned char)src_[pos_];
    char buf[32];
    if (c >= 0x20 && c < 0x7F) std::snprintf(buf, sizeof buf, "'%c'", c);
    else std::snprintf(buf, sizeof buf, "byte 0x%02X", c);
    return buf;
}

void GrammarParser::skip_space() {
    while (!at_end()) {
        char c = src_[pos_];
        if (c == ' ' || c == '\t' || c == '\r' || c == '\n') {
            pos_++;
        } else if (c == '#') {
            while (!at_end() && src_[pos_] != '\n') pos_++;
        } else {
            break;
        }
    }
}

std::string GrammarParser::read_name() {
    size_t start = pos_;
    while (!at_end() && is_name_char(src_[pos_])) pos_++;
    return std::string(src_.substr(start, pos_ - start));
}

bool GrammarParser::rule_definition_follows() {
    size_t start = pos_;
    read_name();
    skip_space();
    bool yes = src_.substr(pos_, 3) == "::=";
    pos_ = start;
    return yes;
}

uint32_t GrammarParser::rule_named(const std::string &name, size_t ref_pos) {
    auto it = by_name_.find(name);
    if (it != by_name_.end()) {
        if (ref_pos != npos && rules_[it->second].ref_pos == npos) rules_[it->second].ref_pos = ref_pos;
        return it->second;
    }
    uint32_t id = (uint32_t)rules_.size();
    rules_.emplace_back();
    rules_.back().name = name;
    rules_.back().ref_pos = ref_pos;
    by_name_.emplace(name, id);
    return id;
}

uint32_t GrammarParser::new_rule(size_t pos) {
    rules_.emplace_back();
    rules_.back().pos = pos;
    rules_.back().defined = true;
    return (uint32_t)rules_.size() - 1;
}

void GrammarParser::count(size_t n, size_t at) {
    n_syms_ += n;
    if (n_syms_ > kMaxSymbols)
        error(at, "the grammar is too large (over %zu symbols once its repetitions are expanded)", kMaxSymbols);
}

std::shared_ptr<Grammar> GrammarParser::run() {
    for (;;) {
        skip_space();
        if (at_end()) break;
        size_t start = pos_;
        if (!is_name_char(src_[pos_])) error(pos_, "expected a rule name, found %s", describe_here().c_str());
        std::string name = read_name();
        skip_space();
        if (src_.substr(pos_, 3) != "::=")
            error(pos_, "expected '::=' after the rule name '%s', found %s", name.c_str(), describe_here().c_str());
        pos_ += 3;
        uint32_t id = rule_named(name, npos);
        if (rules_[id].defined) {
            int line, col;
            line_col(rules_[id].pos, line, col);
            error(start, "rule '%s' is defined twice (first at line %d col %d)", name.c_str(), line, col);
        }
        rules_[id].defined = true;
        rules_[id].pos = start;
        std::vector<Seq> alts = parse_alternatives(false);
        rules_[id].alts = std::move(alts);
        skip_space();
        if (!at_end() && !is_name_char(src_[pos_])) error(pos_, "unexpected %s", describe_here().c_str());
    }
    auto g = std::make_shared<Grammar>();
    g->source_ = std::string(src_);
    check_and_flatten(*g);
    return g;
}

std::vector<GrammarParser::Seq> GrammarParser::parse_alternatives(bool nested) {
    std::vector<Seq> alts;
    alts.push_back(parse_sequence(nested));
    while (!at_end() && src_[pos_] == '|') {
        pos_++;
        alts.push_back(parse_sequence(nested));
    }
    return alts;
}

GrammarParser::Seq GrammarParser::parse_sequence(bool nested) {
    Seq seq;
    size_t item_begin = npos;  // where the last item (what an operator repeats) starts in seq
    for (;;) {
        skip_space();
        if (at_end()) break;
        const size_t at = pos_;
        const char c = src_[pos_];
        if (c == '"') {
            item_begin = seq.size();
            parse_literal(seq);
        } else if (c == '[') {
            item_begin = seq.size();
            seq.push_back(parse_class());
        } else if (c == '.') {
            pos_++;
            item_begin = seq.size();
            seq.push_back(class_of({{0, kMaxCodepoint}}, false, at));
        } else if (c == '(') {
            pos_++;
            if (++depth_ > kMaxNesting) error(at, "groups nested deeper than %d", kMaxNesting);
            uint32_t g = new_rule(at);
            std::vector<Seq> alts = parse_alternatives(true);
            rules_[g].alts = std::move(alts);
            skip_space();
            if (at_end() || src_[pos_] != ')') {
                int line, col;
                line_col(at, line, col);
                error(pos_, "expected ')' to close the group opened at line %d col %d, found %s", line, col,
                      describe_here().c_str());
            }
            pos_++;
            depth_--;
            item_begin = seq.size();
            seq.push_back({true, g});
        } else if (is_name_char(c)) {
            if (rule_definition_follows()) break;  // the next rule begins
            std::string name = read_name();
            item_begin = seq.size();
            seq.push_back({true, rule_named(name, at)});
        } else if (c == '*' || c == '+' || c == '?' || c == '{') {
            if (item_begin == npos) error(at, "'%c' has nothing before it to repeat", c);
            parse_repetition(seq, item_begin);
        } else if (c == '|' || c == ')') {
            if (c == ')' && !nested) error(at, "')' without a matching '('");
            break;
        } else {
            error(at, "unexpected %s", describe_here().c_str());
        }
        count(1, at);
    }
    return seq;
}

uint32_t GrammarParser::read_hex(int digits, size_t esc) {
    uint32_t v = 0;
    for (int i = 0; i < digits; i++) {
        if (at_end()) error(esc, "the escape needs %d hex digits", digits);
        char c = src_[pos_];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0) error(pos_, "the escape needs %d hex digits, found %s", digits, describe_here().c_str());
        v = v * 16 + (uint32_t)d;
        pos_++;
    }
    return v;
}

// One character of a literal or a class: an escape or a UTF-8 character of the source.
uint32_t GrammarParser::read_char() {
    const size_t at = pos_;
    unsigned char c = (unsigned char)src_[pos_];
    if (c == '\\') {
        pos_++;
        if (at_end()) error(at, "the escape is cut off by the end of the grammar");
        char e = src_[pos_++];
        uint32_t cp;
        switch (e) {
        case 'n': return '\n';
        case 'r': return '\r';
        case 't': return '\t';
        case '\\': case '"': case '[': case ']': return (uint32_t)e;
        case 'x': cp = read_hex(2, at); break;
        case 'u': cp = read_hex(4, at); break;
        case 'U': cp = read_hex(8, at); break;
        default:
            pos_--;
            error(at, "unknown escape '\\%s' (known: \\n \\r \\t \\\\ \\\" \\[ \\] \\xHH \\uHHHH \\UHHHHHHHH)",
                  describe_here().c_str());
        }
        if (cp > kMaxCodepoint) error(at, "the escape names U+%X, beyond U+10FFFF", cp);
        if (cp >= 0xD800 && cp <= 0xDFFF) error(at, "the escape names U+%04X, a surrogate, which UTF-8 text cannot hold", cp);
        return cp;
    }
    int len = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 0;
    if (len == 0 || pos_ + len > src_.size()) error(at, "invalid UTF-8 in the grammar");
    uint32_t cp = len == 1 ? c : len == 2 ? c & 0x1F : len == 3 ? c & 0x0F : c & 0x07;
    for (int i = 1; i < len; i++) {
        unsigned char b = (unsigned char)src_[pos_ + i];
        if ((b & 0xC0) != 0x80) error(at, "invalid UTF-8 in the grammar");
        cp = cp << 6 | (b & 0x3F);
    }
    static const uint32_t kMin[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < kMin[len] || cp > kMaxCodepoint || (cp >= 0xD800 && cp <= 0xDFFF)) error(at, "invalid UTF-8 in the grammar");
    pos_ += len;
    return cp;
}

void GrammarParser::parse_literal(Seq &seq) {
    const size_t open = pos_++;
    for (;;) {
        if (at_end()) error(open, "unterminated string literal");
        if (src_[pos_] == '"') {
            pos_++;
            return;
        }
        uint32_t cp = read_char();
        seq.push_back(class_of({{cp, cp}}, false, open));
        count(1, open);
    }
}

GrammarParser::Sym GrammarParser::parse_class() {
    const size_t open = pos_++;
    bool negate = !at_end() && src_[pos_] == '^';
    if (negate) pos_++;
    std::vector<std::pair<uint32_t, uint32_t>> ranges;
    for (;;) {
        if (at_end()) error(open, "unterminated character class");
        if (src_[pos_] == ']') {
            pos_++;
            break;
        }
        const size_t at = pos_;
        uint32_t lo = read_char(), hi = lo;
        if (pos_ + 1 < src_.size() && src_[pos_] == '-' && src_[pos_ + 1] != ']') {
            pos_++;
            hi = read_char();
            if (hi < lo) error(at, "the range U+%04X-U+%04X is empty (its end comes before its start)", lo, hi);
        }
        ranges.emplace_back(lo, hi);
    }
    return class_of(std::move(ranges), negate, open);
}

GrammarParser::Sym GrammarParser::class_of(std::vector<std::pair<uint32_t, uint32_t>> ranges, bool negate, size_t at) {
    std::sort(ranges.begin(), ranges.end());
    std::vector<std::pair<uint32_t, uint32_t>> merged;
    for (const auto &r : ranges) {
        if (!merged.empty() && r.first <= merged.back().second + 1) merged.back().second = std::max(merged.back().second, r.second);
        else merged.push_back(r);
    }
    if (negate) {
        std::vector<std::pair<uint32_t, uint32_t>> inv;
        uint32_t next = 0;
        for (const auto &r : merged) {
            if (r.first > next) inv.emplace_back(next, r.first - 1);
            next = r.second + 1;
        }
        if (next <= kMaxCodepoint) inv.emplace_back(next, kMaxCodepoint);
        merged.swap(inv);
    }
    // Surrogates are no characters of UTF-8 text: left out, so that a partial character that could
    // only become one is dead at once (after 0xED, the bytes 0xA0-0xBF).
    std::vector<std::pair<uint32_t, uint32_t>> chars;
    for (const auto &r : merged) {
        if (r.first < 0xD800) chars.emplace_back(r.first, std::min<uint32_t>(r.second, 0xD7FF));
        if (r.second > 0xDFFF) chars.emplace_back(std::max<uint32_t>(r.first, 0xE000), r.second);
    }
    merged.swap(chars);
    if (merged.empty()) error(at, "the character class matches no character");
    auto it = class_ids_.find(merged);
    if (it != class_ids_.end()) return {false, it->second};
    Grammar::CharClass cls;
    for (const auto &r : merged)
        for (uint32_t c = r.first; c <= r.second && c < 128; c++) cls.ascii[c >> 6] |= 1ull << (c & 63);
    cls.ranges = merged;
    uint32_t id = (uint32_t)classes_.size();
    classes_.push_back(std::move(cls));
    class_ids_.emplace(std::move(merged), id);
    return {false, id};
}

long GrammarParser::read_count() {
    skip_space();
    if (at_end() || src_[pos_] < '0' || src_[pos_] > '9')
        error(pos_, "expected a number in the repetition, found %s", describe_here().c_str());
    const size_t at = pos_;
    long v = 0;
    while (!at_end() && src_[pos_] >= '0' && src_[pos_] <= '9') {
        v = v * 10 + (src_[pos_++] - '0');
        if (v > kMaxRepeat) error(at, "repetition count above %ld", kMaxRepeat);
    }
    skip_space();
    return v;
}

void GrammarParser::parse_repetition(Seq &seq, size_t item_begin) {
    const size_t op = pos_;
    const char c = src_[pos_++];
    long min = 0, max = -1;  // max -1: unbounded
    if (c == '+') min = 1;
    else if (c == '?') max = 1;
    else if (c == '{') {
        min = max = read_count();
        if (!at_end() && src_[pos_] == ',') {
            pos_++;
            skip_space();
            max = !at_end() && src_[pos_] >= '0' && src_[pos_] <= '9' ? read_count() : -1;
        }
        if (at_end() || src_[pos_] != '}') error(pos_, "expected '}' to end the repetition, found %s", describe_here().c_str());
        pos_++;
        if (max >= 0 && max < min) error(op, "the repetition {%ld,%ld} has its maximum below its minimum", min, max);
    }
    Seq item(seq.begin() + (long)item_begin, seq.end());
    if (item.empty()) return;  // "" repeated: still the empty text (found by fuzz_grammar)
    seq.resize(item_begin);
    if (item.size() > 1) {  // a literal of several characters repeats as one
        uint32_t g = new_rule(op);
        rules_[g].alts = {item};
        item = {{true, g}};
    }
    const Sym x = item[0];
    count((size_t)min + (max < 0 ? 2 : 2 * (size_t)(max - min)), op);
    for (long i = 0; i < min; i++) seq.push_back(x);
    if (max < 0) {
        uint32_t r = new_rule(op);  // r ::= x r |
        rules_[r].alts = {{x, {true, r}}, {}};
        rules_[r].loop = true;
        seq.push_back({true, r});
    } else if (max > min) {
        uint32_t next = 0;  // the optional tail, built from its end: o_k ::= x o_{k+1} |
        for (long k = max - min; k >= 1; k--) {
            uint32_t o = new_rule(op);
            if (k == max - min) rules_[o].alts = {{x}, {}};
            else rules_[o].alts = {{x, {true, next}}, {}};
            next = o;
        }
        seq.push_back({true, next});
    }
}

void GrammarParser::check_and_flatten(Grammar &g) {
    auto root = by_name_.find("root");
    if (root == by_name_.end() || !rules_[root->second].defined)
        error(root == by_name_.end() ? src_.size() : rules_[root->second].ref_pos,
              "no rule named 'root' (the rule a grammar starts from)");
    const size_t n = rules_.size();
    {  // undefined rules: the first reference in the text
        size_t first = npos;
        uint32_t which = 0;
        for (uint32_t r = 0; r < n; r++)
            if (!rules_[r].defined && rules_[r].ref_pos < first) first = rules_[r].ref_pos, which = r;
        if (first != npos) error(first, "undefined rule '%s'", rules_[which].name.c_str());
    }
    // Reachable from root, in the order first met.
    std::vector<uint32_t> reach{root->second};
    std::vector<char> seen(n, 0);
    seen[root->second] = 1;
    for (size_t i = 0; i < reach.size(); i++)
        for (const Seq &alt : rules_[reach[i]].alts)
            for (const Sym &s : alt)
                if (s.rule && !seen[s.id]) seen[s.id] = 1, reach.push_back(s.id);

    auto fixed_point = [&](std::vector<char> &flag, bool (*sym_ok)(const Sym &, const std::vector<char> &)) {
        for (bool changed = true; changed;) {
            changed = false;
            for (uint32_t r : reach) {
                if (flag[r]) continue;
                for (const Seq &alt : rules_[r].alts)
                    if (std::all_of(alt.begin(), alt.end(), [&](const Sym &s) { return sym_ok(s, flag); })) {
                        flag[r] = 1, changed = true;
                        break;
                    }
            }
        }
    };
    // Rules that can finish (derive some text): every reachable one must.
    std::vector<char> productive(n, 0);
    fixed_point(productive, [](const Sym &s, const std::vector<char> &f) { return !s.rule || f[s.id] != 0; });
    std::vector<uint32_t> by_pos = reach;
    std::sort(by_pos.begin(), by_pos.end(), [&](uint32_t a, uint32_t b) { return rules_[a].pos < rules_[b].pos; });
    for (uint32_t r : by_pos) {
        if (productive[r]) continue;
        // Follow references to rules that cannot finish either, to the one that is the cause.
        std::vector<char> visited(n, 0);
        for (uint32_t next = r; next != UINT32_MAX;) {
            visited[r = next] = 1;
            next = UINT32_MAX;
            for (const Seq &alt : rules_[r].alts)
                for (const Sym &s : alt)
                    if (next == UINT32_MAX && s.rule && !productive[s.id] && !visited[s.id]) next = s.id;
        }
        error(rules_[r].pos, "rule %s can never finish: each of its alternatives needs itself or another rule that "
              "can never finish%s", describe_rule(r).c_str(),
              productive[root->second] ? "" : ", so the grammar matches nothing");
    }
    // Rules that can match empty text.
    std::vector<char> nullable(n, 0);
    fixed_point(nullable, [](const Sym &s, const std::vector<char> &f) { return s.rule && f[s.id] != 0; });
    for (uint32_t r : by_pos)
        if (rules_[r].loop && rules_[r].alts[0][0].rule && nullable[rules_[r].alts[0][0].id])
            error(rules_[r].pos, "this repetition repeats something that can match empty text (it could loop "
                  "without end); make the repeated part non-empty");
    // Left recursion: a rule reachable from itself through first symbols (past nullable ones).
    std::vector<std::vector<uint32_t>> left(n);
    for (uint32_t r : reach)
        for (const Seq &alt : rules_[r].alts)
            for (const Sym &s : alt) {
                if (!s.rule) break;
                left[r].push_back(s.id);
                if (!nullable[s.id]) break;
            }
    std::vector<char> color(n, 0);  // 0 new, 1 on the path, 2 done
    for (uint32_t start : by_pos) {
        if (color[start]) continue;
        std::vector<std::pair<uint32_t, size_t>> path{{start, 0}};  // iterative depth-first search
        color[start] = 1;
        while (!path.empty()) {
            auto &[r, k] = path.back();
            if (k == left[r].size()) {
                color[r] = 2;
                path.pop_back();
                continue;
            }
            uint32_t t = left[r][k++];
            if (color[t] == 1) {
                std::string cycle;
                size_t from = 0;
                while (path[from].first != t) from++;
                for (size_t i = from; i < path.size(); i++) cycle += describe_rule(path[i].first) + " -> ";
                cycle += describe_rule(t);
                error(rules_[t].pos, "rule %s is left-recursive (%s): the matcher cannot follow left recursion; "
                      "write it with a repetition instead, e.g. `list ::= item (\",\" item)*`",
                      describe_rule(t).c_str(), cycle.c_str());
            }
            if (color[t] == 0) {
                color[t] = 1;
                path.emplace_back(t, 0);
            }
        }
    }
    // Flatten: each alternative is its symbols then kEnd.
    g.alts_.assign(n, {});
    for (uint32_t r = 0; r < n; r++)
        for (const Seq &alt : rules_[r].alts) {
            g.alts_[r].push_back((uint32_t)g.elems_.size());
            for (const Sym &s : alt) g.elems_.push_back({s.rule ? Grammar::kRule : Grammar::kChars, s.id});
            g.elems_.push_back({Grammar::kEnd, 0});
        }
    if (g.elems_.size() > 2 * kMaxSymbols) error(0, "the grammar is too large");
    for (const Grammar::CharClass &c : classes_)
        for (const auto &r : c.ranges) g.boundaries_.push_back(r.first), g.boundaries_.push_back(r.second + 1);
    std::sort(g.boundaries_.begin(), g.boundaries_.end());
    g.boundaries_.erase(std::unique(g.boundaries_.begin(), g.boundaries_.end()), g.boundaries_.end());
    g.classes_ = std::move(classes_);
    g.root_ = root->second;
}

uint32_t Grammar::char_group(uint32_t cp) const {
    return (uint32_t)(std::upper_bound(boundaries_.begin(), boundaries_.end(), cp) - boundaries_.begin());
}

std::shared_ptr<const Grammar> Grammar::parse(std::string_view text) { return GrammarParser(text).run(); }

// ---------------------------------------------------------------------------------------------
// Matching

GrammarMatcher::GrammarMatcher(std::shared_ptr<const Grammar> grammar) : grammar_(std::move(grammar)) {
    StackSet start;
    for (uint32_t alt : grammar_->alternatives(grammar_->root())) expand({alt}, start);
    current_ = intern_state(intern_set(std::move(start)), 0, 0, 0);
}

GrammarMatcher::GrammarMatcher(std::shared_ptr<const Grammar> grammar, const std::vector<std::string> &triggers)
    : GrammarMatcher(std::move(grammar)) {
    for (const std::string &t : triggers) {
        const bool anchored = !t.empty() && t[0] == '^';
        if (t.size() == (anchored ? 1u : 0u)) fail(FASTLLM_ERR_INVALID_ARGUMENT, "grammar: an empty trigger");
        if (anchored && std::strchr(" \t\r\n", t[1]))  // it is looked for after the blanks
            fail(FASTLLM_ERR_INVALID_ARGUMENT, "grammar: an anchored trigger may not begin with whitespace");
        if (t.size() > kMaxTrigger) fail(FASTLLM_ERR_INVALID_ARGUMENT, "grammar: a trigger over %zu bytes", kMaxTrigger);
        triggers_.push_back({anchored ? t.substr(1) : t, anchored});
        longest_trigger_ = std::max(longest_trigger_, triggers_.back().text.size());
    }
    waiting_ = !triggers_.empty();
}

namespace {
constexpr const char *kBlank = " \t\r\n";
}

bool GrammarMatcher::anchored_armed() const {
    const size_t at = accepted_.find_first_not_of(kBlank);
    if (at == std::string::npos) return true;
    const std::string_view rest = std::string_view(accepted_).substr(at);
    for (const Trigger &t : triggers_)  // still a proper prefix of one (no trigger is in the text yet)
        if (t.anchored && rest.size() < t.text.size() && t.text.compare(0, rest.size(), rest) == 0) return true;
    return false;
}

size_t GrammarMatcher::trigger_in(std::string_view more, std::string &window) const {
    // The others need only the bytes that may hold a trigger's beginning; an armed anchored
    // trigger the text from its first non-blank byte (part of a trigger), after blanks, of which
    // the window keeps no more than that.
    const bool whole = anchored_armed();
    size_t from = accepted_.size() - std::min(accepted_.size(), longest_trigger_ - 1);
    if (whole) from = std::min(from, std::min(accepted_.find_first_not_of(kBlank), accepted_.size()));
    window.assign(accepted_, from, std::string::npos);
    window.append(more);
    // The trigger completed first (the smallest end; of those, the longest): the same whichever
    // way the text was split into tokens, so a saved state's replay finds it too.
    size_t best = std::string::npos, best_end = std::string::npos;
    for (const Trigger &t : triggers_) {
        size_t at = std::string::npos;
        if (!t.anchored) at = window.find(t.text);
        else if (whole && (at = window.find_first_not_of(kBlank)) != std::string::npos &&
                 window.compare(at, t.text.size(), t.text) != 0)
            at = std::string::npos;
        if (at == std::string::npos) continue;
        const size_t end = at + t.text.size();
        if (end < best_end || (end == best_end && at < best)) best = at, best_end = end;
    }
    return best;
}

void GrammarMatcher::find_candidates(const TokenTrie &trie) {
    // A token completes a trigger only if it holds one whole, or begins with the rest of one after
    // a first part that the text already ends with.
    have_candidates_ = true;
    const TokenTrie::Node *nodes = trie.nodes();
    const int32_t *tokens = trie.tokens();
    std::string path;
    for (size_t i = 1; i < trie.size(); i++) {
        path.resize(nodes[i].depth - 1u);
        path.push_back((char)nodes[i].byte);
        if (nodes[i].first_token == nodes[i + 1].first_token) continue;
        bool candidate = false;
        for (const Trigger &t : triggers_) {
            candidate = candidate || path.find(t.text) != std::string::npos;
            for (size_t j = std::max<size_t>(1, t.text.size() - std::min(t.text.size(), path.size()));
                 j < t.text.size() && !candidate; j++)
                candidate = path.compare(0, t.text.size() - j, t.text, j) == 0;
        }
        if (candidate)
            for (uint32_t k = nodes[i].first_token; k < nodes[i + 1].first_token; k++) candidates_.emplace_back(tokens[k], path);
    }
}

void GrammarMatcher::expand(Stack stack, StackSet &out) const {
    const std::vector<Grammar::Elem> &elems = grammar_->elems();
    std::vector<Stack> work;
    work.push_back(std::move(stack));
    size_t steps = 0;
    while (!work.empty()) {
        Stack st = std::move(work.back());
        work.pop_back();
        for (;;) {
            if (++steps > kMaxExpansion || out.stacks.size() > kMaxStacks)
                fail(FASTLLM_ERR_INVALID_ARGUMENT, "grammar: too ambiguous: over %zu parse stacks after %zu bytes of text",
                     kMaxStacks, accepted_.size());
            if (st.empty()) {
                out.accepting = true;
                break;
            }
            const uint32_t p = st.back();
            const Grammar::Elem e = elems[p];
            if (e.kind == Grammar::kChars) {
                out.stacks.push_back(std::move(st));
                break;
            }
            st.pop_back();
            if (e.kind == Grammar::kEnd) continue;  // the rule is done: its caller's continuation is on top
            if (elems[p + 1].kind != Grammar::kEnd) st.push_back(p + 1);  // a tail call pushes nothing
            const std::vector<uint32_t> &alts = grammar_->alternatives(e.arg);
            for (size_t a = 1; a < alts.size(); a++) {
                work.push_back(st);
                work.back().push_back(alts[a]);
            }
            st.push_back(alts[0]);
        }
    }
}

GrammarMatcher::StackSet GrammarMatcher::advance(const StackSet &from, uint32_t cp) const {
    StackSet out;
    for (const Stack &s : from.stacks) {
        const uint32_t top = s.back();
        if (!grammar_->char_class(grammar_->elems()[top].arg).contains(cp)) continue;
        Stack next = s;
        next.back() = top + 1;
        expand(std::move(next), out);
    }
    return out;
}

bool GrammarMatcher::any_top_intersects(const StackSet &set, uint32_t lo, uint32_t hi) const {
    for (const Stack &s : set.stacks)
        if (grammar_->char_class(grammar_->elems()[s.back()].arg).intersects(lo, hi)) return true;
    return false;
}

uint32_t GrammarMatcher::intern_set(StackSet &&set) {
    std::sort(set.stacks.begin(), set.stacks.end());
    set.stacks.erase(std::unique(set.stacks.begin(), set.stacks.end()), set.stacks.end());
    std::string key(1, set.accepting ? '\1' : '\0');
    for (const Stack &s : set.stacks) {
        uint32_t len = (uint32_t)s.size();
        key.append((const char *)&len, sizeof len);
        key.append((const char *)s.data(), s.size() * sizeof(uint32_t));
    }
    auto it = set_ids_.find(key);
    if (it != set_ids_.end()) return it->second;
    uint32_t id = (uint32_t)sets_.size();
    sets_.push_back(std::move(set));
    set_ids_.emplace(std::move(key), id);
    return id;
}

int32_t GrammarMatcher::intern_state(uint32_t set, uint32_t prefix, uint8_t need, uint8_t len) {
    const uint64_t key = (uint64_t)set << 32 | (uint64_t)prefix << 8 | (uint64_t)need << 4 | len;
    auto it = state_ids_.find(key);
    if (it != state_ids_.end()) return it->second;
    int32_t id = (int32_t)states_.size();
    states_.push_back(State{set, prefix, need, len});
    state_ids_.emplace(key, id);
    next_.resize(next_.size() + 256, kUnknown);
    return id;
}

int32_t GrammarMatcher::compute(int32_t state, uint8_t byte) {
    static const uint32_t kMinOfLen[5] = {0, 0, 0x80, 0x800, 0x10000};  // shortest form of each length
    const State st = states_[state];
    int32_t result = kDead;
    // After a whole character: the stacks that consume it (dead if none, unless the text may end).
    auto after_char = [&](uint32_t cp) {
        const uint64_t key = (uint64_t)st.set << 32 | grammar_->char_group(cp);
        auto it = after_group_.find(key);
        if (it != after_group_.end()) return it->second;
        StackSet n = advance(sets_[st.set], cp);
        const int32_t to = n.stacks.empty() && !n.accepting ? kDead : intern_state(intern_set(std::move(n)), 0, 0, 0);
        after_group_.emplace(key, to);
        return to;
    };
    // Part of a character: alive while some top accepts a code point it can still become.
    auto partial = [&](uint32_t bits, uint8_t need, uint8_t len) {
        uint32_t lo = std::max(bits << (6 * need), kMinOfLen[len]);
        uint32_t hi = std::min(((bits + 1) << (6 * need)) - 1, kMaxCodepoint);
        if (lo > hi || !any_top_intersects(sets_[st.set], lo, hi)) return kDead;
        return intern_state(st.set, bits, need, len);
    };
    if (st.need == 0) {
        if (byte < 0x80) result = after_char(byte);
        else if (byte >= 0xC2 && byte <= 0xDF) result = partial(byte & 0x1F, 1, 2);
        else if ((byte & 0xF0) == 0xE0) result = partial(byte & 0x0F, 2, 3);
        else if (byte >= 0xF0 && byte <= 0xF4) result = partial(byte & 0x07, 3, 4);
        // else a continuation byte, or a lead byte no valid character starts with
    } else if ((byte & 0xC0) == 0x80) {
        const uint32_t bits = st.prefix << 6 | (byte & 0x3F);
        if (st.need > 1) {
            result = partial(bits, (uint8_t)(st.need - 1), st.len);
        } else if (bits >= kMinOfLen[st.len] && bits <= kMaxCodepoint && !(bits >= 0xD800 && bits <= 0xDFFF)) {
            result = after_char(bits);
        }
    }
    next_[(size_t)state * 256 + byte] = result;
    return result;
}

void GrammarMatcher::compact_if_large() {
    if (states_.size() <= kMaxStates) return;
    StackSet keep = sets_[states_[current_].set];
    const State cur = states_[current_];
    sets_.clear();
    set_ids_.clear();
    states_.clear();
    state_ids_.clear();
    after_group_.clear();
    next_.clear();
    current_ = intern_state(intern_set(std::move(keep)), cur.prefix, cur.need, cur.len);
}

int32_t GrammarMatcher::state_after(std::string_view bytes, bool &triggered) {
    compact_if_large();
    std::string window;
    triggered = false;
    if (waiting_) {  // the grammar follows the text from a trigger on, if one is completed
        const size_t at = trigger_in(bytes, window);
        if (at == std::string::npos) return current_;
        triggered = true;
        bytes = std::string_view(window).substr(at);
    }
    int32_t s = current_;
    for (char b : bytes)
        if ((s = next(s, (uint8_t)b)) < 0) return kDead;
    return s;
}

bool GrammarMatcher::accept(std::string_view bytes) {
    bool triggered;
    const int32_t s = state_after(bytes, triggered);
    if (s < 0) return false;
    current_ = s;
    waiting_ = waiting_ && !triggered;
    accepted_.append(bytes);
    return true;
}

bool GrammarMatcher::allows(std::string_view bytes) {
    bool triggered;
    return state_after(bytes, triggered) >= 0;
}

bool GrammarMatcher::complete() const {
    const State &st = states_[current_];
    return waiting_ || (st.need == 0 && sets_[st.set].accepting);
}

bool GrammarMatcher::can_continue() const {
    const State &st = states_[current_];
    return waiting_ || st.need > 0 || !sets_[st.set].stacks.empty();
}

void GrammarMatcher::mark_allowed(const TokenTrie &trie, bool allow_eos) {
    compact_if_large();
    if (waiting_) {  // free text, but for the tokens that would trigger the grammar into a dead end
        if (!have_candidates_) find_candidates(trie);
        allowed_.assign((size_t)trie.vocab_size(), 1);
        for (const auto &[id, piece] : candidates_)
            if (!allows(piece)) allowed_[(size_t)id] = 0;
        return;
    }
    allowed_.assign((size_t)trie.vocab_size(), 0);
    path_.resize(trie.max_depth() + 1);
    path_[0] = current_;
    const TokenTrie::Node *nodes = trie.nodes();
    const int32_t *tokens = trie.tokens();
    const size_t n = trie.size();
    for (size_t i = 1; i < n;) {
        const TokenTrie::Node &node = nodes[i];
        const int32_t s = next(path_[node.depth - 1], node.byte);
        if (s < 0) {
            i = node.end;  // nothing below a dead prefix can be valid
            continue;
        }
        path_[node.depth] = s;
        for (uint32_t t = node.first_token, e = nodes[i + 1].first_token; t < e; t++) allowed_[(size_t)tokens[t]] = 1;
        i++;
    }
    if (allow_eos && complete())
        for (int32_t id : trie.eos_ids()) allowed_[(size_t)id] = 1;
}

size_t GrammarMatcher::mask(const TokenTrie &trie, float *logits, size_t n_logits, bool allow_eos) {
    mark_allowed(trie, allow_eos);
    size_t n_allowed = 0;
    for (size_t id = 0; id < n_logits; id++) {
        if (id < allowed_.size() && allowed_[id]) n_allowed++;
        else logits[id] = -INFINITY;
    }
    return n_allowed;
}

std::vector<uint8_t> GrammarMatcher::allowed(const TokenTrie &trie, size_t n, bool allow_eos) {
    mark_allowed(trie, allow_eos);
    std::vector<uint8_t> out(n, 0);
    std::copy_n(allowed_.begin(), std::min(n, allowed_.size()), out.begin());
    return out;
}

}  // namespace fastllm
