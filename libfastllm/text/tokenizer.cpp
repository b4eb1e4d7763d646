#include "text/tokenizer.h"

#include <algorithm>

#include "api/error.h"
#include "format/flm_file.h"
#include "text/tokenizer_bpe.h"
#include "text/tokenizer_spm.h"

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

std::unique_ptr<Tokenizer> make_tokenizer(const FlmFile &file, int64_t vocab_size) {
    std::string kind = file.get_string("tokenizer.model");
    if (kind == "spm") return std::make_unique<SpmTokenizer>(file, vocab_size);
    if (kind == "bpe") return std::make_unique<BpeTokenizer>(file, vocab_size);
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
