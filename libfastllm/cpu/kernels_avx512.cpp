// AVX-512 (F, BW, VL, VNNI) kernels. This file alone is compiled with -mavx512f -mavx512bw -mavx512vl
// -mavx512vnni; its table is used only when CPUID reports those features.
#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "cpu/kernels.h"
#include "cpu/kernels_avx2.h"
#include "cpu/kernels_avx512.h"

namespace fastllm {

namespace {

inline __m512 load16_f32(const void *p, int i) { return _mm512_loadu_ps((const float *)p + i); }
inline __m512 load16_f16(const void *p, int i) {
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)p + i)));
}
inline __m512 load16_bf16(const void *p, int i) {
    __m512i v = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)((const uint16_t *)p + i)));
    return _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
}
inline __m256 load8_f32(const void *p, int i) { return _mm256_loadu_ps((const float *)p + i); }
inline __m256 load8_f16(const void *p, int i) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)p + i))); }
inline __m256 load8_bf16(const void *p, int i) {
    __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)((const uint16_t *)p + i)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
}
inline float load1_f32(const void *p, int i) { return ((const float *)p)[i]; }
inline float load1_f16(const void *p, int i) { return f16_to_f32(((const uint16_t *)p)[i]); }
inline float load1_bf16(const void *p, int i) { return bf16_to_f32(((const uint16_t *)p)[i]); }

inline float hsum(__m512 v) { return _mm512_reduce_add_ps(v); }


template <__m512 (*Load16)(const void *, int), float (*Load1)(const void *, int)>
void to_f32(const void *src, float *dst, int n) {
    int i = 0;
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(dst + i, Load16(src, i));
    for (; i < n; i++) dst[i] = Load1(src, i);
}

template <__m512 (*Load16)(const void *, int), float (*Load1)(const void *, int)>
void rows_to_f32(const void *src, size_t stride, int rows, int n, float *dst, size_t ldd) {
    for (int r = 0; r < rows; r++)
        to_f32<Load16, Load1>((const char *)src + (size_t)r * stride, dst + (size_t)r * ldd, n);
}

