#include "text/tokenizer_spm.h"

#include <cstdio>
#include <cstring>
#include <queue>

#include "base/error.h"
#include "format/flm_file.h"

namespace fastllm {

namespace {
const std::string kSpace = "\xE2\x96\x81";  // U+2581 LOWER ONE EIGHTH BLOCK, SentencePiece's space

std::string replace_all(std::string s, const std::string &from, const std::string &to) {
    size_t pos = 0;
    while ((pos = s.find(from, pos)) != std::string::npos) {
        s.replace(pos, from.size(), to);
        pos += to.size();
    }
    return s;
}

int utf8_char_len(unsigned char c) {
    if (c >= 0xF0) return 4;
    if (c >= 0xE0) return 3;
    if (c >= 0xC0) return 2;
    return 1;
}
}  // namespace

SpmTokenizer::SpmTokenizer(const FlmFile &file, int64_t vocab_size) {
    const char *path = file.path().c_str();
    pieces_ = file.get_strings("tokenizer.tokens");
    scores_ = file.get_floats("tokenizer.scores");
    const auto &types = file.get_ints("tokenizer.token_types");
    if ((int64_t)pieces_.size() != vocab_size || scores_.size() != pieces_.size() || types.size() != pieces_.size())
        fail(FASTLLM_ERR_BAD_FORMAT, "%s: tokenizer has %zu pieces, %zu scores, %zu types; the model's vocabulary is %lld",
             path, pieces_.size(), scores_.size(), types.size(), (long long)vocab_size);
    unk_id_ = read_special_ids(file, vocab_size, /*add_bos_default=*/true);
    add_dummy_prefix_ = file.get_int("tokenizer.add_dummy_prefix", 1) != 0;
    remove_extra_whitespaces_ = file.get_int("tokenizer.remove_extra_whitespaces", 0) != 0;
    byte_fallback_ = file.get_int("tokenizer.byte_fallback", 1) != 0;

    std::fill(std::begin(byte_ids_), std::end(byte_ids_), -1);
    types_.resize(pieces_.size());
    for (size_t id = 0; id < pieces_.size(); id++) {
        int t = (int)types[id];
        if (t < NORMAL || t > BYTE) fail(FASTLLM_ERR_BAD_FORMAT, "%s: token %zu has unknown type %d", path, id, t);
        types_[id] = t;
        if (t == NORMAL || t == USER_DEFINED) mergeable_.emplace(pieces_[id], (int32_t)id);
        unsigned byte;
        if (t == BYTE && pieces_[id].size() == 6 && std::sscanf(pieces_[id].c_str(), "<0x%02X>", &byte) == 1)
            byte_ids_[byte] = (int32_t)id;
        const std::string &p = pieces_[id];
        if ((t == CONTROL || t == USER_DEFINED) && !p.empty() && p != "<s>" && p != "</s>" &&
            p.find(kSpace) == std::string::npos)
            added_.add(p, (int32_t)id);
    }
    read_added_strip(file, added_);
    std::string prefix = file.get_string("tokenizer.prefix_after_added", "never");
    if (prefix == "never") prefix_after_added_ = Prefix::NEVER;
    else if (prefix == "always") prefix_after_added_ = Prefix::ALWAYS;
    else if (prefix == "unless_space") prefix_after_added_ = Prefix::UNLESS_SPACE;
    else
        fail(FASTLLM_ERR_BAD_FORMAT, "%s: tokenizer.prefix_after_added is '%s' (expected never, always or unless_space)",
             path, prefix.c_str());
}

std::vector<int32_t> SpmTokenizer::encode(std::string_view text, bool add_bos) const {
    std::vector<int32_t> out;
    if (add_bos && bos_id_ >= 0) out.push_back(bos_id_);
    for (const auto &piece : added_.split(text)) {
        if (piece.id >= 0) {
            out.push_back(piece.id);
            continue;
        }
        bool prefix = add_dummy_prefix_;
        if (piece.after_token && prefix_after_added_ == Prefix::NEVER) prefix = false;
        if (piece.after_token && prefix_after_added_ == Prefix::UNLESS_SPACE)
            prefix = prefix && piece.text[0] != ' ' && piece.text.substr(0, kSpace.size()) != kSpace;
        encode_text(piece.text, prefix, out);
    }
    return out;
}

void SpmTokenizer::encode_text(std::string_view text_in, bool dummy_prefix, std::vector<int32_t> &out) const {
    // Normalise as the SentencePiece identity normaliser does.
    std::string text(text_in);
    if (remove_extra_whitespaces_) {
        std::string t;
        for (char c : text)
            if (c != ' ' || (!t.empty() && t.back() != ' ')) t += c;
        while (!t.empty() && t.back() == ' ') t.pop_back();
        text = t;
    }
    if (text.empty()) return;
    if (dummy_prefix) text = " " + text;
    text = replace_all(text, " ", kSpace);

    // Symbols: one per UTF-8 character, in a doubly linked list.
    struct Symbol {
        int prev, next;
        size_t start, len;  // bytes of text
    };
    std::vector<Symbol> sym;
    for (size_t i = 0; i < text.size();) {
        size_t n = std::min<size_t>(utf8_char_len((unsigned char)text[i]), text.size() - i);
        sym.push_back({(int)sym.size() - 1, (int)sym.size() + 1, i, n});
        i += n;
    }
    sym.back().next = -1;

    // Repeatedly merge the adjacent pair whose joined piece has the highest score (leftmost on ties).
    struct Pair {
        float score;
        int left, right;
        size_t len;  // joined length when queued; a stale entry no longer matches
        bool operator<(const Pair &o) const { return score != o.score ? score < o.score : left > o.left; }
    };
    std::priority_queue<Pair> agenda;
    auto try_pair = [&](int l, int r) {
        if (l < 0 || r < 0) return;
        auto it = mergeable_.find(text.substr(sym[l].start, sym[l].len + sym[r].len));
        if (it != mergeable_.end()) agenda.push({scores_[it->second], l, r, sym[l].len + sym[r].len});
    };
    for (size_t i = 0; i + 1 < sym.size(); i++) try_pair((int)i, (int)i + 1);
    while (!agenda.empty()) {
        Pair p = agenda.top();
        agenda.pop();
        Symbol &l = sym[p.left];
        if (l.len == 0 || l.next != p.right || sym[p.right].len == 0 || l.len + sym[p.right].len != p.len) continue;
        Symbol &r = sym[p.right];
        l.len += r.len;
        r.len = 0;
        l.next = r.next;
        if (r.next >= 0) sym[r.next].prev = p.left;
        try_pair(l.prev, p.left);
        try_pair(p.left, l.next);
    }

    for (int i = 0; i >= 0; i = sym[i].next) {
        std::string piece = text.substr(sym[i].start, sym[i].len);
        auto it = mergeable_.find(piece);
        if (it != mergeable_.end()) {
            out.push_back(it->second);
        } else if (byte_fallback_) {
            for (unsigned char c : piece) out.push_back(byte_ids_[c] >= 0 ? byte_ids_[c] : unk_id_);
        } else {
            out.push_back(unk_id_);
        }
    }
}

std::string SpmTokenizer::piece_bytes(int32_t id) const {
    if (id < 0 || id >= vocab_size()) return "";
    switch (types_[id]) {
    case CONTROL:
    case UNUSED: return "";
    case UNKNOWN: return " \xE2\x81\x87 ";  // SentencePiece's surface for <unk>: " ⁇ "
    case BYTE: {
        for (int b = 0; b < 256; b++)
            if (byte_ids_[b] == id) return std::string(1, (char)b);
        return "";
    }
    default: return replace_all(pieces_[id], kSpace, " ");
    }
}

std::string SpmTokenizer::decode(const int32_t *ids, size_t n) const {
    std::string bytes;
    bool at_start = true;  // the dummy-prefix space of the first text piece is dropped
    for (size_t i = 0; i < n; i++) {
        std::string piece = piece_bytes(ids[i]);
        int type = (ids[i] >= 0 && ids[i] < vocab_size()) ? types_[ids[i]] : CONTROL;
        if (type == CONTROL || type == UNUSED) continue;
        if (at_start && add_dummy_prefix_ && type != BYTE && !piece.empty() && piece[0] == ' ') piece.erase(0, 1);
        at_start = false;
        bytes += piece;
    }
    return sanitize_utf8(bytes);
}

}  // namespace fastllm
