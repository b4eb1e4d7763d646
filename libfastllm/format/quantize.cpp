// quantize.cpp — the converter's quantizer in C++ (converter/quantize.py calls it through
// fastllm_quantize; its numpy search is the reference twin). Both must give the same bytes, so this
// follows numpy's arithmetic step for step: float32 products and quotients, float64 quotients where
// numpy divides a float32 array by a float64 scalar (a linspace step), and every sum over a group in
// numpy's pairwise order (8 running sums, then added in pairs, then to numpy's initial 0). The files
// are built with -ffp-contract=off: a fused multiply-add would round differently. The symmetric
// formats', q4m's and the K formats' searches run over groups in vector lanes (quantize_lanes.h), and
// multiply by a reciprocal only where that provably rounds as numpy's division does.
#include "format/quantize.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <thread>
#include <vector>

#include "base/error.h"
#include "base/half.h"
#include "format/quantize_common.h"
#include "platform/platform.h"

#define FASTLLM_QUANT_LANES 4
#define FASTLLM_QUANT_NAMESPACE base
#include "format/quantize_lanes.h"

namespace fastllm {

namespace {

using quant::kInf;
using quant::kMaxGroup;

// np.clip(np.rint(v), lo, hi) for finite v and integer bounds (clipping first gives the same); NaN
// gives lo. Adding and subtracting 1.5 * 2^23 rounds to an integer, ties to even, as rint does
// (only the sign of a zero can differ, and no sum, product or code depends on it).
inline float round_clip(float v, float lo, float hi) {
    v = v > lo ? v : lo;
    v = v < hi ? v : hi;
    const float magic = 12582912.0f;
    return (v + magic) - magic;
}

// quantize.py's _codes: the codes of x on scale d (0 divides by inf, giving code 0), into q.
inline void codes(const float *x, int n, float d, float lo, float hi, float *q) {
    const float dd = d != 0 ? d : kInf;
    for (int i = 0; i < n; i++) q[i] = round_clip(x[i] / dd, lo, hi);
}

// The first index of the largest |x|, as np.abs(x).argmax().
inline int argmax_abs(const float *x, int n) {
    int at = 0;
    for (int i = 1; i < n; i++)
        if (std::fabs(x[i]) > std::fabs(x[at])) at = i;
    return at;
}

// A symmetric format's code range [-neg, pos] and the zero its codes are stored around (q8 leaves
// the code 0 unused, so that -w is as exact as w).
struct Symmetric {
    int neg, pos, zero;
};
inline Symmetric symmetric_range(int bits) {
    if (bits == 8) return {127, 127, 128};
    return {1 << (bits - 1), (1 << (bits - 1)) - 1, 1 << (bits - 1)};
}

// _k_codes for one row: per super-block of 8 groups, the value of largest magnitude on code 255.
void k_codes(const float *v, int n_groups, uint8_t *code, uint16_t *factor) {
    constexpr int per = kSuperBlock / 32;
    for (int s = 0; s * per < n_groups; s++) {
        const int g0 = s * per, n = std::min(per, n_groups - g0);
        const uint16_t h = f32_to_f16(v[g0 + argmax_abs(v + g0, n)] / 255.0f);
        const float f = f16_to_f32(h);
        factor[s] = h;
        for (int g = g0; g < g0 + n; g++) code[g] = f != 0 ? (uint8_t)round_clip(v[g] / f, 0.0f, 255.0f) : 0;
    }
}

// Where a quantized matrix's parts lie in its bytes (format/tensor.h has the layout).
struct Layout {
    DType t;
    int64_t rows, cols, tiles, groups, supers;
    int G, bits;
    bool has_min, k;
    uint8_t *out;
    quant::LaneSearch search;

