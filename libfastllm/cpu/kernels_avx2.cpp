// AVX2 + FMA + F16C kernels. This file alone is compiled with -mavx2 -mfma -mf16c; its table is
// used only when CPUID reports those features.
#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "cpu/kernels.h"
#include "cpu/kernels_avx2.h"

namespace fastllm {

namespace {

inline __m256 load8_f32(const void *p, int i) { return _mm256_loadu_ps((const float *)p + i); }
inline __m256 load8_f16(const void *p, int i) {
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)p + i)));
}
inline __m256 load8_bf16(const void *p, int i) {
    __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)((const uint16_t *)p + i)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
}
inline float load1_f32(const void *p, int i) { return ((const float *)p)[i]; }
inline float load1_f16(const void *p, int i) { return f16_to_f32(((const uint16_t *)p)[i]); }
inline float load1_bf16(const void *p, int i) { return bf16_to_f32(((const uint16_t *)p)[i]); }

inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

// exp(x) = 2^k * exp(r), k = round(x / ln 2), r = x - k ln 2 (ln 2 in two parts, so r is exact to a
// few ulps), exp(r) by its Taylor series to r^7 (|r| <= 0.35: truncation error ~5e-9). 2^k is built
// in the exponent bits; x is clamped where exp over- or underflows floats.
inline __m256 exp8(__m256 x) {
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.3f)), _mm256_set1_ps(88.7f));
    const __m256 k = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(k, _mm256_set1_ps(0.693145752f), x);
    r = _mm256_fnmadd_ps(k, _mm256_set1_ps(1.42860677e-6f), r);
    __m256 p = _mm256_set1_ps(1.0f / 5040);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 720));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    // k in [-126, 128]: split 2^k = 2^(k/2) * 2^(k - k/2) so that neither factor leaves the normal range
    const __m256i ki = _mm256_cvtps_epi32(k), k1 = _mm256_srai_epi32(ki, 1), k2 = _mm256_sub_epi32(ki, k1);
    const __m256 s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(k1, _mm256_set1_epi32(127)), 23));
    const __m256 s2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(k2, _mm256_set1_epi32(127)), 23));
    return _mm256_mul_ps(_mm256_mul_ps(p, s1), s2);
}

void swiglu(const float *gate_up, int n, float *out) {
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 g = _mm256_loadu_ps(gate_up + i);
        const __m256 silu = _mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.0f), exp8(_mm256_sub_ps(_mm256_setzero_ps(), g))));
        _mm256_storeu_ps(out + i, _mm256_mul_ps(silu, _mm256_loadu_ps(gate_up + n + i)));
    }
    for (; i < n; i++) out[i] = gate_up[i] / (1.0f + std::exp(-gate_up[i])) * gate_up[n + i];
}

void geglu(const float *gate_up, int n, float *out) {
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 g = _mm256_loadu_ps(gate_up + i);
        const __m256 z = _mm256_mul_ps(g, _mm256_fmadd_ps(_mm256_mul_ps(g, g), _mm256_set1_ps(kGeluC3), _mm256_set1_ps(kGeluC1)));
        const __m256 gelu = _mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.0f), exp8(z)));
        _mm256_storeu_ps(out + i, _mm256_mul_ps(gelu, _mm256_loadu_ps(gate_up + n + i)));
    }
    for (; i < n; i++) {
        const float g = gate_up[i];
        out[i] = g / (1.0f + std::exp(g * (kGeluC1 + kGeluC3 * g * g))) * gate_up[n + i];
    }
}

void gelu_erf(const float *x, size_t n, float *out) {
    size_t i = 0;
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (; i + 8 <= n; i += 8) {
        const __m256 v = _mm256_loadu_ps(x + i);
        const __m256 a = _mm256_mul_ps(_mm256_andnot_ps(sign, v), _mm256_set1_ps(0.70710678f));
        const __m256 t = _mm256_div_ps(_mm256_set1_ps(1.0f), _mm256_fmadd_ps(a, _mm256_set1_ps(kErfP), _mm256_set1_ps(1.0f)));
        __m256 p = _mm256_fmadd_ps(t, _mm256_set1_ps(kErfA5), _mm256_set1_ps(kErfA4));
        p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(kErfA3));
        p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(kErfA2));
        p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(kErfA1));
        const __m256 e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), _mm256_mul_ps(a, a)));
        const __m256 y = _mm256_fnmadd_ps(_mm256_mul_ps(t, p), e, _mm256_set1_ps(1.0f));  // erf(|v| / sqrt 2)
        const __m256 erf = _mm256_or_ps(y, _mm256_and_ps(sign, v));                      // its sign: v's
        _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(0.5f), v), _mm256_add_ps(_mm256_set1_ps(1.0f), erf)));
    }
    for (; i < n; i++) out[i] = gelu_erf_scalar(x[i]);
}

// cap * tanh(x / cap) (KernelTable::softcap); exp8 clamps a NaN to a number, so NaNs are put back.
inline __m256 softcap8(__m256 x, __m256 cap, __m256 inv) {
    const __m256 sign = _mm256_set1_ps(-0.0f), one = _mm256_set1_ps(1.0f), v = _mm256_mul_ps(x, inv);
    const __m256 t = exp8(_mm256_mul_ps(_mm256_andnot_ps(sign, v), _mm256_set1_ps(-2.0f)));
    const __m256 r = _mm256_div_ps(_mm256_sub_ps(one, t), _mm256_add_ps(one, t));
    const __m256 y = _mm256_mul_ps(cap, _mm256_or_ps(r, _mm256_and_ps(sign, v)));
    return _mm256_blendv_ps(y, x, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
}

void softcap(float *x, size_t n, float c) {
    const __m256 cap = _mm256_set1_ps(c), inv = _mm256_set1_ps(1.0f / c);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, softcap8(_mm256_loadu_ps(x + i), cap, inv));
    if (i < n) {  // the same steps on a padded copy
        float tail[8] = {};
        std::memcpy(tail, x + i, (n - i) * sizeof(float));
        _mm256_storeu_ps(tail, softcap8(_mm256_loadu_ps(tail), cap, inv));
        std::memcpy(x + i, tail, (n - i) * sizeof(float));
    }
}

float exp_shift_sum(float *x, int n, float shift) {
    __m256 acc = _mm256_setzero_ps();
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(x + i), _mm256_set1_ps(shift)));
        _mm256_storeu_ps(x + i, e);
        acc = _mm256_add_ps(acc, e);
    }
    float sum = hsum(acc);
    for (; i < n; i++) sum += (x[i] = std::exp(x[i] - shift));
    return sum;
}

