// session.h — what fastllm_session is: one context (token history + KV cache + working memory)
// over a shared Model. All memory is allocated in the constructor.
#pragma once

#include <vector>

#include "arena.h"
#include "fastllm.h"
#include "model.h"

namespace fastllm {

class Session {
public:
    Session(const Model &model, const fastllm_session_params &params);

    const Model &model() const { return model_; }
    int n_ctx() const { return n_ctx_; }
    int n_tokens() const { return (int)tokens_.size(); }
    const std::vector<int32_t> &tokens() const { return tokens_; }
    void reset();
    void truncate(size_t n_keep);  // see fastllm_session_truncate

    // Appends tokens and runs the model (see fastllm_session_eval). Validates before changing state.
    void eval(const int32_t *tokens, size_t n, fastllm_logits_mode mode, float *out_logits);
    void generate(const int32_t *prompt, size_t n_prompt, const fastllm_sampling_params &params,
                  fastllm_stream_callback callback, void *user_data, fastllm_generation_result &result);

private:
    void check_tokens(const int32_t *tokens, size_t n) const;
    // Runs tokens_[n_evaluated_..] through the model in n_batch chunks.
    void run_pending(fastllm_logits_mode mode, float *out_logits);

    const Model &model_;
    int n_ctx_, n_batch_, n_threads_;
    Arena arena_;
    LlamaState state_;
    std::vector<int32_t> tokens_;  // the context; the tail past n_evaluated_ is not yet in the KV cache
    size_t n_evaluated_ = 0;
    float *logits_;                // last-token logits for generate()
};

}  // namespace fastllm
