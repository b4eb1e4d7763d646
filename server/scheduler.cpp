#include "scheduler.h"

#include <algorithm>

#include "engine.h"

namespace fastllm_server {

const char *finish_reason_name(FinishReason r) {
    switch (r) {
    case FinishReason::Stop: return "stop";
    case FinishReason::Length: return "length";
    case FinishReason::Cancelled: return "cancelled";
    case FinishReason::Shutdown: return "shutdown";
    case FinishReason::Error: return "error";
    }
    return "error";
}

// ---------------------------------------------------------------------------------------------
// Job

Job::Job(std::vector<int32_t> prompt, const fastllm_sampling_params &params, std::vector<std::string> stops,
         Constraint constraint)
    : prompt_(std::move(prompt)), stops_(std::move(stops)), constraint_(std::move(constraint)), params_(params),
      arrived_(clock::now()) {
    for (const auto &s : stops_) stop_ptrs_.push_back(s.c_str());
    params_.stop = stop_ptrs_.empty() ? nullptr : stop_ptrs_.data();
    params_.n_stop = (int32_t)stop_ptrs_.size();
    params_.grammar = constraint_.grammar.empty() ? nullptr : constraint_.grammar.c_str();
    for (const auto &t : constraint_.triggers) trigger_ptrs_.push_back(t.c_str());
    params_.grammar_triggers = trigger_ptrs_.empty() ? nullptr : trigger_ptrs_.data();
    params_.n_grammar_triggers = (int32_t)trigger_ptrs_.size();
    params_.json_schema = nullptr;  // a schema comes converted, as grammar
}

bool Job::wait(std::string &text, std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, timeout, [&] { return !pending_.empty() || finished_; });
    text += pending_;
    pending_.clear();
    return finished_;
}

JobResult Job::result() const {
    std::lock_guard<std::mutex> lock(mu_);
    return result_;
}

void Job::push_text(const char *text, size_t len) {
    if (len == 0) return;
    {
        std::lock_guard<std::mutex> lock(mu_);
        pending_.append(text, len);
    }
    cv_.notify_all();
}

void Job::finish(JobResult result) {
    {
        std::lock_guard<std::mutex> lock(mu_);
        result_ = std::move(result);
        finished_ = true;
    }
    cv_.notify_all();
}

// ---------------------------------------------------------------------------------------------
// Scheduler

namespace {

int on_text(const char *text, size_t len, void *user_data) {
    static_cast<Job *>(user_data)->push_text(text, len);
    return 0;
}

JobResult simple_result(FinishReason reason) {
    JobResult r;
    r.reason = reason;
    return r;
}

}  // namespace

Scheduler::Scheduler(const fastllm_model *model, SchedulerOptions options, Metrics &metrics)
    : model_(model), options_(options), metrics_(metrics) {}

Scheduler::~Scheduler() {
    shutdown();
    for (auto &slot : slots_) fastllm_session_free(slot.session);
}

bool Scheduler::start(std::string &error) {
    fastllm_session_params p = fastllm_session_default_params();
    p.n_ctx = options_.n_ctx;
    for (int i = 0; i < options_.max_sessions; i++) {
        Slot slot;
        if (fastllm_session_create(model_, &p, &slot.session) != FASTLLM_OK) {
            error = "cannot create session " + std::to_string(i + 1) + " of " + std::to_string(options_.max_sessions) +
                    ": " + fastllm_last_error();
            return false;
        }
        slots_.push_back(slot);
    }
    n_ctx_ = slots_.empty() ? 0 : fastllm_session_n_ctx(slots_[0].session);
    thread_ = std::thread([this] { run(); });
    return true;
}

Scheduler::Admission Scheduler::submit(const std::shared_ptr<Job> &job) {
    {
        std::lock_guard<std::mutex> lock(mu_);
        if (stopping_ || !thread_.joinable()) return Admission::ShuttingDown;
        // Jobs in the queue up to the number of free sessions are about to start; the rest wait.
        size_t free = slots_.size() - busy_;
        if (queue_.size() >= free + (size_t)options_.max_queue) return Admission::QueueFull;
        queue_.push_back(job);
        wake_ = true;
    }
    cv_.notify_one();
    return Admission::Accepted;
}

