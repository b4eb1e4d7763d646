// compute.h — what forward passes compute with: the backend (its threads and scratch), and the
// working activations (Workspace). They belong to the model, one set per thread count, and
// every session of that count shares them, so 64 sessions start no more threads than one and keep
// one copy of the activations (SmolLM2-135M at 256-token batches: about 18 MiB). A pass holds the
// lock for its whole run: passes over one model's sessions (with the same thread count) run one at
// a time, each on all the threads.
#pragma once

#include <memory>
#include <mutex>
#include <vector>

#include "arch/arena.h"
#include "arch/backend.h"
#include "arch/decoder.h"
#include "arch/kv_cache.h"
#include "backends/backends.h"

namespace fastllm {

struct Compute {
    // A backend for passes of d (on n_threads threads, on the CPU), with d's weights prepared.
    Compute(const Decoder &d, const BackendOptions &options);

    std::mutex mutex;  // held by a pass (and by reserve)
    std::unique_ptr<Backend> backend;
    Workspace work;
    std::vector<ForwardRow> rows;  // work.max_batch rows, the inputs of a pass
    std::vector<int32_t> tokens;

    // Makes the working memory big enough for passes of max_batch rows over `positions` keys;
    // caller holds the mutex. Throws FASTLLM_ERR_OUT_OF_MEMORY (the old memory stays).
    void reserve(const Decoder &d, int max_batch, int positions);
    size_t bytes() const { return arena_ ? arena_->bytes() : 0; }

private:
    std::unique_ptr<Arena> arena_;
    int positions_ = 0;
};

}  // namespace fastllm
