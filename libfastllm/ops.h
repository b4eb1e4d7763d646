// ops.h — the operations of a transformer forward pass over f32 activations, built on the kernel
// table (kernels.h) and OpenMP. Every op has a slow, obviously-correct twin in namespace ref
// (ops_ref.cpp) that the tests compare it with.
#pragma once

#include <cstddef>

#include "kernels.h"
#include "tensor.h"

namespace fastllm {
namespace ops {

// Floats of scratch memory that matmul needs for inputs of K columns with n_threads threads.
size_t matmul_scratch_floats(int64_t K, int n_threads);

// y[T, N] = x[T, K] . W[N, K]^T (+ bias[N] if not null). W may be f32, f16 or bf16.
void matmul(const KernelTable &k, const Tensor &W, const float *bias, const float *x, int T, float *y, float *scratch,
            int n_threads);

// out = x / sqrt(mean(x^2) + eps) * w  (out may equal x)
void rmsnorm(const float *x, const float *w, int n, float eps, float *out);

// Rotates each head of one token in place, rotate-half layout: pairs (i, i + head_dim/2).
void rope(float *v, int n_heads, int head_dim, const float *cos, const float *sin);

// out[i] = silu(gate[i]) * up[i], with gate_up = [gate (n) | up (n)] per row.
void swiglu(const float *gate_up, int n, float *out);

void softmax(float *x, int n);

// Causal attention for T query tokens at positions pos0..pos0+T-1. q and out are [T, n_heads*head_dim];
// k_cache and v_cache are [positions, n_kv_heads*head_dim] and already hold positions up to pos0+T-1.
// scores: n_threads * (pos0 + T) floats of scratch.
void attention(const KernelTable &k, const float *q, int T, int pos0, const float *k_cache, const float *v_cache,
               int n_heads, int n_kv_heads, int head_dim, float *out, float *scores, int n_threads);

}  // namespace ops

namespace ref {
void matmul(const Tensor &W, const float *bias, const float *x, int T, float *y);
void rmsnorm(const float *x, const float *w, int n, float eps, float *out);
void rope(float *v, int n_heads, int head_dim, const float *cos, const float *sin);
void swiglu(const float *gate_up, int n, float *out);
void softmax(float *x, int n);
void attention(const float *q, int T, int pos0, const float *k_cache, const float *v_cache, int n_heads,
               int n_kv_heads, int head_dim, float *out);
float weight(const Tensor &W, int64_t r, int64_t c);  // element of a matrix as f32
}  // namespace ref

}  // namespace fastllm
