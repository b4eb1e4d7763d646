// quantize.h — a float32 matrix to the bytes of a quantized .flm dtype, as the converter writes
// them (each group's scales searched, the weights rounded onto them, the file's tiles).
#pragma once

#include <cstdint>

#include "format/tensor.h"

namespace fastllm {

// Writes rows [first_row, first_row + n_rows) of the matrix [rows][cols], given in w, into out
// (the whole matrix's tensor_bytes(t, rows, cols) bytes) as the quantized dtype t: their tiles'
// scales and codes, and nothing of other tiles, so that parts of a matrix (a fused qkv's) can be
// written by separate calls. first_row must be a multiple of 16, and n_rows too unless the rows end
// the matrix. Byte for byte what converter/quantize.py's quantize() gives (its reference twin), on
// n_threads threads. Throws Error (INVALID_ARGUMENT) for a dtype that is not quantized, a row
// length that is not a multiple of the dtype's row_multiple, or rows out of those bounds.
void quantize_matrix(DType t, const float *w, int64_t rows, int64_t cols, int64_t first_row, int64_t n_rows,
                     int n_threads, uint8_t *out);
// The same with w as IEEE half-precision bits, each row widened (exactly) as it is quantized.
void quantize_matrix(DType t, const uint16_t *w, int64_t rows, int64_t cols, int64_t first_row, int64_t n_rows,
                     int n_threads, uint8_t *out);

}  // namespace fastllm
