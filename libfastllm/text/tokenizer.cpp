#include "text/tokenizer.h"

#include <algorithm>

#include "base/error.h"
#include "format/flm_file.h"
#include "text/tokenizer_bpe.h"
#include "text/tokenizer_wordpiece.h"
#include "text/tokenizer_spm.h"
#include "text/unicode.h"

namespace fastllm {

bool Tokenizer::is_eos(int32_t id) const {
    return id == eos_id_ || std::find(eos_ids_.begin(), eos_ids_.end(), id) != eos_ids_.end();
}

int32_t Tokenizer::read_special_ids(const FlmFile &file, int64_t vocab_size, bool add_bos_default) {
    const char *path = file.path().c_str();
    auto id_or_none = [&](const char *key) {
        int64_t id = file.get_int(key, -1);
        if (id < -1 || id >= vocab_size) fail(FASTLLM_ERR_BAD_FORMAT, "%s: %s = %lld is out of range", path, key, (long long)id);
        return (int32_t)id;
    };
    bos_id_ = id_or_none("tokenizer.bos_id");
    eos_id_ = id_or_none("tokenizer.eos_id");
    id_or_none("tokenizer.pad_id");
    if (file.has("tokenizer.eos_ids"))
        for (int64_t id : file.get_ints("tokenizer.eos_ids")) {
            if (id < 0 || id >= vocab_size) fail(FASTLLM_ERR_BAD_FORMAT, "%s: eos id %lld is out of range", path, (long long)id);
            eos_ids_.push_back((int32_t)id);
        }
    add_bos_ = file.get_int("tokenizer.add_bos", add_bos_default ? 1 : 0) != 0;
    return id_or_none("tokenizer.unk_id");
}

void Tokenizer::read_added_strip(const FlmFile &file, AddedTokens &added) const {
    for (const char *key : {"tokenizer.added_lstrip", "tokenizer.added_rstrip"}) {
        if (!file.has(key)) continue;
        bool left = key[16] == 'l';
        for (int64_t id : file.get_ints(key)) {
            if (id < 0 || id >= vocab_size())
                fail(FASTLLM_ERR_BAD_FORMAT, "%s: %s names token %lld, outside the vocabulary of %d", file.path().c_str(),
                     key, (long long)id, vocab_size());
            added.set_strip((int32_t)id, left, !left);
        }
    }
}

void AddedTokens::add(const std::string &text, int32_t id) {
    int32_t node = 0;
    for (unsigned char b : text) {
        auto &next = trie_[node].next;
        auto it = std::find_if(next.begin(), next.end(), [b](const auto &p) { return p.first == b; });
        if (it != next.end()) {
            node = it->second;
        } else {
            int32_t child = (int32_t)trie_.size();
            trie_[node].next.emplace_back(b, child);
            trie_.emplace_back();
            node = child;
        }
    }
    if (trie_[node].id < 0) trie_[node].id = id;
    if (!text.empty()) first_byte_[(unsigned char)text[0]] = true;
}

void AddedTokens::set_strip(int32_t id, bool lstrip, bool rstrip) {
    for (auto [on, list] : {std::pair{lstrip, &lstrip_}, std::pair{rstrip, &rstrip_}}) {
        auto at = std::lower_bound(list->begin(), list->end(), id);
        if (on && (at == list->end() || *at != id)) list->insert(at, id);
    }
}

bool AddedTokens::find(std::string_view text, size_t from, size_t &start, size_t &len, int32_t &id) const {
    for (size_t i = from; i < text.size(); i++) {
        if (!first_byte_[(unsigned char)text[i]]) continue;
        int32_t node = 0, best = -1;
        size_t best_len = 0;
        for (size_t k = i; k < text.size(); k++) {
            unsigned char b = text[k];
            const auto &next = trie_[node].next;
            auto it = std::find_if(next.begin(), next.end(), [b](const auto &p) { return p.first == b; });
            if (it == next.end()) break;
            node = it->second;
            if (trie_[node].id >= 0) {
                best = trie_[node].id;
                best_len = k + 1 - i;
            }
        }
        if (best >= 0) {
            start = i;
            len = best_len;
            id = best;
            return true;
        }
    }
    return false;
}

namespace {
// Start of the run of whitespace that ends at `end` (not before `floor`).
size_t whitespace_before(std::string_view text, size_t end, size_t floor) {
    size_t start = end;
    while (start > floor) {
        size_t b = start - 1;
        while (b > floor && ((unsigned char)text[b] & 0xC0) == 0x80) b--;  // back to a character's first byte
        size_t i = b;
        uint32_t cp = unicode::decode_utf8(text, i);
        if (i != start || cp == unicode::kInvalid || !unicode::is_whitespace(cp)) break;
        start = b;
    }
    return start;
}
// End of the run of whitespace that starts at `start`.
size_t whitespace_after(std::string_view text, size_t start) {
    while (start < text.size()) {
        size_t i = start;
        uint32_t cp = unicode::decode_utf8(text, i);
        if (cp == unicode::kInvalid || !unicode::is_whitespace(cp)) break;
        start = i;
    }
    return start;
}
}  // namespace

std::vector<AddedTokens::Piece> AddedTokens::split(std::string_view text) const {
    std::vector<Piece> out;
    size_t pos = 0, start, len;
    int32_t id;
    bool after_token = false;
    while (!empty() && find(text, pos, start, len, id)) {
        size_t end = start + len;
        if (std::binary_search(lstrip_.begin(), lstrip_.end(), id)) start = whitespace_before(text, start, pos);
        if (std::binary_search(rstrip_.begin(), rstrip_.end(), id)) end = whitespace_after(text, end);
        if (start > pos) out.push_back({text.substr(pos, start - pos), -1, after_token});
        out.push_back({text.substr(start, end - start), id, after_token});
        after_token = true;
        pos = end;
    }
    if (pos < text.size()) out.push_back({text.substr(pos), -1, after_token});
    return out;
}

std::unique_ptr<Tokenizer> make_tokenizer(const FlmFile &file, int64_t vocab_size) {
    std::string kind = file.get_string("tokenizer.model");
    if (kind == "spm") return std::make_unique<SpmTokenizer>(file, vocab_size);
    if (kind == "bpe") return std::make_unique<BpeTokenizer>(file, vocab_size);
    if (kind == "wordpiece") return std::make_unique<WordPieceTokenizer>(file, vocab_size);
    fail(FASTLLM_ERR_UNSUPPORTED, "%s: tokenizer type '%s' is not supported by this library", file.path().c_str(),
         kind.c_str());
}

namespace {
// Number of bytes of the UTF-8 sequence that starts with byte c (0 if c cannot start one).
int utf8_len(unsigned char c) {
    if (c < 0x80) return 1;
    if (c >= 0xC2 && c <= 0xDF) return 2;
    if (c >= 0xE0 && c <= 0xEF) return 3;
    if (c >= 0xF0 && c <= 0xF4) return 4;
    return 0;
}
// Length of a valid sequence at s[i], 0 if invalid or incomplete.
int valid_seq(std::string_view s, size_t i) {
    int n = utf8_len((unsigned char)s[i]);
    if (n == 0 || i + n > s.size()) return 0;
    for (int k = 1; k < n; k++)
        if (((unsigned char)s[i + k] & 0xC0) != 0x80) return 0;
    unsigned char c0 = s[i], c1 = n > 1 ? s[i + 1] : 0;
    if ((c0 == 0xE0 && c1 < 0xA0) || (c0 == 0xED && c1 > 0x9F) || (c0 == 0xF0 && c1 < 0x90) || (c0 == 0xF4 && c1 > 0x8F))
        return 0;  // overlong, surrogate or beyond U+10FFFF
    return n;
}
}  // namespace

std::string sanitize_utf8(const std::string &bytes) {
    std::string out;
    out.reserve(bytes.size());
    for (size_t i = 0; i < bytes.size();) {
        int n = valid_seq(bytes, i);
        if (n) {
            out.append(bytes, i, n);
            i += n;
        } else {
            out += "\xEF\xBF\xBD";
            i++;
        }
    }
    return out;
}

size_t utf8_complete_prefix(std::string_view s) {
    // Only the last up-to-3 bytes can be an incomplete character.
    size_t n = s.size();
    for (size_t back = 1; back <= 3 && back <= n; back++) {
        unsigned char c = s[n - back];
        if ((c & 0xC0) == 0x80) continue;  // continuation byte: look further back
        int need = utf8_len(c);
        return (need > (int)back) ? n - back : n;
    }
    return n;
}

}  // namespace fastllm
