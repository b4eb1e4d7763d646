// tokenizer_bpe.h — GPT-2-style byte-level BPE (GPT-2, Llama 3, Qwen2, SmolLM): added tokens
// are cut out of the text first (AddedTokens), the rest is split by a hand-written version of the model's
// pre-tokenizer regex, each piece's bytes are mapped to GPT-2's byte alphabet and merged by
// rank. Matches HuggingFace `tokenizers` token for token (docs/flm_format.md, "bpe").
#pragma once

#include <unordered_map>

#include "text/tokenizer.h"

namespace fastllm {

class BpeTokenizer : public Tokenizer {
public:
    // How text is split into words before BPE (`tokenizer.pre`).
    enum class Pre { GPT2, LLAMA3, QWEN2, SMOLLM };

    BpeTokenizer(const FlmFile &file, int64_t vocab_size);

    std::vector<int32_t> encode(std::string_view text, bool add_bos) const override;
    // Special tokens (type 3) and padding give nothing, as tokenizers' decode does by default.
    std::string decode(const int32_t *ids, size_t n) const override;
    std::string piece_bytes(int32_t id) const override;

private:
    enum TokenType { NORMAL = 1, SPECIAL = 3, ADDED = 4, UNUSED = 5 };
    struct Merge {
        int32_t rank, result;
    };
    // Pre-tokenizer split of text (no added tokens in it) followed by BPE of each piece.
    void encode_text(std::string_view text, std::vector<int32_t> &out) const;
    // BPE of one pre-token's bytes.
    void encode_word(std::string_view word, std::vector<int32_t> &out) const;
    int32_t lookup(const std::string &token) const;

    Pre pre_ = Pre::GPT2;
    bool ignore_merges_ = false;
    std::vector<uint8_t> types_;
    std::vector<std::string> bytes_;                  // what each token decodes to
    std::unordered_map<std::string, int32_t> vocab_;  // token text -> id (types 1, 3, 4)
    std::unordered_map<uint64_t, Merge> merges_;      // (left id << 32 | right id) -> merge
    int32_t byte_token_[256];                         // token of each single byte, -1 if none
    AddedTokens added_;                               // types 3, 4
};

}  // namespace fastllm
