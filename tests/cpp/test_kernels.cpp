// test_kernels.cpp — every fast op (at every ISA level this CPU supports) against its reference in
// ops_ref.cpp, plus the small pure pieces: f16/bf16 conversion, the sampler, the text stream.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "base/error.h"
#include "cpu/kernels.h"
#include "cpu/ops.h"
#include "arch/kv_cache.h"
#include "runtime/sampler.h"
#include "text/text_stream.h"
#include "cpu/thread_pool.h"
#include "text/tokenizer.h"
#include "refdev/backend_refdev.h"
#include "backends/backends.h"
#include "format/quantize_common.h"
#define FASTLLM_QUANT_LANES 4
#define FASTLLM_QUANT_NAMESPACE test_lanes
#include "format/quantize_lanes.h"  // the quantizer's lanes, for their branchless f16 rounding

using namespace fastllm;

static int g_passed = 0, g_failed = 0;
static ThreadPool g_pool(2);

#define CHECK(cond, ...)                                   \
    do {                                                   \
        if (cond) {                                        \
            g_passed++;                                    \
        } else {                                           \
            g_failed++;                                    \
            std::printf("FAIL %s:%d: ", __FILE__, __LINE__); \
            std::printf(__VA_ARGS__);                      \
            std::printf("\n");                             \
        }                                                  \
    } while (0)

static std::mt19937 rng(1234);
static std::vector<float> randn(size_t n, float scale = 1.0f) {
    std::normal_distribution<float> d(0.0f, scale);
    std::vector<float> v(n);
    for (auto &x : v) x = d(rng);
    return v;
}

// Largest |a-b| relative to the largest |b|.
static double rel_err(const float *a, const float *b, size_t n) {
    double diff = 0, mag = 1e-30;
    for (size_t i = 0; i < n; i++) {
        diff = std::max(diff, (double)std::fabs(a[i] - b[i]));
        mag = std::max(mag, (double)std::fabs(b[i]));
    }
    return diff / mag;
}

struct Weights {  // a matrix stored in one dtype, with its Tensor view
    std::vector<uint16_t> half;
    std::vector<float> full;
    std::vector<uint8_t> bytes;  // quantized layout (docs/flm_format.md)
    Tensor t;
};

// Quantizes full [N, K] into the .flm layout of dt (an independent C++ writer of the format).
static void quantize_weights(Weights &w, DType dt, int N, int K) {
    const int G = dtype_group(dt), groups = K / G, nmax = (1 << dtype_bits(dt)) - 1;
    w.bytes.assign(tensor_bytes(dt, N, K), 0);
    const size_t tiles = quant_tiles(N);
    uint16_t *scales = (uint16_t *)w.bytes.data();
    uint16_t *mins = scales + tiles * kTileRows * groups;
    uint8_t *quants = w.bytes.data() + quant_scales_bytes(dt, N, K);
    // Tiles of 16 rows: scales [tile][group][row], codes [tile][block (q8) or block pair (q4, q6)][4 columns][row][4];
    // q6: per pair, 8 chunks of low 4 bits as q4, then 4 chunks of the top 2 bits
    auto at = [&](int r, int g) { return (size_t)(r / kTileRows) * groups * kTileRows + (size_t)g * kTileRows + r % kTileRows; };
    // K formats: 8-bit codes [tile][group][row] (scales, then minimums), then f16 factors
    // [tile][super-block][row] (scales, then minimums); scale = factor * code.
    const int supers = (int)quant_super_blocks(K);
    uint8_t *k_codes = w.bytes.data();
    uint16_t *k_factors = (uint16_t *)(k_codes + tiles * kTileRows * groups * (dtype_has_min(dt) ? 2 : 1));
    auto at_super = [&](int r, int s) { return (size_t)(r / kTileRows) * supers * kTileRows + (size_t)s * kTileRows + r % kTileRows; };
    std::vector<float> want_scale(groups), want_min(groups);
    for (int r = 0; r < N; r++)
        for (int g = 0; g < groups; g++) {
            const float *v = &w.full[(size_t)r * K + g * G];
            float lo = v[0], hi = v[0], amax = 0;
            for (int i = 0; i < G; i++) lo = std::min(lo, v[i]), hi = std::max(hi, v[i]), amax = std::max(amax, std::fabs(v[i]));
            float scale, mn = 0;
            if (dt == DType::Q8) scale = amax / 127;
            else if (dtype_has_min(dt)) scale = (hi - lo) / nmax, mn = lo;
            else if (dtype_bits(dt) == 6) scale = amax / 32;
            else scale = amax / 8;
            float s, m;
            if (dtype_k_scales(dt)) {
                if (g % 8 == 0) {  // this super-block's factors: the largest scale and minimum on code 255
                    float smax = 0, mext = 0;
                    for (int h = g; h < std::min(groups, g + 8); h++) {
                        const float *u = &w.full[(size_t)r * K + h * G];
                        float l = u[0], x = u[0], a = 0;
                        for (int i = 0; i < G; i++) l = std::min(l, u[i]), x = std::max(x, u[i]), a = std::max(a, std::fabs(u[i]));
                        smax = std::max(smax, dtype_has_min(dt) ? (x - l) / nmax : a / 32);
                        if (std::fabs(l) > std::fabs(mext)) mext = l;
                    }
                    k_factors[at_super(r, g / 8)] = f32_to_f16(smax / 255);
                    if (dtype_has_min(dt)) k_factors[tiles * kTileRows * supers + at_super(r, g / 8)] = f32_to_f16(mext / 255);
                }
                const float fs = f16_to_f32(k_factors[at_super(r, g / 8)]);
                const int sc = fs > 0 ? std::clamp((int)std::lround(scale / fs), 0, 255) : 0;
                k_codes[at(r, g)] = (uint8_t)sc;
                s = fs * sc, m = 0;
                if (dtype_has_min(dt)) {
                    const float fm = f16_to_f32(k_factors[tiles * kTileRows * supers + at_super(r, g / 8)]);
                    const int mc = fm != 0 ? std::clamp((int)std::lround(mn / fm), 0, 255) : 0;
                    k_codes[tiles * kTileRows * groups + at(r, g)] = (uint8_t)mc;
                    m = fm * mc;
                }
            } else {
                scales[at(r, g)] = f32_to_f16(scale);
                if (dtype_has_min(dt)) mins[at(r, g)] = f32_to_f16(mn);
                s = f16_to_f32(scales[at(r, g)]), m = f16_to_f32(f32_to_f16(mn));
            }
            for (int i = 0; i < G; i++) {
                const int c = g * G + i;
                int q;
                if (dt == DType::Q8) q = std::clamp((int)std::lround(v[i] / s), -127, 127) + 128;
                else if (dtype_has_min(dt)) q = s > 0 ? std::clamp((int)std::lround((v[i] - m) / s), 0, nmax) : 0;
                else if (dtype_bits(dt) == 6) q = s > 0 ? std::clamp((int)std::lround(v[i] / s) + 32, 0, 63) : 32;
                else q = std::clamp((int)std::lround(v[i] / s) + 8, 0, 15);
                const size_t tile = (size_t)(r / kTileRows) * quant_tile_bytes(dt, K);
                const size_t in_chunk = (size_t)(r % kTileRows) * 4 + c % 4, chunk = (c % 32) / 4;
                if (dt == DType::Q8) {
                    quants[tile + ((size_t)(c / 32) * 8 + chunk) * 64 + in_chunk] = (uint8_t)q;
                } else {
                    const size_t pair = tile + (size_t)(c / 64) * 128 * dtype_bits(dt);
                    const int second = (c / 32) % 2, u = 8 * second + (int)chunk;
                    if (dtype_bits(dt) == 3) {
                        quants[pair + (u % 4) * 64 + in_chunk] |= (uint8_t)((q & 3) << (2 * (u / 4)));
                        quants[pair + (4 + u % 2) * 64 + in_chunk] |= (uint8_t)((q >> 2) << (u / 2));
                    } else {
                        quants[pair + chunk * 64 + in_chunk] |= (uint8_t)((q & 15) << (4 * second));
                    }
                    if (dtype_bits(dt) == 5)
                        quants[pair + (8 + chunk / 4) * 64 + in_chunk] |= (uint8_t)((q >> 4) << (second + 2 * (chunk % 4)));
                    if (dtype_bits(dt) == 6)
                        quants[pair + (8 + chunk / 2) * 64 + in_chunk] |= (uint8_t)((q >> 4) << (2 * second + 4 * (chunk % 2)));
                }
            }
        }
}

static Weights make_weights(DType dt, int N, int K) {
    Weights w;
    w.full = randn((size_t)N * K);
    if (dtype_is_quantized(dt)) {
        quantize_weights(w, dt, N, K);
    } else if (dt == DType::F16) {
        for (float f : w.full) w.half.push_back(f32_to_f16(f));
    } else if (dt == DType::BF16) {
        for (float f : w.full) {
            uint32_t b;
            std::memcpy(&b, &f, 4);
            w.half.push_back((uint16_t)(b >> 16));
        }
    }
    w.t.name = "w";
    w.t.dtype = dt;
    w.t.n_dims = 2;
    w.t.dims[0] = N;
    w.t.dims[1] = K;
    w.t.data = dt == DType::F32 ? (const void *)w.full.data()
               : dtype_is_quantized(dt) ? (const void *)w.bytes.data() : (const void *)w.half.data();
    return w;
}