void Scheduler::cancel(const std::shared_ptr<Job> &job) {
    job->cancelled_ = true;
    {
        std::lock_guard<std::mutex> lock(mu_);
        wake_ = true;
    }
    cv_.notify_one();
}

void Scheduler::shutdown() {
    {
        std::lock_guard<std::mutex> lock(mu_);
        stopping_ = true;
    }
    cv_.notify_one();
    if (thread_.joinable()) thread_.join();
    // Nothing runs any more: whatever is still queued (only if the thread never ran) ends here.
    std::lock_guard<std::mutex> lock(mu_);
    for (auto &job : queue_) job->finish(simple_result(FinishReason::Shutdown));
    queue_.clear();
}

size_t Scheduler::queue_depth() const {
    std::lock_guard<std::mutex> lock(mu_);
    size_t free = slots_.size() - busy_;
    return queue_.size() > free ? queue_.size() - free : 0;
}

size_t Scheduler::active() const {
    std::lock_guard<std::mutex> lock(mu_);
    return busy_;
}

namespace {
std::vector<int32_t> tokens_of(const fastllm_session *s) {
    std::vector<int32_t> ids((size_t)std::max(0, fastllm_session_n_tokens(s)));
    size_t n = 0;
    if (fastllm_session_get_tokens(s, ids.data(), ids.size(), &n) != FASTLLM_OK) return {};
    ids.resize(n);
    return ids;
}

size_t common_prefix(const std::vector<int32_t> &a, const std::vector<int32_t> &b) {
    size_t n = 0;
    while (n < a.size() && n < b.size() && a[n] == b[n]) n++;
    return n;
}

// A fork pays for copying one KV block (32 positions); a shorter gain is not worth it.
constexpr size_t kMinForkGain = 32;
}  // namespace

void Scheduler::run() {
    for (;;) {
        std::vector<std::shared_ptr<Job>> dropped;
        std::vector<std::shared_ptr<Job>> admitted;
        {
            std::unique_lock<std::mutex> lock(mu_);
            cv_.wait(lock, [&] { return stopping_ || wake_ || busy_ > 0 || !queue_.empty(); });
            wake_ = false;
            if (stopping_) break;
            for (auto it = queue_.begin(); it != queue_.end();) {
                if ((*it)->cancelled()) {
                    dropped.push_back(*it);
                    it = queue_.erase(it);
                } else {
                    ++it;
                }
            }
            // As many as there are free slots; which slot takes which is chosen outside the lock
            // (reading the sessions' tokens), where only this thread touches the slots.
            while (!queue_.empty() && busy_ + admitted.size() < slots_.size()) {
                admitted.push_back(queue_.front());
                queue_.pop_front();
            }
            busy_ += admitted.size();
        }
        for (auto &job : dropped) job->finish(simple_result(FinishReason::Cancelled));
        for (auto &job : admitted) {
            Slot *slot = pick_slot(*job);
            slot->job = std::move(job);
            begin(*slot);
        }
        for (auto &slot : slots_) {
            if (slot.job && slot.job->cancelled()) {
                fastllm_session_cancel_generation(slot.session);
                end(slot, simple_result(FinishReason::Cancelled));
            }
        }
        step();
    }
    // Stopping: end what runs and what waits.
    for (auto &slot : slots_) {
        if (!slot.job) continue;
        fastllm_session_cancel_generation(slot.session);
        end(slot, simple_result(FinishReason::Shutdown));
    }
    std::deque<std::shared_ptr<Job>> queued;
    {
        std::lock_guard<std::mutex> lock(mu_);
        queued.swap(queue_);
    }
    for (auto &job : queued) job->finish(simple_result(FinishReason::Shutdown));
}

namespace {
double ms_since(Job::clock::time_point t) {
    return std::chrono::duration<double, std::milli>(Job::clock::now() - t).count();
}
}  // namespace

