// tokenizer_spm.h — SentencePiece BPE (LLaMA-1/2, stories260K): merges by piece score, byte
// fallback, "▁" for spaces. Matches the sentencepiece package's encode and decode.
#pragma once

#include <unordered_map>

#include "text/tokenizer.h"

namespace fastllm {

class SpmTokenizer : public Tokenizer {
public:
    SpmTokenizer(const FlmFile &file, int64_t vocab_size);

    std::vector<int32_t> encode(std::string_view text, bool add_bos) const override;
    std::string decode(const int32_t *ids, size_t n) const override;
    std::string piece_bytes(int32_t id) const override;

private:
    enum PieceType { NORMAL = 1, UNKNOWN = 2, CONTROL = 3, USER_DEFINED = 4, UNUSED = 5, BYTE = 6 };

    std::vector<float> scores_;
    std::vector<int> types_;
    std::unordered_map<std::string, int32_t> mergeable_;  // pieces BPE may produce (normal, user-defined)
    int32_t byte_ids_[256];                               // id of <0xXX>, -1 if absent
    int32_t unk_id_ = -1;
    bool add_dummy_prefix_ = true, remove_extra_whitespaces_ = false, byte_fallback_ = true;
};

}  // namespace fastllm
