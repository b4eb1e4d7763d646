// kernels_neon.h — the quantized tile dot of the two aarch64 tables, parameterized by the int8 dot
// primitive: plain NEON widening multiplies (kernels_neon.cpp) or SDOT (kernels_neon_dot.cpp,
// compiled with +dotprod). Included by those two files only. Everything here has internal linkage,
// so that the linker cannot pick the +dotprod file's copy of a helper for the plain NEON table.
#pragma once
#if defined(__aarch64__)
#include <arm_neon.h>

#include <cstring>
#include <type_traits>

#include "cpu/kernels.h"

namespace fastllm {
namespace {

// Each byte's bit `from` moved to bit `to` (a signed shift per byte: bits leaving a byte are
// dropped, none come in from its neighbours); the caller masks off the other bits.
inline uint8x16_t bits_to(uint8x16_t v, int from, int to) { return vshlq_u8(v, vdupq_n_s8((int8_t)(to - from))); }

inline float32x4_t f16x4(const uint16_t *p) { return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(p))); }
inline float32x4_t u8x4(const uint8_t *p) {  // 4 bytes, not 8: the last group's codes end an array
    uint32_t four;
    std::memcpy(&four, p, 4);
    return vcvtq_f32_u32(vmovl_u16(vget_low_u16(vmovl_u8(vcreate_u8(four)))));
}

// f(std::integral_constant<int, L>) for L = 0, 1, 2, 3: the lane of a dot must be a constant.
template <class F>
inline void for_lanes(F f) {
    f(std::integral_constant<int, 0>{}), f(std::integral_constant<int, 1>{});
    f(std::integral_constant<int, 2>{}), f(std::integral_constant<int, 3>{});
}

// Block pair codes (kBits < 8) of chunk j (< 8) of a quad: lo of block 2p, hi of block 2p + 1;
// c points at the quad's 16 bytes of the pair's first chunk (tile_code in tensor.h has the layout).
template <int kBits>
inline void unpack_pair(const uint8_t *c, int j, uint8x16_t &lo, uint8x16_t &hi) {
    if (kBits == 3) {  // low 2 bits at 2 (j / 4) (+ 4 for block 2p + 1) of chunk j % 4, top bit j / 2 (+ 4) of chunk 4 + j % 2
        const uint8x16_t three = vdupq_n_u8(3), four = vdupq_n_u8(4);
        const uint8x16_t l = vld1q_u8(c + (j % 4) * 64), h = vld1q_u8(c + (4 + j % 2) * 64);
        lo = vorrq_u8(vandq_u8(bits_to(l, 2 * (j / 4), 0), three), vandq_u8(bits_to(h, j / 2, 2), four));
        hi = vorrq_u8(vandq_u8(bits_to(l, 4 + 2 * (j / 4), 0), three), vandq_u8(bits_to(h, 4 + j / 2, 2), four));
        return;
    }
    const uint8x16_t v = vld1q_u8(c + j * 64);
    lo = vandq_u8(v, vdupq_n_u8(0x0F)), hi = vshrq_n_u8(v, 4);
    if (kBits == 5) {  // bits 2 (j % 4), 2 (j % 4) + 1 of top chunk 8 + j / 4 to bit 4 of each code
        const uint8x16_t h = vld1q_u8(c + (8 + j / 4) * 64), top1 = vdupq_n_u8(0x10);
        lo = vorrq_u8(lo, vandq_u8(bits_to(h, 2 * (j % 4), 4), top1));
        hi = vorrq_u8(hi, vandq_u8(bits_to(h, 2 * (j % 4) + 1, 4), top1));
    }
    if (kBits == 6) {  // bits 4s, 4s + 2 (s = j % 2) of top chunk 8 + j / 2 to bits 4-5 of each code
        const uint8x16_t h = vld1q_u8(c + (8 + j / 2) * 64), top2 = vdupq_n_u8(0x30);
        lo = vorrq_u8(lo, vandq_u8(bits_to(h, 4 * (j % 2), 4), top2));
        hi = vorrq_u8(hi, vandq_u8(bits_to(h, 4 * (j % 2) + 2, 4), top2));
    }
}

