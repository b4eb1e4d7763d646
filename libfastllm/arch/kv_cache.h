// kv_cache.h — one session's keys and values, apart from the pass's working activations
// (Workspace), so that a pass over several sessions' tokens writes each into its own cache.
//
// The cache is a table of blocks of kBlock positions (the K and V rows of those positions, for
// every layer, or for every layer of one sliding window), allocated as the context grows: a
// session holding 1,000 tokens of a 4,096-token context pays for 1,024 positions, and a layer with
// a window of 512 for at most 576 (Gemma 3: 22 of 26 layers). Blocks are reference counted, so a
// session forked from another's first n tokens (a shared persona prompt) points at the same
// blocks; writing into a shared block copies it first (copy on write).
#pragma once

#include <algorithm>
#include <cstddef>
#include <memory>
#include <vector>

#include "arch/kv_format.h"
#include "arch/memory.h"
#include "format/tensor.h"

namespace fastllm {

class KvCache {
public:
    static constexpr int kBlock = 32;  // positions per block: SmolLM2-135M f16, 720 KiB a block

    // window: per layer, the positions a query sees (0 or absent: all, else p - window + 1 .. p).
    // With drop_outside_windows, a windowed layer keeps only what its queries can still see: the
    // layers of one window share blocks (a group), and forget() releases a group's blocks that fell
    // out of its window (keeping one block more, for a truncation by a few tokens, and the first
    // keep_prefix positions, which a context shift keeps).
    // The blocks come from `memory` (a backend's, arch/memory.h; the host's by default): per layer,
    // or one for all (a model split between the CPU and a device keeps each layer's rows where the
    // layer runs). The block table — which block holds which positions, who shares it — is host
    // data.
    KvCache(int n_layers, int n_ctx, int kv_dim, KvType type_k, KvType type_v, const std::vector<int> &window = {},
            bool drop_outside_windows = true, int keep_prefix = 0, std::vector<Memory *> memory = {&host_memory()});

    KvType type_k() const { return type_k_; }
    KvType type_v() const { return type_v_; }
    int n_layers() const { return n_layers_; }
    int n_ctx() const { return n_ctx_; }
    int kv_dim() const { return kv_dim_; }
    size_t row_bytes_k() const { return row_k_; }
    size_t row_bytes_v() const { return row_v_; }
    // Bytes one position takes in every layer (K and V rows).
    size_t bytes_per_position() const { return (size_t)n_layers_ * (row_k_ + row_v_); }

    // The row of a layer's key / value at pos, whose block is held, at the memory's address (only
    // its backend dereferences it). The rows of the following positions of the same block follow
    // it, row_bytes apart.
    char *k_row(int layer, int pos) const {
        const Group &g = groups_[where_[layer].group];
        return g.blocks[pos / kBlock]->data + ((size_t)where_[layer].index * kBlock + pos % kBlock) * row_k_;
    }
    char *v_row(int layer, int pos) const {
        const Group &g = groups_[where_[layer].group];
        return g.blocks[pos / kBlock]->data + g.v_offset + ((size_t)where_[layer].index * kBlock + pos % kBlock) * row_v_;
    }
    bool holds(int layer, int pos) const { return groups_[where_[layer].group].blocks[pos / kBlock] != nullptr; }
    // Positions from pos to the end of its block (at most `limit` - pos).
    static int run_in_block(int pos, int limit) { return std::min(limit, (pos / kBlock + 1) * kBlock) - pos; }

    // Makes positions [from, to) writable: allocates missing blocks and copies shared ones (in the
    // windowed layers too, unless `windowed` is false). Every allocation is made before anything
    // changes, so running out of memory (FASTLLM_ERR_OUT_OF_MEMORY) leaves the cache as it was.
    void prepare(int from, int to, bool windowed = true);
    // Drops the blocks that hold no position below n.
    void release_from(int n);
    // Drops the block holding pos in the layer's group (every layer of its window).
    void release_block(int layer, int pos) { groups_[where_[layer].group].blocks[pos / kBlock].reset(); }
    // With drop_outside_windows: releases the windowed layers' blocks that no query at position n
    // or later sees.
    void forget(int n);
    // Whether a context of n evaluated positions can go on from here: every layer holds the
    // positions a query at n sees. False after forget() when n is older than a window still holds.
    bool can_continue(int n) const;
    // Points the blocks of positions [0, n) at src's (same shape, types, windows and memories);
    // blocks this cache held there are released.
    void share(const KvCache &src, int n);

    // Bytes of the blocks held, and of those among them that another cache also holds.
    size_t bytes() const;
    size_t shared_bytes() const;
    // The most the blocks take when decoding at n_ctx positions (windowed layers: their window,
    // the slack block, the block being written and the kept prefix; a prompt pass adds its rows).
    size_t capacity_bytes() const;
    // Layers whose blocks forget() drops.
    int n_dropping_layers() const;

private:
    struct Block {
        Memory &memory;
        char *data;
        Block(Memory &memory, size_t bytes);
        ~Block();
        Block(const Block &) = delete;
        Block &operator=(const Block &) = delete;
    };
    // The layers of one window and memory, sharing blocks: a block holds kBlock positions of each
    // of their K rows, then of their V rows.
    struct Group {
        Memory *memory = nullptr;  // its layers' backend's
        int window = 0, n_layers = 0;
        bool drops = false;  // forget() releases what falls out of the window
        size_t block_bytes = 0, v_offset = 0;
        std::vector<std::shared_ptr<Block>> blocks;  // one per kBlock positions of n_ctx; null: none
        int first_needed(int n) const { return window > 0 ? std::max(0, n - window + 1) : 0; }
    };
    struct Where {
        int group, index;  // a layer's group and its place in it
    };

    KvType type_k_, type_v_;
    int n_layers_, n_ctx_, kv_dim_, keep_prefix_;
    size_t row_k_, row_v_;
    std::vector<Group> groups_;
    std::vector<Where> where_;  // per layer
};

// One input token of a forward pass: whose KV cache it extends, at which position, where its
// logits go and where its final hidden state goes (nullptr: not needed; host memory), and its
// token type (an encoder's segment: 0 the first, 1 the second). Rows of one pass may belong to
// different sessions, which is how several sessions decode together in one pass over the weights.
struct LoraSet;
struct ForwardRow {
    KvCache *cache;
    int pos;
    float *logits;
    float *hidden = nullptr;
    int type = 0;
    const LoraSet *lora = nullptr;  // the session's LoRA adapters (arch/lora.h), or none
};

// Rows first_row .. first_row + T - 1 of a pass: consecutive positions pos0 .. of one cache.
struct AttentionRun {
    int first_row, T, pos0;
    const KvCache *cache;
};

// A run of up to kStepRows rows (a decoding step's token and its speculative drafts) gives each row
// what it gets in a run of its own, bit for bit, on the CPU backend (test_kernels, and
// tests/test_speculative.py through the API): greedy output is then the same with drafts.
constexpr int kStepRows = 17;

}  // namespace fastllm
