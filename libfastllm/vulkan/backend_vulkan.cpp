#include "vulkan/backend_vulkan.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <unordered_map>

#include "base/error.h"
#include "base/log.h"
#include "vulkan/vk_device.h"

namespace fastllm {

namespace {

using vk::Shader;

// The shaders' Matrix (common.glsl).
struct MatrixArg {
    uint64_t base;
    uint32_t rows, cols, scales_bytes, tile_bytes;
};

constexpr int kSlots = 3;             // command buffers: one recording, up to two running
// flush() submits once this many dispatches are recorded (a layer is 9): a submission costs about
// a millisecond on lavapipe, tens of microseconds on a GPU.
constexpr int kFlushDispatches = 40;
constexpr uint64_t kRingStart = 64 << 10;  // per-pass parameters (row positions, block tables, tokens); grows
constexpr int kMaxHeadDim = 512;      // attention keeps 8 output values per invocation of 64 (two vec4)
constexpr int kMaxKvDim = 4096;       // kv_row.glsl's shared row
constexpr uint32_t kTimedDispatches = 256;  // FASTLLM_VULKAN_PROFILE: a command buffer's timestamp pairs

uint64_t addr(const void *p) { return (uint64_t)(uintptr_t)p; }

size_t weight_bytes(const Tensor &t) {
    if (dtype_is_quantized(t.dtype)) return tensor_bytes(t.dtype, (uint64_t)t.rows(), (uint64_t)t.cols());
    return (size_t)t.n_elements() * dtype_size(t.dtype);
}

class VulkanBackend final : public Backend {
public:
    explicit VulkanBackend(vk::Device &d) : dev_(d), api_(d.api()) {
        VkCommandPoolCreateInfo pci{VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO};
        pci.flags = VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT;
        pci.queueFamilyIndex = d.queue_family();
        dev_.check(api_.vkCreateCommandPool(d.device(), &pci, nullptr, &pool_), "creating a command pool");
        VkCommandBufferAllocateInfo ai{VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO};
        ai.commandPool = pool_;
        ai.level = VK_COMMAND_BUFFER_LEVEL_PRIMARY;
        ai.commandBufferCount = 1;
        VkFenceCreateInfo fci{VK_STRUCTURE_TYPE_FENCE_CREATE_INFO};
        for (Slot &s : slots_) {
            dev_.check(api_.vkAllocateCommandBuffers(d.device(), &ai, &s.cb), "allocating a command buffer");
            dev_.check(api_.vkCreateFence(d.device(), &fci, nullptr, &s.fence), "creating a fence");
        }
        const char *prof = std::getenv("FASTLLM_VULKAN_PROFILE");
        if (prof && std::strcmp(prof, "1") == 0) {
            if (d.timestamp_bits() == 0) {
                log(FASTLLM_LOG_WARN, "vulkan (%s): FASTLLM_VULKAN_PROFILE: the compute queue has no timestamps",
                    d.info().name.c_str());
            } else {
                VkQueryPoolCreateInfo qci{VK_STRUCTURE_TYPE_QUERY_POOL_CREATE_INFO};
                qci.queryType = VK_QUERY_TYPE_TIMESTAMP;
                qci.queryCount = 2 * kTimedDispatches;
                for (Slot &s : slots_) dev_.check(api_.vkCreateQueryPool(d.device(), &qci, nullptr, &s.queries), "creating a query pool");
                profiling_ = true;
            }
        }
        ring_ = dev_.make_host_buffer(kRingStart);
        if (!ring_.buffer) fail(FASTLLM_ERR_OUT_OF_MEMORY, "vulkan: cannot allocate host-visible memory");
    }
    ~VulkanBackend() override {
        try {
            finish_locked();
        } catch (const Error &) {  // a lost device: nothing more to wait for
        }
        if (profiling_) log_profile();
        for (auto &w : weights_) dev_.memory().free(w.second);
        for (auto &r : ropes_) dev_.memory().free(r.second);
        for (Slot &s : slots_) {
            api_.vkDestroyFence(dev_.device(), s.fence, nullptr);
            if (s.queries) api_.vkDestroyQueryPool(dev_.device(), s.queries, nullptr);
        }
        api_.vkDestroyCommandPool(dev_.device(), pool_, nullptr);
        dev_.destroy(ring_);
    }

