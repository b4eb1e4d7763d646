// tokenizer_wordpiece.cpp — BERT's WordPiece; see tokenizer_wordpiece.h.
#include "text/tokenizer_wordpiece.h"

#include "base/error.h"
#include "format/flm_file.h"
#include "text/bert_tables.h"
#include "text/unicode.h"

namespace fastllm {

namespace {
constexpr uint32_t kHangulFirst = 0xAC00, kHangulLast = 0xD7A3;

void append_utf8_cps(std::string_view text, std::vector<uint32_t> &out) {
    for (size_t i = 0; i < text.size();) out.push_back(unicode::decode_utf8(text, i));
}
}  // namespace

WordPieceTokenizer::WordPieceTokenizer(const FlmFile &file, int64_t vocab_size) {
    const char *path = file.path().c_str();
    pieces_ = file.get_strings("tokenizer.tokens");
    const auto &types = file.get_ints("tokenizer.token_types");
    if ((int64_t)pieces_.size() != vocab_size || types.size() != pieces_.size())
        fail(FASTLLM_ERR_BAD_FORMAT, "%s: tokenizer has %zu tokens and %zu token types; the model's vocabulary is %lld",
             path, pieces_.size(), types.size(), (long long)vocab_size);
    unk_id_ = read_special_ids(file, vocab_size, /*add_bos_default=*/true);
    if (unk_id_ < 0) fail(FASTLLM_ERR_BAD_FORMAT, "%s: a wordpiece tokenizer needs tokenizer.unk_id", path);
    int64_t sep = file.get_int("tokenizer.sep_id", -1);
    if (sep < -1 || sep >= vocab_size) fail(FASTLLM_ERR_BAD_FORMAT, "%s: tokenizer.sep_id = %lld is out of range", path, (long long)sep);
    sep_id_ = (int32_t)sep;
    lowercase_ = file.get_int("tokenizer.lowercase", 1) != 0;
    strip_accents_ = file.get_int("tokenizer.strip_accents", lowercase_ ? 1 : 0) != 0;  // BertNormalizer: unset follows lowercase
    clean_text_ = file.get_int("tokenizer.clean_text", 1) != 0;
    chinese_chars_ = file.get_int("tokenizer.chinese_chars", 1) != 0;
    prefix_ = file.get_string("tokenizer.subword_prefix", "##");
    int64_t max_chars = file.get_int("tokenizer.max_word_chars", 100);
    if (max_chars < 1 || max_chars > (1 << 20))
        fail(FASTLLM_ERR_BAD_FORMAT, "%s: tokenizer.max_word_chars = %lld is out of range", path, (long long)max_chars);
    max_word_chars_ = (int32_t)max_chars;

    types_.resize(pieces_.size());
    for (size_t id = 0; id < pieces_.size(); id++) {
        int64_t t = types[id];
        if (t != NORMAL && t != SPECIAL)
            fail(FASTLLM_ERR_BAD_FORMAT, "%s: token %zu has type %lld (a wordpiece vocabulary has types 1 and 3)", path, id,
                 (long long)t);
        types_[id] = (uint8_t)t;
        vocab_.emplace(pieces_[id], (int32_t)id);  // the first id of a text wins, as in vocab.txt
        if (t == SPECIAL && !pieces_[id].empty()) added_.add(pieces_[id], (int32_t)id);
    }
    read_added_strip(file, added_);
}

std::vector<uint32_t> WordPieceTokenizer::normalize(std::string_view text) const {
    // BertNormalizer's steps, each character by character: clean_text, CJK spacing, accent
    // stripping (NFD without nonspacing marks), lowercase.
    std::vector<uint32_t> cleaned;
    cleaned.reserve(text.size());
    for (size_t i = 0; i < text.size();) {
        uint32_t cp = unicode::decode_utf8(text, i);
        if (cp == unicode::kInvalid) cp = 0xFFFD;  // as the text would be decoded lossily
        uint8_t f = bert::flags(cp);
        if (clean_text_) {
            if (cp == 0 || cp == 0xFFFD || (f & bert::CONTROL)) continue;
            if (f & bert::CLEAN_SPACE) cp = ' ', f = bert::flags(cp);
        }
        if (chinese_chars_ && (f & bert::CHINESE)) {
            cleaned.push_back(' ');
            cleaned.push_back(cp);
            cleaned.push_back(' ');
        } else {
            cleaned.push_back(cp);
        }
    }
    std::vector<uint32_t> stripped;
    if (strip_accents_) {
        stripped.reserve(cleaned.size());
        for (uint32_t cp : cleaned) {
            std::string_view s;
            if (cp >= kHangulFirst && cp <= kHangulLast) {  // Unicode's arithmetic decomposition
                uint32_t k = cp - kHangulFirst;
                stripped.push_back(0x1100 + k / 588);
                stripped.push_back(0x1161 + k % 588 / 28);
                if (k % 28) stripped.push_back(0x11A7 + k % 28);
            } else if (bert::strip(cp, s)) {
                append_utf8_cps(s, stripped);
            } else {
                stripped.push_back(cp);
            }
        }
    } else {
        stripped.swap(cleaned);
    }
    if (!lowercase_) return stripped;
    std::vector<uint32_t> lowered;
    lowered.reserve(stripped.size());
    for (uint32_t cp : stripped) {
        std::string_view s;
        if (bert::lower(cp, s)) append_utf8_cps(s, lowered);
        else lowered.push_back(cp);
    }
    return lowered;
}

void WordPieceTokenizer::encode_text(std::string_view text, std::vector<int32_t> &out) const {
    // BertPreTokenizer: words are split at whitespace (dropped) and around punctuation (each a
    // word of its own).
    const std::vector<uint32_t> cps = normalize(text);
    size_t start = 0;
    auto flush = [&](size_t end) {
        if (end > start) encode_word(cps, start, end, out);
    };
    for (size_t i = 0; i < cps.size(); i++) {
        uint8_t f = bert::flags(cps[i]);
        if (f & bert::SPACE) {
            flush(i);
            start = i + 1;
        } else if (f & bert::PUNCT) {
            flush(i);
            encode_word(cps, i, i + 1, out);
            start = i + 1;
        }
    }
    flush(cps.size());
}

void WordPieceTokenizer::encode_word(const std::vector<uint32_t> &cps, size_t first, size_t last,
                                     std::vector<int32_t> &out) const {
    if (last - first > (size_t)max_word_chars_) {
        out.push_back(unk_id_);
        return;
    }
    // UTF-8 of the word, with the byte offset of each character, so that pieces are substrings.
    std::string word;
    std::vector<size_t> at;
    for (size_t i = first; i < last; i++) {
        at.push_back(word.size());
        unicode::append_utf8(word, cps[i]);
    }
    at.push_back(word.size());
    const size_t n = last - first, mark = out.size();
    std::string key;
    for (size_t s = 0; s < n;) {
        // the longest piece from character s that the vocabulary has
        int32_t found = -1;
        size_t e = n;
        for (; e > s; e--) {
            key.assign(s > 0 ? prefix_ : std::string());
            key.append(word, at[s], at[e] - at[s]);
            auto it = vocab_.find(key);
            if (it != vocab_.end()) {
                found = it->second;
                break;
            }
        }
        if (found < 0) {  // the word cannot be cut into pieces: it is unknown as a whole
            out.resize(mark);
            out.push_back(unk_id_);
            return;
        }
        out.push_back(found);
        s = e;
    }
}

std::vector<int32_t> WordPieceTokenizer::encode(std::string_view text, bool add_bos) const {
    std::vector<int32_t> out;
    if (add_bos && bos_id_ >= 0) out.push_back(bos_id_);
    for (const AddedTokens::Piece &p : added_.split(text)) {
        if (p.id >= 0) out.push_back(p.id);
        else encode_text(p.text, out);
    }
    if (add_bos && sep_id_ >= 0) out.push_back(sep_id_);
    return out;
}

namespace {
// tokenizers' decoder cleanup (wordpiece cleanup = true): spaces before punctuation and English
// contractions go, applied to each piece as it is joined.
std::string cleanup(std::string s) {
    static const std::pair<const char *, const char *> kRules[] = {
        {" .", "."}, {" ?", "?"}, {" !", "!"}, {" ,", ","}, {" ' ", "'"}, {" n't", "n't"},
        {" 'm", "'m"}, {" do not", " don't"}, {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"}};
    for (const auto &[from, to] : kRules) {
        const std::string f = from, t = to;
        std::string r;
        size_t i = 0;
        for (size_t j; (j = s.find(f, i)) != std::string::npos; i = j + f.size()) r.append(s, i, j - i).append(t);
        r.append(s, i, std::string::npos);
        s.swap(r);
    }
    return s;
}
}  // namespace

std::string WordPieceTokenizer::decode(const int32_t *ids, size_t n) const {
    std::string out;
    bool first = true;
    for (size_t k = 0; k < n; k++) {
        int32_t id = ids[k];
        if (id < 0 || id >= vocab_size() || types_[id] == SPECIAL) continue;
        // the first piece as it is, every later one as it joins a stream (piece_bytes)
        out += cleanup(first ? pieces_[id] : piece_bytes(id));
        first = false;
    }
    return out;
}

std::string WordPieceTokenizer::piece_bytes(int32_t id) const {
    if (id < 0 || id >= vocab_size() || types_[id] == SPECIAL) return std::string();
    const std::string &piece = pieces_[id];
    if (piece.compare(0, prefix_.size(), prefix_) == 0) return piece.substr(prefix_.size());
    return " " + piece;
}

}  // namespace fastllm
