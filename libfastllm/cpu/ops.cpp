#include "cpu/ops.h"

#include "cpu/thread_pool.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace fastllm {
namespace ops {

namespace {

constexpr int kRowBlock = 16;      // weight rows a thread takes at a time
// A thread's packed panel: kGemmCols rows, k-major.
inline size_t panel_floats(int64_t K) { return (size_t)KernelTable::kGemmCols * K; }

size_t round16(size_t n) { return (n + 15) / 16 * 16; }  // a region of whole cache lines

// Cuts working memory into regions of whole cache lines, in order; given no memory it only adds up
// their sizes. A scratch's size and its carving are then one function, and cannot disagree (as
// Arena does for a model's passes).
struct Carve {
    float *base = nullptr;
    size_t used = 0;
    template <typename T = float>
    T *take(size_t floats) {
        T *p = base ? (T *)(base + used) : nullptr;
        used += round16(floats);
        return p;
    }
    float *next() const { return base ? base + used : nullptr; }
};

// The f32 panels, then the int8 activations, their scales and sums, and the same block-major
// (each with 16 floats to spare).
MatmulScratch carve_matmul(Carve &c, int64_t K, int n_threads, int max_T) {
    const size_t blocks = (size_t)max_T * ((K + kActBlock - 1) / kActBlock);
    MatmulScratch s;
    s.f32 = c.take((size_t)n_threads * panel_floats(K));
    s.acts.q = c.take<int8_t>((size_t)max_T * K / 4 + 16);
    s.acts.d = c.take(blocks + 16), s.acts.ds = c.take(blocks + 16);
    s.acts.d_by_block = c.take(blocks + 16), s.acts.ds_by_block = c.take(blocks + 16);
    return s;
}

}  // namespace

size_t matmul_scratch_floats(int64_t K, int n_threads, int max_T) {
    Carve c;
    carve_matmul(c, K, n_threads, max_T);
    return c.used;
}

MatmulScratch make_matmul_scratch(float *memory, int64_t K, int n_threads, int max_T) {
    if (!memory) return {};  // the arena's planning pass
    Carve c{memory};
    return carve_matmul(c, K, n_threads, max_T);
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
    QuantActs acts = sc.acts;
    if (!k.acts_by_block) acts.d_by_block = acts.ds_by_block = nullptr;
    acts.by_block_stride = (size_t)T;
    const int64_t n_act_blocks = K / kActBlock;
    pool.parallel_for(T, [&](int64_t first, int64_t last, int) {
        for (int64_t t = first; t < last; t++) {
            const QuantActs a = token_acts(acts, (int)K, (int)t);
            k.quantize_acts(x + t * K, (int)K, a);
            for (int64_t b = 0; a.d_by_block && b < n_act_blocks; b++)
                a.d_by_block[b * T] = a.d[b], a.ds_by_block[b * T] = a.ds[b];
        }
    });
    const auto dot = k.dot_rows_quant[(int)W.dtype];
    const int64_t n_blocks = (N + kRowBlock - 1) / kRowBlock;
    // Tokens in blocks whose int8 activations fit in L2 (1 MiB of them), each block taken past
    // every tile of the thread's rows, so that the activations are read from L2 and only the
    // weights, which are read once per token block, come from memory.
    const int64_t tok_block = std::max<int64_t>(16, (int64_t(1) << 20) / K / 16 * 16);
    pool.parallel_for(n_blocks, [&](int64_t first, int64_t last, int) {
        for (int64_t t0 = 0; t0 < T; t0 += tok_block)
            for (int64_t b = first; b < last; b++) {
                const int64_t r0 = b * kRowBlock;
                dot(quant_tile(W, r0), (int)std::min<int64_t>(kRowBlock, N - r0), (int)K, token_acts(acts, (int)K, (int)t0),
                    (int)std::min(tok_block, T - t0), y + t0 * N + r0, (size_t)N);
            }
    });
}

// Plain weights, a prompt's tokens: each thread packs a panel of 32 rows as f32, k-major (in L2:
// 48 KiB at K = 384, 256 KiB at K = 2048), and streams the tokens past it. Chunks of K kept in L1
// measured no faster at 512 x 2048 x 2048 (the sums left the registers once per chunk). Against
// OpenBLAS's sgemm, which this replaced (AVX-512 Xeon, 2 threads, GFLOP/s, best of 9): 400 x 1536
// x 384 275 vs 280, 400 x 384 x 1536 287 vs 270, 512 x 2048 x 2048 309 vs 317, 512 x 2048 x 5632
// 343 vs 320.
void matmul_panels(const KernelTable &k, const Tensor &W, const float *x, int T, float *y, const MatmulScratch &sc,
                   ThreadPool &pool) {
    constexpr int C = KernelTable::kGemmCols;
    const int64_t N = W.rows(), K = W.cols(), n_panels = (N + C - 1) / C;
    const int dt = (int)W.dtype;
    // Fewer panels than two per thread (N = 384 on 16 threads): the tokens are split as well, each
    // part packing its panel again, with at least 32 tokens a part so that packing stays small.
    const int64_t splits = std::max<int64_t>(1, std::min<int64_t>((2 * pool.n_threads() + n_panels - 1) / n_panels, T / 32));
    const int64_t per = (T + splits - 1) / splits;
    pool.parallel_for(n_panels * splits, [&](int64_t first, int64_t last, int tid) {
        float *panel = sc.f32 + (size_t)tid * panel_floats(K);
        for (int64_t task = first, packed = -1; task < last; task++) {
            const int64_t b = task / splits, t0 = task % splits * per, r0 = b * C;
            const int cols = (int)std::min<int64_t>(C, N - r0), n_tok = (int)std::min<int64_t>(per, T - t0);
            if (n_tok <= 0) continue;
            if (b != packed) k.gemm_pack[dt](W.row(r0), W.row_bytes(), cols, (int)K, panel), packed = b;
            k.gemm_panel(panel, (int)K, x + t0 * K, (size_t)K, n_tok, y + t0 * N + r0, (size_t)N, cols);
        }
    });
}

}  // namespace

