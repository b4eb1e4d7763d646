#include "arch/kv_cache.h"

#include <new>

#include "base/error.h"

namespace fastllm {

KvCache::Block::Block(Memory &m, size_t bytes) : memory(m), data(m.alloc(bytes)) {
    if (!data) throw std::bad_alloc();
}

KvCache::Block::~Block() { memory.free(data); }

KvCache::KvCache(int n_layers, int n_ctx, int kv_dim, KvType type_k, KvType type_v, const std::vector<int> &window,
                 bool drop_outside_windows, int keep_prefix, std::vector<Memory *> memory)
    : type_k_(type_k), type_v_(type_v), n_layers_(n_layers), n_ctx_(n_ctx), kv_dim_(kv_dim),
      keep_prefix_(keep_prefix), row_k_(kv_row_bytes(type_k, kv_dim)), row_v_(kv_row_bytes(type_v, kv_dim)) {
    for (int l = 0; l < n_layers; l++) {
        const int w = l < (int)window.size() ? std::max(window[l], 0) : 0;
        Memory *m = memory.size() == 1 ? memory[0] : memory.at((size_t)l);
        size_t g = 0;
        while (g < groups_.size() && (groups_[g].window != w || groups_[g].memory != m)) g++;
        if (g == groups_.size()) {
            groups_.emplace_back();
            groups_.back().memory = m;
            groups_.back().window = w;
            groups_.back().drops = w > 0 && drop_outside_windows;
        }
        where_.push_back(Where{(int)g, groups_[g].n_layers++});
    }
    for (Group &g : groups_) {
        g.v_offset = (size_t)g.n_layers * kBlock * row_k_;
        g.block_bytes = (size_t)g.n_layers * kBlock * (row_k_ + row_v_);
        g.blocks.resize((size_t)(n_ctx + kBlock - 1) / kBlock);
    }
}

void KvCache::prepare(int from, int to, bool windowed) {
    if (from >= to) return;
    const int b0 = from / kBlock, b1 = (to - 1) / kBlock;
    auto wants = [&](const Group &g, int b) { return !g.blocks[b] || g.blocks[b].use_count() > 1; };
    std::vector<std::shared_ptr<Block>> fresh;  // all allocations first: nothing changes on failure
    size_t wanted = 0, wanted_bytes = 0;
    for (const Group &g : groups_) {
        if (!windowed && g.window > 0) continue;
        for (int b = b0; b <= b1; b++) wanted += wants(g, b), wanted_bytes += wants(g, b) ? g.block_bytes : 0;
    }
    try {
        fresh.reserve(wanted);
        for (const Group &g : groups_) {
            if (!windowed && g.window > 0) continue;
            for (int b = b0; b <= b1; b++)
                if (wants(g, b)) fresh.push_back(std::make_shared<Block>(*g.memory, g.block_bytes));
        }
    } catch (const std::bad_alloc &) {
        fail(FASTLLM_ERR_OUT_OF_MEMORY, "cannot allocate %.1f MiB of KV cache for positions %d to %d",
             wanted_bytes / 1048576.0, from, to - 1);
    }
    size_t next = 0;
    for (Group &g : groups_) {
        if (!windowed && g.window > 0) continue;
        for (int b = b0; b <= b1; b++) {
            if (!wants(g, b)) continue;
            std::shared_ptr<Block> &mine = fresh[next++];
            if (g.blocks[b]) g.memory->copy(mine->data, g.blocks[b]->data, g.block_bytes);  // copy on write
            g.blocks[b] = std::move(mine);
        }
    }
}

void KvCache::release_from(int n) {
    for (Group &g : groups_)
        for (size_t b = (size_t)(n + kBlock - 1) / kBlock; b < g.blocks.size(); b++) g.blocks[b].reset();
}

void KvCache::forget(int n) {
    for (Group &g : groups_) {
        if (!g.drops) continue;
        // Blocks wholly before the window of a query at n, less one block of slack, and after the
        // kept prefix.
        const int end = std::min(g.first_needed(n) - kBlock, n);
        for (int b = (keep_prefix_ + kBlock - 1) / kBlock; (b + 1) * kBlock <= end; b++) g.blocks[b].reset();
    }
}

bool KvCache::can_continue(int n) const {
    if (n <= 0) return true;
    for (const Group &g : groups_)
        for (int b = g.first_needed(n) / kBlock; b <= (n - 1) / kBlock; b++)
            if (!g.blocks[b]) return false;
    return true;
}

void KvCache::share(const KvCache &src, int n) {
    bool same = src.type_k_ == type_k_ && src.type_v_ == type_v_ && src.kv_dim_ == kv_dim_ &&
                src.n_layers_ == n_layers_ && src.groups_.size() == groups_.size();
    for (size_t g = 0; same && g < groups_.size(); g++)
        same = src.groups_[g].window == groups_[g].window && src.groups_[g].memory == groups_[g].memory;
    if (!same)
        fail(FASTLLM_ERR_INVALID_ARGUMENT,
             "cannot share a KV cache of another shape, type, window or backend (%s/%s and %s/%s)", kv_type_name(src.type_k_),
             kv_type_name(src.type_v_), kv_type_name(type_k_), kv_type_name(type_v_));
    for (size_t g = 0; g < groups_.size(); g++) {
        const size_t nb = std::min((size_t)(n + kBlock - 1) / kBlock, groups_[g].blocks.size());
        for (size_t b = 0; b < nb; b++) groups_[g].blocks[b] = src.groups_[g].blocks[b];
    }
}

size_t KvCache::bytes() const {
    size_t n = 0;
    for (const Group &g : groups_)
        for (const auto &b : g.blocks) n += b ? g.block_bytes : 0;
    return n;
}

size_t KvCache::shared_bytes() const {
    size_t n = 0;
    for (const Group &g : groups_)
        for (const auto &b : g.blocks) n += b && b.use_count() > 1 ? g.block_bytes : 0;
    return n;
}

size_t KvCache::capacity_bytes() const {
    size_t n = 0;
    for (const Group &g : groups_) {
        size_t blocks = g.blocks.size();
        // the window, the slack block, the block being written, the kept prefix
        if (g.drops) blocks = std::min(blocks, (size_t)(g.window + 2 * kBlock + keep_prefix_) / kBlock + 1);
        n += blocks * g.block_bytes;
    }
    return n;
}

int KvCache::n_dropping_layers() const {
    int n = 0;
    for (const Group &g : groups_) n += g.drops ? g.n_layers : 0;
    return n;
}

}  // namespace fastllm
