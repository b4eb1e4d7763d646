// kernels.h — the innermost loops, one implementation per instruction set.
//
// Each ISA file (kernels_scalar.cpp; kernels_avx2.cpp, kernels_avx512.cpp on x86-64;
// kernels_neon.cpp, kernels_neon_dot.cpp on aarch64) fills a KernelTable; only the file compiled
// for an ISA uses its instructions, and kernels() picks the best table the CPU supports at run time
// (CPUID on x86-64, getauxval(AT_HWCAP) on aarch64 Linux), so one binary runs everywhere.
// The environment variable FASTLLM_ISA names a level to lower the choice to: scalar, avx2, avx512 or
// amx on x86-64; scalar, neon or neon_dotprod on aarch64.
#pragma once

#include <cstddef>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "arch/kv_format.h"
#include "base/half.h"
#include "cpu/tile_layout.h"
#include "format/tensor.h"

namespace fastllm {

// Neon: the Advanced SIMD of every aarch64 CPU; NeonDot: Neon plus the int8 dot product (SDOT,
// Armv8.2's optional DotProd: Cortex-A55/A75 and later, Neoverse, Apple M). Amx: AVX-512 with a
// prompt's quantized products on Intel's tile matrix unit (AMX-INT8, Sapphire Rapids and later).
// AvxVnni: AVX2 with AVX-VNNI's 256-bit vpdpbusd for the quantized products (Intel's cores without
// AVX-512 from Alder Lake on; between Avx2 and Avx512).
enum class Isa { Scalar = 0, Avx2 = 1, Avx512 = 2, Neon = 3, NeonDot = 4, Amx = 5, AvxVnni = 6 };
const char *isa_name(Isa isa);

// Activations quantized to int8 in blocks of 32 for the integer dot products: x[i] ~ d[b] * q[i]
// with b = i / 32, and ds[b] = d[b] * (sum of the block's q), for the zero-point and minimum
// corrections: dot(w, x) = sum_b dw_b * (d_b * dot(code, q) - z * ds_b) [+ min_b * ds_b].
constexpr int kActBlock = 32;
struct QuantActs {
    int8_t *q;  // K
    float *d;   // K / 32
    float *ds;  // K / 32
    // For tables with acts_by_block: d and ds again, block-major (block b of token t at
    // [b * by_block_stride + t]), so that a kernel finds a block's factors of consecutive tokens side
    // by side. Filled by ops::matmul after the quantizer; nullptr otherwise.
    float *d_by_block = nullptr, *ds_by_block = nullptr;
    size_t by_block_stride = 0;
};

// The SIMD kv_dot / kv_accum take a KV head's queries up to 4 at a time, their count a constant
// of the code (registers): f(std::integral_constant<int, H>, h) for queries [h, h + H) of nq.
template <typename F>
inline void by_queries(int nq, F &&f) {
    for (int h = 0; h < nq; h += 4) switch (nq - h) {
        case 1: f(std::integral_constant<int, 1>{}, h); break;
        case 2: f(std::integral_constant<int, 2>{}, h); break;
        case 3: f(std::integral_constant<int, 3>{}, h); break;
        default: f(std::integral_constant<int, 4>{}, h); break;
        }
}

// A table's kv_dot / kv_accum from a kernel of one query: each query in turn.
using KvDotOne = void (*)(const void *rows, size_t stride, int n, int off, const float *q, int dim, float *y);
using KvAccumOne = void (*)(const float *a, int n, const void *rows, size_t stride, int off, int dim, float *y);
template <KvDotOne One>
void kv_dot_each(const void *rows, size_t stride, int n, int off, const float *q, int nq, int dim, float *y, size_t ldy) {
    for (int i = 0; i < nq; i++) One(rows, stride, n, off, q + (size_t)i * dim, dim, y + (size_t)i * ldy);
}
template <KvAccumOne One>
void kv_accum_each(const float *a, size_t lda, int nq, int n, const void *rows, size_t stride, int off, int dim,
                   float *y, size_t ldy) {
    for (int i = 0; i < nq; i++) One(a + (size_t)i * lda, n, rows, stride, off, dim, y + (size_t)i * ldy);
}

// A table's dot_rows_multi from its dot_rows: a few rows at a time, each token in turn (the rows
// read again from L1 or L2), so that every token gets the bits dot_rows gives it alone.
using DotRows = void (*)(const void *w, size_t stride, int rows, const float *x, int n, float *y);
template <DotRows One>
void dot_rows_each(const void *w, size_t stride, int rows, const float *x, int n, int n_tok, float *y, size_t ldy) {
    constexpr int kRows = 4;
    for (int r = 0; r < rows; r += kRows)
        for (int t = 0; t < n_tok; t++)
            One((const char *)w + (size_t)r * stride, stride, rows - r < kRows ? rows - r : kRows, x + (size_t)t * n, n,
                y + (size_t)t * ldy + r);
}

struct KernelTable {
    Isa isa;
    // y[r] = dot(row r of w, x) for r < rows; row r starts at (char*)w + r*stride, holds n weights
    // of the table's dtype. Plain dtypes (f32, f16, bf16).
    void (*dot_rows[3])(const void *w, size_t stride, int rows, const float *x, int n, float *y);
    // dst[i] = float(src[i]) for n elements. Plain dtypes.
    void (*to_f32[3])(const void *src, float *dst, int n);
    // to_f32 of `rows` rows of n elements, row r at (char*)src + r*stride, into dst + r*ldd (a
    // decoding row's value panels, converted from the KV cache's rows a panel a call).
    void (*rows_to_f32[3])(const void *src, size_t stride, int rows, int n, float *dst, size_t ldd);
    // out[i] = silu(gate[i]) * up[i], with gate = gate_up[0, n) and up = gate_up[n, 2n).
    void (*swiglu)(const float *gate_up, int n, float *out);
    // out[i] = gelu_tanh(gate[i]) * up[i] (Gemma's GeGLU), computed as g * up / (1 + exp(-2u)),
    // u = sqrt(2/pi) (g + 0.044715 g^3): the same exp as swiglu's, no tanh.
    void (*geglu)(const float *gate_up, int n, float *out);
    // out[i] = gelu(x[i]), the exact (erf) GELU of BERT's MLP, erf by Abramowitz and Stegun 7.1.26
    // (|error| < 1.5e-7) through the same exp; out may be x. MiniLM: std::erf took 20% of a pass.
    void (*gelu_erf)(const float *x, size_t n, float *out);
    // x[i] = cap * tanh(x[i] / cap): Gemma 2's soft cap of attention scores and logits (a tanh a
    // score: std::tanh took 6.5 ns a value on an AMD EPYC Zen 5, about what a score's products take
    // at head_dim 256).
    // SIMD tables: tanh(v) = (1 - t) / (1 + t), t = exp(-2|v|), v's sign; the last values go through
    // the same vector steps, so that a value's result does not depend on its place in x.
    void (*softcap)(float *x, size_t n, float cap);
    // x[i] = exp(x[i] - shift) for n elements; returns their sum (softmax).
    float (*exp_shift_sum)(float *x, int n, float shift);
    // The largest of x[0, n), n >= 1 (a softmax's shift).
    float (*reduce_max)(const float *x, int n);
    // Quantizes n (a multiple of 32) activations.
    void (*quantize_acts)(const float *x, int n, const QuantActs &out);
    // y[t * ldy + r] = dot(row r of the tile w, activations of token t) for r < rows (<= 16), rows of
    // length n, and n_tok tokens whose activations follow each other in x (q by n, d and ds by
    // n / 32). Indexed by DType (the quantized ones).
    using QuantDot = void (*)(const QuantTile &w, int rows, int n, const QuantActs &x, int n_tok, float *y, size_t ldy);
    QuantDot dot_rows_quant[kNumDTypes];
    // The KV cache, read in place by attention; indexed by KvType (tensor.h has the row layouts).
    // Rows follow each other every `stride` bytes; a head is the values [off, off + dim) of a row.
    // nq queries read the same rows (the query heads of one KV head), each row converted once for
    // all of them; query i's results do not depend on nq or on the queries beside it, nor a row's
    // on its place among the n.
    // kv_dot: y[i * ldy + j] = dot(head of row j, q + i * dim) for j < n, i < nq (attention scores).
    void (*kv_dot[kNumKvTypes])(const void *rows, size_t stride, int n, int off, const float *q, int nq, int dim,
                                float *y, size_t ldy);
    // kv_accum: y[i * ldy + d] += sum over j < n of a[i * lda + j] * value d of the head of row j,
    // for d < dim, i < nq (weighted values).
    void (*kv_accum[kNumKvTypes])(const float *a, size_t lda, int nq, int n, const void *rows, size_t stride, int off,
                                  int dim, float *y, size_t ldy);
    // One row of n values to and from f32 (q8 rounds half to even, as quantize_acts does).
    void (*kv_store[kNumKvTypes])(const float *x, int n, void *row);
    void (*kv_load[kNumKvTypes])(const void *row, float *x, int n);
    // dot_rows for n_tok (<= kMultiTokens) tokens at once: y[t * ldy + r] = dot(row r of w, x + t * n),
    // each weight read from memory once for all of them (a step verifying speculative drafts: 2-17
    // rows), every token's result bit for bit what dot_rows gives it alone (so that greedy output
    // is the same with drafts). Plain dtypes.
    static constexpr int kMultiTokens = 17;  // kStepRows (arch/kv_cache.h; ops.cpp checks)
    void (*dot_rows_multi[3])(const void *w, size_t stride, int rows, const float *x, int n, int n_tok, float *y,
                              size_t ldy);
    // Prompt batches over plain weights: a panel of up to kGemmCols weight rows, packed k-major as
    // f32 (p[k * kGemmCols + j] = weight k of row j, zero past the panel's rows), times n_tok tokens:
    // y[t * ldy + j] = sum over k < n of p[k * kGemmCols + j] * x[t * ldx + k], for j < cols. The
    // tokens stream past the panel a few at a time, their sums in registers for the whole of n.
    static constexpr int kGemmCols = 32;
    // Packs rows (<= kGemmCols) of n weights of a plain dtype, row r at (char*)w + r*stride, into
    // such a panel: p[k * kGemmCols + j] = float(weight k of row j), 0 for j >= rows.
    void (*gemm_pack[3])(const void *w, size_t stride, int rows, int n, float *p);
    void (*gemm_panel)(const float *p, int n, const float *x, size_t ldx, int n_tok, float *y, size_t ldy, int cols);
    // dot_rows_quant reads QuantActs' block-major factors (AMX).
    bool acts_by_block = false;

