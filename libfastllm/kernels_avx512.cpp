// AVX-512 (F, BW, VL, VNNI) kernels. This file alone is compiled with -mavx512f -mavx512bw -mavx512vl
// -mavx512vnni; its table is used only when CPUID reports those features.
#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels.h"

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
inline float load1_f32(const void *p, int i) { return ((const float *)p)[i]; }
inline float load1_f16(const void *p, int i) { return f16_to_f32(((const uint16_t *)p)[i]); }
inline float load1_bf16(const void *p, int i) { return bf16_to_f32(((const uint16_t *)p)[i]); }

inline float hsum(__m512 v) { return _mm512_reduce_add_ps(v); }

// Four rows at a time share each load of x; two accumulators per row hide FMA latency.
template <__m512 (*Load16)(const void *, int), float (*Load1)(const void *, int)>
void dot_rows(const void *w, size_t stride, int rows, const float *x, int n, float *y) {
    const char *base = (const char *)w;
    int r = 0;
    for (; r + 4 <= rows; r += 4) {
        const void *w0 = base + (size_t)r * stride, *w1 = base + (size_t)(r + 1) * stride;
        const void *w2 = base + (size_t)(r + 2) * stride, *w3 = base + (size_t)(r + 3) * stride;
        __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps(), a2 = _mm512_setzero_ps(), a3 = _mm512_setzero_ps();
        int i = 0;
        for (; i + 16 <= n; i += 16) {
            __m512 xv = _mm512_loadu_ps(x + i);
            a0 = _mm512_fmadd_ps(Load16(w0, i), xv, a0);
            a1 = _mm512_fmadd_ps(Load16(w1, i), xv, a1);
            a2 = _mm512_fmadd_ps(Load16(w2, i), xv, a2);
            a3 = _mm512_fmadd_ps(Load16(w3, i), xv, a3);
        }
        float s0 = hsum(a0), s1 = hsum(a1), s2 = hsum(a2), s3 = hsum(a3);
        for (; i < n; i++) {
            s0 += Load1(w0, i) * x[i];
            s1 += Load1(w1, i) * x[i];
            s2 += Load1(w2, i) * x[i];
            s3 += Load1(w3, i) * x[i];
        }
        y[r] = s0, y[r + 1] = s1, y[r + 2] = s2, y[r + 3] = s3;
    }
    for (; r < rows; r++) {
        const void *wr = base + (size_t)r * stride;
        __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
        int i = 0;
        for (; i + 32 <= n; i += 32) {
            a0 = _mm512_fmadd_ps(Load16(wr, i), _mm512_loadu_ps(x + i), a0);
            a1 = _mm512_fmadd_ps(Load16(wr, i + 16), _mm512_loadu_ps(x + i + 16), a1);
        }
        for (; i + 16 <= n; i += 16) a0 = _mm512_fmadd_ps(Load16(wr, i), _mm512_loadu_ps(x + i), a0);
        float s = hsum(_mm512_add_ps(a0, a1));
        for (; i < n; i++) s += Load1(wr, i) * x[i];
        y[r] = s;
    }
}

template <__m512 (*Load16)(const void *, int), float (*Load1)(const void *, int)>
void to_f32(const void *src, float *dst, int n) {
    int i = 0;
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(dst + i, Load16(src, i));
    for (; i < n; i++) dst[i] = Load1(src, i);
}