static void test_matmul(const KernelTable &k) {
    rng.seed(1234);  // every level the same data, whatever the tests before it drew
    const DType dtypes[] = {DType::F32, DType::F16, DType::BF16, DType::Q8, DType::Q4_32, DType::Q4_64, DType::Q4_128,
                            DType::Q4M_32, DType::Q6, DType::Q4K, DType::Q6K, DType::Q3K, DType::Q5K};
    const int shapes[][3] = {{1, 37, 67}, {1, 64, 128}, {3, 37, 67}, {5, 33, 256}, {20, 70, 96}, {40, 300, 64},
                             {1, 21, 384}, {9, 40, 1024}, {2, 17, 160}, {1, 33, 576}, {5, 20, 576}, {3, 17, 1536},
                             // a few tokens (dot_rows_multi): 1-4 a sweep and the rest, tails of 8 and 1
                             {4, 19, 72}, {7, 23, 136}, {8, 9, 67}, {6, 5, 24},
                             // prompt batches (packed GEMM tiles): token counts around the tile width,
                             // rows that do not fill the last tile, q8 rows with an odd number of blocks;
                             // plain weights only: one token past the tiles, 29 and 30 rows in the last
                             // panel, rows shorter than a vector and ending past the last full one
                             {8, 16, 64}, {15, 37, 96}, {12, 20, 192}, {16, 48, 256}, {29, 33, 1536}, {64, 20, 128},
                             {13, 61, 75}, {23, 94, 40}, {10, 32, 13},
                             // AMX: 16-token tiles with a tail, K past one pass of 32 blocks, an odd block count
                             {37, 35, 1056}, {48, 16, 1088}, {17, 40, 96}};
    for (DType dt : dtypes)
        for (auto &s : shapes) {
            int T = s[0], N = s[1], K = s[2];
            if (K % dtype_row_multiple(dt) != 0) continue;
            Weights w = make_weights(dt, N, K);
            std::vector<float> x = randn((size_t)T * K), bias = randn(N), y((size_t)T * N), yr((size_t)T * N);
            std::vector<float> mem(ops::matmul_scratch_floats(K, 2, T));
            ops::matmul(k, w.t, bias.data(), x.data(), T, y.data(), ops::make_matmul_scratch(mem.data(), K, 2, T), g_pool);
            ref::matmul(w.t, bias.data(), x.data(), T, yr.data());
            double e = rel_err(y.data(), yr.data(), y.size());
            CHECK(e < 2e-6, "matmul %s %s T=%d N=%d K=%d rel err %g", isa_name(k.isa), dtype_name(dt), T, N, K, e);
            if (T > 1 && T <= KernelTable::kMultiTokens) {  // a speculative step's tokens: each as alone
                std::vector<float> y1(N);
                for (int t = 0; t < T; t++) {
                    ops::matmul(k, w.t, bias.data(), x.data() + (size_t)t * K, 1, y1.data(),
                                ops::make_matmul_scratch(mem.data(), K, 2, T), g_pool);
                    CHECK(std::memcmp(y1.data(), y.data() + (size_t)t * N, N * sizeof(float)) == 0,
                          "matmul %s %s T=%d N=%d K=%d: token %d differs from itself alone", isa_name(k.isa),
                          dtype_name(dt), T, N, K, t);
                }
            }
            // AMX and AVX-VNNI: the same bits as AVX-512, whatever the batch (AVX-512 decodes one
            // token with AVX-VNNI's pass in halves, kernels_avx2.h)
            if ((k.isa == Isa::Amx || k.isa == Isa::AvxVnni) && kernels_for(Isa::Avx512) && dtype_is_quantized(dt)) {
                std::vector<float> y512((size_t)T * N);
                ops::matmul(*kernels_for(Isa::Avx512), w.t, bias.data(), x.data(), T, y512.data(),
                            ops::make_matmul_scratch(mem.data(), K, 2, T), g_pool);
                CHECK(std::memcmp(y.data(), y512.data(), y.size() * sizeof(float)) == 0,
                      "matmul %s %s T=%d N=%d K=%d differs from avx512", isa_name(k.isa), dtype_name(dt), T, N, K);
            }
            if (dtype_is_quantized(dt)) {  // and the quantized product stays close to the exact f32 one
                Weights exact = w;
                exact.t.dtype = DType::F32;
                exact.t.data = exact.full.data();
                std::vector<float> yf((size_t)T * N);
                ref::matmul(exact.t, bias.data(), x.data(), T, yf.data());
                double q = rel_err(y.data(), yf.data(), y.size());
                // 4-bit codes over random Gaussian rows: about 0.1-0.2 relative error, more with
                // larger groups (one scale spans a wider range)
                double bound = dt == DType::Q8 ? 0.03 : dtype_bits(dt) == 6 ? 0.06 : dtype_bits(dt) == 5 ? 0.1 : dtype_bits(dt) == 3 ? 0.4 : dtype_group(dt) >= 128 ? 0.25 : 0.2;
                CHECK(q < bound, "matmul %s %s vs f32 rel err %g (bound %g)", isa_name(k.isa), dtype_name(dt), q, bound);
            }
        }
}

static void test_quantize_acts(const KernelTable &k) {
    const int n = 256;
    std::vector<float> x = randn(n, 5.0f);
    x[3] = 0;
    std::fill(x.begin() + 64, x.begin() + 96, 0.0f);  // an all-zero block
    std::vector<int8_t> q(n), qr(n);
    std::vector<float> d(n / 32), dr(n / 32), ds(n / 32), dsr(n / 32);
    std::vector<int32_t> sumr(n / 32);
    k.quantize_acts(x.data(), n, QuantActs{q.data(), d.data(), ds.data()});
    ref::quantize_acts(x.data(), n, qr.data(), dr.data(), sumr.data());
    for (int b = 0; b < n / 32; b++) dsr[b] = dr[b] * (float)sumr[b];
    CHECK(q == qr && d == dr && ds == dsr, "%s quantize_acts equals the reference", isa_name(k.isa));
}

static void test_conversions(const KernelTable &k) {
    // Every f16 bit pattern converts exactly as the scalar reference does.
    std::vector<uint16_t> all(65536);
    for (int i = 0; i < 65536; i++) all[i] = (uint16_t)i;
    std::vector<float> out(65536);
    k.to_f32[(int)DType::F16](all.data(), out.data(), 65536);
    int bad = 0;
    for (int i = 0; i < 65536; i++) {
        float r = f16_to_f32((uint16_t)i);
        if (!(std::memcmp(&r, &out[i], 4) == 0 || (std::isnan(r) && std::isnan(out[i])))) bad++;
    }
    CHECK(bad == 0, "%s f16->f32 mismatches: %d", isa_name(k.isa), bad);
    k.to_f32[(int)DType::BF16](all.data(), out.data(), 65536);
    bad = 0;
    for (int i = 0; i < 65536; i++) {
        float r = bf16_to_f32((uint16_t)i);
        if (!(std::memcmp(&r, &out[i], 4) == 0 || (std::isnan(r) && std::isnan(out[i])))) bad++;
    }
    CHECK(bad == 0, "%s bf16->f32 mismatches: %d", isa_name(k.isa), bad);
    // rows_to_f32: each row as to_f32 converts it, at the destination's stride, nothing written
    // between the rows; 37 values: a tail at every vector width.
    for (DType dt : {DType::F32, DType::F16, DType::BF16}) {
        const int rows = 5, n = 37, ldd = 41;
        const size_t stride = 53 * dtype_size(dt);
        const char *src = (const char *)all.data() + 1000;  // every bit pattern's neighbourhood
        std::vector<float> got((size_t)rows * ldd, -7.0f), want(got.size(), -7.0f);
        k.rows_to_f32[(int)dt](src, stride, rows, n, got.data(), ldd);
        for (int r = 0; r < rows; r++) k.to_f32[(int)dt](src + r * stride, want.data() + (size_t)r * ldd, n);
        CHECK(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)) == 0,
              "%s rows_to_f32 %s differs from to_f32", isa_name(k.isa), dtype_name(dt));
    }
}

// A KV cache of the given types holding rows [positions, kv_dim] of k and v.
static KvCache make_cache(const KernelTable &k, KvType tk, KvType tv, int positions, int kv_dim,
                          const std::vector<float> &kc, const std::vector<float> &vc) {
    KvCache c(1, positions + KvCache::kBlock, kv_dim, tk, tv);
    c.prepare(0, positions);
    for (int p = 0; p < positions; p++) {
        k.kv_store[(int)tk](&kc[(size_t)p * kv_dim], kv_dim, c.k_row(0, p));
        k.kv_store[(int)tv](&vc[(size_t)p * kv_dim], kv_dim, c.v_row(0, p));
    }
    return c;
}

// The reference's attention for a query run, kept for the next ISA level: each level draws the
// same data from the same seed, and the same queries, stored rows and shape give the same result
// (keyed by their bytes; a level whose store rounds a row differently gets its own). The reference
// was more than half of test_attention's time: 15 of 27 s a level under QEMU (cortex-a53).
static const std::vector<float> &ref_attention(const float *q, int T, int pos0, const KvCache &cache,
                                               const AttentionShape &sh) {
    static std::map<uint64_t, std::vector<float>> done;
    uint64_t h = 0xcbf29ce484222325ull;
    auto add = [&](const void *p, size_t n) {  // FNV-1a's mixing, a word at a time
        for (size_t i = 0; i < n; i += 8) {
            uint64_t w = 0;
            std::memcpy(&w, (const char *)p + i, std::min<size_t>(8, n - i));
            h = (h ^ w) * 0x100000001b3ull;
        }
    };
    const int meta[] = {T, pos0, sh.n_heads, sh.n_kv_heads, sh.head_dim, sh.window, sh.causal};
    const float params[] = {sh.scale, sh.softcap};
    add(meta, sizeof meta), add(params, sizeof params);
    add(q, sizeof(float) * T * sh.n_heads * sh.head_dim);
    for (int p = sh.window > 0 ? std::max(0, pos0 - sh.window + 1) : 0; p < pos0 + T; p++) {  // the rows it reads
        add(cache.k_row(0, p), cache.row_bytes_k());
        add(cache.v_row(0, p), cache.row_bytes_v());
    }
    auto [it, fresh] = done.try_emplace(h);
    if (fresh) {
        it->second.resize((size_t)T * sh.n_heads * sh.head_dim);
        ref::attention(q, T, pos0, cache, 0, sh, it->second.data());
    }
    return it->second;
}

