// quantize.h — a float32 matrix to the bytes of a quantized .flm dtype, as the converter writes
// them (each group's scales searched, the weights rounded onto them, the file's tiles).
#pragma once

#include <cstdint>

#include "format/tensor.h"

namespace fastllm {

// Fills out (tensor_bytes(t, rows, cols) bytes) with w [rows][cols] stored as the quantized dtype t,
// byte for byte what converter/quantize.py's quantize() gives (its reference twin), on n_threads
// threads. Throws Error (INVALID_ARGUMENT) for a dtype that is not quantized or a row length that
// is not a multiple of the dtype's row_multiple.
void quantize_matrix(DType t, const float *w, int64_t rows, int64_t cols, int n_threads, uint8_t *out);

}  // namespace fastllm