// Plain weights, a speculative step's tokens (dot_rows_multi), in 512-bit vectors with the
// arithmetic of AVX2's dot_rows, which is this table's decoding kernel: its four chains of 8 lanes
// two to a register (chain 0 in lanes 0-7 of the first, chain 1 in lanes 8-15), the last vector of
// 8 into chain 0, the same tree of adds, the same scalar tail. So every token gets the bits a
// decoding step gives it, at twice the rate of 256-bit products (what matters here: 17 tokens
// make the products the bound). R rows x NT tokens share each load: 24 of the 32 registers.
inline __m256 high8(__m512 v) { return _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)); }  // no AVX512DQ
inline float hsum8(__m256 v) {  // AVX2's hsum, operation for operation
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
template <__m512 (*Load16)(const void *, int), __m256 (*Load8)(const void *, int), float (*Load1)(const void *, int),
          int R, int NT>
void dot_tile_tokens(const char *w, size_t stride, const float *x, int n, float *y, size_t ldy) {
    // The loops unrolled (GCC kept a[] in memory otherwise: each product a load and a store)
    __m512 a[R][NT][2];
#pragma GCC unroll 16
    for (int e = 0; e < R * NT; e++) a[e / NT][e % NT][0] = a[e / NT][e % NT][1] = _mm512_setzero_ps();
    int i = 0;
    const size_t elem = n ? stride / (size_t)n : 0;  // bytes per weight (rows are whole)
    for (; i + 32 <= n; i += 32) {
#pragma GCC unroll 2
        for (int r = 0; r < R; r++) prefetch_ahead(w + (size_t)r * stride + i * elem, 32 * elem);
#pragma GCC unroll 2
        for (int c = 0; c < 2; c++) {
            __m512 wv[R];
#pragma GCC unroll 2
            for (int r = 0; r < R; r++) wv[r] = Load16(w + (size_t)r * stride, i + 16 * c);
#pragma GCC unroll 8
            for (int t = 0; t < NT; t++) {
                const __m512 xv = _mm512_loadu_ps(x + (size_t)t * n + i + 16 * c);
#pragma GCC unroll 2
                for (int r = 0; r < R; r++) a[r][t][c] = _mm512_fmadd_ps(wv[r], xv, a[r][t][c]);
            }
        }
    }
    for (; i + 8 <= n; i += 8) {  // chain 0 only: lanes 0-7
        __m512 wv[R];
#pragma GCC unroll 2
        for (int r = 0; r < R; r++) wv[r] = _mm512_zextps256_ps512(Load8(w + (size_t)r * stride, i));
#pragma GCC unroll 8
        for (int t = 0; t < NT; t++) {
            const __m512 xv = _mm512_maskz_loadu_ps(0xFF, x + (size_t)t * n + i);
#pragma GCC unroll 2
            for (int r = 0; r < R; r++) a[r][t][0] = _mm512_mask3_fmadd_ps(wv[r], xv, a[r][t][0], 0xFF);
        }
    }
#pragma GCC unroll 16
    for (int e = 0; e < R * NT; e++) {
        const int r = e / NT, t = e % NT;
        const __m512 a01 = a[r][t][0], a23 = a[r][t][1];
        const __m256 c01 = _mm256_add_ps(_mm512_castps512_ps256(a01), high8(a01));
        const __m256 c23 = _mm256_add_ps(_mm512_castps512_ps256(a23), high8(a23));
        float s = hsum8(_mm256_add_ps(c01, c23));
        for (int j = i; j < n; j++) s = std::fma(Load1(w + (size_t)r * stride, j), x[(size_t)t * n + j], s);
        y[(size_t)t * ldy + r] = s;
    }
}

template <__m512 (*Load16)(const void *, int), __m256 (*Load8)(const void *, int), float (*Load1)(const void *, int), int R>
void dot_rows_tokens(const char *w, size_t stride, const float *x, int n, int n_tok, float *y, size_t ldy) {
    constexpr int NT = 6;
    for (int t = 0; t < n_tok; t += NT) {
        const float *xt = x + (size_t)t * n;
        float *yt = y + (size_t)t * ldy;
        switch (std::min(NT, n_tok - t)) {
        case 1: dot_tile_tokens<Load16, Load8, Load1, R, 1>(w, stride, xt, n, yt, ldy); break;
        case 2: dot_tile_tokens<Load16, Load8, Load1, R, 2>(w, stride, xt, n, yt, ldy); break;
        case 3: dot_tile_tokens<Load16, Load8, Load1, R, 3>(w, stride, xt, n, yt, ldy); break;
        case 4: dot_tile_tokens<Load16, Load8, Load1, R, 4>(w, stride, xt, n, yt, ldy); break;
        case 5: dot_tile_tokens<Load16, Load8, Load1, R, 5>(w, stride, xt, n, yt, ldy); break;
        default: dot_tile_tokens<Load16, Load8, Load1, R, NT>(w, stride, xt, n, yt, ldy); break;
        }
    }
}

// Rows two at a time for more than 4 tokens (the products bind), else one at a time (one stream of
// weights, as decoding: two streams took a 2-token pass of SmolLM2 f32 from 9.7 to 11.9 ms); a
// row's or pair's tokens 6 at a time, read again from L1 for the next 6. Against the packed panels
// it replaces above 8 tokens and the 256-bit kernel below (whose sums were not dot_rows's), SmolLM2
// f32 100 deep, 2 threads, AMD EPYC Zen 5: 6 tokens 18.6 -> 12.5 ms, 9 24.5 -> 14.3, 17 29-33 -> 21.
template <__m512 (*Load16)(const void *, int), __m256 (*Load8)(const void *, int), float (*Load1)(const void *, int)>
void dot_rows_multi(const void *w, size_t stride, int rows, const float *x, int n, int n_tok, float *y, size_t ldy) {
    int r = 0;
    if (n_tok > 4)
        for (; r + 2 <= rows; r += 2)
            dot_rows_tokens<Load16, Load8, Load1, 2>((const char *)w + (size_t)r * stride, stride, x, n, n_tok, y + r, ldy);
    for (; r < rows; r++) dot_rows_tokens<Load16, Load8, Load1, 1>((const char *)w + (size_t)r * stride, stride, x, n, n_tok, y + r, ldy);
}

// Attention's weighted values of H queries, y_i += sum_j a_i[j] * row j: C vectors of a head's
// outputs of each query stay in registers while all n rows pass, each row's vectors converted
// once for the H queries (kernels_avx2.cpp's accum_heads, 32 registers). Each output is a chain
// of FMAs in row order whatever H and C.
template <__m512 (*Load16)(const void *, int), int H, int C>
void accum_heads(const float *a, size_t lda, int n, const char *rows, size_t stride, int off, int i, float *y, size_t ldy) {
    __m512 acc[H][C];
    for (int h = 0; h < H; h++)
        for (int c = 0; c < C; c++) acc[h][c] = _mm512_loadu_ps(y + h * ldy + i + 16 * c);
    for (int j = 0; j < n; j++) {
        const char *row = rows + (size_t)j * stride;
        __m512 v[C];
        for (int c = 0; c < C; c++) v[c] = Load16(row, off + i + 16 * c);
        for (int h = 0; h < H; h++) {
            const __m512 aj = _mm512_set1_ps(a[h * lda + j]);
            for (int c = 0; c < C; c++) acc[h][c] = _mm512_fmadd_ps(aj, v[c], acc[h][c]);
        }
    }
    for (int h = 0; h < H; h++)
        for (int c = 0; c < C; c++) _mm512_storeu_ps(y + h * ldy + i + 16 * c, acc[h][c]);
}

template <__m512 (*Load16)(const void *, int), float (*Load1)(const void *, int), int H>
void accum_group(const float *a, size_t lda, int n, const char *rows, size_t stride, int off, int dim, float *y, size_t ldy) {
    int i = 0;
    for (; i + 64 <= dim; i += 64) accum_heads<Load16, H, 4>(a, lda, n, rows, stride, off, i, y, ldy);
    for (; i + 16 <= dim; i += 16) accum_heads<Load16, H, 1>(a, lda, n, rows, stride, off, i, y, ldy);
    for (int h = 0; h < H; h++)
        for (int d = i; d < dim; d++)
            for (int j = 0; j < n; j++) y[h * ldy + d] += a[h * lda + j] * Load1(rows + (size_t)j * stride, off + d);
}

template <__m512 (*Load16)(const void *, int), float (*Load1)(const void *, int)>
void kv_accum(const float *a, size_t lda, int nq, int n, const void *rows, size_t stride, int off, int dim, float *y,
              size_t ldy) {
    by_queries(nq, [&](auto H, int h) {
        accum_group<Load16, Load1, decltype(H)::value>(a + h * lda, lda, n, (const char *)rows, stride, off, dim,
                                                       y + h * ldy, ldy);
    });
}

// q8 rows of whole blocks (tensor.h); other heads take the portable kernel.
inline __m512 codes16(const int8_t *c) { return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)c))); }

