// AMX (tiles, int8) kernels: the AVX-512 table with a prompt's quantized products on the tile
// matrix unit. This file alone is compiled with the AVX-512 flags plus -mamx-tile -mamx-int8; its
// table is used only when CPUID reports AMX-TILE and AMX-INT8 and Linux grants the process the tile
// data (platform/cpu_features.cpp). Other systems and compilers get no AMX table.
//
// One TDPBSUD multiplies 16 tokens x 32 signed int8 activations (tile A: a block of each token,
// read in place) by 32 x 16 unsigned weight codes (tile B: a block of the weight tile's 16 rows,
// which the file stores in the layout B wants, 4 codes of each row per 64 bytes; 8-bit codes are
// read in place, narrower ones unpacked to bytes) into 16 x 16 exact int32 sums. The sums are then
// scaled a block at a time exactly as the AVX-512 kernel scales its own, so the two levels give the
// same bits and a token's result does not depend on the batch it came in. The activations' and
// the weights' scales change every 32 values, so the tile unit's K of 64 is never used whole
// (measured here: K = 32 takes the same 4.6 ns as K = 64), and the scaling, on the vector units,
// takes longer than the product.
#if (defined(__x86_64__) || defined(_M_X64)) && defined(__linux__) && defined(__AMX_INT8__) && defined(__AMX_TILE__) && \
    defined(__AMX_BF16__) && defined(__AVX512BF16__)
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "cpu/kernels.h"
#include "cpu/kernels_avx512.h"
#include "platform/platform.h"

namespace fastllm {

namespace {

// Two sets of tiles, each one block's product: sums 0 (16 tokens x 16 rows of int32), activations
// 2 (16 tokens x the block), codes 4 (the block of the 16 rows); and 1, 3, 5. While one set's
// product runs, the other's sums are stored, and the sums stored before them are scaled: a set is
// loaded again only after its product is out, so that no tile load waits for the unit.
struct TileConfig {
    uint8_t palette = 1, start_row = 0, reserved[14] = {};
    uint16_t colsb[16] = {64, 64, kActBlock, kActBlock, 64, 64};
    uint8_t rows[16] = {16, 16, 16, 16, kActBlock / 4, kActBlock / 4};
};
static_assert(sizeof(TileConfig) == 64, "LDTILECFG reads 64 bytes");

constexpr int kTokens = 16;       // a tile's rows
constexpr int kChunkBlocks = 32;  // blocks per pass over the tokens: 16 KiB of codes, in L1 with 16 tokens' activations

// The AVX-512 kernels by code width, for tokens that do not fill a tile (decoding, a prompt's last
// few): the AVX-512 table, like this one, has one kernel per width.
KernelTable::QuantDot g_avx512_for_bits[9] = {};

// acc[t] += (d[t] * sums of token t, block b - zero * ds[t]) * scale, or with a minimum
// d[t] * sums * scale + min * ds[t], 16 rows wide: the AVX-512 kernel's finish_block, operation
// for operation, so that both levels give the same bits. A macro, not a function: the accumulators
// must stay in registers across the tile instructions, whose asm statements clobber memory. The
// activations' factors are read block-major (QuantActs' d_by_block), so that token t's is at a
// constant offset: read from the tokens' own rows, 16 pointers were spilled, and copying them here
// per row tile took a fifth of the time.
#define FASTLLM_AMX_SCALE(sums, b)                                                                               \
    do {                                                                                                         \
        const __m512 ws_ = _mm512_load_ps(ws[b]);                                                                \
        const float *d_ = db + (size_t)(b) * x.by_block_stride, *ds_ = dsb + (size_t)(b) * x.by_block_stride;    \
        if (kMin) {                                                                                              \
            const __m512 mn_ = _mm512_load_ps(mins[kMin ? (b) : 0]);                                             \
            _Pragma("GCC unroll 16") for (int t = 0; t < kTokens; t++) {                                         \
                const __m512 f = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_load_si512((const void *)((sums) + t * 16))), \
                                               _mm512_set1_ps(d_[t]));                                           \
                acc[t] = _mm512_fmadd_ps(f, ws_, acc[t]);                                                        \
                acc[t] = _mm512_fmadd_ps(mn_, _mm512_set1_ps(ds_[t]), acc[t]);                                   \
            }                                                                                                    \
        } else {                                                                                                 \
            alignas(64) float zds[kTokens];                                                                      \
            _mm512_store_ps(zds, _mm512_mul_ps(_mm512_set1_ps(-zero), _mm512_loadu_ps(ds_)));                    \
            _Pragma("GCC unroll 16") for (int t = 0; t < kTokens; t++) {                                         \
                const __m512 f = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512((const void *)((sums) + t * 16))), \
                                                 _mm512_set1_ps(d_[t]), _mm512_set1_ps(zds[t]));                 \
                acc[t] = _mm512_fmadd_ps(f, ws_, acc[t]);                                                        \
            }                                                                                                    \
        }                                                                                                        \
    } while (0)