    std::string describe() const override {
        const vk::DeviceInfo &i = dev_.info();
        return "vulkan " + i.name + " (" + i.vendor + " " + i.type + ")";
    }
    // The activations of a quantized matmul, quantized as the CPU's (attention streams its keys:
    // it needs no scratch).
    void carve(Arena &a, const PassShape &shape) override {
        float *x = a.take((size_t)shape.max_batch * shape.max_k);
        if (!a.planning()) acts_ = x;
    }
    Memory &memory() override { return dev_.memory(); }

    void prepare_weights(const std::vector<const Tensor *> &weights) override {
        std::lock_guard<std::mutex> lock(mutex_);
        for (const Tensor *t : weights) {
            if (weights_.count(t->data)) continue;  // tied embeddings: one tensor, two uses
            const size_t bytes = weight_bytes(*t);
            if (bytes >= (1ull << 32) || t->n_elements() >= (1ll << 31))
                fail(FASTLLM_ERR_UNSUPPORTED, "vulkan: weight '%s' (%zu bytes) is larger than the shaders address (4 GiB)",
                     t->name.c_str(), bytes);
            char *mine = dev_.memory().alloc(bytes);
            if (!mine)
                fail(FASTLLM_ERR_OUT_OF_MEMORY, "vulkan (%s): out of device memory for '%s' (%.1f MiB; %.1f MiB in use)",
                     dev_.info().name.c_str(), t->name.c_str(), bytes / 1048576.0, dev_.memory().bytes_in_use() / 1048576.0);
            weights_.emplace(t->data, mine);
            dev_.memory().upload(mine, t->data, bytes);
        }
    }

    void download(void *dst, const void *src, size_t bytes) override {
        std::lock_guard<std::mutex> lock(mutex_);
        finish_locked();
        dev_.memory().download(dst, src, bytes);
    }
    void upload(void *dst, const void *src, size_t bytes) override {
        std::lock_guard<std::mutex> lock(mutex_);
        finish_locked();
        dev_.memory().upload(dst, src, bytes);
    }
    void finish() override {
        std::lock_guard<std::mutex> lock(mutex_);
        finish_locked();
    }
    void flush() override {
        std::lock_guard<std::mutex> lock(mutex_);
        if (recorded_ >= kFlushDispatches) submit_recording();
    }

    void read_kv_row(const KvCache &c, int layer, bool value, int pos, void *dst) override {
        std::lock_guard<std::mutex> lock(mutex_);
        finish_locked();
        dev_.memory().download(dst, value ? c.v_row(layer, pos) : c.k_row(layer, pos), value ? c.row_bytes_v() : c.row_bytes_k());
    }
    void write_kv_row(KvCache &c, int layer, bool value, int pos, KvType from, const void *src) override {
        std::lock_guard<std::mutex> lock(mutex_);
        check_kv(c.kv_dim());
        const size_t n = kv_row_bytes(from, c.kv_dim());
        Param p = param(n);
        std::memcpy(p.host, src, n);
        Param dst = param(4 * sizeof(uint64_t));
        const uint64_t where[2] = {addr(value ? c.v_row(layer, pos) : c.k_row(layer, pos)), 0};
        std::memcpy(dst.host, where, sizeof where);
        struct {
            uint64_t src, dst;
            uint32_t src_stride, k_off, v_off, src_type, n, type_k, type_v;
        } pc{p.dev, dst.dev, 0, 0, 0, (uint32_t)from, (uint32_t)c.kv_dim(), (uint32_t)(value ? c.type_v() : c.type_k()), 0};
        dispatch(Shader::KvStore, 0, &pc, sizeof pc, 1, 1, 1);
    }

