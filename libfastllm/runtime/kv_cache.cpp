#include "runtime/kv_cache.h"

#include <cstdlib>
#include <cstring>
#include <new>

#include "api/error.h"

namespace fastllm {

KvCache::Block::Block(size_t bytes) {
    void *p = nullptr;
    if (posix_memalign(&p, 64, bytes) != 0) throw std::bad_alloc();
    data = (char *)p;
}

KvCache::Block::~Block() { std::free(data); }

KvCache::KvCache(int n_layers, int n_ctx, int kv_dim, KvType type_k, KvType type_v)
    : type_k_(type_k), type_v_(type_v), n_layers_(n_layers), n_ctx_(n_ctx), kv_dim_(kv_dim),
      row_k_(kv_row_bytes(type_k, kv_dim)), row_v_(kv_row_bytes(type_v, kv_dim)),
      v_offset_((size_t)n_layers * kBlock * kv_row_bytes(type_k, kv_dim)),
      blocks_((size_t)(n_ctx + kBlock - 1) / kBlock) {}

void KvCache::prepare(int from, int to) {
    if (from >= to) return;
    const int b0 = from / kBlock, b1 = (to - 1) / kBlock;
    std::vector<std::shared_ptr<Block>> fresh;  // all allocations first: nothing changes on failure
    size_t wanted = 0;
    for (int b = b0; b <= b1; b++) wanted += !blocks_[b] || blocks_[b].use_count() > 1;
    try {
        fresh.reserve(wanted);
        for (size_t i = 0; i < wanted; i++) fresh.push_back(std::make_shared<Block>(block_bytes()));
    } catch (const std::bad_alloc &) {
        fail(FASTLLM_ERR_OUT_OF_MEMORY, "cannot allocate %.1f MiB of KV cache for positions %d to %d",
             wanted * (double)block_bytes() / 1048576.0, from, to - 1);
    }
    size_t next = 0;
    for (int b = b0; b <= b1; b++) {
        if (blocks_[b] && blocks_[b].use_count() == 1) continue;
        std::shared_ptr<Block> &mine = fresh[next++];
        if (blocks_[b]) std::memcpy(mine->data, blocks_[b]->data, block_bytes());  // copy on write
        blocks_[b] = std::move(mine);
    }
}

void KvCache::release_from(int n) {
    for (size_t b = (size_t)(n + kBlock - 1) / kBlock; b < blocks_.size(); b++) blocks_[b].reset();
}

void KvCache::share(const KvCache &src, int n) {
    if (src.type_k_ != type_k_ || src.type_v_ != type_v_ || src.kv_dim_ != kv_dim_ || src.n_layers_ != n_layers_)
        fail(FASTLLM_ERR_INVALID_ARGUMENT, "cannot share a KV cache of another shape or type (%s/%s and %s/%s)",
             kv_type_name(src.type_k_), kv_type_name(src.type_v_), kv_type_name(type_k_), kv_type_name(type_v_));
    const size_t nb = (size_t)(n + kBlock - 1) / kBlock;
    for (size_t b = 0; b < nb && b < blocks_.size(); b++) blocks_[b] = src.blocks_[b];
}

size_t KvCache::bytes() const {
    size_t n = 0;
    for (const auto &b : blocks_) n += b ? block_bytes() : 0;
    return n;
}

size_t KvCache::shared_bytes() const {
    size_t n = 0;
    for (const auto &b : blocks_) n += b && b.use_count() > 1 ? block_bytes() : 0;
    return n;
}

}  // namespace fastllm