// H queries' sums of one block of a head's values (two vectors each), each row's codes converted
// once for them; each output a chain of FMAs in row order, whatever H.
template <int H>
void accum_block_q8(const float *a, size_t lda, int n, const char *rows, size_t stride, int b, float *y, size_t ldy) {
    __m512 acc[H][2];
    for (int h = 0; h < H; h++) acc[h][0] = _mm512_loadu_ps(y + h * ldy), acc[h][1] = _mm512_loadu_ps(y + h * ldy + 16);
    for (int j = 0; j < n; j++) {
        const char *row = rows + (size_t)j * stride;
        const int8_t *c = kv_q8_codes(row, b);
        const __m512 c0 = codes16(c), c1 = codes16(c + 16);
        const float d = kv_q8_scale(row, b);
        for (int h = 0; h < H; h++) {
            const __m512 w = _mm512_set1_ps(a[h * lda + j] * d);
            acc[h][0] = _mm512_fmadd_ps(w, c0, acc[h][0]), acc[h][1] = _mm512_fmadd_ps(w, c1, acc[h][1]);
        }
    }
    for (int h = 0; h < H; h++) _mm512_storeu_ps(y + h * ldy, acc[h][0]), _mm512_storeu_ps(y + h * ldy + 16, acc[h][1]);
}

void kv_accum_q8(const float *a, size_t lda, int nq, int n, const void *rows, size_t stride, int off, int dim, float *y,
                 size_t ldy) {
    if (off % kKvQ8Block || dim % kKvQ8Block)
        return scalar_kernels()->kv_accum[(int)KvType::Q8](a, lda, nq, n, rows, stride, off, dim, y, ldy);
    by_queries(nq, [&](auto H, int h) {
        for (int i = 0; i < dim; i += kKvQ8Block)
            accum_block_q8<decltype(H)::value>(a + h * lda, lda, n, (const char *)rows, stride, (off + i) / kKvQ8Block,
                                               y + h * ldy + i, ldy);
    });
}

void swiglu(const float *gate_up, int n, float *out) {
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m512 g = _mm512_loadu_ps(gate_up + i);
        const __m512 silu = _mm512_div_ps(g, _mm512_add_ps(_mm512_set1_ps(1.0f), exp16(_mm512_sub_ps(_mm512_setzero_ps(), g))));
        _mm512_storeu_ps(out + i, _mm512_mul_ps(silu, _mm512_loadu_ps(gate_up + n + i)));
    }
    for (; i < n; i++) out[i] = gate_up[i] / (1.0f + std::exp(-gate_up[i])) * gate_up[n + i];
}

