// backend.h — the seam between the decoder and the hardware: every computation of a forward pass
// goes through these calls, over a batch of T token rows at a time, and so do the reads and writes
// of KV rows that saving, loading and shifting a context make. The runtime names no concrete
// backend: backends/backends.h makes one. Two implement it: the CPU (cpu/backend_cpu.h) and the
// reference device (refdev/, a test backend that proves the seam) and Vulkan (vulkan/), which
// implement the same calls without touching the decoder, the session or the family files.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "arch/arena.h"
#include "base/error.h"
#include "arch/decoder_config.h"
#include "arch/kv_format.h"
#include "format/tensor.h"
#include "arch/kv_cache.h"

namespace fastllm {

// cos and sin of every position for one set of RoPE frequencies, built once at load.
struct RopeTable {
    int positions = 0, half = 0;  // half = rope dim / 2
    std::vector<float> cos, sin;  // [positions, half], attention factor included
    const float *cos_at(int pos) const { return cos.data() + (size_t)pos * half; }
    const float *sin_at(int pos) const { return sin.data() + (size_t)pos * half; }
};

// One layer's step from the fused q|k|v projection to the KV cache.
struct QkvStep {
    float *qkv;                    // [T, q_dim + 2 kv_dim]; its k and v parts are used as scratch
    float *q;                      // [T, q_dim] out: normed and rotated queries
    int T, n_heads, n_kv_heads, head_dim;
    const Tensor *q_norm, *k_norm;  // [head_dim] per-head norms, or nullptr
    NormKind norm_kind;
    float norm_eps;
    int rope_dim;
    bool rope_interleaved;
    const RopeTable *const *rope;  // [T]: the table row t rotates with
    const ForwardRow *rows;        // [T]: where row t's k and v go
    int layer;
};

// A context shift's rotation of the keys it moves: cos and sin of -delta positions' angles (rope
// dim / 2 values each), applied as RoPE applies its own.
struct KeyShift {
    int n_kv_heads, head_dim, rope_dim;
    bool rope_interleaved;
    const float *cos, *sin;
};

// The largest pass a backend's scratch must serve.
struct PassShape {
    int64_t max_k;      // the longest matrix row
    int max_batch;      // rows of a pass
    int head_dim;       // values of an attention head
    int64_t kv_dim;     // values of a KV cache row
};

class Backend {
public:
    virtual ~Backend() = default;
    // Says what runs the passes, for the log ("cpu avx512, 4 threads").
    virtual std::string describe() const = 0;
    // Takes the backend's scratch for passes of up to `shape` from a (see arena.h: the same call
    // plans, then carves). While a only plans, nothing of the backend changes, so that a failed
    // allocation leaves it as it was.
    virtual void carve(Arena &a, const PassShape &shape) = 0;

    // Makes the model's weights the backend's, once, before its first pass: the ops then receive
    // the file's Tensor views (their shape and dtype describe a weight, their data pointer names
    // it) and read the backend's own copy. The CPU reads the mapped file in place (no copy); a
    // device backend repacks and uploads each tensor. Throws FASTLLM_ERR_UNSUPPORTED for a dtype
    // or shape the backend cannot run, so that a model it cannot serve fails at load.
    virtual void prepare_weights(const std::vector<const Tensor *> &weights) = 0;
    // The backend's memory: the KV blocks of its sessions and the working memory of its passes
    // come from it (arch/memory.h).
    virtual Memory &memory() = 0;
    // Copies bytes of the backend's memory at src (workspace or KV) to host memory: after the work
    // queued before it is done.
    virtual void download(void *dst, const void *src, size_t bytes) = 0;
    // Copies bytes of host memory to the backend's memory at dst (workspace): after the work queued
    // before it is done. A model split between backends hands the hidden state over so.
    virtual void upload(void *dst, const void *src, size_t bytes) = 0;
    // A device backend records the ops and runs them later: flush() hands what is recorded to the
    // device without waiting (the decoder calls it after each layer, so the device works while
    // the host records on and a cancel stops a pass between submissions); finish() waits until
    // everything recorded is done (the end of a pass, of a state's load). The CPU has nothing to do.
    virtual void flush() {}
    virtual void finish() {}

