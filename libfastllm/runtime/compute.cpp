#include "runtime/compute.h"

#include <algorithm>

#include "base/error.h"

namespace fastllm {

Compute::Compute(const Decoder &d, const ComputeOptions &o) {
    const int L = d.config().num_layers, on_device = device_is_gpu(o.device) ? std::min(o.device_layers, L) : 0;
    // The CPU's stage first (the embeddings and the first layers), the device's last (the last
    // layers and the output head), as llama.cpp places n_gpu_layers.
    if (on_device < L) backends_.push_back(make_backend(BackendOptions{o.n_threads, device_is_gpu(o.device) ? "cpu" : o.device}));
    if (on_device > 0) backends_.push_back(make_backend(BackendOptions{o.n_threads, o.device}));
    works_.resize(backends_.size());
    int first = 0;
    for (size_t i = 0; i < backends_.size(); i++) {
        const int end = i + 1 < backends_.size() ? L - on_device : L;
        stages.push_back(Stage{backends_[i].get(), &works_[i], first, end});
        backends_[i]->prepare_weights(d.weights(first, end, i == 0, i + 1 == backends_.size()));
        first = end;
    }
}

Backend &Compute::backend_of(int layer) const {
    for (const Stage &s : stages)
        if (layer >= s.first_layer && layer < s.end_layer) return *s.be;
    return *stages.back().be;
}

std::vector<Memory *> Compute::kv_memory(int n_layers) const {
    std::vector<Memory *> m;
    for (int l = 0; l < n_layers; l++) m.push_back(&backend_of(l).memory());
    return m;
}

void Compute::finish() const {
    for (const Stage &s : stages) s.be->finish();
}

std::string Compute::describe() const {
    if (stages.size() == 1) return stages[0].be->describe();
    std::string out;
    for (const Stage &s : stages)
        out += (out.empty() ? "" : " + ") + s.be->describe() + " (layers " + std::to_string(s.first_layer) + "-" +
               std::to_string(s.end_layer - 1) + ")";
    return out;
}

size_t Compute::bytes() const {
    size_t n = 0;
    for (const auto &a : arenas_) n += a ? a->bytes() : 0;
    return n;
}

void Compute::reserve(const Decoder &d, int max_batch) {
    if (!arenas_.empty() && max_batch <= works_[0].max_batch) return;
    max_batch = std::max(max_batch, works_[0].max_batch);
    // The plan is derived by running the carve twice (arena.h): sizes, then the real buffers. The
    // backend changes nothing while the arena plans, so a failed allocation leaves it as it was.
    std::vector<std::unique_ptr<Arena>> arenas;
    std::vector<Workspace> works(stages.size());
    for (size_t i = 0; i < stages.size(); i++) {
        Backend &be = *stages[i].be;
        auto carve = [&](Arena &a, Workspace &w) {
            d.carve(a, w, max_batch);
            be.carve(a, d.pass_shape(max_batch));
        };
        arenas.push_back(std::make_unique<Arena>(be.memory()));
        carve(*arenas.back(), works[i]);
        if (!arenas.back()->allocate())
            fail(FASTLLM_ERR_OUT_OF_MEMORY, "cannot allocate %.1f MiB of working memory for %d-token batches (%s)",
                 arenas.back()->planned_bytes() / 1048576.0, max_batch, be.describe().c_str());
    }
    for (size_t i = 0; i < stages.size(); i++) {
        Backend &be = *stages[i].be;
        d.carve(*arenas[i], works[i], max_batch);
        be.carve(*arenas[i], d.pass_shape(max_batch));
    }
    arenas_ = std::move(arenas), works_ = std::move(works);
    for (size_t i = 0; i < stages.size(); i++) stages[i].w = &works_[i];
    rows.resize((size_t)max_batch);
    tokens.resize((size_t)max_batch);
}

}  // namespace fastllm
