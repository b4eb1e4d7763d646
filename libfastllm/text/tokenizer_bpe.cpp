#include "text/tokenizer_bpe.h"

#include <algorithm>
#include <queue>

#include "base/error.h"
#include "format/flm_file.h"
#include "text/unicode.h"

namespace fastllm {

using unicode::LETTER;
using unicode::NUMBER;
using unicode::OTHER;
using unicode::SPACE;

namespace {

// GPT-2's bytes_to_unicode: printable bytes stand for themselves, the other 68 bytes (controls,
// space, DEL, NBSP, soft hyphen...) take the code points 256, 257, ... in byte order.
struct ByteAlphabet {
    uint32_t to_cp[256];
    int16_t to_byte[324];  // code point -> byte, -1 if the code point is not in the alphabet
    std::string text[256];

    ByteAlphabet() {
        std::fill(std::begin(to_byte), std::end(to_byte), -1);
        uint32_t extra = 256;
        for (int b = 0; b < 256; b++) {
            bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
            to_cp[b] = printable ? (uint32_t)b : extra++;
            to_byte[to_cp[b]] = (int16_t)b;
            unicode::append_utf8(text[b], to_cp[b]);
        }
    }
};
const ByteAlphabet &alphabet() {
    static const ByteAlphabet a;
    return a;
}

// The code points of a text with their classes and byte offsets.
struct Codepoints {
    std::vector<uint32_t> cp;
    std::vector<uint8_t> cls;
    std::vector<size_t> off;  // off[k]: byte offset of code point k; off[size] = text size