// Two running maxima of 8: one would wait on its own previous maximum (4 cycles) each step.
float reduce_max(const float *x, int n) {
    __m256 m0 = _mm256_set1_ps(x[0]), m1 = m0;
    int i = 0;
    for (; i + 16 <= n; i += 16)
        m0 = _mm256_max_ps(m0, _mm256_loadu_ps(x + i)), m1 = _mm256_max_ps(m1, _mm256_loadu_ps(x + i + 8));
    m0 = _mm256_max_ps(m0, m1);
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(m0), _mm256_extractf128_ps(m0, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    float m = _mm_cvtss_f32(_mm_max_ss(h, _mm_shuffle_ps(h, h, 1)));
    for (; i < n; i++) m = std::max(m, x[i]);
    return m;
}

// One row after another, so that the weights are read as one sequential stream (rows are often
// short, 1.5-4 KiB, and the hardware prefetcher does better on one long stream than on several
// short ones: 110M f16 generation 107 -> 168 tokens/s against 4 rows sharing each load of x);
// four accumulators hide the FMA latency. The AVX-512 table uses these too.
template <__m256 (*Load8)(const void *, int), float (*Load1)(const void *, int)>
void dot_rows(const void *w, size_t stride, int rows, const float *x, int n, float *y) {
    for (int r = 0; r < rows; r++) {
        const void *wr = (const char *)w + (size_t)r * stride;
        __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(), a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
        int i = 0;
        const size_t elem = n ? stride / (size_t)n : 0;  // bytes per weight (rows are whole)
        for (; i + 32 <= n; i += 32) {
            prefetch_ahead((const char *)wr + i * elem, 32 * elem);
            a0 = _mm256_fmadd_ps(Load8(wr, i), _mm256_loadu_ps(x + i), a0);
            a1 = _mm256_fmadd_ps(Load8(wr, i + 8), _mm256_loadu_ps(x + i + 8), a1);
            a2 = _mm256_fmadd_ps(Load8(wr, i + 16), _mm256_loadu_ps(x + i + 16), a2);
            a3 = _mm256_fmadd_ps(Load8(wr, i + 24), _mm256_loadu_ps(x + i + 24), a3);
        }
        for (; i + 8 <= n; i += 8) a0 = _mm256_fmadd_ps(Load8(wr, i), _mm256_loadu_ps(x + i), a0);
        float s = hsum(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
        for (; i < n; i++) s = std::fma(Load1(wr, i), x[i], s);  // fused, as dot_rows_multi's tails (AVX-512's too)
        y[r] = s;
    }
}

// A row against NT tokens, each token's sum dot_rows's operations in dot_rows's order (four
// accumulators over runs of 32, the last vectors into the first, the same tree, the scalar tail):
// a token's result does not depend on the tokens beside it, so a speculative step's rows get the
// bits a decoding step gives them, and greedy output stays the same with drafts. Each pair of
// weight vectors feeds 2 * NT accumulators (NT = 3: 12 of them and the pair in 16 registers).
template <__m256 (*Load8)(const void *, int), float (*Load1)(const void *, int), int NT>
void dot_row_tokens(const void *wr, const float *x, int n, float *y, size_t ldy) {
    __m256 a[NT][4];
    for (int t = 0; t < NT; t++) a[t][0] = a[t][1] = a[t][2] = a[t][3] = _mm256_setzero_ps();
    int i = 0;
    for (; i + 32 <= n; i += 32)
        for (int c = 0; c < 4; c += 2) {
            const __m256 w0 = Load8(wr, i + 8 * c), w1 = Load8(wr, i + 8 * c + 8);
            for (int t = 0; t < NT; t++) {
                a[t][c] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + (size_t)t * n + i + 8 * c), a[t][c]);
                a[t][c + 1] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x + (size_t)t * n + i + 8 * c + 8), a[t][c + 1]);
            }
        }
    for (; i + 8 <= n; i += 8) {
        const __m256 w0 = Load8(wr, i);
        for (int t = 0; t < NT; t++) a[t][0] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + (size_t)t * n + i), a[t][0]);
    }
    for (int t = 0; t < NT; t++) {
        float s = hsum(_mm256_add_ps(_mm256_add_ps(a[t][0], a[t][1]), _mm256_add_ps(a[t][2], a[t][3])));
        for (int j = i; j < n; j++) s = std::fma(Load1(wr, j), x[(size_t)t * n + j], s);
        y[(size_t)t * ldy] = s;
    }
}

// Row by row (one stream of weights, as dot_rows), up to 3 tokens a sweep; a row read again for
// the next tokens comes from L1. Random TinyLlama-1.1B shape, f16, 2 cores: a pass of 2 rows took 1.8x
// one of 1 row when blocks of rows were converted to f32 first.
template <__m256 (*Load8)(const void *, int), float (*Load1)(const void *, int)>
void dot_rows_multi(const void *w, size_t stride, int rows, const float *x, int n, int n_tok, float *y, size_t ldy) {
    for (int r = 0; r < rows; r++) {
        const void *wr = (const char *)w + (size_t)r * stride;
        for (int t = 0; t < n_tok; t += 3) {
            const float *xt = x + (size_t)t * n;
            float *yt = y + (size_t)t * ldy + r;
            switch (std::min(3, n_tok - t)) {
            case 1: dot_row_tokens<Load8, Load1, 1>(wr, xt, n, yt, ldy); break;
            case 2: dot_row_tokens<Load8, Load1, 2>(wr, xt, n, yt, ldy); break;
            default: dot_row_tokens<Load8, Load1, 3>(wr, xt, n, yt, ldy); break;
            }
        }
    }
}

template <__m256 (*Load8)(const void *, int), float (*Load1)(const void *, int)>
void to_f32(const void *src, float *dst, int n) {
    int i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, Load8(src, i));
    for (; i < n; i++) dst[i] = Load1(src, i);
}

template <__m256 (*Load8)(const void *, int), float (*Load1)(const void *, int)>
void rows_to_f32(const void *src, size_t stride, int rows, int n, float *dst, size_t ldd) {
    for (int r = 0; r < rows; r++)
        to_f32<Load8, Load1>((const char *)src + (size_t)r * stride, dst + (size_t)r * ldd, n);
}

// Attention's weighted values of H queries, y_i += sum_j a_i[j] * row j: C vectors of a head's
// outputs of each query stay in registers while all n rows pass, each row's vectors converted
// once for the H queries. Each output is a chain of FMAs in row order whatever H and C, so a
// query's sums do not depend on the queries beside it.
template <__m256 (*Load8)(const void *, int), int H, int C>
void accum_heads(const float *a, size_t lda, int n, const char *rows, size_t stride, int off, int i, float *y, size_t ldy) {
    __m256 acc[H][C];
    for (int h = 0; h < H; h++)
        for (int c = 0; c < C; c++) acc[h][c] = _mm256_loadu_ps(y + h * ldy + i + 8 * c);
    for (int j = 0; j < n; j++) {
        const char *row = rows + (size_t)j * stride;
        __m256 v[C];
        for (int c = 0; c < C; c++) v[c] = Load8(row, off + i + 8 * c);
        for (int h = 0; h < H; h++) {
            const __m256 aj = _mm256_set1_ps(a[h * lda + j]);
            for (int c = 0; c < C; c++) acc[h][c] = _mm256_fmadd_ps(aj, v[c], acc[h][c]);
        }
    }
    for (int h = 0; h < H; h++)
        for (int c = 0; c < C; c++) _mm256_storeu_ps(y + h * ldy + i + 8 * c, acc[h][c]);
}

// The widest C that leaves H queries' sums, C rows' vectors and a weight in 16 registers.
template <__m256 (*Load8)(const void *, int), float (*Load1)(const void *, int), int H>
void accum_group(const float *a, size_t lda, int n, const char *rows, size_t stride, int off, int dim, float *y, size_t ldy) {
    constexpr int C = H <= 2 ? 4 : 2;
    int i = 0;
    for (; i + 8 * C <= dim; i += 8 * C) accum_heads<Load8, H, C>(a, lda, n, rows, stride, off, i, y, ldy);
    for (; i + 8 <= dim; i += 8) accum_heads<Load8, H, 1>(a, lda, n, rows, stride, off, i, y, ldy);
    for (int h = 0; h < H; h++)
        for (int d = i; d < dim; d++)
            for (int j = 0; j < n; j++) y[h * ldy + d] += a[h * lda + j] * Load1(rows + (size_t)j * stride, off + d);
}

