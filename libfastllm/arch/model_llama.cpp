#include "arch/model_llama.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "runtime/arena.h"
#include "api/error.h"
#include "cpu/ops.h"

namespace fastllm {

namespace {

int read_dim(const FlmFile &f, const char *key, int64_t lo, int64_t hi) {
    int64_t v = f.get_int(key);
    if (v < lo || v > hi)
        fail(FASTLLM_ERR_BAD_FORMAT, "%s: %s = %lld is out of range [%lld, %lld]", f.path().c_str(), key, (long long)v,
             (long long)lo, (long long)hi);
    return (int)v;
}

// Looks up a tensor and checks its shape; optional tensors may be absent (empty view).
Tensor get(const FlmFile &f, const std::string &name, std::initializer_list<int64_t> shape, bool optional = false,
           bool must_be_f32 = false) {
    if (optional && !f.has_tensor(name)) return Tensor{};
    const Tensor &t = f.tensor(name);  // throws "missing tensor"
    bool ok = t.n_dims == (int)shape.size();
    int d = 0;
    for (int64_t want : shape) ok = ok && t.dims[d++] == want;
    if (!ok) {
        std::string want, got;
        for (int64_t v : shape) want += std::to_string(v) + " ";
        for (int i = 0; i < t.n_dims; i++) got += std::to_string(t.dims[i]) + " ";
        fail(FASTLLM_ERR_BAD_FORMAT, "%s: tensor '%s' has shape [ %s], the config implies [ %s]", f.path().c_str(),
             name.c_str(), got.c_str(), want.c_str());
    }
    if (must_be_f32 && t.dtype != DType::F32)
        fail(FASTLLM_ERR_BAD_FORMAT, "%s: tensor '%s' must be f32, is %s", f.path().c_str(), name.c_str(),
             dtype_name(t.dtype));
    return t;
}

}  // namespace

LlamaModel::LlamaModel(const FlmFile &f) {
    const char *path = f.path().c_str();
    constexpr int64_t kMaxDim = 1 << 20;
    cfg_.vocab_size = read_dim(f, "llama.vocab_size", 1, 1 << 24);
    cfg_.hidden_size = read_dim(f, "llama.hidden_size", 1, kMaxDim);
    cfg_.intermediate_size = read_dim(f, "llama.intermediate_size", 1, kMaxDim);
    cfg_.num_layers = read_dim(f, "llama.num_layers", 1, 4096);
    cfg_.num_heads = read_dim(f, "llama.num_heads", 1, 4096);
    cfg_.num_kv_heads = read_dim(f, "llama.num_kv_heads", 1, cfg_.num_heads);
    cfg_.head_dim = read_dim(f, "llama.head_dim", 2, 4096);
    cfg_.context_length = read_dim(f, "llama.context_length", 1, 1 << 22);
    cfg_.rms_norm_eps = (float)f.get_float("llama.rms_norm_eps");
    cfg_.tied_embeddings = f.get_int("llama.tie_word_embeddings", 0) != 0;
    if (cfg_.num_heads % cfg_.num_kv_heads != 0 || cfg_.head_dim % 2 != 0)
        fail(FASTLLM_ERR_BAD_FORMAT, "%s: %d heads, %d KV heads, head_dim %d: heads must be a multiple of KV heads and head_dim even",
             path, cfg_.num_heads, cfg_.num_kv_heads, cfg_.head_dim);
    if (!(cfg_.rms_norm_eps >= 0 && cfg_.rms_norm_eps < 1))
        fail(FASTLLM_ERR_BAD_FORMAT, "%s: llama.rms_norm_eps = %g is invalid", path, cfg_.rms_norm_eps);

    const int64_t V = cfg_.vocab_size, H = cfg_.hidden_size, I = cfg_.intermediate_size;
    embedding_ = get(f, "token_embd.weight", {V, H});
    output_norm_ = get(f, "output_norm.weight", {H}, false, true);
    output_ = cfg_.tied_embeddings ? embedding_ : get(f, "output.weight", {V, H});
    for (int l = 0; l < cfg_.num_layers; l++) {
        std::string p = "blk." + std::to_string(l) + ".";
        LlamaLayer L;
        L.attn_norm = get(f, p + "attn_norm.weight", {H}, false, true);
        L.qkv = get(f, p + "attn_qkv.weight", {cfg_.qkv_dim(), H});
        L.qkv_bias = get(f, p + "attn_qkv.bias", {cfg_.qkv_dim()}, true, true);
        L.attn_output = get(f, p + "attn_output.weight", {H, cfg_.q_dim()});
        L.attn_output_bias = get(f, p + "attn_output.bias", {H}, true, true);
        L.ffn_norm = get(f, p + "ffn_norm.weight", {H}, false, true);
        L.gate_up = get(f, p + "ffn_gate_up.weight", {2 * I, H});
        L.gate_up_bias = get(f, p + "ffn_gate_up.bias", {2 * I}, true, true);
        L.down = get(f, p + "ffn_down.weight", {H, I});
        L.down_bias = get(f, p + "ffn_down.bias", {H}, true, true);
        layers_.push_back(L);
    }
    for (const auto &kv : f.tensors()) n_params_ += (uint64_t)kv.second.n_elements();

    // RoPE tables from the stored inverse frequencies (scaling already applied by the converter).
    const auto &inv_freq = f.get_floats("llama.rope.inv_freq");
    const int half = cfg_.head_dim / 2;
    if ((int)inv_freq.size() != half)
        fail(FASTLLM_ERR_BAD_FORMAT, "%s: llama.rope.inv_freq has %zu values, head_dim/2 = %d", path, inv_freq.size(), half);
    const double factor = f.has("llama.rope.attention_factor") ? f.get_float("llama.rope.attention_factor") : 1.0;
    rope_cos_.resize((size_t)cfg_.context_length * half);
    rope_sin_.resize(rope_cos_.size());
    for (int pos = 0; pos < cfg_.context_length; pos++)
        for (int i = 0; i < half; i++) {
            float angle = (float)pos * inv_freq[i];  // f32 product, as the reference computes it
            rope_cos_[(size_t)pos * half + i] = (float)(std::cos((double)angle) * factor);
            rope_sin_[(size_t)pos * half + i] = (float)(std::sin((double)angle) * factor);
        }
}

size_t LlamaModel::state_floats(int n_ctx, int B, int n_threads) const {
    const LlamaConfig &c = cfg_;
    int64_t max_k = std::max({c.hidden_size, c.q_dim(), c.intermediate_size});
    size_t per_token = (size_t)2 * c.hidden_size + c.q_dim() + c.qkv_dim() + c.q_dim() + 2 * (size_t)c.intermediate_size +
                       c.intermediate_size;
    return per_token * B + (size_t)kLogitRows * c.vocab_size + (size_t)n_threads * c.context_length +
           ops::matmul_scratch_floats(max_k, n_threads, B) +
           2 * (size_t)c.num_layers * n_ctx * c.kv_dim();
}

void LlamaModel::init_state(LlamaState &s, Arena &a, int n_ctx, int B, ThreadPool &pool) const {
    const LlamaConfig &c = cfg_;
    const int n_threads = pool.n_threads();
    s.n_ctx = n_ctx, s.max_batch = B, s.pool = &pool;
    s.x = a.take((size_t)B * c.hidden_size);
    s.xb = a.take((size_t)B * c.hidden_size);
    s.q = a.take((size_t)B * c.q_dim());
    s.qkv = a.take((size_t)B * c.qkv_dim());
    s.attn = a.take((size_t)B * c.q_dim());
    s.gate_up = a.take((size_t)B * 2 * c.intermediate_size);
    s.act = a.take((size_t)B * c.intermediate_size);
    s.logits = a.take((size_t)kLogitRows * c.vocab_size);
    s.scores = a.take((size_t)n_threads * c.context_length);  // any session's positions fit
    const int64_t max_k = std::max({c.hidden_size, c.q_dim(), c.intermediate_size});
    s.scratch = ops::make_matmul_scratch(a.take(ops::matmul_scratch_floats(max_k, n_threads, B)), max_k, n_threads, B);
    s.k_cache = a.take((size_t)c.num_layers * n_ctx * c.kv_dim());
    s.v_cache = a.take((size_t)c.num_layers * n_ctx * c.kv_dim());
}

void LlamaModel::forward(const KernelTable &k, LlamaState &s, const int32_t *tokens, const ForwardRow *rows,
                         int T) const {
    const LlamaConfig &c = cfg_;
    const int H = c.hidden_size, I = c.intermediate_size, hd = c.head_dim, half = hd / 2;
    ThreadPool &pool = *s.pool;
    // The small per-token steps between the matmuls, split over the threads by tokens (a prompt).
    auto per_token = [&](auto &&fn) {
        pool.parallel_for(T, [&](int64_t first, int64_t last, int) {
            for (int64_t t = first; t < last; t++) fn((int)t);
        });
    };

    for (int t = 0; t < T; t++) ops::dequantize_row(k, embedding_, tokens[t], s.x + (size_t)t * H);

    for (int l = 0; l < c.num_layers; l++) {
        const LlamaLayer &L = layers_[l];
        const size_t layer_off = (size_t)l * c.kv_dim();  // times n_ctx of the row's own cache

        // Attention block: norm, fused QKV projection, RoPE, cache write, attention, output projection.
        per_token([&](int t) {
            ops::rmsnorm(s.x + (size_t)t * H, L.attn_norm.f32(), H, c.rms_norm_eps, s.xb + (size_t)t * H);
        });
        ops::matmul(k, L.qkv, L.qkv_bias.empty() ? nullptr : L.qkv_bias.f32(), s.xb, T, s.qkv, s.scratch, pool);
        per_token([&](int t) {  // each token writes its own cache rows
            const ForwardRow &r = rows[t];
            float *row = s.qkv + (size_t)t * c.qkv_dim();
            float *q = s.q + (size_t)t * c.q_dim();
            float *kk = r.cache->k_cache + layer_off * r.cache->n_ctx + (size_t)r.pos * c.kv_dim();
            float *vv = r.cache->v_cache + layer_off * r.cache->n_ctx + (size_t)r.pos * c.kv_dim();
            std::memcpy(q, row, sizeof(float) * c.q_dim());
            std::memcpy(kk, row + c.q_dim(), sizeof(float) * c.kv_dim());
            std::memcpy(vv, row + c.q_dim() + c.kv_dim(), sizeof(float) * c.kv_dim());
            const float *cos = rope_cos_.data() + (size_t)r.pos * half, *sin = rope_sin_.data() + (size_t)r.pos * half;
            ops::rope(q, c.num_heads, hd, cos, sin);
            ops::rope(kk, c.num_kv_heads, hd, cos, sin);
        });
        // Rows of the same cache at consecutive positions (a prompt) attend as one batch.
        for (int t = 0; t < T;) {
            int g = 1;
            while (t + g < T && rows[t + g].cache == rows[t].cache && rows[t + g].pos == rows[t].pos + g) g++;
            LlamaState &cache = *rows[t].cache;
            ops::attention(k, s.q + (size_t)t * c.q_dim(), g, rows[t].pos, cache.k_cache + layer_off * cache.n_ctx,
                           cache.v_cache + layer_off * cache.n_ctx, c.num_heads, c.num_kv_heads, hd,
                           s.attn + (size_t)t * c.q_dim(), s.scores, (size_t)c.context_length, pool);
            t += g;
        }
        ops::matmul(k, L.attn_output, L.attn_output_bias.empty() ? nullptr : L.attn_output_bias.f32(), s.attn, T, s.xb,
                    s.scratch, pool);
        // MLP block: residual add, norm, fused gate/up projection, SwiGLU, down projection.
        per_token([&](int t) {
            float *x = s.x + (size_t)t * H, *xb = s.xb + (size_t)t * H;
            for (int i = 0; i < H; i++) x[i] += xb[i];
            ops::rmsnorm(x, L.ffn_norm.f32(), H, c.rms_norm_eps, xb);
        });
        ops::matmul(k, L.gate_up, L.gate_up_bias.empty() ? nullptr : L.gate_up_bias.f32(), s.xb, T, s.gate_up, s.scratch, pool);
        per_token([&](int t) { ops::swiglu(k, s.gate_up + (size_t)t * 2 * I, I, s.act + (size_t)t * I); });
        ops::matmul(k, L.down, L.down_bias.empty() ? nullptr : L.down_bias.f32(), s.act, T, s.xb, s.scratch, pool);
        per_token([&](int t) {
            for (size_t i = (size_t)t * H; i < (size_t)(t + 1) * H; i++) s.x[i] += s.xb[i];
        });
    }

    // Output head, for the rows that want logits, kLogitRows at a time.
    int wanted[kLogitRows];
    for (int t = 0; t < T;) {
        int n = 0;
        for (; t < T && n < kLogitRows; t++)
            if (rows[t].logits) {
                ops::rmsnorm(s.x + (size_t)t * H, output_norm_.f32(), H, c.rms_norm_eps, s.xb + (size_t)n * H);
                wanted[n++] = t;
            }
        if (n == 0) continue;
        ops::matmul(k, output_, nullptr, s.xb, n, s.logits, s.scratch, pool);
        for (int i = 0; i < n; i++)
            std::memcpy(rows[wanted[i]].logits, s.logits + (size_t)i * c.vocab_size, sizeof(float) * c.vocab_size);
    }
}

}  // namespace fastllm
