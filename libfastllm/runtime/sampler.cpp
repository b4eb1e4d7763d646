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
    for (int i = 0; i < vocab_size_; i++)  // a token masked out by a grammar (-inf) is no candidate
        if (logits[i] != -INFINITY) candidates_.emplace_back(logits[i] / p_.temperature, i);
    if (candidates_.empty()) return 0;
    auto by_logit = [](const std::pair<float, int32_t> &a, const std::pair<float, int32_t> &b) {
        return a.first != b.first ? a.first > b.first : a.second < b.second;
    };
    size_t n = candidates_.size();
    if (p_.top_k > 0 && (size_t)p_.top_k < n) {
        std::partial_sort(candidates_.begin(), candidates_.begin() + p_.top_k, candidates_.end(), by_logit);
        n = (size_t)p_.top_k;
    } else {
        std::sort(candidates_.begin(), candidates_.end(), by_logit);
    }
    // Softmax over the survivors (sorted, largest first).
    float mx = candidates_[0].first;
    double sum = 0;
    for (size_t i = 0; i < n; i++) sum += (candidates_[i].first = std::exp(candidates_[i].first - mx));
    for (size_t i = 0; i < n; i++) candidates_[i].first = (float)(candidates_[i].first / sum);
    if (p_.top_p > 0 && p_.top_p < 1) {  // smallest prefix whose mass reaches top_p
        double cum = 0;
        for (size_t i = 0; i < n; i++) {
            cum += candidates_[i].first;
            if (cum >= p_.top_p) {
                n = i + 1;
                break;
            }
        }
    }
    if (p_.min_p > 0) {
        float threshold = p_.min_p * candidates_[0].first;
        size_t keep = 1;
        while (keep < n && candidates_[keep].first >= threshold) keep++;
        n = keep;
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
