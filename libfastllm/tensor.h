// tensor.h — a typed, non-owning view of a weight matrix or vector (usually into the mmapped file).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace fastllm {

// Values are the .flm dtype codes (docs/flm_format.md).
enum class DType : uint32_t { F32 = 0, F16 = 1, BF16 = 2 };

inline bool dtype_is_known(uint32_t code) { return code <= 2; }
inline size_t dtype_size(DType t) { return t == DType::F32 ? 4 : 2; }
inline const char *dtype_name(DType t) {
    switch (t) {
    case DType::F32: return "f32";
    case DType::F16: return "f16";
    case DType::BF16: return "bf16";
    }
    return "?";
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
    size_t row_bytes() const { return (size_t)cols() * dtype_size(dtype); }
    const void *row(int64_t r) const { return (const char *)data + (size_t)r * row_bytes(); }
    const float *f32() const { return (const float *)data; }
};

}  // namespace fastllm