template <__m256 (*Load8)(const void *, int), float (*Load1)(const void *, int)>
void kv_accum(const float *a, size_t lda, int nq, int n, const void *rows, size_t stride, int off, int dim, float *y,
              size_t ldy) {
    by_queries(nq, [&](auto H, int h) {
        accum_group<Load8, Load1, decltype(H)::value>(a + h * lda, lda, n, (const char *)rows, stride, off, dim,
                                                      y + h * ldy, ldy);
    });
}

// The 8 sums of 8 accumulators, one per lane (row r's in lane r).
inline __m256 hsum8(const __m256 *a) {
    const __m256 s0123 = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));
    const __m256 s4567 = _mm256_hadd_ps(_mm256_hadd_ps(a[4], a[5]), _mm256_hadd_ps(a[6], a[7]));
    return _mm256_add_ps(_mm256_permute2f128_ps(s0123, s4567, 0x20), _mm256_permute2f128_ps(s0123, s4567, 0x31));
}

// The sums of N accumulators (row r's of query h at r * H + h) to y[h * ldy + r]: hsum8's tree, 8
// at a time (the last padded).
template <int H, int N>
inline void store_sums(const __m256 *acc, float *y, size_t ldy) {
    for (int e0 = 0; e0 < N; e0 += 8) {
        __m256 part[8];
        for (int e = 0; e < 8; e++) part[e] = e0 + e < N ? acc[e0 + e] : _mm256_setzero_ps();
        alignas(32) float sums[8];
        _mm256_store_ps(sums, hsum8(part));
        for (int e = e0; e < std::min(N, e0 + 8); e++) y[(e % H) * ldy + e / H] = sums[e - e0];
    }
}

// Attention scores of H queries against R rows: each row's vectors are converted once for the H
// queries, and the H * R sums are reduced 8 at a time (hsum8, padded): rows are one head long (64,
// 128 values), and a reduction per row costs about what the row's products do. SmolLM2, 32
// sessions of 1,000 tokens stepping together, 8 rows sharing a reduction: 295 -> 221 ms a step
// (medians of 3, alternating). Every sum is a lane's chain in value order, then hsum8's tree,
// whatever H and R: a row's score does not depend on its place or the queries beside it.
template <__m256 (*Load8)(const void *, int), int H, int R>
int dot_heads(const char *base, size_t stride, int n, const float *q, int dim, float *y, size_t ldy) {
    constexpr int N = H * R;
    int j = 0;
    for (; j + R <= n; j += R) {
        __m256 acc[N];
        for (int e = 0; e < N; e++) acc[e] = _mm256_setzero_ps();
        const char *rows = base + (size_t)j * stride;
        for (int i = 0; i < dim; i += 8)
            for (int r = 0; r < R; r++) {
                const __m256 v = Load8(rows + (size_t)r * stride, i);
                for (int h = 0; h < H; h++) acc[r * H + h] = _mm256_fmadd_ps(v, _mm256_loadu_ps(q + h * dim + i), acc[r * H + h]);
            }
        store_sums<H, N>(acc, y + j, ldy);
    }
    return j;
}

// R rows at a time, R * H accumulators (8 or 12) and a row's vector in 16 registers; the last
// rows one at a time.
template <__m256 (*Load8)(const void *, int), int H>
void dot_group(const char *base, size_t stride, int n, const float *q, int dim, float *y, size_t ldy) {
    constexpr int R = H == 1 ? 8 : H == 2 ? 4 : H == 3 ? 4 : 2;
    const int j = dot_heads<Load8, H, R>(base, stride, n, q, dim, y, ldy);
    dot_heads<Load8, H, 1>(base + (size_t)j * stride, stride, n - j, q, dim, y + j, ldy);
}

template <__m256 (*Load8)(const void *, int), float (*Load1)(const void *, int), size_t kSize>
void kv_dot(const void *rows, size_t stride, int n, int off, const float *q, int nq, int dim, float *y, size_t ldy) {
    const char *base = (const char *)rows + (size_t)off * kSize;
    if (dim % 8) {  // heads of a length no model has: a row at a time
        for (int h = 0; h < nq; h++) dot_rows<Load8, Load1>(base, stride, n, q + (size_t)h * dim, dim, y + h * ldy);
        return;
    }
    by_queries(nq, [&](auto H, int h) {
        dot_group<Load8, decltype(H)::value>(base, stride, n, q + (size_t)h * dim, dim, y + h * ldy, ldy);
    });
}

// q8 rows (tensor.h): a head of whole blocks (head_dim a multiple of 32, as in every model with
// heads of 64 or 128) runs here; shorter heads take the portable kernel.
inline __m256 codes8(const int8_t *c) { return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)c))); }

// q8 scores as the plain rows' (kv_dot above): per block a chain over its 32 codes, times the
// block's scale into the row's sum; R * H accumulators, a block's codes and its scale in 16 registers.
template <int H, int R>
int dot_heads_q8(const char *rows, size_t stride, int n, int b0, int nb, const float *q, int dim, float *y, size_t ldy) {
    constexpr int N = H * R;
    int j = 0;
    for (; j + R <= n; j += R) {
        __m256 acc[N];
        for (int e = 0; e < N; e++) acc[e] = _mm256_setzero_ps();
        for (int b = 0; b < nb; b++)
            for (int r = 0; r < R; r++) {
                const char *row = rows + (size_t)(j + r) * stride;
                const int8_t *c = kv_q8_codes(row, b0 + b);
                const __m256 c0 = codes8(c), c1 = codes8(c + 8), c2 = codes8(c + 16), c3 = codes8(c + 24);
                const __m256 d = _mm256_set1_ps(kv_q8_scale(row, b0 + b));
                for (int h = 0; h < H; h++) {
                    const float *qb = q + h * dim + b * kKvQ8Block;
                    __m256 s = _mm256_mul_ps(c0, _mm256_loadu_ps(qb));
                    s = _mm256_fmadd_ps(c1, _mm256_loadu_ps(qb + 8), s);
                    s = _mm256_fmadd_ps(c2, _mm256_loadu_ps(qb + 16), s);
                    s = _mm256_fmadd_ps(c3, _mm256_loadu_ps(qb + 24), s);
                    acc[r * H + h] = _mm256_fmadd_ps(d, s, acc[r * H + h]);
                }
            }
        store_sums<H, N>(acc, y + j, ldy);
    }
    return j;
}

template <int H>
void dot_group_q8(const char *rows, size_t stride, int n, int b0, int nb, const float *q, int dim, float *y, size_t ldy) {
    constexpr int R = H == 1 ? 8 : H == 2 ? 4 : 2;
    const int j = dot_heads_q8<H, R>(rows, stride, n, b0, nb, q, dim, y, ldy);
    dot_heads_q8<H, 1>(rows + (size_t)j * stride, stride, n - j, b0, nb, q, dim, y + j, ldy);
}

void kv_dot_q8(const void *rows, size_t stride, int n, int off, const float *q, int nq, int dim, float *y, size_t ldy) {
    if (off % kKvQ8Block || dim % kKvQ8Block)
        return scalar_kernels()->kv_dot[(int)KvType::Q8](rows, stride, n, off, q, nq, dim, y, ldy);
    const int b0 = off / kKvQ8Block, nb = dim / kKvQ8Block;
    by_queries(nq, [&](auto H, int h) {
        dot_group_q8<decltype(H)::value>((const char *)rows, stride, n, b0, nb, q + (size_t)h * dim, dim, y + h * ldy, ldy);
    });
}

