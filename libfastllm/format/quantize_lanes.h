// quantize_lanes.h — the symmetric formats' scale search (q8, q6, q4 and its wider groups) over
// several groups at once, one group per vector lane, in GCC's vector extensions. Included once per
// width: by quantize.cpp with FASTLLM_QUANT_LANES 4 (the baseline: SSE2 on x86-64, NEON on aarch64)
// and by quantize_avx2.cpp with 8 (built with -mavx2), each in its own namespace
// fastllm::quant::FASTLLM_QUANT_NAMESPACE. No include guard, on purpose.
//
// In lanes every step is one operation on all the groups, and a group's numpy-ordered sums stay in
// its own lane. One group at a time, the sums across a vector and each candidate's chain of
// divisions, sums and f16 rounding left the vector units idle (a 512 x 4096 matrix to q8, one
// thread: 31 ns a weight; in 8 lanes 27, and 17 with the float64 division replaced below).
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "format/quantize_common.h"

namespace fastllm::quant::FASTLLM_QUANT_NAMESPACE {

constexpr int kLanes = FASTLLM_QUANT_LANES;
static_assert(kLanes <= kMaxLanes && kLanes % 2 == 0, "quantize.cpp holds at most kMaxLanes groups a batch");
typedef float VF __attribute__((vector_size(kLanes * 4)));
typedef int VI __attribute__((vector_size(kLanes * 4)));
typedef float HF __attribute__((vector_size(kLanes * 2)));   // half the lanes
typedef double HD __attribute__((vector_size(kLanes * 4)));  // half the lanes, as float64

inline VF load(const float *p) {
    VF v;
    std::memcpy(&v, p, sizeof v);
    return v;
}
inline VF abs(VF v) { return v < 0 ? -v : v; }
inline bool any(VI m) {
    uint64_t w[kLanes / 2];
    std::memcpy(w, &m, sizeof w);
    uint64_t o = 0;
    for (int i = 0; i < kLanes / 2; i++) o |= w[i];
    return o != 0;
}
// round_clip in every lane.
inline VF round_clip(VF v, float lo, float hi) {
    const VF l = VF{} + lo, h = VF{} + hi, magic = VF{} + 12582912.0f;
    v = v > l ? v : l;
    v = v < h ? v : h;
    return (v + magic) - magic;
}

// float32(x / d) with the division in float64, as numpy divides a float32 array by float64 scales
// (d in two halves of lanes). Dividing in float64 costs 2 cycles a value, most of the search;
// multiplying by r = float32(1 / d) gives a value within 3 2^-24 |v| of the rounded quotient v (r's
// rounding, the product's, v's own), so where x r lies further than 2^-20 |x r| from every
// half-integer, both round to the same code (and clipping to integer bounds keeps that). Lanes
// near a tie, and those in `exact` (r subnormal or infinite), are divided: the extreme weight of a
// group sits on a tie whenever a candidate's code range is a half-integer (q4: 3 candidates of 11).
// A scale of inf gives r = 0, which gives 0 (or NaN) as dividing does.
inline VF quotient(VF x, VF r, VI exact, HD d_lo, HD d_hi) {
    const VF magic = VF{} + 12582912.0f, v = x * r, f = v - ((v + magic) - magic);
    const VI near = ((0.5f - abs(f)) <= abs(v) * 0x1p-20f) | exact;
    if (!any(near)) return v;
    HF x_lo, x_hi;
    std::memcpy(&x_lo, &x, sizeof x_lo), std::memcpy(&x_hi, (const char *)&x + sizeof x_lo, sizeof x_hi);
    const HF q_lo = __builtin_convertvector(__builtin_convertvector(x_lo, HD) / d_lo, HF);
    const HF q_hi = __builtin_convertvector(__builtin_convertvector(x_hi, HD) / d_hi, HF);
    VF q;
    std::memcpy(&q, &q_lo, sizeof q_lo), std::memcpy((char *)&q + sizeof q_lo, &q_hi, sizeof q_hi);
    return near ? q : v;
}

// np_sum in every lane: acc[j] sums the values j, j + 8, ... (from 0 rather than value j, which
// changes only the sign of an all-zero sum, and the final 0 + makes that +0 in both).
struct LaneSums {
    VF acc[8] = {};
    void add(int i, VF v) { acc[i % 8] += v; }
    VF total() const { return VF{} + (((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]))); }
};

// _search_symmetric for kLanes groups of G values: xt holds them lane by lane (xt[i * kLanes + l]
// is value i of group l); out_d gets each group's f16 scale (as float) of least squared error for
// codes in [-neg, pos].
inline void search_symmetric(const float *xt, int G, int neg, int pos, float *out_d) {
    VF extreme = load(xt), amax = abs(extreme);  // np.abs(g).argmax(): the first of the largest
    for (int i = 1; i < G; i++) {
        const VF v = load(xt + i * kLanes), a = abs(v);
        extreme = a > amax ? v : extreme;
        amax = a > amax ? a : amax;
    }
    const float lo = (float)-neg, hi = (float)pos, fmin = std::numeric_limits<float>::min();
    const float fmax = std::numeric_limits<float>::max();
    VF errs[11], ds[11];
    for (int s = 0; s < 11; s++) {
        const double den = -neg + linspace(-1.0, 1.5, 11, s) * (neg / 8.0);
        double d0[kLanes], dd[kLanes];
        VF r;
        VI exact;
        for (int l = 0; l < kLanes; l++) {
            d0[l] = (double)extreme[l] / den, dd[l] = d0[l] != 0 ? d0[l] : (double)kInf;
            r[l] = (float)(1.0 / dd[l]);
            const float a = std::fabs(r[l]);
            exact[l] = a != 0 && !(a >= fmin && a <= fmax) ? -1 : 0;
        }
        HD d_lo, d_hi;
        std::memcpy(&d_lo, dd, sizeof d_lo), std::memcpy(&d_hi, dd + kLanes / 2, sizeof d_hi);
        LaneSums qq, gq;
        for (int i = 0; i < G; i++) {
            const VF x = load(xt + i * kLanes), q = round_clip(quotient(x, r, exact, d_lo, d_hi), lo, hi);
            qq.add(i, q * q);
            gq.add(i, x * q);
        }
        const VF sqq = qq.total(), sgq = gq.total();
        // numpy keeps d0 (float64) where qq is 0, which happens only when the group is all zeros (d0 = ±0)
        VF d;
        for (int l = 0; l < kLanes; l++) d[l] = to_f16(sqq[l] > 0 ? sgq[l] / sqq[l] : (float)d0[l]);
        const VF d2 = d != 0 ? d : VF{} + kInf;
        LaneSums err;
        for (int i = 0; i < G; i++) {
            const VF x = load(xt + i * kLanes), e = x - d * round_clip(x / d2, lo, hi);
            err.add(i, e * e);
        }
        errs[s] = err.total(), ds[s] = d;
    }
    for (int l = 0; l < kLanes; l++) {
        float best_err = kInf, best_d = 0.0f;
        for (int s = 0; s < 11; s++)
            if (errs[s][l] < best_err) best_err = errs[s][l], best_d = ds[s][l];
        out_d[l] = best_d;
    }
}

}  // namespace fastllm::quant::FASTLLM_QUANT_NAMESPACE
