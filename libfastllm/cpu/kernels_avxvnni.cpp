// AVX-VNNI kernels: the AVX2 table with its quantized products on 256-bit vpdpbusd, for the CPUs
// that have the instruction without AVX-512 (Intel's cores from Alder Lake on; AMD's Zen 5 has
// both). This file alone is compiled with -mavx2 -mfma -mf16c -mavxvnni, and builds empty where the
// compiler lacks the flag; its table is used only when CPUID reports AVX-VNNI.
#if (defined(__x86_64__) || defined(_M_X64)) && defined(__AVXVNNI__)
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "cpu/kernels.h"
#include "cpu/kernels_avx2.h"

namespace fastllm {

namespace {

inline __m256i dot4(__m256i sum, __m256i u8, __m256i s8) { return _mm256_dpbusd_avx_epi32(sum, u8, s8); }

// The AVX-512 kernel's arithmetic (kernels_avx512.cpp) on halves of 8 rows, for q8's own codes or
// codes decoded once into pre by unpack_half (one half, H = 1): one vpdpbusd with 4 bytes of a
// token's activations broadcast advances a half's 8 rows into int32 sums, a block at a time, and
// each block's scales (and zero point or minimum) are applied in f32. H halves from half0 (8H rows)
// and NT tokens share every load. Narrower codes streamed from memory take decode_halves
// (kernels_avx2.h), the same arithmetic.
// kStream: the weights come from memory, and are prefetched. kK, kMin as half_scale, half_min.
template <int kBits, int NT, int H, bool kK, bool kMin, bool kStream>
void tile_dot(const QuantTile &w, int half0, int n, const QuantActs &x0, float *y, size_t ldy, int n_rows, const uint8_t *pre) {
    const int n_blocks = n / kActBlock;
    HalfOutputs<kBits, kK, kMin, NT, H> out(w, half0, n, x0);
    static_assert(kBits == 8 || H == 1, "decoded codes are one half's");
    // Decoding takes two chains of sums a token and half (vpdpbusd's latency would bind).
    constexpr int kChains = NT * H < 4 ? 2 : 1;
    for (int b = 0; b < n_blocks; b++) {
        __m256i sum[kChains][H][NT];
        for (int c = 0; c < kChains; c++)
            for (int h = 0; h < H; h++)
                for (int t = 0; t < NT; t++) sum[c][h][t] = _mm256_setzero_si256();
        // q8: chunk j of block b, half h at 64 j + 32 h; decoded codes: chunk j of the pair's
        // block b % 2 at 64 j + 32 (b % 2)
        const uint8_t *cb = kBits == 8 ? w.codes + (size_t)b * 512 + half0 * 32 : pre + (size_t)(b / 2) * 512 + (b % 2) * 32;
        if (kStream && kBits == 8) prefetch_ahead(w.codes + (size_t)b * 512, 512);
        for (int j = 0; j < 8; j++)
            for (int h = 0; h < H; h++) {
                const __m256i v = _mm256_loadu_si256((const __m256i *)(cb + j * 64 + h * 32));
                for (int t = 0; t < NT; t++)
                    sum[j % kChains][h][t] = dot4(sum[j % kChains][h][t], v, out.acts4(t, b * kActBlock + 4 * j));
            }
        for (int h = 0; h < H; h++) {
            if (kChains == 2)
                for (int t = 0; t < NT; t++) sum[0][h][t] = _mm256_add_epi32(sum[0][h][t], sum[kChains - 1][h][t]);
            out.finish_block(b, h, sum[0][h]);
        }
    }
    out.store(y, ldy, n_rows);
}

// One half's passes over codes decoded once into pre (a prompt's), or q8's own, 4 tokens at a time;
// first_streams: the first pass reads the tile from memory.
template <int kBits, bool kK, bool kMin>
void half_passes(const QuantTile &w, int half, int n, const QuantActs &x, int n_tok, float *yh, size_t ldy, int n_rows,
                 const uint8_t *pre, bool first_streams) {
    constexpr int NT = 4;
    int t = 0;
    if constexpr (kBits == 8)  // q8's codes read in place: the first pass prefetches
        if (first_streams && n_tok >= NT) tile_dot<kBits, NT, 1, kK, kMin, true>(w, half, n, x, yh, ldy, n_rows, pre), t = NT;
    for (; t + NT <= n_tok; t += NT)
        tile_dot<kBits, NT, 1, kK, kMin, false>(w, half, n, token_acts(x, n, t), yh + t * ldy, ldy, n_rows, pre);
    const QuantActs rest = token_acts(x, n, t);
    switch (n_tok - t) {
    case 3: tile_dot<kBits, 3, 1, kK, kMin, false>(w, half, n, rest, yh + t * ldy, ldy, n_rows, pre); break;
    case 2: tile_dot<kBits, 2, 1, kK, kMin, false>(w, half, n, rest, yh + t * ldy, ldy, n_rows, pre); break;
    case 1: tile_dot<kBits, 1, 1, kK, kMin, false>(w, half, n, rest, yh + t * ldy, ldy, n_rows, pre); break;
    default: break;
    }
}

// NT tokens through both halves of a tile, streaming it from memory, straight from its codes.
template <int kBits, bool kK, bool kMin, int NT>
void stream_pass(const QuantTile &w, int rows, int n, const QuantActs &x, float *y, size_t ldy) {
    if constexpr (kBits < 8) decode_halves<kBits, kK, kMin, dot4, NT>(w, n, x, y, ldy, rows);
    else tile_dot<kBits, NT, 2, kK, kMin, true>(w, 0, n, x, y, ldy, rows, nullptr);
}

// Up to stream_tokens(kBits) tokens (decoding; a speculative step's rows, a few sessions decoding
// together) stream the tile: both halves a pass, each 64-byte line read once, 2 tokens a pass (3 in
// the last when their number is odd), the codes decoded again for each pass. Against a half at a
// time with the codes decoded once into bytes, as a prompt goes (AMD EPYC Zen 5 at this level, 2
// threads, `build/bench_quant_decode 2 7 DTYPES N`, share of the read rate): 2 tokens q4 54 -> 92%,
// q6k 62 -> 92%, q8 84 -> 97%; 3 tokens q4 88%; 4 tokens 50-58 -> 76-78%; 8 tokens 35-41 -> 43-48%.
// More tokens take a half at a time, the codes narrower than a byte decoded once for all passes.
template <int kBits, bool kK, bool kMin>
void dot_rows_form(const QuantTile &w, int rows, int n, const QuantActs &x, int n_tok, float *y, size_t ldy) {
    if (n_tok == 1) return stream_pass<kBits, kK, kMin, 1>(w, rows, n, x, y, ldy);
    if (n_tok <= stream_tokens(kBits)) {
        int t = 0;
        for (; n_tok - t > 3; t += 2) stream_pass<kBits, kK, kMin, 2>(w, rows, n, token_acts(x, n, t), y + t * ldy, ldy);
        if (n_tok - t == 3) stream_pass<kBits, kK, kMin, 3>(w, rows, n, token_acts(x, n, t), y + t * ldy, ldy);
        else stream_pass<kBits, kK, kMin, 2>(w, rows, n, token_acts(x, n, t), y + t * ldy, ldy);
        return;
    }
    for (int half = 0; half * 8 < rows; half++) {
        const int n_rows = std::min(8, rows - half * 8);
        uint8_t *pre = nullptr;
        // the tile comes from memory once, by the first half's unpacking or first pass (prefetched)
        if constexpr (kBits < 8) unpack_half<kBits>(w, half, n, pre = decoded_codes(n), half == 0);
        half_passes<kBits, kK, kMin>(w, half, n, x, n_tok, y + half * 8, ldy, n_rows, pre, half == 0);
    }
}

template <int kBits>
void dot_rows_quant(const QuantTile &w, int rows, int n, const QuantActs &x, int n_tok, float *y, size_t ldy) {
    with_scale_form<kBits>(w, [&](auto k, auto min) {
        dot_rows_form<kBits, decltype(k)::value, decltype(min)::value>(w, rows, n, x, n_tok, y, ldy);
    });
}

KernelTable::QuantDot quant_for_bits(int bits) {
    return bits == 8 ? dot_rows_quant<8> : bits == 6 ? dot_rows_quant<6> : bits == 5 ? dot_rows_quant<5>
         : bits == 3 ? dot_rows_quant<3> : dot_rows_quant<4>;
}

}  // namespace

const KernelTable *avxvnni_kernels() {
    static const KernelTable *table = []() -> const KernelTable * {
        const KernelTable *avx2 = avx2_kernels();
        if (!avx2) return nullptr;  // not built: cannot happen where this file is
        static KernelTable t = with_quant_kernels(*avx2, quant_for_bits);
        t.isa = Isa::AvxVnni;
        t.acts_by_block = false;
        return &t;
    }();
    return table;
}

}  // namespace fastllm
#else
#include "cpu/kernels.h"
namespace fastllm {
const KernelTable *avxvnni_kernels() { return nullptr; }
}  // namespace fastllm
#endif
