// tokenizer_wordpiece.h — BERT's WordPiece (BertTokenizer, all-MiniLM, bge, e5, ...): added tokens
// ([CLS], [SEP], [MASK], ...) are cut out of the text first (AddedTokens), the rest is normalized
// as BertNormalizer does (clean_text, CJK spacing, accent stripping, lowercase: each as the file
// says), split on whitespace and punctuation as BertPreTokenizer does, and each word is cut into
// the longest vocabulary pieces from its start, the later ones with the continuation prefix
// ("##"); a word that cannot be cut is [UNK]. Matches HuggingFace `tokenizers` token for token
// (docs/flm_format.md, "wordpiece").
#pragma once

#include <unordered_map>

#include "text/tokenizer.h"

namespace fastllm {

class WordPieceTokenizer : public Tokenizer {
public:
    WordPieceTokenizer(const FlmFile &file, int64_t vocab_size);

    // add_bos: the special tokens around the text, [CLS] first and [SEP] last (BERT's
    // "add_special_tokens").
    std::vector<int32_t> encode(std::string_view text, bool add_bos) const override;
    // As tokenizers' WordPiece decoder with cleanup: pieces joined with spaces, continuation
    // pieces glued to the one before; special tokens give nothing.
    std::string decode(const int32_t *ids, size_t n) const override;
    std::string piece_bytes(int32_t id) const override;

    int32_t sep_id() const override { return sep_id_; }

private:
    enum TokenType { NORMAL = 1, SPECIAL = 3 };
    // The normalized text of raw text (no added tokens in it), as code points.
    std::vector<uint32_t> normalize(std::string_view text) const;
    void encode_text(std::string_view text, std::vector<int32_t> &out) const;
    void encode_word(const std::vector<uint32_t> &cps, size_t first, size_t last, std::vector<int32_t> &out) const;

    bool lowercase_ = true, strip_accents_ = true, clean_text_ = true, chinese_chars_ = true;
    std::string prefix_ = "##";
    int32_t max_word_chars_ = 100;
    int32_t unk_id_ = -1, sep_id_ = -1;
    std::vector<uint8_t> types_;
    std::unordered_map<std::string, int32_t> vocab_;
    AddedTokens added_;
};

}  // namespace fastllm
