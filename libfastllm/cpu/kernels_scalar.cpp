// Portable kernels: the fallback for CPUs without AVX2, and the baseline the SIMD files must match.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "cpu/kernels.h"

namespace fastllm {

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
template <void (*ToF32)(const void *, float *, int)>
void rows_to_f32(const void *src, size_t stride, int rows, int n, float *dst, size_t ldd) {
    for (int r = 0; r < rows; r++) ToF32((const char *)src + (size_t)r * stride, dst + (size_t)r * ldd, n);
}

// The KV cache's rows (tensor.h has the layouts and the q8 block accessors).

void kv_dot_f32(const void *rows, size_t stride, int n, int off, const float *q, int dim, float *y) {
    dot_rows_f32((const float *)rows + off, stride, n, q, dim, y);
}
void kv_dot_f16(const void *rows, size_t stride, int n, int off, const float *q, int dim, float *y) {
    dot_rows_f16((const uint16_t *)rows + off, stride, n, q, dim, y);
}
// A head may start and end inside a block (heads shorter than 32): sums per block, then scaled.
void kv_dot_q8(const void *rows, size_t stride, int n, int off, const float *q, int dim, float *y) {
    for (int j = 0; j < n; j++) {
        const char *row = (const char *)rows + (size_t)j * stride;
        float s = 0;
        for (int i = off; i < off + dim;) {
            const int b = i / kKvQ8Block, end = std::min(off + dim, (b + 1) * kKvQ8Block);
            const int8_t *c = kv_q8_codes(row, b) - b * kKvQ8Block;
            float acc = 0;
            for (; i < end; i++) acc += (float)c[i] * q[i - off];
            s += kv_q8_scale(row, b) * acc;
        }
        y[j] = s;
    }
}

void kv_accum_f32(const float *a, int n, const void *rows, size_t stride, int off, int dim, float *y) {
    for (int j = 0; j < n; j++) {
        const float *r = (const float *)((const char *)rows + (size_t)j * stride) + off;
        for (int i = 0; i < dim; i++) y[i] += a[j] * r[i];
    }
}
void kv_accum_f16(const float *a, int n, const void *rows, size_t stride, int off, int dim, float *y) {
    for (int j = 0; j < n; j++) {
        const uint16_t *r = (const uint16_t *)((const char *)rows + (size_t)j * stride) + off;
        for (int i = 0; i < dim; i++) y[i] += a[j] * f16_to_f32(r[i]);
    }
}
void kv_accum_q8(const float *a, int n, const void *rows, size_t stride, int off, int dim, float *y) {
    for (int j = 0; j < n; j++) {
        const char *row = (const char *)rows + (size_t)j * stride;
        for (int i = off; i < off + dim;) {
            const int b = i / kKvQ8Block, end = std::min(off + dim, (b + 1) * kKvQ8Block);
            const int8_t *c = kv_q8_codes(row, b) - b * kKvQ8Block;
            const float w = a[j] * kv_q8_scale(row, b);
            for (; i < end; i++) y[i - off] += w * (float)c[i];
        }
    }
}

void kv_store_f32(const float *x, int n, void *row) { std::memcpy(row, x, (size_t)n * 4); }
void kv_store_f16(const float *x, int n, void *row) {
    for (int i = 0; i < n; i++) ((uint16_t *)row)[i] = f32_to_f16(x[i]);
}
void kv_store_q8(const float *x, int n, void *row) { kv_q8_store_row(x, n, row); }
void kv_load_q8(const void *row, float *x, int n) {
    for (int i = 0; i < n; i++)
        x[i] = kv_q8_scale((const char *)row, i / kKvQ8Block) * (float)kv_q8_codes((const char *)row, i / kKvQ8Block)[i % kKvQ8Block];
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

void geglu(const float *gate_up, int n, float *out) {
    for (int i = 0; i < n; i++) {
        const float g = gate_up[i];
        out[i] = g / (1.0f + std::exp(g * (kGeluC1 + kGeluC3 * g * g))) * gate_up[n + i];
    }
}

void gelu_erf(const float *x, size_t n, float *out) {
    for (size_t i = 0; i < n; i++) out[i] = gelu_erf_scalar(x[i]);
}

void softcap(float *x, size_t n, float cap) {
    const float inv = 1.0f / cap;
    for (size_t i = 0; i < n; i++) x[i] = cap * std::tanh(x[i] * inv);
}

float exp_shift_sum(float *x, int n, float shift) {
    float sum = 0;
    for (int i = 0; i < n; i++) sum += (x[i] = std::exp(x[i] - shift));
    return sum;
}

float reduce_max(const float *x, int n) {
    float m = x[0];
    for (int i = 1; i < n; i++) m = std::max(m, x[i]);
    return m;
}

template <int kBits>
void dot_rows_quant1(const QuantTile &w, int rows, int n, const QuantActs &x, float *y) {
    const float zero = w.has_min() ? 0.0f : (float)(1 << (kBits - 1));
    for (int r = 0; r < rows; r++) {
        float acc = 0, corr = 0, mins = 0;
        for (int b = 0; b < n / kActBlock; b++) {
            const int g = b * kActBlock / w.group;
            int32_t dot = 0;
            for (int i = b * kActBlock; i < (b + 1) * kActBlock; i++) dot += tile_code(w.codes, kBits, r, i) * x.q[i];
            const float dw = tile_scale(w, g, r);
            acc += dw * x.d[b] * (float)dot;
            corr += dw * x.ds[b];
            mins += tile_min(w, g, r) * x.ds[b];
        }
        y[r] = acc - zero * corr + mins;
    }
}

template <int kBits>
void dot_rows_quant(const QuantTile &w, int rows, int n, const QuantActs &x, int n_tok, float *y, size_t ldy) {
    for (int t = 0; t < n_tok; t++) dot_rows_quant1<kBits>(w, rows, n, token_acts(x, n, t), y + t * ldy);
}

inline float load1_f32(const void *p, int i) { return ((const float *)p)[i]; }
inline float load1_f16(const void *p, int i) { return f16_to_f32(((const uint16_t *)p)[i]); }
inline float load1_bf16(const void *p, int i) { return bf16_to_f32(((const uint16_t *)p)[i]); }

// KernelTable::attn_lanes, a query at a time: the reference of the vector tables' (the same sums in
// the same order, each product rounded before its sum, and std::exp).
template <float (*Load1)(const void *, int)>
void attn_lanes(const float *q, int nv, int hd, const void *k, size_t ldk, const void *v, size_t ldv, int n,
                const int *lo, const int *hi, float cap, float *m, float *l, float *o, float *s) {
    auto row = [](const void *base, size_t ld, int j) { return (const char *)base + (size_t)j * ld; };
    for (int i = 0; i < 8 * nv; i++) {
        const float *qi = q + (size_t)i * hd;
        float mx = -INFINITY;
        for (int j = 0; j < n; j++) {
            float t[8] = {};
            for (int d = 0; d < hd; d++) t[d % 8] += Load1(row(k, ldk, j), d) * qi[d];
            float x = ((t[0] + t[1]) + (t[2] + t[3])) + ((t[4] + t[5]) + (t[6] + t[7]));
            if (cap > 0) softcap(&x, 1, cap);
            s[j] = j >= lo[i] && j < hi[i] ? x : -INFINITY;
            mx = std::max(mx, s[j]);
        }
        const float m_new = std::max(m[i], mx), diff = m[i] - m_new;
        const float a = std::exp(diff >= -87.3f ? diff : -87.3f);  // NaN: no key yet (o and l are 0)
        float sum = 0;
        for (int j = 0; j < n; j++) sum += (s[j] = j >= lo[i] && j < hi[i] ? std::exp(s[j] - m_new) : 0.0f);
        l[i] = l[i] * a + sum, m[i] = m_new;
        for (int d = 0; d < hd; d++) {
            float acc = 0;
            for (int j = 0; j < n; j++) acc += s[j] * Load1(row(v, ldv, j), d);
            o[(size_t)i * hd + d] = o[(size_t)i * hd + d] * a + acc;
        }
    }
}

template <float (*Load1)(const void *, int)>
void gemm_pack(const void *w, size_t stride, int rows, int n, float *p) {
    constexpr int C = KernelTable::kGemmCols;
    for (int k = 0; k < n; k++) {
        float *pk = p + (size_t)k * C;
        for (int j = 0; j < rows; j++) pk[j] = Load1((const char *)w + (size_t)j * stride, k);
        for (int j = rows; j < C; j++) pk[j] = 0.0f;
    }
}

// Four tokens at a time against the whole panel: the j loops are plain multiply-adds over 32
// contiguous floats, which the compiler vectorises for whatever vector unit the target has.
void gemm_panel(const float *p, int n, const float *x, size_t ldx, int n_tok, float *y, size_t ldy, int cols) {
    constexpr int C = KernelTable::kGemmCols, NT = 4;
    for (int t0 = 0; t0 < n_tok; t0 += NT) {
        const int nt = std::min(NT, n_tok - t0);
        float acc[NT][C] = {};
        for (int k = 0; k < n; k++) {
            const float *pk = p + (size_t)k * C;
            for (int t = 0; t < nt; t++) {
                const float xv = x[(size_t)(t0 + t) * ldx + k];
                for (int j = 0; j < C; j++) acc[t][j] += pk[j] * xv;
            }
        }
        for (int t = 0; t < nt; t++) {
            float *yt = y + (size_t)(t0 + t) * ldy;
            for (int j = 0; j < cols; j++) yt[j] = acc[t][j];
        }
    }
}

KernelTable::QuantDot quant_for_bits(int bits) {
    return bits == 8 ? dot_rows_quant<8> : bits == 6 ? dot_rows_quant<6> : bits == 5 ? dot_rows_quant<5>
         : bits == 3 ? dot_rows_quant<3> : dot_rows_quant<4>;
}

// dot_rows_quant: filled from the dtype table in scalar_kernels()
const KernelTable kPlain = {Isa::Scalar,
                            {dot_rows_f32, dot_rows_f16, dot_rows_bf16},
                            {to_f32_f32, to_f32_f16, to_f32_bf16},
                            {rows_to_f32<to_f32_f32>, rows_to_f32<to_f32_f16>, rows_to_f32<to_f32_bf16>},
                            swiglu,
                            geglu,
                            gelu_erf,
                            softcap,
                            exp_shift_sum,
                            reduce_max,
                            quantize_acts,
                            {},  // dot_rows_quant
    {}, {}, {}, {},  // KV kernels: set by the factory
    {dot_rows_each<dot_rows_f32>, dot_rows_each<dot_rows_f16>, dot_rows_each<dot_rows_bf16>},
    {gemm_pack<load1_f32>, gemm_pack<load1_f16>, gemm_pack<load1_bf16>},
    gemm_panel};

}  // namespace

const KernelTable *scalar_kernels() {
    static const KernelTable table = [] {
        KernelTable t = with_quant_kernels(kPlain, quant_for_bits);
        set_scalar_kv_kernels(t);
        t.attn_lanes[(int)KvType::F32] = attn_lanes<load1_f32>, t.attn_lanes[(int)KvType::F16] = attn_lanes<load1_f16>;
        return t;
    }();
    return &table;
}

void set_scalar_kv_kernels(KernelTable &t) {
    const int f32 = (int)KvType::F32, f16 = (int)KvType::F16, q8 = (int)KvType::Q8;
    t.kv_dot[f32] = kv_dot_each<kv_dot_f32>, t.kv_dot[f16] = kv_dot_each<kv_dot_f16>, t.kv_dot[q8] = kv_dot_each<kv_dot_q8>;
    t.kv_accum[f32] = kv_accum_each<kv_accum_f32>, t.kv_accum[f16] = kv_accum_each<kv_accum_f16>;
    t.kv_accum[q8] = kv_accum_each<kv_accum_q8>;
    t.kv_store[f32] = kv_store_f32, t.kv_store[f16] = kv_store_f16, t.kv_store[q8] = kv_store_q8;
    t.kv_load[f32] = to_f32_f32, t.kv_load[f16] = to_f32_f16, t.kv_load[q8] = kv_load_q8;
}

}  // namespace fastllm
