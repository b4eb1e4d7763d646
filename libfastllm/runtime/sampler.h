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
    int32_t sample(float *logits, const int32_t *history, size_t n_history);
    // The random state, for saving a generation in progress.
    uint64_t rng_state() const { return state_; }
    void set_rng_state(uint64_t s) { state_ = s; }

private:
    float uniform();  // [0, 1)

    SamplingOptions p_;
    int vocab_size_;
    uint64_t state_;
    std::vector<std::pair<float, int32_t>> candidates_;  // sized once, reused every token
    std::vector<int32_t> seen_;                         // distinct recent tokens, reused
};

}  // namespace fastllm
