// quantize_avx512.cpp — the scale searches in 16 lanes, built with AVX-512 (F, BW, VL, DQ;
// every CPU that cpu_features() counts as avx512 has them) and, as every quantizer file, without
// fused multiply-adds, on x86-64; quantize.cpp takes it where the CPU has AVX-512. Elsewhere this
// file builds nothing but the empty entry.
#include "format/quantize_common.h"

#if defined(__AVX512F__)
#define FASTLLM_QUANT_LANES 16
#define FASTLLM_QUANT_NAMESPACE avx512
#include "format/quantize_lanes.h"

namespace fastllm::quant {
const LaneSearch kAvx512Search = {avx512::kLanes,      avx512::search_symmetric, avx512::search_k_min,
                                  avx512::search_k_sym, avx512::search_q4m,       widen_f16_f16c};
}  // namespace fastllm::quant
#else
namespace fastllm::quant {
const LaneSearch kAvx512Search = {0, nullptr, nullptr, nullptr, nullptr, nullptr};
}  // namespace fastllm::quant
#endif
