// Reference ops: plain loops in double precision, written for clarity, not speed. The tests check
// every fast op in ops.cpp (at every ISA level) against these.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "cpu/ops.h"

namespace fastllm {
namespace ref {

float weight(const Tensor &W, int64_t r, int64_t c) {
    if (dtype_is_quantized(W.dtype)) {  // one code of the tile layout (tile_code in tensor.h)
        const QuantTile q = quant_tile(W, r / kTileRows * kTileRows);
        const int lane = (int)(r % kTileRows), bits = dtype_bits(W.dtype);
        const int64_t g = c / q.group;
        const float scale = tile_scale(q, g, lane), code = (float)tile_code(q.codes, bits, lane, c);
        // symmetric: scale * (code - 2^(bits-1)); q4m, q4k: scale * code + min
        if (q.has_min()) return scale * code + tile_min(q, g, lane);
        return scale * (code - (float)(1 << (bits - 1)));
    }
    const void *row = W.row(r);
    switch (W.dtype) {
    case DType::F32: return ((const float *)row)[c];
    case DType::F16: return f16_to_f32(((const uint16_t *)row)[c]);
    case DType::BF16: return bf16_to_f32(((const uint16_t *)row)[c]);
    default: return 0;
    }
}

void quantize_acts(const float *x, int n, int8_t *q, float *d, int32_t *sum) {
    for (int b = 0; b < n / 32; b++) {
        float amax = 0;
        for (int i = 0; i < 32; i++) amax = std::max(amax, std::fabs(x[b * 32 + i]));
        d[b] = amax / 127.0f;
        const float id = amax > 0 ? 127.0f / amax : 0.0f;
        sum[b] = 0;
        for (int i = 0; i < 32; i++) {
            q[b * 32 + i] = (int8_t)std::nearbyint(x[b * 32 + i] * id);
            sum[b] += q[b * 32 + i];
        }
    }
}

void matmul(const Tensor &W, const float *bias, const float *x, int T, float *y) {
    int64_t N = W.rows(), K = W.cols();
    std::vector<float> xs(x, x + (size_t)T * K);
    if (dtype_is_quantized(W.dtype)) {  // the activations the quantized kernels actually see
        std::vector<int8_t> q(K);
        std::vector<float> d(K / 32);
        std::vector<int32_t> sum(K / 32);
        for (int t = 0; t < T; t++) {
            quantize_acts(x + t * K, (int)K, q.data(), d.data(), sum.data());
            for (int64_t c = 0; c < K; c++) xs[t * K + c] = d[c / 32] * q[c];
        }
    }
    // Each row read once for every token (weight() per token and value was half of test_kernels'
    // time, 20x that under QEMU); the sums are the same, term by term.
    std::vector<double> row(K);
    for (int64_t r = 0; r < N; r++) {
        for (int64_t c = 0; c < K; c++) row[c] = weight(W, r, c);
        for (int t = 0; t < T; t++) {
            double s = bias ? bias[r] : 0.0;
            for (int64_t c = 0; c < K; c++) s += row[c] * xs[t * K + c];
            y[t * N + r] = (float)s;
        }
    }
}

void rmsnorm(const float *x, const float *w, int n, float eps, float *out) {
    double ss = 0;
    for (int i = 0; i < n; i++) ss += (double)x[i] * x[i];
    double inv = 1.0 / std::sqrt(ss / n + eps);
    for (int i = 0; i < n; i++) out[i] = (float)(x[i] * inv * w[i]);
}

void norm(NormKind kind, const float *x, const float *w, const float *b, int n, float eps, float *out) {
    double mean = 0, ss = 0;
    if (kind == NormKind::Layer) {
        for (int i = 0; i < n; i++) mean += x[i];
        mean /= n;
    }
    for (int i = 0; i < n; i++) ss += ((double)x[i] - mean) * ((double)x[i] - mean);
    const double inv = 1.0 / std::sqrt(ss / n + eps);
    for (int i = 0; i < n; i++) {
        out[i] = (float)((x[i] - mean) * inv * w[i] + (kind == NormKind::Layer && b ? b[i] : 0.0));
    }
}

void rope(float *v, int n_heads, int head_dim, int rope_dim, bool interleaved, const float *cos, const float *sin) {
    const int half = rope_dim / 2;
    for (int h = 0; h < n_heads; h++) {
        float *p = v + h * head_dim;
        for (int i = 0; i < half; i++) {
            const int i0 = interleaved ? 2 * i : i, i1 = interleaved ? 2 * i + 1 : i + half;
            double a = p[i0], b = p[i1];
            p[i0] = (float)(a * cos[i] - b * sin[i]);
            p[i1] = (float)(b * cos[i] + a * sin[i]);
        }
    }
}

double activation(Act kind, double x) {
    switch (kind) {
    case Act::Silu: return x / (1.0 + std::exp(-x));
    case Act::GeluTanh: return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / 3.14159265358979323846) * (x + 0.044715 * x * x * x)));
    case Act::GeluErf: return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0)));
    case Act::Tanh: return std::tanh(x);
    }
    return 0;
}

void glu(Act kind, const float *gate_up, int n, float *out) {
    for (int i = 0; i < n; i++) out[i] = (float)(activation(kind, gate_up[i]) * gate_up[n + i]);
}

void act(Act kind, const float *x, size_t n, float *out) {
    for (size_t i = 0; i < n; i++) out[i] = (float)activation(kind, x[i]);
}

