#include "refdev/backend_refdev.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "base/error.h"
#include "cpu/ops.h"

namespace fastllm {

namespace {

// The device's memory: host allocations the host never sees, each at an address in a range no
// host allocation occupies (from 2^46 on: above where Linux, macOS and Windows place user memory
// by default, below the 47-bit limit), 64-aligned, with a gap between allocations so that an
// address one past a buffer belongs to none.
class DeviceMemory final : public Memory {
public:
    char *alloc(size_t bytes) override {
        std::lock_guard<std::mutex> lock(mutex_);
        std::unique_ptr<char[]> real(new (std::nothrow) char[bytes ? bytes : 1]);
        if (!real) return nullptr;
        const uintptr_t at = next_;
        next_ += (bytes + 63) / 64 * 64 + 64;  // the next one 64-aligned, past a 64-byte gap
        allocs_.emplace(at, Alloc{std::move(real), bytes});
        return (char *)at;
    }
    void free(char *p) override {
        if (!p) return;
        std::lock_guard<std::mutex> lock(mutex_);
        allocs_.erase((uintptr_t)p);
    }
    void copy(char *dst, const char *src, size_t bytes) override { std::memcpy(at(dst, bytes), at(src, bytes), bytes); }

    // The real memory behind [addr, addr + bytes), which must lie within one allocation.
    char *at(const void *addr, size_t bytes) {
        std::lock_guard<std::mutex> lock(mutex_);
        auto it = allocs_.upper_bound((uintptr_t)addr);
        if (it != allocs_.begin()) {
            --it;
            const uintptr_t off = (uintptr_t)addr - it->first;
            if (off + bytes <= it->second.bytes) return it->second.real.get() + off;
        }
        fail(FASTLLM_ERR_INTERNAL, "refdev: %zu bytes at %p are not device memory (a host pointer reached the device)",
             bytes, addr);
    }
    float *f32(const void *addr, size_t n) { return (float *)at(addr, n * sizeof(float)); }

private:
    struct Alloc {
        std::unique_ptr<char[]> real;
        size_t bytes;
    };
    std::mutex mutex_;
    uintptr_t next_ = (uintptr_t)1 << 46;
    std::map<uintptr_t, Alloc> allocs_;
};

// One device per process, as a GPU is one per machine: sessions of any thread count share its
// memory, so a fork between them shares KV blocks as on the CPU.
DeviceMemory &device() {
    static DeviceMemory *d = new DeviceMemory;  // never destroyed: blocks may outlive static destructors
    return *d;
}

size_t weight_bytes(const Tensor &t) {
    if (dtype_is_quantized(t.dtype)) return tensor_bytes(t.dtype, (uint64_t)t.rows(), (uint64_t)t.cols());
    return (size_t)t.n_elements() * dtype_size(t.dtype);
}

class RefDeviceBackend final : public Backend {
public:
    explicit RefDeviceBackend(int n_threads) : n_threads_(n_threads) {}
    ~RefDeviceBackend() override {
        for (auto &w : weights_) device().free((char *)w.second);
    }

    std::string describe() const override { return "refdev (reference device), " + std::to_string(n_threads_) + " threads"; }
    void carve(Arena &, const PassShape &) override {}  // the reference ops keep their own scratch
    Memory &memory() override { return device(); }

    void prepare_weights(const std::vector<const Tensor *> &weights) override {
        for (const Tensor *t : weights) {
            if (weights_.count(t->data)) continue;  // tied embeddings: one tensor, two uses
            const size_t bytes = weight_bytes(*t);
            char *mine = device().alloc(bytes);
            if (!mine) fail(FASTLLM_ERR_OUT_OF_MEMORY, "refdev: cannot allocate %zu bytes for '%s'", bytes, t->name.c_str());
            std::memcpy(device().at(mine, bytes), t->data, bytes);  // an upload
            weights_.emplace(t->data, mine);
        }
    }
    void download(void *dst, const void *src, size_t bytes) override { std::memcpy(dst, device().at(src, bytes), bytes); }
    void upload(void *dst, const void *src, size_t bytes) override { std::memcpy(device().at(dst, bytes), src, bytes); }