    // A prompt's attention products on a matrix unit (AMX-BF16); nullptr where the ISA has none
    // (the attention then packs panels for gemm_panel). For nq <= kAttnQueries query rows and
    // n <= kAttnKeys keys, rows of hd floats (hd a multiple of 32). Each f32 operand is split into
    // two bf16 halves (x = hi + lo + a rest below 2^-17 |x|; an f16 key or value is hi + lo exactly)
    // and three products are summed in f32: hi*hi + hi*lo + lo*hi, dropping lo*lo (below 2^-17 of
    // each term). The operands are converted once into the unit's layouts (attn_tile_halves each),
    // so that the keys of a step serve every block of queries that reads them:
    // attn_queries: the queries q[i * hd + d] into qt (rows past nq, to a multiple of 32, zero).
    // attn_keys / attn_vals: keys / values k[j * hd + d] into kt / vt.
    // attn_step: one step of the online softmax of query rows i < nq over keys j < n, each row over
    //   its keys [lo[i], hi[i]), the scores in units of log2 (the queries scaled by log2(e)), soft-
    //   capped to cap * tanh(s / cap) where cap > 0: with the row's running maximum m[i] and total
    //   l[i] (both updated), p[i][j] = 2^(score - m[i]), the row's weighted values o[i * hd ...]
    //   are scaled by 2^(old m[i] - m[i]) and p[i][j] * value j added, 32 rows at a time: o holds
    //   32-row multiples (rows past nq are read and written).
    static constexpr int kAttnQueries = 128, kAttnKeys = 128;
    void (*attn_queries)(const float *q, int nq, int hd, uint16_t *qt) = nullptr;
    void (*attn_keys)(const float *k, int n, int hd, uint16_t *kt) = nullptr;
    void (*attn_vals)(const float *v, int n, int hd, uint16_t *vt) = nullptr;
    void (*attn_step)(const uint16_t *qt, int nq, int hd, const uint16_t *kt, const uint16_t *vt, int n, const int *lo,
                      const int *hi, float cap, float *m, float *l, float *o) = nullptr;