// Attention over caches of every type, against the reference reading the same stored rows; the
// positions cross cache blocks (and the query runs begin inside one). 5 rows (decoding) take a task
// per row and head with 4 query heads a KV head, and one block with 8 (head_dim 80); 40 rows take
// blocks, the last short; head_dim 80 puts q8 heads off the 32-value blocks and leaves a
// part-filled value panel; 120 rows after 41 cross a step of 128 keys (the online rescale).
static void test_attention(const KernelTable &k) {
    for (int hd : {16, 64, 80})
        for (int T : {5, 40, 120}) {  // 120: keys past one block of 128, queries past one of 128
        const int n_heads = 8, n_kv = hd == 80 ? 1 : 2, pos0 = 41, kv_dim = n_kv * hd;
        std::vector<float> q = randn((size_t)T * n_heads * hd), kc = randn((size_t)(pos0 + T) * kv_dim),
                           vc = randn((size_t)(pos0 + T) * kv_dim);
        std::vector<float> out((size_t)T * n_heads * hd);
        std::vector<float> mem(ops::attention_scratch_floats(g_pool.n_threads(), hd, kv_dim));
        const ops::AttentionScratch scratch = ops::make_attention_scratch(mem.data(), hd, kv_dim);
        // causal; sliding windows shorter than the context (3) and than one query run (1); a scale and
        // a soft cap as Gemma 2 sets them
        const AttentionShape shapes[] = {{n_heads, n_kv, hd, 0.25f, 0.0f, 0},
                                         {n_heads, n_kv, hd, 0.25f, 0.0f, 3},
                                         {n_heads, n_kv, hd, 0.25f, 0.0f, 1},
                                         {n_heads, n_kv, hd, 0.6f, 2.0f, 4},
                                         {n_heads, n_kv, hd, 0.25f, 0.0f, 0, false}};  // an encoder's
        // The tile products (AMX, a head of a multiple of 32 values, the blocked rows) carry each f32
        // operand as two bf16 halves, 16 of its 24 bits, and drop lo * lo: about 2^-17 of each term,
        // 2.1e-5 here at worst (against 2^-11 for an f16 cache's rounding of every key and value).
        const bool tiles = k.attn_step && hd % 32 == 0;
        const double bound = tiles ? 5e-5 : 1e-5;
        for (KvType tk : {KvType::F32, KvType::F16, KvType::Q8})
            for (KvType tv : {KvType::F32, KvType::F16, KvType::Q8}) {
                const KvCache cache = make_cache(k, tk, tv, pos0 + T, kv_dim, kc, vc);
                for (const AttentionShape &sh : shapes) {
                    // Every pair of types with every shape up to 40 rows; at 120 (85% of this loop's
                    // time, most of a level's under QEMU) every pair with the causal shape and every
                    // shape with f16 keys and q8 values.
                    if (T > 40 && &sh != shapes && !(tk == KvType::F16 && tv == KvType::Q8)) continue;
                    const AttentionRun run{0, T, pos0, &cache};
                    ops::attention(k, q.data(), &run, 1, 0, sh, out.data(), scratch, g_pool);
                    double e = rel_err(out.data(), ref_attention(q.data(), T, pos0, cache, sh).data(), out.size());
                    CHECK(e < bound, "attention %s K %s V %s head %d rows %d window %d softcap %g causal %d rel err %g",
                          isa_name(k.isa), kv_type_name(tk), kv_type_name(tv), hd, T, sh.window, sh.softcap,
                          (int)sh.causal, e);
                }
            }
        // A window of 1 attends to the query's own position only: the output is its value row.
        const KvCache cache = make_cache(k, KvType::F32, KvType::F32, pos0 + T, kv_dim, kc, vc);
        const AttentionShape own{n_heads, n_kv, hd, 0.25f, 0.0f, 1};
        const AttentionRun run{0, T, pos0, &cache};
        ops::attention(k, q.data(), &run, 1, 0, own, out.data(), scratch, g_pool);
        double worst = 0;  // absolute; relative to the value with the tiles (an f32 value's 16 bits)
        for (int t = 0; t < T; t++)
            for (int h = 0; h < n_heads; h++)
                for (int i = 0; i < hd; i++) {
                    const float v = vc[(size_t)(pos0 + t) * kv_dim + (h / (n_heads / n_kv)) * hd + i];
                    const double e = std::fabs(out[((size_t)t * n_heads + h) * hd + i] - v);
                    worst = std::max(worst, tiles && T >= ops::kAttentionBlockRows ? e / std::fabs(v) : e);
                }
        CHECK(worst < (tiles ? 1e-5 : 1e-6), "attention %s rows %d window 1 is not the own value row (%g)", isa_name(k.isa), T, worst);

        // Runs of several caches in one call (sessions stepping together): each row as alone; with
        // 40 rows the last run is long enough for blocks, beside two short ones.
        const KvCache c2 = make_cache(k, KvType::Q8, KvType::F16, pos0 + T, kv_dim, vc, kc);
        const AttentionRun runs[] = {{0, 2, pos0 - 1, &cache}, {2, 1, 3, &c2}, {3, T - 3, pos0 + 3, &c2}};
        ops::attention(k, q.data(), runs, 3, 0, shapes[3], out.data(), scratch, g_pool);
        double e = 0;
        for (const AttentionRun &r : runs) {
            const std::vector<float> &want = ref_attention(q.data() + (size_t)r.first_row * n_heads * hd, r.T, r.pos0,
                                                           *r.cache, shapes[3]);
            e = std::max(e, rel_err(out.data() + (size_t)r.first_row * n_heads * hd, want.data(), want.size()));
        }
        CHECK(e < bound, "attention %s over 3 runs of 2 caches (rows %d) rel err %g", isa_name(k.isa), T, e);
        }
    // More query heads per KV head (130) than a task's block of queries (128): a KV head's heads
    // in two tasks, of 128 and 2. And 2 a KV head: a decoding row (T = 1) straight from the cache
    // over more keys (151) than a step of 128 (the online rescale of attend_direct).
    for (int n_heads : {260, 4})
    for (int T : {1, 20}) {
        const int n_kv = 2, hd = 32, pos0 = 150, kv_dim = n_kv * hd;
        std::vector<float> q = randn((size_t)T * n_heads * hd), kc = randn((size_t)(pos0 + T) * kv_dim),
                           vc = randn((size_t)(pos0 + T) * kv_dim);
        std::vector<float> out((size_t)T * n_heads * hd);
        std::vector<float> mem(ops::attention_scratch_floats(g_pool.n_threads(), hd, kv_dim));
        const ops::AttentionScratch scratch = ops::make_attention_scratch(mem.data(), hd, kv_dim);
        const KvCache cache = make_cache(k, KvType::F16, KvType::Q8, pos0 + T, kv_dim, kc, vc);
        const AttentionShape sh{n_heads, n_kv, hd, 0.25f, 0.0f, 0};
        const AttentionRun run{0, T, pos0, &cache};
        ops::attention(k, q.data(), &run, 1, 0, sh, out.data(), scratch, g_pool);
        const double e = rel_err(out.data(), ref_attention(q.data(), T, pos0, cache, sh).data(), out.size());
        CHECK(e < (k.attn_step ? 5e-5 : 1e-5), "attention %s, %d heads a KV head, rows %d: rel err %g", isa_name(k.isa),
              n_heads / n_kv, T, e);
    }
    // Decoding rows with 8 heads a KV head, 4 KV heads: on 8 threads their groups are cut into
    // blocks of fewer heads (4 for one row), which must not change a bit of the result against 2
    // threads or 1, nor a row's against the row alone (a speculative step of up to kStepRows rows).
    // f16 and f32 caches, read in place (the panels packed from their rows, or the lanes' kernel
    // reading them), and q8 ones, converted first; with a window of 100, the first step of keys
    // starts inside the window (blocks: copied, zeros before it; lanes: the keys before a row's
    // window outside its bounds) and the second is in place.
    static ThreadPool pool8(8), pool1(1);
    for (KvType kv : {KvType::F16, KvType::F32, KvType::Q8})
    for (int window : {0, 100})
    for (int T : {1, 3, kStepRows}) {
        const int n_heads = 32, n_kv = 4, hd = 64, pos0 = 150, kv_dim = n_kv * hd;
        std::vector<float> q = randn((size_t)T * n_heads * hd), kc = randn((size_t)(pos0 + T) * kv_dim),
                           vc = randn((size_t)(pos0 + T) * kv_dim);
        std::vector<float> out2((size_t)T * n_heads * hd), out8(out2.size()), out1(out2.size());
        std::vector<float> mem(ops::attention_scratch_floats(8, hd, kv_dim));
        const ops::AttentionScratch scratch = ops::make_attention_scratch(mem.data(), hd, kv_dim);
        const KvCache cache = make_cache(k, kv, kv, pos0 + T, kv_dim, kc, vc);
        const AttentionShape sh{n_heads, n_kv, hd, 0.125f, 0.0f, window};
        const AttentionRun run{0, T, pos0, &cache};
        ops::attention(k, q.data(), &run, 1, 0, sh, out2.data(), scratch, g_pool);
        ops::attention(k, q.data(), &run, 1, 0, sh, out8.data(), scratch, pool8);
        ops::attention(k, q.data(), &run, 1, 0, sh, out1.data(), scratch, pool1);
        const double e = rel_err(out8.data(), ref_attention(q.data(), T, pos0, cache, sh).data(), out8.size());
        CHECK(e < 1e-5, "attention %s, 8 heads a KV head on 8 threads, %s cache, window %d, rows %d: rel err %g",
              isa_name(k.isa), kv_type_name(kv), window, T, e);
        CHECK(std::memcmp(out2.data(), out8.data(), out2.size() * sizeof(float)) == 0 &&
                  std::memcmp(out1.data(), out8.data(), out1.size() * sizeof(float)) == 0,
              "attention %s, 8 heads a KV head, window %d, rows %d: 1, 2 and 8 threads differ", isa_name(k.isa), window, T);
        for (int r = 0; r < T && T > 1; r++) {  // each row as a step of its own
            const AttentionRun one{r, 1, pos0 + r, &cache};
            ops::attention(k, q.data(), &one, 1, 0, sh, out1.data(), scratch, g_pool);
        }
        CHECK(T == 1 || std::memcmp(out1.data(), out2.data(), out1.size() * sizeof(float)) == 0,
              "attention %s, 8 heads a KV head, window %d: a row alone differs from the step of %d rows", isa_name(k.isa),
              window, T);
    }
    // Decoding rows of 301 to 1000 keys with 3 heads a KV head (from 512 keys a task per KV head and
    // part of the keys, the parts' softmax states merged; rows whose keys split alike read them
    // together): against the reference; the same bits on 1, 2 and 8 threads; a row alone the same
    // bits as in a step of 4 or kStepRows rows (the parts go by the row's own keys); with a window
    // of 600 the parts start inside it; rows of 301-304 keys (none split), a step crossing the
    // threshold (510-513 keys: the last rows split, the first not), and 17 rows across 1024 keys
    // (1011-1027: a part's bound moves, two groups).
    for (KvType kv : {KvType::F16, KvType::Q8})
    for (int window : {0, 600})
    for (int pos0 : {300, 509, 996, 1010})
    for (int T : {4, kStepRows}) {
        if ((T > 4 && (pos0 == 300 || pos0 == 996)) || (T == 4 && pos0 == 1010)) continue;  // (QEMU's time)
        const int n_heads = 9, n_kv = 3, hd = 64, kv_dim = n_kv * hd;
        std::vector<float> q = randn((size_t)T * n_heads * hd), kc = randn((size_t)(pos0 + T) * kv_dim),
                           vc = randn((size_t)(pos0 + T) * kv_dim);
        std::vector<float> out2((size_t)T * n_heads * hd), out8(out2.size()), out1(out2.size()), alone(out2.size());
        std::vector<float> mem(ops::attention_scratch_floats(8, hd, kv_dim));
        const ops::AttentionScratch scratch = ops::make_attention_scratch(mem.data(), hd, kv_dim);
        const KvCache cache = make_cache(k, kv, kv, pos0 + T, kv_dim, kc, vc);
        const AttentionShape sh{n_heads, n_kv, hd, 0.125f, 0.0f, window};
        const AttentionRun run{0, T, pos0, &cache};
        ops::attention(k, q.data(), &run, 1, 0, sh, out2.data(), scratch, g_pool);
        ops::attention(k, q.data(), &run, 1, 0, sh, out8.data(), scratch, pool8);
        ops::attention(k, q.data(), &run, 1, 0, sh, out1.data(), scratch, pool1);
        for (int r = 0; r < T; r++) {  // each row as a step of its own
            const AttentionRun one{r, 1, pos0 + r, &cache};
            ops::attention(k, q.data(), &one, 1, 0, sh, alone.data(), scratch, g_pool);
        }
        const double e = rel_err(out2.data(), ref_attention(q.data(), T, pos0, cache, sh).data(), out2.size());
        CHECK(e < 1e-5, "attention %s, long decoding rows after %d, %s cache, window %d: rel err %g", isa_name(k.isa), pos0,
              kv_type_name(kv), window, e);
        CHECK(std::memcmp(out2.data(), out8.data(), out2.size() * sizeof(float)) == 0 &&
                  std::memcmp(out1.data(), out8.data(), out1.size() * sizeof(float)) == 0,
              "attention %s, long decoding rows after %d, window %d: 1, 2 and 8 threads differ", isa_name(k.isa), pos0, window);
        CHECK(std::memcmp(out2.data(), alone.data(), out2.size() * sizeof(float)) == 0,
              "attention %s, long decoding rows after %d, window %d: a row alone differs from the step", isa_name(k.isa), pos0,
              window);
    }
    // A prompt's blocks of rows go in groups per task, as many groups as the threads want: on 1
    // thread 6 blocks of 18 rows go in one group (two at head_dim 128: max_group), on 8 threads in
    // six, which must not change a bit;
    // with a window the steps of keys start inside a block's range. Head sizes of 2 and 4 tile
    // chunks, and one the tiles do not take (80).
    for (int window : {0, 100})
    for (int hd : {64, 80, 128}) {
        const int n_heads = 14, n_kv = 2, T = 100, pos0 = 60, kv_dim = n_kv * hd;
        std::vector<float> q = randn((size_t)T * n_heads * hd), kc = randn((size_t)(pos0 + T) * kv_dim),
                           vc = randn((size_t)(pos0 + T) * kv_dim);
        std::vector<float> out1((size_t)T * n_heads * hd), out8(out1.size());
        std::vector<float> mem(ops::attention_scratch_floats(8, hd, kv_dim));
        const ops::AttentionScratch scratch = ops::make_attention_scratch(mem.data(), hd, kv_dim);
        const KvCache cache = make_cache(k, KvType::F16, KvType::F16, pos0 + T, kv_dim, kc, vc);
        const AttentionShape sh{n_heads, n_kv, hd, 0.125f, 0.0f, window};
        const AttentionRun run{0, T, pos0, &cache};
        ops::attention(k, q.data(), &run, 1, 0, sh, out1.data(), scratch, pool1);
        ops::attention(k, q.data(), &run, 1, 0, sh, out8.data(), scratch, pool8);
        const double e = rel_err(out1.data(), ref_attention(q.data(), T, pos0, cache, sh).data(), out1.size());
        CHECK(e < (k.attn_step && hd % 32 == 0 ? 5e-5 : 1e-5), "attention %s, prompt of %d after %d, head %d window %d: rel err %g",
              isa_name(k.isa), T, pos0, hd, window, e);
        CHECK(std::memcmp(out1.data(), out8.data(), out1.size() * sizeof(float)) == 0,
              "attention %s, prompt of %d, head %d window %d: 1 and 8 threads differ", isa_name(k.isa), T, hd, window);
    }
}

