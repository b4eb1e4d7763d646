#include "runtime/context.h"

#include <algorithm>
#include <mutex>

#include "base/error.h"
#include "base/log.h"
#include "runtime/pass.h"

namespace fastllm {

Context::Context(const Model &model, const SessionOptions &opt, Compute &compute)
    : model_(model), opt_(opt), compute_(compute), cache(make_cache()) {
    tokens.reserve((size_t)opt.n_ctx + 1);
}

void Context::fork_from(const Context &src, size_t n) {
    if (n > src.tokens.size())
        fail(FASTLLM_ERR_INVALID_ARGUMENT, "cannot fork %zu tokens: the session has %zu", n, src.tokens.size());
    if (n > (size_t)opt_.n_ctx) fail(FASTLLM_ERR_CONTEXT_FULL, "%zu tokens do not fit into n_ctx %d", n, opt_.n_ctx);
    cache.share(src.cache, (int)std::min(n, src.n_evaluated));
    tokens.assign(src.tokens.begin(), src.tokens.begin() + n);
    n_evaluated = std::min(n, src.n_evaluated);
    lora = src.lora;  // its tokens' KV was computed with them: the fork goes on with them
    keep_or_recompute();
}

void Context::clear() {
    tokens.clear();
    n_evaluated = 0;
    cache.release_from(0);
}

void Context::keep(size_t n) {
    if (n > tokens.size())
        fail(FASTLLM_ERR_INVALID_ARGUMENT, "cannot keep %zu tokens: the context has %zu", n, tokens.size());
    tokens.resize(n);
    n_evaluated = std::min(n_evaluated, n);
    keep_or_recompute();
}

KvCache Context::make_cache() const {
    const DecoderConfig &c = model_.config();
    return KvCache(c.num_layers, opt_.n_ctx, c.kv_dim(), opt_.type_k, opt_.type_v, c.window, !opt_.swa_full,
                   opt_.context_shift ? opt_.n_keep : 0, compute_.kv_memory(c.num_layers));
}

void Context::keep_or_recompute() {
    if (cache.can_continue((int)n_evaluated)) {
        cache.release_from((int)n_evaluated);
        return;
    }
    // The sliding-window layers no longer hold the window before n_evaluated (they dropped it as the
    // context grew): the tokens are evaluated again, from the first, by the next evaluation.
    log(FASTLLM_LOG_INFO, "session: the sliding-window layers no longer hold positions before %zu; its %zu tokens "
        "will be evaluated again (swa_full keeps every position)", n_evaluated, tokens.size());
    n_evaluated = 0;
    cache.release_from(0);
}

void Context::check_tokens(const int32_t *ids, size_t n) const {
    if (n > 0 && !ids) fail(FASTLLM_ERR_INVALID_ARGUMENT, "tokens is NULL");
    model_.check_token_ids(ids, n);
    const bool fits = tokens.size() + n <= (size_t)opt_.n_ctx;
    if (!fits && (!opt_.context_shift || n > (size_t)(opt_.n_ctx - opt_.n_keep)))
        fail(FASTLLM_ERR_CONTEXT_FULL, "%zu tokens do not fit: the context holds %d and %zu are in use%s", n, opt_.n_ctx,
             opt_.context_shift ? (size_t)opt_.n_keep : tokens.size(), opt_.context_shift ? " (kept by n_keep)" : "");
}

void Context::make_room(size_t n) {
    if (tokens.size() + n <= (size_t)opt_.n_ctx) return;
    if (!opt_.context_shift)
        fail(FASTLLM_ERR_CONTEXT_FULL, "%zu tokens do not fit: the context holds %d and %zu are in use", n, opt_.n_ctx,
             tokens.size());
    const size_t after_keep = tokens.size() - std::min(tokens.size(), (size_t)opt_.n_keep);
    const size_t need = tokens.size() + n - (size_t)opt_.n_ctx;
    const size_t discard = std::min(after_keep, std::max(need, opt_.n_discard ? (size_t)opt_.n_discard : after_keep / 2));
    if (discard < need)  // check_tokens has ruled this out
        fail(FASTLLM_ERR_CONTEXT_FULL, "%zu tokens do not fit even after a context shift", n);
    shift((int)discard);
}

void Context::shift(int discard) {
    const int keep = std::min(opt_.n_keep, (int)tokens.size());
    const int evaluated = (int)n_evaluated, from = keep + discard;
    if (evaluated > from) {
        cache.prepare(keep, evaluated - discard);  // copy-on-write before moving rows into shared blocks
        model_.decoder().shift_cache(compute_.stages, cache, from, evaluated, discard);  // needs no pass lock
        n_evaluated = (size_t)(evaluated - discard);
    } else {
        n_evaluated = (size_t)std::min(evaluated, keep);
    }
    tokens.erase(tokens.begin() + keep, tokens.begin() + from);
    cache.release_from((int)n_evaluated);
    cache.forget((int)n_evaluated);  // the windowed layers' blocks the shift allocated below their windows
    log(FASTLLM_LOG_DEBUG, "context shift: kept %d tokens, dropped %d, %zu now", keep, discard, tokens.size());
}

void Context::run_pending(fastllm_logits_mode mode, float *out_logits, std::atomic<bool> &cancel) {
    const size_t vocab = (size_t)model_.config().vocab_size;
    const size_t first = n_evaluated;
    // Out of memory here: nothing changed yet. The sliding-window layers get their blocks a pass at a
    // time, and forget() drops what falls out of their windows, so that a long prompt never makes
    // them hold more than a window and a pass.
    cache.prepare((int)n_evaluated, (int)tokens.size(), false);
    while (n_evaluated < tokens.size()) {
        if (cancel.load()) break;
        const int T = (int)std::min<size_t>(opt_.n_batch, tokens.size() - n_evaluated);
        cache.prepare((int)n_evaluated, (int)n_evaluated + T);  // eval() keeps what is evaluated if this fails
        std::lock_guard<std::mutex> lock(compute_.mutex);  // the constructor reserved room for n_batch rows
        Pass pass(model_.decoder(), compute_, T, &cancel);  // the T-th row runs it
        bool ran = true;
        for (int t = 0; t < T; t++) {
            const size_t i = n_evaluated + t;
            float *logits = nullptr;
            if (mode == FASTLLM_LOGITS_ALL) logits = out_logits + (i - first) * vocab;
            else if (mode == FASTLLM_LOGITS_LAST && i + 1 == tokens.size()) logits = out_logits;
            ran = pass.add(cache, (int)i, tokens[i], logits, nullptr, 0, lora.get());
        }
        if (!ran) break;
        n_evaluated += T;
        cache.forget((int)n_evaluated);
    }
    if (n_evaluated < tokens.size()) {  // cancelled: the evaluated part stays, the rest goes
        const size_t dropped = tokens.size() - n_evaluated;
        tokens.resize(n_evaluated);
        cache.release_from((int)n_evaluated);
        cancel = false;
        fail(FASTLLM_ERR_CANCELLED, "cancelled: %zu tokens evaluated, the last %zu dropped from the context",
             n_evaluated - first, dropped);
    }
}

}  // namespace fastllm
