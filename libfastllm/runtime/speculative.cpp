#include "runtime/speculative.h"

#include <algorithm>
#include <cmath>

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

}  // namespace fastllm
