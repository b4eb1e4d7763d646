// kernels_avx2.h — what the AVX2 table (kernels_avx2.cpp) and the AVX-VNNI one (kernels_avxvnni.cpp)
// share: decoding a tile half's codes 8 rows wide, a thread's bytes for them decoded once, widening a
// half's scales and storing its outputs; and a few tokens' pass over both halves of a tile of codes
// narrower than a byte (decode_halves), which the AVX-512 table (kernels_avx512.cpp) takes for one.
// Included by those three files only; everything here has internal linkage, so that the linker
// cannot pick one file's copy of a helper for another's table (each is compiled with its own ISA's
// flags).
#pragma once
#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "cpu/kernels.h"

namespace fastllm {
namespace {

// 8 f16 values, and 8 unsigned bytes, widened to f32 (a half's scales, a K format's scale codes).
inline __m256 f16x8(const uint16_t *p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)); }
inline __m256 u8x8(const uint8_t *p) { return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p))); }

// A half's 8 outputs to y, only the first `rows` of them (none when rows <= 0).
inline void store_rows8(float *y, __m256 v, int rows) {
    if (rows >= 8) {
        _mm256_storeu_ps(y, v);
    } else if (rows > 0) {
        alignas(32) float tmp[8];
        _mm256_store_ps(tmp, v);
        std::memcpy(y, tmp, sizeof(float) * (size_t)rows);
    }
}

// Each byte's bit `from` moved to bit `to` (other bits to be masked off by the caller).
inline __m256i bits_to(__m256i v, int from, int to) {
    return from >= to ? _mm256_srl_epi16(v, _mm_cvtsi32_si128(from - to)) : _mm256_sll_epi16(v, _mm_cvtsi32_si128(to - from));
}

// Chunk j of the pair of blocks at cb (one half of a tile): lo holds block b's codes, hi block b + 1's,
// one unsigned byte each.
template <int kBits>
inline void decode_pair(const uint8_t *cb, int j, __m256i &lo, __m256i &hi) {
    const __m256i low4 = _mm256_set1_epi8(0x0F), top2 = _mm256_set1_epi8(0x30), top1 = _mm256_set1_epi8(0x10),
                  three = _mm256_set1_epi8(3), four = _mm256_set1_epi8(4);
    if (kBits == 3) {  // low 2 bits at 2 (j / 4) (+ 4 for block b + 1) of chunk j % 4, top bit j / 2 (+ 4) of chunk 4 + j % 2
        const __m256i l = _mm256_loadu_si256((const __m256i *)(cb + (j % 4) * 64));
        const __m256i h = _mm256_loadu_si256((const __m256i *)(cb + (4 + j % 2) * 64));
        lo = _mm256_or_si256(_mm256_and_si256(bits_to(l, 2 * (j / 4), 0), three), _mm256_and_si256(bits_to(h, j / 2, 2), four));
        hi = _mm256_or_si256(_mm256_and_si256(bits_to(l, 4 + 2 * (j / 4), 0), three),
                             _mm256_and_si256(bits_to(h, 4 + j / 2, 2), four));
    } else {
        const __m256i v = _mm256_loadu_si256((const __m256i *)(cb + j * 64));
        lo = _mm256_and_si256(v, low4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);
    }
    if (kBits == 5) {  // bits 2 (j % 4), 2 (j % 4) + 1 of top chunk j / 4 to bit 4 of each code
        const __m256i h = _mm256_loadu_si256((const __m256i *)(cb + (8 + j / 4) * 64));
        lo = _mm256_or_si256(lo, _mm256_and_si256(bits_to(h, 2 * (j % 4), 4), top1));
        hi = _mm256_or_si256(hi, _mm256_and_si256(bits_to(h, 2 * (j % 4) + 1, 4), top1));
    }
    if (kBits == 6) {  // bits 4s, 4s + 2 of the top-bits chunk (s = j % 2) to bit 4 of each code
        const __m256i h = _mm256_loadu_si256((const __m256i *)(cb + (8 + j / 2) * 64));
        const __m256i hl = j % 2 ? h : _mm256_slli_epi16(h, 4);
        const __m256i hh = j % 2 ? _mm256_srli_epi16(h, 2) : _mm256_slli_epi16(h, 2);
        lo = _mm256_or_si256(lo, _mm256_and_si256(hl, top2));
        hi = _mm256_or_si256(hi, _mm256_and_si256(hh, top2));
    }
}

