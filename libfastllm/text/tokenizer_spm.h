// tokenizer_spm.h — SentencePiece BPE (LLaMA-1/2, Mistral, Phi-3, stories260K): merges by piece
// score, byte fallback, "▁" for spaces. Matches the sentencepiece package's encode and decode,
// and HuggingFace's tokenizer (transformers 5) around added tokens:
//  - control (3) and user-defined (4) tokens are added tokens (AddedTokens): cut out of the text
//    as single ids before SentencePiece sees it (Phi-3's <|user|>, <|end|>, Mistral v0.3's
//    [INST]), with the lstrip / rstrip flags of tokenizer.added_lstrip / added_rstrip; except
//    SentencePiece's own <s> and </s>, which stay text as the sentencepiece package treats them,
//    and pieces holding "▁", which sentencepiece matches after its normalisation;
//  - the text at the start of the input gets SentencePiece's dummy-prefix space (add_dummy_prefix),
//    text after an added token as tokenizer.prefix_after_added says: "never" (default;
//    transformers' LlamaTokenizer with legacy=False, Metaspace prepend_scheme "first"), "always"
//    (a tokenizer.json whose normalizer prepends "▁" to every piece, as Llama 2's and Phi-3's do)
//    or "unless_space" (legacy=True: Metaspace prepend_scheme "always").
// The one difference left: transformers' Metaspace gives text that starts with a space no dummy
// prefix; this tokenizer, as sentencepiece, always does.
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
    enum class Prefix { NEVER, ALWAYS, UNLESS_SPACE };  // the dummy prefix of text after an added token

    // SentencePiece's encoding of text without added tokens; dummy_prefix: prepend a space.
    void encode_text(std::string_view text, bool dummy_prefix, std::vector<int32_t> &out) const;

    std::vector<float> scores_;
    std::vector<int> types_;
    std::unordered_map<std::string, int32_t> mergeable_;  // pieces BPE may produce (normal, user-defined)
    int32_t byte_ids_[256];                               // id of <0xXX>, -1 if absent
    int32_t unk_id_ = -1;
    bool add_dummy_prefix_ = true, remove_extra_whitespaces_ = false, byte_fallback_ = true;
    AddedTokens added_;
    Prefix prefix_after_added_ = Prefix::NEVER;
};

}  // namespace fastllm
