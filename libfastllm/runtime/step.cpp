// step.cpp — sessions advancing together: Session::step samples each one's next token (with its
// speculative drafts, speculative.cpp) or takes a chunk of its deferred prompt, evaluates all their
// rows in shared passes over the weights (pass.h), then verifies the drafts.
#include <algorithm>
#include <memory>
#include <mutex>

#include "base/error.h"
#include "runtime/pass.h"
#include "runtime/session.h"

namespace fastllm {

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
    int budget = prompt_budget(sessions, n, max_prompt_tokens, c.max_batch());
    for (size_t i = 0; i < n; i++) sessions[i]->plan_step(budget);
    // Run: each session's rows (a sampled token and its drafts, or a chunk of its prompt) in shared
    // passes over the weights.
    Pass pass(decoder, c, c.max_batch());
    for (size_t i = 0; i < n; i++) done[i] = sessions[i]->add_step_rows(pass) ? 0 : 1;
    pass.flush();
    // Commit: what the passes computed.
    for (size_t i = 0; i < n; i++)
        if (!done[i]) done[i] = sessions[i]->commit_step() ? 0 : 1;
}

void Session::plan_step(int &budget) {
    if (gen_->prefill) {
        gen_->chunk = (int)std::min<size_t>((size_t)budget, ctx_.tokens.size() - ctx_.n_evaluated);
        budget -= gen_->chunk;
        ctx_.cache.prepare((int)ctx_.n_evaluated, (int)ctx_.n_evaluated + gen_->chunk);
        return;
    }
    const int pos = (int)ctx_.tokens.size();
    if (pos < opt_.n_ctx) ctx_.cache.prepare(pos, pos + 1);
}

bool Session::add_step_rows(Pass &pass) {
    if (gen_->prefill) {  // a chunk of the prompt; the logits of its last token only
        if (cancel_.load()) {
            cancel_generation();
            return false;
        }
        for (int t = 0; t < gen_->chunk; t++) {
            const size_t p = ctx_.n_evaluated + t;
            pass.add(ctx_.cache, (int)p, ctx_.tokens[p], p + 1 == ctx_.tokens.size() ? logits_.data() : nullptr, nullptr,
                     0, ctx_.lora.get());
        }
        ctx_.n_evaluated += gen_->chunk;
        return true;
    }
    if (!sample_next()) return false;
    ctx_.cache.prepare((int)ctx_.n_evaluated, (int)ctx_.n_evaluated + 1);  // a shift may have moved it
    // The sampled token, then its drafts (speculative decoding), each row with its own logits.
    const int n_draft = draft();
    const size_t V = (size_t)model_.config().vocab_size;
    for (int r = 0; r <= n_draft; r++) {
        float *logits = n_draft ? spec_->logits.data() + (size_t)r * V : logits_.data();
        pass.add(ctx_.cache, (int)ctx_.n_evaluated + r, r == 0 ? ctx_.tokens.back() : spec_->draft[r - 1], logits,
                 nullptr, 0, ctx_.lora.get());
    }
    ctx_.n_evaluated++;
    return true;
}

bool Session::commit_step() {
    if (gen_->prefill) {
        if (ctx_.n_evaluated == ctx_.tokens.size()) {
            prompt_evaluated();
            if (!sampling_starts()) return false;
        }
    } else if (spec_ && spec_->n) {
        verify();
        if (!gen_) return false;  // it ended inside the drafts
    }
    ctx_.cache.forget((int)ctx_.n_evaluated);
    return true;
}

}  // namespace fastllm
