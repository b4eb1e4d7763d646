// thread_pool.h — the threads the CPU backend computes with. Created once with the backend, one
// per model and thread count (no thread is started per token); the calling thread does a share of every job itself. Idle workers spin
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

    // Calls fn(begin, end, thread_index) over chunks that cover [0, n) exactly once (thread 0 is the
    // caller); returns when every chunk is done. Threads claim chunks as they come, so a worker that
    // is slow to wake (another program has its core) leaves its share to the others instead of
    // holding up the job. A chunk is a few items (light, even ones: rows of a product); `chunk`
    // sets it, 1 for items that are heavy and uneven.
    template <typename F>
    void parallel_for(int64_t n, F &&fn, int64_t chunk = 0) {
        run(n, [](void *ctx, int64_t b, int64_t e, int t) { (*static_cast<F *>(ctx))(b, e, t); }, &fn, chunk);
    }

private:
    using Call = void (*)(void *ctx, int64_t begin, int64_t end, int thread);
    void run(int64_t n, Call call, void *ctx, int64_t chunk);
    void work(int thread);
    void claim(uint64_t job, int thread);

    std::vector<std::thread> workers_;
    // The current job. claim_ packs (job number << kIndexBits) | next unclaimed index; a claim is a
    // compare-and-swap that also checks the job number, so a late worker can never take an index
    // of another job.
    Call call_ = nullptr;
    void *ctx_ = nullptr;
    std::atomic<int64_t> n_{0}, chunk_{1};  // read by late workers while the next job is set up
    std::atomic<uint64_t> claim_{0};
    std::atomic<uint64_t> generation_{0};  // bumped per job: wakes the workers
    std::atomic<int> active_{0};           // workers inside claim(): the caller waits for them
    std::atomic<int> sleepers_{0};
    std::atomic<bool> stop_{false};
    std::mutex mutex_;
    std::condition_variable wake_;
};

}  // namespace fastllm
