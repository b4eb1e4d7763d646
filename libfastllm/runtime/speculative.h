// speculative.h — drafts for speculative decoding (docs/api.md "Speculative decoding"). Each step
// of a generation, a Drafter guesses the tokens that follow the context; the session evaluates
// them in the same pass as the step's own token and keeps those its model would have produced
// (Sampler::accept), so greedy output is identical and sampled output has the same distribution.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "arch/kv_cache.h"
#include "runtime/options.h"

namespace fastllm {

class Model;

struct SpeculativeOptions {
    const Model *draft_model = nullptr;  // nullptr: prompt lookup
    int n_draft = 5;                     // most tokens drafted a step
    int ngram_min = 1, ngram_max = 3;    // prompt lookup: the context's last n tokens matched, n from max down
    float p_min = 0.0f;                  // draft model: drafting stops at a token it gives less (0: never)
    static constexpr int kMaxDraft = kStepRows - 1;  // a step's rows: its token and the drafts
};

class Drafter {
public:
    virtual ~Drafter() = default;
    // Up to k guesses of what follows context[0, n) into out; returns how many (0: no guess).
    virtual int propose(const int32_t *context, size_t n, int k, int32_t *out) = 0;
    // Whether proposing costs passes of a model (so that a step without drafts is a miss too).
    virtual bool costly() const = 0;
};

// Validates the options (n_draft, n-gram bounds; a draft model of the same vocabulary as `target`,
// not `target` itself) and makes the drafter: the draft model's greedy continuation in a session
// of its own (n_ctx and threads of `session`), or the prompt lookup.
std::unique_ptr<Drafter> make_drafter(const Model &target, const SessionOptions &session, const SpeculativeOptions &o);

}  // namespace fastllm