// 64 outputs at a time stay in registers while all n rows pass.
void weighted_rows(const float *a, int n, const float *rows, size_t stride, int dim, float *y) {
    int i = 0;
    for (; i + 64 <= dim; i += 64) {
        __m512 y0 = _mm512_setzero_ps(), y1 = _mm512_setzero_ps(), y2 = _mm512_setzero_ps(), y3 = _mm512_setzero_ps();
        for (int j = 0; j < n; j++) {
            const float *r = rows + j * stride + i;
            const __m512 aj = _mm512_set1_ps(a[j]);
            y0 = _mm512_fmadd_ps(aj, _mm512_loadu_ps(r), y0);
            y1 = _mm512_fmadd_ps(aj, _mm512_loadu_ps(r + 16), y1);
            y2 = _mm512_fmadd_ps(aj, _mm512_loadu_ps(r + 32), y2);
            y3 = _mm512_fmadd_ps(aj, _mm512_loadu_ps(r + 48), y3);
        }
        _mm512_storeu_ps(y + i, y0), _mm512_storeu_ps(y + i + 16, y1);
        _mm512_storeu_ps(y + i + 32, y2), _mm512_storeu_ps(y + i + 48, y3);
    }
    for (; i + 16 <= dim; i += 16) {
        __m512 acc = _mm512_setzero_ps();
        for (int j = 0; j < n; j++) acc = _mm512_fmadd_ps(_mm512_set1_ps(a[j]), _mm512_loadu_ps(rows + j * stride + i), acc);
        _mm512_storeu_ps(y + i, acc);
    }
    for (; i < dim; i++) {
        float acc = 0;
        for (int j = 0; j < n; j++) acc += a[j] * rows[j * stride + i];
        y[i] = acc;
    }
}


// exp as in kernels_avx2.cpp (2^k * Taylor series of exp(r) to r^7); vscalefps applies 2^k and
// handles overflow to inf and underflow to 0 itself.
inline __m512 exp16(__m512 x) {
    const __m512 k = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(k, _mm512_set1_ps(0.693145752f), x);
    r = _mm512_fnmadd_ps(k, _mm512_set1_ps(1.42860677e-6f), r);
    __m512 p = _mm512_set1_ps(1.0f / 5040);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, k);
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

