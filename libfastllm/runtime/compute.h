// compute.h — what forward passes compute with: the backends (their threads and scratch), and the
// working activations (Workspace), one set per stage (arch/decoder.h's Stage: a model on one
// backend has one; one split between the CPU and a device has two). They belong to the model, one
// set per thread count on the CPU (one in all when a device runs layers), and every session of
// that count shares them, so 64 sessions start no more threads than one and keep one copy of the
// activations (SmolLM2-135M at 256-token batches: about 18 MiB). A pass holds the lock for its
// whole run: passes over one model's sessions (with the same thread count) run one at a time, each
// on all the threads.
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "arch/arena.h"
#include "arch/backend.h"
#include "arch/decoder.h"
#include "arch/kv_cache.h"
#include "backends/backends.h"

namespace fastllm {

struct ComputeOptions {
    int n_threads = 1;
    std::string device = "cpu";  // resolved (backends.h)
    int device_layers = 0;       // on a device: its layers, the model's last ones (all of them, or a split)
};

struct Compute {
    // The backends for passes of d, with d's weights prepared (each stage's own).
    Compute(const Decoder &d, const ComputeOptions &options);

    std::mutex mutex;  // held by a pass (and by reserve)
    std::vector<Stage> stages;
    std::vector<ForwardRow> rows;  // max_batch() rows, the inputs of a pass
    std::vector<int32_t> tokens;

    int max_batch() const { return works_[0].max_batch; }
    // The backend that runs a layer (its KV rows are that backend's memory).
    Backend &backend_of(int layer) const;
    // Per layer, the memory its KV rows go in.
    std::vector<Memory *> kv_memory(int n_layers) const;
    // Waits for every stage's recorded work.
    void finish() const;
    // What runs the passes ("cpu avx512, 2 threads", "vulkan ...", or both with their layers).
    std::string describe() const;

    // Makes the working memory big enough for passes of max_batch rows; caller holds the mutex.
    // Throws FASTLLM_ERR_OUT_OF_MEMORY (the old memory stays).
    void reserve(const Decoder &d, int max_batch);
    size_t bytes() const;

private:
    std::vector<std::unique_ptr<Backend>> backends_;
    std::vector<Workspace> works_;
    std::vector<std::unique_ptr<Arena>> arenas_;
};

}  // namespace fastllm