// The KV row kernels against plain loops over the reference's reading of the rows; heads inside a
// q8 block (8, 16) and of whole blocks (32, 64, 128), at offsets of a head.
static void test_kv_kernels(const KernelTable &k) {
    for (KvType t : {KvType::F32, KvType::F16, KvType::Q8})
        for (int dim : {8, 16, 32, 64, 128}) {
            const int heads = 3, row_n = heads * dim, n = 37;
            const size_t stride = kv_row_bytes(t, row_n) + 8;  // rows further apart than they are long
            std::vector<float> x = randn((size_t)n * row_n), q = randn(dim), a = randn(n), back(row_n);
            std::vector<char> rows(stride * n);
            double store_err = 0, ref_store_err = 0;
            std::vector<char> ref_row(stride);
            for (int j = 0; j < n; j++) {
                k.kv_store[(int)t](&x[(size_t)j * row_n], row_n, rows.data() + j * stride);
                ref::kv_store(t, &x[(size_t)j * row_n], row_n, ref_row.data());  // the reference device's store
                // the reference's bytes (a q8 row's whole blocks and its last partial one)
                CHECK(std::memcmp(ref_row.data(), rows.data() + j * stride, kv_row_bytes(t, row_n)) == 0,
                      "kv_store %s %s, %d values: not the reference's bytes", isa_name(k.isa), kv_type_name(t), row_n);
                ref::kv_load(t, rows.data() + j * stride, row_n, back.data());
                store_err = std::max(store_err, rel_err(back.data(), &x[(size_t)j * row_n], row_n));
                ref::kv_load(t, ref_row.data(), row_n, back.data());
                ref_store_err = std::max(ref_store_err, rel_err(back.data(), &x[(size_t)j * row_n], row_n));
            }
            // f16: half an ulp (2^-11) of the largest; q8: half a step of 1/127 of a block's largest.
            const double bound = t == KvType::F32 ? 0 : t == KvType::F16 ? 4.9e-4 : 0.5 / 127 + 1e-6;
            // kv_load: the reference's values, bit for bit (one rounding: code times scale), also for
            // a row that ends inside a q8 block (dim 8, 16: 24 and 48 values)
            for (int j = 0; j < n; j++) {
                std::vector<float> got(row_n);
                k.kv_load[(int)t](rows.data() + j * stride, got.data(), row_n);
                ref::kv_load(t, rows.data() + j * stride, row_n, back.data());
                CHECK(std::memcmp(got.data(), back.data(), sizeof(float) * (size_t)row_n) == 0, "kv_load %s %s, %d values: not the reference's",
                      isa_name(k.isa), kv_type_name(t), row_n);
            }
            CHECK(store_err <= bound, "kv_store %s %s rel err %g > %g", isa_name(k.isa), kv_type_name(t), store_err, bound);
            CHECK(ref_store_err <= bound, "ref::kv_store %s rel err %g > %g", kv_type_name(t), ref_store_err, bound);
            for (int h = 0; h < heads; h++) {
                std::vector<float> y(n), yr(n), acc(dim, 0.5f), accr(dim, 0.5f);
                k.kv_dot[(int)t](rows.data(), stride, n, h * dim, q.data(), 1, dim, y.data(), 0);
                k.kv_accum[(int)t](a.data(), 0, 1, n, rows.data(), stride, h * dim, dim, acc.data(), 0);
                for (int j = 0; j < n; j++) {
                    ref::kv_load(t, rows.data() + j * stride, row_n, back.data());
                    double d = 0;
                    for (int i = 0; i < dim; i++) d += (double)q[i] * back[h * dim + i], accr[i] += a[j] * back[h * dim + i];
                    yr[j] = (float)d;
                }
                CHECK(rel_err(y.data(), yr.data(), n) < 1e-5, "kv_dot %s %s dim %d head %d rel err %g", isa_name(k.isa),
                      kv_type_name(t), dim, h, rel_err(y.data(), yr.data(), n));
                CHECK(rel_err(acc.data(), accr.data(), dim) < 1e-5, "kv_accum %s %s dim %d head %d rel err %g",
                      isa_name(k.isa), kv_type_name(t), dim, h, rel_err(acc.data(), accr.data(), dim));
            }
            // nq queries over the same rows (a KV head's query heads): query i's scores and sums are
            // those of a call with query i alone, bit for bit, and a row's score does not depend on
            // where the call starts (the rows from j0 on, alone).
            for (int nq : {2, 3, 4, 5, 7, 9, 18}) {  // a pass of 4 and what is left; a step's rows' queries
                const size_t ld = n + 3, ldo = dim + 5;  // apart by more than their lengths
                std::vector<float> qs = randn((size_t)nq * dim), as = randn((size_t)nq * ld), y((size_t)nq * ld, -1.0f),
                                   acc((size_t)nq * ldo, 0.25f);
                k.kv_dot[(int)t](rows.data(), stride, n, dim, qs.data(), nq, dim, y.data(), ld);
                k.kv_accum[(int)t](as.data(), ld, nq, n, rows.data(), stride, dim, dim, acc.data(), ldo);
                for (int i = 0; i < nq; i++) {
                    std::vector<float> y1(n), acc1(dim, 0.25f);
                    k.kv_dot[(int)t](rows.data(), stride, n, dim, &qs[(size_t)i * dim], 1, dim, y1.data(), 0);
                    k.kv_accum[(int)t](&as[(size_t)i * ld], 0, 1, n, rows.data(), stride, dim, dim, acc1.data(), 0);
                    CHECK(std::memcmp(y1.data(), &y[(size_t)i * ld], sizeof(float) * n) == 0 && y[(size_t)i * ld + n] == -1.0f,
                          "kv_dot %s %s dim %d: query %d of %d differs from itself alone", isa_name(k.isa), kv_type_name(t), dim, i, nq);
                    CHECK(std::memcmp(acc1.data(), &acc[(size_t)i * ldo], sizeof(float) * dim) == 0 && acc[(size_t)i * ldo + dim] == 0.25f,
                          "kv_accum %s %s dim %d: query %d of %d differs from itself alone", isa_name(k.isa), kv_type_name(t), dim, i, nq);
                    for (int j0 : {1, 5, n - 2}) {
                        std::vector<float> yj(n - j0);
                        k.kv_dot[(int)t](rows.data() + (size_t)j0 * stride, stride, n - j0, dim, &qs[(size_t)i * dim], 1, dim, yj.data(), 0);
                        CHECK(std::memcmp(yj.data(), &y1[j0], sizeof(float) * (n - j0)) == 0,
                              "kv_dot %s %s dim %d: rows from %d alone differ from the same rows after others", isa_name(k.isa),
                              kv_type_name(t), dim, j0);
                    }
                }
            }
        }
}

