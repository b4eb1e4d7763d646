// kernels_avx512.h — what the AVX-512 table (kernels_avx512.cpp) and the AMX one (kernels_amx.cpp,
// compiled with AVX-512 and AMX) share: reading a quantized tile's codes and factors 16 rows wide,
// a 16 x 16 transpose, and exp.
// Included by those two files only; everything here has internal linkage, so that the linker
// cannot pick one file's copy of a helper for the other's table.
#pragma once
#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>

#include "cpu/kernels.h"

namespace fastllm {
namespace {

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

// x[i] = cap * tanh(x[i] / cap) (KernelTable::softcap), 16 at a time, the last ones masked (the
// same steps for every value). exp16 keeps a NaN a NaN.
inline void softcap_row(float *x, size_t n, float c) {
    const __m512 cap = _mm512_set1_ps(c), inv = _mm512_set1_ps(1.0f / c), one = _mm512_set1_ps(1.0f);
    for (size_t i = 0; i < n; i += 16) {
        const __mmask16 m = n - i >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - i)) - 1);
        const __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + i), inv);
        const __m512 t = exp16(_mm512_mul_ps(_mm512_abs_ps(v), _mm512_set1_ps(-2.0f)));
        const __m512 r = _mm512_div_ps(_mm512_sub_ps(one, t), _mm512_add_ps(one, t));
        const __m512i sign = _mm512_and_si512(_mm512_castps_si512(v), _mm512_set1_epi32(INT32_MIN));
        _mm512_mask_storeu_ps(x + i, m, _mm512_mul_ps(cap, _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(r), sign))));
    }
}

// Each byte's bit `from` moved to bit `to` (the caller masks the rest off).
inline __m512i bits_to(__m512i v, int from, int to) {
    return from >= to ? _mm512_srl_epi16(v, _mm_cvtsi32_si128(from - to)) : _mm512_sll_epi16(v, _mm_cvtsi32_si128(to - from));
}

// Chunk j (< 8) of a pair of blocks of a tile of kBits-wide codes (3, 4, 5 or 6; tensor.h): lo gets
// the first block's 4 codes of each of the 16 rows, hi the second's, one unsigned code a byte.
template <int kBits>
inline void decode_pair(const uint8_t *cb, int j, __m512i &lo, __m512i &hi) {
    const __m512i low4 = _mm512_set1_epi8(0x0F), top2 = _mm512_set1_epi8(0x30), top1 = _mm512_set1_epi8(0x10);
    const __m512i three = _mm512_set1_epi8(3), four = _mm512_set1_epi8(4);
    if (kBits == 3) {  // low 2 bits in chunk j % 4, the top bit in chunk 4 + j % 2
        const __m512i l = _mm512_loadu_si512((const void *)(cb + (j % 4) * 64));
        const __m512i h = _mm512_loadu_si512((const void *)(cb + (4 + j % 2) * 64));
        lo = _mm512_or_si512(_mm512_and_si512(bits_to(l, 2 * (j / 4), 0), three), _mm512_and_si512(bits_to(h, j / 2, 2), four));
        hi = _mm512_or_si512(_mm512_and_si512(bits_to(l, 4 + 2 * (j / 4), 0), three),
                             _mm512_and_si512(bits_to(h, 4 + j / 2, 2), four));
    } else {
        const __m512i v = _mm512_loadu_si512((const void *)(cb + j * 64));
        lo = _mm512_and_si512(v, low4), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), low4);
    }
    if (kBits == 5) {  // bits 2 (j % 4), 2 (j % 4) + 1 of top chunk j / 4 to bit 4
        const __m512i h = _mm512_loadu_si512((const void *)(cb + (8 + j / 4) * 64));
        lo = _mm512_ternarylogic_epi32(lo, bits_to(h, 2 * (j % 4), 4), top1, 0xF8);
        hi = _mm512_ternarylogic_epi32(hi, bits_to(h, 2 * (j % 4) + 1, 4), top1, 0xF8);
    }
    if (kBits == 6) {  // bits 4s, 4s + 2 of the top-bits chunk (s = j % 2) to bit 4 of each code
        const __m512i h = _mm512_loadu_si512((const void *)(cb + (8 + j / 2) * 64));
        const __m512i hl = j % 2 ? h : _mm512_slli_epi16(h, 4);
        const __m512i hh = j % 2 ? _mm512_srli_epi16(h, 2) : _mm512_slli_epi16(h, 2);
        lo = _mm512_ternarylogic_epi32(lo, hl, top2, 0xF8);  // lo | (hl & top2)
        hi = _mm512_ternarylogic_epi32(hi, hh, top2, 0xF8);
    }
}