    void embed(const Tensor &E, const int32_t *tokens, int T, float scale, float *x) override {
        std::lock_guard<std::mutex> lock(mutex_);
        Param tok = param(sizeof(int32_t) * T);
        std::memcpy(tok.host, tokens, sizeof(int32_t) * T);
        struct {
            MatrixArg e;
            uint64_t tokens, x;
            float scale;
        } pc{matrix(E), tok.dev, addr(x), scale};
        dispatch(Shader::Embed, (uint32_t)E.dtype, &pc, sizeof pc, groups(E.cols()), (uint32_t)T, 1);
    }
    void matmul(const Tensor &W, const Tensor &bias, const float *x, int T, float *y) override {
        std::lock_guard<std::mutex> lock(mutex_);
        struct {
            MatrixArg w;
            uint64_t bias, x, y;
            uint32_t T;
        } pc{matrix(W), bias.empty() ? 0 : weight(bias), addr(x), addr(y), (uint32_t)T};
        if (dtype_is_quantized(W.dtype)) {
            struct {
                uint64_t x, out;
                uint32_t blocks;
            } q{addr(x), addr(acts_), (uint32_t)(T * W.cols() / 32)};
            const uint32_t g = groups(q.blocks), gx = std::min<uint32_t>(g, 65535);
            dispatch(Shader::Quantize, 0, &q, sizeof q, gx, (g + gx - 1) / gx, 1);
            pc.x = addr(acts_);
        }
        // A workgroup: 8 outputs (matmul, matmul_rows) or a tile of 16 (matmul_quant), for 8 rows.
        const bool quant = dtype_is_quantized(W.dtype);
        const uint32_t outs = quant ? 16 : 8, blocks = (uint32_t)(W.rows() + outs - 1) / outs;
        const uint32_t gx = std::min<uint32_t>(blocks, 65535);
        dispatch(quant ? Shader::MatmulQuant : T > 1 ? Shader::MatmulRows : Shader::Matmul, (uint32_t)W.dtype, &pc, sizeof pc,
                 gx, (blocks + gx - 1) / gx, (uint32_t)(T + 7) / 8);
    }
    void norm(NormKind kind, float eps, const Tensor &w, const Tensor &b, const float *x, int rows, int n,
              float *out) override {
        std::lock_guard<std::mutex> lock(mutex_);
        NormArgs pc{addr(x), 0, 0, weight(w), b.empty() ? 0 : weight(b), addr(out), (uint32_t)n, kind == NormKind::Layer, eps};
        dispatch(Shader::Norm, 0, &pc, sizeof pc, (uint32_t)rows, 1, 1);
    }
    void add_norm(NormKind kind, float eps, const Tensor &post_w, float *d, float *x, const Tensor &w, const Tensor &b,
                  int T, int n, float *out) override {
        std::lock_guard<std::mutex> lock(mutex_);
        NormArgs pc{addr(x), addr(d), post_w.empty() ? 0 : weight(post_w), w.empty() ? 0 : weight(w),
                    b.empty() ? 0 : weight(b), addr(out), (uint32_t)n, kind == NormKind::Layer, eps};
        dispatch(Shader::Norm, 0, &pc, sizeof pc, (uint32_t)T, 1, 1);
    }
    void qkv_to_cache(const QkvStep &s) override {
        std::lock_guard<std::mutex> lock(mutex_);
        if (s.head_dim > kMaxHeadDim) fail(FASTLLM_ERR_UNSUPPORTED, "vulkan: head_dim %d (at most %d)", s.head_dim, kMaxHeadDim);
        const KvCache &c0 = *s.rows[0].cache;
        check_kv(c0.kv_dim());
        // Per row: its RoPE cos and sin, and where its key and value go.
        Param rope = param(sizeof(uint64_t) * 2 * s.T), dst = param(sizeof(uint64_t) * 2 * s.T);
        for (int t = 0; t < s.T; t++) {
            const ForwardRow &r = s.rows[t];
            const uint64_t table = s.rope_dim ? rope_table(s.rope[t]) : 0, off = (uint64_t)r.pos * s.rope[t]->half * sizeof(float);
            const uint64_t cs[2] = {table + off, table + (uint64_t)s.rope[t]->positions * s.rope[t]->half * sizeof(float) + off};
            const uint64_t kv[2] = {addr(r.cache->k_row(s.layer, r.pos)), addr(r.cache->v_row(s.layer, r.pos))};
            std::memcpy((char *)rope.host + t * sizeof cs, cs, sizeof cs);
            std::memcpy((char *)dst.host + t * sizeof kv, kv, sizeof kv);
        }
        const int q_dim = s.n_heads * s.head_dim, kv_dim = s.n_kv_heads * s.head_dim;
        struct {
            uint64_t qkv, q, q_norm, k_norm, rope;
            uint32_t n_heads, n_kv, head_dim, layer_norm, rope_dim, interleaved;
            float eps;
        } pc{addr(s.qkv), addr(s.q), s.q_norm ? weight(*s.q_norm) : 0, s.k_norm ? weight(*s.k_norm) : 0, rope.dev,
             (uint32_t)s.n_heads, (uint32_t)s.n_kv_heads, (uint32_t)s.head_dim, s.norm_kind == NormKind::Layer,
             (uint32_t)s.rope_dim, s.rope_interleaved, s.norm_eps};
        dispatch(Shader::QkvRope, 0, &pc, sizeof pc, (uint32_t)s.T, (uint32_t)(s.n_heads + s.n_kv_heads), 1);
        // Sessions choose their KV types: rows of the same types are stored together.
        for (int t = 0; t < s.T;) {
            const KvCache &c = *s.rows[t].cache;
            int g = 1;
            while (t + g < s.T && s.rows[t + g].cache->type_k() == c.type_k() && s.rows[t + g].cache->type_v() == c.type_v()) g++;
            struct {
                uint64_t src, dst;
                uint32_t src_stride, k_off, v_off, src_type, n, type_k, type_v;
            } st{addr(s.qkv) + (uint64_t)t * (q_dim + 2 * kv_dim) * sizeof(float), dst.dev + (uint64_t)t * 2 * sizeof(uint64_t),
                 (uint32_t)((q_dim + 2 * kv_dim) * sizeof(float)), (uint32_t)(q_dim * sizeof(float)),
                 (uint32_t)((q_dim + kv_dim) * sizeof(float)), (uint32_t)KvType::F32, (uint32_t)kv_dim,
                 (uint32_t)c.type_k(), (uint32_t)c.type_v()};
            dispatch(Shader::KvStore, 0, &st, sizeof st, (uint32_t)g, 2, 1);
            t += g;
        }
    }
    void shift_cache(KvCache &c, int layer, int from, int n, int delta, const KeyShift &ks) override {
        std::lock_guard<std::mutex> lock(mutex_);
        check_kv(c.kv_dim());
        const int half = ks.rope_dim / 2;
        Param cs = param(sizeof(float) * 2 * half);
        std::memcpy(cs.host, ks.cos, sizeof(float) * half);
        std::memcpy((char *)cs.host + sizeof(float) * half, ks.sin, sizeof(float) * half);
        // Chunks of delta positions, one dispatch each: chunk i writes where chunk i - 1 read.
        for (int p0 = from; p0 < from + n; p0 += delta) {
            std::vector<uint64_t> moves;
            for (int p = p0; p < std::min(from + n, p0 + delta); p++)
                if (c.holds(layer, p))
                    for (uint64_t a : {addr(c.k_row(layer, p)), addr(c.k_row(layer, p - delta)), addr(c.v_row(layer, p)),
                                       addr(c.v_row(layer, p - delta))})
                        moves.push_back(a);
            if (moves.empty()) continue;
            Param m = param(moves.size() * sizeof(uint64_t));
            std::memcpy(m.host, moves.data(), moves.size() * sizeof(uint64_t));
            struct {
                uint64_t moves, cs, sn;
                uint32_t n_kv, head_dim, rope_dim, interleaved, type_k, n, v_words;
            } pc{m.dev, cs.dev, cs.dev + sizeof(float) * half, (uint32_t)ks.n_kv_heads, (uint32_t)ks.head_dim,
                 (uint32_t)ks.rope_dim, ks.rope_interleaved, (uint32_t)c.type_k(), (uint32_t)c.kv_dim(),
                 (uint32_t)(c.row_bytes_v() / 4)};
            dispatch(Shader::KvShift, 0, &pc, sizeof pc, (uint32_t)(moves.size() / 4), 1, 1);
        }
        finish_locked();
    }
    void attention(const float *q, const AttentionRun *runs, int n_runs, int layer, const AttentionShape &s,
                   float *out) override {
        std::lock_guard<std::mutex> lock(mutex_);
        if (s.head_dim > kMaxHeadDim) fail(FASTLLM_ERR_UNSUPPORTED, "vulkan: head_dim %d (at most %d)", s.head_dim, kMaxHeadDim);
        // Per row [position, its run's first block]; per run, every block of its positions (the
        // ones out of a window it no longer holds: 0, never read).
        int T = 0;
        size_t n_blocks = 0;
        for (int i = 0; i < n_runs; i++) {
            T = std::max(T, runs[i].first_row + runs[i].T);
            n_blocks += (size_t)(runs[i].pos0 + runs[i].T + KvCache::kBlock - 1) / KvCache::kBlock;
        }
        Param rows = param(sizeof(uint32_t) * 4 * T), blocks = param(sizeof(uint64_t) * 2 * n_blocks);
        uint32_t *R = (uint32_t *)rows.host;
        uint64_t *B = (uint64_t *)blocks.host;
        size_t b = 0;
        for (int i = 0; i < n_runs; i++) {
            const AttentionRun &run = runs[i];
            const KvCache &c = *run.cache;
            for (int t = 0; t < run.T; t++) {
                uint32_t *row = R + 4 * (run.first_row + t);
                // the last key the row sees: its own, or (an encoder) the run's last
                row[0] = (uint32_t)(run.pos0 + (s.causal ? t : run.T - 1)), row[1] = (uint32_t)b, row[2] = (uint32_t)c.type_k() | (uint32_t)c.type_v() << 8, row[3] = 0;
            }
            for (int p = 0; p < run.pos0 + run.T; p += KvCache::kBlock, b++) {
                const bool held = c.holds(layer, p);
                B[2 * b] = held ? addr(c.k_row(layer, p)) : 0;
                B[2 * b + 1] = held ? addr(c.v_row(layer, p)) : 0;
            }
        }
        struct {
            uint64_t q, out, rows, blocks;
            uint32_t n_heads, n_kv, head_dim, window;
            float scale, softcap;
        } pc{addr(q), addr(out), rows.dev, blocks.dev, (uint32_t)s.n_heads, (uint32_t)s.n_kv_heads, (uint32_t)s.head_dim,
             (uint32_t)s.window, s.scale, s.softcap};
        dispatch(Shader::Attention, 0, &pc, sizeof pc, (uint32_t)T, (uint32_t)s.n_heads, 1);
    }
    void glu(Act kind, const float *gate_up, int T, int n, float *out) override {
        std::lock_guard<std::mutex> lock(mutex_);
        struct {
            uint64_t gate_up, out;
            uint32_t n, act, gated;
        } pc{addr(gate_up), addr(out), (uint32_t)n, (uint32_t)kind, 1};
        dispatch(Shader::Glu, 0, &pc, sizeof pc, groups(n), (uint32_t)T, 1);
    }
    void act(Act kind, const float *x, size_t n, float *out) override {
        std::lock_guard<std::mutex> lock(mutex_);
        struct {
            uint64_t x, out;
            uint32_t n, act, gated;
        } pc{addr(x), addr(out), (uint32_t)n, (uint32_t)kind, 0};
        const uint32_t g = groups((int64_t)n), gx = std::min<uint32_t>(g, 65535);
        dispatch(Shader::Glu, 0, &pc, sizeof pc, gx, (g + gx - 1) / gx, 1);
    }
    void softcap(float *x, size_t n, float cap) override {
        std::lock_guard<std::mutex> lock(mutex_);
        struct {
            uint64_t x;
            uint32_t n;
            float cap;
        } pc{addr(x), (uint32_t)n, cap};
        const uint32_t g = groups((int64_t)n), gx = std::min<uint32_t>(g, 65535);
        dispatch(Shader::Softcap, 0, &pc, sizeof pc, gx, (g + gx - 1) / gx, 1);
    }

private:
    struct NormArgs {
        uint64_t x, d, post_w, w, b, out;
        uint32_t n, layer_norm;
        float eps;
    };
    struct Slot {
        VkCommandBuffer cb = VK_NULL_HANDLE;
        VkFence fence = VK_NULL_HANDLE;
        bool running = false;
        VkQueryPool queries = VK_NULL_HANDLE;  // profiling: a timestamp before and after each dispatch
        std::vector<uint32_t> timed;           // their dispatches' profile keys, in order
    };
    struct Timing {
        uint64_t dispatches = 0;
        double ns = 0;
    };
    static uint32_t profile_key(Shader s, uint32_t dtype) { return (uint32_t)s << 16 | dtype; }
    struct Param {
        void *host;
        uint64_t dev;
    };