// A q8 row to f32: each block's codes widened and times its scale, the same one rounding as the
// portable kernel's.
void kv_load_q8(const void *row, float *x, int n) {
    const char *r = (const char *)row;
    int b = 0;
    for (; (b + 1) * kKvQ8Block <= n; b++) {
        const __m256 d = _mm256_set1_ps(kv_q8_scale(r, b));
        const int8_t *c = kv_q8_codes(r, b);
        float *xb = x + b * kKvQ8Block;
        _mm256_storeu_ps(xb, _mm256_mul_ps(d, codes8(c))), _mm256_storeu_ps(xb + 8, _mm256_mul_ps(d, codes8(c + 8)));
        _mm256_storeu_ps(xb + 16, _mm256_mul_ps(d, codes8(c + 16))), _mm256_storeu_ps(xb + 24, _mm256_mul_ps(d, codes8(c + 24)));
    }
    for (int i = b * kKvQ8Block; i < n; i++) x[i] = kv_q8_scale(r, b) * (float)kv_q8_codes(r, b)[i % kKvQ8Block];
}

// H queries' sums of C of a block's 4 vectors of a head's values (from vector c0), each row's codes
// converted once for them; each output a chain of FMAs in row order, whatever H and C.
template <int H, int C>
void accum_block_q8(const float *a, size_t lda, int n, const char *rows, size_t stride, int b, int c0, float *y,
                    size_t ldy) {
    __m256 acc[H][C];
    for (int h = 0; h < H; h++)
        for (int c = 0; c < C; c++) acc[h][c] = _mm256_loadu_ps(y + h * ldy + 8 * c);
    for (int j = 0; j < n; j++) {
        const char *row = rows + (size_t)j * stride;
        const int8_t *codes = kv_q8_codes(row, b) + 8 * c0;
        __m256 v[C];
        for (int c = 0; c < C; c++) v[c] = codes8(codes + 8 * c);
        const float d = kv_q8_scale(row, b);
        for (int h = 0; h < H; h++) {
            const __m256 w = _mm256_set1_ps(a[h * lda + j] * d);
            for (int c = 0; c < C; c++) acc[h][c] = _mm256_fmadd_ps(w, v[c], acc[h][c]);
        }
    }
    for (int h = 0; h < H; h++)
        for (int c = 0; c < C; c++) _mm256_storeu_ps(y + h * ldy + 8 * c, acc[h][c]);
}

// A block's 4 vectors at once for up to 2 queries, 2 at a time for more (16 registers).
template <int H>
void accum_q8(const float *a, size_t lda, int n, const char *rows, size_t stride, int b, float *y, size_t ldy) {
    if constexpr (H <= 2) {
        accum_block_q8<H, 4>(a, lda, n, rows, stride, b, 0, y, ldy);
    } else {
        accum_block_q8<H, 2>(a, lda, n, rows, stride, b, 0, y, ldy);
        accum_block_q8<H, 2>(a, lda, n, rows, stride, b, 2, y + 16, ldy);
    }
}

void kv_accum_q8(const float *a, size_t lda, int nq, int n, const void *rows, size_t stride, int off, int dim, float *y,
                 size_t ldy) {
    if (off % kKvQ8Block || dim % kKvQ8Block)
        return scalar_kernels()->kv_accum[(int)KvType::Q8](a, lda, nq, n, rows, stride, off, dim, y, ldy);
    by_queries(nq, [&](auto H, int h) {
        for (int i = 0; i < dim; i += kKvQ8Block)
            accum_q8<decltype(H)::value>(a + h * lda, lda, n, (const char *)rows, stride, (off + i) / kKvQ8Block,
                                         y + h * ldy + i, ldy);
    });
}

// f16 rows with the F16C conversion (round to nearest even, as f32_to_f16).
void kv_store_f16(const float *x, int n, void *row) {
    uint16_t *h = (uint16_t *)row;
    int i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(h + i), _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++) h[i] = f32_to_f16(x[i]);
}

inline float f16s(uint16_t h) { return _cvtsh_ss(h); }

// 32 values to codes round(x * 127 / max|x|) (half to even) at q, and their scale max|x| / 127;
// returns the codes' sum (the portable quantize_acts' and kv_q8_store_row's arithmetic; a block
// whose scale is 0 gets codes 0, also where max|x| < 2e-43 and kv_q8_store_row's 127 / max is inf).
inline int32_t quantize32(const float *x, float &d, int8_t *q) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 v[4];
    __m256 amax = _mm256_setzero_ps();
    for (int k = 0; k < 4; k++) {
        v[k] = _mm256_loadu_ps(x + 8 * k);
        amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, v[k]));
    }
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    const float mx = _mm_cvtss_f32(m);
    d = mx / 127.0f;
    const float id = d > 0 ? 127.0f / mx : 0.0f;
    __m256i c[4];
    for (int k = 0; k < 4; k++) c[k] = _mm256_cvtps_epi32(_mm256_mul_ps(v[k], _mm256_set1_ps(id)));
    __m256i s = _mm256_add_epi32(_mm256_add_epi32(c[0], c[1]), _mm256_add_epi32(c[2], c[3]));
    __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4E));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xB1));
    const __m256i p16a = _mm256_packs_epi32(c[0], c[1]), p16b = _mm256_packs_epi32(c[2], c[3]);
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    _mm256_storeu_si256((__m256i *)q, _mm256_permutevar8x32_epi32(_mm256_packs_epi16(p16a, p16b), order));
    return _mm_cvtsi128_si32(s4);
}

void quantize_acts(const float *x, int n, const QuantActs &out) {
    for (int b = 0; b < n / kActBlock; b++) {
        float d;
        const int32_t sum = quantize32(x + b * kActBlock, d, out.q + b * kActBlock);
        out.d[b] = d;
        out.ds[b] = d * (float)sum;
    }
}

// q8 KV rows (a prompt's keys and values, each as it is written): whole blocks here, the last
// partial block the portable way (zero-padded); the same bytes as kv_q8_store_row.
void kv_store_q8(const float *x, int n, void *row) {
    const int full = n / kKvQ8Block;
    for (int b = 0; b < full; b++) {
        char *blk = (char *)row + (size_t)b * kKvQ8BlockBytes;
        float d;
        quantize32(x + b * kKvQ8Block, d, (int8_t *)blk + 4);
        std::memcpy(blk, &d, 4);
    }
    if (n > full * kKvQ8Block)
        kv_q8_store_row(x + full * kKvQ8Block, n - full * kKvQ8Block, (char *)row + (size_t)full * kKvQ8BlockBytes);
}

// f(j) for j = from, from + step, ... < to; with kUnroll the loop is unrolled (bounds that are
// constants where it is inlined). It and its lambdas are forced inline: left calls, the sums they
// capture lived in memory (q3_k_m pp128 at 0.71x).
template <bool kUnroll, typename F>
__attribute__((always_inline)) inline void for_chunks(int from, int to, int step, F &&f) {
    if constexpr (kUnroll) {
#pragma GCC unroll 8
        for (int j = from; j < to; j += step) f(j);
    } else {
        for (int j = from; j < to; j += step) f(j);
    }
}