// Block blk's product into tile set 0 or 1 (sums c, activations a, codes bt).
#define FASTLLM_AMX_ISSUE(c, a, bt, blk)                  \
    do {                                                  \
        _tile_loadd(a, q + (blk) * kActBlock, n);         \
        _tile_loadd(bt, codes + (blk) * 512, 64);         \
        _tile_zero(c);                                    \
        _tile_dpbsud(c, a, bt);                           \
    } while (0)

// The codes of blocks [b0, b0 + nb) of a tile of 3- to 6-bit codes, a byte each (unsigned, as
// the file's 8-bit codes are), each block 8 chunks of 64 bytes: the 8-bit layout, tile B's.
template <int kBits>
void unpack(const QuantTile &w, int b0, int nb, uint8_t *out) {
    for (int b = 0; b < nb; b += 2) {  // b0 and nb are even: these chunks hold pairs of blocks
        const uint8_t *cb = w.codes + (size_t)((b0 + b) / 2) * 128 * kBits;
        for (int j = 0; j < 8; j++) {
            __m512i lo, hi;
            decode_pair<kBits>(cb, j, lo, hi);
            _mm512_store_si512((void *)(out + b * 512 + j * 64), lo);
            _mm512_store_si512((void *)(out + (b + 1) * 512 + j * 64), hi);
        }
    }
}

template <int kBits, bool kMin>
void amx_tile_dot(const QuantTile &w, int rows, int n, const QuantActs &x, int full, float *y, size_t ldy) {
    const int n_blocks = n / kActBlock;
    const int group_shift = w.group == 128 ? 2 : w.group == 64 ? 1 : 0;
    const float zero = kMin ? 0.0f : (float)(1 << (kBits - 1));
    const __mmask16 rm = (__mmask16)((1u << rows) - 1);
    static const TileConfig config;
    _tile_loadconfig(&config);
    alignas(64) uint8_t unpacked[kBits == 8 ? 1 : kChunkBlocks * 512];
    alignas(64) int32_t sums[4][kTokens * 16];
    alignas(64) float ws[kChunkBlocks][16], mins[kMin ? kChunkBlocks : 1][16];
    for (int b0 = 0; b0 < n_blocks; b0 += kChunkBlocks) {
        const int nb = std::min(kChunkBlocks, n_blocks - b0);
        const uint8_t *codes = w.codes + (size_t)b0 * 512;  // 8-bit codes: read in place
        if (kBits != 8) unpack<kBits>(w, b0, nb, unpacked), codes = unpacked;
        for (int b = 0; b < nb; b++) {
            _mm512_store_ps(ws[b], group_scale(w, (b0 + b) >> group_shift));
            if (kMin) _mm512_store_ps(mins[kMin ? b : 0], group_min(w, (b0 + b) >> group_shift));
        }
        for (int t0 = 0; t0 < full; t0 += kTokens) {
            const int8_t *q = x.q + (size_t)t0 * n + (size_t)b0 * kActBlock;
            const float *db = x.d_by_block + (size_t)b0 * x.by_block_stride + t0;
            const float *dsb = x.ds_by_block + (size_t)b0 * x.by_block_stride + t0;
            float *yt = y + (size_t)t0 * ldy;
            __m512 acc[kTokens];
            _Pragma("GCC unroll 16") for (int t = 0; t < kTokens; t++) acc[t] = b0 ? _mm512_maskz_loadu_ps(rm, yt + t * ldy) : _mm512_setzero_ps();
            // Even blocks in set 0, odd ones in set 1 (tile numbers are constants of the
            // instructions); block b's sums are scaled two blocks after their store, in sums[b % 4].
            FASTLLM_AMX_ISSUE(0, 2, 4, 0);
            int b = 0;
            for (; b < nb; b += 2) {
                if (b + 1 < nb) FASTLLM_AMX_ISSUE(1, 3, 5, b + 1);
                _tile_stored(0, sums[b % 4], 64);
                if (b >= 2) FASTLLM_AMX_SCALE(sums[(b - 2) % 4], b - 2);
                if (b + 2 < nb) FASTLLM_AMX_ISSUE(0, 2, 4, b + 2);
                if (b + 1 < nb) _tile_stored(1, sums[(b + 1) % 4], 64);
                if (b >= 2) FASTLLM_AMX_SCALE(sums[(b - 1) % 4], b - 1);
            }
            for (b -= 2; b < nb; b++) FASTLLM_AMX_SCALE(sums[b % 4], b);
            _Pragma("GCC unroll 16") for (int t = 0; t < kTokens; t++) _mm512_mask_storeu_ps(yt + t * ldy, rm, acc[t]);
        }
    }
#undef FASTLLM_AMX_ISSUE
#undef FASTLLM_AMX_SCALE
    _tile_release();  // the tile state is large: a thread not using it is cheaper to switch
}