    static uint32_t groups(int64_t n) { return (uint32_t)((n + 63) / 64); }

    void check_kv(int kv_dim) const {
        if (kv_dim > kMaxKvDim || kv_dim % 2)
            fail(FASTLLM_ERR_UNSUPPORTED, "vulkan: a KV row of %d values (even, at most %d)", kv_dim, kMaxKvDim);
    }

    // The device's copy of a weight, as the shaders' Matrix.
    uint64_t weight(const Tensor &t) const {
        auto it = weights_.find(t.data);
        if (it == weights_.end()) fail(FASTLLM_ERR_INTERNAL, "vulkan: weight '%s' was not prepared", t.name.c_str());
        return addr(it->second);
    }
    MatrixArg matrix(const Tensor &t) const {
        const uint64_t rows = (uint64_t)t.rows(), cols = (uint64_t)t.cols();
        const bool q = dtype_is_quantized(t.dtype);
        return MatrixArg{weight(t), (uint32_t)rows, (uint32_t)cols, q ? (uint32_t)quant_scales_bytes(t.dtype, rows, cols) : 0,
                         q ? (uint32_t)quant_tile_bytes(t.dtype, cols) : 0};
    }
    // A RoPE table's cos (positions x half floats) then sin, on the device from its first use.
    uint64_t rope_table(const RopeTable *t) {
        auto it = ropes_.find(t);
        if (it != ropes_.end()) return addr(it->second);
        const size_t n = t->cos.size() * sizeof(float);
        char *mine = dev_.memory().alloc(2 * n);
        if (!mine) fail(FASTLLM_ERR_OUT_OF_MEMORY, "vulkan (%s): out of device memory for a RoPE table", dev_.info().name.c_str());
        ropes_.emplace(t, mine);
        dev_.memory().upload(mine, t->cos.data(), n);
        dev_.memory().upload(mine + n, t->sin.data(), n);
        return addr(mine);
    }

