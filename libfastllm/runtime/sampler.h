// sampler.h — picks the next token from logits: repetition penalty, then greedy or
// temperature / top-k / top-p / min-p sampling with a seeded RNG (same seed, same choices).
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "runtime/options.h"

namespace fastllm {

class Sampler {
public:
    Sampler(const SamplingOptions &params, int vocab_size);

    // logits (vocab_size floats) are modified in place. history: the context so far, oldest first.
    // exclude: a token drawn from the others only (a rejected draft's residual; ignored by greedy,
    // whose pick a rejected draft never is).
    int32_t sample(float *logits, const int32_t *history, size_t n_history, int32_t exclude = -1);
    // Speculative decoding's check of a drafted token: true with the probability sample() would
    // draw it (greedy: when it is the argmax). A rejection followed by sample(..., exclude = token)
    // on the same logits draws from exactly the distribution sample() alone would.
    bool accept(float *logits, const int32_t *history, size_t n_history, int32_t token);
    // The random state, for saving a generation in progress.
    uint64_t rng_state() const { return state_; }
    void set_rng_state(uint64_t s) { state_ = s; }

private:
    float uniform();  // [0, 1)
    // The penalty and truncations: the survivors, with their weights (probabilities over the top-k
    // survivors times their sum; not renormalised after top-p / min-p), are candidates_[0, returned
    // count), most likely first where top-p applied, else in no order; greedy returns 0. argmax: of
    // the penalised logits.
    size_t distribution(float *logits, const int32_t *history, size_t n_history, int32_t &argmax);

    SamplingOptions p_;
    int vocab_size_;
    uint64_t state_;
    std::vector<std::pair<float, int32_t>> candidates_;  // sized once, reused every token
    std::vector<int32_t> seen_;                         // distinct recent tokens, reused
};

}  // namespace fastllm
