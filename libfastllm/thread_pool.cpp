#include "thread_pool.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define FASTLLM_PAUSE() _mm_pause()
#else
#define FASTLLM_PAUSE() std::this_thread::yield()
#endif

namespace fastllm {

namespace {
constexpr int kSpinsBeforeSleep = 4000;  // roughly tens of microseconds of pause instructions
}

ThreadPool::ThreadPool(int n_threads) {
    for (int t = 1; t < n_threads; t++) workers_.emplace_back([this, t] { work(t); });
}

ThreadPool::~ThreadPool() {
    {
        std::lock_guard<std::mutex> lock(mutex_);
        stop_.store(true);
        generation_.fetch_add(1);
    }
    wake_.notify_all();
    for (auto &w : workers_) w.join();
}

void ThreadPool::slice(int thread) const {
    const int64_t nt = n_threads();
    const int64_t begin = n_ * thread / nt, end = n_ * (thread + 1) / nt;
    if (begin < end) call_(ctx_, begin, end, thread);
}

void ThreadPool::run(int64_t n, Call call, void *ctx) {
    if (workers_.empty() || n <= 1) {
        if (n > 0) call(ctx, 0, n, 0);
        return;
    }
    call_ = call, ctx_ = ctx, n_ = n;
    remaining_.store((int)workers_.size(), std::memory_order_relaxed);
    generation_.fetch_add(1);  // publishes the job (seq_cst: ordered before reading sleepers_)
    if (sleepers_.load() > 0) {
        std::lock_guard<std::mutex> lock(mutex_);
        wake_.notify_all();
    }
    slice(0);
    for (int spins = 0; remaining_.load(std::memory_order_acquire) != 0; spins++) {
        if (spins < kSpinsBeforeSleep) FASTLLM_PAUSE();
        else std::this_thread::yield();  // a worker was descheduled: give the core back
    }
}

void ThreadPool::work(int thread) {
    uint64_t seen = 0;
    for (;;) {
        int spins = 0;
        while (generation_.load(std::memory_order_acquire) == seen) {
            if (++spins < kSpinsBeforeSleep) {
                FASTLLM_PAUSE();
                continue;
            }
            std::unique_lock<std::mutex> lock(mutex_);
            sleepers_.fetch_add(1);
            wake_.wait(lock, [&] { return generation_.load() != seen; });
            sleepers_.fetch_sub(1);
        }
        seen = generation_.load(std::memory_order_acquire);
        if (stop_.load()) return;
        slice(thread);
        remaining_.fetch_sub(1, std::memory_order_acq_rel);
    }
}

}  // namespace fastllm
