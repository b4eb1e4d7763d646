#include "runtime/session.h"

#include <algorithm>
#include <chrono>
#include <string>

#include "api/error.h"
#include "api/log.h"

namespace fastllm {

namespace {
double ms_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

namespace {
int threads_of(const Model &model, const SessionOptions &p) {
    if (p.n_threads < 0) fail(FASTLLM_ERR_INVALID_ARGUMENT, "n_threads must not be negative (%d)", p.n_threads);
    return p.n_threads ? p.n_threads : model.n_threads();
}
}  // namespace

Session::Session(const Model &model, const SessionOptions &p)
    : model_(model), n_threads_(threads_of(model, p)), pool_(n_threads_), backend_(kernels(), pool_) {
    const DecoderConfig &c = model.config();
    if (p.n_ctx < 0 || p.n_batch < 0 || p.n_threads < 0)
        fail(FASTLLM_ERR_INVALID_ARGUMENT, "session params must not be negative (n_ctx %d, n_batch %d, n_threads %d)",
             p.n_ctx, p.n_batch, p.n_threads);
    n_ctx_ = p.n_ctx ? p.n_ctx : c.context_length;
    if (n_ctx_ > c.context_length)
        fail(FASTLLM_ERR_INVALID_ARGUMENT, "n_ctx %d exceeds the model's context length %d", n_ctx_, c.context_length);
    n_batch_ = std::min(p.n_batch ? p.n_batch : 256, n_ctx_);
    carve(arena_);  // plan
    if (!arena_.allocate())
        fail(FASTLLM_ERR_OUT_OF_MEMORY, "cannot allocate %.1f MiB for a session with n_ctx %d",
             arena_.planned_bytes() / 1048576.0, n_ctx_);
    carve(arena_);
    tokens_.reserve((size_t)n_ctx_ + 1);
    rows_.resize((size_t)n_batch_);
    row_tokens_.resize((size_t)n_batch_);
    log(FASTLLM_LOG_INFO, "session: n_ctx %d, n_batch %d, %d threads, %.1f MiB of state (KV cache %.1f MiB, %s)",
        n_ctx_, n_batch_, n_threads_, arena_.bytes() / 1048576.0, cache_.bytes() / 1048576.0,
        dtype_name(cache_.type_k));
}

void Session::carve(Arena &a) {
    const Decoder &d = model_.decoder();
    const DecoderConfig &c = d.config();
    cache_.carve(a, c.num_layers, n_ctx_, c.kv_dim());
    d.carve(a, work_, n_batch_);
    backend_.carve(a, d.max_row_length(), n_batch_, c.context_length);  // any session's positions fit
    logits_ = a.take((size_t)c.vocab_size);
}

void Session::reset() {
    tokens_.clear();
    n_evaluated_ = 0;
    gen_.reset();
}

void Session::truncate(size_t n_keep) {
    if (n_keep > tokens_.size())
        fail(FASTLLM_ERR_INVALID_ARGUMENT, "cannot keep %zu tokens: the context has %zu", n_keep, tokens_.size());
    tokens_.resize(n_keep);
    n_evaluated_ = std::min(n_evaluated_, n_keep);
    gen_.reset();
}

void Session::check_tokens(const int32_t *tokens, size_t n) const {
    if (n > 0 && !tokens) fail(FASTLLM_ERR_INVALID_ARGUMENT, "tokens is NULL");
    model_.check_token_ids(tokens, n);
    if (tokens_.size() + n > (size_t)n_ctx_)
        fail(FASTLLM_ERR_CONTEXT_FULL, "%zu tokens do not fit: the context holds %d and %zu are in use", n, n_ctx_,
             tokens_.size());
}

void Session::run_pending(fastllm_logits_mode mode, float *out_logits) {
    const size_t vocab = (size_t)model_.config().vocab_size;
    const size_t first = n_evaluated_;
    while (n_evaluated_ < tokens_.size()) {
        const int T = (int)std::min<size_t>(n_batch_, tokens_.size() - n_evaluated_);
        for (int t = 0; t < T; t++) {
            const size_t i = n_evaluated_ + t;
            float *logits = nullptr;
            if (mode == FASTLLM_LOGITS_ALL) logits = out_logits + (i - first) * vocab;
            else if (mode == FASTLLM_LOGITS_LAST && i + 1 == tokens_.size()) logits = out_logits;
            rows_[t] = ForwardRow{&cache_, (int)i, logits};
        }
        model_.decoder().forward(backend_, work_, tokens_.data() + n_evaluated_, rows_.data(), T);
        n_evaluated_ += T;
    }
}

void Session::eval(const int32_t *tokens, size_t n, fastllm_logits_mode mode, float *out_logits) {
    if (mode != FASTLLM_LOGITS_NONE && !out_logits) fail(FASTLLM_ERR_INVALID_ARGUMENT, "out_logits is NULL");
    if (n == 0) fail(FASTLLM_ERR_INVALID_ARGUMENT, "no tokens to evaluate");
    check_tokens(tokens, n);
    run_pending(FASTLLM_LOGITS_NONE, nullptr);  // a token sampled last by generate() is still pending
    tokens_.insert(tokens_.end(), tokens, tokens + n);
    run_pending(mode, out_logits);
}

void Session::begin_generation(const int32_t *prompt, size_t n_prompt, const SamplingOptions &p,
                               fastllm_stream_callback callback, void *user_data) {
    if (p.max_new_tokens < 0) fail(FASTLLM_ERR_INVALID_ARGUMENT, "max_new_tokens must not be negative");
    check_tokens(prompt, n_prompt);
    if (tokens_.empty() && n_prompt == 0) fail(FASTLLM_ERR_INVALID_ARGUMENT, "empty prompt and empty session");

    result_ = GenerationResult{};
    result_.n_prompt_tokens = (int)n_prompt;
    gen_.reset();
    auto t0 = std::chrono::steady_clock::now();
    tokens_.insert(tokens_.end(), prompt, prompt + n_prompt);
    if (n_evaluated_ == tokens_.size()) n_evaluated_--;  // re-run the last token to get its logits
    run_pending(FASTLLM_LOGITS_LAST, logits_);
    result_.prompt_ms = ms_since(t0);
    gen_ = std::make_unique<Generation>(p, model_.config().vocab_size, callback, user_data);
    gen_->start = std::chrono::steady_clock::now();
    if (p.max_new_tokens == 0) finish_generation(FASTLLM_STOP_MAX_TOKENS);
}

void Session::finish_generation(fastllm_stop_reason reason) {
    result_.stop_reason = reason;
    if (reason != FASTLLM_STOP_STRING && reason != FASTLLM_STOP_CALLBACK) gen_->stream.finish();
    result_.generate_ms = ms_since(gen_->start);
    gen_.reset();
    static const char *const kStopNames[] = {"eos", "max_tokens", "stop_string", "callback", "context_full", "cancelled"};
    log(FASTLLM_LOG_DEBUG, "generation: %d prompt tokens in %.1f ms, %d tokens in %.1f ms (%.1f tok/s), stopped by %s",
        result_.n_prompt_tokens, result_.prompt_ms, result_.n_generated_tokens, result_.generate_ms,
        result_.generate_ms > 0 ? result_.n_generated_tokens * 1000.0 / result_.generate_ms : 0.0,
        kStopNames[result_.stop_reason]);
}

bool Session::sample_next() {
    if (tokens_.size() >= (size_t)n_ctx_) {
        finish_generation(FASTLLM_STOP_CONTEXT_FULL);
        return false;
    }
    const Tokenizer &tok = model_.tokenizer();
    int32_t next = gen_->sampler.sample(logits_, tokens_.data(), tokens_.size());
    tokens_.push_back(next);  // pending: evaluated when the next token's logits are needed
    result_.n_generated_tokens++;
    if (!gen_->params.ignore_eos && tok.is_eos(next)) {
        finish_generation(FASTLLM_STOP_EOS);
        return false;
    }
    if (gen_->stream.push(tok.piece_bytes(next))) {
        finish_generation(gen_->stream.stopped_by_string() ? FASTLLM_STOP_STRING : FASTLLM_STOP_CALLBACK);
        return false;
    }
    if (result_.n_generated_tokens >= gen_->params.max_new_tokens) {
        finish_generation(FASTLLM_STOP_MAX_TOKENS);
        return false;
    }
    return true;
}

void Session::step(Session *const *sessions, size_t n, int32_t *done) {
    if (n == 0) return;
    if (!sessions || !done) fail(FASTLLM_ERR_INVALID_ARGUMENT, "sessions or done is NULL");
    for (size_t i = 0; i < n; i++) {
        if (!sessions[i]) fail(FASTLLM_ERR_INVALID_ARGUMENT, "session %zu is NULL", i);
        if (&sessions[i]->model_ != &sessions[0]->model_)
            fail(FASTLLM_ERR_INVALID_ARGUMENT, "session %zu belongs to another model", i);
        if (!sessions[i]->gen_) fail(FASTLLM_ERR_INVALID_ARGUMENT, "session %zu has no generation in progress", i);
        for (size_t j = 0; j < i; j++)
            if (sessions[j] == sessions[i]) fail(FASTLLM_ERR_INVALID_ARGUMENT, "session %zu is listed twice", i);
    }
    // Sample for everyone, then evaluate the new tokens of those still going in shared passes,
    // using the first session's working memory and backend for the activations.
    Session &work = *sessions[0];
    size_t n_rows = 0;
    for (size_t i = 0; i < n; i++) {
        Session &s = *sessions[i];
        done[i] = s.sample_next() ? 0 : 1;
        if (done[i]) continue;
        work.rows_[n_rows] = ForwardRow{&s.cache_, (int)s.n_evaluated_, s.logits_};
        work.row_tokens_[n_rows] = s.tokens_.back();
        s.n_evaluated_++;
        if (++n_rows == work.rows_.size()) {
            work.model_.decoder().forward(work.backend_, work.work_, work.row_tokens_.data(), work.rows_.data(), (int)n_rows);
            n_rows = 0;
        }
    }
    if (n_rows) work.model_.decoder().forward(work.backend_, work.work_, work.row_tokens_.data(), work.rows_.data(), (int)n_rows);
}

void Session::generate(const int32_t *prompt, size_t n_prompt, const SamplingOptions &p,
                       fastllm_stream_callback callback, void *user_data, GenerationResult &result) {
    begin_generation(prompt, n_prompt, p, callback, user_data);
    Session *self = this;
    int32_t done = gen_ ? 0 : 1;
    while (!done) step(&self, 1, &done);
    result = result_;
}

}  // namespace fastllm