void gelu_erf(const float *x, size_t n, float *out) {
    size_t i = 0;
    const __m512 sign = _mm512_set1_ps(-0.0f);
    for (; i + 16 <= n; i += 16) {
        const __m512 v = _mm512_loadu_ps(x + i);
        const __m512 a = _mm512_mul_ps(_mm512_abs_ps(v), _mm512_set1_ps(0.70710678f));
        const __m512 t = _mm512_div_ps(_mm512_set1_ps(1.0f), _mm512_fmadd_ps(a, _mm512_set1_ps(kErfP), _mm512_set1_ps(1.0f)));
        __m512 p = _mm512_fmadd_ps(t, _mm512_set1_ps(kErfA5), _mm512_set1_ps(kErfA4));
        p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(kErfA3));
        p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(kErfA2));
        p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(kErfA1));
        const __m512 e = exp16(_mm512_sub_ps(_mm512_setzero_ps(), _mm512_mul_ps(a, a)));
        const __m512 y = _mm512_fnmadd_ps(_mm512_mul_ps(t, p), e, _mm512_set1_ps(1.0f));  // erf(|v| / sqrt 2)
        const __m512 erf = _mm512_castsi512_ps(_mm512_or_si512(  // its sign: v's (no AVX512DQ here)
            _mm512_castps_si512(y), _mm512_and_si512(_mm512_castps_si512(sign), _mm512_castps_si512(v))));
        _mm512_storeu_ps(out + i, _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(0.5f), v), _mm512_add_ps(_mm512_set1_ps(1.0f), erf)));
    }
    for (; i < n; i++) out[i] = gelu_erf_scalar(x[i]);
}

float exp_shift_sum(float *x, int n, float shift) {
    __m512 acc = _mm512_setzero_ps();
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m512 e = exp16(_mm512_sub_ps(_mm512_loadu_ps(x + i), _mm512_set1_ps(shift)));
        _mm512_storeu_ps(x + i, e);
        acc = _mm512_add_ps(acc, e);
    }
    float sum = hsum(acc);
    for (; i < n; i++) sum += (x[i] = std::exp(x[i] - shift));
    return sum;
}

// Two running maxima of 16, the tail masked in (a step's scores are 128 at most). Compiled for the
// baseline ISA, a loop of 8 running maxima took 9% of a pp8192 (Qwen2.5-0.5B): GCC left it scalar.
float reduce_max(const float *x, int n) {
    __m512 m0 = _mm512_set1_ps(x[0]), m1 = m0;
    int i = 0;
    for (; i + 32 <= n; i += 32)
        m0 = _mm512_max_ps(m0, _mm512_loadu_ps(x + i)), m1 = _mm512_max_ps(m1, _mm512_loadu_ps(x + i + 16));
    for (; i < n; i += 16) {
        const __mmask16 k = (__mmask16)(n - i >= 16 ? 0xffff : (1u << (n - i)) - 1);
        m0 = _mm512_mask_max_ps(m0, k, m0, _mm512_maskz_loadu_ps(k, x + i));
    }
    return _mm512_reduce_max_ps(_mm512_max_ps(m0, m1));
}

inline float f16s(uint16_t h) { return _cvtsh_ss(h); }

void quantize_acts(const float *x, int n, const QuantActs &out) {
    for (int b = 0; b < n / kActBlock; b++) {
        const float *xb = x + b * kActBlock;
        const __m512 v0 = _mm512_loadu_ps(xb), v1 = _mm512_loadu_ps(xb + 16);
        const float mx = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
        const float d = mx / 127.0f, id = d > 0 ? 127.0f / mx : 0.0f;
        const __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(v0, _mm512_set1_ps(id)));
        const __m512i q1 = _mm512_cvtps_epi32(_mm512_mul_ps(v1, _mm512_set1_ps(id)));
        _mm_storeu_si128((__m128i *)(out.q + b * kActBlock), _mm512_cvtsepi32_epi8(q0));
        _mm_storeu_si128((__m128i *)(out.q + b * kActBlock + 16), _mm512_cvtsepi32_epi8(q1));
        out.d[b] = d;
        out.ds[b] = d * (float)_mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
    }
}

// Quantized tiles (tensor.h): one 64-byte chunk holds 4 consecutive codes of each of the 16 rows
// (lane r = row r), so one vpdpbusd with 4 bytes of a token's activations broadcast advances all 16
// rows; a block of 32 takes 8 of them into an int32 sum per row (no horizontal adds), and the
// block's scale, activation scale and zero-point / minimum term are applied once, 16 rows wide.
// q4 chunks carry two blocks (low and high nibbles); q6 adds the top 2 bits of each code from 4
// more chunks per pair of blocks. NT tokens share every load and unpack.
// kStream: the weights come from memory (stream_tokens(kBits) tokens or fewer), and are
// prefetched. kK, kMin: the tile's scales are a K format's (codes times factors), and it has
// minimums. All three are decided once per tile, so that the loop over blocks tests none of them:
// decoding streams from memory at a rate a third of the kernel's own from cache, yet a test of a
// run-time `stream` before each block's prefetches alone cost 10% of it (q6k, one thread, AMD EPYC
// Zen 5: 0.87-0.96 of a plain read of the bytes against 1.02-1.05 without the test).
// A prompt's passes (not streaming) over codes narrower than a byte read them from pre, where
// unpack_tile decoded the tile once for all of them.
template <int kBits>
constexpr bool kDecodeOnce = kBits < 8;

