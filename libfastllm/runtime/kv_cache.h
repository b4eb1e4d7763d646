// kv_cache.h — one session's keys and values, apart from the pass's working activations
// (Workspace), so that a pass over several sessions' tokens writes each into its own cache.
//
// The cache is a table of blocks of kBlock positions (every layer's K and V rows of those
// positions), allocated as the context grows: a session holding 1,000 tokens of a 4,096-token
// context pays for 1,024 positions. Blocks are reference counted, so a session forked from
// another's first n tokens (a shared persona prompt) points at the same blocks; writing into a
// shared block copies it first (copy on write).
#pragma once

#include <algorithm>
#include <cstddef>
#include <memory>
#include <vector>

#include "format/tensor.h"

namespace fastllm {

class KvCache {
public:
    static constexpr int kBlock = 32;  // positions per block: SmolLM2-135M f16, 720 KiB a block

    KvCache(int n_layers, int n_ctx, int kv_dim, KvType type_k, KvType type_v);

    KvType type_k() const { return type_k_; }
    KvType type_v() const { return type_v_; }
    int n_layers() const { return n_layers_; }
    int n_ctx() const { return n_ctx_; }
    int kv_dim() const { return kv_dim_; }
    size_t row_bytes_k() const { return row_k_; }
    size_t row_bytes_v() const { return row_v_; }
    // Bytes one position takes (every layer's K and V rows).
    size_t bytes_per_position() const { return (size_t)n_layers_ * (row_k_ + row_v_); }

    // The row of a layer's key / value at pos, whose block is allocated. The rows of the following
    // positions of the same block follow it, row_bytes apart.
    char *k_row(int layer, int pos) const {
        return blocks_[pos / kBlock]->data + ((size_t)layer * kBlock + pos % kBlock) * row_k_;
    }
    char *v_row(int layer, int pos) const {
        return blocks_[pos / kBlock]->data + v_offset_ + ((size_t)layer * kBlock + pos % kBlock) * row_v_;
    }
    // Positions from pos to the end of its block (at most `limit` - pos).
    static int run_in_block(int pos, int limit) { return std::min(limit, (pos / kBlock + 1) * kBlock) - pos; }

    // Makes positions [from, to) writable: allocates missing blocks and copies shared ones. Every
    // allocation is made before anything changes, so running out of memory (FASTLLM_ERR_OUT_OF_MEMORY)
    // leaves the cache as it was.
    void prepare(int from, int to);
    // Drops the blocks that hold no position below n.
    void release_from(int n);
    // Points the blocks of positions [0, n) at src's (same shape and types); blocks this cache
    // held there are released.
    void share(const KvCache &src, int n);
    // Whether the block holding pos is also held by another cache.
    bool shared(int pos) const { return blocks_[pos / kBlock] && blocks_[pos / kBlock].use_count() > 1; }

    // Bytes of the blocks held, and of those among them that another cache also holds.
    size_t bytes() const;
    size_t shared_bytes() const;
    size_t block_bytes() const { return (size_t)kBlock * bytes_per_position(); }

private:
    struct Block {
        char *data;
        explicit Block(size_t bytes);
        ~Block();
        Block(const Block &) = delete;
        Block &operator=(const Block &) = delete;
    };

    KvType type_k_, type_v_;
    int n_layers_, n_ctx_, kv_dim_;
    size_t row_k_, row_v_, v_offset_;
    std::vector<std::shared_ptr<Block>> blocks_;  // one per kBlock positions of n_ctx; null: none yet
};

// One input token of a forward pass: whose KV cache it extends, at which position, and where its
// logits go (nullptr: not needed). Rows of one pass may belong to different sessions, which is
// how several sessions decode together in one pass over the weights.
struct ForwardRow {
    KvCache *cache;
    int pos;
    float *logits;
};

// Rows first_row .. first_row + T - 1 of a pass: consecutive positions pos0 .. of one cache.
struct AttentionRun {
    int first_row, T, pos0;
    const KvCache *cache;
};

}  // namespace fastllm
