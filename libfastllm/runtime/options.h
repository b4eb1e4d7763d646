// options.h — the core's own forms of the C API's params and result structs: c_api.cpp converts
// at the boundary (and checks the pointers in them), so the public structs can grow by the
// sqlite rules without the core changing.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "fastllm.h"
#include "arch/kv_format.h"
#include "format/tensor.h"

namespace fastllm {

struct SessionOptions {
    int n_ctx = 0;      // 0: min(kDefaultContext, the model's context length)
    int n_batch = 0;    // 0: 256
    int n_threads = 0;  // 0: the model's
    KvType type_k = KvType::F16, type_v = KvType::F16;
    bool context_shift = false;
    int n_keep = 0, n_discard = 0;  // n_discard 0: half of the tokens after n_keep
    bool swa_full = false;          // sliding-window layers keep every position

    static constexpr int kDefaultContext = 4096;
};

struct SamplingOptions {
    int max_new_tokens = 0;
    float temperature = 0, top_p = 1, min_p = 0, repetition_penalty = 1;
    int top_k = 0, repeat_last_n = 0;
    uint64_t seed = 0;
    std::vector<std::string> stop;
    bool ignore_eos = false;
    std::string grammar;  // GBNF; empty: none (a JSON schema is converted at the C boundary)
    std::vector<std::string> grammar_triggers;  // empty: the grammar applies from the start (grammar.h)
};

struct GenerationResult {
    int n_prompt_tokens = 0, n_generated_tokens = 0;
    fastllm_stop_reason stop_reason = FASTLLM_STOP_EOS;
    double prompt_ms = 0, generate_ms = 0;
};

}  // namespace fastllm