    // A layer's key (value = false) or value row at pos, in the cache's type (row_bytes_k / _v), to
    // host memory; and from host memory in type `from`, converted to the cache's type. The row's
    // block must be held (and, to write, not shared). For saving and loading a context: rare.
    virtual void read_kv_row(const KvCache &c, int layer, bool value, int pos, void *dst) = 0;
    virtual void write_kv_row(KvCache &c, int layer, bool value, int pos, KvType from, const void *src) = 0;

    // x[t] = row tokens[t] of E (any dtype) * scale.
    virtual void embed(const Tensor &E, const int32_t *tokens, int T, float scale, float *x) = 0;
    // y[T, N] = x[T, K] . W[N, K]^T (+ bias[N] unless empty).
    virtual void matmul(const Tensor &W, const Tensor &bias, const float *x, int T, float *y) = 0;
    // out[r] = norm(x[r]) for rows of n values (b: LayerNorm's bias, may be empty).
    virtual void norm(NormKind kind, float eps, const Tensor &w, const Tensor &b, const float *x, int rows, int n,
                      float *out) = 0;
    // The residual add: x[t] += d[t] (d normed in place by post_w first unless post_w is empty), then
    // out[t] = norm(x[t]) by w, b unless w is empty.
    virtual void add_norm(NormKind kind, float eps, const Tensor &post_w, float *d, float *x, const Tensor &w,
                          const Tensor &b, int T, int n, float *out) = 0;
    // Splits each row's q|k|v, norms the q and k heads (if given), rotates them, and writes k and v
    // at the row's position in its own cache.
    virtual void qkv_to_cache(const QkvStep &s) = 0;
    // Moves a layer's positions [from, from + n) of the cache down by delta positions (to
    // from - delta; the blocks written are the caller's to own), rotating each moved key by ks;
    // positions the cache no longer holds (out of a sliding window) are skipped.
    virtual void shift_cache(KvCache &cache, int layer, int from, int n, int delta, const KeyShift &ks) = 0;
    // Attention of a pass's rows (q and out: [rows, n_heads * head_dim]), grouped in runs of
    // consecutive positions of one cache (a prompt, or one session's token in a step over many),
    // all in one job over the threads. Causal: a row at p sees the keys up to p; otherwise (an
    // encoder) every row of a run sees the keys up to the run's last position.
    virtual void attention(const float *q, const AttentionRun *runs, int n_runs, int layer, const AttentionShape &s,
                           float *out) = 0;
    // out[t] = act(gate[t]) * up[t] with gate_up[t] = [gate (n) | up (n)].
    virtual void glu(Act kind, const float *gate_up, int T, int n, float *out) = 0;
    // out[i] = act(x[i]) (a non-gated MLP, a classifier's pooler); out may be x.
    virtual void act(Act kind, const float *x, size_t n, float *out) = 0;
    // x[i] = cap * tanh(x[i] / cap).
    virtual void softcap(float *x, size_t n, float cap) = 0;

    // LoRA adapters (arch/lora.h): a backend runs them only if it reads their small matrices in
    // host memory (no prepare_weights for them); the others decline them when a session sets them
    // (Session::set_adapters), never in a pass. lora() adds, to each row t of the product y [T, out]
    // of layer l's matrix m with x [T, in], the parts of that row's adapters (rows[t].lora):
    // y[t, row0 + i] += scale * (b (a x[t]))[i], all of a pass's rows in one job.
    virtual bool runs_adapters() const { return false; }
    virtual void lora(const ForwardRow *rows, int T, int layer, int m, const float *x, int64_t in, float *y,
                      int64_t out) {
        (void)rows, (void)T, (void)layer, (void)m, (void)x, (void)in, (void)y, (void)out;
        fail(FASTLLM_ERR_UNSUPPORTED, "%s does not run LoRA adapters", describe().c_str());
    }
};

}  // namespace fastllm
