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

}  // namespace fastllm
