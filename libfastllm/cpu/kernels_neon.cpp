// Advanced SIMD (NEON) kernels for aarch64, where NEON is part of every CPU; the table is used
// when the kernel reports ASIMD (HWCAP). kernels_neon_dot.cpp replaces its quantized dots with SDOT.
#if defined(__aarch64__)
#include <arm_neon.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "cpu/kernels.h"
#include "cpu/kernels_neon.h"

namespace fastllm {

namespace {

inline float32x4_t load4_f32(const void *p, int i) { return vld1q_f32((const float *)p + i); }
inline float32x4_t load4_f16(const void *p, int i) { return f16x4((const uint16_t *)p + i); }
inline float32x4_t load4_bf16(const void *p, int i) {
    return vreinterpretq_f32_u32(vshll_n_u16(vld1_u16((const uint16_t *)p + i), 16));
}
inline float load1_f32(const void *p, int i) { return ((const float *)p)[i]; }
inline float load1_f16(const void *p, int i) { return f16_to_f32(((const uint16_t *)p)[i]); }
inline float load1_bf16(const void *p, int i) { return bf16_to_f32(((const uint16_t *)p)[i]); }

// exp8 of kernels_avx2.cpp four lanes at a time, the same steps and constants (so the same
// results): exp(x) = 2^k * exp(r), k = round(x / ln 2), r = x - k ln 2 with ln 2 in two parts,
// exp(r) by its Taylor series to r^7, 2^k built in the exponent bits as 2^(k/2) * 2^(k - k/2).
inline float32x4_t exp4(float32x4_t x) {
    x = vminq_f32(vmaxq_f32(x, vdupq_n_f32(-87.3f)), vdupq_n_f32(88.7f));
    const float32x4_t k = vrndnq_f32(vmulq_n_f32(x, 1.44269504f));
    float32x4_t r = vfmsq_f32(x, k, vdupq_n_f32(0.693145752f));
    r = vfmsq_f32(r, k, vdupq_n_f32(1.42860677e-6f));
    float32x4_t p = vdupq_n_f32(1.0f / 5040);
    p = vfmaq_f32(vdupq_n_f32(1.0f / 720), p, r);
    p = vfmaq_f32(vdupq_n_f32(1.0f / 120), p, r);
    p = vfmaq_f32(vdupq_n_f32(1.0f / 24), p, r);
    p = vfmaq_f32(vdupq_n_f32(1.0f / 6), p, r);
    p = vfmaq_f32(vdupq_n_f32(0.5f), p, r);
    p = vfmaq_f32(vdupq_n_f32(1.0f), p, r);
    p = vfmaq_f32(vdupq_n_f32(1.0f), p, r);
    const int32x4_t ki = vcvtq_s32_f32(k), k1 = vshrq_n_s32(ki, 1), k2 = vsubq_s32(ki, k1);
    const float32x4_t s1 = vreinterpretq_f32_s32(vshlq_n_s32(vaddq_s32(k1, vdupq_n_s32(127)), 23));
    const float32x4_t s2 = vreinterpretq_f32_s32(vshlq_n_s32(vaddq_s32(k2, vdupq_n_s32(127)), 23));
    return vmulq_f32(vmulq_f32(p, s1), s2);
}

void swiglu(const float *gate_up, int n, float *out) {
    int i = 0;
    for (; i + 4 <= n; i += 4) {
        const float32x4_t g = vld1q_f32(gate_up + i);
        const float32x4_t silu = vdivq_f32(g, vaddq_f32(vdupq_n_f32(1.0f), exp4(vnegq_f32(g))));
        vst1q_f32(out + i, vmulq_f32(silu, vld1q_f32(gate_up + n + i)));
    }
    for (; i < n; i++) out[i] = gate_up[i] / (1.0f + std::exp(-gate_up[i])) * gate_up[n + i];
}

void geglu(const float *gate_up, int n, float *out) {
    int i = 0;
    for (; i + 4 <= n; i += 4) {
        const float32x4_t g = vld1q_f32(gate_up + i);
        const float32x4_t z = vmulq_f32(g, vfmaq_f32(vdupq_n_f32(kGeluC1), vmulq_f32(g, g), vdupq_n_f32(kGeluC3)));
        const float32x4_t gelu = vdivq_f32(g, vaddq_f32(vdupq_n_f32(1.0f), exp4(z)));
        vst1q_f32(out + i, vmulq_f32(gelu, vld1q_f32(gate_up + n + i)));
    }
    for (; i < n; i++) {
        const float g = gate_up[i];
        out[i] = g / (1.0f + std::exp(g * (kGeluC1 + kGeluC3 * g * g))) * gate_up[n + i];
    }
}

void gelu_erf(const float *x, size_t n, float *out) {
    size_t i = 0;
    for (; i + 4 <= n; i += 4) {
        const float32x4_t v = vld1q_f32(x + i);
        const float32x4_t a = vmulq_n_f32(vabsq_f32(v), 0.70710678f);
        const float32x4_t t = vdivq_f32(vdupq_n_f32(1.0f), vfmaq_n_f32(vdupq_n_f32(1.0f), a, kErfP));
        float32x4_t p = vfmaq_n_f32(vdupq_n_f32(kErfA4), t, kErfA5);
        p = vfmaq_f32(vdupq_n_f32(kErfA3), p, t);
        p = vfmaq_f32(vdupq_n_f32(kErfA2), p, t);
        p = vfmaq_f32(vdupq_n_f32(kErfA1), p, t);
        const float32x4_t e = exp4(vnegq_f32(vmulq_f32(a, a)));
        float32x4_t y = vfmsq_f32(vdupq_n_f32(1.0f), vmulq_f32(t, p), e);  // erf(|v| / sqrt 2)
        y = vbslq_f32(vcltq_f32(v, vdupq_n_f32(0.0f)), vnegq_f32(y), y);  // its sign: v's
        vst1q_f32(out + i, vmulq_f32(vmulq_n_f32(v, 0.5f), vaddq_f32(vdupq_n_f32(1.0f), y)));
    }
    for (; i < n; i++) out[i] = gelu_erf_scalar(x[i]);
}

// cap * tanh(x / cap) (KernelTable::softcap); vmaxq/vminq keep a NaN a NaN through exp4.
inline float32x4_t softcap4(float32x4_t x, float cap, float inv) {
    const float32x4_t v = vmulq_n_f32(x, inv), one = vdupq_n_f32(1.0f);
    const float32x4_t t = exp4(vmulq_n_f32(vabsq_f32(v), -2.0f));
    const float32x4_t r = vdivq_f32(vsubq_f32(one, t), vaddq_f32(one, t));
    return vmulq_n_f32(vbslq_f32(vcltq_f32(v, vdupq_n_f32(0.0f)), vnegq_f32(r), r), cap);
}

void softcap(float *x, size_t n, float cap) {
    const float inv = 1.0f / cap;
    size_t i = 0;
    for (; i + 4 <= n; i += 4) vst1q_f32(x + i, softcap4(vld1q_f32(x + i), cap, inv));
    if (i < n) {  // the same steps on a padded copy
        float tail[4] = {};
        std::memcpy(tail, x + i, (n - i) * sizeof(float));
        vst1q_f32(tail, softcap4(vld1q_f32(tail), cap, inv));
        std::memcpy(x + i, tail, (n - i) * sizeof(float));
    }
}

float exp_shift_sum(float *x, int n, float shift) {
    float32x4_t acc = vdupq_n_f32(0.0f);
    int i = 0;
    for (; i + 4 <= n; i += 4) {
        const float32x4_t e = exp4(vsubq_f32(vld1q_f32(x + i), vdupq_n_f32(shift)));
        vst1q_f32(x + i, e);
        acc = vaddq_f32(acc, e);
    }
    float sum = vaddvq_f32(acc);
    for (; i < n; i++) sum += (x[i] = std::exp(x[i] - shift));
    return sum;
}

// Two running maxima of 4: one would wait on its own previous maximum each step.
float reduce_max(const float *x, int n) {
    float32x4_t m0 = vdupq_n_f32(x[0]), m1 = m0;
    int i = 0;
    for (; i + 8 <= n; i += 8) m0 = vmaxq_f32(m0, vld1q_f32(x + i)), m1 = vmaxq_f32(m1, vld1q_f32(x + i + 4));
    float m = vmaxvq_f32(vmaxq_f32(m0, m1));
    for (; i < n; i++) m = std::max(m, x[i]);
    return m;
}

// One row after another, the weights read as one sequential stream (kernels_avx2.cpp has the
// measurement on x86); four accumulators of 4 lanes hide the FMA latency.
template <float32x4_t (*Load4)(const void *, int), float (*Load1)(const void *, int)>
void dot_rows(const void *w, size_t stride, int rows, const float *x, int n, float *y) {
    for (int r = 0; r < rows; r++) {
        const void *wr = (const char *)w + (size_t)r * stride;
        float32x4_t a0 = vdupq_n_f32(0.0f), a1 = a0, a2 = a0, a3 = a0;
        int i = 0;
        for (; i + 16 <= n; i += 16) {
            a0 = vfmaq_f32(a0, Load4(wr, i), vld1q_f32(x + i));
            a1 = vfmaq_f32(a1, Load4(wr, i + 4), vld1q_f32(x + i + 4));
            a2 = vfmaq_f32(a2, Load4(wr, i + 8), vld1q_f32(x + i + 8));
            a3 = vfmaq_f32(a3, Load4(wr, i + 12), vld1q_f32(x + i + 12));
        }
        for (; i + 4 <= n; i += 4) a0 = vfmaq_f32(a0, Load4(wr, i), vld1q_f32(x + i));
        float s = vaddvq_f32(vaddq_f32(vaddq_f32(a0, a1), vaddq_f32(a2, a3)));
        for (; i < n; i++) s += Load1(wr, i) * x[i];
        y[r] = s;
    }
}

template <float32x4_t (*Load4)(const void *, int), float (*Load1)(const void *, int)>
void to_f32(const void *src, float *dst, int n) {
    int i = 0;
    for (; i + 4 <= n; i += 4) vst1q_f32(dst + i, Load4(src, i));
    for (; i < n; i++) dst[i] = Load1(src, i);
}

template <float32x4_t (*Load4)(const void *, int), float (*Load1)(const void *, int)>
void rows_to_f32(const void *src, size_t stride, int rows, int n, float *dst, size_t ldd) {
    for (int r = 0; r < rows; r++)
        to_f32<Load4, Load1>((const char *)src + (size_t)r * stride, dst + (size_t)r * ldd, n);
}

// The 4 sums of 4 accumulators, one per lane (row r's in lane r).
inline float32x4_t hsum4(const float32x4_t *a) { return vpaddq_f32(vpaddq_f32(a[0], a[1]), vpaddq_f32(a[2], a[3])); }

// Attention scores: rows are one head long, so 8 rows at a time share each load of q and one
// reduction (kernels_avx2.cpp's kv_dot has the measurement); the last rows go the same way (their
// group padded with zeros), so that a row's score does not depend on its place.
template <float32x4_t (*Load4)(const void *, int), int R>
void dot_rows8(const char *base, size_t stride, int rows, const float *q, int dim, float *y) {
    float32x4_t acc[8];
    for (int r = 0; r < 8; r++) acc[r] = vdupq_n_f32(0.0f);
    for (int i = 0; i < dim; i += 4) {
        const float32x4_t qi = vld1q_f32(q + i);
        for (int r = 0; r < (R ? R : rows); r++) acc[r] = vfmaq_f32(acc[r], Load4(base + (size_t)r * stride, i), qi);
    }
    float sums[8];
    vst1q_f32(sums, hsum4(acc)), vst1q_f32(sums + 4, hsum4(acc + 4));
    for (int r = 0; r < (R ? R : rows); r++) y[r] = sums[r];
}

template <float32x4_t (*Load4)(const void *, int), float (*Load1)(const void *, int), size_t kSize>
void kv_dot(const void *rows, size_t stride, int n, int off, const float *q, int dim, float *y) {
    const char *base = (const char *)rows + (size_t)off * kSize;
    if (dim % 4) return dot_rows<Load4, Load1>(base, stride, n, q, dim, y);
    int j = 0;
    for (; j + 8 <= n; j += 8) dot_rows8<Load4, 8>(base + (size_t)j * stride, stride, 8, q, dim, y + j);
    if (j < n) dot_rows8<Load4, 0>(base + (size_t)j * stride, stride, n - j, q, dim, y + j);
}

// Attention's weighted values, y += sum_j a[j] * row j: 32 outputs at a time stay in registers
// while all n rows pass.
template <float32x4_t (*Load4)(const void *, int), float (*Load1)(const void *, int)>
void kv_accum(const float *a, int n, const void *rows, size_t stride, int off, int dim, float *y) {
    auto row = [&](int j) { return (const char *)rows + (size_t)j * stride; };
    int i = 0;
    for (; i + 32 <= dim; i += 32) {
        float32x4_t acc[8];
        for (int k = 0; k < 8; k++) acc[k] = vld1q_f32(y + i + 4 * k);
        for (int j = 0; j < n; j++)
            for (int k = 0; k < 8; k++) acc[k] = vfmaq_n_f32(acc[k], Load4(row(j), off + i + 4 * k), a[j]);
        for (int k = 0; k < 8; k++) vst1q_f32(y + i + 4 * k, acc[k]);
    }
    for (; i + 4 <= dim; i += 4) {
        float32x4_t acc = vld1q_f32(y + i);
        for (int j = 0; j < n; j++) acc = vfmaq_n_f32(acc, Load4(row(j), off + i), a[j]);
        vst1q_f32(y + i, acc);
    }
    for (; i < dim; i++)
        for (int j = 0; j < n; j++) y[i] += a[j] * Load1(row(j), off + i);
}

// q8 rows (tensor.h): heads of whole blocks (head_dim a multiple of 32, as in every model with heads
// of 64 or 128) run here; shorter heads take the portable kernels, as do a row's last partial block
// in kv_store / kv_load.
inline void codes32(const int8_t *c, float32x4_t *f) {  // a block's 32 codes as 8 x 4 floats
    for (int h = 0; h < 2; h++) {
        const int8x16_t v = vld1q_s8(c + 16 * h);
        const int16x8_t lo = vmovl_s8(vget_low_s8(v)), hi = vmovl_high_s8(v);
        f[4 * h + 0] = vcvtq_f32_s32(vmovl_s16(vget_low_s16(lo)));
        f[4 * h + 1] = vcvtq_f32_s32(vmovl_high_s16(lo));
        f[4 * h + 2] = vcvtq_f32_s32(vmovl_s16(vget_low_s16(hi)));
        f[4 * h + 3] = vcvtq_f32_s32(vmovl_high_s16(hi));
    }
}
inline float32x4_t block_dot(const int8_t *c, const float32x4_t *q) {  // 4 partial sums of codes x q
    float32x4_t f[8];
    codes32(c, f);
    float32x4_t s0 = vmulq_f32(f[0], q[0]), s1 = vmulq_f32(f[1], q[1]);
    for (int k = 2; k < 8; k += 2) s0 = vfmaq_f32(s0, f[k], q[k]), s1 = vfmaq_f32(s1, f[k + 1], q[k + 1]);
    return vaddq_f32(s0, s1);
}

void kv_dot_q8(const void *rows, size_t stride, int n, int off, const float *q, int dim, float *y) {
    if (off % kKvQ8Block || dim % kKvQ8Block) return scalar_kernels()->kv_dot[(int)KvType::Q8](rows, stride, n, off, q, 1, dim, y, 0);
    const int b0 = off / kKvQ8Block, nb = dim / kKvQ8Block;
    auto row = [&](int j) { return (const char *)rows + (size_t)j * stride; };
    int j0 = 0;
    for (; j0 + 4 <= n; j0 += 4) {  // 4 rows share each block of q
        float32x4_t acc[4];
        for (int r = 0; r < 4; r++) acc[r] = vdupq_n_f32(0.0f);
        for (int b = 0; b < nb; b++) {
            float32x4_t qb[8];
            for (int k = 0; k < 8; k++) qb[k] = vld1q_f32(q + b * kKvQ8Block + 4 * k);
            for (int r = 0; r < 4; r++)
                acc[r] = vfmaq_n_f32(acc[r], block_dot(kv_q8_codes(row(j0 + r), b0 + b), qb), kv_q8_scale(row(j0 + r), b0 + b));
        }
        vst1q_f32(y + j0, hsum4(acc));
    }
    for (int j = j0; j < n; j++) {
        float32x4_t acc = vdupq_n_f32(0.0f);
        for (int b = 0; b < nb; b++) {
            float32x4_t qb[8];
            for (int k = 0; k < 8; k++) qb[k] = vld1q_f32(q + b * kKvQ8Block + 4 * k);
            acc = vfmaq_n_f32(acc, block_dot(kv_q8_codes(row(j), b0 + b), qb), kv_q8_scale(row(j), b0 + b));
        }
        y[j] = vaddvq_f32(acc);
    }
}

void kv_accum_q8(const float *a, int n, const void *rows, size_t stride, int off, int dim, float *y) {
    if (off % kKvQ8Block || dim % kKvQ8Block) return scalar_kernels()->kv_accum[(int)KvType::Q8](a, 0, 1, n, rows, stride, off, dim, y, 0);
    for (int i = 0; i < dim; i += kKvQ8Block) {
        const int b = (off + i) / kKvQ8Block;
        float32x4_t acc[8];
        for (int k = 0; k < 8; k++) acc[k] = vld1q_f32(y + i + 4 * k);
        for (int j = 0; j < n; j++) {
            const char *row = (const char *)rows + (size_t)j * stride;
            float32x4_t f[8];
            codes32(kv_q8_codes(row, b), f);
            const float wj = a[j] * kv_q8_scale(row, b);
            for (int k = 0; k < 8; k++) acc[k] = vfmaq_n_f32(acc[k], f[k], wj);
        }
        for (int k = 0; k < 8; k++) vst1q_f32(y + i + 4 * k, acc[k]);
    }
}

// The largest |x| of 32 values, loaded into v.
inline float amax32(const float *x, float32x4_t *v) {
    float32x4_t m = vdupq_n_f32(0.0f);
    for (int k = 0; k < 8; k++) v[k] = vld1q_f32(x + 4 * k), m = vmaxq_f32(m, vabsq_f32(v[k]));
    return vmaxvq_f32(m);
}
// q[i] = round half to even (v[i] * id) for 32 values, |v[i] * id| <= 127; returns their sum.
inline int32_t round32(const float32x4_t *v, float id, int8_t *q) {
    int32x4_t c[8];
    for (int k = 0; k < 8; k++) c[k] = vcvtnq_s32_f32(vmulq_n_f32(v[k], id));
    for (int h = 0; h < 2; h++) {
        const int16x8_t lo = vcombine_s16(vqmovn_s32(c[4 * h]), vqmovn_s32(c[4 * h + 1]));
        const int16x8_t hi = vcombine_s16(vqmovn_s32(c[4 * h + 2]), vqmovn_s32(c[4 * h + 3]));
        vst1q_s8(q + 16 * h, vcombine_s8(vqmovn_s16(lo), vqmovn_s16(hi)));
    }
    const int32x4_t s = vaddq_s32(vaddq_s32(vaddq_s32(c[0], c[1]), vaddq_s32(c[2], c[3])),
                                  vaddq_s32(vaddq_s32(c[4], c[5]), vaddq_s32(c[6], c[7])));
    return vaddvq_s32(s);
}

void kv_store_q8(const float *x, int n, void *row) {
    const int full = n / kKvQ8Block;
    for (int b = 0; b < full; b++) {
        float32x4_t v[8];
        const float amax = amax32(x + b * kKvQ8Block, v), d = amax / 127.0f, id = amax > 0 ? 127.0f / amax : 0.0f;
        char *blk = (char *)row + (size_t)b * kKvQ8BlockBytes;
        std::memcpy(blk, &d, 4);
        round32(v, id, (int8_t *)blk + 4);
    }
    if (n > full * kKvQ8Block)  // the last, partial block (zero-padded)
        scalar_kernels()->kv_store[(int)KvType::Q8](x + full * kKvQ8Block, n - full * kKvQ8Block,
                                                    (char *)row + (size_t)full * kKvQ8BlockBytes);
}

void kv_load_q8(const void *row, float *x, int n) {
    const int full = n / kKvQ8Block;
    for (int b = 0; b < full; b++) {
        float32x4_t f[8];
        codes32(kv_q8_codes((const char *)row, b), f);
        const float s = kv_q8_scale((const char *)row, b);
        for (int k = 0; k < 8; k++) vst1q_f32(x + b * kKvQ8Block + 4 * k, vmulq_n_f32(f[k], s));
    }
    if (n > full * kKvQ8Block)
        scalar_kernels()->kv_load[(int)KvType::Q8]((const char *)row + (size_t)full * kKvQ8BlockBytes,
                                                   x + full * kKvQ8Block, n - full * kKvQ8Block);
}

// f16 rows with FCVTN, which rounds to nearest even (FPCR's default mode), as f32_to_f16.
void kv_store_f16(const float *x, int n, void *row) {
    uint16_t *h = (uint16_t *)row;
    int i = 0;
    for (; i + 4 <= n; i += 4) vst1_u16(h + i, vreinterpret_u16_f16(vcvt_f16_f32(vld1q_f32(x + i))));
    for (; i < n; i++) h[i] = f32_to_f16(x[i]);
}

// The same d = amax / 127 and id = 127 / amax as the portable kernel, and FCVTNS rounds half to
// even as nearbyint does: the codes equal the reference's bit for bit.
void quantize_acts(const float *x, int n, const QuantActs &out) {
    for (int b = 0; b < n / kActBlock; b++) {
        float32x4_t v[8];
        const float amax = amax32(x + b * kActBlock, v), d = amax / 127.0f, id = d > 0 ? 127.0f / amax : 0.0f;
        const int32_t sum = round32(v, id, out.q + b * kActBlock);
        out.d[b] = d;
        out.ds[b] = d * (float)sum;
    }
}

// The int8 dot of a quad (4 rows x 4 codes, tile_dot in kernels_neon.h) with the 4 activations in
// lane L of a, broadcast: widening multiplies of rows 0-1 and 2-3 to int16, pairwise adds to 2
// int16 a row, pairwise add-accumulate into the row's int32 lane. The int16 pairs cannot saturate:
// codes are in [-128, 127], activations in [-127, 127], 2 x 128 x 127 < 32768.
struct DotNeon {
    template <int L>
    static int32x4_t lane(int32x4_t acc, int8x16_t w, int8x16_t a) {
        const int8x16_t x = vreinterpretq_s8_s32(vdupq_laneq_s32(vreinterpretq_s32_s8(a), L));
        return vpadalq_s16(acc, vpaddq_s16(vmull_s8(vget_low_s8(w), vget_low_s8(x)), vmull_high_s8(w, x)));
    }
};

// The panel in blocks of 4 rows x 4 weights, each transposed in registers.
template <float32x4_t (*Load4)(const void *, int), float (*Load1)(const void *, int)>
void gemm_pack(const void *w, size_t stride, int rows, int n, float *p) {
    constexpr int C = KernelTable::kGemmCols;
    for (int h = 0; h < C; h += 4) {
        const int rh = std::max(0, std::min(4, rows - h));
        auto row = [&](int i) { return (const char *)w + (size_t)(h + i) * stride; };
        int k = 0;
        for (; k + 4 <= n; k += 4) {
            float32x4_t r[4];
            for (int i = 0; i < 4; i++) r[i] = i < rh ? Load4(row(i), k) : vdupq_n_f32(0.0f);
            const float32x4x2_t a = vtrnq_f32(r[0], r[1]), b = vtrnq_f32(r[2], r[3]);  // [a0 b0 a2 b2], [a1 b1 a3 b3]
            vst1q_f32(p + (size_t)k * C + h, vcombine_f32(vget_low_f32(a.val[0]), vget_low_f32(b.val[0])));
            vst1q_f32(p + (size_t)(k + 1) * C + h, vcombine_f32(vget_low_f32(a.val[1]), vget_low_f32(b.val[1])));
            vst1q_f32(p + (size_t)(k + 2) * C + h, vcombine_f32(vget_high_f32(a.val[0]), vget_high_f32(b.val[0])));
            vst1q_f32(p + (size_t)(k + 3) * C + h, vcombine_f32(vget_high_f32(a.val[1]), vget_high_f32(b.val[1])));
        }
        for (; k < n; k++)
            for (int i = 0; i < 4; i++) p[(size_t)k * C + h + i] = i < rh ? Load1(row(i), k) : 0.0f;
    }
}

// NT tokens x 16 columns (half the panel) in 4 * NT of the 32 registers, the panel's four loads
// per k shared by every token.
template <int NT>
void gemm_tile(const float *p, int n, const float *x, size_t ldx, float *y, size_t ldy, int cols) {
    float32x4_t c[NT][4];
    for (int t = 0; t < NT; t++)
        for (int i = 0; i < 4; i++) c[t][i] = vdupq_n_f32(0.0f);
    for (int k = 0; k < n; k++) {
        const float *pk = p + (size_t)k * 32;
        const float32x4_t w0 = vld1q_f32(pk), w1 = vld1q_f32(pk + 4), w2 = vld1q_f32(pk + 8), w3 = vld1q_f32(pk + 12);
        for (int t = 0; t < NT; t++) {
            const float b = x[(size_t)t * ldx + k];
            c[t][0] = vfmaq_n_f32(c[t][0], w0, b);
            c[t][1] = vfmaq_n_f32(c[t][1], w1, b);
            c[t][2] = vfmaq_n_f32(c[t][2], w2, b);
            c[t][3] = vfmaq_n_f32(c[t][3], w3, b);
        }
    }
    for (int t = 0; t < NT; t++) {
        float v[16];
        for (int i = 0; i < 4; i++) vst1q_f32(v + 4 * i, c[t][i]);
        float *yt = y + (size_t)t * ldy;
        for (int j = 0; j < std::min(cols, 16); j++) yt[j] = v[j];
    }
}

void gemm_panel(const float *p, int n, const float *x, size_t ldx, int n_tok, float *y, size_t ldy, int cols) {
    static_assert(KernelTable::kGemmCols == 32, "two halves of 16 columns");
    using Tile = void (*)(const float *, int, const float *, size_t, float *, size_t, int);
    static constexpr Tile kTiles[] = {nullptr, gemm_tile<1>, gemm_tile<2>, gemm_tile<3>, gemm_tile<4>};
    constexpr int NT = 4;
    for (int h = 0; h < 32 && h < cols; h += 16)
        for (int t = 0; t < n_tok; t += NT)
            kTiles[std::min(NT, n_tok - t)](p + h, n, x + (size_t)t * ldx, ldx, y + (size_t)t * ldy + h, ldy,
                                            cols - h);
}

// dot_rows_quant: filled from the dtype table when the table is first asked for
const KernelTable kPlain = {
    Isa::Neon,
    {dot_rows<load4_f32, load1_f32>, dot_rows<load4_f16, load1_f16>, dot_rows<load4_bf16, load1_bf16>},
    {to_f32<load4_f32, load1_f32>, to_f32<load4_f16, load1_f16>, to_f32<load4_bf16, load1_bf16>},
    {rows_to_f32<load4_f32, load1_f32>, rows_to_f32<load4_f16, load1_f16>, rows_to_f32<load4_bf16, load1_bf16>},
    swiglu,
    geglu,
    gelu_erf,
    softcap,
    exp_shift_sum,
    reduce_max,
    quantize_acts,
    {},  // dot_rows_quant
    {}, {}, {}, {},  // KV kernels: set by the factory
    {dot_rows_each<dot_rows<load4_f32, load1_f32>>, dot_rows_each<dot_rows<load4_f16, load1_f16>>,
     dot_rows_each<dot_rows<load4_bf16, load1_bf16>>},
    {gemm_pack<load4_f32, load1_f32>, gemm_pack<load4_f16, load1_f16>, gemm_pack<load4_bf16, load1_bf16>},
    gemm_panel};

}  // namespace

const KernelTable *neon_kernels() {
    static const KernelTable table = [] {
        KernelTable t = with_quant_kernels(kPlain, quant_for_bits<DotNeon>);
        set_scalar_kv_kernels(t);  // f32 stores and loads: the portable memcpy
        const int f32 = (int)KvType::F32, f16 = (int)KvType::F16, q8 = (int)KvType::Q8;
        t.kv_dot[f32] = kv_dot_each<kv_dot<load4_f32, load1_f32, 4>>, t.kv_dot[f16] = kv_dot_each<kv_dot<load4_f16, load1_f16, 2>>;
        t.kv_dot[q8] = kv_dot_each<kv_dot_q8>;
        t.kv_accum[f32] = kv_accum_each<kv_accum<load4_f32, load1_f32>>;
        t.kv_accum[f16] = kv_accum_each<kv_accum<load4_f16, load1_f16>>, t.kv_accum[q8] = kv_accum_each<kv_accum_q8>;
        t.kv_store[f16] = kv_store_f16, t.kv_store[q8] = kv_store_q8;
        t.kv_load[f16] = to_f32<load4_f16, load1_f16>, t.kv_load[q8] = kv_load_q8;
        return t;
    }();
    return &table;
}

}  // namespace fastllm
#else
#include "cpu/kernels.h"
namespace fastllm {
const KernelTable *neon_kernels() { return nullptr; }
}  // namespace fastllm
#endif