// Whole tiles of 16 tokens here; the rest (decoding, a prompt's tail) by the AVX-512 kernel.
template <int kBits>
void amx_dot(const QuantTile &w, int rows, int n, const QuantActs &x, int n_tok, float *y, size_t ldy) {
    const int full = x.d_by_block ? n_tok / kTokens * kTokens : 0;
    if (full > 0) {
        if (w.has_min()) amx_tile_dot<kBits, true>(w, rows, n, x, full, y, ldy);
        else amx_tile_dot<kBits, false>(w, rows, n, x, full, y, ldy);
    }
    if (full < n_tok)
        g_avx512_for_bits[kBits](w, rows, n, token_acts(x, n, full), n_tok - full, y + (size_t)full * ldy, ldy);
}

KernelTable::QuantDot quant_for_bits(int bits) {
    return bits == 8 ? amx_dot<8> : bits == 6 ? amx_dot<6> : bits == 5 ? amx_dot<5> : bits == 3 ? amx_dot<3> : amx_dot<4>;
}

// ---- A prompt's attention (KernelTable::attn_*): bf16 products, three per f32 product ----
//
// TDPBF16PS multiplies 16 rows x 32 bf16 (tile A) by 32 x 16 bf16 (tile B, stored as 16 rows of
// 16 pairs: B's rows 2r and 2r + 1 side by side) into 16 x 16 f32 sums. Each operand x is split
// into hi = bf16(x) and lo = bf16(x - hi); hi*hi + hi*lo + lo*hi is then x*y to within about
// 2^-17 |x y| (an f16 key or value is hi + lo exactly). All eight tiles are 16 x 64 bytes: sums
// 0 and 1 (two blocks of 16 outputs), A's halves 2 and 3, the two blocks' B halves 4-5 and 6-7.
struct BfTileConfig {
    uint8_t palette = 1, start_row = 0, reserved[14] = {};
    uint16_t colsb[16] = {64, 64, 64, 64, 64, 64, 64, 64};
    uint8_t rows[16] = {16, 16, 16, 16, 16, 16, 16, 16};
};
static_assert(sizeof(BfTileConfig) == 64, "LDTILECFG reads 64 bytes");
constexpr int kQ = KernelTable::kAttnQueries, kKeys = KernelTable::kAttnKeys;