template <int kBits, int NT, bool kK, bool kMin, bool kStream>
void tile_dot(const QuantTile &w, int n, const QuantActs &x0, float *y, size_t ldy, __mmask16 rm, const uint8_t *pre) {
    constexpr bool kPre = !kStream && kDecodeOnce<kBits>;
    const int n_blocks = n / kActBlock;
    constexpr float zero = kMin ? 0.0f : (float)(1 << (kBits - 1));
    // block -> group, without a division (K formats: a group is a block)
    const int group_shift = kK || w.group == 32 ? 0 : w.group == 128 ? 2 : 1;
    const int8_t *q[NT];
    const float *d[NT], *ds[NT];
    for (int t = 0; t < NT; t++) {
        const QuantActs a = token_acts(x0, n, t);
        q[t] = a.q, d[t] = a.d, ds[t] = a.ds;
    }
    __m512 acc[NT];
    for (int t = 0; t < NT; t++) acc[t] = _mm512_setzero_ps();
    auto bcast = [](const int8_t *p) {
        int32_t four;
        std::memcpy(&four, p, 4);
        return _mm512_set1_epi32(four);
    };
    // Symmetric dtypes: (d * sum - zero * ds) * scale, the zero point taken off before the scale
    // (zero is a power of 2, so zero * ds is exact); with a minimum: d * sum * scale + min * ds.
    // The AMX kernel does the same operations, for the same bits.
    auto finish_block = [&](int b, const __m512i *sum) {
        const int g = b >> group_shift;
        const __m512 ws = group_scale<kK>(w, g);
        if constexpr (kMin) {
            const __m512 mn = group_min<kK>(w, g);
            for (int t = 0; t < NT; t++) {
                const __m512 f = _mm512_mul_ps(_mm512_cvtepi32_ps(sum[t]), _mm512_set1_ps(d[t][b]));
                acc[t] = _mm512_fmadd_ps(f, ws, acc[t]);
                acc[t] = _mm512_fmadd_ps(mn, _mm512_set1_ps(ds[t][b]), acc[t]);
            }
        } else {
            for (int t = 0; t < NT; t++) {
                const __m512 f = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum[t]), _mm512_set1_ps(d[t][b]), _mm512_set1_ps(-zero * ds[t][b]));
                acc[t] = _mm512_fmadd_ps(f, ws, acc[t]);
            }
        }
    };
    if constexpr (kBits == 8 || kPre) {
        // One block at a time, from q8's own codes or a prompt's decoded ones. Decoding takes two
        // chains of sums a token (vpdpbusd's latency, not its throughput, would bind); 8 tokens take
        // one, so that their sums and outputs fill 16 of the 32 registers (a pair of blocks at a
        // time, as below, spilled: q5k's 8-token passes were a third moves to and from the stack).
        constexpr int kChains = NT < 4 ? 2 : 1;
        constexpr size_t kStep = kBits == 8 ? 64 : 128;  // between a block's chunks
        for (int b = 0; b < n_blocks; b++) {
            __m512i sum[kChains][NT];
            for (int c = 0; c < kChains; c++)
                for (int t = 0; t < NT; t++) sum[c][t] = _mm512_setzero_si512();
            const uint8_t *cb = kBits == 8 ? w.codes + (size_t)b * 512 : pre + (size_t)(b / 2) * 1024 + (b % 2) * 64;
            if (kStream) prefetch_ahead(cb, 512);
            for (int j = 0; j < 8; j++) {
                const __m512i v = _mm512_loadu_si512((const void *)(cb + j * kStep));
                for (int t = 0; t < NT; t++)
                    sum[j % kChains][t] = _mm512_dpbusd_epi32(sum[j % kChains][t], v, bcast(q[t] + b * kActBlock + 4 * j));
            }
            if (kChains == 2)
                for (int t = 0; t < NT; t++) sum[0][t] = _mm512_add_epi32(sum[0][t], sum[kChains - 1][t]);
            finish_block(b, sum[0]);
        }
    } else {
        for (int b = 0; b < n_blocks; b += 2) {
            __m512i lo_sum[NT], hi_sum[NT];
            for (int t = 0; t < NT; t++) lo_sum[t] = _mm512_setzero_si512(), hi_sum[t] = _mm512_setzero_si512();
            const uint8_t *cb = w.codes + (b / 2) * 128 * kBits;
            if (kStream) prefetch_ahead(cb, 128 * kBits);
            for (int j = 0; j < 8; j++) {
                __m512i lo, hi;
                decode_pair<kBits>(cb, j, lo, hi);
                for (int t = 0; t < NT; t++) {
                    lo_sum[t] = _mm512_dpbusd_epi32(lo_sum[t], lo, bcast(q[t] + b * kActBlock + 4 * j));
                    hi_sum[t] = _mm512_dpbusd_epi32(hi_sum[t], hi, bcast(q[t] + (b + 1) * kActBlock + 4 * j));
                }
            }
            finish_block(b, lo_sum);
            finish_block(b + 1, hi_sum);
        }
    }
    for (int t = 0; t < NT; t++) _mm512_mask_storeu_ps(y + t * ldy, rm, acc[t]);
}

