#include "text/unicode.h"

namespace fastllm {
namespace unicode {

namespace {
// Length of the longest valid prefix of a UTF-8 sequence at s[i] (0 if s[i] cannot start one),
// and whether that prefix is the whole sequence. The second byte's range excludes overlongs,
// surrogates and code points past U+10FFFF (Unicode table 3-7).
size_t valid_prefix(std::string_view s, size_t i, bool &complete) {
    unsigned char c = s[i];
    complete = false;
    if (c < 0x80) {
        complete = true;
        return 1;
    }
    size_t need;
    unsigned char lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) {
        need = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
        need = 3;
        if (c == 0xE0) lo = 0xA0;
        if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        need = 4;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F;
    } else {
        return 0;
    }
    size_t k = 1;
    for (; k < need && i + k < s.size(); k++) {
        unsigned char b = s[i + k];
        if (k == 1 ? (b < lo || b > hi) : (b < 0x80 || b > 0xBF)) break;
    }
    complete = k == need;
    return k;
}
}  // namespace

uint32_t decode_utf8(std::string_view s, size_t &i) {
    bool complete;
    size_t n = valid_prefix(s, i, complete);
    if (!complete) {
        i++;
        return kInvalid;
    }
    unsigned char c = s[i];
    uint32_t cp = n == 1 ? c : n == 2 ? (c & 0x1F) : n == 3 ? (c & 0x0F) : (c & 0x07);
    for (size_t k = 1; k < n; k++) cp = (cp << 6) | ((unsigned char)s[i + k] & 0x3F);
    i += n;
    return cp;
}

void append_utf8(std::string &out, uint32_t cp) {
    if (cp < 0x80) {
        out += (char)cp;
    } else if (cp < 0x800) {
        out += (char)(0xC0 | (cp >> 6));
        out += (char)(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
        out += (char)(0xE0 | (cp >> 12));
        out += (char)(0x80 | ((cp >> 6) & 0x3F));
        out += (char)(0x80 | (cp & 0x3F));
    } else {
        out += (char)(0xF0 | (cp >> 18));
        out += (char)(0x80 | ((cp >> 12) & 0x3F));
        out += (char)(0x80 | ((cp >> 6) & 0x3F));
        out += (char)(0x80 | (cp & 0x3F));
    }
}

CodepointClass classify(uint32_t cp) {
    if (cp < 256) return (CodepointClass)kLatin1Class[cp];
    size_t lo = 0, hi = kNumRanges;  // first range with last >= cp
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (kRanges[mid].last < cp)
            lo = mid + 1;
        else
            hi = mid;
    }
    return (lo < kNumRanges && kRanges[lo].first <= cp) ? kRanges[lo].cls : OTHER;
}

std::string utf8_lossy(std::string_view bytes) {
    std::string out;
    out.reserve(bytes.size());
    for (size_t i = 0; i < bytes.size();) {
        bool complete;
        size_t n = valid_prefix(bytes, i, complete);
        if (complete) {
            out.append(bytes.data() + i, n);
        } else {
            out += "\xEF\xBF\xBD";
            if (n == 0) n = 1;
        }
        i += n;
    }
    return out;
}

}  // namespace unicode
}  // namespace fastllm
