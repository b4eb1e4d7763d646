// generation.cpp — a session's generation: the prompt, sampling under a grammar, the text stream,
// the stop reasons. Session::step (step.cpp) advances it a token at a time.
#include <algorithm>
#include <chrono>
#include <memory>
#include <string>

#include "base/error.h"
#include "base/log.h"
#include "runtime/session.h"

namespace fastllm {

namespace {
double ms_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

void Session::begin_generation(const int32_t *prompt, size_t n_prompt, const SamplingOptions &p,
                               fastllm_stream_callback callback, void *user_data, bool deferred) {
    // cleared before the session counts as busy: a cancel from another thread that finds it busy
    // is then never wiped (one that finds it idle is refused, and the caller may try again)
    cancel_ = false;
    Busy busy(*this);
    if (p.max_new_tokens < 0) fail(FASTLLM_ERR_INVALID_ARGUMENT, "max_new_tokens must not be negative");
    // A bad grammar fails here, before anything changes.
    auto grammar = matcher_of(p);
    ctx_.check_tokens(prompt, n_prompt);
    if (ctx_.tokens.empty() && n_prompt == 0) fail(FASTLLM_ERR_INVALID_ARGUMENT, "empty prompt and empty session");

    result_ = GenerationResult{};
    result_.n_prompt_tokens = (int)n_prompt;
    if (spec_) spec_->drafted = spec_->accepted = 0;
    gen_.reset();
    has_gen_ = false;
    auto t0 = std::chrono::steady_clock::now();
    ctx_.make_room(n_prompt);
    const size_t from = ctx_.tokens.size(), end = from + n_prompt;
    if (deferred) {
        // Out of memory here rather than in a step: the layers without a window get the prompt's
        // blocks now (as run_pending does before its first pass).
        ctx_.cache.prepare((int)std::min(ctx_.n_evaluated, end - 1), (int)end, false);
    }
    ctx_.tokens.insert(ctx_.tokens.end(), prompt, prompt + n_prompt);
    if (ctx_.n_evaluated == ctx_.tokens.size()) ctx_.n_evaluated--;  // re-run the last token to get its logits
    if (deferred) {
        gen_ = std::make_unique<Generation>(p, model_.config().vocab_size, callback, user_data, std::move(grammar));
        gen_->prefill = true;
        gen_->prompt_from = from;
        gen_->start = t0;  // until the prompt is evaluated: when it began
        has_gen_ = true;
        return;
    }
    try {
        ctx_.run_pending(FASTLLM_LOGITS_LAST, logits_.data(), cancel_);
    } catch (const Error &e) {
        if (e.status() != FASTLLM_ERR_CANCELLED) throw;
        result_.prompt_ms = ms_since(t0);
        result_.stop_reason = FASTLLM_STOP_CANCELLED;  // no generation: the caller sees it ended
        log(FASTLLM_LOG_DEBUG, "generation: %s", e.what());
        return;
    }
    result_.prompt_ms = ms_since(t0);
    gen_ = std::make_unique<Generation>(p, model_.config().vocab_size, callback, user_data, std::move(grammar));
    gen_->start = std::chrono::steady_clock::now();
    has_gen_ = true;
    sampling_starts();
}

bool Session::sampling_starts() {
    if (gen_->params.max_new_tokens == 0) finish_generation(FASTLLM_STOP_MAX_TOKENS);
    else if (gen_->grammar && gen_->grammar->finished()) finish_generation(FASTLLM_STOP_GRAMMAR);  // it matches only ""
    return gen_ != nullptr;
}

void Session::prompt_evaluated() {
    result_.prompt_ms = ms_since(gen_->start);
    gen_->start = std::chrono::steady_clock::now();
    gen_->prefill = false;
}

void Session::cancel_generation() {
    if (!gen_) return;
    if (gen_->prefill) {  // as a cancelled evaluation: the evaluated part of the prompt stays
        ctx_.tokens.resize(std::max(ctx_.n_evaluated, gen_->prompt_from));
        ctx_.cache.release_from((int)ctx_.n_evaluated);
        prompt_evaluated();
    }
    finish_generation(FASTLLM_STOP_CANCELLED);
}

void Session::finish_generation(fastllm_stop_reason reason) {
    result_.stop_reason = reason;
    if (reason != FASTLLM_STOP_STRING && reason != FASTLLM_STOP_CALLBACK) gen_->stream.finish();
    result_.generate_ms = ms_since(gen_->start);
    gen_.reset();
    has_gen_ = false;
    cancel_ = false;
    static const char *const kStopNames[] = {"eos", "max_tokens", "stop_string", "callback",
                                             "context_full", "cancelled", "grammar"};
    log(FASTLLM_LOG_DEBUG, "generation: %d prompt tokens in %.1f ms, %d tokens in %.1f ms (%.1f tok/s), stopped by %s",
        result_.n_prompt_tokens, result_.prompt_ms, result_.n_generated_tokens, result_.generate_ms,
        result_.generate_ms > 0 ? result_.n_generated_tokens * 1000.0 / result_.generate_ms : 0.0,
        kStopNames[result_.stop_reason]);
}

bool Session::sample_next() {
    if (cancel_.load()) {
        finish_generation(FASTLLM_STOP_CANCELLED);
        return false;
    }
    if (ctx_.tokens.size() >= (size_t)opt_.n_ctx) {
        if (!opt_.context_shift || ctx_.tokens.size() <= (size_t)opt_.n_keep) {
            finish_generation(FASTLLM_STOP_CONTEXT_FULL);
            return false;
        }
        ctx_.make_room(1);
    }
    GrammarMatcher *grammar = gen_->grammar.get();
    // Masking before the sampler (penalty, truncations, draw) samples exactly from the allowed tokens.
    if (grammar && grammar->mask(model_.token_trie(), logits_.data(), (size_t)model_.config().vocab_size,
                                 !gen_->params.ignore_eos) == 0) {
        finish_generation(FASTLLM_STOP_GRAMMAR);  // a dead end: no token of the vocabulary continues the text
        return false;
    }
    const int32_t next = gen_->sampler.sample(logits_.data(), ctx_.tokens.data(), ctx_.tokens.size(), gen_->exclude);
    gen_->exclude = -1;
    return emit(next);
}

bool Session::emit(int32_t next) {
    const Tokenizer &tok = model_.tokenizer();
    GrammarMatcher *grammar = gen_->grammar.get();
    ctx_.tokens.push_back(next);  // pending: evaluated when the next token's logits are needed
    result_.n_generated_tokens++;
    if (!gen_->params.ignore_eos && tok.is_eos(next)) {
        finish_generation(FASTLLM_STOP_EOS);
        return false;
    }
    const std::string piece = tok.piece_bytes(next);
    if (grammar && !grammar->accept(piece)) fail(FASTLLM_ERR_INTERNAL, "grammar: the sampled token %d was masked out", next);
    if (gen_->stream.push(piece)) {
        finish_generation(gen_->stream.stopped_by_string() ? FASTLLM_STOP_STRING : FASTLLM_STOP_CALLBACK);
        return false;
    }
    if (grammar && grammar->finished()) {
        finish_generation(FASTLLM_STOP_GRAMMAR);
        return false;
    }
    if (result_.n_generated_tokens >= gen_->params.max_new_tokens) {
        finish_generation(FASTLLM_STOP_MAX_TOKENS);
        return false;
    }
    return true;
}

void Session::generate(const int32_t *prompt, size_t n_prompt, const SamplingOptions &p,
                       fastllm_stream_callback callback, void *user_data, GenerationResult &result) {
    begin_generation(prompt, n_prompt, p, callback, user_data);
    Session *self = this;
    int32_t done = gen_ ? 0 : 1;
    while (!done) step(&self, 1, &done, 1);  // its prompt is evaluated already
    result = result_;
}

}  // namespace fastllm
