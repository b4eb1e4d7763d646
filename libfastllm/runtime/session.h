// session.h — what fastllm_session is: one context (context.h: token history + its KV cache, blocks
// allocated as the context grows, possibly shared with the session it was forked from) over a
// shared Model, the generation in progress (generation.cpp), speculative decoding, and the steps
// that advance sessions together (step.cpp). The backend and activations it computes with are the
// model's (compute.h).
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "runtime/compute.h"
#include "arch/kv_cache.h"
#include "runtime/context.h"
#include "runtime/options.h"
#include "runtime/pass.h"
#include "fastllm.h"
#include "runtime/model.h"
#include "runtime/sampler.h"
#include "runtime/speculative.h"
#include "text/grammar.h"
#include "text/text_stream.h"

namespace fastllm {

struct SessionMemory {
    size_t kv_bytes = 0, kv_shared_bytes = 0, kv_bytes_per_token = 0, kv_capacity_bytes = 0;
    size_t session_bytes = 0, compute_bytes = 0;
};

class Session {
public:
    Session(const Model &model, const SessionOptions &options);
    // A session whose context is src's first n tokens, sharing the KV blocks that hold them
    // (options give its own n_ctx, n_batch, threads and shift settings; KV types must be src's).
    Session(const Session &src, size_t n, const SessionOptions &options);

    const Model &model() const { return model_; }
    const SessionOptions &options() const { return opt_; }
    int n_ctx() const { return opt_.n_ctx; }
    int n_tokens() const { return (int)ctx_.tokens.size(); }
    int n_cached() const { return (int)ctx_.n_evaluated; }
    const std::vector<int32_t> &tokens() const { return ctx_.tokens; }
    void reset();
    void truncate(size_t n_keep);  // see fastllm_session_truncate
    SessionMemory memory() const;

    // Appends tokens and runs the model (see fastllm_session_eval). Validates before changing state.
    void eval(const int32_t *tokens, size_t n, fastllm_logits_mode mode, float *out_logits);

    // Generation, one token at a time, so that several sessions can advance together:
    // begin_generation evaluates the prompt (deferred: leaves it to the steps); step() then samples
    // one token for each session and evaluates all the new tokens in one pass over the weights.
    void begin_generation(const int32_t *prompt, size_t n_prompt, const SamplingOptions &params,
                          fastllm_stream_callback callback, void *user_data, bool deferred = false);
    bool generating() const { return gen_ != nullptr; }
    void cancel_generation();
    const GenerationResult &generation_result() const { return result_; }
    // Advances each session by one token, or, while its prompt is deferred, by a chunk of the prompt:
    // up to max_prompt_tokens of them over all sessions, in the order listed, in the same passes.
    // Sets done[i] when session i's generation ended.
    static void step(Session *const *sessions, size_t n, int32_t *done, int max_prompt_tokens);

    // begin_generation + step until done (see fastllm_session_generate).
    void generate(const int32_t *prompt, size_t n_prompt, const SamplingOptions &params,
                  fastllm_stream_callback callback, void *user_data, GenerationResult &result);

    // The grammar matcher of the generation in progress, nullptr without one. For saving a session
    // mid-generation: a new GrammarMatcher of params.grammar that accepts its accepted() bytes is
    // in the same state.
    const GrammarMatcher *grammar_matcher() const { return gen_ ? gen_->grammar.get() : nullptr; }

    // The LoRA adapters this session's passes apply from now on, each with its scale (empty: the
    // base model); see fastllm_session_set_adapters. Validates everything before changing anything.
    void set_adapters(const std::vector<std::pair<std::shared_ptr<const LoraAdapter>, float>> &adapters);
    const LoraSet *adapters() const { return ctx_.lora.get(); }

    // Speculative decoding for the generations that follow (nullptr: off); see fastllm_session_set_speculative.
    void set_speculative(const SpeculativeOptions *o);
    // Of the current or last generation: tokens drafted, and those of them kept.
    int64_t n_drafted() const { return spec_ ? spec_->drafted : 0; }
    int64_t n_accepted() const { return spec_ ? spec_->accepted : 0; }

    // From any thread: asks the evaluation or generation in progress to stop (see
    // fastllm_session_cancel). False when there is none.
    bool request_cancel();