// In place: r[i] (row i, values 0-15) becomes column i (value i of rows 0-15). Pairs, then
// quadruples within each 128-bit lane, then the lanes themselves.
inline void transpose16(__m512 r[16]) {
    __m512 t[16], u[16];
    for (int i = 0; i < 16; i += 2) t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]), t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    for (int g = 0; g < 4; g++) {  // u[4g + c]: rows 4g..4g+3 at column 4l + c of lane l
        const __m512 *q = t + 4 * g;
        u[4 * g + 0] = _mm512_shuffle_ps(q[0], q[2], 0x44), u[4 * g + 1] = _mm512_shuffle_ps(q[0], q[2], 0xEE);
        u[4 * g + 2] = _mm512_shuffle_ps(q[1], q[3], 0x44), u[4 * g + 3] = _mm512_shuffle_ps(q[1], q[3], 0xEE);
    }
    for (int c = 0; c < 4; c++) {
        const __m512 v0 = _mm512_shuffle_f32x4(u[c], u[4 + c], 0x44), v1 = _mm512_shuffle_f32x4(u[c], u[4 + c], 0xEE);
        const __m512 w0 = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0x44), w1 = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0xEE);
        r[c] = _mm512_shuffle_f32x4(v0, w0, 0x88), r[4 + c] = _mm512_shuffle_f32x4(v0, w0, 0xDD);
        r[8 + c] = _mm512_shuffle_f32x4(v1, w1, 0x88), r[12 + c] = _mm512_shuffle_f32x4(v1, w1, 0xDD);
    }
}

// The 16 rows' scale of group g, and their minimum (has_min dtypes only). Forced inline: GCC 12 left
// group_min a call in tile_dot's loop over blocks, every vector register caller-saved around it
// (decoding from cache, one thread, AMD EPYC Zen 5: q4k 72 -> 81 GB/s, q5k 75 -> 80).
__attribute__((always_inline)) inline __m512 k_value(const uint16_t *factor, const uint8_t *code, int64_t g) {
    const __m512 c = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(code + g * kTileRows))));
    return _mm512_mul_ps(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(factor + (g / 8) * kTileRows))), c);
}
// kK: a K format's (8-bit codes times f16 factors), known where the caller is compiled; without it,
// the tile says.
template <bool kK>
__attribute__((always_inline)) inline __m512 group_scale(const QuantTile &w, int64_t g) {
    if constexpr (kK) return k_value(w.k_scale, w.k_scale_code, g);
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(w.scales + g * kTileRows)));
}
template <bool kK>
__attribute__((always_inline)) inline __m512 group_min(const QuantTile &w, int64_t g) {
    if constexpr (kK) return k_value(w.k_min, w.k_min_code, g);
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(w.mins + g * kTileRows)));
}
__attribute__((always_inline)) inline __m512 group_scale(const QuantTile &w, int64_t g) {
    return w.k_scale ? group_scale<true>(w, g) : group_scale<false>(w, g);
}
__attribute__((always_inline)) inline __m512 group_min(const QuantTile &w, int64_t g) {
    return w.k_min ? group_min<true>(w, g) : group_min<false>(w, g);
}

}  // namespace
}  // namespace fastllm
#endif
