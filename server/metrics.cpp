#include "metrics.h"

#include <cstdio>
#include <sstream>

namespace fastllm_server {

namespace {

constexpr std::chrono::seconds kRateWindow{10};

std::string number(double v) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.6g", v);
    return buf;
}

void header(std::ostringstream &out, const char *name, const char *type, const char *help) {
    out << "# HELP " << name << ' ' << help << "\n# TYPE " << name << ' ' << type << '\n';
}

}  // namespace

Metrics::Metrics() : start_(clock::now()) {}

void Metrics::count_request(const std::string &endpoint, int status) {
    std::lock_guard<std::mutex> lock(mu_);
    requests_[{endpoint, status}]++;
}

void Metrics::add_prompt_tokens(int64_t n) {
    std::lock_guard<std::mutex> lock(mu_);
    prompt_tokens_ += (uint64_t)n;
}

void Metrics::add_drafts(int64_t drafted, int64_t accepted) {
    std::lock_guard<std::mutex> lock(mu_);
    drafted_ += (uint64_t)drafted;
    draft_accepted_ += (uint64_t)accepted;
}

void Metrics::add_generated_tokens(int64_t n) {
    if (n <= 0) return;
    std::lock_guard<std::mutex> lock(mu_);
    generated_tokens_ += (uint64_t)n;
    auto now = clock::now();
    if (!recent_.empty() && now - recent_.back().first < std::chrono::milliseconds(100))
        recent_.back().second += n;  // 100 ms buckets keep the window short
    else
        recent_.emplace_back(now, n);
    while (now - recent_.front().first > kRateWindow) recent_.pop_front();
}

void Metrics::count_step(size_t batch_size) {
    std::lock_guard<std::mutex> lock(mu_);
    steps_++;
    step_sessions_ += batch_size;
}

void Metrics::observe_time_to_first_token(double seconds) {
    std::lock_guard<std::mutex> lock(mu_);
    ttft_sum_ += seconds;
    ttft_count_++;
}

void Metrics::observe_request_duration(double seconds) {
    std::lock_guard<std::mutex> lock(mu_);
    request_sum_ += seconds;
    request_count_++;
}

double Metrics::tokens_per_second_locked(clock::time_point now) const {
    while (!recent_.empty() && now - recent_.front().first > kRateWindow) recent_.pop_front();
    int64_t sum = 0;
    for (const auto &r : recent_) sum += r.second;
    double window = std::chrono::duration<double>(std::min<clock::duration>(now - start_, kRateWindow)).count();
    return window > 0 ? sum / window : 0.0;
}

double Metrics::tokens_per_second() const {
    std::lock_guard<std::mutex> lock(mu_);
    return tokens_per_second_locked(clock::now());
}

std::string Metrics::render(const Gauges &g) const {
    std::lock_guard<std::mutex> lock(mu_);
    std::ostringstream out;
    header(out, "fastllm_requests_total", "counter", "HTTP requests answered, by endpoint and status code.");
    for (const auto &[key, n] : requests_)
        out << "fastllm_requests_total{endpoint=\"" << key.first << "\",status=\"" << key.second << "\"} " << n << '\n';
    header(out, "fastllm_prompt_tokens_total", "counter", "Prompt tokens evaluated for generation requests.");
    out << "fastllm_prompt_tokens_total " << prompt_tokens_ << '\n';
    header(out, "fastllm_draft_tokens_total", "counter", "Tokens drafted by speculative decoding.");
    out << "fastllm_draft_tokens_total " << drafted_ << '\n';
    header(out, "fastllm_draft_tokens_accepted_total", "counter", "Drafted tokens the model kept.");
    out << "fastllm_draft_tokens_accepted_total " << draft_accepted_ << '\n';
    header(out, "fastllm_generated_tokens_total", "counter", "Tokens generated.");
    out << "fastllm_generated_tokens_total " << generated_tokens_ << '\n';
    header(out, "fastllm_tokens_per_second", "gauge", "Generated tokens per second over the last 10 seconds.");
    out << "fastllm_tokens_per_second " << number(tokens_per_second_locked(clock::now())) << '\n';
    header(out, "fastllm_queue_depth", "gauge", "Requests waiting for a free session.");
    out << "fastllm_queue_depth " << g.queue_depth << '\n';
    header(out, "fastllm_queue_capacity", "gauge", "Most requests that may wait (--max-queue); more get 503.");
    out << "fastllm_queue_capacity " << g.max_queue << '\n';
    header(out, "fastllm_active_sessions", "gauge", "Sessions with a generation in progress.");
    out << "fastllm_active_sessions " << g.active_sessions << '\n';
    header(out, "fastllm_max_sessions", "gauge", "Sessions created at start (--max-sessions).");
    out << "fastllm_max_sessions " << g.max_sessions << '\n';
    header(out, "fastllm_decode_steps_total", "counter", "Batched decode steps (one token for every active session).");
    out << "fastllm_decode_steps_total " << steps_ << '\n';
    header(out, "fastllm_decode_step_sessions_total", "counter",
           "Sessions advanced by decode steps; divided by the steps, the mean batch size.");
    out << "fastllm_decode_step_sessions_total " << step_sessions_ << '\n';
    header(out, "fastllm_time_to_first_token_seconds", "summary", "From a request's arrival to its first generated token.");
    out << "fastllm_time_to_first_token_seconds_sum " << number(ttft_sum_) << '\n';
    out << "fastllm_time_to_first_token_seconds_count " << ttft_count_ << '\n';
    header(out, "fastllm_request_duration_seconds", "summary", "From a generation request's arrival to its end.");
    out << "fastllm_request_duration_seconds_sum " << number(request_sum_) << '\n';
    out << "fastllm_request_duration_seconds_count " << request_count_ << '\n';
    header(out, "fastllm_uptime_seconds", "gauge", "Seconds since the server started.");
    out << "fastllm_uptime_seconds " << number(std::chrono::duration<double>(clock::now() - start_).count()) << '\n';
    return out.str();
}

}  // namespace fastllm_server
