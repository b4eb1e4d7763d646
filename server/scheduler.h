// Continuous batching. One scheduler thread owns every session (the C API lets one thread at a
// time use a session); HTTP threads hand it Jobs and read their text back through the Job.
//
// Loop: admit waiting jobs into free sessions (a prefix reused, then
// fastllm_session_begin_generation_deferred queues the rest of the prompt), drop cancelled ones
// (fastllm_session_cancel_generation), then one fastllm_generate_step_ex over ALL active sessions:
// one new token each, and up to prefill_chunk tokens of the new jobs' prompts (the oldest job's
// first), in the same passes over the weights. Jobs join and leave between steps.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "engine.h"
#include "fastllm.h"
#include "metrics.h"
#include "request.h"

namespace fastllm_server {

enum class FinishReason {
    Stop,       // end-of-sequence token or a stop string
    Length,     // max_tokens or the context is full
    Cancelled,  // the client went away
    Shutdown,   // the server is stopping
    Error,      // see JobResult::error
};

const char *finish_reason_name(FinishReason r);  // "stop" / "length" for the OpenAI field

// Where a request's time went, in milliseconds from its arrival (-1: not reached).
struct JobTimings {
    double queued_ms = -1;       // arrival -> a session took it
    double prompt_ms = -1;       // evaluating the prompt
    double first_token_ms = -1;  // arrival -> its first generated token (time to first token)
    double total_ms = -1;        // arrival -> the end
};

struct JobResult {
    FinishReason reason = FinishReason::Stop;
    int32_t n_prompt_tokens = 0;
    int32_t n_cached_tokens = 0;  // of the prompt: a prefix found in a session, not evaluated again
    int32_t n_generated_tokens = 0;
    JobTimings timings;
    ApiError error;  // when reason == Error
};

// One generation request as the scheduler sees it: its input, and a thread-safe channel through
// which the scheduler streams text to the HTTP thread that waits for it.
class Job {
public:
    using clock = std::chrono::steady_clock;

    // constraint: for params.grammar and its triggers; the job keeps it, as it keeps the stops.
    Job(std::vector<int32_t> prompt, const fastllm_sampling_params &params, std::vector<std::string> stops,
        Constraint constraint = {});

    // HTTP side. Waits until there is text or the job has ended (or until timeout); moves the new
    // text into text. Returns true once the job has ended and all its text has been taken.
    bool wait(std::string &text, std::chrono::milliseconds timeout);
    JobResult result() const;  // final once wait() returned true
    bool cancelled() const { return cancelled_.load(); }

    // Scheduler side.
    void push_text(const char *text, size_t len);
    void finish(JobResult result);

    const std::vector<int32_t> &prompt() const { return prompt_; }
    const fastllm_sampling_params &params() const { return params_; }
    // Speculative decoding for this job (without a call: none).
    void set_speculative(const fastllm_speculative_params &p) { speculative_ = p, has_speculative_ = true; }
    // LoRA adapters for this job (without a call: the base model).
    void set_adapters(AdapterSet adapters) { adapters_ = std::move(adapters); }
    clock::time_point arrived() const { return arrived_; }

private:
    friend class Scheduler;
    std::vector<int32_t> prompt_;
    std::vector<std::string> stops_;
    std::vector<const char *> stop_ptrs_;  // into stops_, for params_.stop
    Constraint constraint_;                // params_.grammar and grammar_triggers point here
    std::vector<const char *> trigger_ptrs_;
    fastllm_sampling_params params_;
    fastllm_speculative_params speculative_{};
    bool has_speculative_ = false;
    AdapterSet adapters_;
    clock::time_point arrived_;
    std::atomic<bool> cancelled_{false};

    mutable std::mutex mu_;
    std::condition_variable cv_;
    std::string pending_;  // text not yet taken by wait()
    bool finished_ = false;
    JobResult result_;
};

struct SchedulerOptions {
    int max_sessions = 4;
    int max_queue = 64;
    int n_ctx = 0;  // 0: the library's default, min(4096, the model's context length)
    // Prompt tokens a step evaluates beside the running jobs' next tokens, so that a new long
    // prompt delays them by at most one such chunk a step; 0: each prompt whole, on admission.
    int prefill_chunk = 256;
};

class Scheduler {
public:
    Scheduler(const fastllm_model *model, SchedulerOptions options, Metrics &metrics);
    ~Scheduler();  // shuts down, then frees the sessions

    // Creates the sessions and starts the thread; false and a message on failure.
    bool start(std::string &error);

    enum class Admission { Accepted, QueueFull, ShuttingDown };
    Admission submit(const std::shared_ptr<Job> &job);
    // Asks for the job's end (client gone); its session is freed before the next step.
    void cancel(const std::shared_ptr<Job> &job);
    // Ends every waiting and active job (FinishReason::Shutdown) and stops the thread. Idempotent.
    void shutdown();

    int n_ctx() const { return n_ctx_; }
    int max_sessions() const { return options_.max_sessions; }
    int max_queue() const { return options_.max_queue; }
    size_t queue_depth() const;  // requests waiting beyond the free sessions
    size_t active() const;       // sessions with a job

private:
    struct Slot {
        fastllm_session *session = nullptr;
        AdapterSet adapters;  // the session's: its KV was computed with them
        std::shared_ptr<Job> job;
        int32_t n_generated = 0;  // as of the last step, for the token counters
        int32_t n_prompt = 0, n_cached = 0;  // of the job: its prompt, and the part reused
        JobTimings timings;       // of the job so far
    };

    void run();
    Slot *pick_slot(const Job &job);  // a free one: the caller has counted it in busy_
    size_t held(const Slot &slot, const Job &job, const std::vector<int32_t> &tokens) const;
    void begin(Slot &slot);
    // Sets up slot.session to hold the longest prefix of the job's prompt that any slot's session
    // holds under the job's adapters, and to apply them; returns its length (the tokens not to
    // evaluate again), or -1 and error when the adapters cannot be set.
    int64_t reuse_prefix(Slot &slot, const Job &job, ApiError &error);
    void end(Slot &slot, JobResult result);
    void end_with_library_result(Slot &slot);
    void step();

    const fastllm_model *model_;
    SchedulerOptions options_;
    Metrics &metrics_;
    int n_ctx_ = 0;

    std::vector<Slot> slots_;  // owned by the scheduler thread, except busy_ below

    mutable std::mutex mu_;
    std::condition_variable cv_;
    std::deque<std::shared_ptr<Job>> queue_;
    size_t busy_ = 0;  // slots holding a job
    bool stopping_ = false;
    bool wake_ = false;  // a cancellation or a submission arrived
    std::thread thread_;
};

}  // namespace fastllm_server
