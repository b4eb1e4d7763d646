#include "cpu/backend_cpu.h"

#include "arch/lora.h"

#include <algorithm>
#include <cstring>
#include <vector>

namespace fastllm {

namespace {
const float *data_or_null(const Tensor &t) { return t.empty() ? nullptr : t.f32(); }
}  // namespace

std::string CpuBackend::describe() const {
    return std::string("cpu ") + isa_name(k_.isa) + ", " + std::to_string(pool_.n_threads()) + " threads";
}

void CpuBackend::carve(Arena &a, const PassShape &s) {
    const int n_threads = pool_.n_threads();
    float *matmul = a.take(ops::matmul_scratch_floats(s.max_k, n_threads, s.max_batch));
    float *attn = a.take(ops::attention_scratch_floats(n_threads, s.head_dim, s.kv_dim));
    const size_t lora_stride = (size_t)s.max_k;  // a rank up to max_k (LoraAdapter checks)
    float *lora = a.take((size_t)n_threads * lora_stride);
    if (a.planning()) return;
    lora_ = lora, lora_stride_ = lora_stride;
    scratch_ = ops::make_matmul_scratch(matmul, s.max_k, n_threads, s.max_batch);
    attn_ = ops::make_attention_scratch(attn, s.head_dim, s.kv_dim);
}

void CpuBackend::download(void *dst, const void *src, size_t bytes) { std::memcpy(dst, src, bytes); }

void CpuBackend::upload(void *dst, const void *src, size_t bytes) { std::memcpy(dst, src, bytes); }

void CpuBackend::read_kv_row(const KvCache &c, int layer, bool value, int pos, void *dst) {
    std::memcpy(dst, value ? c.v_row(layer, pos) : c.k_row(layer, pos), value ? c.row_bytes_v() : c.row_bytes_k());
}

void CpuBackend::write_kv_row(KvCache &c, int layer, bool value, int pos, KvType from, const void *src) {
    const KvType to = value ? c.type_v() : c.type_k();
    char *dst = value ? c.v_row(layer, pos) : c.k_row(layer, pos);
    if (from == to) {
        std::memcpy(dst, src, value ? c.row_bytes_v() : c.row_bytes_k());
        return;
    }
    std::vector<float> row((size_t)c.kv_dim());  // a conversion (a state saved with other KV types): rare
    k_.kv_load[(int)from](src, row.data(), c.kv_dim());
    k_.kv_store[(int)to](row.data(), c.kv_dim(), dst);
}

void CpuBackend::embed(const Tensor &E, const int32_t *tokens, int T, float scale, float *x) {
    const int64_t H = E.cols();
    for (int t = 0; t < T; t++) {
        float *row = x + (size_t)t * H;
        ops::dequantize_row(k_, E, tokens[t], row);
        if (scale != 1.0f)
            for (int64_t i = 0; i < H; i++) row[i] *= scale;
    }
}

void CpuBackend::matmul(const Tensor &W, const Tensor &bias, const float *x, int T, float *y) {
    ops::matmul(k_, W, data_or_null(bias), x, T, y, scratch_, pool_);
}

void CpuBackend::norm(NormKind kind, float eps, const Tensor &w, const Tensor &b, const float *x, int rows, int n,
                      float *out) {
    per_row(rows, [&](int64_t r) {
        ops::norm(kind, x + (size_t)r * n, w.f32(), data_or_null(b), n, eps, out + (size_t)r * n);
    });
}

void CpuBackend::add_norm(NormKind kind, float eps, const Tensor &post_w, float *d, float *x, const Tensor &w,
                          const Tensor &b, int T, int n, float *out) {
    per_row(T, [&](int64_t t) {
        float *xt = x + (size_t)t * n;
        float *dt = d + (size_t)t * n;
        if (!post_w.empty()) ops::norm(kind, dt, post_w.f32(), nullptr, n, eps, dt);  // sandwich norm
        for (int i = 0; i < n; i++) xt[i] += dt[i];
        if (!w.empty()) ops::norm(kind, xt, w.f32(), data_or_null(b), n, eps, out + (size_t)t * n);
    });
}

void CpuBackend::qkv_to_cache(const QkvStep &s) {
    const int hd = s.head_dim, q_dim = s.n_heads * hd, kv_dim = s.n_kv_heads * hd, qkv_dim = q_dim + 2 * kv_dim;
    per_row(s.T, [&](int64_t t) {
        const ForwardRow &r = s.rows[t];
        // k and v are finished in place in the projection's output, then stored in the cache's types.
        float *row = s.qkv + (size_t)t * qkv_dim, *k = row + q_dim, *v = row + q_dim + kv_dim;
        float *q = s.q + (size_t)t * q_dim;
        std::memcpy(q, row, sizeof(float) * q_dim);
        if (s.q_norm) {
            for (int h = 0; h < s.n_heads; h++) ops::norm(s.norm_kind, q + h * hd, s.q_norm->f32(), nullptr, hd, s.norm_eps, q + h * hd);
            for (int h = 0; h < s.n_kv_heads; h++) ops::norm(s.norm_kind, k + h * hd, s.k_norm->f32(), nullptr, hd, s.norm_eps, k + h * hd);
        }
        const RopeTable &tab = *s.rope[t];
        ops::rope(q, s.n_heads, hd, s.rope_dim, s.rope_interleaved, tab.cos_at(r.pos), tab.sin_at(r.pos));
        ops::rope(k, s.n_kv_heads, hd, s.rope_dim, s.rope_interleaved, tab.cos_at(r.pos), tab.sin_at(r.pos));
        k_.kv_store[(int)r.cache->type_k()](k, kv_dim, r.cache->k_row(s.layer, r.pos));
        k_.kv_store[(int)r.cache->type_v()](v, kv_dim, r.cache->v_row(s.layer, r.pos));
    });
}

void CpuBackend::shift_cache(KvCache &c, int layer, int from, int n, int delta, const KeyShift &ks) {
    // In order of position: a row is read before the move overwrites it (delta > 0). Its own
    // scratch (a shift is rare), so that no pass's lock is needed.
    const int dim = c.kv_dim();
    std::vector<float> scratch((size_t)dim);
    float *row = scratch.data();
    const auto load_k = k_.kv_load[(int)c.type_k()];
    const auto store_k = k_.kv_store[(int)c.type_k()];
    for (int p = from; p < from + n; p++) {
        if (!c.holds(layer, p)) continue;  // out of a sliding window: dropped
        load_k(c.k_row(layer, p), row, dim);
        ops::rope(row, ks.n_kv_heads, ks.head_dim, ks.rope_dim, ks.rope_interleaved, ks.cos, ks.sin);
        store_k(row, dim, c.k_row(layer, p - delta));
        std::memcpy(c.v_row(layer, p - delta), c.v_row(layer, p), c.row_bytes_v());
    }
}

void CpuBackend::attention(const float *q, const AttentionRun *runs, int n_runs, int layer, const AttentionShape &s,
                           float *out) {
    ops::attention(k_, q, runs, n_runs, layer, s, out, attn_, pool_);
}

void CpuBackend::glu(Act kind, const float *gate_up, int T, int n, float *out) {
    per_row(T, [&](int64_t t) { ops::glu(k_, kind, gate_up + (size_t)t * 2 * n, n, out + (size_t)t * n); });
}

void CpuBackend::act(Act kind, const float *x, size_t n, float *out) {
    constexpr size_t kChunk = 4096;  // elements per task: MiniLM's 32-token pass is 12 chunks a layer
    per_row((int64_t)((n + kChunk - 1) / kChunk), [&](int64_t c) {
        const size_t first = (size_t)c * kChunk;
        ops::act(k_, kind, x + first, std::min(kChunk, n - first), out + first);
    });
}

void CpuBackend::softcap(float *x, size_t n, float cap) { k_.softcap(x, n, cap); }

// A task per row: the row's own adapters, one after another (rows never share an output), each
// part as r dot products (a x) and r scaled adds of bt's rows: the two sums of attention over the
// KV cache (kv_dot, kv_accum), whatever the rows' type. 8 sessions with 8 adapters decoding: one
// job per matrix, where a matmul and an add per part took 2,000 jobs a step.
void CpuBackend::lora(const ForwardRow *rows, int T, int layer, int m, const float *x, int64_t in, float *y,
                      int64_t out) {
    pool_.parallel_for(T, [&](int64_t first, int64_t last, int tid) {
        float *ax = lora_ + (size_t)tid * lora_stride_;
        for (int64_t t = first; t < last; t++) {
            if (!rows[t].lora) continue;
            const float *xt = x + (size_t)t * in;
            float *yt = y + (size_t)t * out;
            for (const auto &entry : rows[t].lora->entries) {
                if (entry.second == 0.0f) continue;
                for (const LoraPart &p : entry.first->parts(layer, m)) {
                    const LoraRows &a = p.a, &bt = p.bt;
                    k_.kv_dot[(int)a.type](a.data, a.stride, a.n, 0, xt, 1, (int)in, ax, 0);
                    for (int j = 0; j < a.n; j++) ax[j] *= entry.second;
                    k_.kv_accum[(int)bt.type](ax, 0, 1, bt.n, bt.data, bt.stride, 0, (int)bt.len, yt + p.row0, 0);
                }
            }
        }
    });
}

}  // namespace fastllm