// NT tokens (1..4) at once share each load and unpack of the weight codes.
template <bool kQ4, int NT>
void dot_rows_quant_nt(const QuantRows &w, int rows, int n, const QuantActs &x0, float *y, size_t ldy) {
    const int groups = n / w.group, row_bytes = kQ4 ? n / 2 : n, n_blocks = n / kActBlock;
    const int shift = w.group == 128 ? 2 : w.group == 64 ? 1 : 0;  // block -> group: b >> shift
    const float zero = w.mins ? 0.0f : (kQ4 ? 8.0f : 128.0f);
    const __m256i low4 = _mm256_set1_epi8(0x0F);
    const __m512i pair0 = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
    const __m512i group_of =
        _mm512_srli_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15), shift);
    QuantActs x[NT];
    for (int t = 0; t < NT; t++) x[t] = token_acts(x0, n, t);
    for (int r = 0; r < rows; r++) {
        const uint8_t *qr = w.quants + (size_t)r * row_bytes;
        const uint16_t *sc = w.scales + (size_t)r * groups;
        const uint16_t *mn = w.mins ? w.mins + (size_t)r * groups : nullptr;
        __m512 acc[NT], corr[NT];
        float tail[NT];
        for (int t = 0; t < NT; t++) acc[t] = _mm512_setzero_ps(), corr[t] = _mm512_setzero_ps(), tail[t] = 0;
        for (int b0 = 0; b0 < n_blocks; b0 += 16) {
            const int cnt = std::min(16, n_blocks - b0), n_g = (cnt + (1 << shift) - 1) >> shift;
            const __mmask16 bm = (__mmask16)((1u << cnt) - 1), gm = (__mmask16)((1u << n_g) - 1);
            const __m512 wsv = _mm512_maskz_permutexvar_ps(
                bm, group_of, _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(gm, sc + (b0 >> shift))));
            __m512 base = _mm512_mul_ps(_mm512_set1_ps(-zero), wsv);  // per block: min - zero * scale
            if (mn)
                base = _mm512_add_ps(base, _mm512_maskz_permutexvar_ps(bm, group_of,
                                                                       _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(
                                                                           gm, mn + (b0 >> shift)))));
            __m512 scale[NT];
            for (int t = 0; t < NT; t++) {
                scale[t] = _mm512_mul_ps(wsv, _mm512_maskz_loadu_ps(bm, x[t].d + b0));
                corr[t] = _mm512_fmadd_ps(base, _mm512_maskz_loadu_ps(bm, x[t].ds + b0), corr[t]);
            }
            int j = 0;
            if (kQ4) {
                // 4 blocks per 64-byte load: low nibbles hold blocks j and j + 2, high nibbles j + 1
                // and j + 3; the activations are paired to match (two 32-byte halves each).
                const __m512i low4z = _mm512_set1_epi8(0x0F), pair0x2 = _mm512_add_epi32(pair0, pair0);
                for (; j + 4 <= cnt; j += 4) {
                    const int b = b0 + j;
                    const __m512i bytes = _mm512_loadu_si512((const void *)(qr + (b / 2) * 32));
                    const __m512i lo = _mm512_and_si512(bytes, low4z);
                    const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(bytes, 4), low4z);
                    const __m512i idx_lo = _mm512_add_epi32(pair0x2, _mm512_set1_epi32(j));
                    const __m512i idx_hi = _mm512_add_epi32(pair0x2, _mm512_set1_epi32(j + 1));
                    for (int t = 0; t < NT; t++) {
                        const int8_t *xq = x[t].q + b * kActBlock;
                        const __m512i xlo = _mm512_inserti64x4(
                            _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)xq)),
                            _mm256_loadu_si256((const __m256i *)(xq + 2 * kActBlock)), 1);
                        const __m512i xhi = _mm512_inserti64x4(
                            _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(xq + kActBlock))),
                            _mm256_loadu_si256((const __m256i *)(xq + 3 * kActBlock)), 1);
                        const __m512i plo = _mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, xlo);
                        const __m512i phi = _mm512_dpbusd_epi32(_mm512_setzero_si512(), hi, xhi);
                        acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(plo), _mm512_permutexvar_ps(idx_lo, scale[t]), acc[t]);
                        acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(phi), _mm512_permutexvar_ps(idx_hi, scale[t]), acc[t]);
                    }
                }
            }
            for (; j + 2 <= cnt; j += 2) {
                const int b = b0 + j;
                __m512i codes;
                if (kQ4) {
                    const __m256i bytes = _mm256_loadu_si256((const __m256i *)(qr + (b / 2) * 32));
                    codes = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_and_si256(bytes, low4)),
                                               _mm256_and_si256(_mm256_srli_epi16(bytes, 4), low4), 1);
                } else {
                    codes = _mm512_loadu_si512((const void *)(qr + b * kActBlock));
                }
                const __m512i idx = _mm512_add_epi32(pair0, _mm512_set1_epi32(j));
                for (int t = 0; t < NT; t++) {
                    const __m512i p = _mm512_dpbusd_epi32(_mm512_setzero_si512(), codes,
                                                          _mm512_loadu_si512((const void *)(x[t].q + b * kActBlock)));
                    acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), _mm512_permutexvar_ps(idx, scale[t]), acc[t]);
                }
            }
            if (j < cnt) {  // q8 rows may hold an odd number of blocks (q4 rows never do)
                const int b = b0 + j;
                const __m256i wv = _mm256_loadu_si256((const __m256i *)(qr + b * kActBlock));
                for (int t = 0; t < NT; t++) {
                    const __m256 f = _mm256_cvtepi32_ps(_mm256_dpbusd_epi32(
                        _mm256_setzero_si256(), wv, _mm256_loadu_si256((const __m256i *)(x[t].q + b * kActBlock))));
                    __m128 h = _mm_add_ps(_mm256_castps256_ps128(f), _mm256_extractf128_ps(f, 1));
                    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
                    h = _mm_add_ss(h, _mm_movehdup_ps(h));
                    alignas(64) float sv[16];
                    _mm512_store_ps(sv, scale[t]);
                    tail[t] += sv[j] * _mm_cvtss_f32(h);
                }
            }
        }
        for (int t = 0; t < NT; t++) y[t * ldy + r] = hsum(acc[t]) + hsum(corr[t]) + tail[t];
    }
}