static_assert(KernelTable::kMultiTokens == kStepRows, "a step's rows take the decoding kernels");
void matmul(const KernelTable &k, const Tensor &W, const float *bias, const float *x, int T, float *y,
            const MatmulScratch &sc, ThreadPool &pool) {
    const int64_t N = W.rows(), K = W.cols();
    const int dt = (int)W.dtype;
    const int64_t n_blocks = (N + kRowBlock - 1) / kRowBlock;
    if (dtype_is_quantized(W.dtype)) {
        matmul_quant(k, W, x, T, y, sc, pool);
    } else if (T == 1) {
        // Decoding: every weight is read once; split the rows across threads.
        pool.parallel_for(n_blocks, [&](int64_t first, int64_t last, int) {
            const int64_t r0 = first * kRowBlock, r1 = std::min(N, last * kRowBlock);
            k.dot_rows[dt](W.row(r0), W.row_bytes(), (int)(r1 - r0), x, (int)K, y + r0);
        });
    } else if (T <= KernelTable::kMultiTokens) {
        // A few tokens (speculative drafts): as decoding, each weight read once for all of them, each
        // token's sums those it gets alone.
        pool.parallel_for(n_blocks, [&](int64_t first, int64_t last, int) {
            const int64_t r0 = first * kRowBlock, r1 = std::min(N, last * kRowBlock);
            k.dot_rows_multi[dt](W.row(r0), W.row_bytes(), (int)(r1 - r0), x, (int)K, T, y + r0, (size_t)N);
        });
    } else {
        matmul_panels(k, W, x, T, y, sc, pool);
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


namespace {

// Keys per step of the blocked path: 4 panels. With one panel (32 keys) the per-query softmax
// bookkeeping took as long as the products (Qwen2.5-0.5B's heads, 2048 rows).
constexpr int kBlockKeys = 4 * KernelTable::kGemmCols;
// Query vectors (rows x a KV head's heads) per block. When each block converted and packed its
// keys and values itself, more queries shared that work: 128 against 64, Qwen2.5-0.5B int8 (AMX
// Xeon, 2 threads) pp8192 1.085x, pp2048 1.04x; 256 gave 1.05x more at 8192 but needs 0.7 MiB of scratch
// per thread at head_dim 128, past many CPUs' L2 (128: 0.47 MiB; 0.27 MiB at head_dim 64).
constexpr int kBlockQueries = 128;

static_assert(kBlockKeys % KvCache::kBlock == 0 && KvCache::kBlock % KernelTable::kGemmCols == 0,
              "a panel's keys are consecutive rows of one cache block");
static_assert(kBlockQueries == KernelTable::kAttnQueries && kBlockKeys == KernelTable::kAttnKeys,
              "a block is what the tile products take");

// A task takes several blocks of a prompt's rows (of one KV head), so that the keys and values of
// a step are converted and packed once for all of them (they were converted once per block: a
// fifth of a pp8192's time, Qwen2.5-0.5B). Each block keeps its queries, sums and softmax state
// across the steps: up to this many bytes of them per thread.
// 512 KiB against 256 KiB (7 blocks a task against 3 at head_dim 64): 1.06x the attention alone
// (bench_attention, Qwen2.5-0.5B heads, 2 threads); 1 MiB gave 1.04x more, past many CPUs' L2.
constexpr size_t kGroupStateBytes = 512 << 10, kMaxGroup = 16;

// A step's memory: scores, rescale factors and sums, the keys' and values' heads as f32, a whole
// q8 row, then in the same memory the panels' (key panels, value panels, one block's weighted
// values) or the tile products' (key and value tiles).
struct StepMemory {
    float *S, *alpha, *sums, *Kt, *Vt, *tmp, *Kp, *Vp, *Ot;
    uint16_t *kt, *vt;
};
StepMemory carve_step(Carve &c, int hd, int64_t kv_dim) {
    const size_t Q = kBlockQueries, B = kBlockKeys, C = KernelTable::kGemmCols;
    StepMemory m;
    m.S = c.take(Q * B), m.alpha = c.take(Q), m.sums = c.take(Q);
    m.Kt = c.take(B * hd), m.Vt = c.take(B * hd), m.tmp = c.take((size_t)kv_dim);
    Carve panels{c.next()}, tiles{c.next()};
    m.Kp = panels.take((size_t)hd * B), m.Vp = panels.take(B * ((hd + C - 1) / C * C)), m.Ot = panels.take(Q * hd);
    m.kt = tiles.take<uint16_t>(attn_tile_halves(hd) / 2), m.vt = tiles.take<uint16_t>(attn_tile_halves(hd) / 2);
    c.used += std::max(panels.used, tiles.used);
    return m;
}

// A block's state: its queries (f32, or their tile halves), its weighted values, maxima and totals.
struct BlockState {
    float *Qs, *O, *m, *l;
};
BlockState carve_state(Carve &c, int hd) {
    const size_t Q = kBlockQueries;
    BlockState s;
    s.Qs = c.take(Q * hd), s.O = c.take(Q * hd), s.m = c.take(Q), s.l = c.take(Q);
    return s;
}

int max_group(int hd) {
    Carve state;
    carve_state(state, hd);
    return (int)std::clamp<size_t>(kGroupStateBytes / (4 * state.used), 1, kMaxGroup);
}

// Values [off, off + dim) of a KV row as f32 (tmp: room for a whole row, for a q8 head that does
// not start a block).
void load_head(const KernelTable &k, KvType t, const char *row, int off, int dim, int kv_dim, float *out, float *tmp) {
    if (t == KvType::F32) {
        std::memcpy(out, (const float *)row + off, (size_t)dim * 4);
    } else if (t == KvType::F16) {
        k.to_f32[(int)DType::F16](row + (size_t)off * 2, out, dim);
    } else if (off % kKvQ8Block == 0) {
        k.kv_load[(int)t](row + (size_t)(off / kKvQ8Block) * kKvQ8BlockBytes, out, dim);
    } else {
        k.kv_load[(int)t](row, tmp, kv_dim);
        std::memcpy(out, tmp + off, (size_t)dim * 4);
    }
}

// A decoding row's KV rows are prefetched into L1, kPrefetchKeys keys before they are read:
// it reads them from memory, one KV head's slice of each row in runs of a cache block's rows, with
// few products between them, and the hardware's prefetcher left it waiting on the loads. Tokens/s
// after 4096 tokens of Qwen2.5-0.5B int8 1.14-1.17x, after 1900 of TinyLlama-1.1B int4 1.07-1.12x
// (AMD EPYC Zen 3, 2 threads, 9 alternating rounds: bench_long_prompt.py --from_state); 16 and 8
// keys ahead about the same as 32. The lines are worked out once per task: worked out for each
// key, two spellings of the same arithmetic ran 1.11x apart (the compiler's code for the loop, not
// its work), and the better one 1.05x slower than this.
constexpr int kPrefetchKeys = 32;
// The cache lines of a KV row that hold values [off, off + dim): bytes [first, end) from the row's start.
struct HeadLines {
    size_t first, end;
};
HeadLines head_lines(KvType t, int off, int dim) {
    const int from = t == KvType::Q8 ? off / kKvQ8Block * kKvQ8Block : off;  // a q8 head starts in its block
    return {kv_row_bytes(t, from) / 64 * 64, kv_row_bytes(t, off + dim)};
}
void prefetch_lines(const char *row, HeadLines l) {
    for (size_t b = l.first; b < l.end; b += 64) __builtin_prefetch(row + b, 0, 3);
}
// n rows' lines, `stride` bytes apart, into L2.
void prefetch_rows_l2(const char *row, size_t stride, int n, HeadLines l) {
    for (int j = 0; j < n; j++, row += stride)
        for (size_t b = l.first; b < l.end; b += 64) __builtin_prefetch(row + b, 0, 2);
}

// Which rows of a run a task takes: blocks first, first + stride, ... (n of them) of `rows` rows
// each, heads [h0, h0 + hn) of KV head g's group; block b's queries i = (row - its first row) * hn
// + h - h0.
struct BlockGroup {
    int g, h0, hn, rows, first, stride, n;
};

void attend_blocks(const KernelTable &k, const float *q, const AttentionRun &run, int layer, const AttentionShape &sh,
                   const BlockGroup &bg, float *out, float *mem) {
    constexpr int Q = kBlockQueries, B = kBlockKeys, C = KernelTable::kGemmCols;
    const int hd = sh.head_dim, group = sh.n_heads / sh.n_kv_heads, hn = bg.hn;
    const KvCache &cache = *run.cache;
    const int kv_dim = cache.kv_dim(), off = bg.g * hd;
    Carve carve{mem};
    // panels: the keys' (hd x B), the values' (B x C per C of a head's values), a block's weighted
    // values; tiles: the keys' and the values' halves
    const StepMemory step = carve_step(carve, hd, kv_dim);  // named, not bound: lambdas below take them
    float *S = step.S, *alpha = step.alpha, *sums = step.sums, *Kt = step.Kt, *Vt = step.Vt, *tmp = step.tmp;
    float *Kp = step.Kp, *Vp = step.Vp, *Ot = step.Ot;
    uint16_t *kt = step.kt, *vt = step.vt;
    struct Block : BlockState {
        int r0, r1, nq;
    };
    Block blocks[kMaxGroup];
    // The products on the matrix unit where the ISA has one (AMX: bf16 halves, three products each),
    // for a prompt's rows: a decoding row's few queries (padded to 16) do not repay the keys'
    // conversion to tiles (Qwen2.5-0.5B tg64 4096 deep 0.92x), and a decoding row must not take
    // other products when it comes with others (a speculative step's rows, T <= kStepRows).
    const bool tiles = k.attn_step && hd % 32 == 0 && run.T >= kAttentionBlockRows;
    // The tiles' softmax takes scores in units of log2 (attn_step): the queries carry log2(e),
    // and a soft cap c, c * log2(e) (c' tanh(s' / c') is c tanh(s / c) * log2(e) for s' = s log2(e)).
    const float scale = tiles ? sh.scale * 1.44269504f : sh.scale, cap = tiles ? sh.softcap * 1.44269504f : sh.softcap;
    // A decoding row's keys and values are prefetched, and go from the cache into the panels in place
    // (below); a prompt's go to many blocks' products, behind which the hardware's prefetcher keeps
    // up and a copy costs little.
    const bool decoding = run.T < kAttentionBlockRows;
    const HeadLines k_lines = head_lines(cache.type_k(), off, hd), v_lines = head_lines(cache.type_v(), off, hd);
    // the plain dtype of f16 and f32 keys and values (-1: q8)
    auto plain = [](KvType t) { return t == KvType::F16 ? (int)DType::F16 : t == KvType::F32 ? (int)DType::F32 : -1; };
    const int k_plain = plain(cache.type_k()), v_plain = plain(cache.type_v());
    auto key_end = [&](int r) { return run.pos0 + (sh.causal ? r + 1 : run.T); };
    auto key_begin = [&](int r) { return sh.window > 0 ? std::max(0, key_end(r) - sh.window) : 0; };
    int first_key = INT32_MAX, last_key = 0;
    for (int b = 0; b < bg.n; b++) {
        Block &blk = blocks[b];
        blk.r0 = (bg.first + b * bg.stride) * bg.rows, blk.r1 = std::min(run.T, blk.r0 + bg.rows);
        blk.nq = (blk.r1 - blk.r0) * hn;
        static_cast<BlockState &>(blk) = carve_state(carve, hd);
        // the scaled queries; their tiles' halves are made from a copy in the memory of the block's
        // weighted values (zeroed next)
        float *Qf = tiles ? blk.O : blk.Qs;
        for (int i = 0; i < blk.nq; i++) {
            const int row = run.first_row + blk.r0 + i / hn, h = bg.g * group + bg.h0 + i % hn;
            const float *src = q + ((size_t)row * sh.n_heads + h) * hd;
            for (int d = 0; d < hd; d++) Qf[(size_t)i * hd + d] = src[d] * scale;
        }
        if (tiles) k.attn_queries(Qf, blk.nq, hd, (uint16_t *)blk.Qs);
        std::fill(blk.O, blk.O + (size_t)blk.nq * hd, 0.0f);
        std::fill(blk.m, blk.m + blk.nq, -INFINITY);
        std::fill(blk.l, blk.l + blk.nq, 0.0f);
        first_key = std::min(first_key, key_begin(blk.r0)), last_key = std::max(last_key, key_end(blk.r1 - 1));
    }
    // Steps of B keys from multiples of B, key p + j in row j: a query's steps, and so the order of
    // its sums, do not depend on the block or task it went in. Keys before the task's first (out of
    // a window, perhaps no longer in the cache) are zero rows, outside every query's range.
    for (int p = first_key / B * B, n; p < last_key; p += n) {
        n = std::min(B, last_key - p);
        const int skip = std::max(0, first_key - p);
        // A decoding row's f16 and f32 keys and values go from the cache into the panels, with no
        // copy between (tg64 after 1900 tokens of TinyLlama int4 1.04-1.05x in three runs, after
        // 4096 of Qwen2.5-0.5B int8 1.00x; AMD EPYC Zen 3, bench_long_prompt.py --from_state, 9
        // rounds); not a step that starts with rows out of range (zeros in Kt, Vt).
        const bool k_in_place = decoding && skip == 0 && k_plain >= 0, v_in_place = decoding && skip == 0 && v_plain >= 0;
        std::fill(Kt, Kt + (size_t)skip * hd, 0.0f);
        std::fill(Vt, Vt + (size_t)skip * hd, 0.0f);
        for (int j = skip; j < n; j++) {
            if (const int a = p + j + kPrefetchKeys; decoding && a < last_key && cache.holds(layer, a)) {
                prefetch_lines(cache.k_row(layer, a), k_lines);
                prefetch_lines(cache.v_row(layer, a), v_lines);
            }
            if (!k_in_place)
                load_head(k, cache.type_k(), cache.k_row(layer, p + j), off, hd, kv_dim, Kt + (size_t)j * hd, tmp);
            if (!v_in_place)
                load_head(k, cache.type_v(), cache.v_row(layer, p + j), off, hd, kv_dim, Vt + (size_t)j * hd, tmp);
        }
        if (tiles) {
            k.attn_keys(Kt, n, hd, kt);
            k.attn_vals(Vt, n, hd, vt);
        }
        // The panels (C keys each; C of a head's values each) are packed by the first block that
        // takes them, just before its product reads them: all packed before the first product, a
        // decoding row's had left L1 when read (its attention 8192 deep 1.10x slower).
        int keys_packed = 0, values_packed = 0;
        auto key_panel = [&](int c) {
            float *kp = Kp + (size_t)c * hd;
            if (c < keys_packed) return kp;
            if (k_in_place)  // a panel's keys are consecutive rows of one cache block
                k.gemm_pack[k_plain](cache.k_row(layer, p + c) + (size_t)off * dtype_size((DType)k_plain),
                                     cache.row_bytes_k(), std::min(C, n - c), hd, kp);
            else
                k.gemm_pack[(int)DType::F32](Kt + (size_t)c * hd, (size_t)hd * 4, std::min(C, n - c), hd, kp);
            keys_packed = c + C;
            return kp;
        };
        auto value_panel = [&](int d0) {
            // kept for the group's other blocks; a group of one (a decoding row) packs each into the
            // same memory, which stays in L1 (its attention 8192 deep 0.338 -> 0.331 ms, 0.329 the
            // day before)
            float *vp = Vp + (size_t)(bg.n > 1 ? d0 / C : 0) * B * C;
            if (d0 < values_packed) return vp;
            const int dc = std::min(C, hd - d0);
            // In place, a cache block's rows a call: one call a row took 17% of a decoding row's
            // attention (the call and its loop's setup for 32 values). A layer's after 1900 tokens
            // of TinyLlama-1.1B 1.15-1.2x (bench_attention, in the caches), its tokens/s 1.03-1.045x
            // and Qwen2.5-0.5B's after 4096 1.00-1.04x, three runs each (bench_long_prompt.py
            // --from_state, 9 rounds; AMD EPYC Zen 3). Copied from Vt, a whole panel's width copies
            // with a constant size: vector moves, where the variable size became `rep movsq` per key
            // (4% of a pp8192's time, Qwen2.5-0.5B).
            if (v_in_place) {
                for (int j = 0, len; j < n; j += len) {
                    len = KvCache::run_in_block(p + j, p + n);
                    k.rows_to_f32[v_plain](cache.v_row(layer, p + j) + (size_t)(off + d0) * dtype_size((DType)v_plain),
                                           cache.row_bytes_v(), len, dc, vp + (size_t)j * C, C);
                }
                if (dc < C)
                    for (int j = 0; j < n; j++) std::fill(vp + (size_t)j * C + dc, vp + (size_t)(j + 1) * C, 0.0f);
            } else if (dc == C)
                for (int j = 0; j < n; j++) std::memcpy(vp + (size_t)j * C, Vt + (size_t)j * hd + d0, sizeof(float) * C);
            else
                for (int j = 0; j < n; j++) {
                    std::memcpy(vp + (size_t)j * C, Vt + (size_t)j * hd + d0, (size_t)dc * 4);
                    std::fill(vp + (size_t)j * C + dc, vp + (size_t)(j + 1) * C, 0.0f);
                }
            values_packed = d0 + C;
            return vp;
        };
        for (int b = 0; b < bg.n; b++) {
            const Block &blk = blocks[b];
            if (p >= key_end(blk.r1 - 1) || p + n <= key_begin(blk.r0)) continue;  // none of its keys
            const int nq = blk.nq;
            if (tiles) {
                int lo[Q], hi[Q];
                for (int i = 0; i < nq; i++) {
                    const int r = blk.r0 + i / hn;
                    lo[i] = std::max(p, key_begin(r)) - p, hi[i] = std::max(lo[i], std::min(p + n, key_end(r)) - p);
                }
                k.attn_step((const uint16_t *)blk.Qs, nq, hd, kt, vt, n, lo, hi, cap, blk.m, blk.l, blk.O);
                continue;
            }
            for (int c = 0; c < n; c += C)  // scores of every query against these keys, a panel at a time
                k.gemm_panel(key_panel(c), hd, blk.Qs, (size_t)hd, nq, S + c, B, std::min(C, n - c));
            for (int i = 0; i < nq; i++) {
                const int r = blk.r0 + i / hn;
                const int lo = std::max(p, key_begin(r)) - p, hi = std::min(p + n, key_end(r)) - p;
                float *s = S + (size_t)i * B;
                alpha[i] = 0.0f, sums[i] = 0.0f;  // exp(0): unchanged
                if (lo >= hi) {  // none of these keys is this query's: it adds nothing
                    std::fill(s, s + n, 0.0f);
                    continue;
                }
                if (sh.softcap > 0) k.softcap(s + lo, (size_t)(hi - lo), sh.softcap);
                const float m_new = std::max(blk.m[i], k.reduce_max(s + lo, hi - lo));
                // exp(-87) for the first keys (m = -inf): the table's exp takes finite input, and 1e-38
                // of a total and sums still 0 is 0
                alpha[i] = std::max(blk.m[i] - m_new, -87.0f);
                sums[i] = k.exp_shift_sum(s + lo, hi - lo, m_new);
                std::fill(s, s + lo, 0.0f);
                std::fill(s + hi, s + n, 0.0f);
                blk.m[i] = m_new;
            }
            // The rescale factors, all the queries' at once, padded to whole vectors: a vector exp and
            // its scalar tail round differently, so a query's factor must not depend on its place in
            // the block (a decoding row alone and in a speculative step's three would differ).
            const int padded = (nq + 15) / 16 * 16;
            std::fill(alpha + nq, alpha + padded, 0.0f);
            k.exp_shift_sum(alpha, padded, 0.0f);
            for (int i = 0; i < nq; i++) {
                blk.l[i] = blk.l[i] * alpha[i] + sums[i];
                if (alpha[i] != 1.0f)
                    for (int d = 0; d < hd; d++) blk.O[(size_t)i * hd + d] *= alpha[i];
            }
            for (int d0 = 0; d0 < hd; d0 += C)  // the weighted values, C of a head's values at a time
                k.gemm_panel(value_panel(d0), n, S, B, nq, Ot + d0, (size_t)hd, std::min(C, hd - d0));
            for (size_t e = 0; e < (size_t)nq * hd; e++) blk.O[e] += Ot[e];
        }
    }
    for (int b = 0; b < bg.n; b++) {
        const Block &blk = blocks[b];
        for (int i = 0; i < blk.nq; i++) {
            const int row = run.first_row + blk.r0 + i / hn, h = bg.g * group + bg.h0 + i % hn;
            const float inv = 1.0f / blk.l[i];
            float *o = out + ((size_t)row * sh.n_heads + h) * hd;
            for (int d = 0; d < hd; d++) o[d] = blk.O[(size_t)i * hd + d] * inv;
        }
    }
}

// Query heads per KV head from which a decoding row's heads go in a block together (attend_block)
// rather than each straight from the cache (attend_direct). Generated tokens/s, 64 after a prompt
// (bench_long_prompt.py --gen 64, AMX Xeon, 2 threads, medians of 3), direct / block:
//   1 head a KV head (110M shape):      896 deep 121 / 78, 4096 deep 56 / 34
//   4 (110M, 3 KV heads):               128 deep 390 / 371, 896 deep 316 / 286, 4096 deep 118 / 122
//   7 (Qwen2.5-0.5B):                   1900 deep 32.5 / 33.1, 4096 deep 30.3 / 34.7
// A block converts each key once for all its heads, and its products need no horizontal sums, but
// it converts and packs the keys and values before any product; with few heads that costs more
// than it saves. Where the kernels have attn_lanes (AVX2), a block's decoding rows take their heads
// in lanes instead (attend_lanes); below 6 heads a KV head those lanes lost to the direct path too
// (build/bench_attention 2 4096 11 64 HEADS KV 1, AMD EPYC Zen 3: 9 heads of 3 KV heads 0.69-0.97
// against 0.45-0.58 ms, 32 of 8 1.95-2.38 against 1.41-1.51).
constexpr int kDecodeGroupBlocked = 6;

// The keys of decoding row r of a run: [begin, end).
struct KeyRange {
    int begin, end;
};
KeyRange row_keys(const AttentionRun &run, const AttentionShape &sh, int r) {
    const int end = run.pos0 + (sh.causal ? r + 1 : run.T);
    return {sh.window > 0 ? std::max(0, end - sh.window) : 0, end};
}
// In a model of fewer than kSplitKvHeads KV heads, a decoding row with kSplitKeys keys or more goes
// in kKeyParts parts, each a task, their softmax states merged after the job (merge_parts): a row's
// KV heads alone were too few tasks to share out (SmolLM2-135M: 3 KV heads, one row: 3 tasks on 2
// threads, one thread idle a third of the time; decoding 4096 deep 1.22-1.42x). With 12 KV heads
// (the 110M shape) the parts' merges cost more than they evened out (880 deep 0.89-0.99x). Decided
// by the model and the row's own keys, so that a row's result does not depend on the rows,
// sessions or threads it goes with.
constexpr int kSplitKvHeads = 8, kSplitKeys = 512, kKeyParts = 4;
int key_parts(const AttentionRun &run, const AttentionShape &sh, int r) {
    const KeyRange kr = row_keys(run, sh, r);
    return sh.n_kv_heads < kSplitKvHeads && kr.end - kr.begin >= kSplitKeys ? kKeyParts : 1;
}
// Part `part` of n_parts of a row's keys, its bounds on whole steps of kBlockKeys from begin.
KeyRange key_part(KeyRange kr, int part, int n_parts) {
    auto at = [&](int i) {
        return i == n_parts ? kr.end : kr.begin + (int)((int64_t)(kr.end - kr.begin) * i / n_parts / kBlockKeys * kBlockKeys);
    };
    return {at(part), at(part + 1)};
}

// A direct run's rows go in groups that read their keys together (attend_direct): consecutive rows
// whose keys go in as many parts, each part starting at the same key and, but for the last, ending
// at the same key, the rows' ends not decreasing. A speculative step's rows, or a short prompt's,
// are one group, unless a row's one more key moves a part's bound or a sliding window moves the
// first key. Read once for all the group's rows rather than once a row: a step of 6 rows after
// 4096 tokens of SmolLM2-135M q4m 17.0 -> 13.9 ms, of 12 rows 32-40 -> 24-26 ms, of 2 rows 8.1 ->
// 7.7 (AMD EPYC Zen 5, 2 threads, medians of 15-20, three alternating runs).
struct RowGroup {
    int run, r0, nr, n_parts;
    int64_t slot0;  // the group's first slot of part states (n_parts > 1)
};
bool read_together(const AttentionRun &run, const AttentionShape &sh, int a, int b) {
    const int n = key_parts(run, sh, a);
    const KeyRange ka = row_keys(run, sh, a), kb = row_keys(run, sh, b);
    if (key_parts(run, sh, b) != n || kb.end < ka.end) return false;
    for (int i = 0; i < n; i++) {
        const KeyRange pa = key_part(ka, i, n), pb = key_part(kb, i, n);
        if (pa.begin != pb.begin || (i + 1 < n && pa.end != pb.end)) return false;
    }
    return true;
}

// A decoding row reads its KV rows kDirectRows at a time (a call of the kernels for all its heads),
// each call first prefetching into L2 the rows kDirectAhead positions on (whole cache blocks on, so
// that they too follow each other in one block). SmolLM2-135M q4m, 128 tokens after 4096 (AMD EPYC
// Zen 5, 2 threads, 5 alternating runs), against the next step's 128 rows prefetched at once before
// the step (itself 1.08-1.20x no prefetch): 1.08-1.33x (1.20-1.30x in a later run); 8 rows a call
// 1.03-1.27x, 32 rows 1.04-1.17x; 32 rows ahead as 64, 128 1.13-1.30x, 256 1.06-1.17x. Prefetched
// all at once, the rows' misses queued behind each other while the products waited; spread out,
// they overlap the products.
constexpr int kDirectRows = 16, kDirectAhead = 64;
static_assert(kDirectAhead % KvCache::kBlock == 0 && KvCache::kBlock % kDirectRows == 0, "rows a call ahead in one block");

// The first kDirectAhead of KV rows [begin, end) into L2 (head lines k and v), which no call's
// prefetch ahead reaches: 32 characters of 1,000 tokens decoding together (bench_npc.py --sessions
// 32, tasks of 250 keys) 1.05-1.09x, one row of 4096 keys 1.0x (attend_direct).
void prefetch_first_rows(const KvCache &cache, int layer, int begin, int end, HeadLines k, HeadLines v) {
    end = std::min(end, begin + kDirectAhead);
    for (int p = begin, len; p < end; p += len) {
        len = KvCache::run_in_block(p, end);
        prefetch_rows_l2(cache.k_row(layer, p), cache.row_bytes_k(), len, k);
        prefetch_rows_l2(cache.v_row(layer, p), cache.row_bytes_v(), len, v);
    }
}

// A direct task's queries: up to a run's decoding rows times a KV head's heads.
constexpr int kMaxDirectQueries = kStepRows * (kDecodeGroupBlocked - 1);
// A direct task's memory: its queries' scores for a step, the queries, their weighted values.
struct DirectMemory {
    float *s, *q, *o;
};
DirectMemory carve_direct(Carve &c, int nq, int hd) {
    DirectMemory m;
    m.s = c.take((size_t)nq * kBlockKeys), m.q = c.take((size_t)nq * hd), m.o = c.take((size_t)nq * hd);
    return m;
}

// Queries a pass over a decoding task's keys takes in lanes (attend_lanes): 8 vectors. A task's
// queries past these (a step of 17 rows of 7 heads: 119) take another pass.
constexpr int kLaneQueries = 64;
// A lanes task's memory: the queries and their weighted values, maxima, totals and bounds, a step's
// scores, its keys and values as f32 (where the cache's are not both f32 or both f16), a q8 row.
struct LaneMemory {
    float *q, *o, *m, *l, *s, *kt, *vt, *tmp;
    int *lo, *hi;
};
LaneMemory carve_lanes(Carve &c, int hd, int64_t kv_dim) {
    const size_t Q = kLaneQueries, B = KvCache::kBlock;
    LaneMemory m;
    m.q = c.take(Q * hd), m.o = c.take(Q * hd), m.m = c.take(Q), m.l = c.take(Q), m.s = c.take(Q * B);
    m.kt = c.take(B * hd), m.vt = c.take(B * hd), m.tmp = c.take((size_t)kv_dim);
    m.lo = c.take<int>(Q), m.hi = c.take<int>(Q);
    return m;
}

// A task's memory: a blocked one's (a step's, then max_group blocks' states), a direct one's or a
// lanes one's.
size_t block_floats(int hd, int64_t kv_dim) {
    Carve c, d, e;
    carve_step(c, hd, kv_dim);
    for (int b = 0; b < max_group(hd); b++) carve_state(c, hd);
    carve_direct(d, kMaxDirectQueries, hd);
    carve_lanes(e, hd, kv_dim);
    return std::max({c.used, d.used, e.used});
}

// A blocked task's decoding rows with their queries in lanes (KernelTable::attn_lanes): up to
// kLaneQueries of the rows' heads a pass over their keys, a step of the online softmax per run of
// keys in one cache block (the steps fall on the blocks, so a row's are the same whatever rows go
// with it). Keys and values both f16 or both f32 are read in the cache; other types are converted
// to f32 a row at a time. The rows' KV rows are prefetched into L2 kDirectAhead keys on, as
// attend_direct's (none, 32, 128 or 256 keys on measured the same). Against the same rows in blocks
// (attend_blocks: keys packed into panels, products of 7 queries, each query's softmax apart; AMD
// EPYC Zen 3, 2 threads, build/bench_attention 2 4096 11 64 14 2 ROWS, Qwen2.5-0.5B's heads 4096
// deep, the rows from memory): one row 0.52-0.61 -> 0.42 ms (in the caches, 1 thread, 7.4 -> 5.2-5.8
// ns a head and key), 4 rows 1.17-1.19 -> 1.13-1.15 ms, 17 rows 2.31-2.36 -> 2.02-2.08 ms. In the
// model, generating after 4096 tokens, a token's attention 10.0-10.4 -> 8.7-9.3 ms and tokens/s
// 1.037x (bench_long_prompt.py --from_state, 7 rounds); TinyLlama int4's after 1900 1.022x. A first
// form, the rows converted to f32 and each key value broadcast against the queries (transposed),
// ran no faster than the blocks.
void attend_lanes(const KernelTable &k, const float *q, const AttentionRun &run, int layer, const AttentionShape &sh,
                  const BlockGroup &bg, float *out, float *mem) {
    const int hd = sh.head_dim, group = sh.n_heads / sh.n_kv_heads, hn = bg.hn, off = bg.g * hd;
    const KvCache &cache = *run.cache;
    Carve carve{mem};
    const LaneMemory lm = carve_lanes(carve, hd, cache.kv_dim());
    const HeadLines k_lines = head_lines(cache.type_k(), off, hd), v_lines = head_lines(cache.type_v(), off, hd);
    const KvType tk = cache.type_k(), tv = cache.type_v();
    const bool in_place = tk == tv && k.attn_lanes[(int)tk];
    const KernelTable::AttnLanes lanes = k.attn_lanes[(int)(in_place ? tk : KvType::F32)];
    const size_t value_bytes = tk == KvType::F16 ? 2 : 4;  // in place: f16 or f32
    int begin[kLaneQueries], end[kLaneQueries];
    for (int b = 0; b < bg.n; b++) {
        const int r0 = (bg.first + b * bg.stride) * bg.rows, r1 = std::min(run.T, r0 + bg.rows), all = (r1 - r0) * hn;
        for (int i0 = 0; i0 < all; i0 += kLaneQueries) {
            const int nq = std::min(kLaneQueries, all - i0), nv = (nq + 7) / 8, L = 8 * nv;
            int first_key = INT32_MAX, last_key = 0;
            for (int i = 0; i < L; i++) {
                const int row = r0 + (i0 + i) / hn, h = bg.g * group + bg.h0 + (i0 + i) % hn;
                const float *src = i < nq ? q + ((size_t)(run.first_row + row) * sh.n_heads + h) * hd : nullptr;
                for (int d = 0; d < hd; d++) lm.q[(size_t)i * hd + d] = src ? src[d] * sh.scale : 0.0f, lm.o[(size_t)i * hd + d] = 0.0f;
                lm.m[i] = -INFINITY, lm.l[i] = 0.0f;
                const KeyRange kr = src ? row_keys(run, sh, row) : KeyRange{0, 0};  // a lane past nq: no key
                begin[i] = kr.begin, end[i] = kr.end;
                if (src) first_key = std::min(first_key, begin[i]), last_key = std::max(last_key, end[i]);
            }
            prefetch_first_rows(cache, layer, first_key, last_key, k_lines, v_lines);
            for (int p = first_key, n; p < last_key; p += n) {
                n = KvCache::run_in_block(p, last_key);
                if (const int a = p + kDirectAhead; a < last_key) {
                    prefetch_rows_l2(cache.k_row(layer, a), cache.row_bytes_k(), std::min(n, last_key - a), k_lines);
                    prefetch_rows_l2(cache.v_row(layer, a), cache.row_bytes_v(), std::min(n, last_key - a), v_lines);
                }
                const char *kr = cache.k_row(layer, p), *vr = cache.v_row(layer, p);
                const void *kp = kr + (size_t)off * value_bytes, *vp = vr + (size_t)off * value_bytes;
                size_t ldk = cache.row_bytes_k(), ldv = cache.row_bytes_v();
                if (!in_place) {
                    for (int j = 0; j < n; j++) {
                        load_head(k, tk, kr + (size_t)j * ldk, off, hd, cache.kv_dim(), lm.kt + (size_t)j * hd, lm.tmp);
                        load_head(k, tv, vr + (size_t)j * ldv, off, hd, cache.kv_dim(), lm.vt + (size_t)j * hd, lm.tmp);
                    }
                    kp = lm.kt, vp = lm.vt, ldk = ldv = (size_t)hd * 4;
                }
                for (int i = 0; i < L; i++) lm.lo[i] = begin[i] - p, lm.hi[i] = end[i] - p;
                lanes(lm.q, nv, hd, kp, ldk, vp, ldv, n, lm.lo, lm.hi, sh.softcap, lm.m, lm.l, lm.o, lm.s);
            }
            for (int i = 0; i < nq; i++) {
                const int row = r0 + (i0 + i) / hn, h = bg.g * group + bg.h0 + (i0 + i) % hn;
                float *dst = out + ((size_t)(run.first_row + row) * sh.n_heads + h) * hd;
                const float inv = 1.0f / lm.l[i];
                for (int d = 0; d < hd; d++) dst[d] = lm.o[(size_t)i * hd + d] * inv;
            }
        }
    }
}

// Rows [r0, r0 + nr) of a run, row r0 + i against keys kr[i], query heads [h0, h0 + hn) of KV head
// g, straight from the cache (kv_dot, kv_accum), a step of kBlockKeys keys at a time from the
// rows' common first key, each query's softmax online. The rows' keys start at one key and their
// ends do not decrease (read_together). All the rows' heads go through the kernels together, each KV
// row read and converted once for all of them (f16 to f32: 0.39 ns a vector of 8, 0.47 of 16 on an
// AMD EPYC Zen 5, about all of a head's products' time when each head converted it again;
// SmolLM2 4096 deep, prefetching as above, against the step's rows prefetched at once: a call per
// head 1.04-1.22x, a call for all 1.09-1.39x). Each query's operations and their order are those
// of its row alone: its steps are its own, a step's softmax takes only its keys, and a call of
// kv_accum ends where a row's keys end, the rows still in it going on in the next. So the grouping
// changes no result. With `part` (a part of the rows' keys), row i's head j's state goes to
// part + i * part_stride + j * (hd + 2) instead of to out: its maximum, total and unnormalised sums.
void attend_direct(const KernelTable &k, const float *q, const AttentionRun &run, int layer, const AttentionShape &sh,
                   int r0, int nr, const KeyRange *kr, int g, int h0, int hn, float *out, float *mem, float *part,
                   size_t part_stride) {
    const KvCache &cache = *run.cache;
    const int hd = sh.head_dim, off = g * hd, h_first = g * (sh.n_heads / sh.n_kv_heads) + h0, nq = nr * hn;
    const auto kdot = k.kv_dot[(int)cache.type_k()];
    const auto vacc = k.kv_accum[(int)cache.type_v()];
    const int begin = kr[0].begin, end = kr[nr - 1].end;
    Carve carve{mem};
    const DirectMemory dm = carve_direct(carve, nq, hd);
    float *s = dm.s, *qs = dm.q, *o = dm.o;
    for (int i = 0; i < nr; i++)  // the rows' queries, one after another
        std::memcpy(qs + (size_t)i * hn * hd, q + ((size_t)(run.first_row + r0 + i) * sh.n_heads + h_first) * hd,
                    sizeof(float) * hn * hd);
    std::fill(o, o + (size_t)nq * hd, 0.0f);
    float m[kMaxDirectQueries], l[kMaxDirectQueries];
    std::fill(m, m + nq, -INFINITY);
    std::fill(l, l + nq, 0.0f);
    const HeadLines k_lines = head_lines(cache.type_k(), off, hd), v_lines = head_lines(cache.type_v(), off, hd);
    prefetch_first_rows(cache, layer, begin, end, k_lines, v_lines);
    for (int p0 = begin, n; p0 < end; p0 += n) {
        n = std::min(kBlockKeys, end - p0);
        // The step's rows in calls of kDirectRows, each prefetching the rows kDirectAhead on
        for (int p = p0, len; p < p0 + n; p += len) {
            len = std::min(kDirectRows, KvCache::run_in_block(p, p0 + n));
            if (const int a = p + kDirectAhead; a < end)
                prefetch_rows_l2(cache.k_row(layer, a), cache.row_bytes_k(), std::min(len, end - a), k_lines);
            kdot(cache.k_row(layer, p), cache.row_bytes_k(), len, off, qs, nq, hd, s + (p - p0), kBlockKeys);
        }
        for (int i = 0; i < nq; i++) {
            const int ni = std::min(n, kr[i / hn].end - p0);  // the query's keys in the step
            if (ni <= 0) continue;  // its row's keys ended before the step
            float *si = s + i * kBlockKeys, *oi = o + (size_t)i * hd;
            for (int j = 0; j < ni; j++) si[j] *= sh.scale;
            if (sh.softcap > 0) k.softcap(si, (size_t)ni, sh.softcap);
            const float m_new = std::max(m[i], k.reduce_max(si, ni)), alpha = std::exp(m[i] - m_new);
            l[i] = l[i] * alpha + k.exp_shift_sum(si, ni, m_new), m[i] = m_new;
            if (alpha != 1.0f)
                for (int d = 0; d < hd; d++) oi[d] *= alpha;
        }
        int first = 0;  // the first row with keys from p on: it and the rows after it take the call
        for (int p = p0, len; p < p0 + n; p += len) {
            while (kr[first].end <= p) first++;
            len = std::min({kDirectRows, KvCache::run_in_block(p, p0 + n), kr[first].end - p});
            if (const int a = p + kDirectAhead; a < end)
                prefetch_rows_l2(cache.v_row(layer, a), cache.row_bytes_v(), std::min(len, end - a), v_lines);
            vacc(s + (size_t)first * hn * kBlockKeys + (p - p0), kBlockKeys, (nr - first) * hn, len, cache.v_row(layer, p),
                 cache.row_bytes_v(), off, hd, o + (size_t)first * hn * hd, hd);
        }
    }
    for (int i = 0; i < nq; i++) {
        const float *oi = o + (size_t)i * hd;
        if (part) {
            float *pi = part + (size_t)(i / hn) * part_stride + (size_t)(i % hn) * (hd + 2);
            pi[0] = m[i], pi[1] = l[i];
            std::memcpy(pi + 2, oi, sizeof(float) * hd);
            continue;
        }
        float *dst = out + ((size_t)(run.first_row + r0 + i / hn) * sh.n_heads + h_first + i % hn) * hd;
        const float inv = 1.0f / l[i];
        for (int d = 0; d < hd; d++) dst[d] = oi[d] * inv;
    }
}

// A row's heads [h0, h0 + hn) from the states of its n_parts parts (attend_direct's `part`, one
// every per_part floats), in part order: the largest maximum, each part's total and sums scaled by
// exp(its maximum - that), the sums over the total.
void merge_parts(const float *parts, size_t per_part, int n_parts, int hn, int hd, float *out) {
    const size_t ostride = (size_t)hd + 2;
    for (int i = 0; i < hn; i++) {
        float mx = -INFINITY;
        for (int c = 0; c < n_parts; c++) mx = std::max(mx, parts[c * per_part + i * ostride]);
        float *o = out + (size_t)i * hd;
        std::fill(o, o + hd, 0.0f);
        float l = 0.0f;
        for (int c = 0; c < n_parts; c++) {
            const float *pc = parts + c * per_part + i * ostride;
            if (pc[1] == 0.0f) continue;  // a part without keys
            const float w = std::exp(pc[0] - mx);
            l += w * pc[1];
            for (int d = 0; d < hd; d++) o[d] += w * pc[2 + d];
        }
        const float inv = 1.0f / l;
        for (int d = 0; d < hd; d++) o[d] *= inv;
    }
}

}  // namespace

size_t attention_scratch_floats(int n_threads, int head_dim, int64_t kv_dim) {
    return (size_t)n_threads * block_floats(head_dim, kv_dim);
}

AttentionScratch make_attention_scratch(float *memory, int head_dim, int64_t kv_dim) {
    AttentionScratch s;
    if (!memory) return s;
    s.blocks = memory, s.blocks_stride = block_floats(head_dim, kv_dim);
    return s;
}

void attention(const KernelTable &k, const float *q, const AttentionRun *runs, int n_runs, int layer,
               const AttentionShape &sh, float *out, const AttentionScratch &sc, ThreadPool &pool) {
    // Tasks of all the runs in one job (32 sessions decoding together are 32 runs of one row: a
    // job per run would leave the threads waiting on each other 32 times per layer). A prompt's
    // run goes in blocks, a task per (block of rows, KV head, block of its query heads); so does a
    // decoding run whose KV heads have kDecodeGroupBlocked query heads or more, each of its tasks
    // then taking a KV head's group of heads. Other decoding runs take a task per (group of rows,
    // KV head, block of its heads, part of its keys: attend_direct, read_together, key_parts).
    const int group = sh.n_heads / sh.n_kv_heads;
    auto direct = [&](const AttentionRun &r) { return r.T < kAttentionBlockRows && group < kDecodeGroupBlocked; };
    // The direct runs' groups of rows, run i's from first_group[i] (thread_local, kept between
    // calls: the workers reach them through the pointers below, their own copies being others)
    static thread_local std::vector<RowGroup> row_groups;
    static thread_local std::vector<int> first_group;
    row_groups.clear(), first_group.assign((size_t)n_runs + 1, 0);
    // Decoding rows' groups are cut in as many blocks of heads as it takes to give every thread a
    // task (Qwen2.5-0.5B has 2 KV heads: one row would be 2 tasks). A query's sums do not depend
    // on the others of its block, so the cut changes no result, only the sharing of conversions.
    int64_t decode_rows = 0;  // a direct run's groups of rows count as one
    for (int i = 0; i < n_runs; i++) {
        first_group[i] = (int)row_groups.size();
        const AttentionRun &r = runs[i];
        if (!direct(r)) {
            decode_rows += r.T < kAttentionBlockRows ? r.T : 0;
            continue;
        }
        for (int row = 0; row < r.T; row++) {
            if (row > 0 && read_together(r, sh, row - 1, row)) row_groups.back().nr++;
            else row_groups.push_back({i, row, 1, key_parts(r, sh, row), 0}), decode_rows++;
        }
    }
    first_group[n_runs] = (int)row_groups.size();
    const int64_t decode_groups = decode_rows * sh.n_kv_heads;
    const int cut = decode_rows ? (int)std::min<int64_t>(group, (pool.n_threads() + decode_groups - 1) / decode_groups) : 1;
    struct Blocks {
        int hn, head_blocks, rows;
        int64_t per_rows;  // tasks per block of rows
    };
    auto blocks_of = [&](int hn) {
        const int head_blocks = (group + hn - 1) / hn;
        return Blocks{hn, head_blocks, std::max(1, kBlockQueries / hn), (int64_t)sh.n_kv_heads * head_blocks};
    };
    const Blocks prompt = blocks_of(std::min(group, kBlockQueries));
    const Blocks decode = blocks_of(std::min((group + cut - 1) / cut, kBlockQueries));
    auto blocks_for = [&](const AttentionRun &r) -> const Blocks & { return r.T < kAttentionBlockRows ? decode : prompt; };
    // A prompt's blocks of rows go in groups (attend_blocks), each group every n_groups-th block
    // (so that the groups take about as many keys each), as many groups as it takes to give each
    // thread two tasks, and no group more blocks than max_group.
    const int most = max_group(sh.head_dim);
    auto n_groups = [&](const AttentionRun &r) -> int64_t {
        const Blocks &b = blocks_for(r);
        const int64_t n_blocks = (r.T + b.rows - 1) / b.rows;
        if (r.T < kAttentionBlockRows) return n_blocks;
        const int64_t fill = (2 * pool.n_threads() + b.per_rows - 1) / b.per_rows;
        return std::max((n_blocks + most - 1) / most, std::min(n_blocks, fill));
    };
    // The parts' states, a slot of decode.hn heads per (row, block of heads, part): their size
    // follows the call's rows and keys, not the planned scratch's threads, so the calling thread
    // keeps them between calls.
    const size_t slot = (size_t)decode.hn * (sh.head_dim + 2);
    int64_t n_slots = 0;
    for (RowGroup &rg : row_groups)
        if (rg.n_parts > 1) rg.slot0 = n_slots, n_slots += decode.per_rows * rg.n_parts * rg.nr;
    static thread_local std::vector<float> part_states;
    if (part_states.size() < (size_t)n_slots * slot) part_states.resize((size_t)n_slots * slot);
    float *const states = part_states.data();
    const RowGroup *const groups = row_groups.data();
    const int *const firsts = first_group.data();
    auto tasks_of = [&](int i) {
        if (!direct(runs[i])) return n_groups(runs[i]) * blocks_for(runs[i]).per_rows;
        int64_t n = 0;
        for (int j = firsts[i]; j < firsts[i + 1]; j++) n += decode.per_rows * groups[j].n_parts;
        return n;
    };
    int64_t total = 0;
    for (int i = 0; i < n_runs; i++) total += tasks_of(i);
    // A direct run's tasks: group of rows by group, each group's (KV head, block of heads) by (part
    // of its keys).
    struct DirectTask {
        int group, part;
        int64_t blk;
        int g, h0, hn;  // KV head g's heads [h0, h0 + hn)
    };
    auto direct_task = [&](int i, int64_t local) {
        for (int j = firsts[i];; j++) {
            const int n_parts = groups[j].n_parts;
            const int64_t n = decode.per_rows * n_parts;
            if (local < n) {
                const int64_t blk = local / n_parts;
                const int g = (int)(blk / decode.head_blocks), h0 = (int)(blk % decode.head_blocks) * decode.hn;
                return DirectTask{j, (int)(local % n_parts), blk, g, h0, std::min(decode.hn, group - h0)};
            }
            local -= n;
        }
    };
    pool.parallel_for(total, [&](int64_t first, int64_t last, int tid) {
        float *mem = sc.blocks + (size_t)tid * sc.blocks_stride;
        int i = 0;
        int64_t base = 0;  // the first task of run i
        for (int64_t task = first; task < last; task++) {
            while (task >= base + tasks_of(i)) base += tasks_of(i++);
            const AttentionRun &run = runs[i];
            const int64_t local = task - base;
            if (direct(run)) {  // (group of rows, KV head, block of its heads, part of its keys)
                const DirectTask t = direct_task(i, local);
                const RowGroup &rg = groups[t.group];
                KeyRange kr[kStepRows];
                for (int j = 0; j < rg.nr; j++) kr[j] = key_part(row_keys(run, sh, rg.r0 + j), t.part, rg.n_parts);
                float *part = rg.n_parts > 1 ? states + (size_t)(rg.slot0 + (t.blk * rg.n_parts + t.part) * rg.nr) * slot : nullptr;
                attend_direct(k, q, run, layer, sh, rg.r0, rg.nr, kr, t.g, t.h0, t.hn, out, mem, part, slot);
                continue;
            }
            const Blocks &b = blocks_for(run);
            const bool lanes = k.attn_lanes[(int)KvType::F32] && run.T < kAttentionBlockRows && sh.head_dim % 8 == 0;
            const int64_t n_blocks = (run.T + b.rows - 1) / b.rows, groups_of_blocks = n_groups(run);
            const int j = (int)(groups_of_blocks - 1 - local / b.per_rows);  // the group of the last block (the most keys) first
            const int g = (int)(local % b.per_rows / b.head_blocks), h0 = (int)(local % b.head_blocks) * b.hn;
            const BlockGroup bg{g, h0, std::min(b.hn, group - h0), b.rows, j, (int)groups_of_blocks,
                                (int)((n_blocks - j + groups_of_blocks - 1) / groups_of_blocks)};
            if (lanes) attend_lanes(k, q, run, layer, sh, bg, out, mem);
            else attend_blocks(k, q, run, layer, sh, bg, out, mem);
        }
    }, 1);  // one task at a time: a prompt's tasks are few, long, and uneven
    for (const RowGroup &rg : row_groups) {  // the parts' states merged, row by row
        if (rg.n_parts == 1) continue;
        for (int64_t blk = 0; blk < decode.per_rows; blk++) {
            const int g = (int)(blk / decode.head_blocks), h0 = (int)(blk % decode.head_blocks) * decode.hn;
            for (int j = 0; j < rg.nr; j++) {
                const int row = runs[rg.run].first_row + rg.r0 + j;
                merge_parts(states + (size_t)(rg.slot0 + blk * rg.n_parts * rg.nr + j) * slot, (size_t)rg.nr * slot,
                            rg.n_parts, std::min(decode.hn, group - h0), sh.head_dim,
                            out + ((size_t)row * sh.n_heads + g * group + h0) * sh.head_dim);
            }
        }
    }
}

}  // namespace ops
}  // namespace fastllm