template <int kBits, bool kK, bool kMin, bool kStream>
void tile_passes(const QuantTile &w, int rows, int n, const QuantActs &x, int n_tok, float *y, size_t ldy, const uint8_t *pre) {
    const __mmask16 rm = (__mmask16)((1u << rows) - 1);
    constexpr int NT = 8;
    int t = 0;
    for (; t + NT <= n_tok; t += NT) tile_dot<kBits, NT, kK, kMin, kStream>(w, n, token_acts(x, n, t), y + t * ldy, ldy, rm, pre);
    const QuantActs rest = token_acts(x, n, t);
    float *yr = y + t * ldy;
    switch (n_tok - t) {
    case 7: tile_dot<kBits, 7, kK, kMin, kStream>(w, n, rest, yr, ldy, rm, pre); break;
    case 6: tile_dot<kBits, 6, kK, kMin, kStream>(w, n, rest, yr, ldy, rm, pre); break;
    case 5: tile_dot<kBits, 5, kK, kMin, kStream>(w, n, rest, yr, ldy, rm, pre); break;
    case 4: tile_dot<kBits, 4, kK, kMin, kStream>(w, n, rest, yr, ldy, rm, pre); break;
    case 3: tile_dot<kBits, 3, kK, kMin, kStream>(w, n, rest, yr, ldy, rm, pre); break;
    case 2: tile_dot<kBits, 2, kK, kMin, kStream>(w, n, rest, yr, ldy, rm, pre); break;
    case 1: tile_dot<kBits, 1, kK, kMin, kStream>(w, n, rest, yr, ldy, rm, pre); break;
    default: break;
    }
}

// The thread's bytes for a tile's decoded codes (n x 16, 64-byte aligned): the kernels get no
// scratch, and a thread runs one tile at a time. AVX2's decoded_codes is its twin, not shared:
// each ISA's file keeps its helpers to itself (kernels_avx512.h).
inline uint8_t *decoded_tile(int n) {
    static thread_local std::vector<uint8_t> bytes;
    if (bytes.size() < (size_t)n * 16 + 64) bytes.resize((size_t)n * 16 + 64);
    return bytes.data() + (64 - (uintptr_t)bytes.data() % 64) % 64;
}

// A tile's codes narrower than a byte decoded by decode_pair into bytes: for each pair of blocks and
// chunk j, the first block's 64 bytes, then the second's. The one pass that reads the tile from
// memory, so it prefetches.
template <int kBits>
void unpack_tile(const QuantTile &w, int n, uint8_t *out) {
    for (int b = 0; b < n / kActBlock; b += 2) {
        const uint8_t *cb = w.codes + (size_t)(b / 2) * 128 * kBits;
        prefetch_ahead(cb, 128 * kBits);
        for (int j = 0; j < 8; j++, out += 128) {
            __m512i lo, hi;
            decode_pair<kBits>(cb, j, lo, hi);
            _mm512_store_si512((void *)out, lo);
            _mm512_store_si512((void *)(out + 64), hi);
        }
    }
}

// One token over codes narrower than a byte goes in 256-bit halves (decode_halves, kernels_avx2.h;
// the same bits): 512-bit registers streamed the tiles from memory slower on an AMD EPYC Zen 5,
// though faster from cache, and neither prefetching nor loading a line as two halves changed that
// (build/bench_quant_decode 1 12, one thread, ratio to the 256-bit AVX-VNNI kernel: q6k 0.87-0.91
// in 512 bits, 0.96-0.97 in halves; q4 0.93-0.98 against 1.00).
inline __m256i dot4(__m256i sum, __m256i u8, __m256i s8) { return _mm256_dpbusd_epi32(sum, u8, s8); }

