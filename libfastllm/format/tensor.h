// tensor.h — a typed, non-owning view of a weight matrix or vector (usually into the mmapped file),
// the dtypes of the .flm format and the sizes of their layout in the file. How a backend reads that
// layout is its own (cpu/tile_layout.h); the KV cache's row format is arch/kv_format.h.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

namespace fastllm {

// Values are the .flm dtype codes (docs/flm_format.md).
enum class DType : uint32_t {
    F32 = 0, F16 = 1, BF16 = 2, Q8 = 3, Q4_32 = 4, Q4_64 = 5, Q4_128 = 6, Q4M_32 = 7, Q6 = 8, Q4K = 9, Q6K = 10,
    Q3K = 11, Q5K = 12
};
constexpr int kNumDTypes = 13;
// K formats (q3k, q4k, q5k, q6k): a group's scale (and minimum) is an 8-bit code times an f16 factor per row
// and super-block of kSuperBlock weights (the last super-block of a row may be shorter).
constexpr int kSuperBlock = 256;

// The facts about each dtype, in one table indexed by the enum (checked below).
struct DTypeTraits {
    DType type;
    const char *name;
    bool quantized;
    int bits;          // per stored code (quantized) or element (plain)
    int group;         // weights per scale (1 for plain types)
    bool has_min;      // a minimum per group beside the scale (q4m, q4k)
    int row_multiple;  // what K (the row length) must be a multiple of: q4 / q6 blocks go in pairs
    bool k_scales;     // scales (and minimums) as 8-bit codes per group times f16 per super-block
};
inline constexpr DTypeTraits kDTypes[kNumDTypes] = {
    {DType::F32, "f32", false, 32, 1, false, 1, false},      {DType::F16, "f16", false, 16, 1, false, 1, false},
    {DType::BF16, "bf16", false, 16, 1, false, 1, false},    {DType::Q8, "q8", true, 8, 32, false, 32, false},
    {DType::Q4_32, "q4", true, 4, 32, false, 64, false},     {DType::Q4_64, "q4_g64", true, 4, 64, false, 64, false},
    {DType::Q4_128, "q4_g128", true, 4, 128, false, 128, false}, {DType::Q4M_32, "q4m", true, 4, 32, true, 64, false},
    {DType::Q6, "q6", true, 6, 32, false, 64, false},        {DType::Q4K, "q4k", true, 4, 32, true, 64, true},
    {DType::Q6K, "q6k", true, 6, 32, false, 64, true},       {DType::Q3K, "q3k", true, 3, 32, true, 64, true},
    {DType::Q5K, "q5k", true, 5, 32, true, 64, true},
};
constexpr bool dtype_table_in_enum_order() {
    for (int i = 0; i < kNumDTypes; i++)
        if ((int)kDTypes[i].type != i) return false;
    return true;
}
static_assert(dtype_table_in_enum_order(), "kDTypes must list the dtypes in the order of their codes");

inline bool dtype_is_known(uint32_t code) { return code < (uint32_t)kNumDTypes; }
inline const DTypeTraits &dtype_traits(DType t) { return kDTypes[(int)t]; }
inline bool dtype_is_quantized(DType t) { return dtype_traits(t).quantized; }
inline bool dtype_has_min(DType t) { return dtype_traits(t).has_min; }
inline int dtype_bits(DType t) { return dtype_traits(t).bits; }
inline int dtype_group(DType t) { return dtype_traits(t).group; }
inline int dtype_row_multiple(DType t) { return dtype_traits(t).row_multiple; }
inline bool dtype_k_scales(DType t) { return dtype_traits(t).k_scales; }
inline size_t dtype_size(DType t) { return (size_t)dtype_traits(t).bits / 8; }  // plain types only
inline const char *dtype_name(DType t) { return dtype_is_known((uint32_t)t) ? dtype_traits(t).name : "?"; }

inline uint64_t align64(uint64_t n) { return (n + 63) / 64 * 64; }

// Quantized matrices are stored in tiles of 16 rows (the last one padded with zero rows), laid out
// as the CPU kernels read them in place (docs/flm_format.md): per group, the 16 rows' f16 scales side by side; per block
// of 32 columns, 8 chunks of 64 bytes holding 4 consecutive codes of each of the 16 rows (q8), or
// for q4 the chunks of blocks 2p and 2p + 1 in the low and high nibbles of the same 64 bytes; q6
// keeps its low 4 bits as q4 does, each pair's 8 chunks followed by 4 chunks of the top 2 bits.
constexpr int kTileRows = 16;
inline uint64_t quant_tiles(uint64_t rows) { return (rows + kTileRows - 1) / kTileRows; }
// K formats replace the f16 scales by, in order: the 8-bit scale codes [tile][group][16], the
// minimum codes (same shape, q4k), the f16 scale factors [tile][super-block][16], the f16 minimum
// factors (q4k). A row's group g then has scale = factor[g / 8] * code[g] (minimum likewise).
inline uint64_t quant_super_blocks(uint64_t cols) { return (cols + kSuperBlock - 1) / kSuperBlock; }
// Bytes of the scales (+ minimums) region of a quantized [rows, cols] matrix, padded to 64.
inline uint64_t quant_scales_bytes(DType t, uint64_t rows, uint64_t cols) {
    const uint64_t r = quant_tiles(rows) * kTileRows, kinds = dtype_has_min(t) ? 2 : 1;
    if (dtype_k_scales(t)) return align64(kinds * r * (cols / dtype_group(t) + 2 * quant_super_blocks(cols)));
    return align64(kinds * r * (cols / dtype_group(t)) * 2);
}
// Bytes of one tile's codes.
inline uint64_t quant_tile_bytes(DType t, uint64_t cols) { return kTileRows * cols * dtype_bits(t) / 8; }
// Bytes a tensor of this dtype and shape occupies in the file.
inline uint64_t tensor_bytes(DType t, uint64_t rows, uint64_t cols) {
    if (!dtype_is_quantized(t)) return rows * cols * dtype_size(t);
    return quant_scales_bytes(t, rows, cols) + quant_tiles(rows) * quant_tile_bytes(t, cols);
}

// The stored (unsigned) code of row i (< 16), column c of a tile's codes with `bits` per code: the
// layout above, spelled out one weight at a time (the reference and the scalar kernels read it so).
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

// The inverse of tile_code: ORs a code into a tile's codes, zeroed before (format/quantize.cpp
// writes the file's tiles so).
inline void tile_put_code(uint8_t *codes, int bits, int i, int64_t c, int code) {
    const int64_t b = c / 32, chunk = (c % 32) / 4, at = i * 4 + c % 4;
    if (bits == 8) {
        codes[(b * 8 + chunk) * 64 + at] = (uint8_t)code;
        return;
    }
    uint8_t *pair = codes + (b / 2) * 128 * bits;
    if (bits == 3) {
        const int u = (int)(8 * (b % 2) + chunk);
        pair[(u % 4) * 64 + at] |= (uint8_t)((code & 3) << (2 * (u / 4)));
        pair[(4 + u % 2) * 64 + at] |= (uint8_t)((code >> 2 & 1) << (u / 2));
        return;
    }
    pair[chunk * 64 + at] |= (uint8_t)((code & 15) << (b % 2 == 0 ? 0 : 4));
    if (bits == 5) pair[(8 + chunk / 4) * 64 + at] |= (uint8_t)((code >> 4 & 1) << (b % 2 + 2 * (chunk % 4)));
    if (bits == 6) pair[(8 + chunk / 2) * 64 + at] |= (uint8_t)((code >> 4 & 3) << (2 * (b % 2) + 4 * (chunk % 2)));
}

// tile_put_code for row i's codes, one per column, with the bits fixed in each loop (one call per
// weight, its bits tested each time, took a tenth of a q8 conversion).
template <int Bits>
inline void tile_put_row_bits(uint8_t *codes, int i, const uint8_t *row, int64_t cols) {
    if (Bits == 8) {  // 4 columns lie together
        for (int64_t c = 0; c < cols; c += 4) std::memcpy(codes + ((c / 32) * 8 + (c % 32) / 4) * 64 + i * 4, row + c, 4);
        return;
    }
    if (Bits == 4) {  // a byte holds a column of a pair's first block and the same of its second
        for (int64_t c0 = 0; c0 < cols; c0 += 64) {
            const uint8_t *a = row + c0, *b = c0 + 32 < cols ? row + c0 + 32 : nullptr;
            uint8_t *pair = codes + (c0 / 64) * 512 + i * 4;
            for (int k = 0; k < 32; k += 4) {
                uint8_t v[4];
                for (int m = 0; m < 4; m++) v[m] = (uint8_t)(a[k + m] | (b ? b[k + m] << 4 : 0));
                std::memcpy(pair + (k / 4) * 64, v, 4);
            }
        }
        return;
    }
    for (int64_t c = 0; c < cols; c++) tile_put_code(codes, Bits, i, c, row[c]);
}
inline void tile_put_row(uint8_t *codes, int bits, int i, const uint8_t *row, int64_t cols) {
    switch (bits) {
    case 8: return tile_put_row_bits<8>(codes, i, row, cols);
    case 6: return tile_put_row_bits<6>(codes, i, row, cols);
    case 5: return tile_put_row_bits<5>(codes, i, row, cols);
    case 4: return tile_put_row_bits<4>(codes, i, row, cols);
    default: return tile_put_row_bits<3>(codes, i, row, cols);
    }
}

struct Tensor {
    std::string name;
    DType dtype = DType::F32;
    int n_dims = 0;
    int64_t dims[4] = {0, 0, 0, 0};  // outermost first: a matrix is [rows, cols]
    const void *data = nullptr;

    bool empty() const { return data == nullptr; }
    int64_t rows() const { return n_dims == 1 ? 1 : dims[0]; }
    int64_t cols() const { return dims[n_dims - 1]; }
    int64_t n_elements() const {
        int64_t n = 1;
        for (int i = 0; i < n_dims; i++) n *= dims[i];
        return n;
    }
    // Plain types only:
    size_t row_bytes() const { return (size_t)cols() * dtype_size(dtype); }
    const void *row(int64_t r) const { return (const char *)data + (size_t)r * row_bytes(); }
    const float *f32() const { return (const float *)data; }
};

}  // namespace fastllm
