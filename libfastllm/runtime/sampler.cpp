#include "runtime/sampler.h"

#include <algorithm>
#include <cmath>

namespace fastllm {

Sampler::Sampler(const SamplingOptions &params, int vocab_size)
    : p_(params), vocab_size_(vocab_size), state_(params.seed ^ 0x9E3779B97F4A7C15ull) {
    candidates_.reserve((size_t)vocab_size);
}

float Sampler::uniform() {  // splitmix64: tiny, fast and well distributed
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return (float)((z >> 40) * (1.0 / 16777216.0));
}

size_t Sampler::distribution(float *logits, const int32_t *history, size_t n_history, int32_t &argmax) {
    if (p_.repetition_penalty > 0 && p_.repetition_penalty != 1.0f) {
        size_t from = (p_.repeat_last_n > 0 && n_history > (size_t)p_.repeat_last_n) ? n_history - p_.repeat_last_n : 0;
        // Each distinct token is penalised once, as in HF's RepetitionPenaltyLogitsProcessor.
        seen_.assign(history + from, history + n_history);
        std::sort(seen_.begin(), seen_.end());
        seen_.erase(std::unique(seen_.begin(), seen_.end()), seen_.end());
        for (int32_t id : seen_) {
            if (id < 0 || id >= vocab_size_) continue;
            float &l = logits[id];
            l = l > 0 ? l / p_.repetition_penalty : l * p_.repetition_penalty;
        }
    }
    argmax = (int32_t)(std::max_element(logits, logits + vocab_size_) - logits);
    if (p_.temperature <= 0) return 0;

    candidates_.clear();
    float mx = -INFINITY;
    for (int i = 0; i < vocab_size_; i++)  // a token masked out by a grammar (-inf) is no candidate
        if (logits[i] != -INFINITY) {
            candidates_.emplace_back(logits[i] / p_.temperature, i);
            mx = std::max(mx, candidates_.back().first);
        }
    if (candidates_.empty()) return 0;
    // The truncations keep the most likely tokens, ties to the lower id: top-k selects its k in no
    // order, min-p is a threshold, and only top-p needs an order, as far as its mass reaches. A full
    // sort of the vocabulary for every token took 11 ms of Qwen2.5-0.5B's 26 (152k entries; the
    // OpenAI API's default, temperature 1 and no top-k).
    auto most_likely = [](const std::pair<float, int32_t> &a, const std::pair<float, int32_t> &b) {
        return a.first != b.first ? a.first > b.first : a.second < b.second;
    };
    const auto first = candidates_.begin();
    size_t n = candidates_.size();
    size_t sorted = 0;  // candidates_[0, sorted) are the most likely, in order
    if (p_.top_k > 0 && (size_t)p_.top_k < n) {
        n = (size_t)p_.top_k;
        if (n <= 256) {  // a heap of k: one comparison for most of the vocabulary
            std::partial_sort(first, first + (ptrdiff_t)n, candidates_.end(), most_likely);
            sorted = n;
        } else {
            std::nth_element(first, first + (ptrdiff_t)n, candidates_.end(), most_likely);
        }
    }
    // Weights exp(x - max): the probabilities over the top-k survivors times their sum.
    double total = 0;
    for (size_t i = 0; i < n; i++) total += (candidates_[i].first = std::exp(candidates_[i].first - mx));
    if (p_.min_p > 0) {  // p >= min_p * p_max, p_max's weight being 1; the kept ones in their order
        size_t kept = 0;
        for (size_t i = 0; i < n; i++)
            if (candidates_[i].first >= p_.min_p) candidates_[kept++] = candidates_[i];
        n = kept, sorted = std::min(sorted, n);
    }
    if (p_.top_p > 0 && p_.top_p < 1) {  // the smallest prefix, most likely first, whose mass reaches top_p
        const double target = p_.top_p * total;
        double cum = 0;
        size_t i = 0;
        while (i < n) {
            if (i == sorted) {
                // The next most likely: 8 times as many as so far (64 at first), or more where the
                // mass still missing needs more at the weight of the last one sorted (1 at first: a
                // flat distribution, a random model's, is sorted at once); the rest once past a quarter.
                const double bound = sorted ? candidates_[sorted - 1].first : 1.0;
                const double need = (double)sorted + (target - cum) / std::max(bound, 1e-30);
                size_t upto = std::max(sorted ? sorted * 8 : 64, need < (double)n ? (size_t)need : n);
                upto = upto > n / 4 ? n : upto;
                if (upto < n) std::nth_element(first + (ptrdiff_t)sorted, first + (ptrdiff_t)upto, first + (ptrdiff_t)n, most_likely);
                std::sort(first + (ptrdiff_t)sorted, first + (ptrdiff_t)upto, most_likely);
                sorted = upto;
            }
            cum += candidates_[i++].first;
            if (cum >= target) break;
        }
        n = i;
    }
    return n;
}

int32_t Sampler::sample(float *logits, const int32_t *history, size_t n_history, int32_t exclude) {
    int32_t argmax;
    const size_t n = distribution(logits, history, n_history, argmax);
    double total = 0;
    for (size_t i = 0; i < n; i++)
        if (candidates_[i].second != exclude) total += candidates_[i].first;
    if (total <= 0) return argmax;  // greedy, or nothing left to draw from
    double r = uniform() * total, cum = 0;
    int32_t last = argmax;
    for (size_t i = 0; i < n; i++) {
        if (candidates_[i].second == exclude) continue;
        cum += candidates_[i].first;
        last = candidates_[i].second;
        if (r < cum) return last;
    }
    return last;
}

bool Sampler::accept(float *logits, const int32_t *history, size_t n_history, int32_t token) {
    int32_t argmax;
    const size_t n = distribution(logits, history, n_history, argmax);
    double total = 0, p = 0;
    for (size_t i = 0; i < n; i++) {
        total += candidates_[i].first;
        if (candidates_[i].second == token) p = candidates_[i].first;
    }
    if (total <= 0) return token == argmax;
    return uniform() < p / total;
}

}  // namespace fastllm