// Up to stream_tokens(kBits) tokens stream the tile (kStream). A prompt's first pass over q8's codes
// streams them too (prefetched; q8 at 24-32 tokens from memory 1.3-1.7x). A prompt decodes each
// tile of narrower codes once (32 KiB at K = 2048, read back from L1 or L2; unpack_tile prefetches)
// for all its passes of 8 tokens, which then go a block at a time, as q8's do (AMD EPYC Zen 5,
// TinyLlama-1.1B shape, pp128: decoding once 1.14-1.19x for 3-, 5- and 6-bit codes, then a block at
// a time 1.11-1.33x; for 4-bit codes, both at once, int4 1.40x, q4_k_m 1.24x).
template <int kBits, bool kK, bool kMin>
void dot_rows_form(const QuantTile &w, int rows, int n, const QuantActs &x, int n_tok, float *y, size_t ldy) {
    if constexpr (kDecodeOnce<kBits>)
        if (n_tok == 1) return decode_halves<kBits, kK, kMin, dot4>(w, n, x, y, ldy, rows);
    if (n_tok <= stream_tokens(kBits)) return tile_passes<kBits, kK, kMin, true>(w, rows, n, x, n_tok, y, ldy, nullptr);
    if constexpr (kBits == 8) {  // read in place by every pass: the first streams the tile, with prefetches
        tile_passes<kBits, kK, kMin, true>(w, rows, n, x, 8, y, ldy, nullptr);
        return tile_passes<kBits, kK, kMin, false>(w, rows, n, token_acts(x, n, 8), n_tok - 8, y + 8 * ldy, ldy, nullptr);
    }
    uint8_t *pre = nullptr;
    if constexpr (kDecodeOnce<kBits>) unpack_tile<kBits>(w, n, pre = decoded_tile(n));
    tile_passes<kBits, kK, kMin, false>(w, rows, n, x, n_tok, y, ldy, pre);
}

template <int kBits>
void dot_rows_quant(const QuantTile &w, int rows, int n, const QuantActs &x, int n_tok, float *y, size_t ldy) {
    with_scale_form<kBits>(w, [&](auto k, auto min) {
        dot_rows_form<kBits, decltype(k)::value, decltype(min)::value>(w, rows, n, x, n_tok, y, ldy);
    });
}

void geglu(const float *gate_up, int n, float *out) {
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m512 g = _mm512_loadu_ps(gate_up + i);
        const __m512 z = _mm512_mul_ps(g, _mm512_fmadd_ps(_mm512_mul_ps(g, g), _mm512_set1_ps(kGeluC3), _mm512_set1_ps(kGeluC1)));
        const __m512 gelu = _mm512_div_ps(g, _mm512_add_ps(_mm512_set1_ps(1.0f), exp16(z)));
        _mm512_storeu_ps(out + i, _mm512_mul_ps(gelu, _mm512_loadu_ps(gate_up + n + i)));
    }
    for (; i < n; i++) {
        const float g = gate_up[i];
        out[i] = g / (1.0f + std::exp(g * (kGeluC1 + kGeluC3 * g * g))) * gate_up[n + i];
    }
}

// The panel in blocks of 16 rows x 16 weights, each transposed in registers: the portable
// element-by-element copy took 15% of a 400 x 1536 x 384 f32 product.
template <__m512 (*Load16)(const void *, int), float (*Load1)(const void *, int)>
void gemm_pack(const void *w, size_t stride, int rows, int n, float *p) {
    constexpr int C = KernelTable::kGemmCols;
    for (int h = 0; h < C; h += 16) {
        const int rh = std::max(0, std::min(16, rows - h));
        auto row = [&](int i) { return (const char *)w + (size_t)(h + i) * stride; };
        int k = 0;
        for (; k + 16 <= n; k += 16) {
            __m512 r[16];
            for (int i = 0; i < 16; i++) r[i] = i < rh ? Load16(row(i), k) : _mm512_setzero_ps();
            transpose16(r);
            for (int c = 0; c < 16; c++) _mm512_storeu_ps(p + (size_t)(k + c) * C + h, r[c]);
        }
        for (; k < n; k++)
            for (int i = 0; i < 16; i++) p[(size_t)k * C + h + i] = i < rh ? Load1(row(i), k) : 0.0f;
    }
}

// NT tokens x 32 columns of the panel in 2 * NT accumulators: per k, two loads of the panel and NT
// broadcasts feed 2 * NT FMAs.
template <int NT>
void gemm_tile(const float *p, int n, const float *x, size_t ldx, float *y, size_t ldy, __mmask16 m0, __mmask16 m1) {
    __m512 c0[NT], c1[NT];
    for (int t = 0; t < NT; t++) c0[t] = _mm512_setzero_ps(), c1[t] = _mm512_setzero_ps();
    for (int k = 0; k < n; k++) {
        const __m512 w0 = _mm512_loadu_ps(p + (size_t)k * 32), w1 = _mm512_loadu_ps(p + (size_t)k * 32 + 16);
        for (int t = 0; t < NT; t++) {
            const __m512 b = _mm512_set1_ps(x[(size_t)t * ldx + k]);
            c0[t] = _mm512_fmadd_ps(w0, b, c0[t]);
            c1[t] = _mm512_fmadd_ps(w1, b, c1[t]);
        }
    }
    for (int t = 0; t < NT; t++) {
        float *yt = y + (size_t)t * ldy;
        _mm512_mask_storeu_ps(yt, m0, c0[t]);
        _mm512_mask_storeu_ps(yt + 16, m1, c1[t]);
    }
}