// The KV cache's blocks: allocated as positions are prepared, shared by share(), copied when a
// holder writes into a shared one, released past a length.
static void test_kv_cache_blocks() {
    const int B = KvCache::kBlock;
    KvCache a(2, 4 * B, 8, KvType::F32, KvType::F32);
    const size_t block = B * a.bytes_per_position();
    CHECK(a.bytes() == 0, "a new cache holds %zu bytes", a.bytes());
    a.prepare(0, B + 3);
    CHECK(a.bytes() == 2 * block, "%zu bytes for %d positions", a.bytes(), B + 3);
    for (int p = 0; p < B + 3; p++) ((float *)a.k_row(1, p))[0] = (float)p;
    KvCache b(2, 4 * B, 8, KvType::F32, KvType::F32);
    b.share(a, B + 3);
    CHECK(b.shared_bytes() == 2 * block && a.shared_bytes() == 2 * block, "not shared");
    CHECK(b.k_row(1, 5) == a.k_row(1, 5), "shared rows are not the same memory");
    b.prepare(B + 3, B + 4);  // writing into the shared second block copies it
    CHECK(b.k_row(1, B) != a.k_row(1, B) && b.k_row(1, 5) == a.k_row(1, 5), "copy on write copied the wrong blocks");
    CHECK(((float *)b.k_row(1, B + 2))[0] == (float)(B + 2), "the copy lost a row");
    CHECK(a.shared_bytes() == block, "after the copy, a shares %zu bytes", a.shared_bytes());
    a.release_from(1);
    CHECK(a.bytes() == block && b.shared_bytes() == block, "release_from(1) kept %zu bytes", a.bytes());
    a.release_from(0);
    CHECK(a.bytes() == 0 && b.shared_bytes() == 0 && ((float *)b.k_row(1, 7))[0] == 7.0f, "b lost the block a released");
}

// A layer with a sliding window keeps its own blocks: forget() drops those out of its window (less
// one block of slack, and the kept prefix), can_continue() says whether a context can go on from a
// length, share() keeps the holes.
static void test_kv_cache_windows() {
    const int B = KvCache::kBlock, W = 2 * B;
    KvCache a(3, 16 * B, 8, KvType::F32, KvType::F32, {0, W, W});  // layer 0 full, layers 1 and 2 windowed
    const size_t full_block = B * 8 * 4 * 2, window_block = 2 * full_block;  // 1 layer, 2 layers
    a.prepare(0, 10 * B);
    CHECK(a.bytes() == 10 * (full_block + window_block), "10 blocks: %zu bytes", a.bytes());
    ((float *)a.k_row(0, 0))[0] = 1.0f, ((float *)a.k_row(2, 9 * B))[0] = 2.0f;
    // A query at 10B sees 8B+1 .. 10B; one block of slack before 8B+1 keeps 7B .. : blocks 0 .. 6 go.
    a.forget(10 * B);
    for (int b = 0; b < 10; b++) {
        CHECK(a.holds(0, b * B), "the full layer dropped block %d", b);
        CHECK(a.holds(1, b * B) == (b >= 7) && a.holds(2, b * B) == (b >= 7), "windowed block %d: held %d", b,
              (int)a.holds(1, b * B));
    }
    CHECK(a.bytes() == 10 * full_block + 3 * window_block, "after forget: %zu bytes", a.bytes());
    CHECK(((float *)a.k_row(0, 0))[0] == 1.0f && ((float *)a.k_row(2, 9 * B))[0] == 2.0f, "forget moved rows");
    CHECK(a.can_continue(10 * B) && a.can_continue(9 * B) && a.can_continue(9 * B - 1), "the window is held");
    CHECK(!a.can_continue(9 * B - 2) && !a.can_continue(5 * B), "a query at 9B-2 sees 7B-1 .., which is dropped");
    CHECK(a.can_continue(0), "an empty context can always go on");
    CHECK(a.capacity_bytes() == 16 * full_block + (W + 2 * B) / B * window_block + window_block,
          "capacity %zu", a.capacity_bytes());
    KvCache b(3, 16 * B, 8, KvType::F32, KvType::F32, {0, W, W});
    b.share(a, 9 * B);
    CHECK(b.holds(0, 0) && !b.holds(1, 0) && b.holds(1, 8 * B) && b.k_row(2, 8 * B) == a.k_row(2, 8 * B),
          "share() of a windowed cache");
    KvCache kept(3, 16 * B, 8, KvType::F32, KvType::F32, {0, W, W}, true, B + 1);  // keeps positions 0 .. B
    kept.prepare(0, 10 * B);
    kept.forget(10 * B);
    CHECK(kept.holds(1, 0) && kept.holds(1, B) && !kept.holds(1, 2 * B) && kept.holds(1, 7 * B), "the kept prefix");
    KvCache all(3, 16 * B, 8, KvType::F32, KvType::F32, {0, W, W}, false);  // swa_full
    all.prepare(0, 10 * B);
    all.forget(10 * B);
    CHECK(all.bytes() == 10 * (full_block + window_block) && all.can_continue(B), "swa_full dropped blocks");
    KvCache c(3, 16 * B, 8, KvType::F32, KvType::F32, {0, B, B});
    bool refused = false;
    try {
        c.share(a, B);
    } catch (const Error &) {
        refused = true;
    }
    CHECK(refused, "share() between caches of different windows");
}

// swiglu and softmax use each ISA's own exp: ordinary values, and ones where exp over- or underflows.
static void test_exp_ops(const KernelTable &k) {
    // the largest value, for lengths around the vector widths and their tails, wherever it sits
    for (int len : {1, 3, 8, 15, 16, 17, 31, 32, 33, 100, 128, 131}) {
        std::vector<float> x = randn((size_t)len, 3.0f);
        for (float &v : x) v -= 20.0f;  // all negative: a maximum that starts at 0 would be wrong
        for (int at : {0, len / 2, len - 1}) {
            std::vector<float> y = x;
            y[(size_t)at] = -1.0f;
            CHECK(k.reduce_max(y.data(), len) == *std::max_element(y.begin(), y.end()), "reduce_max %s n %d at %d",
                  isa_name(k.isa), len, at);
        }
    }
    const int n = 203;
    std::vector<float> gu = randn(2 * n, 4.0f), a(n), b(n);
    const float extremes[] = {-200.0f, -104.0f, -88.0f, -87.0f, -30.0f, -1e-8f, 0.0f, 1e-8f, 30.0f, 88.0f, 100.0f};
    for (size_t i = 0; i < sizeof extremes / sizeof *extremes; i++) gu[7 * i] = extremes[i];
    ops::swiglu(k, gu.data(), n, a.data());
    ref::swiglu(gu.data(), n, b.data());
    double e = rel_err(a.data(), b.data(), n);
    CHECK(e < 1e-6, "swiglu %s rel err %g", isa_name(k.isa), e);
    ops::geglu(k, gu.data(), n, a.data());
    ref::geglu(gu.data(), n, b.data());
    e = rel_err(a.data(), b.data(), n);
    CHECK(e < 1e-6, "geglu %s rel err %g", isa_name(k.isa), e);
    ops::act(k, Act::GeluErf, gu.data(), n, a.data());
    ref::act(Act::GeluErf, gu.data(), n, b.data());
    e = rel_err(a.data(), b.data(), n);
    CHECK(e < 1e-6, "gelu_erf %s rel err %g", isa_name(k.isa), e);
    double gelu_worst = 0;  // and value by value: A&S 7.1.26's erf is within 1.5e-7
    for (int i = 0; i < n; i++) gelu_worst = std::max(gelu_worst, std::fabs((double)a[i] - b[i]) / (1.0 + std::fabs(gu[i])));
    CHECK(gelu_worst < 2e-7, "gelu_erf %s worst error %g", isa_name(k.isa), gelu_worst);
    for (float spread : {1.0f, 10.0f, 60.0f}) {
        std::vector<float> x = randn(n, spread);
        a = x, b = x;
        const float inv = 1.0f / k.exp_shift_sum(a.data(), n, *std::max_element(a.begin(), a.end()));
        for (float &v : a) v *= inv;
        ref::softmax(b.data(), n);
        e = rel_err(a.data(), b.data(), n);
        CHECK(e < 1e-6, "softmax %s spread %g rel err %g", isa_name(k.isa), spread, e);
    }
    // the soft cap, cap * tanh(x / cap), against double precision: within 4e-7 of the cap, whatever
    // a value's place (the tails take the vector steps), a NaN a NaN, infinities to +-cap
    for (float cap : {2.0f, 30.0f, 50.0f}) {
        std::vector<float> x = randn(n, cap);
        const float edges[] = {0.0f, -0.0f, 1e-8f, -1e-8f, 1e-3f, 0.3f, -0.3f, 200.0f, -200.0f, 1e30f, -1e30f};
        for (size_t i = 0; i < sizeof edges / sizeof *edges; i++) x[5 * i + 1] = edges[i] * cap;
        std::vector<float> y = x, z(x.begin() + 1, x.end());
        k.softcap(y.data(), (size_t)n, cap);
        k.softcap(z.data(), (size_t)n - 1, cap);
        double worst = 0;
        for (int i = 0; i < n; i++) worst = std::max(worst, std::fabs(y[i] - cap * std::tanh((double)x[i] / cap)) / cap);
        CHECK(worst < 4e-7, "softcap %s cap %g worst error %g of the cap", isa_name(k.isa), cap, worst);
        CHECK(std::memcmp(y.data() + 1, z.data(), sizeof(float) * (n - 1)) == 0, "softcap %s: a value's result depends on its place",
              isa_name(k.isa));
        float odd[3] = {std::nanf(""), INFINITY, -INFINITY};
        k.softcap(odd, 3, cap);
        CHECK(std::isnan(odd[0]) && odd[1] == cap && odd[2] == -cap, "softcap %s: NaN %g, inf %g, -inf %g", isa_name(k.isa),
              odd[0], odd[1], odd[2]);
    }
    // exp itself, over the whole range where floats are normal
    std::vector<float> x(n), y(n);
    double worst = 0;
    for (int i = 0; i < n; i++) x[i] = -87.0f + 175.0f * i / (n - 1);
    y = x;
    k.exp_shift_sum(y.data(), n, 0.0f);
    for (int i = 0; i < n; i++) worst = std::max(worst, std::fabs(y[i] / std::exp((double)x[i]) - 1));
    CHECK(worst < 1e-6, "exp %s max rel err %g", isa_name(k.isa), worst);
}

