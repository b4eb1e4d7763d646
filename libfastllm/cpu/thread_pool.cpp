#include "cpu/thread_pool.h"

#include <algorithm>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define FASTLLM_PAUSE() _mm_pause()
#elif defined(__aarch64__)
// The spin-wait hint rather than a system call; close to a no-op on most cores, so the spins before
// sleeping are shorter than on x86 (not measured on ARM hardware).
#define FASTLLM_PAUSE() __asm__ volatile("yield")
#else
#define FASTLLM_PAUSE() std::this_thread::yield()
#endif

namespace fastllm {

namespace {
constexpr int kSpinsBeforeSleep = 4000;  // roughly tens of microseconds of pause instructions
constexpr int kIndexBits = 40;
constexpr uint64_t kIndexMask = (uint64_t(1) << kIndexBits) - 1;
// Small enough to even out, large enough to keep rows together. SmolLM2-135M q4m decoding, whose
// products are a few microseconds each (AMD EPYC Zen 3, 2 threads, 3 alternating runs of 20 x 64
// tokens): 4 chunks a thread 0.96x, 8 0.76-0.95x, 1 1.00x.
constexpr int kChunksPerThread = 2;
}  // namespace

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

void ThreadPool::claim(uint64_t job, int thread) {
    const int64_t n = n_.load(std::memory_order_relaxed), chunk = chunk_.load(std::memory_order_relaxed);
    uint64_t c = claim_.load();
    for (;;) {  // n and chunk may belong to a newer job: then the job number below no longer matches
        const uint64_t index = c & kIndexMask;
        if ((c >> kIndexBits) != job || index >= (uint64_t)n) return;
        if (!claim_.compare_exchange_weak(c, c + (uint64_t)chunk)) continue;  // c now holds the fresh value
        call_(ctx_, (int64_t)index, std::min(n, (int64_t)index + chunk), thread);
        c = claim_.load();
    }
}

void ThreadPool::run(int64_t n, Call call, void *ctx, int64_t chunk) {
    if (workers_.empty() || n <= 1) {
        if (n > 0) call(ctx, 0, n, 0);
        return;
    }
    const uint64_t job = ((claim_.load() >> kIndexBits) + 1) & (~uint64_t(0) >> kIndexBits);
    call_ = call, ctx_ = ctx;
    n_.store(n, std::memory_order_relaxed);
    chunk_.store(chunk > 0 ? chunk : std::max<int64_t>(1, n / (n_threads() * kChunksPerThread)), std::memory_order_relaxed);
    claim_.store(job << kIndexBits);  // publishes the job (seq_cst, like everything below)
    generation_.fetch_add(1);
    if (sleepers_.load() > 0) {
        std::lock_guard<std::mutex> lock(mutex_);
        wake_.notify_all();
    }
    claim(job, 0);
    // Every index is taken; close the job so that no late worker looks at it again, then wait for
    // the workers still computing their chunks.
    claim_.store((job << kIndexBits) | kIndexMask);
    for (int spins = 0; active_.load() != 0; spins++) {
        if (spins < kSpinsBeforeSleep) FASTLLM_PAUSE();
        else std::this_thread::yield();  // a worker was descheduled mid-chunk: give the core back
    }
}

void ThreadPool::work(int thread) {
    uint64_t seen = 0;
    for (;;) {
        int spins = 0;
        while (generation_.load() == seen) {
            if (++spins < kSpinsBeforeSleep) {
                FASTLLM_PAUSE();
                continue;
            }
            std::unique_lock<std::mutex> lock(mutex_);
            sleepers_.fetch_add(1);
            wake_.wait(lock, [&] { return generation_.load() != seen; });
            sleepers_.fetch_sub(1);
        }
        seen = generation_.load();
        if (stop_.load()) return;
        // Registered before the first claim: the caller cannot return while this thread may run a chunk.
        active_.fetch_add(1);
        claim(claim_.load() >> kIndexBits, thread);
        active_.fetch_sub(1);
    }
}

}  // namespace fastllm
