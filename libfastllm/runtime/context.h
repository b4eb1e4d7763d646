// context.h — a session's context: its tokens, the KV cache that holds the evaluated ones, and
// what changes them without sampling: evaluation in passes (pass.h), truncation, context shift,
// forks. The generation (generation.cpp) and the steps that batch sessions (step.cpp) build on it.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "arch/kv_cache.h"
#include "fastllm.h"
#include "runtime/compute.h"
#include "runtime/model.h"
#include "runtime/options.h"

namespace fastllm {

class Context {
    const Model &model_;
    const SessionOptions &opt_;
    Compute &compute_;

public:
    // opt: resolved (n_ctx, n_batch, threads), the owner's, outliving this context.
    Context(const Model &model, const SessionOptions &opt, Compute &compute);

    std::vector<int32_t> tokens;  // the context; the tail past n_evaluated is not yet in the cache
    size_t n_evaluated = 0;
    KvCache cache;
    std::shared_ptr<const LoraSet> lora;  // the adapters its tokens are evaluated with (none: the base model)

    // This (empty) context becomes src's first n tokens, sharing the KV blocks that hold them.
    void fork_from(const Context &src, size_t n);
    void clear();
    // Keeps the first n tokens (at most tokens.size()).
    void keep(size_t n);
    // Throws unless n tokens of these ids can be appended (after a context shift, where enabled).
    void check_tokens(const int32_t *ids, size_t n) const;
    // Makes room for n more tokens: a context shift when enabled, else FASTLLM_ERR_CONTEXT_FULL.
    void make_room(size_t n);
    // Runs tokens[n_evaluated..] through the model in n_batch chunks. When `cancel` is set (checked
    // between chunks and layers) the evaluated part stays, the rest is dropped, `cancel` is cleared
    // and FASTLLM_ERR_CANCELLED thrown.
    void run_pending(fastllm_logits_mode mode, float *out_logits, std::atomic<bool> &cancel);
    // After n_evaluated went back (a truncation, a fork, a load): drops the cache past it, or, when
    // the sliding-window layers no longer hold what a query there sees, all of it (the tokens are
    // then evaluated again by the next evaluation).
    void keep_or_recompute();
    // An empty KV cache of this context's shape, types, windows and backend.
    KvCache make_cache() const;

private:
    // Drops `discard` tokens after the first n_keep, moving the later keys and values down and
    // turning their keys' rotary angles back by as many positions.
    void shift(int discard);
};

}  // namespace fastllm
