// bert_normalize.cpp — lookups into the generated BERT tables (bert_tables.cpp).
#include <algorithm>

#include "text/bert_tables.h"

namespace fastllm {
namespace bert {

uint8_t flags(uint32_t cp) {
    const FlagRange *end = kFlagRanges + kFlagRangeCount;
    const FlagRange *r = std::upper_bound(kFlagRanges, end, cp, [](uint32_t c, const FlagRange &x) { return c < x.first; });
    if (r == kFlagRanges) return 0;
    --r;
    return cp <= r->last ? r->flags : 0;
}

namespace {
bool find(const MappedCodepoint *table, size_t n, uint32_t cp, std::string_view &out) {
    const MappedCodepoint *end = table + n;
    const MappedCodepoint *m = std::lower_bound(table, end, cp, [](const MappedCodepoint &x, uint32_t c) { return x.cp < c; });
    if (m == end || m->cp != cp) return false;
    out = std::string_view(kPool + m->offset, m->length);
    return true;
}
}  // namespace

bool lower(uint32_t cp, std::string_view &out) { return find(kLower, kLowerCount, cp, out); }

bool strip(uint32_t cp, std::string_view &out) { return find(kStrip, kStripCount, cp, out); }

}  // namespace bert
}  // namespace fastllm
