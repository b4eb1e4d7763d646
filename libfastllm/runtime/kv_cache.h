// kv_cache.h — one session's keys and values, apart from the pass's working activations
// (Workspace), so that a pass over several sessions' tokens writes each into its own cache.
#pragma once

#include <cstddef>

#include "format/tensor.h"
#include "runtime/arena.h"

namespace fastllm {

struct KvCache {
    DType type_k = DType::F32, type_v = DType::F32;  // the element types (f32 is the only one yet)
    int n_layers = 0, n_ctx = 0, kv_dim = 0;
    float *k = nullptr, *v = nullptr;  // [n_layers, n_ctx, kv_dim]

    void carve(Arena &a, int layers, int ctx, int dim) {
        n_layers = layers, n_ctx = ctx, kv_dim = dim;
        k = a.take((size_t)layers * ctx * dim);
        v = a.take((size_t)layers * ctx * dim);
    }
    float *k_at(int layer, int pos) const { return k + ((size_t)layer * n_ctx + pos) * kv_dim; }
    float *v_at(int layer, int pos) const { return v + ((size_t)layer * n_ctx + pos) * kv_dim; }
    size_t bytes() const { return 2 * (size_t)n_layers * n_ctx * kv_dim * sizeof(float); }
};

// One input token of a forward pass: whose KV cache it extends, at which position, and where its
// logits go (nullptr: not needed). Rows of one pass may belong to different sessions, which is
// how several sessions decode together in one pass over the weights.
struct ForwardRow {
    KvCache *cache;
    int pos;
    float *logits;
};

}  // namespace fastllm