// VNNI: vpdpbusd multiplies unsigned weight codes by signed activations and sums into int32, two
// blocks of 32 per instruction. Blocks are taken 16 at a time: their scales are widened into one
// vector, multiplied by the activation scales at once and spread to block pairs with a permute;
// the weights' zero point (128 for q8, 8 for q4) and q4m's minimums become 16-wide dot products
// with the activations' block sums.
template <bool kQ4>
void dot_rows_quant(const QuantRows &w, int rows, int n, const QuantActs &x, int n_tok, float *y, size_t ldy) {
    int t = 0;
    for (; t + 4 <= n_tok; t += 4) dot_rows_quant_nt<kQ4, 4>(w, rows, n, token_acts(x, n, t), y + t * ldy, ldy);
    switch (n_tok - t) {
    case 3: dot_rows_quant_nt<kQ4, 3>(w, rows, n, token_acts(x, n, t), y + t * ldy, ldy); break;
    case 2: dot_rows_quant_nt<kQ4, 2>(w, rows, n, token_acts(x, n, t), y + t * ldy, ldy); break;
    case 1: dot_rows_quant_nt<kQ4, 1>(w, rows, n, token_acts(x, n, t), y + t * ldy, ldy); break;
    default: break;
    }
}

// Prompt batches. The 16 rows are packed so that one 64-byte vector holds 4 consecutive codes of
// each row (lane r = row r): then one vpdpbusd with 4 bytes of a token's activations broadcast
// advances 16 rows at once, the int32 sums of a block of 32 need no horizontal add, and the scale
// is applied once per block, 16 rows wide. Packing costs one gather per 64 bytes, once per tile,
// against n_tok x 8 vpdpbusd per block that reuse it.
// 16 x 16 transpose of 32-bit elements: afterwards r[j] lane i holds what r[i] lane j held.
void transpose16x16(__m512i r[16]) {
    __m512i a[16], c[16];
    for (int p = 0; p < 8; p++) {  // pairs of rows, interleaved by dwords
        a[2 * p] = _mm512_unpacklo_epi32(r[2 * p], r[2 * p + 1]);
        a[2 * p + 1] = _mm512_unpackhi_epi32(r[2 * p], r[2 * p + 1]);
    }
    for (int q = 0; q < 4; q++) {  // c[4q + m], 128-bit lane L: rows 4q..4q+3 of column 4L + m
        const __m512i lo0 = a[4 * q], hi0 = a[4 * q + 1], lo1 = a[4 * q + 2], hi1 = a[4 * q + 3];
        c[4 * q + 0] = _mm512_unpacklo_epi64(lo0, lo1);
        c[4 * q + 1] = _mm512_unpackhi_epi64(lo0, lo1);
        c[4 * q + 2] = _mm512_unpacklo_epi64(hi0, hi1);
        c[4 * q + 3] = _mm512_unpackhi_epi64(hi0, hi1);
    }
    for (int m = 0; m < 4; m++) {  // a 4 x 4 transpose of 128-bit lanes
        const __m512i d0 = _mm512_shuffle_i32x4(c[m], c[4 + m], 0x88), d1 = _mm512_shuffle_i32x4(c[m], c[4 + m], 0xDD);
        const __m512i d2 = _mm512_shuffle_i32x4(c[8 + m], c[12 + m], 0x88);
        const __m512i d3 = _mm512_shuffle_i32x4(c[8 + m], c[12 + m], 0xDD);
        r[m] = _mm512_shuffle_i32x4(d0, d2, 0x88);
        r[8 + m] = _mm512_shuffle_i32x4(d0, d2, 0xDD);
        r[4 + m] = _mm512_shuffle_i32x4(d1, d3, 0x88);
        r[12 + m] = _mm512_shuffle_i32x4(d1, d3, 0xDD);
    }
}

