// quantize_avx2.cpp — the scale searches in 8 lanes, built with -mavx2 -mf16c (and, as every
// quantizer file, without fused multiply-adds) on x86-64; quantize.cpp takes it where the CPU has
// AVX2 (which cpu_features() counts only with F16C). Elsewhere this file builds nothing but the
// empty entry.
#include "format/quantize_common.h"

#if defined(__AVX2__) && defined(__F16C__)
#include <immintrin.h>

#define FASTLLM_QUANT_LANES 8
#define FASTLLM_QUANT_NAMESPACE avx2
#include "format/quantize_lanes.h"

namespace fastllm::quant {
void widen_f16_f16c(const uint16_t *h, int64_t n, float *out) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(h + i))));
    widen_f16_scalar(h + i, n - i, out + i);
}
const LaneSearch kAvx2Search = {avx2::kLanes,      avx2::search_symmetric, avx2::search_k_min,
                                avx2::search_k_sym, avx2::search_q4m,       widen_f16_f16c};
}  // namespace fastllm::quant
#else
namespace fastllm::quant {
const LaneSearch kAvx2Search = {0, nullptr, nullptr, nullptr, nullptr, nullptr};
}  // namespace fastllm::quant
#endif
