// decoder.h — the one decoder forward pass of every family: weights (views into the .flm file),
// RoPE tables, and forward() over a batch of token rows, configured by DecoderConfig's knobs and
// computed through a Backend.
#pragma once

#include <atomic>
#include <cstdint>
#include <vector>

#include "arch/backend.h"
#include "arch/decoder_config.h"
#include "format/flm_file.h"
#include "arch/arena.h"
#include "arch/kv_cache.h"
#include "arch/lora.h"

namespace fastllm {

struct DecoderLayer {
    Tensor attn_norm, attn_norm_bias;          // [H]
    Tensor qkv, qkv_bias;                      // [q_dim + 2 kv_dim, H], [q_dim + 2 kv_dim]
    Tensor q_norm, k_norm;                     // [head_dim] (qk_norm)
    Tensor attn_output, attn_output_bias;      // [H, q_dim], [H]
    Tensor post_attn_norm;                     // [H] (sandwich_norms)
    Tensor ffn_norm, ffn_norm_bias;            // [H]
    Tensor gate_up, gate_up_bias;              // [2 I, H]: gate rows, then up rows
    Tensor down, down_bias;                    // [H, I]
    Tensor post_ffn_norm;                      // [H] (sandwich_norms)
};

// A pass's working activations for up to max_batch rows: one set per model and thread count
// (runtime/compute.h), shared by its sessions, whose passes take turns. The activations are the
// backend's memory (the decoder computes addresses in them, never reads them); rope and runs are
// the host's description of the pass, which the backend reads.
struct Workspace {
    int max_batch = 0;
    float *x, *xb, *q, *qkv, *attn, *gate_up, *act;  // [max_batch, ...]
    float *logits;                                   // [kLogitRows, vocab]: output-head rows before download
    std::vector<const RopeTable *> rope;             // [max_batch]: the table each row rotates with
    std::vector<AttentionRun> runs;                  // [max_batch]: the pass's runs of one cache
    std::vector<float> boundary;                     // [2, max_batch, H] host: x and xb between stages
    std::vector<int32_t> ids;                        // [max_batch] host: positions or token types to embed
};

// Where layers run: consecutive layers [first_layer, end_layer) on one backend, with a workspace
// in that backend's memory. One stage runs a whole model; a model split between the CPU and a
// device (n_gpu_layers, as llama.cpp's) has two: the embeddings and the first layers on the CPU,
// the last layers and the output head on the device. Between stages the hidden state (x, and xb,
// its norm for the next layer) is copied once per pass.
struct Stage {
    Backend *be;
    Workspace *w;
    int first_layer, end_layer;
};

class Decoder {
public:
    // Validates every tensor's shape and dtype against the config.
    Decoder(const FlmFile &file, DecoderConfig config);

    const DecoderConfig &config() const { return cfg_; }
    // Whether the file has an output head over the vocabulary (an encoder has none: it embeds).
    bool has_lm_head() const { return !output_.empty(); }
    // A sequence classifier's labels (a cross-encoder reranker: 1), 0 without one. With one, a
    // row's logits are its labels' scores: the classifier over its hidden state (a [CLS] row).
    int n_labels() const { return classifier_.empty() ? 0 : (int)classifier_.rows(); }
    DType weight_dtype() const { return layers_[0].qkv.dtype; }
    uint64_t n_params() const { return n_params_; }
    // The longest matrix row (for the backend's scratch).
    int64_t max_row_length() const;
    // What a backend's scratch must hold for passes of up to max_batch rows.
    PassShape pass_shape(int max_batch) const;
    // Layer l's matrix m (LoraMatrix order: what a LoRA adapter's parts are checked against).
    const Tensor &matrix(int layer, int m) const;
    // Every weight the passes read (for Backend::prepare_weights): of layers [first, end), with the
    // embeddings (the first stage's) and the output head (the last stage's) where asked.
    std::vector<const Tensor *> weights() const { return weights(0, cfg_.num_layers, true, true); }
    std::vector<const Tensor *> weights(int first_layer, int end_layer, bool embedding, bool head) const;

    static constexpr int kLogitRows = 16;  // output-head rows computed per pass over its weights
    void carve(Arena &a, Workspace &w, int max_batch) const;

    // Runs tokens[0..T) (T <= w.max_batch; ids already validated) with w's buffers; rows[t] says
    // where token t's K/V, logits and hidden state go (see ForwardRow). An encoder (!causal) gets
    // each run of rows whole in one pass. With `cancel`, checks it after every
    // layer and returns false when it is set (the rows' cache entries are then incomplete).
    // The stages cover the layers in order, each its own workspace's buffers.
    bool forward(const std::vector<Stage> &stages, const int32_t *tokens, const ForwardRow *rows, int T,
                 const std::atomic<bool> *cancel = nullptr) const;
    // Context shift: moves positions [from, n_rows) of the cache down by delta (from - delta >= 0),
    // every layer (on the backend of its stage), turning each moved key's rotary angle back by
    // delta positions — the key it would have had there (RoPE rotations compose; attention factors
    // and q/k norms are unchanged).
    void shift_cache(const std::vector<Stage> &stages, KvCache &cache, int from, int n_rows, int delta) const;

private:
    DecoderConfig cfg_;
    Tensor embedding_, output_norm_, output_norm_bias_, output_;
    Tensor position_embd_, token_types_, embd_norm_, embd_norm_bias_;  // learned_positions
    Tensor pooler_, pooler_bias_, classifier_, classifier_bias_;      // a sequence classifier's head
    std::vector<DecoderLayer> layers_;
    std::vector<RopeTable> rope_;  // one per RopeConfig set
    uint64_t n_params_ = 0;
};

}  // namespace fastllm