// Half h's 8 rows' scale of group g, and their minimum; kK: a K format's (8-bit codes times f16
// factors).
template <bool kK>
inline __m256 half_scale(const QuantTile &w, int64_t g, int h) {
    if constexpr (kK) return _mm256_mul_ps(f16x8(w.k_scale + (g / 8) * kTileRows + h * 8), u8x8(w.k_scale_code + g * kTileRows + h * 8));
    return f16x8(w.scales + g * kTileRows + h * 8);
}
template <bool kK>
inline __m256 half_min(const QuantTile &w, int64_t g, int h) {
    if constexpr (kK) return _mm256_mul_ps(f16x8(w.k_min + (g / 8) * kTileRows + h * 8), u8x8(w.k_min_code + g * kTileRows + h * 8));
    return f16x8(w.mins + g * kTileRows + h * 8);
}

// What a pass of NT tokens over H halves of a tile from half0 keeps: the tokens' activations, and
// the halves' outputs, to which finish_block adds a block's int32 sums times the block's scales with
// the AVX-512 kernel's operations (kernels_avx512.cpp, tile_dot), so the same bits: (d * sum - zero
// * ds) * scale, or d * sum * scale + min * ds. kK, kMin as half_scale, half_min.
template <int kBits, bool kK, bool kMin, int NT, int H>
struct HalfOutputs {
    static constexpr float kZero = kMin ? 0.0f : (float)(1 << (kBits - 1));
    const QuantTile &w;
    const int half0, group_shift;  // group_shift: block -> group
    const int8_t *q[NT];
    const float *d[NT], *ds[NT];
    __m256 acc[H][NT];

    __attribute__((always_inline)) HalfOutputs(const QuantTile &w_, int half0_, int n, const QuantActs &x)
        : w(w_), half0(half0_), group_shift(kK || w_.group == 32 ? 0 : w_.group == 128 ? 2 : 1) {
        for (int t = 0; t < NT; t++) {
            const QuantActs a = token_acts(x, n, t);
            q[t] = a.q, d[t] = a.d, ds[t] = a.ds;
        }
        for (int h = 0; h < H; h++)
            for (int t = 0; t < NT; t++) acc[h][t] = _mm256_setzero_ps();
    }
    // Token t's 4 activation bytes from i, broadcast to every lane.
    __attribute__((always_inline)) __m256i acts4(int t, int i) const {
        int32_t four;
        std::memcpy(&four, q[t] + i, 4);
        return _mm256_set1_epi32(four);
    }
    __attribute__((always_inline)) void finish_block(int b, int h, const __m256i *sum) {
        const int g = b >> group_shift;
        const __m256 ws = half_scale<kK>(w, g, half0 + h);
        if constexpr (kMin) {
            const __m256 mn = half_min<kK>(w, g, half0 + h);
            for (int t = 0; t < NT; t++) {
                const __m256 f = _mm256_mul_ps(_mm256_cvtepi32_ps(sum[t]), _mm256_set1_ps(d[t][b]));
                acc[h][t] = _mm256_fmadd_ps(mn, _mm256_set1_ps(ds[t][b]), _mm256_fmadd_ps(f, ws, acc[h][t]));
            }
        } else {
            for (int t = 0; t < NT; t++) {
                const __m256 f = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum[t]), _mm256_set1_ps(d[t][b]), _mm256_set1_ps(-kZero * ds[t][b]));
                acc[h][t] = _mm256_fmadd_ps(f, ws, acc[h][t]);
            }
        }
    }
    // The outputs to y (token t at y + t * ldy), only the first n_rows rows from half0's first.
    __attribute__((always_inline)) void store(float *y, size_t ldy, int n_rows) const {
        for (int h = 0; h < H; h++)
            for (int t = 0; t < NT; t++) store_rows8(y + t * ldy + h * 8, acc[h][t], n_rows - h * 8);
    }
};