    // A decoding row's attention, its queries in lanes (nullptr: decoding rows go in blocks, as a
    // prompt's do): a KV head's queries go through each key and value together, 8 to a vector, the
    // key and value rows read where they lie (no panel packed, no copy) and the softmax taken for 8
    // queries a vector op. Indexed by the KV rows' type (f32 and f16; q8 rows are converted to f32
    // first). 8 * nv queries q[i * hd + d] (scaled) over n keys, row j's head at (char*)k + j * ldk,
    // its values at (char*)v + j * ldv (hd values each, hd a multiple of 8): one step of the online
    // softmax. Query i takes keys lo[i] <= j < hi[i] (bounds may lie outside [0, n)). Its score s_j:
    // 8 sums t_r of key times query over the d = r (mod 8), each from zero in order of d, then ((t0 +
    // t1) + (t2 + t3)) + ((t4 + t5) + (t6 + t7)); soft-capped to cap * tanh(s_j / cap) where cap >
    // 0. With M = max(m[i], its scores) (m[i] = -inf before any key), p_j = exp(s_j - M) and a =
    // exp(m[i] - M) (a number where that is NaN: no key yet), l[i] = l[i] * a + (sum of its p_j from
    // zero in order of j), o[i * hd + d] = o[i * hd + d] * a + (sum of p_j * value d of row j
    // likewise), m[i] = M. A key outside a query's bounds changes none of its sums, so a query's
    // results do not depend on the queries, keys or lanes beside it. s: room for 8 * nv * n floats.
    // The AVX2 tables' (and AVX-VNNI's, built on them); AVX-512's keep the blocks, whose products
    // are 16 lanes wide (not measured against these).
    using AttnLanes = void (*)(const float *q, int nv, int hd, const void *k, size_t ldk, const void *v, size_t ldv,
                               int n, const int *lo, const int *hi, float cap, float *m, float *l, float *o, float *s);
    AttnLanes attn_lanes[kNumKvTypes] = {};
};
// The bf16 halves (uint16_t) of 128 rows (queries, keys or values) of hd values, in the tile
// products' layouts: twice 128 * hd.
inline size_t attn_tile_halves(int hd) { return (size_t)2 * KernelTable::kAttnKeys * hd; }

// Calls f(std::bool_constant<kK>, std::bool_constant<kMin>) for the form of the tile's scales (kK:
// a K format's codes times factors; kMin: minimums), so that a kernel decides them once per tile.
// Only the forms a dtype of kBits-wide codes has are compiled (kDTypes), and one of them is the
// tile's: quant_tile sets its pointers from the same table. Each ISA's file passes its own lambda,
// so no instantiation is shared between files compiled for different instruction sets.
constexpr bool has_scale_form(int bits, bool k, bool min) {
    for (const DTypeTraits &d : kDTypes)
        if (d.quantized && d.bits == bits && d.k_scales == k && d.has_min == min) return true;
    return false;
}
template <int kBits, typename F>
inline void with_scale_form(const QuantTile &w, F &&f) {
    const bool k = w.k_scale != nullptr, min = w.has_min();
    if constexpr (has_scale_form(kBits, false, false))
        if (!k && !min) return f(std::false_type{}, std::false_type{});
    if constexpr (has_scale_form(kBits, false, true))
        if (!k && min) return f(std::false_type{}, std::true_type{});
    if constexpr (has_scale_form(kBits, true, false))
        if (k && !min) return f(std::true_type{}, std::false_type{});
    if constexpr (has_scale_form(kBits, true, true))
        if (k && min) return f(std::true_type{}, std::true_type{});
}

// `plain` with dot_rows_quant of every quantized dtype set to the ISA's kernel for its code width
// (for_bits(8 / 6 / 4)), so that a new quantized dtype is one row of kDTypes (tensor.h).
inline KernelTable with_quant_kernels(KernelTable plain, KernelTable::QuantDot (*for_bits)(int bits)) {
    for (const DTypeTraits &d : kDTypes) plain.dot_rows_quant[(int)d.type] = d.quantized ? for_bits(d.bits) : nullptr;
    return plain;
}

// The tables this build and CPU can run; nullptr for an ISA the CPU (or build) lacks.
const KernelTable *kernels_for(Isa isa);
// Best supported ISA of this architecture, lowered by FASTLLM_ISA if set to one of its levels (an
// unknown name, or one of another architecture, leaves the best). Decided once per process.
const KernelTable &kernels();

// Decoding reads each weight once, straight from memory: the kernels prefetch the lines
// kPrefetchAhead bytes past those they load (the quantized tiles' codes, plain rows). The hardware
// prefetcher alone kept the int8 1.1B shape's generation at 84% of the read bandwidth (2 threads,
// AVX-512 Xeon); 2 KiB ahead gave 23.4 tokens/s, 8 KiB 23.7, 32 KiB 22.4, none 21.0. Alternating
// runs (bench_before_after.py): int8 1.10-1.13x, int4 1.04x, q4_k_m 1.06x; at FASTLLM_ISA=avx2
// 1.24x, 1.06x, 1.03x. Prefetching the tiles' scales as well changed nothing. Into L2 (prefetcht1),
// not L1: with prefetcht0 the int4 decode kernel's samples sat on the prefetches themselves (L1's
// fill buffers full); into L2 int4 decodes at 1.13x, int8 1.05x, q4_k_m 1.11x (avx2: 1.09x, 1.06x,
// 1.04x). 16 KiB ahead into L2 gave the same as 8 KiB. On an AMD EPYC Zen 3 (AVX2) none, 2, 4, 8
// and 16 KiB ahead, into L1 or L2, streamed within the noise of each other (build/bench_quant_decode
// 2 3 q4,q8,q4k: 22-28 GB/s a round).
constexpr size_t kPrefetchAhead = 8192;
inline void prefetch_ahead(const void *p, size_t bytes) {
    for (size_t i = 0; i < bytes; i += 64) __builtin_prefetch((const char *)p + kPrefetchAhead + i, 0, 2);
}
// Token counts up to stream_tokens(bits) stream the weights: each tile is read from memory once, by
// the first pass over it, whose loads are prefetched (later passes find it in cache), and every
// pass takes the codes as they lie. More tokens go as a prompt's do, codes narrower than a byte
// decoded once a tile where that pays. 3-, 5- and 6-bit codes, the costliest to decode, stream up
// to 8 tokens; 4- and 8-bit ones up to a step's rows (KernelTable::kMultiTokens): at 9-17 tokens
// (AMD EPYC Zen 5, 2 threads, build/bench_quant_decode 2 5 DTYPES N, against a limit of 8) AVX-512
// 1.03-1.5x, AVX-VNNI 1.04-1.4x, AVX2 (whose passes only gain the prefetches) 1.15-1.27x; 3- and
// 5-bit codes 0.9x that way on AVX-512, 6-bit ones 0.9x at 17 tokens on AVX-VNNI.
constexpr int stream_tokens(int bits) { return bits == 4 || bits == 8 ? KernelTable::kMultiTokens : 8; }
// Token t's view of activations quantized for n_tok tokens of n values each.
inline QuantActs token_acts(const QuantActs &x, int n, int t) {
    QuantActs v{x.q + (size_t)t * n, x.d + (size_t)t * (n / kActBlock), x.ds + (size_t)t * (n / kActBlock)};
    if (x.d_by_block) v.d_by_block = x.d_by_block + t, v.ds_by_block = x.ds_by_block + t, v.by_block_stride = x.by_block_stride;
    return v;
}

// Fills the KV kernels with the portable ones (the SIMD tables then replace what they speed up).
void set_scalar_kv_kernels(KernelTable &t);

// Per-ISA factories (each defined in its own file; absent ones return nullptr).
const KernelTable *scalar_kernels();
const KernelTable *avx2_kernels();
const KernelTable *avxvnni_kernels();
const KernelTable *avx512_kernels();
const KernelTable *amx_kernels();
const KernelTable *neon_kernels();
const KernelTable *neon_dot_kernels();

// gelu_tanh(g) = g / (1 + exp(g (kGeluC1 + kGeluC3 g^2))): -2 sqrt(2/pi) and -2 sqrt(2/pi) 0.044715
constexpr float kGeluC1 = -1.5957691216057308f, kGeluC3 = -0.07135481627159473f;
// erf(x) = 1 - t (kErfA1 + t (kErfA2 + ... + t kErfA5)) exp(-x^2), t = 1 / (1 + kErfP x), x >= 0
constexpr float kErfP = 0.3275911f, kErfA1 = 0.254829592f, kErfA2 = -0.284496736f, kErfA3 = 1.421413741f,
                kErfA4 = -1.453152027f, kErfA5 = 1.061405429f;
// The scalar tail of every ISA's gelu_erf (and the scalar table's).
inline float gelu_erf_scalar(float v) {
    const float x = std::fabs(v) * 0.70710678f, t = 1.0f / (1.0f + kErfP * x);
    const float y = 1.0f - t * (kErfA1 + t * (kErfA2 + t * (kErfA3 + t * (kErfA4 + t * kErfA5)))) * std::exp(-x * x);
    return 0.5f * v * (1.0f + (v < 0 ? -y : y));
}
// Row i's (< 16) scale and minimum (0 for symmetric dtypes) of group g in a tile, as floats.
inline float tile_scale(const QuantTile &w, int64_t g, int i) {
    if (w.k_scale) return f16_to_f32(w.k_scale[(g / 8) * kTileRows + i]) * (float)w.k_scale_code[g * kTileRows + i];
    return f16_to_f32(w.scales[g * kTileRows + i]);
}
inline float tile_min(const QuantTile &w, int64_t g, int i) {
    if (w.k_min) return f16_to_f32(w.k_min[(g / 8) * kTileRows + i]) * (float)w.k_min_code[g * kTileRows + i];
    return w.mins ? f16_to_f32(w.mins[g * kTileRows + i]) : 0.0f;
}

}  // namespace fastllm
