// Portable kernels: the fallback for CPUs without AVX2, and the baseline the SIMD files must match.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "cpu/kernels.h"

namespace fastllm {

float f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f;
    uint32_t mant = h & 0x3ff;
    uint32_t bits;
    if (exp == 0x1f) {
        bits = sign | 0x7f800000 | (mant << 13);  // inf / nan
    } else if (exp != 0) {
        bits = sign | ((exp + 112) << 23) | (mant << 13);
    } else if (mant == 0) {
        bits = sign;
    } else {  // subnormal: normalise
        int e = -1;
        do {
            e++;
            mant <<= 1;
        } while ((mant & 0x400) == 0);
        bits = sign | ((uint32_t)(112 - e) << 23) | ((mant & 0x3ff) << 13);
    }
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
}

uint16_t f32_to_f16(float f) {  // round to nearest even; used by tests only
    uint32_t x;
    std::memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000;
    int32_t exp = (int32_t)((x >> 23) & 0xff) - 127 + 15;
    uint32_t mant = x & 0x7fffff;
    if (((x >> 23) & 0xff) == 0xff) return (uint16_t)(sign | 0x7c00 | (mant ? 0x200 : 0));
    if (exp >= 0x1f) return (uint16_t)(sign | 0x7c00);
    if (exp <= 0) {
        if (exp < -10) return (uint16_t)sign;
        mant |= 0x800000;
        uint32_t shift = (uint32_t)(14 - exp);
        uint32_t half = mant >> shift;
        uint32_t rem = mant & ((1u << shift) - 1);
        uint32_t mid = 1u << (shift - 1);
        if (rem > mid || (rem == mid && (half & 1))) half++;
        return (uint16_t)(sign | half);
    }
    uint32_t h = sign | ((uint32_t)exp << 10) | (mant >> 13);
    uint32_t rem = mant & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) h++;
    return (uint16_t)h;
}

namespace {

template <typename Load>
void dot_rows_generic(const void *w, size_t stride, int rows, const float *x, int n, float *y, Load load) {
    for (int r = 0; r < rows; r++) {
        const char *row = (const char *)w + (size_t)r * stride;
        float acc[8] = {0};  // 8 partial sums: vectorisable and less rounding drift
        int i = 0;
        for (; i + 8 <= n; i += 8)
            for (int k = 0; k < 8; k++) acc[k] += load(row, i + k) * x[i + k];
        float s = 0;
        for (; i < n; i++) s += load(row, i) * x[i];
        for (int k = 0; k < 8; k++) s += acc[k];
        y[r] = s;
    }
}

void dot_rows_f32(const void *w, size_t stride, int rows, const float *x, int n, float *y) {
    dot_rows_generic(w, stride, rows, x, n, y, [](const char *row, int i) { return ((const float *)row)[i]; });
}
void dot_rows_f16(const void *w, size_t stride, int rows, const float *x, int n, float *y) {
    dot_rows_generic(w, stride, rows, x, n, y,
                     [](const char *row, int i) { return f16_to_f32(((const uint16_t *)row)[i]); });
}
void dot_rows_bf16(const void *w, size_t stride, int rows, const float *x, int n, float *y) {
    dot_rows_generic(w, stride, rows, x, n, y,
                     [](const char *row, int i) { return bf16_to_f32(((const uint16_t *)row)[i]); });
}

void to_f32_f32(const void *src, float *dst, int n) { std::memcpy(dst, src, (size_t)n * 4); }
void to_f32_f16(const void *src, float *dst, int n) {
    for (int i = 0; i < n; i++) dst[i] = f16_to_f32(((const uint16_t *)src)[i]);
}
void to_f32_bf16(const void *src, float *dst, int n) {
    for (int i = 0; i < n; i++) dst[i] = bf16_to_f32(((const uint16_t *)src)[i]);
}

void weighted_rows(const float *a, int n, const float *rows, size_t stride, int dim, float *y) {
    for (int i = 0; i < dim; i++) y[i] = 0;
    for (int j = 0; j < n; j++)
        for (int i = 0; i < dim; i++) y[i] += a[j] * rows[j * stride + i];
}

void quantize_acts(const float *x, int n, const QuantActs &out) {
    for (int b = 0; b < n / kActBlock; b++) {
        const float *xb = x + b * kActBlock;
        float amax = 0;
        for (int i = 0; i < kActBlock; i++) amax = std::max(amax, std::fabs(xb[i]));
        const float d = amax / 127.0f, id = d > 0 ? 127.0f / amax : 0.0f;
        int32_t sum = 0;
        for (int i = 0; i < kActBlock; i++) {
            int v = (int)std::nearbyint(xb[i] * id);  // round half to even, as the SIMD conversions do
            out.q[b * kActBlock + i] = (int8_t)v;
            sum += v;
        }
        out.d[b] = d;
        out.ds[b] = d * (float)sum;
    }
}

void swiglu(const float *gate_up, int n, float *out) {
    for (int i = 0; i < n; i++) {
        const float g = gate_up[i];
        out[i] = g / (1.0f + std::exp(-g)) * gate_up[n + i];
    }
}

float exp_shift_sum(float *x, int n, float shift) {
    float sum = 0;
    for (int i = 0; i < n; i++) sum += (x[i] = std::exp(x[i] - shift));
    return sum;
}

template <int kBits>
void dot_rows_quant1(const QuantTile &w, int rows, int n, const QuantActs &x, float *y) {
    const float zero = w.mins ? 0.0f : (float)(1 << (kBits - 1));
    for (int r = 0; r < rows; r++) {
        float acc = 0, corr = 0, mins = 0;
        for (int b = 0; b < n / kActBlock; b++) {
            const int g = b * kActBlock / w.group;
            int32_t dot = 0;
            for (int i = b * kActBlock; i < (b + 1) * kActBlock; i++) dot += tile_code(w.codes, kBits, r, i) * x.q[i];
            const float dw = f16_to_f32(w.scales[g * kTileRows + r]);
            acc += dw * x.d[b] * (float)dot;
            corr += dw * x.ds[b];
            if (w.mins) mins += f16_to_f32(w.mins[g * kTileRows + r]) * x.ds[b];
        }
        y[r] = acc - zero * corr + mins;
    }
}

template <int kBits>
void dot_rows_quant(const QuantTile &w, int rows, int n, const QuantActs &x, int n_tok, float *y, size_t ldy) {
    for (int t = 0; t < n_tok; t++) dot_rows_quant1<kBits>(w, rows, n, token_acts(x, n, t), y + t * ldy);
}

KernelTable::QuantDot quant_for_bits(int bits) {
    return bits == 8 ? dot_rows_quant<8> : bits == 6 ? dot_rows_quant<6> : dot_rows_quant<4>;
}

// dot_rows_quant: filled from the dtype table in scalar_kernels()
const KernelTable kPlain = {Isa::Scalar,
                            {dot_rows_f32, dot_rows_f16, dot_rows_bf16},
                            {to_f32_f32, to_f32_f16, to_f32_bf16},
                            weighted_rows,
                            swiglu,
                            exp_shift_sum,
                            quantize_acts,
                            {}};

}  // namespace

const KernelTable *scalar_kernels() {
    static const KernelTable table = with_quant_kernels(kPlain, quant_for_bits);
    return &table;
}

}  // namespace fastllm