// NT tokens through a tile's first n_rows rows of kBits-wide codes (3-6), streamed from memory:
// both halves of 8 rows a pair of blocks at a time, each 64-byte line read once (prefetched) and
// each of its 32-byte halves decoded once by decode_pair for all NT tokens, one vpdpbusd with 4
// bytes of a token's activations broadcast advancing a half's 8 rows, each block scaled by
// HalfOutputs. Dot is the table's 256-bit vpdpbusd (AVX-VNNI's VEX form, AVX-512's EVEX one).
template <int kBits, bool kK, bool kMin, __m256i (*Dot)(__m256i, __m256i, __m256i), int NT = 1>
void decode_halves(const QuantTile &w, int n, const QuantActs &x, float *y, size_t ldy, int n_rows) {
    HalfOutputs<kBits, kK, kMin, NT, 2> out(w, 0, n, x);
    for (int b = 0; b < n / kActBlock; b += 2) {
        __m256i lo_sum[2][NT], hi_sum[2][NT];
        for (int h = 0; h < 2; h++)
            for (int t = 0; t < NT; t++) lo_sum[h][t] = hi_sum[h][t] = _mm256_setzero_si256();
        const uint8_t *cb = w.codes + (size_t)(b / 2) * 128 * kBits;
        prefetch_ahead(cb, 128 * kBits);
#pragma GCC unroll 8
        for (int j = 0; j < 8; j++)
            for (int h = 0; h < 2; h++) {
                __m256i lo, hi;
                decode_pair<kBits>(cb + h * 32, j, lo, hi);
                for (int t = 0; t < NT; t++) {
                    lo_sum[h][t] = Dot(lo_sum[h][t], lo, out.acts4(t, b * kActBlock + 4 * j));
                    hi_sum[h][t] = Dot(hi_sum[h][t], hi, out.acts4(t, (b + 1) * kActBlock + 4 * j));
                }
            }
        for (int h = 0; h < 2; h++) out.finish_block(b, h, lo_sum[h]), out.finish_block(b + 1, h, hi_sum[h]);
    }
    out.store(y, ldy, n_rows);
}

// The thread's bytes for a half's decoded codes (n x 8 bytes, 32-byte aligned), one buffer for every
// code width: the kernels get no scratch, and a thread runs one tile at a time.
inline uint8_t *decoded_codes(int n) {
    static thread_local std::vector<uint8_t> bytes;
    if (bytes.size() < (size_t)n * 8 + 32) bytes.resize((size_t)n * 8 + 32);
    return bytes.data() + (32 - (uintptr_t)bytes.data() % 32) % 32;
}

// One half's codes of a tile (3, 5, 6 bits), decoded by decode_pair into bytes: for each pair of
// blocks and chunk j, the first block's 32 bytes, then the second's.
template <int kBits>
void unpack_half(const QuantTile &w, int half, int n, uint8_t *out, bool stream) {
    for (int b = 0; b < n / kActBlock; b += 2) {
        const uint8_t *cb = w.codes + (size_t)(b / 2) * 128 * kBits;
        if (stream) prefetch_ahead(cb, 128 * kBits);
        for (int j = 0; j < 8; j++, out += 64) {
            __m256i lo, hi;
            decode_pair<kBits>(cb + half * 32, j, lo, hi);
            _mm256_store_si256((__m256i *)out, lo);
            _mm256_store_si256((__m256i *)(out + 32), hi);
        }
    }
}

}  // namespace
}  // namespace fastllm
#endif
