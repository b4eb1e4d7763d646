#include "session.h"

#include <algorithm>
#include <chrono>
#include <string>

#include "error.h"
#include "sampler.h"
#include "text_stream.h"

namespace fastllm {

namespace {
double ms_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

Session::Session(const Model &model, const fastllm_session_params &p) : model_(model) {
    const LlamaConfig &c = model.llama().config();
    if (p.n_ctx < 0 || p.n_batch < 0 || p.n_threads < 0)
        fail(FASTLLM_ERR_INVALID_ARGUMENT, "session params must not be negative (n_ctx %d, n_batch %d, n_threads %d)",
             p.n_ctx, p.n_batch, p.n_threads);
    n_ctx_ = p.n_ctx ? p.n_ctx : c.context_length;
    if (n_ctx_ > c.context_length)
        fail(FASTLLM_ERR_INVALID_ARGUMENT, "n_ctx %d exceeds the model's context length %d", n_ctx_, c.context_length);
    n_batch_ = std::min(p.n_batch ? p.n_batch : 256, n_ctx_);
    n_threads_ = p.n_threads ? p.n_threads : model.n_threads();
    size_t floats = model.llama().state_floats(n_ctx_, n_batch_, n_threads_) + (size_t)c.vocab_size;
    if (!arena_.allocate(floats, LlamaModel::kStateBuffers + 1))
        fail(FASTLLM_ERR_OUT_OF_MEMORY, "cannot allocate %.1f MiB for a session with n_ctx %d",
             floats * 4.0 / (1 << 20), n_ctx_);
    model.llama().init_state(state_, arena_, n_ctx_, n_batch_, n_threads_);
    logits_ = arena_.take((size_t)c.vocab_size);
    tokens_.reserve((size_t)n_ctx_ + 1);
}

void Session::reset() {
    tokens_.clear();
    n_evaluated_ = 0;
}

void Session::truncate(size_t n_keep) {
    if (n_keep > tokens_.size())
        fail(FASTLLM_ERR_INVALID_ARGUMENT, "cannot keep %zu tokens: the context has %zu", n_keep, tokens_.size());
    tokens_.resize(n_keep);
    n_evaluated_ = std::min(n_evaluated_, n_keep);
}

void Session::check_tokens(const int32_t *tokens, size_t n) const {
    if (n > 0 && !tokens) fail(FASTLLM_ERR_INVALID_ARGUMENT, "tokens is NULL");
    model_.check_token_ids(tokens, n);
    if (tokens_.size() + n > (size_t)n_ctx_)
        fail(FASTLLM_ERR_CONTEXT_FULL, "%zu tokens do not fit: the context holds %d and %zu are in use", n, n_ctx_,
             tokens_.size());
}

void Session::run_pending(fastllm_logits_mode mode, float *out_logits) {
    const size_t vocab = (size_t)model_.llama().config().vocab_size;
    const KernelTable &k = kernels();
    const size_t first = n_evaluated_;
    while (n_evaluated_ < tokens_.size()) {
        int T = (int)std::min<size_t>(n_batch_, tokens_.size() - n_evaluated_);
        bool last_chunk = n_evaluated_ + T == tokens_.size();
        fastllm_logits_mode m = mode == FASTLLM_LOGITS_ALL ? mode : (last_chunk ? mode : FASTLLM_LOGITS_NONE);
        float *out = mode == FASTLLM_LOGITS_ALL ? out_logits + (n_evaluated_ - first) * vocab : out_logits;
        model_.llama().forward(k, state_, tokens_.data() + n_evaluated_, T, (int)n_evaluated_, m, out);
        n_evaluated_ += T;
    }
}

void Session::eval(const int32_t *tokens, size_t n, fastllm_logits_mode mode, float *out_logits) {
    if (mode != FASTLLM_LOGITS_NONE && mode != FASTLLM_LOGITS_LAST && mode != FASTLLM_LOGITS_ALL)
        fail(FASTLLM_ERR_INVALID_ARGUMENT, "unknown logits mode %d", (int)mode);
    if (mode != FASTLLM_LOGITS_NONE && !out_logits) fail(FASTLLM_ERR_INVALID_ARGUMENT, "out_logits is NULL");
    if (n == 0) fail(FASTLLM_ERR_INVALID_ARGUMENT, "no tokens to evaluate");
    check_tokens(tokens, n);
    run_pending(FASTLLM_LOGITS_NONE, nullptr);  // a token sampled last by generate() is still pending
    tokens_.insert(tokens_.end(), tokens, tokens + n);
    run_pending(mode, out_logits);
}

void Session::generate(const int32_t *prompt, size_t n_prompt, const fastllm_sampling_params &p,
                       fastllm_stream_callback callback, void *user_data, fastllm_generation_result &result) {
    if (p.max_new_tokens < 0) fail(FASTLLM_ERR_INVALID_ARGUMENT, "max_new_tokens must not be negative");
    if (p.n_stop < 0 || (p.n_stop > 0 && !p.stop)) fail(FASTLLM_ERR_INVALID_ARGUMENT, "invalid stop list");
    std::vector<std::string> stops;
    for (int i = 0; i < p.n_stop; i++) {
        if (!p.stop[i]) fail(FASTLLM_ERR_INVALID_ARGUMENT, "stop string %d is NULL", i);
        stops.emplace_back(p.stop[i]);
    }
    check_tokens(prompt, n_prompt);
    if (tokens_.empty() && n_prompt == 0) fail(FASTLLM_ERR_INVALID_ARGUMENT, "empty prompt and empty session");

    result = fastllm_generation_result{};
    result.n_prompt_tokens = (int32_t)n_prompt;
    auto t0 = std::chrono::steady_clock::now();
    tokens_.insert(tokens_.end(), prompt, prompt + n_prompt);
    if (n_evaluated_ == tokens_.size()) n_evaluated_--;  // re-run the last token to get its logits
    run_pending(FASTLLM_LOGITS_LAST, logits_);
    result.prompt_ms = ms_since(t0);

    t0 = std::chrono::steady_clock::now();
    const Tokenizer &tok = model_.tokenizer();
    Sampler sampler(p, model_.llama().config().vocab_size);
    TextStream stream(std::move(stops), callback, user_data);
    result.stop_reason = FASTLLM_STOP_MAX_TOKENS;
    for (int i = 0; i < p.max_new_tokens; i++) {
        if (tokens_.size() >= (size_t)n_ctx_) {
            result.stop_reason = FASTLLM_STOP_CONTEXT_FULL;
            break;
        }
        int32_t next = sampler.sample(logits_, tokens_.data(), tokens_.size());
        tokens_.push_back(next);  // pending: evaluated when the next token's logits are needed
        result.n_generated_tokens++;
        if (!p.ignore_eos && tok.is_eos(next)) {
            result.stop_reason = FASTLLM_STOP_EOS;
            break;
        }
        if (stream.push(tok.piece_bytes(next))) {
            result.stop_reason = stream.stopped_by_string() ? FASTLLM_STOP_STRING : FASTLLM_STOP_CALLBACK;
            break;
        }
        if (i + 1 < p.max_new_tokens) run_pending(FASTLLM_LOGITS_LAST, logits_);
    }
    if (result.stop_reason != FASTLLM_STOP_STRING && result.stop_reason != FASTLLM_STOP_CALLBACK) stream.finish();
    result.generate_ms = ms_since(t0);
}

}  // namespace fastllm