    void read_kv_row(const KvCache &c, int layer, bool value, int pos, void *dst) override {
        const size_t n = value ? c.row_bytes_v() : c.row_bytes_k();
        std::memcpy(dst, device().at(value ? c.v_row(layer, pos) : c.k_row(layer, pos), n), n);
    }
    void write_kv_row(KvCache &c, int layer, bool value, int pos, KvType from, const void *src) override {
        std::vector<float> row((size_t)c.kv_dim());
        ref::kv_load(from, src, c.kv_dim(), row.data());
        store(c, layer, value, pos, row.data());
    }

    void embed(const Tensor &E, const int32_t *tokens, int T, float scale, float *x) override {
        const Tensor e = mine(E);
        const int64_t H = e.cols();
        float *X = device().f32(x, (size_t)T * H);
        for (int t = 0; t < T; t++)
            for (int64_t i = 0; i < H; i++) {
                float v = ref::weight(e, tokens[t], i);
                X[(size_t)t * H + i] = scale != 1.0f ? v * scale : v;
            }
    }
    void matmul(const Tensor &W, const Tensor &bias, const float *x, int T, float *y) override {
        const Tensor w = mine(W);
        ref::matmul(w, bias.empty() ? nullptr : mine(bias).f32(), device().f32(x, (size_t)T * w.cols()), T,
                    device().f32(y, (size_t)T * w.rows()));
    }
    void norm(NormKind kind, float eps, const Tensor &w, const Tensor &b, const float *x, int rows, int n,
              float *out) override {
        const float *X = device().f32(x, (size_t)rows * n);
        float *O = device().f32(out, (size_t)rows * n);
        for (int r = 0; r < rows; r++)
            ref::norm(kind, X + (size_t)r * n, mine(w).f32(), b.empty() ? nullptr : mine(b).f32(), n, eps, O + (size_t)r * n);
    }
    void add_norm(NormKind kind, float eps, const Tensor &post_w, float *d, float *x, const Tensor &w, const Tensor &b,
                  int T, int n, float *out) override {
        float *D = device().f32(d, (size_t)T * n), *X = device().f32(x, (size_t)T * n);
        float *O = w.empty() ? nullptr : device().f32(out, (size_t)T * n);
        for (int t = 0; t < T; t++) {
            float *dt = D + (size_t)t * n, *xt = X + (size_t)t * n;
            if (!post_w.empty()) ref::norm(kind, dt, mine(post_w).f32(), nullptr, n, eps, dt);
            for (int i = 0; i < n; i++) xt[i] += dt[i];
            if (O) ref::norm(kind, xt, mine(w).f32(), b.empty() ? nullptr : mine(b).f32(), n, eps, O + (size_t)t * n);
        }
    }
    void qkv_to_cache(const QkvStep &s) override {
        const int hd = s.head_dim, q_dim = s.n_heads * hd, kv_dim = s.n_kv_heads * hd, qkv_dim = q_dim + 2 * kv_dim;
        float *QKV = device().f32(s.qkv, (size_t)s.T * qkv_dim), *Q = device().f32(s.q, (size_t)s.T * q_dim);
        const float *qn = s.q_norm ? mine(*s.q_norm).f32() : nullptr, *kn = s.k_norm ? mine(*s.k_norm).f32() : nullptr;
        for (int t = 0; t < s.T; t++) {
            const ForwardRow &r = s.rows[t];
            float *row = QKV + (size_t)t * qkv_dim, *k = row + q_dim, *v = k + kv_dim, *q = Q + (size_t)t * q_dim;
            std::memcpy(q, row, sizeof(float) * q_dim);
            if (qn) {
                for (int h = 0; h < s.n_heads; h++) ref::norm(s.norm_kind, q + h * hd, qn, nullptr, hd, s.norm_eps, q + h * hd);
                for (int h = 0; h < s.n_kv_heads; h++) ref::norm(s.norm_kind, k + h * hd, kn, nullptr, hd, s.norm_eps, k + h * hd);
            }
            const RopeTable &tab = *s.rope[t];
            ref::rope(q, s.n_heads, hd, s.rope_dim, s.rope_interleaved, tab.cos_at(r.pos), tab.sin_at(r.pos));
            ref::rope(k, s.n_kv_heads, hd, s.rope_dim, s.rope_interleaved, tab.cos_at(r.pos), tab.sin_at(r.pos));
            store(*r.cache, s.layer, false, r.pos, k);
            store(*r.cache, s.layer, true, r.pos, v);
        }
    }
    void shift_cache(KvCache &c, int layer, int from, int n, int delta, const KeyShift &ks) override {
        std::vector<float> row((size_t)c.kv_dim());
        for (int p = from; p < from + n; p++) {
            if (!c.holds(layer, p)) continue;
            ref::kv_load(c.type_k(), device().at(c.k_row(layer, p), c.row_bytes_k()), c.kv_dim(), row.data());
            ref::rope(row.data(), ks.n_kv_heads, ks.head_dim, ks.rope_dim, ks.rope_interleaved, ks.cos, ks.sin);
            store(c, layer, false, p - delta, row.data());
            device().copy(c.v_row(layer, p - delta), c.v_row(layer, p), c.row_bytes_v());
        }
    }
    void attention(const float *q, const AttentionRun *runs, int n_runs, int layer, const AttentionShape &s,
                   float *out) override {
        const size_t q_dim = (size_t)s.n_heads * s.head_dim;
        for (int i = 0; i < n_runs; i++) {
            const AttentionRun &run = runs[i];
            const KvCache &c = *run.cache;
            const ref::KvRows kv{c.type_k(), c.type_v(), [&](int pos, bool value) -> const void * {
                                     return device().at(value ? c.v_row(layer, pos) : c.k_row(layer, pos),
                                                        value ? c.row_bytes_v() : c.row_bytes_k());
                                 }};
            ref::attention(device().f32(q + run.first_row * q_dim, run.T * q_dim), run.T, run.pos0, kv, s,
                           device().f32(out + run.first_row * q_dim, run.T * q_dim));
        }
    }
    void glu(Act kind, const float *gate_up, int T, int n, float *out) override {
        const float *G = device().f32(gate_up, (size_t)T * 2 * n);
        float *O = device().f32(out, (size_t)T * n);
        for (int t = 0; t < T; t++) ref::glu(kind, G + (size_t)t * 2 * n, n, O + (size_t)t * n);
    }
    void act(Act kind, const float *x, size_t n, float *out) override {
        ref::act(kind, device().f32(x, n), n, device().f32(out, n));
    }
    void softcap(float *x, size_t n, float cap) override {
        float *X = device().f32(x, n);
        for (size_t i = 0; i < n; i++) X[i] = (float)(cap * std::tanh((double)X[i] / cap));
    }

private:
    // The device's copy of a weight the ops were given the file's view of.
    Tensor mine(const Tensor &t) const {
        auto it = weights_.find(t.data);
        if (it == weights_.end()) fail(FASTLLM_ERR_INTERNAL, "refdev: weight '%s' was not prepared", t.name.c_str());
        Tensor d = t;
        d.data = device().at(it->second, weight_bytes(t));
        return d;
    }
    // A row of kv_dim floats into the cache's type at a layer's key or value row of pos.
    void store(KvCache &c, int layer, bool value, int pos, const float *row) {
        const size_t n = value ? c.row_bytes_v() : c.row_bytes_k();
        ref::kv_store(value ? c.type_v() : c.type_k(), row, c.kv_dim(), device().at(value ? c.v_row(layer, pos) : c.k_row(layer, pos), n));
    }

    int n_threads_;
    std::unordered_map<const void *, char *> weights_;  // the file's data -> the device's copy
};

}  // namespace

std::unique_ptr<Backend> make_refdev_backend(int n_threads) { return std::make_unique<RefDeviceBackend>(n_threads); }

}  // namespace fastllm
