// quantize_common.h — what quantize.cpp and each width of quantize_lanes.h share: numpy's
// rounding steps in scalar form.
#pragma once

#include <cstdint>
#include <limits>

#include "base/half.h"

namespace fastllm::quant {

constexpr int kMaxGroup = 128;  // the largest group (q4_g128); numpy's sums of up to 128 take one block
constexpr int kMaxLanes = 16;   // the widest LaneSearch (AVX-512)
constexpr float kInf = std::numeric_limits<float>::infinity();

// np.linspace(start, stop, num)[i].
inline double linspace(double start, double stop, int num, int i) {
    if (i == num - 1) return stop;
    const double step = (stop - start) / (num - 1);
    return (double)i * step + start;
}

// A float rounded to f16 and back, as numpy's astype(np.float16).astype(np.float32).
inline float to_f16(float v) { return f16_to_f32(f32_to_f16(v)); }

// The searches over groups in lanes (quantize_lanes.h) at one width: the symmetric formats', and the
// K formats' with a minimum and without.
struct LaneSearch {
    int lanes;
    void (*search)(const float *xt, int G, int neg, int pos, int zero, float *out_d, uint8_t *out_codes);
    void (*search_k_min)(const float *xt, int n_max, float *out_d, float *out_m);
    void (*search_k_sym)(const float *xt, int neg, int pos, float *out_d);
    void (*search_q4m)(const float *xt, int G, float *out_d, float *out_m);
    void (*widen_f16)(const uint16_t *h, int64_t n, float *out);  // exact: any width gives the same floats
};
// widen_f16 one value at a time (the baseline's, and the twin of the vector ones).
inline void widen_f16_scalar(const uint16_t *h, int64_t n, float *out) {
    for (int64_t i = 0; i < n; i++) out[i] = f16_to_f32(h[i]);
}
// bfloat16 bits to float32 (exact: the float's top half). A plain loop: compilers vectorize it, and
// it is no part of the search's time.
inline void widen_bf16(const uint16_t *h, int64_t n, float *out) {
    for (int64_t i = 0; i < n; i++) out[i] = bf16_to_f32(h[i]);
}
// Their AVX2 and AVX-512 builds (quantize_avx2.cpp, quantize_avx512.cpp); the functions are nullptr
// where those are not built (not x86-64).
extern const LaneSearch kAvx2Search, kAvx512Search;
// widen_f16 with F16C, 8 values an instruction (quantize_avx2.cpp, x86-64 only): both tables' (every
// CPU that cpu_features() counts as avx512 counts as avx2, F16C included).
void widen_f16_f16c(const uint16_t *h, int64_t n, float *out);

}  // namespace fastllm::quant
