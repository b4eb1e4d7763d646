// ops.h — the operations of a transformer forward pass over f32 activations, built on the kernel
// table (kernels.h) and the thread pool; the CPU backend (backend_cpu.cpp) calls them. Every op has
// a slow, obviously-correct twin in namespace ref (ops_ref.cpp) that the tests compare it with.
#pragma once

#include <cstddef>
#include <functional>

#include "arch/decoder_config.h"
#include "cpu/kernels.h"
#include "format/tensor.h"
#include "arch/kv_cache.h"

namespace fastllm {

class ThreadPool;

namespace ops {

// Working memory of matmul: per-thread f32 weight panels, and room for T x K quantized activations.
struct MatmulScratch {
    float *f32;
    QuantActs acts;
};
// Floats of memory a MatmulScratch needs for up to max_T rows of at most K columns.
size_t matmul_scratch_floats(int64_t K, int n_threads, int max_T);
MatmulScratch make_matmul_scratch(float *memory, int64_t K, int n_threads, int max_T);

// y[T, N] = x[T, K] . W[N, K]^T (+ bias[N] if not null). W may be of any dtype: plain weights
// are widened to f32; quantized weights meet the activations quantized to int8.
void matmul(const KernelTable &k, const Tensor &W, const float *bias, const float *x, int T, float *y,
            const MatmulScratch &scratch, ThreadPool &pool);

// Row r of a matrix of any dtype, as f32 (embedding lookups).
void dequantize_row(const KernelTable &k, const Tensor &W, int64_t r, float *out);

// out = x / sqrt(mean(x^2) + eps) * w  (out may equal x)
void rmsnorm(const float *x, const float *w, int n, float eps, float *out);

// out = norm(x) of the given kind (w: [n]; b: [n] for LayerNorm, else unused; out may equal x).
void norm(NormKind kind, const float *x, const float *w, const float *b, int n, float eps, float *out);

// Rotates the first rope_dim values of each head of one token in place (cos, sin: rope_dim/2
// values): rotate-half pairs (i, i + rope_dim/2), or interleaved pairs (2i, 2i + 1).
void rope(float *v, int n_heads, int head_dim, int rope_dim, bool interleaved, const float *cos, const float *sin);

// out[i] = silu(gate[i]) * up[i], with gate_up = [gate (n) | up (n)] per row.
void swiglu(const KernelTable &k, const float *gate_up, int n, float *out);
// out[i] = gelu_tanh(gate[i]) * up[i] (the table's kernel).
void geglu(const KernelTable &k, const float *gate_up, int n, float *out);
// out[i] = act(gate[i]) * up[i]: the table's kernels for silu and gelu_tanh.
void glu(const KernelTable &k, Act kind, const float *gate_up, int n, float *out);
// out[i] = act(x[i]) (out may be x); the exact GELU by the table's kernel.
void act(const KernelTable &k, Act kind, const float *x, size_t n, float *out);

// Working memory of attention: a block of queries, keys and values per thread.
struct AttentionScratch {
    float *blocks = nullptr;  // n_threads parts of blocks_stride floats
    size_t blocks_stride = 0;
};
// For heads of head_dim values and KV rows of kv_dim values.
size_t attention_scratch_floats(int n_threads, int head_dim, int64_t kv_dim);
AttentionScratch make_attention_scratch(float *memory, int head_dim, int64_t kv_dim);

// Attention (causal or, with !shape.causal, over each run's keys) over one layer of KV caches (of
// any KvType, read in place) for the rows of runs[0..n_runs) (sorted by first_row; each run's
// cache already holds its positions up to pos0 + T - 1); q and out are [rows, n_heads*head_dim].
// A run of more than kStepRows rows (a prompt) goes in blocks: a few rows of one KV head's
// queries against 128 keys at a time, the softmax kept online (running maximum and sum), a task
// taking several blocks so that each step's keys and values are converted once for all of them. Shorter runs (decoding) go so too when a KV head has
// enough query heads; otherwise they read the cache in place, a task per (group of rows whose keys
// split alike, KV head, block of its heads, and for long rows of a model with few KV heads, part of
// the keys). Either way each row gets the bits it gets in a run of its own (kStepRows).
constexpr int kAttentionBlockRows = kStepRows + 1;
void attention(const KernelTable &k, const float *q, const AttentionRun *runs, int n_runs, int layer,
               const AttentionShape &shape, float *out, const AttentionScratch &scratch, ThreadPool &pool);

}  // namespace ops

namespace ref {
// Plain dtypes: exact products of x with the weights. Quantized dtypes: x is quantized to int8 per
// block of 32 exactly as the fast kernels do it, then multiplied with the dequantized weights.
void matmul(const Tensor &W, const float *bias, const float *x, int T, float *y);
void quantize_acts(const float *x, int n, int8_t *q, float *d, int32_t *sum);
void rmsnorm(const float *x, const float *w, int n, float eps, float *out);
void norm(NormKind kind, const float *x, const float *w, const float *b, int n, float eps, float *out);
void rope(float *v, int n_heads, int head_dim, int rope_dim, bool interleaved, const float *cos, const float *sin);
void swiglu(const float *gate_up, int n, float *out);
void geglu(const float *gate_up, int n, float *out);
double activation(Act kind, double x);
void glu(Act kind, const float *gate_up, int n, float *out);
void act(Act kind, const float *x, size_t n, float *out);
void softmax(float *x, int n);
// One layer's K and V rows as attention reads them: the cache's own, or a device's copy of them.
struct KvRows {
    KvType type_k, type_v;
    std::function<const void *(int pos, bool value)> row;  // the key (value false) or value row at pos
};
void attention(const float *q, int T, int pos0, const KvRows &kv, const AttentionShape &shape, float *out);
// The same over a cache's rows in host memory.
void attention(const float *q, int T, int pos0, const KvCache &cache, int layer, const AttentionShape &shape,
               float *out);
// A KV cache row of n values as f32, read value by value from the layout in arch/kv_format.h; and
// n values stored as a row of that type (q8: a scale of amax / 127 per block, codes rounded to
// nearest).
void kv_load(KvType type, const void *row, int n, float *out);
void kv_store(KvType type, const float *x, int n, void *row);
float weight(const Tensor &W, int64_t r, int64_t c);  // element of a matrix as f32
}  // namespace ref

}  // namespace fastllm