    // Room for `bytes` of parameters until the recorded work is done. A full ring is not reused
    // before then (an op may still hold what it was given): a ring twice the size takes over, and
    // finish() keeps only the largest.
    Param param(size_t bytes) {
        bytes = (bytes + 15) / 16 * 16;
        if (ring_used_ + bytes > ring_.bytes) {
            retired_.push_back(ring_);
            ring_ = dev_.make_host_buffer(std::max<uint64_t>(bytes, 2 * ring_.bytes));
            if (!ring_.buffer) {
                ring_ = retired_.back();
                retired_.pop_back();
                fail(FASTLLM_ERR_OUT_OF_MEMORY, "vulkan: cannot allocate %.1f MiB of host-visible memory",
                     2.0 * ring_.bytes / 1048576.0);
            }
            ring_used_ = 0;
        }
        Param p{ring_.mapped + ring_used_, ring_.address + ring_used_};
        ring_used_ += bytes;
        return p;
    }

    void dispatch(Shader s, uint32_t dtype, const void *push, size_t bytes, uint32_t gx, uint32_t gy, uint32_t gz) {
        if (gx == 0 || gy == 0 || gz == 0) return;
        const VkPipeline p = dev_.pipeline(s, dtype);
        if (recording_ && profiling_ && slots_[cur_].timed.size() == kTimedDispatches) submit_recording();
        if (!recording_) begin();
        Slot &slot = slots_[cur_];
        const VkCommandBuffer cb = slot.cb;
        vk::full_barrier(api_, cb);
        api_.vkCmdBindPipeline(cb, VK_PIPELINE_BIND_POINT_COMPUTE, p);
        api_.vkCmdPushConstants(cb, dev_.layout(), VK_SHADER_STAGE_COMPUTE_BIT, 0, (uint32_t)bytes, push);
        // Profiling: the ticks when every command before has finished, and when this one has (the
        // barrier above orders them), so a dispatch's time is its own.
        const uint32_t q = 2 * (uint32_t)slot.timed.size();
        if (profiling_) api_.vkCmdWriteTimestamp(cb, VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, slot.queries, q);
        api_.vkCmdDispatch(cb, gx, gy, gz);
        if (profiling_) {
            api_.vkCmdWriteTimestamp(cb, VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, slot.queries, q + 1);
            slot.timed.push_back(profile_key(s, dtype));
        }
        recorded_++;
    }
    void begin() {
        Slot &s = slots_[cur_];
        if (s.running) wait(s);
        dev_.check(api_.vkResetCommandBuffer(s.cb, 0), "resetting a command buffer");
        VkCommandBufferBeginInfo bi{VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO};
        bi.flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT;
        dev_.check(api_.vkBeginCommandBuffer(s.cb, &bi), "recording commands");
        if (profiling_) api_.vkCmdResetQueryPool(s.cb, s.queries, 0, 2 * kTimedDispatches);
        recording_ = true;
    }
    void wait(Slot &s) {
        s.running = false;
        dev_.check(api_.vkWaitForFences(dev_.device(), 1, &s.fence, VK_TRUE, UINT64_MAX), "running a pass");
        if (profiling_ && !s.timed.empty()) collect(s);
    }
    // A finished command buffer's timestamps into the totals.
    void collect(Slot &s) {
        const uint32_t n = 2 * (uint32_t)s.timed.size();
        std::vector<uint64_t> ticks(n);
        dev_.check(api_.vkGetQueryPoolResults(dev_.device(), s.queries, 0, n, n * sizeof(uint64_t), ticks.data(),
                                              sizeof(uint64_t), VK_QUERY_RESULT_64_BIT | VK_QUERY_RESULT_WAIT_BIT),
                   "reading timestamps");
        const uint64_t mask = dev_.timestamp_bits() >= 64 ? ~0ull : (1ull << dev_.timestamp_bits()) - 1;
        for (size_t i = 0; i < s.timed.size(); i++) {
            Timing &t = timings_[s.timed[i]];
            t.dispatches++;
            t.ns += (double)((ticks[2 * i + 1] - ticks[2 * i]) & mask) * dev_.timestamp_ns();
        }
        s.timed.clear();
    }
    // FASTLLM_VULKAN_PROFILE=1: the device time of every shader (matmul and embed per weight dtype),
    // logged at info level when the backend goes (its model is freed).
    void log_profile() const {
        double total = 0;
        uint64_t dispatches = 0;
        std::vector<std::pair<double, uint32_t>> rows;
        for (const auto &[key, t] : timings_) total += t.ns, dispatches += t.dispatches, rows.push_back({t.ns, key});
        std::sort(rows.rbegin(), rows.rend());
        log(FASTLLM_LOG_INFO, "vulkan profile (%s): %llu dispatches, %.3f ms of device time", dev_.info().name.c_str(),
            (unsigned long long)dispatches, total / 1e6);
        for (const auto &[ns, key] : rows) {
            const Shader s = (Shader)(key >> 16);
            const Timing &t = timings_.at(key);
            log(FASTLLM_LOG_INFO, "vulkan profile: %-12s %-6s %8llu dispatches %11.3f ms %10.1f us each %5.1f%%",
                vk::shader_name(s), vk::shader_by_dtype(s) ? dtype_name((DType)(key & 0xffff)) : "", (unsigned long long)t.dispatches,
                ns / 1e6, ns / 1e3 / (double)t.dispatches, total > 0 ? 100 * ns / total : 0.0);
        }
    }
    // Hands what is recorded to the device without waiting; the slot after it is next, waited for
    // if still running, so at most two submissions run behind the host (a cancel stops a pass
    // within them).
    void submit_recording() {
        if (!recording_) return;
        Slot &s = slots_[cur_];
        vk::full_barrier(api_, s.cb);
        dev_.check(api_.vkEndCommandBuffer(s.cb), "recording commands");
        dev_.check(api_.vkResetFences(dev_.device(), 1, &s.fence), "resetting a fence");
        dev_.submit(s.cb, s.fence);
        s.running = true;
        recording_ = false;
        recorded_ = 0;
        cur_ = (cur_ + 1) % kSlots;
    }
    void finish_locked() {
        submit_recording();
        for (Slot &s : slots_)
            if (s.running) wait(s);
        for (vk::Buffer &b : retired_) dev_.destroy(b);
        retired_.clear();
        ring_used_ = 0;
    }