void Scheduler::begin(Slot &slot) {
    Job &job = *slot.job;
    slot.n_generated = 0;
    slot.timings = JobTimings{};
    slot.timings.queued_ms = ms_since(job.arrived());
    if (job.cancelled()) return end(slot, simple_result(FinishReason::Cancelled));
    JobResult failed;
    failed.reason = FinishReason::Error;
    const int64_t r = reuse_prefix(slot, job, failed.error);
    if (r < 0) return end(slot, failed);
    const size_t reused = (size_t)r;
    // cached_tokens: what the session holds of it (a sliding-window model may evaluate it again)
    slot.n_prompt = (int32_t)job.prompt_.size();
    slot.n_cached = (int32_t)std::min(reused, (size_t)fastllm_session_n_cached(slot.session));
    fastllm_status s = fastllm_session_set_speculative(slot.session, job.has_speculative_ ? &job.speculative_ : nullptr);
    if (s != FASTLLM_OK) {
        JobResult r;
        r.reason = FinishReason::Error;
        r.error = library_error(s, "speculative");
        return end(slot, r);
    }
    auto begin = options_.prefill_chunk > 0 ? fastllm_session_begin_generation_deferred : fastllm_session_begin_generation;
    s = begin(slot.session, job.prompt_.data() + reused, job.prompt_.size() - reused, &job.params_, on_text, &job);
    if (s != FASTLLM_OK) {
        JobResult r;
        r.reason = FinishReason::Error;
        r.error = library_error(s, "prompt");
        return end(slot, r);
    }
    if (options_.prefill_chunk == 0) slot.timings.prompt_ms = ms_since(job.arrived()) - slot.timings.queued_ms;
    metrics_.add_prompt_tokens((int64_t)job.prompt_.size());
    if (!fastllm_session_is_generating(slot.session)) end_with_library_result(slot);
}

// What of the job's prompt the slot's session holds: its common prefix, if the session applies the
// job's adapters (KV computed under others is never reused).
size_t Scheduler::held(const Slot &slot, const Job &job, const std::vector<int32_t> &tokens) const {
    return slot.adapters == job.adapters_ ? common_prefix(tokens, job.prompt_) : 0;
}

// The free slot that holds the longest prefix of the job's prompt under its adapters; among those
// that hold none, the one holding the fewest tokens, so that what other slots hold (another
// adapter set's conversation, a long system prompt) stays for the requests that come back to it.
Scheduler::Slot *Scheduler::pick_slot(const Job &job) {
    Slot *best = nullptr;
    size_t best_held = 0, best_size = 0;
    for (auto &slot : slots_) {
        if (slot.job) continue;
        const std::vector<int32_t> tokens = tokens_of(slot.session);
        const size_t n = held(slot, job, tokens);
        if (!best || n > best_held || (n == best_held && tokens.size() < best_size))
            best = &slot, best_held = n, best_size = tokens.size();
    }
    return best;
}

// Prefix reuse, as llama.cpp's cache_prompt but across slots: the conversation a slot served
// last is usually the one that comes back (its own session, truncated to the common part); a
// system prompt many requests share lives in some session (forked: its KV blocks are shared,
// nothing is evaluated or copied). KV computed under other LoRA adapters is never reused: a prefix
// counts only in a session with the job's adapter set. Only the scheduler thread touches the
// sessions, so reading a busy one to fork it is safe.
int64_t Scheduler::reuse_prefix(Slot &slot, const Job &job, ApiError &error) {
    size_t own = held(slot, job, tokens_of(slot.session)), best = own;
    Slot *from = nullptr;
    for (auto &other : slots_) {
        if (&other == &slot) continue;
        const size_t n = held(other, job, tokens_of(other.session));
        if (n > best) best = n, from = &other;
    }
    if (from && best >= own + kMinForkGain) {
        fastllm_session *fork = nullptr;
        if (fastllm_session_fork(from->session, (int32_t)best, nullptr, &fork) == FASTLLM_OK) {
            fastllm_session_free(slot.session);
            slot.session = fork;
            slot.adapters = from->adapters;  // a fork applies its source's
            return (int64_t)best;
        }
    }
    if (fastllm_session_truncate(slot.session, (int32_t)own) != FASTLLM_OK) {
        fastllm_session_reset(slot.session);
        own = 0;
    }
    if (slot.adapters != job.adapters_) {  // own is 0 here: nothing computed under the old set stays
        std::vector<const fastllm_adapter *> adapters;
        std::vector<float> scales;
        for (const auto &[a, scale] : job.adapters_) adapters.push_back(a), scales.push_back(scale);
        slot.adapters.clear();
        const fastllm_status st = fastllm_session_set_adapters(slot.session, adapters.data(), scales.data(), adapters.size());
        if (st != FASTLLM_OK) {
            error = library_error(st, "lora");
            fastllm_session_set_adapters(slot.session, nullptr, nullptr, 0);
            return -1;
        }
        slot.adapters = job.adapters_;
    }
    return (int64_t)own;
}

