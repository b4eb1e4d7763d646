// bert_tables.h — what BERT's normalizer and pre-tokenizer (HuggingFace tokenizers' BertNormalizer,
// BertPreTokenizer) do to each code point: the tables are generated from tokenizers itself by
// scripts/gen_bert_tables.py (bert_tables.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace fastllm {
namespace bert {

enum Flag : uint8_t {
    CONTROL = 1,      // clean_text removes it
    CLEAN_SPACE = 2,  // clean_text turns it into ' '
    CHINESE = 4,      // handle_chinese_chars puts spaces around it
    PUNCT = 8,        // the pre-tokenizer isolates it
    SPACE = 16,       // the pre-tokenizer splits on it
};

struct FlagRange {
    uint32_t first, last;
    uint8_t flags;
};
struct MappedCodepoint {
    uint32_t cp;
    uint32_t offset, length;  // its replacement: kPool[offset, offset + length)
};

extern const FlagRange kFlagRanges[];
extern const size_t kFlagRangeCount;
extern const MappedCodepoint kLower[], kStrip[];
extern const size_t kLowerCount, kStripCount;
extern const char kPool[];

// The Flag bits of cp.
uint8_t flags(uint32_t cp);
// cp's lowercase / its NFD without nonspacing marks, when that is not cp itself (true, the UTF-8
// text in out, possibly empty); false when cp stays.
bool lower(uint32_t cp, std::string_view &out);
bool strip(uint32_t cp, std::string_view &out);

}  // namespace bert
}  // namespace fastllm