// Quantized tiles (tensor.h): a 32-byte half of a 64-byte chunk holds 4 codes of each of 8 rows (one
// int32 lane each), so vpmaddubsw with 4 bytes of a token's activations broadcast advances the 8
// rows. NT tokens and H halves side by side (8H rows) share every load, unpack and broadcast: one
// token (decoding) takes both halves in one pass, so each 64-byte line is read once; a prompt takes
// 3 tokens (4 for q8) a half at a time, what 16 ymm registers hold. q8 codes are made signed (code -
// 128) for the sign trick (|x| times w carrying x's sign keeps the int16 pairs from saturating).
// The int16 pair sums of the other codes stay in int16 for kChunks chunks: 4-bit (and 3-bit) 8 (8 x
// 2 x 15 x 127 < 32768), 5-bit 4, 6-bit 2 (2 x 2 x 63 x 127), added with saturating adds that never
// saturate here: GCC 12 reassociates wrapping adds into a tree, computing all the products of a
// pair's chunks first and spilling them (q4k, one token from cache, one thread: 26.5 -> 32.6 GB/s;
// 24 tokens 1.13x). vpmaddwd then reduces the pairs to int32 against a block's 8-bit scale codes (K
// formats) or against ones, so that a K format's f16 factors apply once per super-block of 8 blocks
// and the others' f16 scales once per group: a block costs a conversion and an FMA per 8 rows and
// token (a K format's minimum term one more). Against a half at a time with every block's scale
// applied in f32 (AVX2 EPYC, random TinyLlama-1.1B shapes; a harness alternating both kernels):
// one token streaming from memory on 2 threads, q4k 20 -> 28.5 GB/s; from cache on one thread q4
// 1.21x, q8 1.19x, q4_g128 1.13x, q4k and q6k about 1.0x; 24 tokens q4k 1.14x, q6k 1.09x, q4 1.06x,
// q8 0.98x. End to end (bench_before_after.py): q4_k_m tg64 1.35x, pp128 1.25x; int4 1.37x, 1.13x.
// bench/bench_quant_decode.cpp measures decoding's rate against a plain read of the same bytes.
// stream: the weights come from memory, and are prefetched: a few tokens' passes over both halves,
// a prompt's first pass over the first half (later passes, and a second half's, find them in cache).
// kPre: the half's codes are read from pre, where unpack_half decoded them once for all of a
// prompt's passes, instead of being decoded again in every pass of NT tokens.
template <int kBits, bool kKScales, int NT, int H, bool kPre = false>
void tile_dot(const QuantTile &w, int half0, int n, const QuantActs &x0, float *y, size_t ldy, int n_rows, bool stream,
              const uint8_t *pre = nullptr) {
    static_assert(!kPre || H == 1, "one half is decoded ahead");
    constexpr int kChunks = kBits <= 4 ? 8 : kBits == 5 ? 4 : kBits == 6 ? 2 : 1;
    constexpr int kPer = kBits == 8 ? 1 : 2;  // blocks a chunk holds: q3-q6 chunks carry a pair
    const int n_blocks = n / kActBlock, r0 = half0 * 8;
    // blocks per f16 scale (a power of 2: 1, 2, 4 or 8), as a shift: a division per block cost 11%
    const int span_shift = __builtin_ctz(kKScales ? kSuperBlock / kActBlock : w.group / kActBlock), span = 1 << span_shift;
    const float zero = kBits == 8 || w.has_min() ? 0.0f : (float)(1 << (kBits - 1));
    const __m256i ones = _mm256_set1_epi16(1), flip = _mm256_set1_epi8((char)0x80);
    // Code i of 8 bytes (broadcast to both 128-bit lanes) to the int16 lanes 2i and 2i + 1 (row i's pair).
    const __m256i dup = _mm256_setr_epi8(0, -1, 0, -1, 1, -1, 1, -1, 2, -1, 2, -1, 3, -1, 3, -1,
                                         4, -1, 4, -1, 5, -1, 5, -1, 6, -1, 6, -1, 7, -1, 7, -1);
    auto bcast = [](const int8_t *p) {
        int32_t four;
        std::memcpy(&four, p, 4);
        return _mm256_set1_epi32(four);
    };
    auto code16 = [&](const uint8_t *c) {
        int64_t eight;
        std::memcpy(&eight, c, 8);
        return _mm256_shuffle_epi8(_mm256_set1_epi64x(eight), dup);
    };
    const int8_t *q[NT];
    const float *d[NT], *ds[NT];
    for (int t = 0; t < NT; t++) {
        const QuantActs a = token_acts(x0, n, t);
        q[t] = a.q, d[t] = a.d, ds[t] = a.ds;
    }
    // A K format's minimum term: the minimum's codes times the activations' sums (without a minimum,
    // the scale's codes, times -zero when the super-block ends).
    const uint8_t *mcode = w.k_min_code ? w.k_min_code : w.k_scale_code;
    // acc: the output; sacc, macc: a K format's super-block's scale and minimum terms, before its
    // f16 factors.
    __m256 acc[NT][H], sacc[NT][H], macc[NT][H];
    for (int t = 0; t < NT; t++)
        for (int h = 0; h < H; h++) acc[t][h] = sacc[t][h] = macc[t][h] = _mm256_setzero_ps();
    for (int b = 0; b < n_blocks; b += kPer) {
        __m256i s[kPer][NT][H];  // int32 sums of block b + p, token t, half h
        for (int p = 0; p < kPer; p++)
            for (int t = 0; t < NT; t++)
                for (int h = 0; h < H; h++) s[p][t][h] = _mm256_setzero_si256();
        if constexpr (kBits == 8) {
            const uint8_t *cb = w.codes + b * 512;
            if (stream) prefetch_ahead(cb, 512);
            for (int j = 0; j < 8; j++) {
                __m256i wv[H];
                for (int h = 0; h < H; h++)
                    wv[h] = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(cb + j * 64 + (half0 + h) * 32)), flip);
                for (int t = 0; t < NT; t++) {
                    const __m256i xv = bcast(q[t] + b * kActBlock + 4 * j), ax = _mm256_sign_epi8(xv, xv);
                    for (int h = 0; h < H; h++)
                        s[0][t][h] = _mm256_add_epi32(s[0][t][h], _mm256_madd_epi16(
                            _mm256_maddubs_epi16(ax, _mm256_sign_epi8(wv[h], xv)), ones));
                }
            }
        } else {
            const uint8_t *cb = w.codes + (b / 2) * 128 * kBits;
            if (stream) prefetch_ahead(cb, 128 * kBits);
            const uint8_t *c = kKScales ? w.k_scale_code + (size_t)b * kTileRows + r0 : nullptr;
            // One token (decoding): the chunks' loops unrolled, so that decode_pair's shifts and offsets
            // are constants (q3k from cache, one thread: 21 -> 25-27 GB/s; q3_k_m tg 1.09-1.12x); a
            // prompt's passes measured 0.91-0.96x so unrolled (q6_k, q3_k_m pp128) and keep them rolled.
            for_chunks<NT == 1>(0, 8, kChunks, [&](int j0) __attribute__((always_inline)) {
                __m256i lo16[NT][H], hi16[NT][H];
                for (int t = 0; t < NT; t++)
                    for (int h = 0; h < H; h++) lo16[t][h] = hi16[t][h] = _mm256_setzero_si256();
                for_chunks<NT == 1>(j0, j0 + kChunks, 1, [&](int j) __attribute__((always_inline)) {
                    __m256i lo[H], hi[H];
                    if constexpr (kPre) {
                        lo[0] = _mm256_load_si256((const __m256i *)(pre + ((size_t)(b / 2) * 8 + j) * 64));
                        hi[0] = _mm256_load_si256((const __m256i *)(pre + ((size_t)(b / 2) * 8 + j) * 64 + 32));
                    } else {
                        for (int h = 0; h < H; h++) decode_pair<kBits>(cb + (half0 + h) * 32, j, lo[h], hi[h]);
                    }
                    for (int t = 0; t < NT; t++) {
                        const __m256i xl = bcast(q[t] + b * kActBlock + 4 * j), xh = bcast(q[t] + (b + 1) * kActBlock + 4 * j);
                        for (int h = 0; h < H; h++) {
                            lo16[t][h] = _mm256_adds_epi16(lo16[t][h], _mm256_maddubs_epi16(lo[h], xl));
                            hi16[t][h] = _mm256_adds_epi16(hi16[t][h], _mm256_maddubs_epi16(hi[h], xh));
                        }
                    }
                });
                for (int h = 0; h < H; h++) {
                    const __m256i m_lo = kKScales ? code16(c + h * 8) : ones, m_hi = kKScales ? code16(c + kTileRows + h * 8) : ones;
                    for (int t = 0; t < NT; t++) {
                        s[0][t][h] = _mm256_add_epi32(s[0][t][h], _mm256_madd_epi16(lo16[t][h], m_lo));
                        s[1][t][h] = _mm256_add_epi32(s[1][t][h], _mm256_madd_epi16(hi16[t][h], m_hi));
                    }
                }
            });
        }