    vk::Device &dev_;
    const vk::Api &api_;
    std::mutex mutex_;  // sessions call shift_cache and the KV row copies outside the pass lock
    VkCommandPool pool_ = VK_NULL_HANDLE;
    Slot slots_[kSlots];
    int cur_ = 0;
    bool recording_ = false;
    int recorded_ = 0;  // dispatches in the command buffer being recorded
    vk::Buffer ring_;
    std::vector<vk::Buffer> retired_;  // full rings the recorded work still reads
    uint64_t ring_used_ = 0;
    std::unordered_map<const void *, char *> weights_;  // the file's data -> the device's copy
    std::unordered_map<const RopeTable *, char *> ropes_;
    float *acts_ = nullptr;  // [max_batch, max_k] in the workspace
    bool profiling_ = false;
    std::map<uint32_t, Timing> timings_;  // by profile_key
};

}  // namespace

std::unique_ptr<Backend> make_vulkan_backend(int index) { return std::make_unique<VulkanBackend>(vk::Device::get(index)); }

void adopt_vulkan_device(const VulkanHandles &h) {
    vk::Device::adopt((VkInstance)h.instance, (VkPhysicalDevice)h.physical_device, (VkDevice)h.device, h.queue_family,
                      h.queue_index, (PFN_vkGetInstanceProcAddr)h.get_instance_proc_addr);
}

std::vector<VulkanDeviceInfo> vulkan_devices(std::string *why) {
    std::vector<VulkanDeviceInfo> out;
    for (const vk::DeviceInfo &d : vk::Device::list(why))
        out.push_back(VulkanDeviceInfo{d.index, d.name, d.type, d.vendor, d.api_version, d.memory_bytes, d.usable, d.missing});
    return out;
}

}  // namespace fastllm