// The reference device's memory is no host memory: its addresses round-trip through it, a host
// pointer given to it is an error (never a read), and a KV cache on it copies blocks through it.
static void test_refdev_memory() {
    auto be = make_refdev_backend(1);
    Memory &m = be->memory();
    char *a = m.alloc(64), *b = m.alloc(64);
    CHECK(a && b && a != b && (uintptr_t)a >= ((uintptr_t)1 << 46), "refdev addresses %p %p", (void *)a, (void *)b);
    float host[16] = {1, 2, 3}, back[16] = {};
    bool refused = false;
    try {
        be->download(back, host, sizeof host);  // a host pointer where device memory belongs
    } catch (const Error &e) {
        refused = e.status() == FASTLLM_ERR_INTERNAL && std::strstr(e.what(), "not device memory");
    }
    CHECK(refused, "refdev read a host pointer");
    refused = false;
    try {
        be->download(back, a + 32, 64);  // past the end of an allocation
    } catch (const Error &e) {
        refused = e.status() == FASTLLM_ERR_INTERNAL;
    }
    CHECK(refused, "refdev read past an allocation");
    // A KV cache in its memory: rows written and read back through the backend, copy on write.
    const int B = KvCache::kBlock;
    KvCache c(1, 2 * B, 8, KvType::F32, KvType::Q8, {}, true, 0, {&m});
    c.prepare(0, B);
    const float row[8] = {1, -2, 3, -4, 5, -6, 7, -8};
    be->write_kv_row(c, 0, false, 3, KvType::F32, row);
    be->write_kv_row(c, 0, true, 3, KvType::F32, row);
    KvCache d(1, 2 * B, 8, KvType::F32, KvType::Q8, {}, true, 0, {&m});
    d.share(c, B);
    d.prepare(0, B);  // copies the shared block
    CHECK(d.k_row(0, 3) != c.k_row(0, 3), "copy on write kept the shared block");
    float k[8], v[8];
    std::vector<char> vq(d.row_bytes_v());
    be->read_kv_row(d, 0, false, 3, k);
    be->read_kv_row(d, 0, true, 3, vq.data());
    ref::kv_load(KvType::Q8, vq.data(), 8, v);
    double worst = 0;
    for (int i = 0; i < 8; i++) worst = std::max({worst, (double)std::fabs(k[i] - row[i]), (double)std::fabs(v[i] - row[i])});
    CHECK(worst < 8.0 / 127, "refdev KV rows came back off by %g", worst);
    m.free(a), m.free(b);
}

static void test_elementwise() {
    const int n = 83;
    std::vector<float> x = randn(n, 3.0f), w = randn(n), a(n), b(n);
    ops::rmsnorm(x.data(), w.data(), n, 1e-5f, a.data());
    ref::rmsnorm(x.data(), w.data(), n, 1e-5f, b.data());
    CHECK(rel_err(a.data(), b.data(), n) < 1e-6, "rmsnorm");
    std::vector<float> bias = randn(n);
    for (NormKind kind : {NormKind::Rms, NormKind::Layer}) {
        ops::norm(kind, x.data(), w.data(), bias.data(), n, 1e-5f, a.data());
        ref::norm(kind, x.data(), w.data(), bias.data(), n, 1e-5f, b.data());
        CHECK(rel_err(a.data(), b.data(), n) < 1e-6, "norm kind %d", (int)kind);
    }
    // LayerNorm's output has mean b's mean and, with w = 1 and b = 0, unit variance.
    std::vector<float> ones(n, 1.0f), zeros(n, 0.0f);
    ops::norm(NormKind::Layer, x.data(), ones.data(), zeros.data(), n, 0.0f, a.data());
    double mean = 0, var = 0;
    for (float v : a) mean += v / n;
    for (float v : a) var += (v - mean) * (v - mean) / n;
    CHECK(std::fabs(mean) < 1e-5 && std::fabs(var - 1) < 1e-4, "layernorm mean %g var %g", mean, var);


    const int heads = 3, hd = 10;
    std::vector<float> v = randn(heads * hd), cs = randn(hd / 2), sn = randn(hd / 2);
    a = v, b = v;
    for (int rope_dim : {hd, 6})  // full and partial rotary
        for (bool interleaved : {false, true}) {
            a = v, b = v;
            ops::rope(a.data(), heads, hd, rope_dim, interleaved, cs.data(), sn.data());
            ref::rope(b.data(), heads, hd, rope_dim, interleaved, cs.data(), sn.data());
            CHECK(rel_err(a.data(), b.data(), heads * hd) < 1e-6, "rope dim %d interleaved %d", rope_dim, interleaved);
            bool kept = true;  // partial rotary leaves the dims past rope_dim alone
            for (int h = 0; h < heads; h++)
                for (int i = rope_dim; i < hd; i++) kept = kept && a[h * hd + i] == v[h * hd + i];
            CHECK(kept, "rope dim %d changed dims it does not rotate", rope_dim);
        }
    // cos = 0, sin = 1 turns each pair (x0, x1) into (-x1, x0): rotate-half pairs i and i + dim/2.
    std::vector<float> c0(hd / 2, 0.0f), s1(hd / 2, 1.0f);
    a = v;
    ops::rope(a.data(), 1, hd, hd, false, c0.data(), s1.data());
    CHECK(a[0] == -v[hd / 2] && a[hd / 2] == v[0], "rotate-half pairs");
    a = v;
    ops::rope(a.data(), 1, hd, hd, true, c0.data(), s1.data());
    CHECK(a[0] == -v[1] && a[1] == v[0], "interleaved pairs");
}

static void test_f16_rounding() {
    CHECK(f16_to_f32(0x3C00) == 1.0f, "f16 1.0");
    CHECK(f16_to_f32(0xC000) == -2.0f, "f16 -2.0");
    CHECK(f16_to_f32(0x0001) == std::ldexp(1.0f, -24), "f16 smallest subnormal");
    CHECK(f16_to_f32(0x7BFF) == 65504.0f, "f16 max");
    int bad = 0;
    for (int i = 0; i < 0x7C00; i++)
        if (f32_to_f16(f16_to_f32((uint16_t)i)) != i) bad++;
    CHECK(bad == 0, "f16 round trip mismatches: %d", bad);

    // The quantizer's f16 rounding in lanes gives the scalar's bits: every float with the low 13 bits
    // near a tie (0xfff, 0x1000, 0x1001, and for subnormal f16 the tie of each shift), and a stride
    // through all 2^32 (all of them matched once, in 9 s).
    using namespace fastllm::quant::test_lanes;
    std::vector<uint32_t> patterns;
    for (uint32_t hi = 0; hi < (1u << 19); hi++)
        for (uint32_t lo : {0xfffu, 0x1000u, 0x1001u, 0u}) patterns.push_back(hi << 13 | lo);
    for (uint32_t e = 100; e < 114; e++)  // subnormal f16: the tie sits at bit 125 - e of the significand
        for (uint32_t s : {0u, 0x80000000u})
            for (int64_t k = -1; k <= 1; k++)
                for (uint32_t m = 0; m < 64; m++)
                    patterns.push_back(s | e << 23 | (uint32_t)(((m << (126 - e)) + (1u << (125 - e)) + k) & 0x7fffff));
    for (uint64_t b = 0; b < (1ull << 32); b += 4093) patterns.push_back((uint32_t)b);
    bad = 0;
    for (size_t i = 0; i + kLanes <= patterns.size(); i += kLanes) {
        const VF r = to_f16(bits<VF>(*(const VU *)&patterns[i]));
        for (int l = 0; l < kLanes; l++) {
            float v, want, got = r[l];
            std::memcpy(&v, &patterns[i + l], 4);
            want = fastllm::quant::to_f16(v);
            if (std::memcmp(&want, &got, 4)) bad++;
        }
    }
    CHECK(bad == 0, "f16 rounding in lanes: %d of %zu differ", bad, patterns.size());
}

static void test_sampler() {
    const int V = 50;
    std::vector<float> logits = randn(V, 2.0f);
    int argmax = (int)(std::max_element(logits.begin(), logits.end()) - logits.begin());
    SamplingOptions p;
    p.temperature = 0;
    p.repetition_penalty = 1;
    std::vector<float> l = logits;
    CHECK(Sampler(p, V).sample(l.data(), nullptr, 0) == argmax, "greedy picks the argmax");

    p.temperature = 1.0f;
    p.top_k = 1;
    l = logits;
    CHECK(Sampler(p, V).sample(l.data(), nullptr, 0) == argmax, "top_k=1 picks the argmax");

    p.top_k = 0;
    p.seed = 42;
    auto draw = [&](uint64_t seed) {
        p.seed = seed;
        Sampler s(p, V);
        std::vector<int> out;
        for (int i = 0; i < 20; i++) {
            std::vector<float> c = logits;
            out.push_back(s.sample(c.data(), nullptr, 0));
        }
        return out;
    };
    CHECK(draw(42) == draw(42), "same seed, same draws");
    CHECK(draw(42) != draw(43), "another seed, other draws");

    // min_p = 1 keeps only the most likely token; top_p tiny keeps only it too.
    p.min_p = 1.0f;
    l = logits;
    CHECK(Sampler(p, V).sample(l.data(), nullptr, 0) == argmax, "min_p=1 picks the argmax");
    p.min_p = 0;
    p.top_p = 1e-6f;
    l = logits;
    CHECK(Sampler(p, V).sample(l.data(), nullptr, 0) == argmax, "tiny top_p picks the argmax");

    // The draws follow the truncated distribution, worked out here the plain way (sort everything,
    // cut, renormalise): every token drawn is a survivor, and each survivor's frequency is within 5
    // standard deviations of its probability. A vocabulary past top-p's first sorted chunk (64).
    {
        const int V2 = 300, N = 40000;
        std::vector<float> lg = randn(V2, 2.5f);
        struct Case {
            int top_k;
            float top_p, min_p, temperature;
        };
        for (const Case c : {Case{0, 1.0f, 0.0f, 1.0f}, Case{20, 1.0f, 0.0f, 0.7f}, Case{0, 0.9f, 0.0f, 1.0f},
                             Case{0, 0.995f, 0.0f, 1.5f}, Case{0, 1.0f, 0.05f, 1.0f}, Case{50, 0.8f, 0.02f, 1.2f}}) {
            std::vector<std::pair<double, int>> order;
            for (int i = 0; i < V2; i++) order.emplace_back(lg[i] / c.temperature, i);
            std::sort(order.begin(), order.end(), [](auto a, auto b) { return a.first != b.first ? a.first > b.first : a.second < b.second; });
            size_t n = c.top_k > 0 ? (size_t)c.top_k : order.size();
            std::vector<double> w(n);
            double sum = 0;
            for (size_t i = 0; i < n; i++) sum += (w[i] = std::exp(order[i].first - order[0].first));
            size_t keep = n;
            double cum = 0;
            if (c.top_p < 1)
                for (size_t i = 0; i < n; i++)
                    if ((cum += w[i] / sum) >= c.top_p) {
                        keep = i + 1;
                        break;
                    }
            if (c.min_p > 0)
                for (size_t i = 0; i < keep; i++)
                    if (w[i] < c.min_p) {
                        keep = i;
                        break;
                    }
            std::vector<double> want(V2, 0.0);
            double kept_sum = 0;
            for (size_t i = 0; i < keep; i++) kept_sum += w[i];
            for (size_t i = 0; i < keep; i++) want[order[i].second] = w[i] / kept_sum;
            SamplingOptions o;
            o.temperature = c.temperature, o.top_k = c.top_k, o.top_p = c.top_p, o.min_p = c.min_p, o.seed = 7;
            Sampler smp(o, V2);
            std::vector<int> count(V2, 0);
            for (int d = 0; d < N; d++) {
                std::vector<float> cl = lg;
                count[smp.sample(cl.data(), nullptr, 0)]++;
            }
            // tokens expected 10 times or more one by one, the rarer ones as one bucket
            double worst = 0, rare_want = 0, rare_got = 0;
            bool outside = false;
            auto z = [&](double got, double p) { return p > 0 ? std::fabs(got / N - p) / std::sqrt(p * (1 - p) / N) : 0.0; };
            for (int i = 0; i < V2; i++) {
                if (want[i] == 0 && count[i] > 0) outside = true;
                if (want[i] * N >= 10) worst = std::max(worst, z(count[i], want[i]));
                else rare_want += want[i], rare_got += count[i];
            }
            if (rare_want * N >= 10) worst = std::max(worst, z(rare_got, rare_want));
            else CHECK(rare_got <= 30, "sampler: %g draws of tokens expected %g times", rare_got, rare_want * N);
            CHECK(!outside, "sampler top_k %d top_p %g min_p %g: drew a token the truncation removes", c.top_k, c.top_p, c.min_p);
            CHECK(worst < 5.0, "sampler top_k %d top_p %g min_p %g: a frequency %g standard deviations off", c.top_k, c.top_p,
                  c.min_p, worst);
        }
    }

    // A strong repetition penalty moves greedy away from a token already in the history.
    p = SamplingOptions{};
    p.temperature = 0;
    p.repetition_penalty = 1e6f;
    l = logits;
    int32_t hist[1] = {argmax};
    CHECK(Sampler(p, V).sample(l.data(), hist, 1) != argmax, "repetition penalty");
}

