// bench_quant_decode — decoding's quantized products (ops::matmul of one token) at each
// instruction-set level this CPU runs, in alternating rounds, against the rate at which the same
// threads merely read the same bytes. The matrices are one TinyLlama-1.1B layer's (qkv 2560 x 2048,
// o 2048 x 2048, gate-up 11264 x 2048, down 2048 x 5632) six times over, random codes and scales,
// far more than the caches hold, so every weight comes from memory as in a decode step. Built with
// the tests (it calls internal functions): build/bench_quant_decode [threads] [rounds] [dtypes]
// (dtypes comma-separated .flm names: q8,q4,q4_g128,q4k,q6k by default) [cache | prompt | N]. With `cache`, one
// 512 x 2048 matrix (0.3-1.1 MB, within L2 or the L3) passes 200 times a round instead: the kernels'
// own rate with the weights in cache, the ceiling that memory's rate is measured against. With
// `prompt`, 64 tokens pass through one 2048 x 2048 matrix 10 times a round, as a prompt's passes do
// (the weights in cache, every pass of 8 tokens a block at a time): multiply-adds a second at each
// level, the products' own rate, steadier than a whole prompt's tokens/s. With a number N (2-8), N
// tokens pass through the layers together from memory, as a speculative step's rows or a few
// sessions decoding together do (the rate is still the weights' bytes a second).
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "cpu/kernels.h"
#include "cpu/ops.h"
#include "cpu/thread_pool.h"
#include "cpu_name.h"

using namespace fastllm;

// A quantized matrix of random codes; its f16 scales (or a K format's f16 factors) set to finite
// values near 2^-8, its 8-bit K scale codes left random.
struct Matrix {
    std::vector<uint64_t> memory;  // 8-byte aligned; the data starts on 64
    Tensor t;
    size_t bytes = 0;
};

static Matrix random_matrix(DType dt, int64_t rows, int64_t cols, std::mt19937_64 &rng) {
    Matrix m;
    m.bytes = tensor_bytes(dt, rows, cols);
    m.memory.resize(m.bytes / 8 + 16);
    for (uint64_t &v : m.memory) v = rng();
    uint8_t *p = (uint8_t *)m.memory.data();
    p += (64 - (uintptr_t)p % 64) % 64;
    const uint64_t r = quant_tiles(rows) * kTileRows, kinds = dtype_has_min(dt) ? 2 : 1;
    uint16_t *f16 = (uint16_t *)(dtype_k_scales(dt) ? p + kinds * r * (cols / dtype_group(dt)) : p);
    const uint64_t n_f16 = dtype_k_scales(dt) ? kinds * r * quant_super_blocks(cols) : kinds * r * (cols / dtype_group(dt));
    for (uint64_t i = 0; i < n_f16; i++) f16[i] = (uint16_t)(0x1c00 + rng() % 256);
    m.t.name = "w";
    m.t.dtype = dt;
    m.t.n_dims = 2;
    m.t.dims[0] = rows;
    m.t.dims[1] = cols;
    m.t.data = p;
    return m;
}