void swiglu(const float *gate_up, int n, float *out) { glu(Act::Silu, gate_up, n, out); }
void geglu(const float *gate_up, int n, float *out) { glu(Act::GeluTanh, gate_up, n, out); }

void softmax(float *x, int n) {
    double mx = x[0];
    for (int i = 1; i < n; i++) mx = std::max(mx, (double)x[i]);
    double sum = 0;
    for (int i = 0; i < n; i++) sum += std::exp(x[i] - mx);
    for (int i = 0; i < n; i++) x[i] = (float)(std::exp(x[i] - mx) / sum);
}

void kv_load(KvType type, const void *row, int n, float *out) {
    for (int i = 0; i < n; i++) {
        if (type == KvType::F32) {
            out[i] = ((const float *)row)[i];
        } else if (type == KvType::F16) {
            out[i] = f16_to_f32(((const uint16_t *)row)[i]);
        } else {  // a float scale, then 32 codes, per block
            const char *block = (const char *)row + (size_t)(i / kKvQ8Block) * kKvQ8BlockBytes;
            float d;
            std::memcpy(&d, block, 4);
            out[i] = d * (float)((const int8_t *)block)[4 + i % kKvQ8Block];
        }
    }
}

void kv_store(KvType type, const float *x, int n, void *row) {
    for (int b = 0; b * kKvQ8Block < n; b++) {
        const int first = b * kKvQ8Block, len = std::min(kKvQ8Block, n - first);
        if (type == KvType::F32) {
            std::memcpy((float *)row + first, x + first, sizeof(float) * len);
            continue;
        }
        if (type == KvType::F16) {
            for (int i = first; i < first + len; i++) ((uint16_t *)row)[i] = f32_to_f16(x[i]);
            continue;
        }
        float amax = 0;
        for (int i = 0; i < len; i++) amax = std::max(amax, std::fabs(x[first + i]));
        const float d = amax / 127.0f, id = amax > 0 ? 127.0f / amax : 0.0f;
        char *block = (char *)row + (size_t)b * kKvQ8BlockBytes;
        std::memcpy(block, &d, 4);
        for (int i = 0; i < kKvQ8Block; i++)
            ((int8_t *)block)[4 + i] = i < len ? (int8_t)std::nearbyint(x[first + i] * id) : 0;
    }
}

void attention(const float *q, int T, int pos0, const KvCache &cache, int layer, const AttentionShape &sh,
               float *out) {
    const KvRows kv{cache.type_k(), cache.type_v(),
                    [&](int pos, bool value) -> const void * { return value ? cache.v_row(layer, pos) : cache.k_row(layer, pos); }};
    attention(q, T, pos0, kv, sh, out);
}

void attention(const float *q, int T, int pos0, const KvRows &kv, const AttentionShape &sh, float *out) {
    const int head_dim = sh.head_dim, kv_dim = sh.n_kv_heads * head_dim, group = sh.n_heads / sh.n_kv_heads;
    const int positions = pos0 + T;
    std::vector<float> k_cache((size_t)positions * kv_dim), v_cache(k_cache.size());
    // The keys the run's first query sees on: a windowed cache holds no others.
    for (int j = sh.window > 0 ? std::max(0, pos0 - sh.window + 1) : 0; j < positions; j++) {
        kv_load(kv.type_k, kv.row(j, false), kv_dim, &k_cache[(size_t)j * kv_dim]);
        kv_load(kv.type_v, kv.row(j, true), kv_dim, &v_cache[(size_t)j * kv_dim]);
    }
    for (int t = 0; t < T; t++)
        for (int h = 0; h < sh.n_heads; h++) {
            // the last key the row sees: its own position, or (an encoder) the run's last
            const int p = sh.causal ? pos0 + t : pos0 + T - 1, kvh = h / group;
            const float *qh = q + (size_t)t * sh.n_heads * head_dim + h * head_dim;
            std::vector<double> s(p + 1);
            double mx = -1e300;
            for (int j = 0; j <= p; j++) {
                if (sh.window > 0 && p - j >= sh.window) continue;  // masked: older than the window
                double d = 0;
                for (int i = 0; i < head_dim; i++) d += (double)qh[i] * k_cache[(size_t)j * kv_dim + kvh * head_dim + i];
                s[j] = d * sh.scale;
                if (sh.softcap > 0) s[j] = sh.softcap * std::tanh(s[j] / sh.softcap);
                mx = std::max(mx, s[j]);
            }
            double sum = 0;
            for (int j = 0; j <= p; j++)
                sum += (s[j] = sh.window > 0 && p - j >= sh.window ? 0.0 : std::exp(s[j] - mx));
            // Key by key, each weight divided once (not once per value: those divisions were a third
            // of test_kernels' time); every output's terms are added in the same order as before.
            std::vector<double> acc(head_dim, 0.0);
            for (int j = 0; j <= p; j++) {
                const double w = s[j] / sum;
                const float *v = &v_cache[(size_t)j * kv_dim + kvh * head_dim];
                for (int i = 0; i < head_dim; i++) acc[i] += w * v[i];
            }
            float *o = out + (size_t)t * sh.n_heads * head_dim + h * head_dim;
            for (int i = 0; i < head_dim; i++) o[i] = (float)acc[i];
        }
}

}  // namespace ref
}  // namespace fastllm
