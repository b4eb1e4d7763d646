// kernels.h — the innermost loops, one implementation per instruction set.
//
// Each ISA file (kernels_scalar.cpp, kernels_avx2.cpp, kernels_avx512.cpp) fills a KernelTable;
// only the file compiled for an ISA uses its instructions, and select_kernels() picks the best
// table the CPU supports at run time (CPUID), so one binary runs everywhere.
// The environment variable FASTLLM_ISA=scalar|avx2|avx512 forces a lower level.
#pragma once

#include <cstddef>
#include <cstdint>

#include "tensor.h"

namespace fastllm {

enum class Isa { Scalar = 0, Avx2 = 1, Avx512 = 2 };
const char *isa_name(Isa isa);

struct KernelTable {
    Isa isa;
    // y[r] = dot(row r of w, x) for r < rows; row r starts at (char*)w + r*stride, holds n weights
    // of the table's dtype. Indexed by DType.
    void (*dot_rows[3])(const void *w, size_t stride, int rows, const float *x, int n, float *y);
    // dst[i] = float(src[i]) for n elements. Indexed by DType.
    void (*to_f32[3])(const void *src, float *dst, int n);
    // y[i] += a * x[i]
    void (*axpy)(float a, const float *x, float *y, int n);
};

// The tables this build and CPU can run; nullptr for an ISA the CPU (or build) lacks.
const KernelTable *kernels_for(Isa isa);
// Best supported ISA, lowered by FASTLLM_ISA if set. Decided once per process.
const KernelTable &kernels();

// Per-ISA factories (each defined in its own file; absent ones return nullptr).
const KernelTable *scalar_kernels();
const KernelTable *avx2_kernels();
const KernelTable *avx512_kernels();

// Portable scalar conversions, shared by all files.
float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);
inline float bf16_to_f32(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    __builtin_memcpy(&f, &bits, 4);
    return f;
}

}  // namespace fastllm
