// session.h — what fastllm_session is: one context (token history + its KV cache) over a shared
// Model, with the working memory and the backend a pass computes with. All memory is allocated in
// the constructor, in one arena whose plan is derived from the carve functions.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "cpu/backend_cpu.h"
#include "runtime/arena.h"
#include "runtime/kv_cache.h"
#include "runtime/options.h"
#include "fastllm.h"
#include "runtime/model.h"
#include "runtime/sampler.h"
#include "text/text_stream.h"
#include "cpu/thread_pool.h"

namespace fastllm {

class Session {
public:
    Session(const Model &model, const SessionOptions &options);

    const Model &model() const { return model_; }
    int n_ctx() const { return n_ctx_; }
    int n_tokens() const { return (int)tokens_.size(); }
    const std::vector<int32_t> &tokens() const { return tokens_; }
    void reset();
    void truncate(size_t n_keep);  // see fastllm_session_truncate

    // Appends tokens and runs the model (see fastllm_session_eval). Validates before changing state.
    void eval(const int32_t *tokens, size_t n, fastllm_logits_mode mode, float *out_logits);

    // Generation, one token at a time, so that several sessions can advance together:
    // begin_generation evaluates the prompt; step() then samples one token for each session and
    // evaluates all the new tokens in one pass over the weights.
    void begin_generation(const int32_t *prompt, size_t n_prompt, const SamplingOptions &params,
                          fastllm_stream_callback callback, void *user_data);
    bool generating() const { return gen_ != nullptr; }
    void cancel_generation() {
        if (gen_) finish_generation(FASTLLM_STOP_CANCELLED);
    }
    const GenerationResult &generation_result() const { return result_; }
    // Advances each session by one token; sets done[i] when session i's generation ended.
    static void step(Session *const *sessions, size_t n, int32_t *done);

    // begin_generation + step until done (see fastllm_session_generate).
    void generate(const int32_t *prompt, size_t n_prompt, const SamplingOptions &params,
                  fastllm_stream_callback callback, void *user_data, GenerationResult &result);

private:
    struct Generation {
        SamplingOptions params;
        Sampler sampler;
        TextStream stream;
        std::chrono::steady_clock::time_point start;
        Generation(const SamplingOptions &p, int vocab, fastllm_stream_callback cb, void *user)
            : params(p), sampler(p, vocab), stream(p.stop, cb, user) {}
    };

    void check_tokens(const int32_t *tokens, size_t n) const;
    // Runs tokens_[n_evaluated_..] through the model in n_batch chunks.
    void run_pending(fastllm_logits_mode mode, float *out_logits);
    // Samples this session's next token; returns false when its generation has ended.
    bool sample_next();
    void finish_generation(fastllm_stop_reason reason);

    const Model &model_;
    int n_ctx_, n_batch_, n_threads_;
    ThreadPool pool_;
    CpuBackend backend_;
    Arena arena_;
    KvCache cache_;
    Workspace work_;
    std::vector<int32_t> tokens_;  // the context; the tail past n_evaluated_ is not yet in the KV cache
    size_t n_evaluated_ = 0;
    float *logits_;                // last-token logits for generation
    std::vector<ForwardRow> rows_;  // n_batch rows, reused by every forward pass
    // Carves cache_, work_, the backend's scratch and logits_ from the arena (see arena.h).
    void carve(Arena &a);
    std::vector<int32_t> row_tokens_;
    std::unique_ptr<Generation> gen_;
    GenerationResult result_;
};

}  // namespace fastllm
