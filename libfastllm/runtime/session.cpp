#include "runtime/session.h"

#include <cmath>

#include <algorithm>
#include <cstdio>
#include <mutex>

#include "base/error.h"
#include "base/log.h"

namespace fastllm {

namespace {
// Checks the options and fills in the defaults.
SessionOptions resolve(const Model &model, SessionOptions p) {
    const DecoderConfig &c = model.config();
    if (!c.causal || !model.decoder().has_lm_head())
        fail(FASTLLM_ERR_UNSUPPORTED, "%s is an embedding model (%s, no output head): it embeds (fastllm_embed) and "
             "does not generate", model.file().path().c_str(), c.arch.c_str());
    if (p.n_ctx < 0 || p.n_batch < 0 || p.n_threads < 0 || p.n_keep < 0 || p.n_discard < 0)
        fail(FASTLLM_ERR_INVALID_ARGUMENT,
             "session params must not be negative (n_ctx %d, n_batch %d, n_threads %d, n_keep %d, n_discard %d)",
             p.n_ctx, p.n_batch, p.n_threads, p.n_keep, p.n_discard);
    for (KvType t : {p.type_k, p.type_v})
        if ((int)t < 0 || (int)t >= kNumKvTypes) fail(FASTLLM_ERR_INVALID_ARGUMENT, "unknown KV cache type %d", (int)t);
    if (p.n_ctx > c.context_length)
        fail(FASTLLM_ERR_INVALID_ARGUMENT, "n_ctx %d exceeds the model's context length %d", p.n_ctx, c.context_length);
    p.n_ctx = p.n_ctx ? p.n_ctx : std::min(SessionOptions::kDefaultContext, c.context_length);
    p.n_batch = std::min(p.n_batch ? p.n_batch : 256, p.n_ctx);
    p.n_threads = p.n_threads ? p.n_threads : model.n_threads();
    if (p.n_keep >= p.n_ctx)
        fail(FASTLLM_ERR_INVALID_ARGUMENT, "n_keep %d must be smaller than the context (n_ctx %d)", p.n_keep, p.n_ctx);
    return p;
}
}  // namespace

Session::Session(const Model &model, const SessionOptions &options)
    : model_(model), opt_(resolve(model, options)), compute_(model.compute(opt_.n_threads)),
      ctx_(model, opt_, compute_) {
    {
        std::lock_guard<std::mutex> lock(compute_.mutex);
        compute_.reserve(model_.decoder(), opt_.n_batch);
    }
    logits_.resize((size_t)model.config().vocab_size);
    const size_t full = (size_t)opt_.n_ctx * ctx_.cache.bytes_per_position();
    char windows[160] = "";
    if (ctx_.cache.n_dropping_layers() > 0)
        std::snprintf(windows, sizeof windows, "; %d of %d layers keep only their sliding window: at most %.1f MiB, not %.1f",
                      ctx_.cache.n_dropping_layers(), ctx_.cache.n_layers(), ctx_.cache.capacity_bytes() / 1048576.0, full / 1048576.0);
    log(FASTLLM_LOG_INFO, "session: n_ctx %d, n_batch %d, %s, KV cache %s/%s (%.1f KiB a token, allocated as used%s)",
        opt_.n_ctx, opt_.n_batch, compute_.describe().c_str(), kv_type_name(opt_.type_k), kv_type_name(opt_.type_v),
        ctx_.cache.bytes_per_position() / 1024.0, windows);
}

Session::Session(const Session &src, size_t n, const SessionOptions &options) : Session(src.model_, options) {
    ctx_.fork_from(src.ctx_, n);
}

void Session::set_adapters(const std::vector<std::pair<std::shared_ptr<const LoraAdapter>, float>> &adapters) {
    if (has_gen_.load() || busy_.load() > 0)
        fail(FASTLLM_ERR_INVALID_ARGUMENT, "the session is generating or evaluating: set its adapters between them");
    for (size_t i = 0; i < adapters.size(); i++) {
        const LoraAdapter *a = adapters[i].first.get();
        if (!a) fail(FASTLLM_ERR_INVALID_ARGUMENT, "adapter %zu is NULL", i);
        if (&a->decoder() != &model_.decoder())
            fail(FASTLLM_ERR_INVALID_ARGUMENT, "adapter %zu (%s) was loaded for another model", i, a->path().c_str());
        if (!std::isfinite(adapters[i].second))
            fail(FASTLLM_ERR_INVALID_ARGUMENT, "adapter %zu (%s): scale %g is not finite", i, a->path().c_str(),
                 (double)adapters[i].second);
        for (size_t j = 0; j < i; j++)
            if (adapters[j].first.get() == a)
                fail(FASTLLM_ERR_INVALID_ARGUMENT, "adapter %zu is adapter %zu again: give it one scale", i, j);
    }
    if (!adapters.empty())
        for (const Stage &st : compute_.stages)
            if (!st.be->runs_adapters())
                fail(FASTLLM_ERR_UNSUPPORTED, "LoRA adapters run on the CPU; this model's layers %d-%d are on %s",
                     st.first_layer, st.end_layer - 1, st.be->describe().c_str());
    if (adapters.empty()) {
        ctx_.lora.reset();
        return;
    }
    auto set = std::make_shared<LoraSet>();
    set->entries = adapters;
    ctx_.lora = std::move(set);
}

void Session::reset() {
    ctx_.clear();
    gen_.reset();
    has_gen_ = false;
}

void Session::truncate(size_t n_keep) {
    ctx_.keep(n_keep);
    gen_.reset();
    has_gen_ = false;
}

SessionMemory Session::memory() const {
    SessionMemory m;
    m.kv_bytes = ctx_.cache.bytes();
    m.kv_shared_bytes = ctx_.cache.shared_bytes();
    m.kv_bytes_per_token = ctx_.cache.bytes_per_position();
    m.kv_capacity_bytes = ctx_.cache.capacity_bytes();
    m.session_bytes = sizeof(*this) + logits_.capacity() * sizeof(float) + ctx_.tokens.capacity() * sizeof(int32_t) +
                      (size_t)(opt_.n_ctx + KvCache::kBlock - 1) / KvCache::kBlock * 16;
    m.compute_bytes = compute_.bytes();
    return m;
}

void Session::eval(const int32_t *tokens, size_t n, fastllm_logits_mode mode, float *out_logits) {
    // cleared before the session counts as busy: a cancel from another thread that finds it busy
    // is then never wiped (one that finds it idle is refused, and the caller may try again)
    cancel_ = false;
    Busy busy(*this);
    if (mode != FASTLLM_LOGITS_NONE && !out_logits) fail(FASTLLM_ERR_INVALID_ARGUMENT, "out_logits is NULL");
    if (n == 0) fail(FASTLLM_ERR_INVALID_ARGUMENT, "no tokens to evaluate");
    if (gen_ && gen_->prefill)
        fail(FASTLLM_ERR_INVALID_ARGUMENT, "the session's generation has a deferred prompt that the steps evaluate; "
             "cancel the generation first");
    ctx_.check_tokens(tokens, n);
    ctx_.run_pending(FASTLLM_LOGITS_NONE, nullptr, cancel_);  // a token sampled last by generate() is still pending
    ctx_.make_room(n);
    const size_t before = ctx_.tokens.size();
    ctx_.tokens.insert(ctx_.tokens.end(), tokens, tokens + n);
    try {
        ctx_.run_pending(mode, out_logits, cancel_);
    } catch (const Error &e) {
        if (e.status() != FASTLLM_ERR_OUT_OF_MEMORY) throw;
        // The context keeps what was evaluated: nothing, unless the sliding-window layers ran out
        // of blocks after some passes.
        ctx_.tokens.resize(std::max(before, ctx_.n_evaluated));
        ctx_.cache.release_from((int)ctx_.n_evaluated);
        throw;
    }
}

bool Session::request_cancel() {
    if (busy_.load() == 0 && !has_gen_.load()) return false;
    cancel_ = true;
    return true;
}

}  // namespace fastllm
