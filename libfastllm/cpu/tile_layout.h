// tile_layout.h — how the CPU kernels read a quantized matrix: in place, in the file's tiles of 16
// rows (format/tensor.h gives their sizes, docs/flm_format.md the layout). A backend with another
// layout repacks the file's tiles when it prepares the weights; this one needs no copy.
#pragma once

#include <cstdint>

#include "format/tensor.h"

namespace fastllm {

// One tile of a quantized matrix, as the kernels see it.
struct QuantTile {
    const uint16_t *scales;  // f16, [K/G][16]; nullptr for K formats
    const uint16_t *mins;    // f16, [K/G][16]; nullptr unless q4m
    const uint8_t *codes;    // K * 16 (q8), K * 12 (q6) or K * 8 (q4) bytes, in chunks of 64
    int group;               // G
    // K formats: scale of row i, group g = f16(k_scale[(g / 8) * 16 + i]) * k_scale_code[g * 16 + i],
    // minimum = f16(k_min[...]) * k_min_code[...] (k_min* nullptr for q6k); nullptr otherwise.
    const uint8_t *k_scale_code, *k_min_code;
    const uint16_t *k_scale, *k_min;
    bool has_min() const { return mins || k_min; }
};

// The tile of a quantized matrix W holding rows [r0, r0 + 16); r0 must be a multiple of 16.
inline QuantTile quant_tile(const Tensor &W, int64_t r0) {
    const int64_t K = W.cols(), G = dtype_group(W.dtype), per_tile = (K / G) * kTileRows, tile = r0 / kTileRows;
    const int64_t n_tiles = (int64_t)quant_tiles(W.rows());
    QuantTile q{};
    if (dtype_k_scales(W.dtype)) {
        const uint8_t *codes = (const uint8_t *)W.data;
        const int64_t all_codes = n_tiles * per_tile, per_tile_super = (int64_t)quant_super_blocks(K) * kTileRows;
        q.k_scale_code = codes + tile * per_tile;
        const uint16_t *factors = (const uint16_t *)(codes + all_codes * (dtype_has_min(W.dtype) ? 2 : 1));
        q.k_scale = factors + tile * per_tile_super;
        if (dtype_has_min(W.dtype)) {
            q.k_min_code = codes + all_codes + tile * per_tile;
            q.k_min = factors + n_tiles * per_tile_super + tile * per_tile_super;
        }
    } else {
        const uint16_t *scales = (const uint16_t *)W.data;
        q.scales = scales + tile * per_tile;
        q.mins = dtype_has_min(W.dtype) ? scales + n_tiles * per_tile + tile * per_tile : nullptr;
    }
    q.codes = (const uint8_t *)W.data + quant_scales_bytes(W.dtype, W.rows(), K) + tile * quant_tile_bytes(W.dtype, K);
    q.group = (int)G;
    return q;
}

// The stored (unsigned) code of row i (< 16), column c of a tile's codes with `bits` per code; the
// file's layout (format/tensor.h), spelled out one weight at a time (the reference and the scalar kernels read it so).
// q5 keeps the low 4 bits as q4 does, each pair's 8 chunks followed by 2 chunks of top bits: bit
// b + 2s of top chunk h is block b's chunk 4h + s. q3: per pair of blocks, 4 chunks of the low 2
// bits (bits 2k, 2k + 1 of chunk u % 4, k = u / 4) and 2 of the top bit (bit u / 2 of chunk
// 4 + u % 2), u = 8 * (block in pair) + chunk.
inline int tile_code(const uint8_t *codes, int bits, int i, int64_t c) {
    const int64_t b = c / 32, chunk = (c % 32) / 4, at = i * 4 + c % 4;  // block, chunk in it, byte in chunk
    if (bits == 8) return codes[(b * 8 + chunk) * 64 + at];
    const uint8_t *pair = codes + (b / 2) * 128 * bits;  // 16 rows x 64 columns x bits
    if (bits == 3) {
        const int u = (int)(8 * (b % 2) + chunk);
        return (pair[(u % 4) * 64 + at] >> (2 * (u / 4)) & 3) | (pair[(4 + u % 2) * 64 + at] >> (u / 2) & 1) << 2;
    }
    const int low = b % 2 == 0 ? (pair[chunk * 64 + at] & 15) : (pair[chunk * 64 + at] >> 4);
    if (bits == 4) return low;
    if (bits == 5) return low | ((pair[(8 + chunk / 4) * 64 + at] >> (b % 2 + 2 * (chunk % 4))) & 1) << 4;
    return low | ((pair[(8 + chunk / 2) * 64 + at] >> (2 * (b % 2) + 4 * (chunk % 2))) & 3) << 4;
}

}  // namespace fastllm