    // The saved state (see fastllm_session_save_state): tokens, KV rows in the cache's types, and
    // a generation in progress with its sampler; load validates all of it before changing anything.
    std::vector<uint8_t> save_state() const;
    void load_state(const uint8_t *data, size_t size, fastllm_stream_callback callback, void *user_data);

private:
    struct Generation {
        SamplingOptions params;
        Sampler sampler;
        TextStream stream;
        std::unique_ptr<GrammarMatcher> grammar;  // of params.grammar, when it has one (matcher_of)
        std::chrono::steady_clock::time_point start;
        int32_t exclude = -1;  // a draft rejected at the next position: the next token is drawn from the others
        // A deferred prompt: steps evaluate ctx_.tokens[n_evaluated..] (`chunk` of them this step) before
        // sampling starts; on a cancel the context keeps tokens[..prompt_from] at least.
        bool prefill = false;
        size_t prompt_from = 0;
        int chunk = 0;
        // matcher: params.grammar's, made beforehand; nullptr: made here when there is a grammar.
        Generation(const SamplingOptions &p, int vocab, fastllm_stream_callback cb, void *user,
                   std::unique_ptr<GrammarMatcher> matcher = nullptr)
            : params(p), sampler(p, vocab), stream(p.stop, cb, user),
              grammar(matcher ? std::move(matcher) : matcher_of(p)) {}
    };
    // The matcher of p's grammar and triggers, nullptr without a grammar.
    static std::unique_ptr<GrammarMatcher> matcher_of(const SamplingOptions &p) {
        return p.grammar.empty() ? nullptr : std::make_unique<GrammarMatcher>(Grammar::parse(p.grammar), p.grammar_triggers);
    }

    // After the prompt: ends a generation that has nothing to sample (max_new_tokens 0, a grammar
    // matching only ""); returns false then.
    bool sampling_starts();
    // The deferred prompt is evaluated (or cancelled): its time is prompt_ms, generation time starts.
    void prompt_evaluated();
    // The prompt tokens a step evaluates: max_prompt_tokens, less what would only spill the
    // decode rows into one more pass.
    static int prompt_budget(Session *const *sessions, size_t n, int max_prompt_tokens, int max_batch);
    // A step's three parts for this session (step() runs each over all sessions before the next):
    // makes its rows' cache positions writable, taking a prompt chunk from the budget; adds its rows
    // to the pass (false: its generation ended); takes in what the pass computed (false: ended).
    void plan_step(int &budget);
    bool add_step_rows(Pass &pass);
    bool commit_step();
    // Samples this session's next token; returns false when its generation has ended.
    bool sample_next();
    // The sampled (or accepted) token into the context, the text stream and the grammar; false
    // when the generation ends with it.
    bool emit(int32_t token);
    // This step's drafts after the token just sampled (0 without speculation, or when backing off).
    int draft();
    // Keeps the drafts the model agrees with (their rows are in spec_->logits) and drops the rest.
    void verify();

    // Speculative decoding's state: options, drafter, the logits of a step's rows (the sampled
    // token's, then each draft's), this step's drafts, the back-off after drafts that all failed.
    struct Speculation {
        SpeculativeOptions opt;
        std::unique_ptr<Drafter> drafter;
        std::vector<float> logits;
        std::vector<int32_t> draft;
        int n = 0, misses = 0, skip = 0;
        // Tokens to draft next: 2 more after a step that kept every draft, 1 fewer after one that
        // did not (transformers' assisted generation does the same), so that a drafter that is often
        // wrong costs fewer draft passes while one that is right keeps drafting opt.n_draft.
        int k = 0;
        int64_t drafted = 0, accepted = 0;
        // After a step whose drafts all failed (or a draft model too unsure to guess), the next
        // steps draft nothing: 4, 16, 64, 128 for a draft model, whose tries cost its passes (4 tries
        // in 128 tokens rather than 7 with 2, 4, 8, ...: 0.96x -> 0.99x of the speed without drafts
        // in bench/bench_speculative.py's case "rejected"); 2, 4, ... 128 for prompt lookup, whose
        // tries cost only their rows in the step's pass. The count goes on across generations.
        void back_off() { skip = 1 << std::min(drafter->costly() ? 2 * ++misses : ++misses, 7); }
    };
    void finish_generation(fastllm_stop_reason reason);

    // Counts a call that computes with the session, so that request_cancel knows one is running.
    struct Busy {
        Session &s;
        explicit Busy(Session &s) : s(s) { s.busy_.fetch_add(1); }
        ~Busy() { s.busy_.fetch_sub(1); }
    };

    const Model &model_;
    SessionOptions opt_;  // n_ctx, n_batch, n_threads resolved
    Compute &compute_;
    Context ctx_;
    std::vector<float> logits_;  // last-token logits for generation
    std::unique_ptr<Generation> gen_;
    std::unique_ptr<Speculation> spec_;
    GenerationResult result_;
    std::atomic<int> busy_{0};
    std::atomic<bool> cancel_{false}, has_gen_{false};
};

}  // namespace fastllm
