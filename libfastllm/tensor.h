// tensor.h — a typed, non-owning view of a weight matrix or vector (usually into the mmapped file).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace fastllm {

// Values are the .flm dtype codes (docs/flm_format.md).
enum class DType : uint32_t { F32 = 0, F16 = 1, BF16 = 2, Q8 = 3, Q4_32 = 4, Q4_64 = 5, Q4_128 = 6, Q4M_32 = 7 };
constexpr int kNumDTypes = 8;

inline bool dtype_is_known(uint32_t code) { return code < (uint32_t)kNumDTypes; }
inline bool dtype_is_quantized(DType t) { return (uint32_t)t >= 3; }
inline bool dtype_is_q4(DType t) { return (uint32_t)t >= 4; }
inline bool dtype_has_min(DType t) { return t == DType::Q4M_32; }
// Weights per scale of a quantized type (1 for plain types).
inline int dtype_group(DType t) {
    switch (t) {
    case DType::Q4_64: return 64;
    case DType::Q4_128: return 128;
    case DType::Q8:
    case DType::Q4_32:
    case DType::Q4M_32: return 32;
    default: return 1;
    }
}
// What K (the row length) must be a multiple of.
inline int dtype_row_multiple(DType t) {
    if (!dtype_is_quantized(t)) return 1;
    return dtype_is_q4(t) ? (dtype_group(t) > 64 ? dtype_group(t) : 64) : 32;
}
inline size_t dtype_size(DType t) { return t == DType::F32 ? 4 : 2; }  // plain types only
inline const char *dtype_name(DType t) {
    switch (t) {
    case DType::F32: return "f32";
    case DType::F16: return "f16";
    case DType::BF16: return "bf16";
    case DType::Q8: return "q8";
    case DType::Q4_32: return "q4";
    case DType::Q4_64: return "q4_g64";
    case DType::Q4_128: return "q4_g128";
    case DType::Q4M_32: return "q4m";
    }
    return "?";
}

inline uint64_t align64(uint64_t n) { return (n + 63) / 64 * 64; }
// Bytes of the scales (+ minimums) region of a quantized [rows, cols] matrix, padded to 64.
inline uint64_t quant_scales_bytes(DType t, uint64_t rows, uint64_t cols) {
    uint64_t n = rows * (cols / dtype_group(t)) * 2;
    return align64(dtype_has_min(t) ? 2 * n : n);
}
// Bytes a tensor of this dtype and shape occupies in the file.
inline uint64_t tensor_bytes(DType t, uint64_t rows, uint64_t cols) {
    if (!dtype_is_quantized(t)) return rows * cols * dtype_size(t);
    return quant_scales_bytes(t, rows, cols) + rows * (dtype_is_q4(t) ? cols / 2 : cols);
}

// A quantized matrix's rows, as the kernels see them (see docs/flm_format.md).
struct QuantRows {
    const uint16_t *scales;  // f16, K/G per row
    const uint16_t *mins;    // f16, K/G per row; nullptr unless q4m
    const uint8_t *quants;   // K (q8) or K/2 (q4) bytes per row
    int group;               // G
};

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
    // Quantized types: the rows from r on.
    QuantRows quant_rows(int64_t r) const {
        const int64_t K = cols(), G = dtype_group(dtype), per_row = K / G;
        const uint16_t *scales = (const uint16_t *)data;
        const uint8_t *quants = (const uint8_t *)data + quant_scales_bytes(dtype, rows(), K);
        QuantRows q;
        q.scales = scales + r * per_row;
        q.mins = dtype_has_min(dtype) ? scales + rows() * per_row + r * per_row : nullptr;
        q.quants = quants + r * (dtype_is_q4(dtype) ? K / 2 : K);
        q.group = (int)G;
        return q;
    }
};

}  // namespace fastllm