// The halves of 32 floats (a's 16, then b's) as 32 bf16 each: hi = bf16(x) rounded to nearest
// even, lo = bf16(x - hi). VCVTNE2PS2BF16 reads denormal input as zero and flushes denormal
// output: a lo below 2^-126 (of an x below 2^-118) is lost, nothing an f16 or a probability holds.
inline void split32(__m512 a, __m512 b, __m512i &hi, __m512i &lo) {
    hi = (__m512i)_mm512_cvtne2ps_pbh(b, a);
    const __m512 ha = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_castsi512_si256(hi)), 16));
    const __m512 hb = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(hi, 1)), 16));
    lo = (__m512i)_mm512_cvtne2ps_pbh(_mm512_sub_ps(b, hb), _mm512_sub_ps(a, ha));
}
static_assert(kQ == kKeys, "queries, keys and values take attn_tile_halves each");

// The queries' halves, row-major (hi, then lo kQ * hd halves on), rows past nq up to a multiple of
// 32 zero: attn_step takes queries 32 at a time.
void attn_queries(const float *q, int nq, int hd, uint16_t *qt) {
    const int padded = (nq + 31) / 32 * 32;
    for (int i = 0; i < padded; i++)
        for (int c = 0; c < hd; c += 32) {
            const __mmask16 m = i < nq ? 0xffff : 0;
            __m512i h, l;
            split32(_mm512_maskz_loadu_ps(m, q + (size_t)i * hd + c), _mm512_maskz_loadu_ps(m, q + (size_t)i * hd + c + 16), h, l);
            _mm512_storeu_si512((void *)(qt + (size_t)i * hd + c), h);
            _mm512_storeu_si512((void *)(qt + kQ * hd + (size_t)i * hd + c), l);
        }
}

