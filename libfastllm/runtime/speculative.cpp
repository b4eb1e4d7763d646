#include "runtime/speculative.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>

#include "base/error.h"
#include "runtime/model.h"
#include "runtime/session.h"

namespace fastllm {

namespace {

// Prompt lookup: the most recent earlier occurrence of the context's last n tokens (n from
// ngram_max down to ngram_min), and the tokens that followed it. For replies that repeat their
// input (rewriting, extraction, quoting): no second model, no pass when nothing matches.
class PromptLookup : public Drafter {
public:
    PromptLookup(int ngram_min, int ngram_max) : min_(ngram_min), max_(ngram_max) {}
    int propose(const int32_t *ctx, size_t n, int k, int32_t *out) override {
        for (int g = std::min<int>(max_, (int)n - 1); g >= min_; g--) {
            const int32_t *tail = ctx + n - g;
            for (size_t j = n - g; j-- > 0;) {
                if (!std::equal(tail, tail + g, ctx + j)) continue;
                const int m = (int)std::min<size_t>((size_t)k, n - (j + g));
                std::copy(ctx + j + g, ctx + j + g + m, out);
                return m;
            }
        }
        return 0;
    }
    bool costly() const override { return false; }

private:
    int min_, max_;
};

// A smaller model of the same vocabulary, greedy, in its own session that follows the target's
// context: the common prefix is kept, the rest evaluated, then up to k - 1 single-token passes,
// stopping at a token the draft model itself gives less than p_min (a guess it is unsure of is
// seldom kept, and its pass is wasted).
class DraftModel : public Drafter {
public:
    DraftModel(const Model &draft, const SessionOptions &target, float p_min)
        : session_(draft, options(target)), logits_((size_t)draft.config().vocab_size), p_min_(p_min) {}
    bool costly() const override { return true; }
    int propose(const int32_t *ctx, size_t n, int k, int32_t *out) override {
        try {
            const std::vector<int32_t> &have = session_.tokens();
            size_t common = std::mismatch(have.begin(), have.end(), ctx, ctx + n).first - have.begin();
            if (common == n) common--;  // the last token again, for its logits
            if (common < have.size()) session_.truncate(common);
            session_.eval(ctx + common, n - common, FASTLLM_LOGITS_LAST, logits_.data());
            int got = 0;
            while (got < k) {
                const auto top = std::max_element(logits_.begin(), logits_.end());
                double sum = 0;  // softmax probability of the top token
                for (float l : logits_) sum += std::exp((double)(l - *top));
                if (1.0 / sum < p_min_) break;
                out[got] = (int32_t)(top - logits_.begin());
                if (++got == k) break;
                session_.eval(out + got - 1, 1, FASTLLM_LOGITS_LAST, logits_.data());
            }
            return got;
        } catch (const Error &) {  // its context full, out of memory: no draft this step
            session_.truncate(0);
            return 0;
        }
    }

private:
    static SessionOptions options(const SessionOptions &target) {
        SessionOptions o;
        o.n_ctx = target.n_ctx;
        o.n_threads = target.n_threads;
        return o;
    }
    Session session_;
    std::vector<float> logits_;
    float p_min_;
};

}  // namespace

std::unique_ptr<Drafter> make_drafter(const Model &target, const SessionOptions &session, const SpeculativeOptions &o) {
    if (o.n_draft < 1 || o.n_draft > SpeculativeOptions::kMaxDraft)
        fail(FASTLLM_ERR_INVALID_ARGUMENT, "n_draft %d is out of range (1 to %d)", o.n_draft, SpeculativeOptions::kMaxDraft);
    if (!o.draft_model) {
        if (o.ngram_min < 1 || o.ngram_max < o.ngram_min || o.ngram_max > 16)
            fail(FASTLLM_ERR_INVALID_ARGUMENT, "prompt lookup n-grams %d to %d: expected 1 <= ngram_min <= ngram_max <= 16",
                 o.ngram_min, o.ngram_max);
        return std::make_unique<PromptLookup>(o.ngram_min, o.ngram_max);
    }
    const Model &d = *o.draft_model;
    if (&d == &target) fail(FASTLLM_ERR_INVALID_ARGUMENT, "the draft model is the session's own model");
    const Tokenizer &a = target.tokenizer(), &b = d.tokenizer();
    if (a.vocab_size() != b.vocab_size() || target.config().vocab_size != d.config().vocab_size)
        fail(FASTLLM_ERR_INVALID_ARGUMENT, "the draft model's vocabulary has %d tokens, the model's %d: they must be the same",
             b.vocab_size(), a.vocab_size());
    for (int32_t id = 0; id < a.vocab_size(); id++)
        if (a.piece_bytes(id) != b.piece_bytes(id))
            fail(FASTLLM_ERR_INVALID_ARGUMENT, "the draft model's token %d differs from the model's: another tokenizer", id);
    if (d.config().context_length < session.n_ctx)
        fail(FASTLLM_ERR_INVALID_ARGUMENT, "the draft model's context length %d is shorter than the session's n_ctx %d",
             d.config().context_length, session.n_ctx);
    if (!(o.p_min >= 0.0f && o.p_min <= 1.0f)) fail(FASTLLM_ERR_INVALID_ARGUMENT, "p_min %g is not in [0, 1]", (double)o.p_min);
    return std::make_unique<DraftModel>(d, session, o.p_min);
}

// A session's speculation: its drafter, a step's drafts, and what the step's pass says of them.

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
    const int room = std::min<int>(opt_.n_ctx - (int)ctx_.tokens.size(), gen_->params.max_new_tokens - result_.n_generated_tokens);
    const int k = std::min(sp.k, room);
    if (k <= 0) return 0;
    sp.n = sp.drafter->propose(ctx_.tokens.data(), ctx_.tokens.size(), k, sp.draft.data());
    if (sp.n == 0 && sp.drafter->costly()) sp.back_off();
    if (sp.n > 0) {
        try {  // out of memory for the drafts' cache rows: no drafts, nothing else changes
            ctx_.cache.prepare((int)ctx_.tokens.size(), (int)ctx_.tokens.size() + sp.n);
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
    const size_t first = ctx_.n_evaluated;  // the drafts' positions begin here
    int kept = 0;
    sp.drafted += sp.n;
    for (int i = 0; i < sp.n; i++) {
        float *row = sp.logits.data() + (size_t)i * V;  // after the sampled token and drafts [0, i)
        std::memcpy(logits_.data(), row, V * sizeof(float));  // what the next token is drawn from if draft i fails
        GrammarMatcher *grammar = gen_->grammar.get();
        const bool ok = (!grammar || grammar->mask(model_.token_trie(), row, V, !gen_->params.ignore_eos) > 0) &&
                        gen_->sampler.accept(row, ctx_.tokens.data(), ctx_.tokens.size(), sp.draft[i]);
        if (!ok) {
            gen_->exclude = sp.draft[i];
            break;
        }
        kept++;
        const bool going = emit(sp.draft[i]);
        ctx_.n_evaluated++;  // its row is in the cache already
        if (!going) break;
    }
    if (kept == sp.n && gen_) std::memcpy(logits_.data(), sp.logits.data() + (size_t)sp.n * V, V * sizeof(float));
    sp.accepted += kept;
    sp.k = kept == sp.n ? std::min(sp.opt.n_draft, sp.k + 2) : std::max(1, sp.k - 1);
    if (kept == 0) sp.back_off();
    else sp.misses = 0;
    if (ctx_.n_evaluated < first + (size_t)sp.n) ctx_.cache.release_from((int)ctx_.n_evaluated);
    sp.n = 0;
}

}  // namespace fastllm