void gemm_panel(const float *p, int n, const float *x, size_t ldx, int n_tok, float *y, size_t ldy, int cols) {
    static_assert(KernelTable::kGemmCols == 32, "two 16-float vectors per k");
    using Tile = void (*)(const float *, int, const float *, size_t, float *, size_t, __mmask16, __mmask16);
    static constexpr Tile kTiles[] = {nullptr,       gemm_tile<1>, gemm_tile<2>, gemm_tile<3>, gemm_tile<4>,
                                      gemm_tile<5>,  gemm_tile<6>, gemm_tile<7>, gemm_tile<8>, gemm_tile<9>,
                                      gemm_tile<10>, gemm_tile<11>, gemm_tile<12>};
    constexpr int NT = 12;
    const __mmask16 m0 = (__mmask16)(cols >= 16 ? 0xffff : (1u << cols) - 1);
    const __mmask16 m1 = (__mmask16)(cols >= 32 ? 0xffff : cols <= 16 ? 0 : (1u << (cols - 16)) - 1);
    for (int t = 0; t < n_tok; t += NT)
        kTiles[std::min(NT, n_tok - t)](p, n, x + (size_t)t * ldx, ldx, y + (size_t)t * ldy, ldy, m0, m1);
}

KernelTable::QuantDot quant_for_bits(int bits) {
    return bits == 8 ? dot_rows_quant<8> : bits == 6 ? dot_rows_quant<6> : bits == 5 ? dot_rows_quant<5>
         : bits == 3 ? dot_rows_quant<3> : dot_rows_quant<4>;
}

// dot_rows_quant: filled from the dtype table when the table is first asked for
const KernelTable kPlain = {
    Isa::Avx512,
    {nullptr, nullptr, nullptr},  // AVX2's, see avx512_kernels()
    {to_f32<load16_f32, load1_f32>, to_f32<load16_f16, load1_f16>, to_f32<load16_bf16, load1_bf16>},
    {rows_to_f32<load16_f32, load1_f32>, rows_to_f32<load16_f16, load1_f16>, rows_to_f32<load16_bf16, load1_bf16>},
    swiglu,
    geglu,
    gelu_erf,
    softcap_row,
    exp_shift_sum,
    reduce_max,
    quantize_acts,
    {},  // dot_rows_quant
    {}, {}, {}, {},  // KV kernels: set by the factory
    {dot_rows_multi<load16_f32, load8_f32, load1_f32>, dot_rows_multi<load16_f16, load8_f16, load1_f16>,
     dot_rows_multi<load16_bf16, load8_bf16, load1_bf16>},
    {gemm_pack<load16_f32, load1_f32>, gemm_pack<load16_f16, load1_f16>, gemm_pack<load16_bf16, load1_bf16>},
    gemm_panel};

}  // namespace

// The plain-dtype dot products (f32/f16/bf16 rows: decoding such weights, attention scores) are
// AVX2's: its 256-bit loads and conversions measured faster than 512-bit ones on an AMD EPYC with
// AVX-512 (110M f16 generation 137 -> 170 tokens/s), for the same arithmetic.
const KernelTable *avx512_kernels() {
    static const KernelTable *table = []() -> const KernelTable * {
        static KernelTable t = with_quant_kernels(kPlain, quant_for_bits);
        const KernelTable *avx2 = avx2_kernels();
        if (!avx2) return nullptr;  // not built: cannot happen where this file is
        for (int d = 0; d < 3; d++) t.dot_rows[d] = avx2->dot_rows[d];
        // KV reads: the scores (dot products of short rows) are AVX2's, as dot_rows above; 512-bit
        // ones (a vector of 16 f16 converts in 0.47 ns against 0.39 for 8 on a Zen 5; 16 sums a
        // reduction) measured 0.94-1.15x decoding SmolLM2 4096 deep, within the noise.
        for (int kv = 0; kv < kNumKvTypes; kv++) {
            t.kv_dot[kv] = avx2->kv_dot[kv], t.kv_store[kv] = avx2->kv_store[kv], t.kv_load[kv] = avx2->kv_load[kv];
        }
        t.kv_accum[(int)KvType::F32] = kv_accum<load16_f32, load1_f32>;
        t.kv_accum[(int)KvType::F16] = kv_accum<load16_f16, load1_f16>;
        t.kv_accum[(int)KvType::Q8] = kv_accum_q8;
        return &t;
    }();
    return table;
}

}  // namespace fastllm
#else
#include "cpu/kernels.h"
namespace fastllm {
const KernelTable *avx512_kernels() { return nullptr; }
}  // namespace fastllm
#endif
