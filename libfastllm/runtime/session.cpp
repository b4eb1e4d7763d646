#include "runtime/session.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>

#include "base/error.h"
#include "base/log.h"
#include "runtime/pass.h"

namespace fastllm {

namespace {
double ms_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// Checks the options and fills in the defaults.
SessionOptions resolve(const Model &model, SessionOptions p) {
    const DecoderConfig &c = model.config();
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
      cache_(make_cache()) {
    {
        std::lock_guard<std::mutex> lock(compute_.mutex);
        compute_.reserve(model_.decoder(), opt_.n_batch, model_.config().context_length);  // any session's positions fit
    }
    tokens_.reserve((size_t)opt_.n_ctx + 1);
    logits_.resize((size_t)model.config().vocab_size);
    const size_t full = (size_t)opt_.n_ctx * cache_.bytes_per_position();
    char windows[160] = "";
    if (cache_.n_dropping_layers() > 0)
        std::snprintf(windows, sizeof windows, "; %d of %d layers keep only their sliding window: at most %.1f MiB, not %.1f",
                      cache_.n_dropping_layers(), cache_.n_layers(), cache_.capacity_bytes() / 1048576.0, full / 1048576.0);
    log(FASTLLM_LOG_INFO, "session: n_ctx %d, n_batch %d, %s, KV cache %s/%s (%.1f KiB a token, allocated as used%s)",
        opt_.n_ctx, opt_.n_batch, compute_.backend->describe().c_str(), kv_type_name(opt_.type_k), kv_type_name(opt_.type_v),
        cache_.bytes_per_position() / 1024.0, windows);
}

Session::Session(const Session &src, size_t n, const SessionOptions &options) : Session(src.model_, options) {
    if (n > src.tokens_.size())
        fail(FASTLLM_ERR_INVALID_ARGUMENT, "cannot fork %zu tokens: the session has %zu", n, src.tokens_.size());
    if (n > (size_t)opt_.n_ctx) fail(FASTLLM_ERR_CONTEXT_FULL, "%zu tokens do not fit into n_ctx %d", n, opt_.n_ctx);
    cache_.share(src.cache_, (int)std::min(n, src.n_evaluated_));
    tokens_.assign(src.tokens_.begin(), src.tokens_.begin() + n);
    n_evaluated_ = std::min(n, src.n_evaluated_);
    keep_or_recompute();
}

KvCache Session::make_cache() const {
    const DecoderConfig &c = model_.config();
    return KvCache(c.num_layers, opt_.n_ctx, c.kv_dim(), opt_.type_k, opt_.type_v, c.window, !opt_.swa_full,
                   opt_.context_shift ? opt_.n_keep : 0, compute_.backend->memory());
}

void Session::keep_or_recompute() {
    if (cache_.can_continue((int)n_evaluated_)) {
        cache_.release_from((int)n_evaluated_);
        return;
    }
    // The sliding-window layers no longer hold the window before n_evaluated_ (they dropped it as the
    // context grew): the tokens are evaluated again, from the first, by the next evaluation.
    log(FASTLLM_LOG_INFO, "session: the sliding-window layers no longer hold positions before %zu; its %zu tokens "
        "will be evaluated again (swa_full keeps every position)", n_evaluated_, tokens_.size());
    n_evaluated_ = 0;
    cache_.release_from(0);
}

void Session::reset() {
    tokens_.clear();
    n_evaluated_ = 0;
    cache_.release_from(0);
    gen_.reset();
    has_gen_ = false;
}

void Session::truncate(size_t n_keep) {
    if (n_keep > tokens_.size())
        fail(FASTLLM_ERR_INVALID_ARGUMENT, "cannot keep %zu tokens: the context has %zu", n_keep, tokens_.size());
    tokens_.resize(n_keep);
    n_evaluated_ = std::min(n_evaluated_, n_keep);
    keep_or_recompute();
    gen_.reset();
    has_gen_ = false;
}

SessionMemory Session::memory() const {
    SessionMemory m;
    m.kv_bytes = cache_.bytes();
    m.kv_shared_bytes = cache_.shared_bytes();
    m.kv_bytes_per_token = cache_.bytes_per_position();
    m.kv_capacity_bytes = cache_.capacity_bytes();
    m.session_bytes = sizeof(*this) + logits_.capacity() * sizeof(float) + tokens_.capacity() * sizeof(int32_t) +
                      (size_t)(opt_.n_ctx + KvCache::kBlock - 1) / KvCache::kBlock * 16;
    m.compute_bytes = compute_.bytes();
    return m;
}

void Session::check_tokens(const int32_t *tokens, size_t n) const {
    if (n > 0 && !tokens) fail(FASTLLM_ERR_INVALID_ARGUMENT, "tokens is NULL");
    model_.check_token_ids(tokens, n);
    const bool fits = tokens_.size() + n <= (size_t)opt_.n_ctx;
    if (!fits && (!opt_.context_shift || n > (size_t)(opt_.n_ctx - opt_.n_keep)))
        fail(FASTLLM_ERR_CONTEXT_FULL, "%zu tokens do not fit: the context holds %d and %zu are in use%s", n, opt_.n_ctx,
             opt_.context_shift ? (size_t)opt_.n_keep : tokens_.size(), opt_.context_shift ? " (kept by n_keep)" : "");
}

void Session::make_room(size_t n) {
    if (tokens_.size() + n <= (size_t)opt_.n_ctx) return;
    if (!opt_.context_shift)
        fail(FASTLLM_ERR_CONTEXT_FULL, "%zu tokens do not fit: the context holds %d and %zu are in use", n, opt_.n_ctx,
             tokens_.size());
    const size_t after_keep = tokens_.size() - std::min(tokens_.size(), (size_t)opt_.n_keep);
    const size_t need = tokens_.size() + n - (size_t)opt_.n_ctx;
    const size_t discard = std::min(after_keep, std::max(need, opt_.n_discard ? (size_t)opt_.n_discard : after_keep / 2));
    if (discard < need)  // check_tokens has ruled this out
        fail(FASTLLM_ERR_CONTEXT_FULL, "%zu tokens do not fit even after a context shift", n);
    shift((int)discard);
}

void Session::shift(int discard) {
    const int keep = std::min(opt_.n_keep, (int)tokens_.size());
    const int evaluated = (int)n_evaluated_, from = keep + discard;
    if (evaluated > from) {
        cache_.prepare(keep, evaluated - discard);  // copy-on-write before moving rows into shared blocks
        model_.decoder().shift_cache(*compute_.backend, cache_, from, evaluated, discard);  // needs no pass lock
        n_evaluated_ = (size_t)(evaluated - discard);
    } else {
        n_evaluated_ = (size_t)std::min(evaluated, keep);
    }
    tokens_.erase(tokens_.begin() + keep, tokens_.begin() + from);
    cache_.release_from((int)n_evaluated_);
    cache_.forget((int)n_evaluated_);  // the windowed layers' blocks the shift allocated below their windows
    log(FASTLLM_LOG_DEBUG, "context shift: kept %d tokens, dropped %d, %zu now", keep, discard, tokens_.size());
}

void Session::run_pending(fastllm_logits_mode mode, float *out_logits) {
    const size_t vocab = (size_t)model_.config().vocab_size;
    const size_t first = n_evaluated_;
    // Out of memory here: nothing changed yet. The sliding-window layers get their blocks a pass at a
    // time, and forget() drops what falls out of their windows, so that a long prompt never makes
    // them hold more than a window and a pass.
    cache_.prepare((int)n_evaluated_, (int)tokens_.size(), false);
    while (n_evaluated_ < tokens_.size()) {
        if (cancel_.load()) break;
        const int T = (int)std::min<size_t>(opt_.n_batch, tokens_.size() - n_evaluated_);
        cache_.prepare((int)n_evaluated_, (int)n_evaluated_ + T);  // eval() keeps what is evaluated if this fails
        std::lock_guard<std::mutex> lock(compute_.mutex);  // the constructor reserved room for n_batch rows
        Pass pass(model_.decoder(), compute_, T, &cancel_);  // the T-th row runs it
        bool ran = true;
        for (int t = 0; t < T; t++) {
            const size_t i = n_evaluated_ + t;
            float *logits = nullptr;
            if (mode == FASTLLM_LOGITS_ALL) logits = out_logits + (i - first) * vocab;
            else if (mode == FASTLLM_LOGITS_LAST && i + 1 == tokens_.size()) logits = out_logits;
            ran = pass.add(cache_, (int)i, tokens_[i], logits);
        }
        if (!ran) break;
        n_evaluated_ += T;
        cache_.forget((int)n_evaluated_);
    }
    if (n_evaluated_ < tokens_.size()) {  // cancelled: the evaluated part stays, the rest goes
        const size_t dropped = tokens_.size() - n_evaluated_;
        tokens_.resize(n_evaluated_);
        cache_.release_from((int)n_evaluated_);
        cancel_ = false;
        fail(FASTLLM_ERR_CANCELLED, "cancelled: %zu tokens evaluated, the last %zu dropped from the context",
             n_evaluated_ - first, dropped);
    }
}

void Session::eval(const int32_t *tokens, size_t n, fastllm_logits_mode mode, float *out_logits) {
    Busy busy(*this);
    cancel_ = false;
    if (mode != FASTLLM_LOGITS_NONE && !out_logits) fail(FASTLLM_ERR_INVALID_ARGUMENT, "out_logits is NULL");
    if (n == 0) fail(FASTLLM_ERR_INVALID_ARGUMENT, "no tokens to evaluate");
    if (gen_ && gen_->prefill)
        fail(FASTLLM_ERR_INVALID_ARGUMENT, "the session's generation has a deferred prompt that the steps evaluate; "
             "cancel the generation first");
    check_tokens(tokens, n);
    run_pending(FASTLLM_LOGITS_NONE, nullptr);  // a token sampled last by generate() is still pending
    make_room(n);
    const size_t before = tokens_.size();
    tokens_.insert(tokens_.end(), tokens, tokens + n);
    try {
        run_pending(mode, out_logits);
    } catch (const Error &e) {
        if (e.status() != FASTLLM_ERR_OUT_OF_MEMORY) throw;
        // The context keeps what was evaluated: nothing, unless the sliding-window layers ran out
        // of blocks after some passes.
        tokens_.resize(std::max(before, n_evaluated_));
        cache_.release_from((int)n_evaluated_);
        throw;
    }
}

void Session::begin_generation(const int32_t *prompt, size_t n_prompt, const SamplingOptions &p,
                               fastllm_stream_callback callback, void *user_data, bool deferred) {
    Busy busy(*this);
    cancel_ = false;
    if (p.max_new_tokens < 0) fail(FASTLLM_ERR_INVALID_ARGUMENT, "max_new_tokens must not be negative");
    // A bad grammar fails here, before anything changes.
    auto grammar = p.grammar.empty() ? nullptr : std::make_unique<GrammarMatcher>(Grammar::parse(p.grammar));
    check_tokens(prompt, n_prompt);
    if (tokens_.empty() && n_prompt == 0) fail(FASTLLM_ERR_INVALID_ARGUMENT, "empty prompt and empty session");

    result_ = GenerationResult{};
    result_.n_prompt_tokens = (int)n_prompt;
    if (spec_) spec_->drafted = spec_->accepted = 0;
    gen_.reset();
    has_gen_ = false;
    auto t0 = std::chrono::steady_clock::now();
    make_room(n_prompt);
    const size_t from = tokens_.size(), end = from + n_prompt;
    if (deferred) {
        // Out of memory here rather than in a step: the layers without a window get the prompt's
        // blocks now (as run_pending does before its first pass).
        cache_.prepare((int)std::min(n_evaluated_, end - 1), (int)end, false);
    }
    tokens_.insert(tokens_.end(), prompt, prompt + n_prompt);
    if (n_evaluated_ == tokens_.size()) n_evaluated_--;  // re-run the last token to get its logits
    if (deferred) {
        gen_ = std::make_unique<Generation>(p, model_.config().vocab_size, callback, user_data, std::move(grammar));
        gen_->prefill = true;
        gen_->prompt_from = from;
        gen_->start = t0;  // until the prompt is evaluated: when it began
        has_gen_ = true;
        return;
    }
    try {
        run_pending(FASTLLM_LOGITS_LAST, logits_.data());
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
        tokens_.resize(std::max(n_evaluated_, gen_->prompt_from));
        cache_.release_from((int)n_evaluated_);
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

bool Session::request_cancel() {
    if (busy_.load() == 0 && !has_gen_.load()) return false;
    cancel_ = true;
    return true;
}

bool Session::sample_next() {
    if (cancel_.load()) {
        finish_generation(FASTLLM_STOP_CANCELLED);
        return false;
    }
    if (tokens_.size() >= (size_t)opt_.n_ctx) {
        if (!opt_.context_shift || tokens_.size() <= (size_t)opt_.n_keep) {
            finish_generation(FASTLLM_STOP_CONTEXT_FULL);
            return false;
        }
        make_room(1);
    }
    GrammarMatcher *grammar = gen_->grammar.get();
    // Masking before the sampler (penalty, truncations, draw) samples exactly from the allowed tokens.
    if (grammar && grammar->mask(model_.token_trie(), logits_.data(), (size_t)model_.config().vocab_size,
                                 !gen_->params.ignore_eos) == 0) {
        finish_generation(FASTLLM_STOP_GRAMMAR);  // a dead end: no token of the vocabulary continues the text
        return false;
    }
    const int32_t next = gen_->sampler.sample(logits_.data(), tokens_.data(), tokens_.size(), gen_->exclude);
    gen_->exclude = -1;
    return emit(next);
}

bool Session::emit(int32_t next) {
    const Tokenizer &tok = model_.tokenizer();
    GrammarMatcher *grammar = gen_->grammar.get();
    tokens_.push_back(next);  // pending: evaluated when the next token's logits are needed
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

void Session::set_speculative(const SpeculativeOptions *o) {
    if (!o) {
        spec_.reset();
        return;
    }
    auto s = std::make_unique<Speculation>();
    s->opt = *o;
    s->k = o->n_draft;
    s->drafter = make_drafter(model_, opt_, *o);
    s->logits.resize((size_t)(o->n_draft + 1) * (size_t)model_.config().vocab_size);
    s->draft.resize((size_t)o->n_draft);
    spec_ = std::move(s);
}

// Drafts only where they fit: inside n_ctx without a shift and max_new_tokens.
int Session::draft() {
    if (!spec_ || !gen_) return 0;
    Speculation &sp = *spec_;
    sp.n = 0;
    if (sp.skip > 0) {
        sp.skip--;
        return 0;
    }
    const int room = std::min<int>(opt_.n_ctx - (int)tokens_.size(), gen_->params.max_new_tokens - result_.n_generated_tokens);
    const int k = std::min(sp.k, room);
    if (k <= 0) return 0;
    sp.n = sp.drafter->propose(tokens_.data(), tokens_.size(), k, sp.draft.data());
    if (sp.n == 0 && sp.drafter->costly()) sp.back_off();
    if (sp.n > 0) {
        try {  // out of memory for the drafts' cache rows: no drafts, nothing else changes
            cache_.prepare((int)tokens_.size(), (int)tokens_.size() + sp.n);
        } catch (const Error &e) {
            if (e.status() != FASTLLM_ERR_OUT_OF_MEMORY) throw;
            sp.n = 0;
        } catch (const std::bad_alloc &) {
            sp.n = 0;
        }
    }
    return sp.n;
}

void Session::verify() {
    Speculation &sp = *spec_;
    const size_t V = (size_t)model_.config().vocab_size;
    const size_t first = n_evaluated_;  // the drafts' positions begin here
    int kept = 0;
    sp.drafted += sp.n;
    for (int i = 0; i < sp.n; i++) {
        float *row = sp.logits.data() + (size_t)i * V;  // after the sampled token and drafts [0, i)
        std::memcpy(logits_.data(), row, V * sizeof(float));  // what the next token is drawn from if draft i fails
        GrammarMatcher *grammar = gen_->grammar.get();
        const bool ok = (!grammar || grammar->mask(model_.token_trie(), row, V, !gen_->params.ignore_eos) > 0) &&
                        gen_->sampler.accept(row, tokens_.data(), tokens_.size(), sp.draft[i]);
        if (!ok) {
            gen_->exclude = sp.draft[i];
            break;
        }
        kept++;
        const bool going = emit(sp.draft[i]);
        n_evaluated_++;  // its row is in the cache already
        if (!going) break;
    }
    if (kept == sp.n && gen_) std::memcpy(logits_.data(), sp.logits.data() + (size_t)sp.n * V, V * sizeof(float));
    sp.accepted += kept;
    sp.k = kept == sp.n ? std::min(sp.opt.n_draft, sp.k + 2) : std::max(1, sp.k - 1);
    if (kept == 0) sp.back_off();
    else sp.misses = 0;
    if (n_evaluated_ < first + (size_t)sp.n) cache_.release_from((int)n_evaluated_);
    sp.n = 0;
}

// A pass holds max_batch rows. Prompt tokens that would push the step's decode rows (each decoding
// session's token and its most drafts) into one more pass than the prompt tokens need alone wait
// for the next step, unless that leaves them less than a quarter of the budget. SmolLM2-135M, 32
// streams, 256-token passes: each admission step made a second pass for the 31 rows that spilled
// (bench/bench_server.py --prefill_chunk 0,256).
int Session::prompt_budget(Session *const *sessions, size_t n, int max_prompt_tokens, int max_batch) {
    int decode = 0;
    for (size_t i = 0; i < n; i++) {
        const Session &s = *sessions[i];
        if (!s.gen_->prefill) decode += 1 + (s.spec_ ? s.spec_->opt.n_draft : 0);
    }
    const int passes = (std::max(max_prompt_tokens, decode) + max_batch - 1) / max_batch;
    const int room = passes * max_batch - decode;
    return room >= max_prompt_tokens / 4 ? std::min(max_prompt_tokens, room) : max_prompt_tokens;
}

void Session::step(Session *const *sessions, size_t n, int32_t *done, int max_prompt_tokens) {
    if (n == 0) return;
    if (!sessions || !done) fail(FASTLLM_ERR_INVALID_ARGUMENT, "sessions or done is NULL");
    if (max_prompt_tokens < 1)
        fail(FASTLLM_ERR_INVALID_ARGUMENT, "max_prompt_tokens must be at least 1, not %d", max_prompt_tokens);
    for (size_t i = 0; i < n; i++) {
        if (!sessions[i]) fail(FASTLLM_ERR_INVALID_ARGUMENT, "session %zu is NULL", i);
        if (&sessions[i]->model_ != &sessions[0]->model_)
            fail(FASTLLM_ERR_INVALID_ARGUMENT, "session %zu belongs to another model", i);
        if (!sessions[i]->gen_) fail(FASTLLM_ERR_INVALID_ARGUMENT, "session %zu has no generation in progress", i);
        for (size_t j = 0; j < i; j++)
            if (sessions[j] == sessions[i]) fail(FASTLLM_ERR_INVALID_ARGUMENT, "session %zu is listed twice", i);
    }
    struct BusyAll {  // Busy for every listed session, without allocating per step
        Session *const *s;
        size_t n;
        BusyAll(Session *const *s, size_t n) : s(s), n(n) {
            for (size_t i = 0; i < n; i++) s[i]->busy_.fetch_add(1);
        }
        ~BusyAll() {
            for (size_t i = 0; i < n; i++) s[i]->busy_.fetch_sub(1);
        }
    } busy(sessions, n);
    Compute &c = sessions[0]->compute_;  // the step's passes use the first session's compute
    const Decoder &decoder = sessions[0]->model_.decoder();
    std::lock_guard<std::mutex> lock(c.mutex);
    // Plan: every session's cache blocks for this step first, so that running out of memory leaves
    // every session as it was. Deferred prompts share the step's prompt budget in the order listed.
    int budget = prompt_budget(sessions, n, max_prompt_tokens, c.work.max_batch);
    for (size_t i = 0; i < n; i++) sessions[i]->plan_step(budget);
    // Run: each session's rows (a sampled token and its drafts, or a chunk of its prompt) in shared
    // passes over the weights.
    Pass pass(decoder, c, c.work.max_batch);
    for (size_t i = 0; i < n; i++) done[i] = sessions[i]->add_step_rows(pass) ? 0 : 1;
    pass.flush();
    // Commit: what the passes computed.
    for (size_t i = 0; i < n; i++)
        if (!done[i]) done[i] = sessions[i]->commit_step() ? 0 : 1;
}

void Session::plan_step(int &budget) {
    if (gen_->prefill) {
        gen_->chunk = (int)std::min<size_t>((size_t)budget, tokens_.size() - n_evaluated_);
        budget -= gen_->chunk;
        cache_.prepare((int)n_evaluated_, (int)n_evaluated_ + gen_->chunk);
        return;
    }
    const int pos = (int)tokens_.size();
    if (pos < opt_.n_ctx) cache_.prepare(pos, pos + 1);
}

bool Session::add_step_rows(Pass &pass) {
    if (gen_->prefill) {  // a chunk of the prompt; the logits of its last token only
        if (cancel_.load()) {
            cancel_generation();
            return false;
        }
        for (int t = 0; t < gen_->chunk; t++) {
            const size_t p = n_evaluated_ + t;
            pass.add(cache_, (int)p, tokens_[p], p + 1 == tokens_.size() ? logits_.data() : nullptr);
        }
        n_evaluated_ += gen_->chunk;
        return true;
    }
    if (!sample_next()) return false;
    cache_.prepare((int)n_evaluated_, (int)n_evaluated_ + 1);  // a shift may have moved it
    // The sampled token, then its drafts (speculative decoding), each row with its own logits.
    const int n_draft = draft();
    const size_t V = (size_t)model_.config().vocab_size;
    for (int r = 0; r <= n_draft; r++) {
        float *logits = n_draft ? spec_->logits.data() + (size_t)r * V : logits_.data();
        pass.add(cache_, (int)n_evaluated_ + r, r == 0 ? tokens_.back() : spec_->draft[r - 1], logits);
    }
    n_evaluated_++;
    return true;
}

bool Session::commit_step() {
    if (gen_->prefill) {
        if (n_evaluated_ == tokens_.size()) {
            prompt_evaluated();
            if (!sampling_starts()) return false;
        }
    } else if (spec_ && spec_->n) {
        verify();
        if (!gen_) return false;  // it ended inside the drafts
    }
    cache_.forget((int)n_evaluated_);
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
