// Both tokenizers on any input: the first byte picks the model (even: SentencePiece, odd:
// byte-level BPE) and the operation; the rest is text to encode (any bytes, invalid UTF-8 and NULs
// included) or little-endian int32 ids to decode (out-of-range ids included), piece by piece too.
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "fuzz_common.h"

static fastllm_model *g_models[2];

extern "C" int LLVMFuzzerInitialize(int *, char ***) {
    g_models[0] = fuzz_model("FASTLLM_FUZZ_SPM");
    g_models[1] = fuzz_model("FASTLLM_FUZZ_BPE");
    return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    const fastllm_model *m = g_models[data[0] & 1];
    const int op = (data[0] >> 1) & 3;
    data++, size--;
    if (op < 2) {  // encode, then decode what came out: must give ids in the vocabulary
        std::vector<int32_t> ids(size + 2);
        size_t n = 0;
        fastllm_status st = fastllm_tokenize(m, (const char *)data, size, op == 0 ? 1 : 0, ids.data(), ids.size(), &n);
        if (st == FASTLLM_ERR_BUFFER_TOO_SMALL) {
            ids.resize(n);
            st = fastllm_tokenize(m, (const char *)data, size, op == 0 ? 1 : 0, ids.data(), ids.size(), &n);
        }
        if (st != FASTLLM_OK) return 0;
        fastllm_model_info info;
        fastllm_model_get_info(m, &info);
        for (size_t i = 0; i < n; i++)
            if (ids[i] < 0 || ids[i] >= info.vocab_size) __builtin_trap();
        std::string text(4 * size + 64, '\0');
        size_t len = 0;
        if (fastllm_detokenize(m, ids.data(), n, text.data(), text.size(), &len) == FASTLLM_ERR_BUFFER_TOO_SMALL) {
            text.resize(len + 1);
            fastllm_detokenize(m, ids.data(), n, text.data(), text.size(), &len);
        }
        return 0;
    }
    std::vector<int32_t> ids(size / 4);
    if (!ids.empty()) std::memcpy(ids.data(), data, ids.size() * 4);
    char small[8], big[4096];
    size_t len = 0;
    if (op == 2) {
        fastllm_detokenize(m, ids.data(), ids.size(), small, sizeof small, &len);
        fastllm_detokenize(m, ids.data(), ids.size(), big, sizeof big, &len);
    } else {
        for (int32_t id : ids) fastllm_token_to_piece(m, id, small, sizeof small, &len);
    }
    return 0;
}