// Packs 16 rows x 64 bytes from `src` (row stride row_bytes): out[j] lane i = dword j of row i.
// Rows past `rows` read as zeros (and are never touched in memory).
inline void load_transposed(const uint8_t *src, size_t row_bytes, int rows, __m512i out[16]) {
    for (int i = 0; i < 16; i++)
        out[i] = i < rows ? _mm512_loadu_si512((const void *)(src + i * row_bytes)) : _mm512_setzero_si512();
    transpose16x16(out);
}

// The same for one dword column j of 16 rows (the tails that do not fill 64 bytes).
inline __m512i gather_column(const uint8_t *src, int row_bytes, int rows) {
    const __m512i row_off = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                               _mm512_set1_epi32(row_bytes));
    return _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), (__mmask16)((1u << rows) - 1), row_off,
                                       (const void *)src, 1);
}

template <bool kQ4>
void pack_rows(const QuantRows &w, int rows, int n, uint8_t *codes, float *ws, float *base) {
    const int n_blocks = n / kActBlock, groups = n / w.group, row_bytes = kQ4 ? n / 2 : n;
    auto put = [&](int block, int j, __m512i v) { _mm512_storeu_si512((void *)(codes + (block * 8 + j) * 64), v); };
    if (!kQ4) {  // 64 bytes of a row = blocks b and b + 1
        int b = 0;
        for (; b + 2 <= n_blocks; b += 2) {
            __m512i t[16];
            load_transposed(w.quants + b * 32, row_bytes, rows, t);
            for (int j = 0; j < 16; j++) put(b, j, t[j]);
        }
        for (; b < n_blocks; b++)
            for (int j = 0; j < 8; j++) put(b, j, gather_column(w.quants + b * 32 + 4 * j, row_bytes, rows));
    } else {  // 32 bytes of a row = blocks b (low nibbles) and b + 1 (high nibbles)
        const __m512i low4 = _mm512_set1_epi8(0x0F);
        auto put_pair = [&](int b, int j, __m512i v) {
            put(b, j, _mm512_and_si512(v, low4));
            put(b + 1, j, _mm512_and_si512(_mm512_srli_epi16(v, 4), low4));
        };
        int b = 0;
        for (; b + 4 <= n_blocks; b += 4) {
            __m512i t[16];
            load_transposed(w.quants + b * 16, row_bytes, rows, t);
            for (int j = 0; j < 8; j++) put_pair(b, j, t[j]), put_pair(b + 2, j, t[8 + j]);
        }
        for (; b < n_blocks; b += 2)
            for (int j = 0; j < 8; j++) put_pair(b, j, gather_column(w.quants + b * 16 + 4 * j, row_bytes, rows));
    }
    const float zero = w.mins ? 0.0f : (kQ4 ? 8.0f : 128.0f);
    const int blocks_per_group = w.group / kActBlock;
    for (int r = 0; r < kGemmRows; r++)
        for (int g = 0; g < groups; g++) {
            const float s = r < rows ? f16s(w.scales[(size_t)r * groups + g]) : 0.0f;
            const float m = r < rows && w.mins ? f16s(w.mins[(size_t)r * groups + g]) : 0.0f;
            for (int b = g * blocks_per_group; b < (g + 1) * blocks_per_group; b++) {
                ws[b * kGemmRows + r] = s;
                base[b * kGemmRows + r] = m - zero * s;
            }
        }
}