    explicit Codepoints(std::string_view text) {
        cp.reserve(text.size());
        cls.reserve(text.size());
        off.reserve(text.size() + 1);
        for (size_t i = 0; i < text.size();) {
            off.push_back(i);
            uint32_t c = unicode::decode_utf8(text, i);
            cp.push_back(c);
            cls.push_back(c == unicode::kInvalid ? OTHER : unicode::classify(c));
        }
        off.push_back(text.size());
    }
    size_t size() const { return cp.size(); }
};

bool is_crlf(uint32_t c) { return c == '\r' || c == '\n'; }

// End of the run of class `cls` that starts at i (< e).
size_t run_end(const Codepoints &c, size_t i, size_t e, uint8_t cls) {
    while (i < e && c.cls[i] == cls) i++;
    return i;
}

// The whitespace alternatives shared by all patterns, at i (whitespace) with the run ending
// at j: `\s+(?!\S)` leaves the last space to the next word unless the run reaches the end;
// `\s+` takes a single space.
size_t match_trailing_space(size_t i, size_t j, size_t e) { return (j == e || j - i == 1) ? j : j - 1; }

// One match of GPT-2's pattern at i (< e); returns its end.
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
size_t match_gpt2(const Codepoints &c, size_t i, size_t e) {
    uint32_t ch = c.cp[i];
    if (ch == '\'' && i + 1 < e) {
        uint32_t a = c.cp[i + 1];
        if (a == 's' || a == 't' || a == 'm' || a == 'd') return i + 2;
        if (i + 2 < e) {
            uint32_t b = c.cp[i + 2];
            if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return i + 3;
        }
    }
    size_t s = ch == ' ' ? i + 1 : i;  // the optional leading space
    if (s < e && c.cls[s] != SPACE) return run_end(c, s + 1, e, c.cls[s]);
    return match_trailing_space(i, run_end(c, i + 1, e, SPACE), e);
}

// Case-insensitive contraction letter: ASCII letters plus the one non-ASCII code point whose
// simple case folding is one of "strevmld": U+017F LATIN SMALL LETTER LONG S.
uint32_t fold(uint32_t c) {
    if (c >= 'A' && c <= 'Z') return c + 32;
    if (c == 0x17F) return 's';
    return c;
}

// One match of the Llama 3 pattern (max_digits 3) or the Qwen2 one (max_digits 1) at i (< e).
//   (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|
//   \s*[\r\n]+|\s+(?!\S)|\s+
size_t match_llama3(const Codepoints &c, size_t i, size_t e, size_t max_digits) {
    uint32_t ch = c.cp[i];
    if (ch == '\'' && i + 1 < e) {
        uint32_t a = fold(c.cp[i + 1]);
        if (a == 's' || a == 't' || a == 'm' || a == 'd') return i + 2;
        if (i + 2 < e) {
            uint32_t b = fold(c.cp[i + 2]);
            if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return i + 3;
        }
    }
    uint8_t cls = c.cls[i];
    if (cls == LETTER) return run_end(c, i + 1, e, LETTER);
    if (cls != NUMBER && !is_crlf(ch) && i + 1 < e && c.cls[i + 1] == LETTER) return run_end(c, i + 2, e, LETTER);
    if (cls == NUMBER) {
        size_t j = i + 1;
        while (j < e && j - i < max_digits && c.cls[j] == NUMBER) j++;
        return j;
    }
    size_t s = ch == ' ' ? i + 1 : i;
    if (s < e && c.cls[s] == OTHER) {
        size_t j = run_end(c, s + 1, e, OTHER);
        while (j < e && is_crlf(c.cp[j])) j++;
        return j;
    }
    // Here ch is whitespace.
    size_t j = run_end(c, i + 1, e, SPACE);
    for (size_t p = j; p > i; p--)  // \s*[\r\n]+ : up to the last line break of the run
        if (is_crlf(c.cp[p - 1])) return p;
    return match_trailing_space(i, j, e);
}

}  // namespace

BpeTokenizer::BpeTokenizer(const FlmFile &file, int64_t vocab_size) {
    const char *path = file.path().c_str();
    const ByteAlphabet &abc = alphabet();

    pieces_ = file.get_strings("tokenizer.tokens");
    const auto &types = file.get_ints("tokenizer.token_types");
    if ((int64_t)pieces_.size() != vocab_size || types.size() != pieces_.size())
        fail(FASTLLM_ERR_BAD_FORMAT, "%s: tokenizer has %zu tokens and %zu token types; the model's vocabulary is %lld",
             path, pieces_.size(), types.size(), (long long)vocab_size);

    if (!file.has("tokenizer.pre")) fail(FASTLLM_ERR_BAD_FORMAT, "%s: tokenizer.pre is missing", path);
    std::string pre = file.get_string("tokenizer.pre");
    if (pre == "gpt2")
        pre_ = Pre::GPT2;
    else if (pre == "llama3")
        pre_ = Pre::LLAMA3;
    else if (pre == "qwen2")
        pre_ = Pre::QWEN2;
    else if (pre == "smollm")
        pre_ = Pre::SMOLLM;
    else
        fail(FASTLLM_ERR_BAD_FORMAT, "%s: unknown tokenizer.pre '%s' (known: gpt2, llama3, qwen2, smollm)", path,
             pre.c_str());
    ignore_merges_ = file.get_int("tokenizer.ignore_merges", 0) != 0;

    read_special_ids(file, vocab_size, /*add_bos_default=*/false);  // byte-level BPE has no unknown text

    // Types, decoded bytes, the text -> id map (normal tokens win over added ones of the same
    // text, then the lower id), the added-token trie.
    types_.resize(pieces_.size());
    bytes_.resize(pieces_.size());
    for (size_t id = 0; id < pieces_.size(); id++) {
        int64_t t = types[id];
        if (t != NORMAL && t != SPECIAL && t != ADDED && t != UNUSED)
            fail(FASTLLM_ERR_BAD_FORMAT, "%s: token %zu has type %lld (a bpe vocabulary has types 1, 3, 4 and 5)", path, id,
                 (long long)t);
        types_[id] = (uint8_t)t;
        if (t == UNUSED) continue;
        const std::string &text = pieces_[id];
        if (t == NORMAL) vocab_.emplace(text, (int32_t)id);
        // tokenizers' ByteLevel decoder: a token whose characters are all in the byte alphabet
        // stands for those bytes; any other token for its own text.
        std::string raw;
        bool in_alphabet = true;
        for (size_t i = 0; i < text.size() && in_alphabet;) {
            uint32_t cp = unicode::decode_utf8(text, i);
            if (cp < 324 && abc.to_byte[cp] >= 0)
                raw += (char)abc.to_byte[cp];
            else
                in_alphabet = false;
        }
        bytes_[id] = in_alphabet ? raw : text;
        if (t == SPECIAL || t == ADDED) {
            if (text.empty()) fail(FASTLLM_ERR_BAD_FORMAT, "%s: added token %zu is empty", path, id);
            added_.add(text, (int32_t)id);
        }
    }
    read_added_strip(file, added_);
    for (size_t id = 0; id < pieces_.size(); id++)
        if (types_[id] == SPECIAL || types_[id] == ADDED) vocab_.emplace(pieces_[id], (int32_t)id);
    for (int b = 0; b < 256; b++) byte_token_[b] = lookup(abc.text[b]);

    // Merges: "left right", in rank order; a later duplicate of a pair replaces the earlier one
    // (as tokenizers' merge map does).
    const auto &merges = file.get_strings("tokenizer.merges");
    merges_.reserve(merges.size());
    for (size_t rank = 0; rank < merges.size(); rank++) {
        const std::string &m = merges[rank];
        size_t sp = m.find(' ');
        if (sp == std::string::npos || sp == 0 || sp + 1 == m.size() || m.find(' ', sp + 1) != std::string::npos)
            fail(FASTLLM_ERR_BAD_FORMAT, "%s: merge %zu ('%s') is not two tokens separated by one space", path, rank,
                 m.c_str());
        std::string left = m.substr(0, sp), right = m.substr(sp + 1);
        int32_t l = lookup(left), r = lookup(right), joined = lookup(left + right);
        if (l < 0 || r < 0 || joined < 0)
            fail(FASTLLM_ERR_BAD_FORMAT, "%s: merge %zu ('%s') names '%s', which is not a token", path, rank, m.c_str(),
                 (l < 0 ? left : r < 0 ? right : left + right).c_str());
        if (rank > (size_t)INT32_MAX) fail(FASTLLM_ERR_BAD_FORMAT, "%s: too many merges", path);
        merges_[(uint64_t)(uint32_t)l << 32 | (uint32_t)r] = {(int32_t)rank, joined};
    }
}

int32_t BpeTokenizer::lookup(const std::string &token) const {
    auto it = vocab_.find(token);
    return it == vocab_.end() ? -1 : it->second;
}

std::vector<int32_t> BpeTokenizer::encode(std::string_view text, bool add_bos) const {
    std::vector<int32_t> out;
    if (add_bos && bos_id_ >= 0) out.push_back(bos_id_);
    for (const auto &piece : added_.split(text)) {
        if (piece.id >= 0) out.push_back(piece.id);
        else encode_text(piece.text, out);
    }
    return out;
}

void BpeTokenizer::encode_text(std::string_view text, std::vector<int32_t> &out) const {
    if (text.empty()) return;
    Codepoints c(text);
    size_t n = c.size();
    auto word = [&](size_t a, size_t b) { encode_word(text.substr(c.off[a], c.off[b] - c.off[a]), out); };
    auto split = [&](size_t b, size_t e) {  // pieces of the code points [b, e)
        for (size_t i = b; i < e;) {
            size_t j;
            switch (pre_) {
            case Pre::LLAMA3: j = match_llama3(c, i, e, 3); break;
            case Pre::QWEN2: j = match_llama3(c, i, e, 1); break;
            default: j = match_gpt2(c, i, e); break;
            }
            word(i, j);
            i = j;
        }
    };
    if (pre_ != Pre::SMOLLM) {
        split(0, n);
        return;
    }
    // SmolLM: every digit alone (tokenizers' Digits(individual_digits=True)), then GPT-2's
    // pattern on each stretch between digits.
    for (size_t i = 0; i < n;) {
        if (c.cls[i] == NUMBER) {
            word(i, i + 1);
            i++;
        } else {
            size_t j = i + 1;
            while (j < n && c.cls[j] != NUMBER) j++;
            split(i, j);
            i = j;
        }
    }
}

void BpeTokenizer::encode_word(std::string_view word, std::vector<int32_t> &out) const {
    if (word.size() == 1) {
        int32_t id = byte_token_[(unsigned char)word[0]];
        if (id >= 0) out.push_back(id);
        return;
    }
    if (ignore_merges_) {  // a word that is a token is that token
        std::string text;
        for (unsigned char b : word) text += alphabet().text[b];
        int32_t id = lookup(text);
        if (id >= 0) {
            out.push_back(id);
            return;
        }
    }
    // One symbol per byte (a byte without a token is dropped, as tokenizers does without an
    // unknown token), in a linked list; then merge the pair of lowest rank, leftmost first,
    // until no pair has a merge: O(n log n) with a heap of candidate pairs.
    struct Symbol {
        int32_t id, prev, next;
    };
    std::vector<Symbol> sym;
    sym.reserve(word.size());
    for (unsigned char b : word) {
        int32_t id = byte_token_[b];
        if (id < 0) continue;
        int32_t k = (int32_t)sym.size();
        sym.push_back({id, k - 1, k + 1});
    }
    if (sym.empty()) return;
    sym.back().next = -1;

    struct Candidate {
        int32_t rank, pos, result;
        bool operator<(const Candidate &o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
    };
    auto find_merge = [&](int32_t l, int32_t r) -> const Merge * {
        auto it = merges_.find((uint64_t)(uint32_t)sym[l].id << 32 | (uint32_t)sym[r].id);
        return it == merges_.end() ? nullptr : &it->second;
    };
    std::vector<Candidate> heap_storage;
    heap_storage.reserve(sym.size());
    std::priority_queue<Candidate> heap(std::less<Candidate>(), std::move(heap_storage));
    for (int32_t k = 0; k + 1 < (int32_t)sym.size(); k++)
        if (const Merge *m = find_merge(k, k + 1)) heap.push({m->rank, k, m->result});
    std::vector<bool> dead(sym.size(), false);
    while (!heap.empty()) {
        Candidate top = heap.top();
        heap.pop();
        Symbol &s = sym[top.pos];
        if (dead[top.pos] || s.next < 0) continue;
        // A stale candidate: the pair at pos changed since it was queued (tokenizers' check).
        const Merge *m = find_merge(top.pos, s.next);
        if (!m || m->result != top.result) continue;
        int32_t right = s.next;
        s.id = top.result;
        dead[right] = true;
        s.next = sym[right].next;
        if (s.next >= 0) sym[s.next].prev = top.pos;
        if (s.prev >= 0)
            if (const Merge *pm = find_merge(s.prev, top.pos)) heap.push({pm->rank, s.prev, pm->result});
        if (s.next >= 0)
            if (const Merge *nm = find_merge(top.pos, s.next)) heap.push({nm->rank, top.pos, nm->result});
    }
    for (int32_t k = 0; k >= 0; k = sym[k].next) out.push_back(sym[k].id);
}

std::string BpeTokenizer::piece_bytes(int32_t id) const {
    if (id < 0 || id >= vocab_size() || types_[id] == SPECIAL || types_[id] == UNUSED) return "";
    return bytes_[id];
}

std::string BpeTokenizer::decode(const int32_t *ids, size_t n) const {
    std::string bytes;
    for (size_t i = 0; i < n; i++) bytes += piece_bytes(ids[i]);
    return unicode::utf8_lossy(bytes);
}

}  // namespace fastllm
