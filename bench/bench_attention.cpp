// bench_attention — one prompt pass's attention (ops::attention) at each instruction-set level this
// CPU runs, in alternating rounds: ns a (query head, key) pair, and that times the threads (the
// work a thread does for a pair). The pass is 512 rows after `pos0` positions of an f16 KV cache,
// Qwen2.5-0.5B's heads by default (14 query heads, 2 KV heads of 64 values). Built with the tests
// (it calls internal functions): build/bench_attention [threads] [pos0] [rounds] [head_dim]
// [heads] [kv_heads] [rows] [cold]. Up to 17 rows are decoding rows (rows = 1: a decoding step's
// attention of one layer); their KV rows are read from memory, as after the weights' layers (a
// 256 MiB read between rounds), not from the caches of the round before; cold = 0 leaves them in
// the caches (the attention's own work, without the reads' waits).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "arch/kv_cache.h"
#include "cpu/kernels.h"
#include "cpu/ops.h"
#include "cpu/thread_pool.h"
#include "cpu_name.h"

using namespace fastllm;

int main(int argc, char **argv) {
    auto arg = [&](int i, int def) { return argc > i ? std::atoi(argv[i]) : def; };
    const int threads = arg(1, 2), pos0 = arg(2, 7680), rounds = arg(3, 3), hd = arg(4, 64), n_heads = arg(5, 14),
              n_kv = arg(6, 2), T = arg(7, 512), cold = arg(8, 1), kv_dim = n_kv * hd;
    std::vector<const KernelTable *> tables;
    for (Isa isa : {Isa::Amx, Isa::Avx512, Isa::Avx2, Isa::NeonDot, Isa::Neon})
        if (const KernelTable *k = kernels_for(isa)) tables.push_back(k);
    if (tables.empty()) tables.push_back(&kernels());
    std::mt19937 rng(1);
    std::normal_distribution<float> nd;
    std::vector<float> q((size_t)T * n_heads * hd), row(kv_dim), out(q.size());
    for (float &x : q) x = nd(rng);
    const KernelTable &k0 = *tables.back();
    KvCache cache(1, pos0 + T + KvCache::kBlock, kv_dim, KvType::F16, KvType::F16);
    cache.prepare(0, pos0 + T);
    for (int p = 0; p < pos0 + T; p++)
        for (bool value : {false, true}) {
            for (float &x : row) x = nd(rng);
            k0.kv_store[(int)KvType::F16](row.data(), kv_dim, value ? cache.v_row(0, p) : cache.k_row(0, p));
        }
    ThreadPool pool(threads);
    // The scratch as the backend carves it: 64-byte aligned (the tiles' loads of unaligned rows
    // took twice as long).
    std::vector<float> memory(ops::attention_scratch_floats(threads, hd, kv_dim) + 16);
    float *mem = memory.data() + (64 - (uintptr_t)memory.data() % 64) % 64 / sizeof(float);
    const ops::AttentionScratch scratch = ops::make_attention_scratch(mem, hd, kv_dim);
    const AttentionShape shape{n_heads, n_kv, hd, 1.0f / std::sqrt((float)hd), 0.0f, 0};
    const AttentionRun run{0, T, pos0, &cache};
    const double pairs = (double)n_heads * T * (pos0 + (T + 1) / 2.0);
    std::vector<std::vector<double>> ns(tables.size());
    std::vector<uint8_t> evict(T < 16 && cold ? 256 << 20 : 0, 1);  // past any L3, as a decoding step's weights
    uint64_t sink = 0;
    for (int r = 0; r < rounds; r++)
        for (size_t i = 0; i < tables.size(); i++) {
            for (size_t b = 0; b < evict.size(); b += 64) sink += evict[b];
            const auto t0 = std::chrono::steady_clock::now();
            ops::attention(*tables[i], q.data(), &run, 1, 0, shape, out.data(), scratch, pool);
            ns[i].push_back(std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count());
        }
    if (sink == 42) std::printf(" ");
    std::printf("%s, %d threads; %d rows after %d positions, %d heads (%d KV) of %d, f16 cache; median of %d rounds\n",
                cpu_name().c_str(), threads, T, pos0, n_heads, n_kv, hd, rounds);
    for (size_t i = 0; i < tables.size(); i++) {
        std::sort(ns[i].begin(), ns[i].end());
        const double med = ns[i][ns[i].size() / 2];
        std::printf("  %-8s %8.2f ms  %.3f ns a pair  (x threads: %.3f)\n", isa_name(tables[i]->isa), med / 1e6,
                    med / pairs, med * threads / pairs);
    }
    return 0;
}