// Quantized tiles (tensor.h), all 16 rows in one pass over the codes: a 16-byte quarter of a
// 64-byte chunk holds 4 codes of each of 4 rows (a quad), and Dot::lane<L>(acc, w, a) adds to int32
// lane i of acc the dot of row i's 4 codes in w with bytes 4L .. 4L + 3 of a, a token's 16
// activations of chunks 4 (j / 4) .. + 3, loaded once. q8 codes are made signed (code - 128, so
// zero 0 below); the 3- to 6-bit codes (< 64) are int8 as they are, their zero point taken off in
// float with ds. The quads take turns within a block (or pair of blocks), each with its own int32
// sums, so that the registers hold every token's activations and float sums: NT tokens at a time.
template <class Dot, int kBits, int NT>
void tile_dot(const QuantTile &w, int rows, int n, const QuantActs &x0, float *y, size_t ldy) {
    const int n_blocks = n / kActBlock, n_quads = (rows + 3) / 4;  // quads of zero padding rows are skipped
    const float zero = kBits == 8 || w.has_min() ? 0.0f : (float)(1 << (kBits - 1));
    const int group_shift = w.group == 128 ? 2 : w.group == 64 ? 1 : 0;  // block -> group, without a division
    const int8_t *q[NT];
    const float *d[NT], *ds[NT];
    for (int t = 0; t < NT; t++) {
        const QuantActs a = token_acts(x0, n, t);
        q[t] = a.q, d[t] = a.d, ds[t] = a.ds;
    }
    float32x4_t acc[4][NT];  // [quad][token]
    for (int r = 0; r < 4; r++)
        for (int t = 0; t < NT; t++) acc[r][t] = vdupq_n_f32(0.0f);
    // Block b's int32 sums of quad r into the float sums: its scales, and (below 8 bits) its base,
    // -zero * scale + minimum, times d * sum(q).
    auto finish_block = [&](int b, int r, const int32x4_t *sum) {
        const int g = b >> group_shift;
        float32x4_t ws, base;
        if (w.k_scale) {  // K formats: 8-bit codes times the super-block's f16 factors
            const size_t at = (size_t)g * kTileRows + 4 * r, sup = (size_t)(g / 8) * kTileRows + 4 * r;
            ws = vmulq_f32(f16x4(w.k_scale + sup), u8x4(w.k_scale_code + at));
            base = w.k_min ? vmulq_f32(f16x4(w.k_min + sup), u8x4(w.k_min_code + at)) : vmulq_n_f32(ws, -zero);
        } else {
            ws = f16x4(w.scales + (size_t)g * kTileRows + 4 * r);
            base = vmulq_n_f32(ws, -zero);
            if (w.mins) base = vaddq_f32(base, f16x4(w.mins + (size_t)g * kTileRows + 4 * r));
        }
        for (int t = 0; t < NT; t++) {
            acc[r][t] = vfmaq_f32(acc[r][t], vmulq_n_f32(vcvtq_f32_s32(sum[t]), d[t][b]), ws);
            if (kBits != 8) acc[r][t] = vfmaq_n_f32(acc[r][t], base, ds[t][b]);
        }
    };
    if (kBits == 8) {
        const int8x16_t flip = vdupq_n_s8(-128);
        for (int b = 0; b < n_blocks; b++) {
            int8x16_t a[NT][2];
            for (int t = 0; t < NT; t++) a[t][0] = vld1q_s8(q[t] + b * kActBlock), a[t][1] = vld1q_s8(q[t] + b * kActBlock + 16);
            const uint8_t *cb = w.codes + (size_t)b * 512;
            for (int r = 0; r < n_quads; r++) {
                int32x4_t sum[NT];
                for (int t = 0; t < NT; t++) sum[t] = vdupq_n_s32(0);
                for (int j0 = 0; j0 < 8; j0 += 4)
                    for_lanes([&](auto lane) {
                        constexpr int L = decltype(lane)::value;
                        const int8x16_t wv = veorq_s8(vld1q_s8((const int8_t *)cb + (j0 + L) * 64 + 16 * r), flip);
                        for (int t = 0; t < NT; t++) sum[t] = Dot::template lane<L>(sum[t], wv, a[t][j0 / 4]);
                    });
                finish_block(b, r, sum);
            }
        }
    } else {
        for (int b = 0; b < n_blocks; b += 2) {
            int8x16_t a[NT][4];  // blocks b (0, 1) and b + 1 (2, 3)
            for (int t = 0; t < NT; t++)
                for (int k = 0; k < 4; k++) a[t][k] = vld1q_s8(q[t] + b * kActBlock + 16 * k);
            const uint8_t *cb = w.codes + (size_t)(b / 2) * 128 * kBits;
            for (int r = 0; r < n_quads; r++) {
                int32x4_t lo_sum[NT], hi_sum[NT];
                for (int t = 0; t < NT; t++) lo_sum[t] = vdupq_n_s32(0), hi_sum[t] = vdupq_n_s32(0);
                for (int j0 = 0; j0 < 8; j0 += 4)
                    for_lanes([&](auto lane) {
                        constexpr int L = decltype(lane)::value;
                        uint8x16_t lo, hi;
                        unpack_pair<kBits>(cb + 16 * r, j0 + L, lo, hi);
                        for (int t = 0; t < NT; t++) {
                            lo_sum[t] = Dot::template lane<L>(lo_sum[t], vreinterpretq_s8_u8(lo), a[t][j0 / 4]);
                            hi_sum[t] = Dot::template lane<L>(hi_sum[t], vreinterpretq_s8_u8(hi), a[t][2 + j0 / 4]);
                        }
                    });
                finish_block(b, r, lo_sum);
                finish_block(b + 1, r, hi_sum);
            }
        }
    }
    for (int t = 0; t < NT; t++)
        for (int r = 0; r < n_quads; r++) {
            float *yr = y + t * ldy + 4 * r;
            if (4 * r + 4 <= rows) {
                vst1q_f32(yr, acc[r][t]);
            } else {
                float tmp[4];
                vst1q_f32(tmp, acc[r][t]);
                std::memcpy(yr, tmp, sizeof(float) * (size_t)(rows - 4 * r));
            }
        }
}

template <class Dot, int kBits>
void dot_rows_quant(const QuantTile &w, int rows, int n, const QuantActs &x, int n_tok, float *y, size_t ldy) {
    constexpr int NT = kBits == 8 ? 3 : 2;  // what 32 vector registers hold beside the sums and codes
    int t = 0;
    for (; t + NT <= n_tok; t += NT) tile_dot<Dot, kBits, NT>(w, rows, n, token_acts(x, n, t), y + t * ldy, ldy);
    const QuantActs rest = token_acts(x, n, t);
    if (n_tok - t == 2) tile_dot<Dot, kBits, 2>(w, rows, n, rest, y + t * ldy, ldy);
    if (n_tok - t == 1) tile_dot<Dot, kBits, 1>(w, rows, n, rest, y + t * ldy, ldy);
}

template <class Dot>
KernelTable::QuantDot quant_for_bits(int bits) {
    return bits == 8 ? dot_rows_quant<Dot, 8> : bits == 6 ? dot_rows_quant<Dot, 6> : bits == 5 ? dot_rows_quant<Dot, 5>
         : bits == 3 ? dot_rows_quant<Dot, 3> : dot_rows_quant<Dot, 4>;
}

}  // namespace
}  // namespace fastllm
#endif
