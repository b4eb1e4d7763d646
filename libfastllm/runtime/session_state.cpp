// session_state.cpp — a session's saved state (fastllm_session_save_state). Layout, little-endian:
//   "FLMSTATE" u32 version  u64 model fingerprint
//   (version 4) u32 n_adapters, then per adapter u64 fingerprint, f32 scale: the LoRA adapters its
//     KV was computed with (loading into a session with other adapters is refused)
//   u32 n_layers  u32 kv_dim  u32 type_k  u32 type_v  u32 n_tokens  u32 n_evaluated  i32 tokens[n_tokens]
//   per layer: u8 held[ceil(n_evaluated / 32)] (version 2: which blocks of 32 positions follow;
//     a sliding-window layer holds only its window), then the key rows of the held positions below
//     n_evaluated, then their value rows (in type_k / type_v); version 1: every block, no flags
//   u8 generating; if 1: the sampling options (stop strings, grammar, its triggers from version 3),
//     the RNG state, n_prompt /
//     n_generated, the text the stream holds back, the text the grammar has accepted (replayed
//     into a new matcher on load), and the last logits (vocab floats)
//   u64 FNV-1a of everything before
// Loading checks the checksum, the version, the fingerprint and every size before anything in the
// session changes.
#include <cstdio>
#include <cstring>
#include <string>

#include "base/error.h"
#include "base/fnv.h"
#include "runtime/session.h"