void Scheduler::end(Slot &slot, JobResult result) {
    std::shared_ptr<Job> job = std::move(slot.job);
    slot.job.reset();
    result.timings = slot.timings;
    result.timings.total_ms = ms_since(job->arrived());
    metrics_.observe_request_duration(result.timings.total_ms / 1000.0);
    job->finish(std::move(result));
    {
        std::lock_guard<std::mutex> lock(mu_);
        busy_--;
    }
}

void Scheduler::end_with_library_result(Slot &slot) {
    fastllm_generation_result g{};
    fastllm_session_generation_result(slot.session, &g);
    int64_t drafted = 0, accepted = 0;
    fastllm_session_speculative_stats(slot.session, &drafted, &accepted);
    metrics_.add_drafts(drafted, accepted);
    if (slot.timings.prompt_ms < 0 && g.prompt_ms > 0) slot.timings.prompt_ms = g.prompt_ms;  // ended before a token
    JobResult r;
    r.n_prompt_tokens = slot.n_prompt;
    r.n_cached_tokens = slot.n_cached;
    r.n_generated_tokens = g.n_generated_tokens;
    switch (g.stop_reason) {
    case FASTLLM_STOP_MAX_TOKENS:
    case FASTLLM_STOP_CONTEXT_FULL: r.reason = FinishReason::Length; break;
    case FASTLLM_STOP_CANCELLED: r.reason = FinishReason::Cancelled; break;
    default: r.reason = FinishReason::Stop;  // EOS, stop string, grammar complete
    }
    end(slot, r);
}

void Scheduler::step() {
    std::vector<fastllm_session *> batch;
    std::vector<Slot *> owners;
    for (auto &slot : slots_)
        if (slot.job) owners.push_back(&slot);
    if (owners.empty()) return;
    // Oldest first: the step's prompt budget goes to the jobs waiting longest.
    std::stable_sort(owners.begin(), owners.end(),
                     [](const Slot *a, const Slot *b) { return a->job->arrived() < b->job->arrived(); });
    size_t decoding = 0;  // the others' prompts are still queued: this step gives them no token
    for (Slot *slot : owners) {
        batch.push_back(slot->session);
        decoding += fastllm_session_n_cached(slot->session) == fastllm_session_n_tokens(slot->session);
    }
    std::vector<int32_t> done(batch.size(), 0);
    fastllm_step_params sp = fastllm_step_default_params();
    if (options_.prefill_chunk > 0) sp.max_prompt_tokens = options_.prefill_chunk;
    fastllm_status s = fastllm_generate_step_ex(batch.data(), batch.size(), &sp, done.data());
    if (decoding) metrics_.count_step(decoding);
    if (s != FASTLLM_OK) {  // a bug rather than bad input: every job in the step fails
        JobResult r;
        r.reason = FinishReason::Error;
        r.error = library_error(s, "generation step");
        r.error.status = 500;
        r.error.type = "server_error";
        for (Slot *slot : owners) {
            fastllm_session_cancel_generation(slot->session);
            end(*slot, r);
        }
        return;
    }
    for (size_t i = 0; i < owners.size(); i++) {
        Slot &slot = *owners[i];
        fastllm_generation_result g{};
        fastllm_session_generation_result(slot.session, &g);
        if (g.n_generated_tokens > slot.n_generated) {
            if (slot.n_generated == 0) {
                if (slot.timings.prompt_ms < 0) slot.timings.prompt_ms = g.prompt_ms;  // a deferred prompt's
                slot.timings.first_token_ms = ms_since(slot.job->arrived());
                metrics_.observe_time_to_first_token(slot.timings.first_token_ms / 1000.0);
            }
            metrics_.add_generated_tokens(g.n_generated_tokens - slot.n_generated);
            slot.n_generated = g.n_generated_tokens;
        }
        if (done[i]) end_with_library_result(slot);
    }
}

}  // namespace fastllm_server