// NT tokens x 16 rows: NT int32 accumulators per block, NT float accumulators overall.
template <int NT>
void gemm_tile(const uint8_t *codes, const float *ws, const float *base, int n, const QuantActs &x0, float *y,
               size_t ldy, __mmask16 rm) {
    const int n_blocks = n / kActBlock;
    const int8_t *q[NT];
    const float *d[NT], *ds[NT];
    for (int t = 0; t < NT; t++) {
        const QuantActs a = token_acts(x0, n, t);
        q[t] = a.q, d[t] = a.d, ds[t] = a.ds;
    }
    __m512 acc[NT];
    for (int t = 0; t < NT; t++) acc[t] = _mm512_setzero_ps();
    for (int b = 0; b < n_blocks; b++) {
        __m512i sum[NT];
        for (int t = 0; t < NT; t++) sum[t] = _mm512_setzero_si512();
        const uint8_t *cb = codes + b * 512;
        for (int j = 0; j < 8; j++) {
            const __m512i wv = _mm512_loadu_si512((const void *)(cb + j * 64));
            for (int t = 0; t < NT; t++) {
                int32_t four;
                std::memcpy(&four, q[t] + b * kActBlock + 4 * j, 4);
                sum[t] = _mm512_dpbusd_epi32(sum[t], wv, _mm512_set1_epi32(four));
            }
        }
        const __m512 wsb = _mm512_loadu_ps(ws + b * kGemmRows), bb = _mm512_loadu_ps(base + b * kGemmRows);
        for (int t = 0; t < NT; t++) {
            const __m512 f = _mm512_mul_ps(_mm512_cvtepi32_ps(sum[t]), _mm512_set1_ps(d[t][b]));
            acc[t] = _mm512_fmadd_ps(f, wsb, acc[t]);
            acc[t] = _mm512_fmadd_ps(bb, _mm512_set1_ps(ds[t][b]), acc[t]);
        }
    }
    for (int t = 0; t < NT; t++) _mm512_mask_storeu_ps(y + t * ldy, rm, acc[t]);
}

template <bool kQ4>
void gemm_quant(const QuantRows &w, int rows, int n, const QuantActs &x, int n_tok, float *y, size_t ldy, void *pack) {
    uint8_t *codes = (uint8_t *)pack;
    float *ws = (float *)(codes + (size_t)kGemmRows * n), *base = ws + (size_t)kGemmRows * (n / kActBlock);
    pack_rows<kQ4>(w, rows, n, codes, ws, base);
    const __mmask16 rm = (__mmask16)((1u << rows) - 1);
    constexpr int NT = 8;
    int t = 0;
    for (; t + NT <= n_tok; t += NT) gemm_tile<NT>(codes, ws, base, n, token_acts(x, n, t), y + t * ldy, ldy, rm);
    const QuantActs rest = token_acts(x, n, t);
    float *yr = y + t * ldy;
    switch (n_tok - t) {
    case 7: gemm_tile<7>(codes, ws, base, n, rest, yr, ldy, rm); break;
    case 6: gemm_tile<6>(codes, ws, base, n, rest, yr, ldy, rm); break;
    case 5: gemm_tile<5>(codes, ws, base, n, rest, yr, ldy, rm); break;
    case 4: gemm_tile<4>(codes, ws, base, n, rest, yr, ldy, rm); break;
    case 3: gemm_tile<3>(codes, ws, base, n, rest, yr, ldy, rm); break;
    case 2: gemm_tile<2>(codes, ws, base, n, rest, yr, ldy, rm); break;
    case 1: gemm_tile<1>(codes, ws, base, n, rest, yr, ldy, rm); break;
    default: break;
    }
}

const KernelTable kTable = {
    Isa::Avx512,
    {dot_rows<load16_f32, load1_f32>, dot_rows<load16_f16, load1_f16>, dot_rows<load16_bf16, load1_bf16>},
    {to_f32<load16_f32, load1_f32>, to_f32<load16_f16, load1_f16>, to_f32<load16_bf16, load1_bf16>},
    weighted_rows,
    swiglu,
    exp_shift_sum,
    quantize_acts,
    {nullptr, nullptr, nullptr, dot_rows_quant<false>, dot_rows_quant<true>, dot_rows_quant<true>, dot_rows_quant<true>,
     dot_rows_quant<true>},
    {nullptr, nullptr, nullptr, gemm_quant<false>, gemm_quant<true>, gemm_quant<true>, gemm_quant<true>, gemm_quant<true>}};

}  // namespace

const KernelTable *avx512_kernels() { return &kTable; }

}  // namespace fastllm
#else
#include "kernels.h"
namespace fastllm {
const KernelTable *avx512_kernels() { return nullptr; }
}  // namespace fastllm
#endif
