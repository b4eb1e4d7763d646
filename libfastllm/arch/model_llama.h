// model_llama.h — the LLaMA family: hyperparameters, weights (views into the .flm file) and one
// readable forward pass over a batch of tokens.
#pragma once

#include <cstdint>
#include <vector>

#include "fastllm.h"
#include "format/flm_file.h"
#include "cpu/kernels.h"
#include "cpu/ops.h"
#include "cpu/thread_pool.h"

namespace fastllm {

struct LlamaConfig {
    int vocab_size, hidden_size, intermediate_size, num_layers, num_heads, num_kv_heads, head_dim, context_length;
    float rms_norm_eps;
    bool tied_embeddings;
    int q_dim() const { return num_heads * head_dim; }
    int kv_dim() const { return num_kv_heads * head_dim; }
    int qkv_dim() const { return q_dim() + 2 * kv_dim(); }
};

struct LlamaLayer {
    Tensor attn_norm, qkv, qkv_bias, attn_output, attn_output_bias;
    Tensor ffn_norm, gate_up, gate_up_bias, down, down_bias;
};

// Per-session working memory for forward(): activations for up to max_batch tokens and the KV cache.
struct LlamaState {
    int n_ctx = 0, max_batch = 0;
    ThreadPool *pool = nullptr;                      // the threads that compute with this memory
    float *x, *xb, *q, *qkv, *attn, *gate_up, *act;  // [max_batch, ...]
    float *logits;                                   // [kLogitRows, vocab]: output-head rows before copy-out
    float *scores;                                   // [threads, context_length]: attention scores
    ops::MatmulScratch scratch;                      // matmul working memory
    float *k_cache, *v_cache;                        // [layers, n_ctx, kv_dim]
};

// One input token of a forward pass: whose KV cache it extends, at which position, and where its
// logits go (nullptr: not needed). Rows of one pass may belong to different sessions, which is
// how several sessions decode together in one pass over the weights.
struct ForwardRow {
    LlamaState *cache;
    int pos;
    float *logits;
};

class LlamaModel {
public:
    explicit LlamaModel(const FlmFile &file);  // validates every shape against the config

    const LlamaConfig &config() const { return cfg_; }
    DType weight_dtype() const { return layers_[0].qkv.dtype; }
    uint64_t n_params() const { return n_params_; }

    // Floats of memory a session needs (for Arena planning) and the number of buffers.
    size_t state_floats(int n_ctx, int max_batch, int n_threads) const;
    static constexpr size_t kStateBuffers = 12;
    static constexpr int kLogitRows = 16;  // output-head rows computed per pass over its weights
    void init_state(LlamaState &s, class Arena &arena, int n_ctx, int max_batch, ThreadPool &pool) const;

    // Runs tokens[0..T) (T <= work.max_batch; ids already validated) using work's activation
    // buffers; rows[t] says where token t's K/V and logits go (see ForwardRow).
    void forward(const KernelTable &k, LlamaState &work, const int32_t *tokens, const ForwardRow *rows, int T) const;

private:
    LlamaConfig cfg_;
    Tensor embedding_, output_norm_, output_;
    std::vector<LlamaLayer> layers_;
    std::vector<float> rope_cos_, rope_sin_;  // [context_length, head_dim/2]
    uint64_t n_params_ = 0;
};

}  // namespace fastllm
