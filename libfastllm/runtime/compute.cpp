#include "runtime/compute.h"

#include <algorithm>

#include "base/error.h"

namespace fastllm {

Compute::Compute(const Decoder &d, const BackendOptions &options) : backend(make_backend(options)) {
    backend->prepare_weights(d.weights());
}

void Compute::reserve(const Decoder &d, int max_batch, int positions) {
    if (arena_ && max_batch <= work.max_batch && positions <= positions_) return;
    max_batch = std::max(max_batch, work.max_batch), positions = std::max(positions, positions_);
    // The plan is derived by running the carve twice (arena.h): sizes, then the real buffers. The
    // backend changes nothing while the arena plans, so a failed allocation leaves it as it was.
    auto carve = [&](Arena &a, Workspace &w) {
        d.carve(a, w, max_batch);
        backend->carve(a, PassShape{d.max_row_length(), max_batch, positions});
    };
    auto arena = std::make_unique<Arena>(backend->memory());
    Workspace w;
    carve(*arena, w);
    if (!arena->allocate())
        fail(FASTLLM_ERR_OUT_OF_MEMORY, "cannot allocate %.1f MiB of working memory for %d-token batches",
             arena->planned_bytes() / 1048576.0, max_batch);
    carve(*arena, w);
    arena_ = std::move(arena), work = w, positions_ = positions;
    rows.resize((size_t)max_batch);
    tokens.resize((size_t)max_batch);
}

}  // namespace fastllm