    uint8_t *tile_codes(int64_t tile) const {
        return out + quant_scales_bytes(t, rows, cols) + tile * quant_tile_bytes(t, cols);
    }
    // f16 scales (minimums: kind 1) [tile][group][16]
    uint16_t &scale(int kind, int64_t r, int64_t g) const {
        return ((uint16_t *)out)[(kind * tiles + r / kTileRows) * groups * kTileRows + g * kTileRows + r % kTileRows];
    }
    // K formats: 8-bit codes [tile][group][16], then f16 factors [tile][super-block][16] (kind 1: minimums)
    uint8_t &k_code(int kind, int64_t r, int64_t g) const {
        return out[(kind * tiles + r / kTileRows) * groups * kTileRows + g * kTileRows + r % kTileRows];
    }
    uint16_t &k_factor(int kind, int64_t r, int64_t s) const {
        uint16_t *f = (uint16_t *)(out + tiles * groups * kTileRows * (has_min ? 2 : 1));
        return f[(kind * tiles + r / kTileRows) * supers * kTileRows + s * kTileRows + r % kTileRows];
    }
};

// A thread's room for one row's scales, made before the threads start (so none of them allocates).
struct RowScratch {
    std::vector<float> d, m;
    std::vector<uint8_t> code;
    std::vector<uint16_t> factor;
    std::vector<uint8_t> row_codes;  // the row's stored codes, one per column
    std::vector<float> widened;      // the row as float32, where it came as 16-bit floats
};

// The searches' width in lanes: the widest the CPU has (AVX-512's 16, AVX2's 8, else the baseline's
// 4), lowered as the kernels are by FASTLLM_ISA=avxvnni or avx2 (AVX2's width) or scalar.
quant::LaneSearch lane_search() {
    const char *isa = std::getenv("FASTLLM_ISA");
    const bool scalar = isa && !std::strcmp(isa, "scalar"), avx2 = scalar || (isa && (!std::strcmp(isa, "avx2") || !std::strcmp(isa, "avxvnni")));
    const platform::CpuFeatures &cpu = platform::cpu_features();
    if (quant::kAvx512Search.search && cpu.avx512 && !avx2) return quant::kAvx512Search;
    if (quant::kAvx2Search.search && cpu.avx2 && !scalar) return quant::kAvx2Search;
    return {quant::base::kLanes,      quant::base::search_symmetric, quant::base::search_k_min,
            quant::base::search_k_sym, quant::base::search_q4m,       quant::widen_f16_scalar};
}

// One row: its groups' scales searched and stored, its codes written into the row's tile.
void quantize_row(const Layout &L, const float *x, int64_t r, RowScratch &S) {
    float *d = S.d.data(), *m = S.m.data();
    const Symmetric sym = symmetric_range(L.bits);
    // The searches in lanes: W groups a batch, a last batch's missing lanes repeat its first group
    const int W = L.search.lanes;
    float xt[kMaxGroup * quant::kMaxLanes], dl[quant::kMaxLanes], ml[quant::kMaxLanes] = {};
    uint8_t ct[kMaxGroup * quant::kMaxLanes];
    for (int64_t g0 = 0; g0 < L.groups; g0 += W) {
        const int n = (int)std::min<int64_t>(W, L.groups - g0);
        for (int l = 0; l < W; l++)
            for (int i = 0; i < L.G; i++) xt[i * W + l] = x[(g0 + (l < n ? l : 0)) * L.G + i];
        if (!L.k && L.has_min) L.search.search_q4m(xt, L.G, dl, ml);
        else if (!L.k) L.search.search(xt, L.G, sym.neg, sym.pos, sym.zero, dl, ct);
        else if (L.has_min) L.search.search_k_min(xt, (1 << L.bits) - 1, dl, ml);
        else L.search.search_k_sym(xt, sym.neg, sym.pos, dl);
        for (int l = 0; l < n; l++) d[g0 + l] = dl[l], m[g0 + l] = ml[l];
        // The symmetric search gave the codes too, in the row's order: taking them lane by lane
        // here took about 6% of an int4 conversion's CPU time (its byte stores reloaded L.G each time).
        if (!L.k && !L.has_min) std::memcpy(&S.row_codes[g0 * L.G], ct, (size_t)(n * L.G));
    }
    if (L.k) {  // the scales (minimums) become codes of f16 factors; the weights are rounded on those
        for (int kind = 0; kind < (L.has_min ? 2 : 1); kind++) {
            float *v = kind ? m : d;
            k_codes(v, (int)L.groups, S.code.data(), S.factor.data());
            for (int64_t g = 0; g < L.groups; g++) {
                L.k_code(kind, r, g) = S.code[g];
                v[g] = f16_to_f32(S.factor[g / (kSuperBlock / 32)]) * (float)S.code[g];
            }
            for (int64_t s = 0; s < L.supers; s++) L.k_factor(kind, r, s) = S.factor[s];
        }
    } else {
        for (int64_t g = 0; g < L.groups; g++) {
            L.scale(0, r, g) = f32_to_f16(d[g]);
            if (L.has_min) L.scale(1, r, g) = f32_to_f16(m[g]);
        }
    }
    // round_to_grid: codes in [0, 2^bits - 1] above the minimum, or symmetric around the zero (the
    // symmetric search gave its codes)
    if (L.k || L.has_min) {
        const int zero = L.has_min ? 0 : sym.zero;
        const float lo = L.has_min ? 0.0f : (float)-sym.neg, hi = L.has_min ? (float)((1 << L.bits) - 1) : (float)sym.pos;
        float t[kMaxGroup], q[kMaxGroup];
        for (int64_t g = 0; g < L.groups; g++) {
            const float *xg = x + g * L.G;
            if (L.has_min) {
                for (int j = 0; j < L.G; j++) t[j] = xg[j] - m[g];
                xg = t;
            }
            codes(xg, L.G, d[g], lo, hi, q);
            for (int j = 0; j < L.G; j++) S.row_codes[g * L.G + j] = (uint8_t)((int)q[j] + zero);
        }
    }
    tile_put_row(L.tile_codes(r / kTileRows), L.bits, (int)(r % kTileRows), S.row_codes.data(), L.cols);
}

// Zeroes what tiles [t0, t1) hold (their scales, minimums or K codes and factors, their codes) and
// the padding between the scales and the codes.
void clear_tiles(const Layout &L, int64_t t0, int64_t t1) {
    const int kinds = L.has_min ? 2 : 1;
    const int64_t r0 = t0 * kTileRows, n = t1 - t0;
    uint8_t *scales_end;
    for (int kind = 0; kind < kinds; kind++) {
        if (L.k) {
            std::memset(&L.k_code(kind, r0, 0), 0, (size_t)(n * L.groups * kTileRows));
            std::memset(&L.k_factor(kind, r0, 0), 0, (size_t)(n * L.supers * kTileRows) * 2);
        } else {
            std::memset(&L.scale(kind, r0, 0), 0, (size_t)(n * L.groups * kTileRows) * 2);
        }
    }
    if (L.k) scales_end = (uint8_t *)&L.k_factor(kinds - 1, 0, 0) + L.tiles * L.supers * kTileRows * 2;
    else scales_end = (uint8_t *)&L.scale(kinds - 1, 0, 0) + L.tiles * L.groups * kTileRows * 2;
    std::memset(scales_end, 0, (size_t)(L.tile_codes(0) - scales_end));
    std::memset(L.tile_codes(t0), 0, (size_t)(n * (int64_t)quant_tile_bytes(L.t, (uint64_t)L.cols)));
}

}  // namespace

void quantize_matrix(DType t, WeightBits bits, const void *w, int64_t rows, int64_t cols, int64_t first_row,
                     int64_t n_rows, int n_threads, uint8_t *out) {
    if (!dtype_is_known((uint32_t)t) || !dtype_is_quantized(t))
        fail(FASTLLM_ERR_INVALID_ARGUMENT, "%s is not a quantized dtype", dtype_name(t));
    if (rows <= 0 || cols <= 0 || cols % dtype_row_multiple(t))
        fail(FASTLLM_ERR_INVALID_ARGUMENT, "%s needs rows of a multiple of %d weights, not [%lld, %lld]", dtype_name(t),
             dtype_row_multiple(t), (long long)rows, (long long)cols);
    const int64_t end = first_row + n_rows;
    if (first_row < 0 || n_rows <= 0 || end > rows || first_row % kTileRows || (n_rows % kTileRows && end != rows))
        fail(FASTLLM_ERR_INVALID_ARGUMENT,
             "rows %lld to %lld of %lld: the first must be a multiple of %d, and so the count unless they end the matrix",
             (long long)first_row, (long long)end, (long long)rows, kTileRows);
    Layout L{t, rows, cols, (int64_t)quant_tiles((uint64_t)rows), cols / dtype_group(t),
             (int64_t)quant_super_blocks((uint64_t)cols), dtype_group(t), dtype_bits(t), dtype_has_min(t),
             dtype_k_scales(t), out, lane_search()};
    // 16-bit weights: each row widened into the thread's float32 row first
    void (*const widen)(const uint16_t *, int64_t, float *) =
        bits == WeightBits::F16 ? L.search.widen_f16 : bits == WeightBits::BF16 ? quant::widen_bf16 : nullptr;
    const int64_t t0 = first_row / kTileRows, t1 = (end + kTileRows - 1) / kTileRows;
    clear_tiles(L, t0, t1);  // codes are ORed in, and a last tile's padding rows stay 0
    // A tile at a time to whichever thread is free (a row's bytes are its own, but its tile's lie
    // together). Fixed ranges left a thread idle whenever another process or the converter's own
    // writer took the other's core: an int4 conversion of the 1.1B shape took 9.6 s instead of 10.8
    // from the f32 folder, 10.7 instead of 11.9 from the f16 GGUF (medians of 4 alternating runs, AMD
    // EPYC, 2 cores, 2026-12-06).
    const int64_t n = std::max<int64_t>(1, std::min<int64_t>(n_threads, t1 - t0));
    std::vector<RowScratch> scratch((size_t)n);
    for (RowScratch &S : scratch)
        S.d.resize((size_t)L.groups), S.m.resize((size_t)L.groups), S.code.resize((size_t)L.groups),
            S.factor.resize((size_t)L.supers), S.row_codes.resize((size_t)cols),
            S.widened.resize(widen ? (size_t)cols : 0);
    std::atomic<int64_t> next{t0};
    auto work = [&](int64_t k) {
        RowScratch &S = scratch[(size_t)k];
        for (int64_t tile; (tile = next.fetch_add(1, std::memory_order_relaxed)) < t1;)
            for (int64_t r = tile * kTileRows; r < std::min(end, (tile + 1) * kTileRows); r++) {
                const size_t at = (size_t)((r - first_row) * cols);
                if (widen) widen((const uint16_t *)w + at, cols, S.widened.data());
                quantize_row(L, widen ? S.widened.data() : (const float *)w + at, r, S);
            }
    };
    std::vector<std::thread> threads;
    try {
        for (int64_t k = 1; k < n; k++) threads.emplace_back(work, k);
    } catch (...) {  // a thread that could not start: finish on those that did, then report
        for (auto &th : threads) th.join();
        throw;
    }
    work(0);
    for (auto &th : threads) th.join();
}

}  // namespace fastllm
