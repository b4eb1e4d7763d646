// quantize_avx2.cpp — the scale searches in 8 lanes, built with -mavx2 (and, as every
// quantizer file, without fused multiply-adds) on x86-64; quantize.cpp takes it where the CPU has
// AVX2. Elsewhere this file builds nothing but the empty entry.
#include "format/quantize_common.h"

#if defined(__AVX2__)
#define FASTLLM_QUANT_LANES 8
#define FASTLLM_QUANT_NAMESPACE avx2
#include "format/quantize_lanes.h"

namespace fastllm::quant {
const LaneSearch kAvx2Search = {avx2::kLanes, avx2::search_symmetric, avx2::search_k_min, avx2::search_k_sym};
}  // namespace fastllm::quant
#else
namespace fastllm::quant {
const LaneSearch kAvx2Search = {0, nullptr, nullptr, nullptr};
}  // namespace fastllm::quant
#endif