namespace fastllm {

namespace {

constexpr char kMagic[8] = {'F', 'L', 'M', 'S', 'T', 'A', 'T', 'E'};
// version 1 (fastllm 0.4): every position of every layer; version 2 (0.5): no grammar triggers;
// version 3 (0.6): no adapters
constexpr uint32_t kStateVersion = 4;

uint64_t fnv1a(const uint8_t *p, size_t n) {
    Fnv1a f;
    f.add(p, n);
    return f.h;
}

struct Writer {
    std::vector<uint8_t> out;
    void bytes(const void *p, size_t n) { out.insert(out.end(), (const uint8_t *)p, (const uint8_t *)p + n); }
    // n bytes more, for the caller to fill.
    uint8_t *grow(size_t n) {
        out.resize(out.size() + n);
        return out.data() + out.size() - n;
    }
    template <typename T>
    void put(T v) { bytes(&v, sizeof v); }
    void str(const std::string &s) {
        put((uint32_t)s.size());
        bytes(s.data(), s.size());
    }
};

struct Reader {
    const uint8_t *p, *end;
    const uint8_t *take(size_t n) {
        if ((size_t)(end - p) < n) fail(FASTLLM_ERR_BAD_FORMAT, "session state: truncated");
        const uint8_t *at = p;
        p += n;
        return at;
    }
    template <typename T>
    T get() {
        T v;
        std::memcpy(&v, take(sizeof v), sizeof v);
        return v;
    }
    std::string str() {
        const uint32_t n = get<uint32_t>();
        const uint8_t *at = take(n);
        return std::string((const char *)at, n);
    }
};

void put_options(Writer &w, const SamplingOptions &o) {
    w.put((int32_t)o.max_new_tokens);
    w.put(o.temperature), w.put(o.top_p), w.put(o.min_p), w.put(o.repetition_penalty);
    w.put((int32_t)o.top_k), w.put((int32_t)o.repeat_last_n);
    w.put(o.seed);
    w.put((uint8_t)o.ignore_eos);
    w.put((uint32_t)o.stop.size());
    for (const std::string &s : o.stop) w.str(s);
    w.str(o.grammar);
    w.put((uint32_t)o.grammar_triggers.size());
    for (const std::string &s : o.grammar_triggers) w.str(s);
}

SamplingOptions get_options(Reader &r, uint32_t version) {
    SamplingOptions o;
    o.max_new_tokens = r.get<int32_t>();
    o.temperature = r.get<float>(), o.top_p = r.get<float>(), o.min_p = r.get<float>();
    o.repetition_penalty = r.get<float>();
    o.top_k = r.get<int32_t>(), o.repeat_last_n = r.get<int32_t>();
    o.seed = r.get<uint64_t>();
    o.ignore_eos = r.get<uint8_t>() != 0;
    const uint32_t n_stop = r.get<uint32_t>();
    if (n_stop > (size_t)(r.end - r.p) / 4) fail(FASTLLM_ERR_BAD_FORMAT, "session state: bad stop string count");
    for (uint32_t i = 0; i < n_stop; i++) o.stop.push_back(r.str());
    o.grammar = r.str();
    if (version >= 3) {
        const uint32_t n = r.get<uint32_t>();
        if (n > (size_t)(r.end - r.p) / 4) fail(FASTLLM_ERR_BAD_FORMAT, "session state: bad grammar trigger count");
        for (uint32_t i = 0; i < n; i++) o.grammar_triggers.push_back(r.str());
    }
    return o;
}

}  // namespace

std::vector<uint8_t> Session::save_state() const {
    if (gen_ && gen_->prefill)
        fail(FASTLLM_ERR_INVALID_ARGUMENT, "the session's generation has a deferred prompt not yet evaluated; "
             "step until its first token, or cancel the generation");
    Writer w;
    w.bytes(kMagic, sizeof kMagic);
    w.put(kStateVersion);
    w.put(model_.fingerprint());
    const auto *adapters = ctx_.lora ? &ctx_.lora->entries : nullptr;
    w.put((uint32_t)(adapters ? adapters->size() : 0));
    if (adapters)
        for (const auto &e : *adapters) w.put(e.first->fingerprint()), w.put(e.second);
    w.put((uint32_t)ctx_.cache.n_layers()), w.put((uint32_t)ctx_.cache.kv_dim());
    w.put((uint32_t)ctx_.cache.type_k()), w.put((uint32_t)ctx_.cache.type_v());
    w.put((uint32_t)ctx_.tokens.size()), w.put((uint32_t)ctx_.n_evaluated);
    w.bytes(ctx_.tokens.data(), ctx_.tokens.size() * sizeof(int32_t));
    w.out.reserve(w.out.size() + ctx_.cache.bytes() + 64 + logits_.size() * 4);
    const int n_eval = (int)ctx_.n_evaluated, n_blocks = (n_eval + KvCache::kBlock - 1) / KvCache::kBlock;
    for (int l = 0; l < ctx_.cache.n_layers(); l++) {
        for (int b = 0; b < n_blocks; b++) w.put((uint8_t)ctx_.cache.holds(l, b * KvCache::kBlock));
        for (int p = 0; p < n_eval; p++)
            if (ctx_.cache.holds(l, p)) compute_.backend_of(l).read_kv_row(ctx_.cache, l, false, p, w.grow(ctx_.cache.row_bytes_k()));
        for (int p = 0; p < n_eval; p++)
            if (ctx_.cache.holds(l, p)) compute_.backend_of(l).read_kv_row(ctx_.cache, l, true, p, w.grow(ctx_.cache.row_bytes_v()));
    }
    w.put((uint8_t)(gen_ ? 1 : 0));
    if (gen_) {
        put_options(w, gen_->params);
        w.put(gen_->sampler.rng_state());
        w.put((int32_t)result_.n_prompt_tokens), w.put((int32_t)result_.n_generated_tokens);
        w.str(gen_->stream.held());
        w.str(gen_->grammar ? gen_->grammar->accepted() : std::string());  // replayed into a new matcher
        w.bytes(logits_.data(), logits_.size() * sizeof(float));
    }
    w.put(fnv1a(w.out.data(), w.out.size()));
    return std::move(w.out);
}

void Session::load_state(const uint8_t *data, size_t size, fastllm_stream_callback callback, void *user_data) {
    if (!data && size) fail(FASTLLM_ERR_INVALID_ARGUMENT, "data is NULL");
    if (size < sizeof kMagic + 4 + 8 || std::memcmp(data, kMagic, sizeof kMagic) != 0)
        fail(FASTLLM_ERR_BAD_FORMAT, "not a fastllm session state");
    uint64_t sum;
    std::memcpy(&sum, data + size - 8, 8);
    if (fnv1a(data, size - 8) != sum) fail(FASTLLM_ERR_BAD_FORMAT, "session state: truncated or damaged (checksum)");
    Reader r{data + sizeof kMagic, data + size - 8};
    const uint32_t version = r.get<uint32_t>();
    if (version < 1 || version > kStateVersion)
        fail(FASTLLM_ERR_BAD_FORMAT, "session state version %u; this library reads versions 1 to %u", version,
             kStateVersion);
    if (r.get<uint64_t>() != model_.fingerprint())
        fail(FASTLLM_ERR_BAD_FORMAT, "session state belongs to another model (its weights, config or vocabulary differ)");
    // Its KV was computed with these adapters: only a session with the same ones (and scales) can go on.
    std::vector<std::pair<uint64_t, float>> saved;
    if (version >= 4) {
        const uint32_t n = r.get<uint32_t>();
        if (n > (size_t)(r.end - r.p) / 12) fail(FASTLLM_ERR_BAD_FORMAT, "session state: bad adapter count");
        for (uint32_t i = 0; i < n; i++) {
            const uint64_t f = r.get<uint64_t>();
            saved.emplace_back(f, r.get<float>());
        }
    }
    std::vector<std::pair<uint64_t, float>> mine;
    if (ctx_.lora)
        for (const auto &e : ctx_.lora->entries) mine.emplace_back(e.first->fingerprint(), e.second);
    if (saved != mine)
        fail(FASTLLM_ERR_BAD_FORMAT, "session state was saved with %zu LoRA adapter(s); this session has %zu%s: set the "
             "same adapters and scales before loading it", saved.size(), mine.size(),
             saved.size() == mine.size() ? " others (or other scales)" : "");
    const uint32_t layers = r.get<uint32_t>(), dim = r.get<uint32_t>();
    const uint32_t tk = r.get<uint32_t>(), tv = r.get<uint32_t>();
    const uint32_t n_tokens = r.get<uint32_t>(), n_eval = r.get<uint32_t>();
    if ((int)layers != ctx_.cache.n_layers() || (int)dim != ctx_.cache.kv_dim() || tk >= (uint32_t)kNumKvTypes ||
        tv >= (uint32_t)kNumKvTypes || n_eval > n_tokens)
        fail(FASTLLM_ERR_BAD_FORMAT, "session state: inconsistent header");
    if (n_tokens > (uint32_t)opt_.n_ctx)
        fail(FASTLLM_ERR_CONTEXT_FULL, "session state holds %u tokens; this session's n_ctx is %d", n_tokens, opt_.n_ctx);
    std::vector<int32_t> tokens(n_tokens);
    std::memcpy(tokens.data(), r.take((size_t)n_tokens * 4), (size_t)n_tokens * 4);
    model_.check_token_ids(tokens.data(), tokens.size());

    // The rows go into a new cache (converted when the types differ); it replaces ours at the end.
    const KvType type_k = (KvType)tk, type_v = (KvType)tv;
    const size_t rk = kv_row_bytes(type_k, (int)dim), rv = kv_row_bytes(type_v, (int)dim);
    KvCache cache = ctx_.make_cache();
    cache.prepare(0, (int)n_eval);
    const int n_blocks = ((int)n_eval + KvCache::kBlock - 1) / KvCache::kBlock;
    std::vector<uint8_t> held((size_t)n_blocks, 1);
    auto copy_rows = [&](KvType from, size_t row_bytes, bool value, int l) {
        for (uint32_t p = 0; p < n_eval; p++)
            if (held[p / KvCache::kBlock]) compute_.backend_of(l).write_kv_row(cache, l, value, (int)p, from, r.take(row_bytes));
    };
    std::vector<std::pair<int, int>> missing;  // (layer, block): released once every layer is read, as
                                               // the layers of a window share blocks
    try {
        for (int l = 0; l < ctx_.cache.n_layers(); l++) {
            if (version >= 2) std::memcpy(held.data(), r.take(held.size()), held.size());
            copy_rows(type_k, rk, false, l);
            copy_rows(type_v, rv, true, l);
            for (int b = 0; b < n_blocks; b++)
                if (!held[b]) missing.emplace_back(l, b);
        }
        compute_.finish();  // a device backend's writes done before the blocks can change hands
    } catch (...) {
        compute_.finish();  // a truncated state: the writes recorded so far land before the cache is freed
        throw;
    }
    for (const auto &m : missing) cache.release_block(m.first, m.second * KvCache::kBlock);
    cache.forget((int)n_eval);
    const bool generating = r.get<uint8_t>() != 0;
    std::unique_ptr<Generation> gen;
    GenerationResult result;
    std::vector<float> logits;
    if (generating) {
        const SamplingOptions o = get_options(r, version);
        const uint64_t rng = r.get<uint64_t>();
        result.n_prompt_tokens = r.get<int32_t>(), result.n_generated_tokens = r.get<int32_t>();
        std::string held = r.str();
        const std::string accepted = r.str();
        logits.resize(logits_.size());
        std::memcpy(logits.data(), r.take(logits.size() * 4), logits.size() * 4);
        if (n_eval != n_tokens) fail(FASTLLM_ERR_BAD_FORMAT, "session state: a generation with unevaluated tokens");
        if (!cache.can_continue((int)n_eval))
            fail(FASTLLM_ERR_BAD_FORMAT, "session state: a generation whose KV rows lack positions its next token sees");
        std::unique_ptr<GrammarMatcher> matcher;
        if (!o.grammar.empty()) {
            try {
                matcher = matcher_of(o);
            } catch (const Error &e) {
                fail(FASTLLM_ERR_BAD_FORMAT, "session state: its grammar does not parse (%s)", e.what());
            }
            if (!matcher->accept(accepted)) fail(FASTLLM_ERR_BAD_FORMAT, "session state: its grammar rejects its text");
        }
        gen = std::make_unique<Generation>(o, model_.config().vocab_size, callback, user_data, std::move(matcher));
        gen->sampler.set_rng_state(rng);
        gen->stream.restore_held(std::move(held));
        gen->start = std::chrono::steady_clock::now();
    }
    if (r.p != r.end) fail(FASTLLM_ERR_BAD_FORMAT, "session state: %zu bytes too many", (size_t)(r.end - r.p));

    ctx_.cache = std::move(cache);
    ctx_.tokens = std::move(tokens);
    ctx_.tokens.reserve((size_t)opt_.n_ctx + 1);
    ctx_.n_evaluated = n_eval;
    ctx_.keep_or_recompute();  // rows saved without the window a query at n_eval sees: evaluated again
    gen_ = std::move(gen);
    has_gen_ = gen_ != nullptr;
    if (gen_) {
        logits_ = std::move(logits);
        result_ = result;
    }
}

}  // namespace fastllm