#pragma GCC unroll 2
        for (int p = 0; p < kPer; p++) {  // unrolled, so that s and acc stay in registers (q4, 24 tokens: 1.1x)
            const int bb = b + p;
            const size_t at = (size_t)(bb >> span_shift) * kTileRows + r0;  // the group's scales
            if (!kKScales) {  // plain formats: (d * sum - zero * ds) * scale [+ min * ds]
                for (int h = 0; h < H; h++) {
                    const __m256 ws = f16x8(w.scales + at + h * 8);
                    for (int t = 0; t < NT; t++) {
                        const __m256 sum = _mm256_cvtepi32_ps(s[p][t][h]), dv = _mm256_set1_ps(d[t][bb]);
                        if (kBits == 8) {  // signed codes, no minimum
                            acc[t][h] = _mm256_fmadd_ps(_mm256_mul_ps(sum, dv), ws, acc[t][h]);
                            continue;
                        }
                        acc[t][h] = _mm256_fmadd_ps(_mm256_fmadd_ps(sum, dv, _mm256_set1_ps(-zero * ds[t][bb])), ws, acc[t][h]);
                        if (w.mins) acc[t][h] = _mm256_fmadd_ps(f16x8(w.mins + at + h * 8), _mm256_set1_ps(ds[t][bb]), acc[t][h]);
                    }
                }
                continue;
            }
            // K formats: the super-block's terms before its f16 factors
            for (int h = 0; h < H; h++) {
                const __m256 mc = u8x8(mcode + (size_t)bb * kTileRows + r0 + h * 8);
                for (int t = 0; t < NT; t++) {
                    sacc[t][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[p][t][h]), _mm256_set1_ps(d[t][bb]), sacc[t][h]);
                    macc[t][h] = _mm256_fmadd_ps(mc, _mm256_set1_ps(ds[t][bb]), macc[t][h]);
                }
            }
            if (((bb + 1) & (span - 1)) && bb + 1 < n_blocks) continue;
            for (int h = 0; h < H; h++) {  // the super-block ends: times its factors into acc
                const __m256 f = f16x8(w.k_scale + at + h * 8);
                const __m256 mf = w.k_min ? f16x8(w.k_min + at + h * 8) : _mm256_mul_ps(f, _mm256_set1_ps(-zero));
                for (int t = 0; t < NT; t++) {
                    acc[t][h] = _mm256_fmadd_ps(macc[t][h], mf, _mm256_fmadd_ps(sacc[t][h], f, acc[t][h]));
                    sacc[t][h] = macc[t][h] = _mm256_setzero_ps();
                }
            }
        }
    }
    for (int t = 0; t < NT; t++)
        for (int h = 0; h < H; h++) store_rows8(y + t * ldy + h * 8, acc[t][h], n_rows - h * 8);
}

// The passes over one half of a tile for a prompt's tokens, NT at a time; stream: the first reads the
// tile from memory (prefetched).
template <int kBits, bool kKScales, int NT, bool kPre>
void half_passes(const QuantTile &w, int half, int n, const QuantActs &x, int n_tok, float *yh, size_t ldy, int n_rows,
                 bool stream, const uint8_t *pre) {
    int t = 0;
    for (; t + NT <= n_tok; t += NT)
        tile_dot<kBits, kKScales, NT, 1, kPre>(w, half, n, token_acts(x, n, t), yh + t * ldy, ldy, n_rows, stream && t == 0, pre);
    const QuantActs rest = token_acts(x, n, t);
    stream = stream && t == 0;
    switch (n_tok - t) {
    case 3: tile_dot<kBits, kKScales, 3, 1, kPre>(w, half, n, rest, yh + t * ldy, ldy, n_rows, stream, pre); break;
    case 2: tile_dot<kBits, kKScales, 2, 1, kPre>(w, half, n, rest, yh + t * ldy, ldy, n_rows, stream, pre); break;
    case 1: tile_dot<kBits, kKScales, 1, 1, kPre>(w, half, n, rest, yh + t * ldy, ldy, n_rows, stream, pre); break;
    default: break;
    }
}

// kKScales: w.k_scale is set (a K format), decided once per tile.
template <int kBits, bool kKScales>
void dot_rows_quant(const QuantTile &w, int rows, int n, const QuantActs &x, int n_tok, float *y, size_t ldy) {
    // A few tokens (decoding, a speculative step, a few sessions decoding together) go as one token
    // does: both halves a pass, each 64-byte line read once, 2 tokens a pass (their sums over both
    // halves are more than 16 registers hold, yet it streams faster), the codes decoded again for
    // each pass: up to 8 tokens of 4- and 8-bit codes, 4 of the others, which cost more to decode.
    // Against passes of 3 tokens a half at a time (AMD EPYC Zen 5 at FASTLLM_ISA=avx2, 2 threads,
    // `build/bench_quant_decode 2 5 DTYPES N`, share of the read rate): 2 tokens 56-71% -> 83-100%,
    // 3 tokens 58-61% -> 61-82%, 4 tokens 39-56% -> 56-67%; 6-7 tokens q4, q4k, q8 about 1.0-1.3x,
    // q3k 0.6x, q5k 0.75x.
    constexpr int kPairsMax = kBits == 4 || kBits == 8 ? 8 : 4;
    if (n_tok <= kPairsMax) {
        int t = 0;
        for (; t + 2 <= n_tok; t += 2) tile_dot<kBits, kKScales, 2, 2>(w, 0, n, token_acts(x, n, t), y + t * ldy, ldy, rows, true);
        if (t < n_tok) tile_dot<kBits, kKScales, 1, 2>(w, 0, n, token_acts(x, n, t), y + t * ldy, ldy, rows, true);
        return;
    }
    constexpr int NT = kBits == 8 ? 4 : 3;  // what 16 ymm registers hold
    // 3-, 5- and 6-bit codes cost about as many instructions to decode as the products of 3 tokens
    // take: a prompt decodes each half once into bytes (8 KiB a half at K = 2048, read back from L1)
    // for all its passes (AVX2 EPYC, 110M shape: q5_k_m pp128 1.31x, q3_k_m 1.36x; 4-bit codes,
    // two instructions to decode, no faster).
    constexpr bool kDecodeOnce = kBits == 3 || kBits == 5 || kBits == 6;
    uint8_t *decoded = kDecodeOnce && n_tok > NT ? decoded_codes(n) : nullptr;
    for (int half = 0; half * 8 < rows; half++) {
        const int n_rows = std::min(8, rows - half * 8);
        const bool stream = half == 0;  // the tile comes from memory once, by half 0's first pass or unpacking
        if constexpr (kDecodeOnce) {
            if (decoded) {
                unpack_half<kBits>(w, half, n, decoded, stream);
                half_passes<kBits, kKScales, NT, true>(w, half, n, x, n_tok, y + half * 8, ldy, n_rows, false, decoded);
                continue;
            }
        }
        half_passes<kBits, kKScales, NT, false>(w, half, n, x, n_tok, y + half * 8, ldy, n_rows, stream, nullptr);
    }
}

