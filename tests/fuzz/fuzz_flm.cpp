// The .flm loader on any bytes (fastllm_model_load_from_memory), then what a loaded model does
// first: info, tokenize, a session of 16 positions evaluating the prompt and sampling two tokens
// (sampler, text stream), detokenize.
#include <cstdint>
#include <vector>

#include "fuzz_common.h"

static int on_text(const char *, size_t, void *) { return 0; }

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fastllm_model_params p = fastllm_model_default_params();
    p.n_threads = 1;
    fastllm_model *m = nullptr;
    if (fastllm_model_load_from_memory(data, size, &p, &m) != FASTLLM_OK) return 0;
    fastllm_model_info info;
    fastllm_model_get_info(m, &info);
    int32_t ids[8];
    size_t n = 0;
    if (fastllm_tokenize(m, "Hi there", 8, 1, ids, 8, &n) == FASTLLM_OK && n > 0) {
        fastllm_session_params sp = fastllm_session_default_params();
        sp.n_ctx = 16;
        sp.n_threads = 1;
        fastllm_session *s = nullptr;
        if (fastllm_session_create(m, &sp, &s) == FASTLLM_OK) {
            fastllm_sampling_params gp = fastllm_sampling_default_params();
            gp.max_new_tokens = 2;
            gp.seed = 1;
            fastllm_generation_result r;
            fastllm_session_generate(s, ids, n < 3 ? n : 3, &gp, on_text, nullptr, &r);
            fastllm_session_free(s);
        }
        char text[64];
        size_t len = 0;
        fastllm_detokenize(m, ids, n, text, sizeof text, &len);
    }
    fastllm_model_free(m);
    return 0;
}
