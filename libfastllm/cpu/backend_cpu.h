// backend_cpu.h — the Backend (arch/backend.h) on this machine's cores: the ops of cpu/ops.h on
// the kernel table chosen at run time, split over its own thread pool. One per model and thread
// count (runtime/compute.h), shared by that model's sessions of that count.
#pragma once

#include "arch/backend.h"
#include "cpu/kernels.h"
#include "cpu/ops.h"
#include "cpu/thread_pool.h"

namespace fastllm {

class CpuBackend final : public Backend {
public:
    CpuBackend(const KernelTable &k, int n_threads) : k_(k), pool_(n_threads) {}

    std::string describe() const override;
    void carve(Arena &a, const PassShape &shape) override;
    void prepare_weights(const std::vector<const Tensor *> &) override {}  // read in place, mapped
    Memory &memory() override { return host_memory(); }
    void download(void *dst, const void *src, size_t bytes) override;
    void upload(void *dst, const void *src, size_t bytes) override;
    void read_kv_row(const KvCache &c, int layer, bool value, int pos, void *dst) override;
    void write_kv_row(KvCache &c, int layer, bool value, int pos, KvType from, const void *src) override;

    void embed(const Tensor &E, const int32_t *tokens, int T, float scale, float *x) override;
    void matmul(const Tensor &W, const Tensor &bias, const float *x, int T, float *y) override;
    void norm(NormKind kind, float eps, const Tensor &w, const Tensor &b, const float *x, int rows, int n,
              float *out) override;
    void add_norm(NormKind kind, float eps, const Tensor &post_w, float *d, float *x, const Tensor &w,
                  const Tensor &b, int T, int n, float *out) override;
    void qkv_to_cache(const QkvStep &s) override;
    void shift_cache(KvCache &cache, int layer, int from, int n, int delta, const KeyShift &ks) override;
    void attention(const float *q, const AttentionRun *runs, int n_runs, int layer, const AttentionShape &s,
                   float *out) override;
    void glu(Act kind, const float *gate_up, int T, int n, float *out) override;
    void act(Act kind, const float *x, size_t n, float *out) override;
    void softcap(float *x, size_t n, float cap) override;
    bool runs_adapters() const override { return true; }  // their matrices are host memory, as the weights
    void lora(const ForwardRow *rows, int T, int layer, int m, const float *x, int64_t in, float *y,
              int64_t out) override;

private:
    // fn(t) for t < T, split over the threads by rows.
    template <typename F>
    void per_row(int64_t T, F &&fn) {
        pool_.parallel_for(T, [&](int64_t first, int64_t last, int) {
            for (int64_t t = first; t < last; t++) fn(t);
        });
    }

    const KernelTable &k_;
    ThreadPool pool_;
    ops::MatmulScratch scratch_{};
    ops::AttentionScratch attn_;
    float *lora_ = nullptr;  // [threads, lora_stride_]: a row's a x, scaled
    size_t lora_stride_ = 0;
};

}  // namespace fastllm
