#include "cpu/ops.h"

#include "cpu/thread_pool.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#ifdef FASTLLM_USE_BLAS
#include <cblas.h>
#endif

namespace fastllm {
namespace ops {

namespace {

constexpr int kRowBlock = 16;      // weight rows a thread takes at a time
constexpr int kBlasRowBlock = 256;  // rows converted to f32 per sgemm call (f16/bf16 weights)
constexpr int kBlasMinTokens = 8;  // below this, our own tiles beat the sgemm call overhead

#ifdef FASTLLM_USE_BLAS
// OpenBLAS would otherwise start its own thread pool, whose threads spin while waiting and starve
// ours on a small machine; we parallelise around it instead.
void blas_single_threaded() {
    static const bool once = (openblas_set_num_threads(1), true);
    (void)once;
}
#endif

}  // namespace

size_t matmul_scratch_floats(int64_t K, int n_threads, int max_T) {
    const size_t blocks = (size_t)max_T * ((K + kActBlock - 1) / kActBlock);
    return (size_t)n_threads * std::max(kRowBlock, kBlasRowBlock) * (size_t)K  // f32 blocks
           + (size_t)max_T * K / 4 + 16                                        // int8 activations
           + 2 * blocks + 32;                                                  // their scales and sums
}

MatmulScratch make_matmul_scratch(float *memory, int64_t K, int n_threads, int max_T) {
    MatmulScratch s;
    if (!memory) return s;  // the arena's planning pass: no offsets from a null pointer
    s.f32 = memory;
    float *p = memory + (size_t)n_threads * std::max(kRowBlock, kBlasRowBlock) * (size_t)K;
    s.acts.q = (int8_t *)p;
    p += (size_t)max_T * K / 4 + 16;
    const size_t blocks = (size_t)max_T * ((K + kActBlock - 1) / kActBlock);
    s.acts.d = p;
    s.acts.ds = p + blocks + 16;
    return s;
}

void dequantize_row(const KernelTable &k, const Tensor &W, int64_t r, float *out) {
    if (!dtype_is_quantized(W.dtype)) return k.to_f32[(int)W.dtype](W.row(r), out, (int)W.cols());
    for (int64_t c = 0; c < W.cols(); c++) out[c] = ref::weight(W, r, c);  // one row per token: plain loop
}

namespace {

// Quantized weights: activations are quantized to int8 once, then each thread takes tiles of 16
// rows and applies them to every token while they are in cache.
void matmul_quant(const KernelTable &k, const Tensor &W, const float *x, int T, float *y, const MatmulScratch &sc,
                  ThreadPool &pool) {
    static_assert(kRowBlock == kTileRows, "a row block is one tile of the quantized layout");
    const int64_t N = W.rows(), K = W.cols();
    pool.parallel_for(T, [&](int64_t first, int64_t last, int) {
        for (int64_t t = first; t < last; t++) k.quantize_acts(x + t * K, (int)K, token_acts(sc.acts, (int)K, (int)t));
    });
    const auto dot = k.dot_rows_quant[(int)W.dtype];
    const int64_t n_blocks = (N + kRowBlock - 1) / kRowBlock;
    pool.parallel_for(n_blocks, [&](int64_t first, int64_t last, int) {
        for (int64_t b = first; b < last; b++) {
            const int64_t r0 = b * kRowBlock;
            dot(quant_tile(W, r0), (int)std::min<int64_t>(kRowBlock, N - r0), (int)K, sc.acts, T, y + r0, (size_t)N);
        }
    });
}

}  // namespace

void matmul(const KernelTable &k, const Tensor &W, const float *bias, const float *x, int T, float *y,
            const MatmulScratch &sc, ThreadPool &pool) {
    const int64_t N = W.rows(), K = W.cols();
    const int dt = (int)W.dtype;
    const int64_t n_blocks = (N + kRowBlock - 1) / kRowBlock;
    float *scratch = sc.f32;
    if (dtype_is_quantized(W.dtype)) {
        matmul_quant(k, W, x, T, y, sc, pool);
    } else if (T == 1) {
        // Decoding: every weight is read once; split the rows across threads.
        pool.parallel_for(n_blocks, [&](int64_t first, int64_t last, int) {
            const int64_t r0 = first * kRowBlock, r1 = std::min(N, last * kRowBlock);
            k.dot_rows[dt](W.row(r0), W.row_bytes(), (int)(r1 - r0), x, (int)K, y + r0);
        });
    } else if (T <= KernelTable::kMultiTokens && k.dot_rows_multi[dt]) {
        // A few tokens (speculative drafts): as decoding, each weight read once for all of them.
        pool.parallel_for(n_blocks, [&](int64_t first, int64_t last, int) {
            const int64_t r0 = first * kRowBlock, r1 = std::min(N, last * kRowBlock);
            k.dot_rows_multi[dt](W.row(r0), W.row_bytes(), (int)(r1 - r0), x, (int)K, T, y + r0, (size_t)N);
        });
    }
#ifdef FASTLLM_USE_BLAS
    else if (T >= kBlasMinTokens) {
        // Each of our threads runs a single-threaded sgemm on its own slice of rows: OpenBLAS's own
        // threads would compete with ours for the cores (see blas_single_threaded).
        blas_single_threaded();
        pool.parallel_for(n_blocks, [&](int64_t first, int64_t last, int tid) {
            const int64_t end = std::min(N, last * kRowBlock);
            const int64_t step = W.dtype == DType::F32 ? end : kBlasRowBlock;
            float *buf = scratch + (size_t)tid * kBlasRowBlock * K;
            for (int64_t r0 = first * kRowBlock; r0 < end; r0 += step) {
                const int rows = (int)std::min(step, end - r0);
                const float *wb = (const float *)W.row(r0);
                if (W.dtype != DType::F32) {
                    for (int r = 0; r < rows; r++) k.to_f32[dt](W.row(r0 + r), buf + (size_t)r * K, (int)K);
                    wb = buf;
                }
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, rows, (int)K, 1.0f, x, (int)K, wb, (int)K,
                            0.0f, y + r0, (int)N);
            }
        });
    }
#endif
    else {
        // Prompt batch: a thread converts a block of rows to f32 once and applies it to every token.
        pool.parallel_for(n_blocks, [&](int64_t first, int64_t last, int tid) {
            for (int64_t b = first; b < last; b++) {
                const int64_t r0 = b * kRowBlock;
                const int rows = (int)std::min<int64_t>(kRowBlock, N - r0);
                const float *wb = (const float *)W.row(r0);
                if (W.dtype != DType::F32) {
                    float *buf = scratch + (size_t)tid * kRowBlock * K;
                    for (int r = 0; r < rows; r++) k.to_f32[dt](W.row(r0 + r), buf + (size_t)r * K, (int)K);
                    wb = buf;
                }
                for (int t = 0; t < T; t++)
                    k.dot_rows[(int)DType::F32](wb, (size_t)K * 4, rows, x + (size_t)t * K, (int)K,
                                                y + (size_t)t * N + r0);
            }
        });
    }
    if (bias)
        for (int t = 0; t < T; t++)
            for (int64_t r = 0; r < N; r++) y[(size_t)t * N + r] += bias[r];
}

void rmsnorm(const float *x, const float *w, int n, float eps, float *out) {
    double ss = 0;
    for (int i = 0; i < n; i++) ss += x[i] * x[i];
    float inv = (float)(1.0 / std::sqrt(ss / n + eps));
    for (int i = 0; i < n; i++) out[i] = x[i] * inv * w[i];
}

void norm(NormKind kind, const float *x, const float *w, const float *b, int n, float eps, float *out) {
    if (kind == NormKind::Rms) return rmsnorm(x, w, n, eps, out);
    double sum = 0, ss = 0;
    for (int i = 0; i < n; i++) sum += x[i];
    const float mean = (float)(sum / n);
    for (int i = 0; i < n; i++) ss += (double)(x[i] - mean) * (x[i] - mean);
    const float inv = (float)(1.0 / std::sqrt(ss / n + eps));
    for (int i = 0; i < n; i++) out[i] = (x[i] - mean) * inv * w[i] + (b ? b[i] : 0.0f);
}

void rope(float *v, int n_heads, int head_dim, int rope_dim, bool interleaved, const float *cos, const float *sin) {
    const int half = rope_dim / 2;
    const int step = interleaved ? 2 : 1, other = interleaved ? 1 : half;  // pair i: (i*step, i*step + other)
    for (int h = 0; h < n_heads; h++) {
        float *p = v + h * head_dim;
        for (int i = 0; i < half; i++) {
            float *x0 = p + i * step, *x1 = x0 + other;
            const float a = *x0, b = *x1;
            *x0 = a * cos[i] - b * sin[i];
            *x1 = b * cos[i] + a * sin[i];
        }
    }
}

void swiglu(const KernelTable &k, const float *gate_up, int n, float *out) { k.swiglu(gate_up, n, out); }

// Gemma-3-1B's prompts: std::tanh per value took 7% of a 128-token pass.
void geglu(const KernelTable &k, const float *gate_up, int n, float *out) { k.geglu(gate_up, n, out); }

namespace {
inline float silu(float x) { return x / (1.0f + std::exp(-x)); }
inline float gelu_tanh(float x) { return 0.5f * x * (1.0f + std::tanh(0.7978845608f * (x + 0.044715f * x * x * x))); }
}  // namespace

void glu(const KernelTable &k, Act kind, const float *gate_up, int n, float *out) {
    if (kind == Act::Silu) return k.swiglu(gate_up, n, out);
    if (kind == Act::GeluTanh) return k.geglu(gate_up, n, out);
    for (int i = 0; i < n; i++) out[i] = (kind == Act::GeluErf ? gelu_erf_scalar(gate_up[i]) : std::tanh(gate_up[i])) * gate_up[n + i];
}

void act(const KernelTable &k, Act kind, const float *x, size_t n, float *out) {
    switch (kind) {
    case Act::Silu: for (size_t i = 0; i < n; i++) out[i] = silu(x[i]); break;
    case Act::GeluTanh: for (size_t i = 0; i < n; i++) out[i] = gelu_tanh(x[i]); break;
    case Act::GeluErf: k.gelu_erf(x, n, out); break;
    case Act::Tanh: for (size_t i = 0; i < n; i++) out[i] = std::tanh(x[i]); break;
    }
}

void softcap(float *x, size_t n, float cap) {
    const float inv = 1.0f / cap;
    for (size_t i = 0; i < n; i++) x[i] = cap * std::tanh(x[i] * inv);
}

void softmax(const KernelTable &k, float *x, int n) {
    float mx = x[0];
    for (int i = 1; i < n; i++) mx = std::max(mx, x[i]);
    const float inv = 1.0f / k.exp_shift_sum(x, n, mx);
    for (int i = 0; i < n; i++) x[i] *= inv;
}

void attention(const KernelTable &k, const float *q, const AttentionRun *runs, int n_runs, int layer,
               const AttentionShape &sh, float *out, float *scores, size_t scores_stride, ThreadPool &pool) {
    const int n_heads = sh.n_heads, head_dim = sh.head_dim, group = n_heads / sh.n_kv_heads;
    const int rows = runs[n_runs - 1].first_row + runs[n_runs - 1].T;
    // One job for every run: 32 sessions decoding together are 32 runs of one row, and a job per
    // run would leave the threads waiting on each other 32 times per layer.
    pool.parallel_for((int64_t)rows * n_heads, [&](int64_t first, int64_t last, int tid) {
        float *s = scores + (size_t)tid * scores_stride;
        const AttentionRun *run = runs;
        for (int64_t task = first; task < last; task++) {
            const int row = (int)(task / n_heads), h = (int)(task % n_heads);
            while (row >= run->first_row + run->T) run++;  // tasks come in order of row
            const KvCache &cache = *run->cache;
            const auto kdot = k.kv_dot[(int)cache.type_k()];
            const auto vacc = k.kv_accum[(int)cache.type_v()];
            const size_t k_stride = cache.row_bytes_k(), v_stride = cache.row_bytes_v();
            const int end = run->pos0 + (sh.causal ? row - run->first_row + 1 : run->T);
            const int begin = sh.window > 0 ? std::max(0, end - sh.window) : 0, n = end - begin;
            const int kv_off = (h / group) * head_dim;
            const float *qh = q + (size_t)row * n_heads * head_dim + (size_t)h * head_dim;
            // The cache's blocks one after another: each holds a run of consecutive rows.
            for (int p = begin, len; p < end; p += len) {
                len = KvCache::run_in_block(p, end);
                kdot(cache.k_row(layer, p), k_stride, len, kv_off, qh, head_dim, s + (p - begin));
            }
            for (int j = 0; j < n; j++) s[j] *= sh.scale;
            if (sh.softcap > 0) softcap(s, (size_t)n, sh.softcap);
            softmax(k, s, n);
            float *o = out + (size_t)row * n_heads * head_dim + (size_t)h * head_dim;
            std::fill(o, o + head_dim, 0.0f);
            for (int p = begin, len; p < end; p += len) {
                len = KvCache::run_in_block(p, end);
                vacc(s + (p - begin), len, cache.v_row(layer, p), v_stride, kv_off, head_dim, o);
            }
        }
    });
}

}  // namespace ops
}  // namespace fastllm
