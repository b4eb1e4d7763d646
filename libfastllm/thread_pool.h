// thread_pool.h — the threads a session computes with. Created once with the session (no thread
// is started per token); the calling thread does a share of every job itself. Idle workers spin
// for a few microseconds (jobs within one token follow each other closely), then sleep on a
// condition variable, so a pool never burns a core that another program needs.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

namespace fastllm {

class ThreadPool {
public:
    explicit ThreadPool(int n_threads);
    ~ThreadPool();
    ThreadPool(const ThreadPool &) = delete;
    ThreadPool &operator=(const ThreadPool &) = delete;

    int n_threads() const { return (int)workers_.size() + 1; }

    // Splits [0, n) into one contiguous slice per thread and calls fn(begin, end, thread_index)
    // for each (thread 0 is the caller); returns when every slice is done.
    template <typename F>
    void parallel_for(int64_t n, F &&fn) {
        run(n, [](void *ctx, int64_t b, int64_t e, int t) { (*static_cast<F *>(ctx))(b, e, t); }, &fn);
    }

private:
    using Call = void (*)(void *ctx, int64_t begin, int64_t end, int thread);
    void run(int64_t n, Call call, void *ctx);
    void work(int thread);
    void slice(int thread) const;

    std::vector<std::thread> workers_;
    // The current job, published by bumping generation_.
    Call call_ = nullptr;
    void *ctx_ = nullptr;
    int64_t n_ = 0;
    std::atomic<uint64_t> generation_{0};
    std::atomic<int> remaining_{0};  // workers still busy with the current job
    std::atomic<int> sleepers_{0};
    std::atomic<bool> stop_{false};
    std::mutex mutex_;
    std::condition_variable wake_;
};

}  // namespace fastllm