template <int kBits>
void dot_rows_quant(const QuantTile &w, int rows, int n, const QuantActs &x, int n_tok, float *y, size_t ldy) {
    if constexpr (kBits == 8) return dot_rows_quant<8, false>(w, rows, n, x, n_tok, y, ldy);
    else if (w.k_scale) return dot_rows_quant<kBits, true>(w, rows, n, x, n_tok, y, ldy);
    else return dot_rows_quant<kBits, false>(w, rows, n, x, n_tok, y, ldy);
}

// In place: r[i] (row i, values 0-7) becomes column i (value i of rows 0-7).
inline void transpose8(__m256 r[8]) {
    __m256 t[8], u[8];
    for (int i = 0; i < 8; i += 2) t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]), t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
    for (int g = 0; g < 2; g++) {  // u[4g + c]: rows 4g..4g+3 at column 4l + c of lane l
        const __m256 *q = t + 4 * g;
        u[4 * g + 0] = _mm256_shuffle_ps(q[0], q[2], 0x44), u[4 * g + 1] = _mm256_shuffle_ps(q[0], q[2], 0xEE);
        u[4 * g + 2] = _mm256_shuffle_ps(q[1], q[3], 0x44), u[4 * g + 3] = _mm256_shuffle_ps(q[1], q[3], 0xEE);
    }
    for (int c = 0; c < 4; c++)
        r[c] = _mm256_permute2f128_ps(u[c], u[4 + c], 0x20), r[4 + c] = _mm256_permute2f128_ps(u[c], u[4 + c], 0x31);
}

// The panel in blocks of 8 rows x 8 weights, each transposed in registers.
template <__m256 (*Load8)(const void *, int), float (*Load1)(const void *, int)>
void gemm_pack(const void *w, size_t stride, int rows, int n, float *p) {
    constexpr int C = KernelTable::kGemmCols;
    for (int h = 0; h < C; h += 8) {
        const int rh = std::max(0, std::min(8, rows - h));
        auto row = [&](int i) { return (const char *)w + (size_t)(h + i) * stride; };
        int k = 0;
        for (; k + 8 <= n; k += 8) {
            __m256 r[8];
            for (int i = 0; i < 8; i++) r[i] = i < rh ? Load8(row(i), k) : _mm256_setzero_ps();
            transpose8(r);
            for (int c = 0; c < 8; c++) _mm256_storeu_ps(p + (size_t)(k + c) * C + h, r[c]);
        }
        for (; k < n; k++)
            for (int i = 0; i < 8; i++) p[(size_t)k * C + h + i] = i < rh ? Load1(row(i), k) : 0.0f;
    }
}

// NT tokens x 16 columns (one half of the panel) in 2 * NT of the 16 registers, with the two panel
// loads and a broadcast: per k, 2 * NT FMAs. Columns at and past `cols` are not stored.
template <int NT>
void gemm_tile(const float *p, int n, const float *x, size_t ldx, float *y, size_t ldy, int cols) {
    __m256 c0[NT], c1[NT];
    for (int t = 0; t < NT; t++) c0[t] = _mm256_setzero_ps(), c1[t] = _mm256_setzero_ps();
    for (int k = 0; k < n; k++) {
        const __m256 w0 = _mm256_loadu_ps(p + (size_t)k * 32), w1 = _mm256_loadu_ps(p + (size_t)k * 32 + 8);
        for (int t = 0; t < NT; t++) {
            // x read by value: through _mm256_broadcast_ss's pointer, which may alias the __m256
            // sums, GCC 12 stored every sum to the stack after each FMA (97 -> 189 GFLOP/s at
            // 400 x 1536 x 384, 2 threads).
            const __m256 b = _mm256_set1_ps(x[(size_t)t * ldx + k]);
            c0[t] = _mm256_fmadd_ps(w0, b, c0[t]);
            c1[t] = _mm256_fmadd_ps(w1, b, c1[t]);
        }
    }
    // Columns past `cols` masked off, not branched around.
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256i m0 = _mm256_cmpgt_epi32(_mm256_set1_epi32(cols), lane);
    const __m256i m1 = _mm256_cmpgt_epi32(_mm256_set1_epi32(cols - 8), lane);
    for (int t = 0; t < NT; t++) {
        _mm256_maskstore_ps(y + (size_t)t * ldy, m0, c0[t]);
        _mm256_maskstore_ps(y + (size_t)t * ldy + 8, m1, c1[t]);
    }
}

void gemm_panel(const float *p, int n, const float *x, size_t ldx, int n_tok, float *y, size_t ldy, int cols) {
    static_assert(KernelTable::kGemmCols == 32, "two halves of 16 columns");
    using Tile = void (*)(const float *, int, const float *, size_t, float *, size_t, int);
    static constexpr Tile kTiles[] = {nullptr, gemm_tile<1>, gemm_tile<2>, gemm_tile<3>,
                                      gemm_tile<4>, gemm_tile<5>, gemm_tile<6>};
    // The tokens in as few tiles as fit, of sizes differing by one at most: a decoding row's 7 heads
    // (Qwen2.5-0.5B) as 4 + 3, not 6 + 1, whose one chain of FMAs per half waits on each FMA's
    // latency (Qwen2.5-0.5B tg64 after 4096 tokens 1.02-1.03x, AMD EPYC Zen 3, medians of 7 and 9
    // alternating rounds). A sum's order is the same in any tile.
    constexpr int NT = 6;
    const int tiles = (n_tok + NT - 1) / NT;
    for (int h = 0; h < 32 && h < cols; h += 16)
        for (int i = 0, t = 0; i < tiles; i++) {
            const int nt = n_tok / tiles + (i < n_tok % tiles);
            kTiles[nt](p + h, n, x + (size_t)t * ldx, ldx, y + (size_t)t * ldy + h, ldy, cols - h);
            t += nt;
        }
}

// KernelTable::attn_lanes. A key's scores against 8 queries: each query's 8 sums t_r in one register
// (lane r), a vector of the key's values at a time against the 8 queries' (the FMAs' memory
// operands), so that the 8 chains of FMAs interleave; the 8 registers then reduced together, the
// same pairwise tree for each (lane i: query i).
template <__m256 (*Load8)(const void *, int)>
inline __m256 lane_scores(const void *kr, const float *q, int hd) {
    __m256 acc[8];
    for (int i = 0; i < 8; i++) acc[i] = _mm256_setzero_ps();
    for (int c = 0; c < hd; c += 8) {
        const __m256 kv = Load8(kr, c);
#pragma GCC unroll 8
        for (int i = 0; i < 8; i++) acc[i] = _mm256_fmadd_ps(kv, _mm256_loadu_ps(q + (size_t)i * hd + c), acc[i]);
    }
    // hadd(a, b) = a0+a1, a2+a3, b0+b1, b2+b3 | a4+a5, a6+a7, b4+b5, b6+b7: twice gives each query
    // (t0+t1)+(t2+t3) in the low half and (t4+t5)+(t6+t7) in the high, then the halves added.
    const __m256 h01 = _mm256_hadd_ps(acc[0], acc[1]), h23 = _mm256_hadd_ps(acc[2], acc[3]);
    const __m256 h45 = _mm256_hadd_ps(acc[4], acc[5]), h67 = _mm256_hadd_ps(acc[6], acc[7]);
    const __m256 a = _mm256_hadd_ps(h01, h23), b = _mm256_hadd_ps(h45, h67);
    return _mm256_add_ps(_mm256_permute2f128_ps(a, b, 0x20), _mm256_permute2f128_ps(a, b, 0x31));
}

