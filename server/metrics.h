// Server metrics, rendered in the Prometheus text exposition format for GET /metrics.
// Counters are updated from the HTTP threads (requests) and the scheduler thread (tokens, steps);
// the gauges that describe the scheduler's state are passed in when rendering.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <utility>

namespace fastllm_server {

class Metrics {
public:
    Metrics();

    void count_request(const std::string &endpoint, int status);
    void add_prompt_tokens(int64_t n);
    void add_drafts(int64_t drafted, int64_t accepted);  // speculative decoding
    void add_generated_tokens(int64_t n);  // also feeds the recent tokens/s gauge
    void count_step(size_t batch_size);    // one step giving batch_size sessions a token (not counting prompt chunks)
    void observe_time_to_first_token(double seconds);
    void observe_request_duration(double seconds);

    struct Gauges {
        size_t queue_depth = 0;
        size_t active_sessions = 0;
        size_t max_sessions = 0;
        size_t max_queue = 0;
    };
    std::string render(const Gauges &g) const;

    // Generated tokens per second over the last window (up to 10 s).
    double tokens_per_second() const;

private:
    using clock = std::chrono::steady_clock;
    double tokens_per_second_locked(clock::time_point now) const;

    mutable std::mutex mu_;
    clock::time_point start_;
    std::map<std::pair<std::string, int>, uint64_t> requests_;
    uint64_t prompt_tokens_ = 0, generated_tokens_ = 0, drafted_ = 0, draft_accepted_ = 0;
    uint64_t steps_ = 0, step_sessions_ = 0;
    double ttft_sum_ = 0, request_sum_ = 0;
    uint64_t ttft_count_ = 0, request_count_ = 0;
    mutable std::deque<std::pair<clock::time_point, int64_t>> recent_;  // generated tokens with their time
};

}  // namespace fastllm_server