// One step of depth 32 for two blocks of 16 rows, into sums tiles 0 and 1: the first block's A
// halves (hi, then lo at al) into tiles 2, 3, the second's (lda bytes on) into 4, 5, B's halves
// (hi, then lo 512 halves on) into 6, 7, three products each. Each B tile serves both blocks of
// rows: B comes from L2 (a step's keys and values are 64 KiB at head_dim 64), and taken for 16
// rows at a time it held the products to a third of the unit's rate (Qwen2.5-0.5B pp8192).
// The tile numbers are spelled into the instructions: literals only.
inline void bf16_step2(const uint16_t *ah, const uint16_t *al, int lda, const uint16_t *b) {
    _tile_loadd(6, b, 64);
    _tile_loadd(2, ah, lda);
    _tile_loadd(7, b + 512, 64);
    _tile_loadd(3, al, lda);
    _tile_dpbf16ps(0, 2, 6);
    _tile_loadd(4, (const char *)ah + 16 * lda, lda);
    _tile_dpbf16ps(0, 2, 7);
    _tile_loadd(5, (const char *)al + 16 * lda, lda);
    _tile_dpbf16ps(1, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(0, 3, 6);
    _tile_dpbf16ps(1, 5, 6);
}

// The keys as tile B: for keys [16 kb, 16 kb + 16) and values [32 c, 32 c + 32), 16 rows (pairs of
// values) of 16 keys, hi then lo, 512 halves each, at ((kb * (hd / 32) + c) * 2 + half) * 512.
void attn_keys(const float *k, int n, int hd, uint16_t *kt) {
    const int chunks = hd / 32, n32 = (n + 31) / 32 * 32;
    for (int kb = 0; kb < n32 / 16; kb++)
        for (int c = 0; c < chunks; c++) {
            __m512 h[16], l[16];  // key j's 16 pairs (as floats, for the transpose)
            for (int j = 0; j < 16; j++) {
                const int key = kb * 16 + j;
                const __mmask16 m = key < n ? 0xffff : 0;
                __m512i hj, lj;
                split32(_mm512_maskz_loadu_ps(m, k + (size_t)key * hd + c * 32),
                        _mm512_maskz_loadu_ps(m, k + (size_t)key * hd + c * 32 + 16), hj, lj);
                h[j] = _mm512_castsi512_ps(hj), l[j] = _mm512_castsi512_ps(lj);
            }
            transpose16(h), transpose16(l);
            uint16_t *t = kt + (size_t)(kb * chunks + c) * 2 * 512;
            for (int r = 0; r < 16; r++) {
                _mm512_storeu_ps(t + r * 32, h[r]);
                _mm512_storeu_ps(t + 512 + r * 32, l[r]);
            }
        }
}

// The values as tile B: for keys [32 kc, 32 kc + 32) and values [16 db, 16 db + 16), 16 rows (pairs of
// keys) of 16 values, hi then lo, at ((kc * (hd / 16) + db) * 2 + half) * 512.
void attn_vals(const float *v, int n, int hd, uint16_t *vt) {
    const int n32 = (n + 31) / 32 * 32, dblocks = hd / 16;
    // value d of key a, then of key a + 1: halves d and 16 + d of the split
    alignas(64) static const uint16_t order[32] = {0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23,
                                                   8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
    const __m512i pairs = _mm512_load_si512((const void *)order);
    for (int kc = 0; kc < n32 / 32; kc++)
        for (int db = 0; db < dblocks; db++) {
            uint16_t *t = vt + (size_t)(kc * dblocks + db) * 2 * 512;
            for (int r = 0; r < 16; r++) {
                const int a = kc * 32 + 2 * r;
                __m512i h, l;
                split32(_mm512_maskz_loadu_ps(a < n ? 0xffff : 0, v + (size_t)a * hd + db * 16),
                        _mm512_maskz_loadu_ps(a + 1 < n ? 0xffff : 0, v + (size_t)(a + 1) * hd + db * 16), h, l);
                _mm512_storeu_si512((void *)(t + r * 32), _mm512_permutexvar_epi16(pairs, h));
                _mm512_storeu_si512((void *)(t + 512 + r * 32), _mm512_permutexvar_epi16(pairs, l));
            }
        }
}

// 2^x for finite x: 2^k * a polynomial of degree 5 in r = x - k, |r| <= 1/2 (fitted to 2^r,
// relative error 2.3e-7 in f32: the probabilities are carried to 2^-17 as bf16 halves).
inline __m512 exp2_16(__m512 x) {
    const __m512 k = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m512 r = _mm512_sub_ps(x, k);
    __m512 p = _mm512_set1_ps(0.001327647129073739f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.009675540961325169f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.05550713092088699f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.24022120237350464f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.6931469440460205f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0000001192092896f));
    return _mm512_scalef_ps(p, k);
}

// Lanes [lo, hi) of the 16 from j0.
inline __mmask16 lanes(int j0, int lo, int hi) {
    auto below = [](int k) { return k <= 0 ? 0u : k >= 16 ? 0xffffu : (1u << k) - 1; };
    return (__mmask16)(below(hi - j0) & ~below(lo - j0));
}

// A row of scores [0, n32) to its probabilities' halves in place (each 32: hi, then lo), those of
// keys outside [a, b) zero; returns the new maximum (m_old for a row without keys) and the sum.
// kFull (every key the row's, the common case) takes no masks (0.93 -> 0.89 ns a query and key).
template <bool kFull>
inline float softmax_row(float *si, int n32, int a, int b, float m_old, float &sum) {
    __m512 mx = _mm512_set1_ps(-INFINITY);
    if (kFull)
        for (int j0 = 0; j0 < n32; j0 += 16) mx = _mm512_max_ps(mx, _mm512_load_ps(si + j0));
    else
        for (int j0 = a / 16 * 16; j0 < b; j0 += 16) {
            const __mmask16 k = lanes(j0, a, b);
            mx = _mm512_mask_max_ps(mx, k, mx, _mm512_maskz_loadu_ps(k, si + j0));
        }
    const float m_new = a < b ? std::max(m_old, _mm512_reduce_max_ps(mx)) : m_old;
    const __m512 shift = _mm512_set1_ps(a < b ? m_new : 0.0f);
    __m512 sum0 = _mm512_setzero_ps(), sum1 = _mm512_setzero_ps();
    for (int j0 = 0; j0 < n32; j0 += 32) {
        __m512 e0, e1;
        if (kFull) {
            e0 = exp2_16(_mm512_sub_ps(_mm512_load_ps(si + j0), shift));
            e1 = exp2_16(_mm512_sub_ps(_mm512_load_ps(si + j0 + 16), shift));
        } else {
            const __mmask16 k0 = lanes(j0, a, b), k1 = lanes(j0 + 16, a, b);
            e0 = _mm512_maskz_mov_ps(k0, exp2_16(_mm512_sub_ps(_mm512_maskz_loadu_ps(k0, si + j0), shift)));
            e1 = _mm512_maskz_mov_ps(k1, exp2_16(_mm512_sub_ps(_mm512_maskz_loadu_ps(k1, si + j0 + 16), shift)));
        }
        sum0 = _mm512_add_ps(sum0, e0), sum1 = _mm512_add_ps(sum1, e1);
        __m512i h, lw;
        split32(e0, e1, h, lw);
        _mm512_store_si512((void *)(si + j0), h);
        _mm512_store_si512((void *)(si + j0 + 16), lw);
    }
    sum = _mm512_reduce_add_ps(_mm512_add_ps(sum0, sum1));
    return m_new;
}

// One step of a block of queries against n keys, 32 query rows at a time, so that their scores
// and probabilities stay in L1 from the products that make them to those that read them (a step's
// whole block of probabilities, 64 KiB, went to L2 and back: stores of them took a tenth of the
// softmax): the scores; per row, the maximum, 2^ of the scores less it, their sum, and those
// probabilities' halves, in place of the scores; the row's weighted values rescaled; the
// probabilities times the values. The tile unit's work is issued between the rows of the softmax
// of the rows before, a tile of outputs at a time (the previous 32 rows' weighted values, the next
// 32 rows' scores), so that it computes while the vector units take the exponentials: Qwen2.5-0.5B's
// heads (one thread, a block of 126 queries against 128 keys) took 0.80-0.89 ns a query and key one
// after the other, 0.70-0.75 so, against 0.43 for the tiles' work alone and 0.36 for the softmax
// alone: the two overlap little.
void attn_step(const uint16_t *qt, int nq, int hd, const uint16_t *kt, const uint16_t *vt, int n, const int *lo,
               const int *hi, float cap, float *m, float *l, float *o) {
    constexpr int kRows = 32;
    const int chunks = hd / 32, n32 = (n + 31) / 32 * 32, dblocks = hd / 16, key_tiles = n32 / 16;
    const uint16_t *qh = qt, *ql = qh + kQ * hd;
    // three blocks of rows' scores (the softmax's, the next rows' being made, the last rows' read
    // by their weighted values), rows of n32; in place of each chunk of 32 of a row's scores, then,
    // its probabilities' halves, hi then lo
    alignas(64) float sbuf[3][kRows * kKeys];
    alignas(64) float alpha[kRows];
    float sums[kRows];
    // the scores of rows [i0, i0 + 32) and keys [16 kb, 16 kb + 16)
    auto scores = [&](int i0, int kb, float *s) {
        _tile_zero(0);
        _tile_zero(1);
        for (int c = 0; c < chunks; c++)
            bf16_step2(qh + (size_t)i0 * hd + c * 32, ql + (size_t)i0 * hd + c * 32, hd * 2,
                       kt + (size_t)(kb * chunks + c) * 2 * 512);
        _tile_stored(0, s + kb * 16, n32 * 4);
        _tile_stored(1, s + 16 * n32 + kb * 16, n32 * 4);
    };
    // the weighted values of rows [i0, i0 + 32), values [16 db, 16 db + 16)
    auto values = [&](int i0, int db, const float *p) {
        float *oi = o + (size_t)i0 * hd + db * 16;
        _tile_loadd(0, oi, hd * 4);
        _tile_loadd(1, oi + 16 * hd, hd * 4);
        for (int kc = 0; kc < n32 / 32; kc++) {
            const uint16_t *pc = (const uint16_t *)(p + kc * 32);
            bf16_step2(pc, pc + 32, n32 * 4, vt + (size_t)(kc * dblocks + db) * 2 * 512);
        }
        _tile_stored(0, oi, hd * 4);
        _tile_stored(1, oi + 16 * hd, hd * 4);
    };
    static const BfTileConfig config;
    _tile_loadconfig(&config);
    for (int kb = 0; kb < key_tiles; kb++) scores(0, kb, sbuf[0]);
    const int groups = (nq + kRows - 1) / kRows;
    for (int g = 0; g < groups; g++) {
        const int i0 = g * kRows;
        float *s = sbuf[g % 3], *next = sbuf[(g + 1) % 3], *last = sbuf[(g + 2) % 3];
        // the tile unit's work for these rows' softmax: rounds [0, v) of the last rows' values,
        // then [v, v + k) of the next rows' scores
        const int v = g > 0 ? dblocks : 0, k = g + 1 < groups ? key_tiles : 0;
        int issued = 0;
        auto issue = [&](int upto) {
            for (; issued < upto; issued++)
                if (issued < v) values(i0 - kRows, issued, last);
                else scores(i0 + kRows, issued - v, next);
        };
        for (int r = 0; r < kRows; r++) {
            issue((r + 1) * (v + k) / kRows);
            const int i = i0 + r, a = i < nq ? lo[i] : 0, b = i < nq ? hi[i] : 0;
            float *si = s + (size_t)r * n32;
            if (cap > 0 && a < b) softcap_row(si + a, (size_t)(b - a), cap);
            // 2^-126 for the first keys (m = -inf): exp2_16 takes finite input, and 1e-38 of a
            // total and sums still 0 is 0; a row without keys here keeps its state (2^0)
            const float m_old = a < b ? m[i] : 0.0f;
            const float m_new = a == 0 && b == n32 ? softmax_row<true>(si, n32, 0, n32, m_old, sums[r])
                                                   : softmax_row<false>(si, n32, a, b, m_old, sums[r]);
            alpha[r] = a < b ? std::max(m_old - m_new, -126.0f) : 0.0f;
            if (a < b) m[i] = m_new;
        }
        issue(v + k);
        // the rescale factors in whole vectors, so that a row's does not depend on its place
        for (int r = 0; r < kRows; r += 16) _mm512_store_ps(alpha + r, exp2_16(_mm512_load_ps(alpha + r)));
        for (int r = 0; r < kRows && i0 + r < nq; r++) {
            l[i0 + r] = l[i0 + r] * alpha[r] + sums[r];
            if (alpha[r] == 1.0f) continue;
            const __m512 f = _mm512_set1_ps(alpha[r]);
            float *orow = o + (size_t)(i0 + r) * hd;
            for (int d = 0; d < hd; d += 16) _mm512_storeu_ps(orow + d, _mm512_mul_ps(f, _mm512_loadu_ps(orow + d)));
        }
    }
    for (int db = 0; db < dblocks; db++) values((groups - 1) * kRows, db, sbuf[(groups - 1) % 3]);
    _tile_release();
}

}  // namespace

const KernelTable *amx_kernels() {
    static const KernelTable *table = []() -> const KernelTable * {
        const KernelTable *avx512 = avx512_kernels();
        if (!avx512) return nullptr;
        for (const DTypeTraits &d : kDTypes)
            if (d.quantized) g_avx512_for_bits[d.bits] = avx512->dot_rows_quant[(int)d.type];
        static KernelTable t = with_quant_kernels(*avx512, quant_for_bits);
        t.isa = Isa::Amx;
        t.acts_by_block = true;
        if (platform::cpu_features().amx_bf16) {
            t.attn_queries = attn_queries, t.attn_keys = attn_keys, t.attn_vals = attn_vals;
            t.attn_step = attn_step;
        }
        return &t;
    }();
    return table;
}

}  // namespace fastllm
#else
#include "cpu/kernels.h"
namespace fastllm {
const KernelTable *amx_kernels() { return nullptr; }
}  // namespace fastllm
#endif
