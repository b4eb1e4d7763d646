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
// w holds float32 values, or 16-bit floats (IEEE half or bfloat16 bits, as checkpoints and GGUF
// files keep them), each row widened (exactly) to float32 as it is quantized: the bytes are those of
// the widened matrix, with no float32 copy of it made.
enum class WeightBits { F32, F16, BF16 };
void quantize_matrix(DType t, WeightBits bits, const void *w, int64_t rows, int64_t cols, int64_t first_row,
                     int64_t n_rows, int n_threads, uint8_t *out);

}  // namespace fastllm