static void test_thread_pool() {
    // Every index is visited exactly once per job, many jobs over, with thread indices in range;
    // chunks are claimed concurrently, so the counts are atomic.
    for (int threads : {1, 2, 3, 5}) {
        ThreadPool pool(threads);
        for (int64_t n : {0, 1, 2, 7, 100, 1000}) {
            std::vector<std::atomic<int>> hits((size_t)n);
            std::atomic<bool> bad_thread{false};
            for (int rep = 0; rep < 200; rep++)
                pool.parallel_for(n, [&](int64_t b, int64_t e, int t) {
                    if (t < 0 || t >= threads) bad_thread = true;
                    for (int64_t i = b; i < e; i++) hits[i]++;
                });
            bool ok = !bad_thread;
            for (auto &h : hits) ok = ok && h == 200;
            CHECK(ok, "thread pool of %d threads covers [0, %lld) exactly once per job", threads, (long long)n);
        }
    }
    // The workers do take chunks: a job slow enough for them to wake is shared.
    ThreadPool pool(2);
    std::atomic<int> by_worker{0};
    pool.parallel_for(64, [&](int64_t b, int64_t e, int t) {
        std::this_thread::sleep_for(std::chrono::milliseconds(2 * (e - b)));
        if (t == 1) by_worker += (int)(e - b);
    });
    CHECK(by_worker > 0, "a worker took part in a 128 ms job (%d of 64 items)", by_worker.load());
}

static void test_text_stream() {
    std::string got;
    auto cb = [](const char *t, size_t n, void *u) -> int {
        static_cast<std::string *>(u)->append(t, n);
        return 0;
    };
    {
        TextStream s({"STOP"}, cb, &got);
        CHECK(!s.push("Hello ST"), "no stop yet");
        CHECK(got == "Hello ", "held back a possible stop prefix: '%s'", got.c_str());
        CHECK(!s.push("ART "), "not a stop string");
        CHECK(s.push("and STO") == false && s.push("P here"), "stop found across pieces");
        CHECK(got == "Hello START and ", "text before the stop string only: '%s'", got.c_str());
    }
    got.clear();
    {
        TextStream s({}, cb, &got);
        s.push("caf\xC3");  // "é" split across two tokens
        CHECK(got == "caf", "incomplete UTF-8 held back: '%s'", got.c_str());
        s.push("\xA9!");
        s.finish();
        CHECK(got == "caf\xC3\xA9!", "completed character delivered");
    }
    CHECK(sanitize_utf8("a\xFF" "b") == "a\xEF\xBF\xBD" "b", "invalid byte replaced");
    CHECK(utf8_complete_prefix("ab\xE2\x96") == 2, "partial 3-byte char cut");
}

// A device backend's ops (Vulkan) against the reference ops: every weight dtype and shape class,
// the norms, GLUs, soft cap, attention over KV blocks of every type (windows, soft cap, several
// runs), the KV row copies and a context shift's rotation. Inputs reach the device the way a
// model's do: as weights (prepare_weights), embedded rows (embed) and KV rows (write_kv_row).
struct DeviceCase {
    Backend &be;
    std::vector<std::unique_ptr<Weights>> keep;  // prepared weights must stay where they were
    std::vector<char *> blocks;

    const Tensor &weight(Weights w) {
        keep.push_back(std::make_unique<Weights>(std::move(w)));
        Weights &k = *keep.back();
        k.t.data = k.t.dtype == DType::F32 ? (const void *)k.full.data()
                   : dtype_is_quantized(k.t.dtype) ? (const void *)k.bytes.data() : (const void *)k.half.data();
        be.prepare_weights({&k.t});
        return k.t;
    }
    const Tensor &vector(const std::vector<float> &v) {
        Weights w;
        w.full = v;
        w.t.name = "v", w.t.dtype = DType::F32, w.t.n_dims = 1, w.t.dims[0] = (int64_t)v.size();
        return weight(std::move(w));
    }
    // rows [T, n] of x in fresh device memory.
    float *upload(const std::vector<float> &x, int T) {
        const int n = (int)(x.size() / T);
        Weights w;
        w.full = x;
        w.t.name = "x", w.t.dtype = DType::F32, w.t.n_dims = 2, w.t.dims[0] = T, w.t.dims[1] = n;
        const Tensor &t = weight(std::move(w));
        float *d = (float *)be.memory().alloc(x.size() * sizeof(float));
        blocks.push_back((char *)d);
        std::vector<int32_t> ids(T);
        for (int i = 0; i < T; i++) ids[i] = i;
        be.embed(t, ids.data(), T, 1.0f, d);
        return d;
    }
    float *alloc(size_t n) {
        blocks.push_back(be.memory().alloc(n * sizeof(float)));
        return (float *)blocks.back();
    }
    std::vector<float> down(const float *d, size_t n) {
        std::vector<float> h(n);
        be.download(h.data(), d, n * sizeof(float));
        return h;
    }
    ~DeviceCase() {
        be.finish();
        for (char *b : blocks) be.memory().free(b);
    }
};