// Reads every byte of the matrices, split over the threads in runs of 512 bytes and prefetched as
// the kernels prefetch: the rate the memory gives these threads.
static double read_all(const std::vector<Matrix> &ms, ThreadPool &pool) {
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<uint64_t> sink(pool.n_threads());
    for (const Matrix &m : ms) {
        const uint64_t *p = (const uint64_t *)m.t.data;
        const int64_t words = (int64_t)m.bytes / 8, per = 64;  // 512 bytes an item
        pool.parallel_for((words + per - 1) / per, [&](int64_t b, int64_t e, int tid) {
            uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
            for (int64_t i = b * per; i < std::min(words, e * per); i += 8) {
                prefetch_ahead(p + i, 64);  // as the kernels do
                s0 += p[i] + p[i + 4], s1 += p[i + 1] + p[i + 5], s2 += p[i + 2] + p[i + 6], s3 += p[i + 3] + p[i + 7];
            }
            sink[tid] += s0 + s1 + s2 + s3;
        });
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (sink[0] == 42) std::printf(" ");  // keeps the sums
    return s;
}

int main(int argc, char **argv) {
    const int threads = argc > 1 ? std::atoi(argv[1]) : 2, rounds = argc > 2 ? std::atoi(argv[2]) : 9;
    const std::string list = argc > 3 ? argv[3] : "q8,q4,q4_g128,q4k,q6k";
    const std::string mode = argc > 4 ? argv[4] : "";
    const bool cache = mode == "cache", prompt = mode == "prompt";
    const int steps = std::atoi(mode.c_str());  // a number: that many tokens a pass, streaming
    const int repeat = cache ? 200 : prompt ? 10 : 1, n_tok = prompt ? 64 : steps > 0 ? steps : 1;
    std::vector<const KernelTable *> tables;
    for (Isa isa : {Isa::Avx512, Isa::AvxVnni, Isa::Avx2, Isa::NeonDot, Isa::Neon})  // amx: the avx512 kernel decodes
        if (const KernelTable *k = kernels_for(isa)) tables.push_back(k);
    if (tables.empty()) tables.push_back(&kernels());
    ThreadPool pool(threads);
    const std::string what = prompt ? "64 tokens through a 2048 x 2048 matrix, 10 times"
                           : cache  ? "one token through a 512 x 2048 matrix in cache, 200 times"
                                    : std::to_string(n_tok) + (n_tok == 1 ? " token" : " tokens") + " through 6 layers of the TinyLlama-1.1B shape";
    std::printf("%s, %d threads, %s; median of %d alternating rounds\n", cpu_name().c_str(), threads, what.c_str(), rounds);
    std::stringstream names(list);
    for (std::string name; std::getline(names, name, ',');) {
        DType dt = DType::F32;
        for (const DTypeTraits &d : kDTypes)
            if (name == d.name && d.quantized) dt = d.type;
        if (dt == DType::F32) {
            std::fprintf(stderr, "unknown quantized dtype '%s'\n", name.c_str());
            return 1;
        }
        std::mt19937_64 rng(1);
        std::vector<Matrix> ms;
        if (cache) ms.push_back(random_matrix(dt, 512, 2048, rng));
        if (prompt) ms.push_back(random_matrix(dt, 2048, 2048, rng));
        for (int layer = 0; layer < (cache || prompt ? 0 : 6); layer++)
            for (auto shape : {std::pair<int64_t, int64_t>{2560, 2048}, {2048, 2048}, {11264, 2048}, {2048, 5632}})
                ms.push_back(random_matrix(dt, shape.first, shape.second, rng));
        size_t total = 0;
        for (const Matrix &m : ms) total += m.bytes * repeat;
        std::vector<float> x(5632 * n_tok), y(11264 * n_tok);
        std::normal_distribution<float> nd;
        for (float &v : x) v = nd(rng);
        std::vector<float> scratch(ops::matmul_scratch_floats(5632, threads, n_tok));
        const ops::MatmulScratch sc = ops::make_matmul_scratch(scratch.data(), 5632, threads, n_tok);
        std::vector<std::vector<double>> secs(tables.size() + 1);
        // Each round starts one step further along the levels and the plain read, so that no level
        // always follows the same one (the first level after the read streamed 5-10% slower when the
        // order was fixed).
        const size_t n_runs = tables.size() + 1;
        for (int r = 0; r < rounds; r++) {
            for (size_t s = 0; s < n_runs; s++) {
                const size_t i = (s + r) % n_runs;
                if (i == tables.size()) {
                    double read_s = 0;
                    for (int k = 0; k < (prompt ? 0 : repeat); k++) read_s += read_all(ms, pool);
                    secs[i].push_back(read_s);
                    continue;
                }
                const auto t0 = std::chrono::steady_clock::now();
                for (int k = 0; k < repeat; k++)
                    for (const Matrix &m : ms) ops::matmul(*tables[i], m.t, nullptr, x.data(), n_tok, y.data(), sc, pool);
                secs[i].push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
            }
        }
        auto median = [](std::vector<double> v) {
            std::sort(v.begin(), v.end());
            return v[v.size() / 2];
        };
        const double read_gbs = total / median(secs[tables.size()]) / 1e9;
        if (prompt) {  // the products' rate: multiply-adds a second
            double macs = 0;
            for (const Matrix &m : ms) macs += (double)m.t.rows() * m.t.cols() * n_tok * repeat;
            std::printf("%-8s", name.c_str());
            for (size_t i = 0; i < tables.size(); i++) std::printf("  %s %6.1f GMAC/s", isa_name(tables[i]->isa), macs / median(secs[i]) / 1e9);
        } else {
            std::printf("%-8s %6.0f MB  read %5.1f GB/s", name.c_str(), total / 1e6, read_gbs);
            for (size_t i = 0; i < tables.size(); i++) {
                const double gbs = total / median(secs[i]) / 1e9;
                std::printf("  %s %5.1f GB/s (%3.0f%%)", isa_name(tables[i]->isa), gbs, 100 * gbs / read_gbs);
            }
        }
        std::printf("\n");
    }
    return 0;
}