// The weighted values of queries i0..i0+3, W vectors of a head's values from d0: 4 x W sums in
// registers, each key's weights broadcast (from s, a key's 8 lanes every ls floats) against its
// values' W vectors (gemm_tile's shape).
template <__m256 (*Load8)(const void *, int), int W>
inline void lane_values(const float *s, size_t ls, int i0, const void *v, size_t ldv, int n, int d0, const float *a,
                        float *o, int hd) {
    __m256 acc[4][W];
    for (int t = 0; t < 4; t++)
        for (int w = 0; w < W; w++) acc[t][w] = _mm256_setzero_ps();
    for (int j = 0; j < n; j++) {
        const void *vr = (const char *)v + (size_t)j * ldv;
        __m256 vv[W];
        for (int w = 0; w < W; w++) vv[w] = Load8(vr, d0 + 8 * w);
        for (int t = 0; t < 4; t++) {
            const __m256 p = _mm256_set1_ps(s[(size_t)j * ls + i0 + t]);
            for (int w = 0; w < W; w++) acc[t][w] = _mm256_fmadd_ps(vv[w], p, acc[t][w]);
        }
    }
    for (int t = 0; t < 4; t++) {
        const __m256 at = _mm256_set1_ps(a[i0 + t]);
        for (int w = 0; w < W; w++) {
            float *od = o + (size_t)(i0 + t) * hd + d0 + 8 * w;
            _mm256_storeu_ps(od, _mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(od), at), acc[t][w]));
        }
    }
}

template <__m256 (*Load8)(const void *, int)>
void attn_lanes(const float *q, int nv, int hd, const void *k, size_t ldk, const void *v, size_t ldv, int n,
                const int *lo, const int *hi, float cap, float *m, float *l, float *o, float *s) {
    const size_t ls = (size_t)8 * nv;
    const __m256 neg_inf = _mm256_set1_ps(-INFINITY), capv = _mm256_set1_ps(cap), inv = _mm256_set1_ps(1.0f / cap);
    for (int vi = 0; vi < nv; vi++) {
        const float *qv = q + (size_t)vi * 8 * hd;
        float *sv = s + vi * 8, *ov = o + (size_t)vi * 8 * hd;
        // The queries' bounds; a key outside one's gets the score -inf and the weight 0.
        const __m256i lov = _mm256_loadu_si256((const __m256i *)(lo + vi * 8));
        const __m256i hiv = _mm256_loadu_si256((const __m256i *)(hi + vi * 8));
        auto inside = [&](int j) {
            const __m256i jv = _mm256_set1_epi32(j);
            return _mm256_castsi256_ps(_mm256_andnot_si256(_mm256_cmpgt_epi32(lov, jv), _mm256_cmpgt_epi32(hiv, jv)));
        };
        const __m256 m_old = _mm256_loadu_ps(m + vi * 8);
        __m256 mx = neg_inf;
        for (int j = 0; j < n; j++) {
            __m256 x = lane_scores<Load8>((const char *)k + (size_t)j * ldk, qv, hd);
            if (cap > 0) x = softcap8(x, capv, inv);
            x = _mm256_blendv_ps(neg_inf, x, inside(j));
            _mm256_storeu_ps(sv + j * ls, x);
            mx = _mm256_max_ps(mx, x);
        }
        const __m256 m_new = _mm256_max_ps(m_old, mx);
        const __m256 a = exp8(_mm256_sub_ps(m_old, m_new));  // exp8 takes a NaN (no key yet) as -87.3
        __m256 sum = _mm256_setzero_ps();
        for (int j = 0; j < n; j++) {
            const __m256 p = _mm256_and_ps(exp8(_mm256_sub_ps(_mm256_loadu_ps(sv + j * ls), m_new)), inside(j));
            _mm256_storeu_ps(sv + j * ls, p);
            sum = _mm256_add_ps(sum, p);
        }
        _mm256_storeu_ps(l + vi * 8, _mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(l + vi * 8), a), sum));
        _mm256_storeu_ps(m + vi * 8, m_new);
        alignas(32) float av[8];
        _mm256_store_ps(av, a);
        for (int i0 = 0; i0 < 8; i0 += 4) {
            int d0 = 0;
            for (; d0 + 16 <= hd; d0 += 16) lane_values<Load8, 2>(sv, ls, i0, v, ldv, n, d0, av, ov, hd);
            if (d0 < hd) lane_values<Load8, 1>(sv, ls, i0, v, ldv, n, d0, av, ov, hd);
        }
    }
}

KernelTable::QuantDot quant_for_bits(int bits) {
    return bits == 8 ? dot_rows_quant<8> : bits == 6 ? dot_rows_quant<6> : bits == 5 ? dot_rows_quant<5>
         : bits == 3 ? dot_rows_quant<3> : dot_rows_quant<4>;
}

// dot_rows_quant: filled from the dtype table when the table is first asked for
const KernelTable kPlain = {
    Isa::Avx2,
    {dot_rows<load8_f32, load1_f32>, dot_rows<load8_f16, load1_f16>, dot_rows<load8_bf16, load1_bf16>},
    {to_f32<load8_f32, load1_f32>, to_f32<load8_f16, load1_f16>, to_f32<load8_bf16, load1_bf16>},
    {rows_to_f32<load8_f32, load1_f32>, rows_to_f32<load8_f16, load1_f16>, rows_to_f32<load8_bf16, load1_bf16>},
    swiglu,
    geglu,
    gelu_erf,
    softcap,
    exp_shift_sum,
    reduce_max,
    quantize_acts,
    {},  // dot_rows_quant
    {}, {}, {}, {},  // KV kernels: set by the factory
    {dot_rows_multi<load8_f32, load1_f32>, dot_rows_multi<load8_f16, load1_f16>, dot_rows_multi<load8_bf16, load1_bf16>},
    {gemm_pack<load8_f32, load1_f32>, gemm_pack<load8_f16, load1_f16>, gemm_pack<load8_bf16, load1_bf16>},
    gemm_panel};

}  // namespace

const KernelTable *avx2_kernels() {
    static const KernelTable table = [] {
        KernelTable t = with_quant_kernels(kPlain, quant_for_bits);
        set_scalar_kv_kernels(t);
        const int f32 = (int)KvType::F32, f16 = (int)KvType::F16, q8 = (int)KvType::Q8;
        t.kv_dot[f32] = kv_dot<load8_f32, load1_f32, 4>, t.kv_dot[f16] = kv_dot<load8_f16, load1_f16, 2>;
        t.kv_dot[q8] = kv_dot_q8;
        t.kv_accum[f32] = kv_accum<load8_f32, load1_f32>, t.kv_accum[f16] = kv_accum<load8_f16, load1_f16>;
        t.kv_accum[q8] = kv_accum_q8;
        t.kv_store[f16] = kv_store_f16, t.kv_store[q8] = kv_store_q8;
        t.kv_load[f16] = to_f32<load8_f16, load1_f16>, t.kv_load[q8] = kv_load_q8;
        t.attn_lanes[f32] = attn_lanes<load8_f32>, t.attn_lanes[f16] = attn_lanes<load8_f16>;
        return t;
    }();
    return &table;
}

}  // namespace fastllm
#else
#include "cpu/kernels.h"
namespace fastllm {
const KernelTable *avx2_kernels() { return nullptr; }
}  // namespace fastllm
#endif