static void test_device_backend(const char *device) {
    std::unique_ptr<Backend> be;
    try {
        be = make_backend(BackendOptions{1, device});
    } catch (const Error &e) {
        std::printf("backend %s: not tested here (%s)\n", device, e.what());
        return;
    }
    std::printf("backend %s: %s\n", device, be->describe().c_str());
    DeviceCase dc{*be};
    const DType dtypes[] = {DType::F32, DType::F16, DType::BF16, DType::Q8, DType::Q4_32, DType::Q4_64, DType::Q4_128,
                            DType::Q4M_32, DType::Q6, DType::Q4K, DType::Q6K, DType::Q3K, DType::Q5K};
    // one row (a decode step), a few, a prompt's worth; rows of a tile and tails; K of one and many
    // super-blocks and groups; rows of a float W that are no whole 64-bit loads (K % 4 != 0)
    const int shapes[][3] = {{1, 37, 64}, {3, 16, 128}, {9, 70, 256}, {20, 33, 384}, {1, 5, 1536}, {1, 9, 30}, {5, 9, 30}};
    for (DType dt : dtypes)
        for (auto &sh : shapes) {
            const int T = sh[0], N = sh[1], K = sh[2];
            if (K % dtype_row_multiple(dt) != 0) continue;
            Weights w = make_weights(dt, N, K);
            std::vector<float> x = randn((size_t)T * K), bias = randn(N), yr((size_t)T * N);
            ref::matmul(w.t, bias.data(), x.data(), T, yr.data());
            const Tensor &W = dc.weight(w);
            float *dx = dc.upload(x, T), *dy = dc.alloc((size_t)T * N);
            Arena scratch(be->memory());  // the backend's scratch (quantized activations), planned then carved
            be->carve(scratch, PassShape{K, T, 64});
            scratch.allocate();
            be->carve(scratch, PassShape{K, T, 64});
            be->matmul(W, dc.vector(bias), dx, T, dy);
            std::vector<float> y = dc.down(dy, (size_t)T * N);
            double e = rel_err(y.data(), yr.data(), y.size());
            CHECK(e < 2e-6, "%s matmul %s T=%d N=%d K=%d rel err %g", device, dtype_name(dt), T, N, K, e);
            // embed: rows of the matrix, scaled
            std::vector<int32_t> ids = {N - 1, 0, N / 2};
            float *de = dc.alloc((size_t)3 * K);
            be->embed(W, ids.data(), 3, 0.5f, de);
            std::vector<float> emb = dc.down(de, (size_t)3 * K), embr((size_t)3 * K);
            for (int r = 0; r < 3; r++)
                for (int c = 0; c < K; c++) embr[(size_t)r * K + c] = ref::weight(w.t, ids[r], c) * 0.5f;
            CHECK(rel_err(emb.data(), embr.data(), emb.size()) < 1e-6, "%s embed %s K=%d", device, dtype_name(dt), K);
        }

    // norms (RMS and LayerNorm with bias), the residual add with a post-norm, GLUs, soft cap
    for (int n : {83, 896}) {
        const int T = 3;
        std::vector<float> x = randn((size_t)T * n, 3.0f), d = randn((size_t)T * n), w = randn(n), b = randn(n), pw = randn(n);
        for (NormKind kind : {NormKind::Rms, NormKind::Layer}) {
            float *dx = dc.upload(x, T), *out = dc.alloc((size_t)T * n);
            be->norm(kind, 1e-5f, dc.vector(w), kind == NormKind::Layer ? dc.vector(b) : Tensor{}, dx, T, n, out);
            std::vector<float> got = dc.down(out, (size_t)T * n), want((size_t)T * n);
            for (int t = 0; t < T; t++) ref::norm(kind, &x[(size_t)t * n], w.data(), b.data(), n, 1e-5f, &want[(size_t)t * n]);
            CHECK(rel_err(got.data(), want.data(), got.size()) < 1e-5, "%s norm kind %d n=%d", device, (int)kind, n);

            float *dd = dc.upload(d, T);
            dx = dc.upload(x, T);
            be->add_norm(kind, 1e-5f, dc.vector(pw), dd, dx, dc.vector(w), kind == NormKind::Layer ? dc.vector(b) : Tensor{}, T, n, dd);
            std::vector<float> xs = dc.down(dx, (size_t)T * n), o = dc.down(dd, (size_t)T * n), xr = x, orf((size_t)T * n);
            for (int t = 0; t < T; t++) {
                std::vector<float> dn(n);
                ref::norm(kind, &d[(size_t)t * n], pw.data(), nullptr, n, 1e-5f, dn.data());
                for (int i = 0; i < n; i++) xr[(size_t)t * n + i] += dn[i];
                ref::norm(kind, &xr[(size_t)t * n], w.data(), b.data(), n, 1e-5f, &orf[(size_t)t * n]);
            }
            CHECK(rel_err(xs.data(), xr.data(), xs.size()) < 1e-5 && rel_err(o.data(), orf.data(), o.size()) < 1e-5,
                  "%s add_norm kind %d n=%d", device, (int)kind, n);
        }
        std::vector<float> gu = randn((size_t)T * 2 * n, 3.0f);
        for (Act kind : {Act::Silu, Act::GeluTanh, Act::GeluErf, Act::Tanh}) {
            float *dg = dc.upload(gu, T), *out = dc.alloc((size_t)T * n);
            be->glu(kind, dg, T, n, out);
            std::vector<float> got = dc.down(out, (size_t)T * n), want((size_t)T * n);
            for (int t = 0; t < T; t++) ref::glu(kind, &gu[(size_t)t * 2 * n], n, &want[(size_t)t * n]);
            CHECK(rel_err(got.data(), want.data(), got.size()) < 1e-5, "%s glu kind %d n=%d", device, (int)kind, n);
            // the activation alone (a non-gated MLP), in place
            dg = dc.upload(gu, T);
            be->act(kind, dg, (size_t)T * 2 * n, dg);
            got = dc.down(dg, (size_t)T * 2 * n);
            want.resize(got.size());
            ref::act(kind, gu.data(), gu.size(), want.data());
            CHECK(rel_err(got.data(), want.data(), got.size()) < 1e-5, "%s act kind %d n=%d", device, (int)kind, n);
        }
        float *dx = dc.upload(x, T);
        be->softcap(dx, (size_t)T * n, 2.5f);
        std::vector<float> got = dc.down(dx, (size_t)T * n), want = x;
        for (float &v : want) v = (float)(2.5 * std::tanh(v / 2.5));
        CHECK(rel_err(got.data(), want.data(), got.size()) < 1e-5, "%s softcap n=%d", device, n);
    }

    // attention over caches of every type in the device's memory, against the reference over the
    // same rows in host caches; a context shift's rotation of the keys
    for (int hd : {6, 16, 24, 64, 160}) {  // all but 160 split by key as well (attention.comp); 6: no whole 64-bit loads
        const int n_heads = 8, n_kv = 2, pos0 = 41, T = 5, kv_dim = n_kv * hd, P = pos0 + T;
        std::vector<float> q = randn((size_t)T * n_heads * hd), kc = randn((size_t)P * kv_dim), vc = randn((size_t)P * kv_dim);
        const AttentionShape shapes[] = {{n_heads, n_kv, hd, 0.25f, 0.0f, 0}, {n_heads, n_kv, hd, 0.25f, 0.0f, 3},
                                         {n_heads, n_kv, hd, 0.6f, 2.0f, 40}, {n_heads, n_kv, hd, 0.25f, 0.0f, 0, false}};
        for (KvType tk : {KvType::F32, KvType::F16, KvType::Q8})
            for (KvType tv : {KvType::F32, KvType::F16, KvType::Q8}) {
                KvCache dev(1, P + KvCache::kBlock, kv_dim, tk, tv, {}, true, 0, {&be->memory()}), host(1, P + KvCache::kBlock, kv_dim, tk, tv);
                dev.prepare(0, P), host.prepare(0, P);
                for (int p = 0; p < P; p++) {
                    be->write_kv_row(dev, 0, false, p, KvType::F32, &kc[(size_t)p * kv_dim]);
                    be->write_kv_row(dev, 0, true, p, KvType::F32, &vc[(size_t)p * kv_dim]);
                    ref::kv_store(tk, &kc[(size_t)p * kv_dim], kv_dim, host.k_row(0, p));
                    ref::kv_store(tv, &vc[(size_t)p * kv_dim], kv_dim, host.v_row(0, p));
                }
                std::vector<char> row(kv_row_bytes(tk, kv_dim));
                be->read_kv_row(dev, 0, false, 17, row.data());
                if (tk != KvType::Q8) {
                    CHECK(std::memcmp(row.data(), host.k_row(0, 17), row.size()) == 0, "%s KV row %s stored as the CPU stores it",
                          device, kv_type_name(tk));
                } else {  // GLSL's division is exact to 2.5 ulp only: a scale may differ in its last bits, a
                          // code on a rounding boundary by one
                    bool close = true;
                    for (int b = 0; b * kKvQ8Block < kv_dim; b++) {
                        const float d = kv_q8_scale(row.data(), b), dh = kv_q8_scale(host.k_row(0, 17), b);
                        close = close && std::fabs(d - dh) <= 4e-7f * dh;
                        for (int i = 0; i < kKvQ8Block; i++)
                            close = close && std::abs(kv_q8_codes(row.data(), b)[i] - kv_q8_codes(host.k_row(0, 17), b)[i]) <= 1;
                    }
                    CHECK(close, "%s KV row q8 stored as the CPU stores it, to a scale's last bits and a code's rounding", device);
                }
                float *dq = dc.upload(q, T), *dout = dc.alloc((size_t)T * n_heads * hd);
                for (const AttentionShape &sh : shapes) {
                    // two runs of one cache: a step's row at an early position, then a prompt's rows
                    const AttentionRun druns[] = {{0, 1, 9, &dev}, {1, T - 1, pos0 + 1, &dev}};
                    be->attention(dq, druns, 2, 0, sh, dout);
                    std::vector<float> got = dc.down(dout, (size_t)T * n_heads * hd), want(got.size());
                    ref::attention(q.data(), 1, 9, host, 0, sh, want.data());
                    ref::attention(q.data() + (size_t)n_heads * hd, T - 1, pos0 + 1, host, 0, sh, want.data() + (size_t)n_heads * hd);
                    double e = rel_err(got.data(), want.data(), got.size());
                    CHECK(e < 1e-5, "%s attention K %s V %s head %d window %d softcap %g rel err %g", device, kv_type_name(tk),
                          kv_type_name(tv), hd, sh.window, sh.softcap, e);
                }
                // a shift down by 7 of positions [20, P), keys rotated (partial, interleaved rope), from
                // the rows the device holds
                const int delta = 7, rope_dim = hd / 2;
                std::vector<std::vector<char>> ks0(P, std::vector<char>(kv_row_bytes(tk, kv_dim))), vs0(P, std::vector<char>(kv_row_bytes(tv, kv_dim)));
                for (int p = 0; p < P; p++) be->read_kv_row(dev, 0, false, p, ks0[p].data()), be->read_kv_row(dev, 0, true, p, vs0[p].data());
                std::vector<float> cs = randn(rope_dim / 2), sn = randn(rope_dim / 2);
                const KeyShift ks{n_kv, hd, rope_dim, true, cs.data(), sn.data()};
                be->shift_cache(dev, 0, 20, P - 20, delta, ks);
                std::vector<float> want(kv_dim), got(kv_dim);
                std::vector<char> vrow(kv_row_bytes(tv, kv_dim));
                double e = 0;
                for (int p = 20; p < P; p++) {
                    ref::kv_load(tk, ks0[p].data(), kv_dim, want.data());
                    ref::rope(want.data(), n_kv, hd, rope_dim, true, cs.data(), sn.data());
                    be->read_kv_row(dev, 0, false, p - delta, row.data());
                    ref::kv_load(tk, row.data(), kv_dim, got.data());
                    e = std::max(e, rel_err(got.data(), want.data(), kv_dim));
                    be->read_kv_row(dev, 0, true, p - delta, vrow.data());
                    e = std::max(e, std::memcmp(vrow.data(), vs0[p].data(), vrow.size()) == 0 ? 0.0 : 1.0);
                }
                const double bound = tk == KvType::F32 ? 1e-6 : tk == KvType::F16 ? 2e-3 : 2.0 / 127;
                CHECK(e < bound, "%s shift_cache K %s V %s rel err %g", device, kv_type_name(tk), kv_type_name(tv), e);
            }
    }
    // a host pointer is refused, not dereferenced
    std::vector<float> host_x(64);
    bool refused = false;
    try {
        be->download(host_x.data(), host_x.data(), 64);
    } catch (const Error &e) {
        refused = e.status() == FASTLLM_ERR_INTERNAL;
    }
    CHECK(refused, "%s read a host pointer", device);
}

// test_kernels [ISA...]: the kernel tables of the ISAs named (default: all), then the rest.
// Under QEMU a run per emulated CPU tests only its new level (tests/test_platforms.py).
int main(int argc, char **argv) {
    for (Isa isa : {Isa::Scalar, Isa::Avx2, Isa::AvxVnni, Isa::Avx512, Isa::Amx, Isa::Neon, Isa::NeonDot}) {
        bool named = argc == 1;
        for (int i = 1; i < argc; i++) named |= std::strcmp(argv[i], isa_name(isa)) == 0;
        if (!named) continue;
        const KernelTable *k = kernels_for(isa);
        if (!k) {
            std::printf("ISA %s: not supported by this CPU/build, not tested here\n", isa_name(isa));
            continue;
        }
        std::printf("ISA %s\n", isa_name(isa));
        test_matmul(*k);
        test_quantize_acts(*k);
        test_conversions(*k);
        test_attention(*k);
        test_exp_ops(*k);
        test_kv_kernels(*k);
    }
    test_elementwise();
    test_kv_cache_blocks();
    test_kv_cache_windows();
    test_refdev_memory();
    test_device_backend("vulkan");
    test_f16_rounding();
    test_sampler();
    test_text_stream();
    test_thread_pool();
    std::printf("%d passed, %d failed\n", g_passed, g_failed);
    return g_failed ? 1 : 0;
}
