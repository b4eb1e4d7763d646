// quantize_lanes.h — the scale searches of the symmetric formats (q8, q6, q4 and its wider groups)
// and of the K formats over several groups at once, one group per vector lane, in GCC's vector
// extensions. Included once per
// width: by quantize.cpp with FASTLLM_QUANT_LANES 4 (the baseline: SSE2 on x86-64, NEON on aarch64),
// by quantize_avx2.cpp with 8 (built with -mavx2) and by quantize_avx512.cpp with 16, each in its own
// namespace fastllm::quant::FASTLLM_QUANT_NAMESPACE. No include guard, on purpose.
//
// In lanes every step is one operation on all the groups, and a group's numpy-ordered sums stay in
// its own lane. One group at a time, the sums across a vector and each candidate's chain of
// divisions, sums and f16 rounding left the vector units idle (a 512 x 4096 matrix to q8, one
// thread: 31 ns a weight; in 8 lanes 27, 17 with the float64 division replaced below, 10 with the
// tie test once a chunk and each candidate's scales and f16 rounding in lanes too, and 7.5 in 16).
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
typedef uint32_t VU __attribute__((vector_size(kLanes * 4)));
typedef float HF __attribute__((vector_size(kLanes * 2)));   // half the lanes
typedef double HD __attribute__((vector_size(kLanes * 4)));  // half the lanes, as float64

inline VF load(const float *p) {
    VF v;
    std::memcpy(&v, p, sizeof v);
    return v;
}
template <class To, class From>
inline To bits(From v) {
    static_assert(sizeof(To) == sizeof(From));
    To t;
    std::memcpy(&t, &v, sizeof t);
    return t;
}
// The two halves of the lanes, and back.
inline HD low_half(VF v) {
    HF h;
    std::memcpy(&h, &v, sizeof h);
    return __builtin_convertvector(h, HD);
}
inline HD high_half(VF v) {
    HF h;
    std::memcpy(&h, (const char *)&v + sizeof h, sizeof h);
    return __builtin_convertvector(h, HD);
}
inline VF join(HD lo, HD hi) {
    const HF l = __builtin_convertvector(lo, HF), h = __builtin_convertvector(hi, HF);
    VF v;
    std::memcpy(&v, &l, sizeof l), std::memcpy((char *)&v + sizeof l, &h, sizeof h);
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
// rint in every lane where |v| < 2^22 (larger values are clipped to a code range, and keep their
// sign and size here), ties to even. (roundps was 3-4% slower on AVX2: two uops on the ports the
// products need.)
inline VF rint(VF v) {
    const VF magic = VF{} + 12582912.0f;
    return (v + magic) - magic;
}
// np.clip(v, lo, hi) of an integer v; NaN gives lo.
inline VF clip(VF v, float lo, float hi) {
    const VF l = VF{} + lo, h = VF{} + hi;
    v = v > l ? v : l;
    return v < h ? v : h;
}

// The codes float32(x / d), rounded and clipped, where d is a float64 (numpy divides a float32 array
// by float64 scales) or a float32. Dividing in float64 costs 2 cycles a value, most of the search;
// multiplying by r = float32(1 / d) gives a value within 3 2^-24 |v| of the rounded quotient v (r's
// rounding, the product's, v's own), so where x r lies further than `margin` >= 2^-20 |x r| from every
// half-integer, both round to the same code (and clipping to integer bounds keeps that). Lanes in
// `exact` (r subnormal, infinite or NaN) are always divided. The test branches once for a chunk of 8
// values, and only then for each: ties are rare except at a group's extreme weight, which sits on
// one whenever a candidate's code range is a half-integer (q4: 3 candidates of 11). A branch per
// value cost more than it saved; margin is one bound for the whole group (from its largest |x|)
// rather than each value's.
// A float32 d divides (one instruction, exact by definition) where that measured faster than the
// product and its tie test: in 8 lanes (AMD EPYC Zen 3, 2026-12-06, `bench_quantize.py --isa best`,
// 3 alternating rounds against the product: q8 9.2-9.7 ns a weight against 11.0-15.4, q4 11.3-14.2
// against 13.0-16.8, q4k 11.2-13.7 against 14.8-19.6) and in 4 (`--isa scalar`: q8 20-21 against
// 27-32, q4k 21-27 against 39-40). 16 lanes keep the product: an AVX-512 divider takes a vector of
// 16 at about half the rate of 8, unmeasured here (no AVX-512 on that machine).
constexpr bool kDivideF32 = kLanes <= 8;

// Whether den lies within 2^-20 of a half-integer: then x / d0 = den where x is the extreme d0 was
// taken from, a rounding tie (Divisor::pin).
inline bool half_integer(double den) { return std::fabs(std::fabs(den - std::rint(den)) - 0.5) < 0x1p-20; }

struct Divisor {
    VF r, margin;
    VI exact;
    bool f64;  // d in float64 (d_lo, d_hi: its two halves of lanes) or in float32 (d32)
    HD d_lo, d_hi;
    VF d32;

    Divisor(VF r_, VF amax, bool f64_) : r(r_), f64(f64_) {
        const VF a = abs(r);
        exact = ((a < std::numeric_limits<float>::min()) | (a > std::numeric_limits<float>::max()) | (a != a)) & (a != 0);
        exact |= amax != amax;  // (no lane of a NaN group is skipped: its margin is NaN)
        // 0.5 - margin rounds by at most 2^-26, and |x r| <= amax |r| (1 + 2^-23)
        margin = 0.5f - (amax * a * 0x1.004p-20f + 0x1p-24f);
    }
    VF divide(VF x) const { return f64 ? join(low_half(x) / d_lo, high_half(x) / d_hi) : x / d32; }

    // Where a candidate's code range is a half-integer, the group's extreme weight and its negation
    // sit on a rounding tie in every lane (q4: 3 candidates of 11, q6k: 2 of 21), which sent every
    // chunk holding one down the test's slow path. pin() divides them once: codes<true> takes those
    // values' codes from here and leaves them out of the test. (AMD EPYC Zen 3, one thread, 512 x
    // 4096, 7 alternating rounds: q4 9.6 ns a weight against 10.7, q6k 14.9 against 16.3.)
    VF pin_ext, pin_abs, pin_pos, pin_neg;
    void pin(VF ext, float lo, float hi) {
        const VF c = divide(ext);  // (-x) / d is -(x / d), in float64 and rounded to float32
        pin_ext = ext, pin_pos = rint(clip(c, lo, hi)), pin_neg = rint(clip(-c, lo, hi));
        pin_abs = exact ? VF{} - 1.0f : abs(ext);  // (divided anyway; -1 matches no |x|)
    }
    // q[j]: the codes in [lo, hi] of a chunk of 8 values
    template <bool kPinned = false>
    void codes(const VF *x, float lo, float hi, VF *q) const {
        if (kDivideF32 && !f64) {  // numpy's own float32 quotient: nothing to test
            for (int j = 0; j < 8; j++) q[j] = rint(clip(x[j] / d32, lo, hi));
            return;
        }
        VI near = exact;
        for (int j = 0; j < 8; j++) {
            const VF v = x[j] * r;
            q[j] = rint(v);
            VI tie = abs(v - q[j]) >= margin;
            if (kPinned) {
                const VI p = abs(x[j]) == pin_abs;
                tie &= ~p;
                q[j] = p ? (x[j] == pin_ext ? pin_pos : pin_neg) : q[j];
            }
            near |= tie;
        }
        if (any(near))  // (a pinned value divided again gets the same code)
            for (int j = 0; j < 8; j++) {
                const VF v = x[j] * r;
                const VI at = (abs(v - rint(v)) >= margin) | exact;
                if (any(at)) q[j] = at ? rint(clip(divide(x[j]), lo, hi)) : q[j];  // (divided values are clipped first)
            }
        for (int j = 0; j < 8; j++) q[j] = clip(q[j], lo, hi);
    }
};

// to_f16 in every lane, without its branches (which mispredicted on the rounding's ties, a tenth of
// the search): a normal f16 keeps 11 bits of the float's significand, rounded to even on its bits; a
// subnormal one is a multiple of 2^-24, which adding 0.5 rounds to (as 2^-24 is 0.5's ulp).
inline VF to_f16(VF v) {
    const VU u = bits<VU>(v), sign = u & 0x80000000u, ua = u & 0x7fffffffu;
    const VF a = bits<VF>(ua), normal = bits<VF>((ua + 0xfffu + ((ua >> 13) & 1u)) & ~0x1fffu);
    VF r = a < 0x1p-14f ? (a + 0.5f) - 0.5f : normal;
    r = normal > 65504.0f ? VF{} + kInf : r;
    r = a != a ? bits<VF>(VU{} + 0x7fc00000u) : r;  // f32_to_f16 makes every NaN quiet, payload 0
    return bits<VF>(bits<VU>(r) | sign);
}

// np_sum in every lane: acc[j] sums the values j, j + 8, ... (from 0 rather than value j, which
// changes only the sign of an all-zero sum, and the final 0 + makes that +0 in both).
// Loops over a group go by chunks of 8 (G is a multiple of 8), so that with j constant the sums stay
// in registers.
struct LaneSums {
    VF acc[8] = {};
    void add(int j, VF v) { acc[j] += v; }
    VF total() const { return VF{} + (((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]))); }
};

// _search_symmetric for kLanes groups of G values: xt holds them lane by lane (xt[i * kLanes + l]
// is value i of group l); out_d gets each group's f16 scale (as float) of least squared error for
// codes in [-neg, pos], and out_codes the codes on that scale, plus `zero`, group by group
// (out_codes[l * G + i]: a row's codes in order, where quantize_row copies them).
inline void search_symmetric(const float *xt, int G, int neg, int pos, int zero, float *out_d, uint8_t *out_codes) {
    VF extreme = load(xt), amax = abs(extreme);  // np.abs(g).argmax(): the first of the largest
    for (int i = 1; i < G; i++) {
        const VF v = load(xt + i * kLanes), a = abs(v);
        extreme = a > amax ? v : extreme;
        amax = a > amax ? a : amax;
    }
    const float lo = (float)-neg, hi = (float)pos;
    const HD ext_lo = low_half(extreme), ext_hi = high_half(extreme), inf = HD{} + (double)kInf;
    VF best_err = VF{} + kInf, best_d = VF{};
    for (int s = 0; s < 11; s++) {
        const double den = -neg + linspace(-1.0, 1.5, 11, s) * (neg / 8.0);
        const HD d0_lo = ext_lo / den, d0_hi = ext_hi / den;
        // r within 2^-24 (1 + 2^-28) of 1 / d0 (den is exact in float32): Divisor's margin holds
        Divisor by((float)den / extreme, amax, true);
        by.d_lo = d0_lo != 0 ? d0_lo : inf, by.d_hi = d0_hi != 0 ? d0_hi : inf;
        const bool tie = half_integer(den);
        if (tie) by.pin(extreme, lo, hi);
        LaneSums qq, gq;
        for (int i = 0; i < G; i += 8) {
            VF x[8], q[8];
            for (int j = 0; j < 8; j++) x[j] = load(xt + (i + j) * kLanes);
            tie ? by.codes<true>(x, lo, hi, q) : by.codes(x, lo, hi, q);
            for (int j = 0; j < 8; j++) qq.add(j, q[j] * q[j]), gq.add(j, x[j] * q[j]);
        }
        const VF sqq = qq.total(), sgq = gq.total();
        // numpy keeps d0 (float64) where qq is 0, which happens only when the group is all zeros (d0 = ±0)
        const VF d = to_f16(sqq > 0 ? sgq / sqq : join(d0_lo, d0_hi));
        const VF d2 = d != 0 ? d : VF{} + kInf;
        Divisor by_d(1.0f / d2, amax, false);
        by_d.d32 = d2;
        LaneSums err;
        for (int i = 0; i < G; i += 8) {
            VF x[8], q[8];
            for (int j = 0; j < 8; j++) x[j] = load(xt + (i + j) * kLanes);
            by_d.codes(x, lo, hi, q);
            for (int j = 0; j < 8; j++) {
                const VF e = x[j] - d * q[j];
                err.add(j, e * e);
            }
        }
        const VF e = err.total();  // the first candidate of the least error
        best_d = e < best_err ? d : best_d;
        best_err = e < best_err ? e : best_err;
    }
    std::memcpy(out_d, &best_d, sizeof best_d);
    const VF d2 = best_d != 0 ? best_d : VF{} + kInf;  // round_to_grid: codes of x / d (0 divides by inf)
    Divisor by(1.0f / d2, amax, false);
    by.d32 = d2;
    for (int i = 0; i < G; i += 8) {
        VF x[8], q[8];
        for (int j = 0; j < 8; j++) x[j] = load(xt + (i + j) * kLanes);
        by.codes(x, lo, hi, q);
        for (int j = 0; j < 8; j++) {
            const VI c = __builtin_convertvector(q[j], VI) + zero;
            for (int l = 0; l < kLanes; l++) out_codes[l * G + i + j] = (uint8_t)c[l];
        }
    }
}

// _search_q4m for kLanes groups of G values (xt lane by lane as for search_symmetric): 9 ranges
// shrunk from [min, max], each refitted by least squares, out_d and out_m the f16 scale and minimum
// (as floats) of least squared error, the first such. One group at a time this took 72 ns a weight
// (AMD EPYC Zen 3, one thread, bench_quantize.py), where the symmetric q4 took 9.
inline void search_q4m(const float *xt, int G, float *out_d, float *out_m) {
    VF x[kMaxGroup], t[kMaxGroup];
    x[0] = load(xt);
    VF lo0 = x[0], hi0 = x[0];
    for (int i = 1; i < G; i++) {
        x[i] = load(xt + i * kLanes);
        lo0 = x[i] < lo0 ? x[i] : lo0, hi0 = x[i] > hi0 ? x[i] : hi0;
    }
    LaneSums sw_;
    for (int i = 0; i < G; i += 8)
        for (int j = 0; j < 8; j++) sw_.add(j, x[i + j]);
    const VF span = hi0 - lo0, sw = sw_.total(), n = VF{} + (float)G;
    // the codes of t = x - shift on scale d (0 divides by inf), into q
    auto codes = [&](VF shift, VF d, VF *q) {
        VF tmax = VF{};  // the largest |t|, the product's margin where the Divisor multiplies (a NaN: divided)
        for (int i = 0; i < G; i++) t[i] = x[i] - shift, tmax = abs(t[i]) > tmax ? abs(t[i]) : tmax;
        for (int i = 0; i < G; i++) tmax = t[i] != t[i] ? t[i] : tmax;
        const VF dd = d != 0 ? d : VF{} + kInf;
        Divisor by(1.0f / dd, tmax, false);
        by.d32 = dd;
        for (int i = 0; i < G; i += 8) by.codes(t + i, 0.0f, 15.0f, q + i);
    };
    static constexpr double kShrink[3] = {0.0, 0.05, 0.1};
    VF best_err = VF{} + kInf, best_d = VF{}, best_m = VF{};
    for (double a : kShrink)
        for (double b : kShrink) {
            const VF lo = lo0 + (float)a * span;
            VF d = (span * (float)(1 - a - b)) / 15.0f, q[kMaxGroup];
            codes(lo, d, q);
            LaneSums sq_, sqq_, sqw_;
            for (int i = 0; i < G; i += 8)
                for (int j = 0; j < 8; j++)
                    sq_.add(j, q[i + j]), sqq_.add(j, q[i + j] * q[i + j]), sqw_.add(j, q[i + j] * x[i + j]);
            const VF sq = sq_.total(), sqq = sqq_.total(), sqw = sqw_.total();
            const VF det = n * sqq - sq * sq;
            d = det > 0 ? (n * sqw - sq * sw) / det : d;
            const VF m = (sw - d * sq) / n;
            const VF d16 = to_f16(d), m16 = to_f16(m);
            codes(m16, d16, q);
            LaneSums err_;
            for (int i = 0; i < G; i += 8)
                for (int j = 0; j < 8; j++) {
                    const VF e = x[i + j] - (d16 * q[i + j] + m16);
                    err_.add(j, e * e);
                }
            const VF err = err_.total();
            const VI better = err < best_err;
            best_err = better ? err : best_err, best_d = better ? d16 : best_d, best_m = better ? m16 : best_m;
        }
    std::memcpy(out_d, &best_d, sizeof best_d);
    std::memcpy(out_m, &best_m, sizeof best_m);
}

// What both K searches start from, for kLanes groups of 32: the values, and the weights |x| + the
// group's RMS of numpy's _importance.
struct KGroups {
    static constexpr int G = 32;
    VF x[G], w[G];

    explicit KGroups(const float *xt) {
        for (int i = 0; i < G; i++) x[i] = load(xt + i * kLanes);
        LaneSums xx;
        for (int i = 0; i < G; i += 8)
            for (int j = 0; j < 8; j++) xx.add(j, x[i + j] * x[i + j]);
        VF rms = xx.total() / (float)G;
        for (int l = 0; l < kLanes; l++) rms[l] = std::sqrt(rms[l]);
        for (int i = 0; i < G; i++) w[i] = abs(x[i]) + rms;
    }
};

// search_k's scale and minimum (q3k, q4k, q5k: has_min) for kLanes groups of 32 (xt lane by lane as
// for search_symmetric): 21 candidates, each refitted by weighted least squares, the minimum kept
// <= 0, out_d and out_m the least weighted squared error's: numpy's _search_k with a minimum, step
// for step. One group at a time this took 36 ns a q4k weight, in 16 lanes 10 (bench_quantize.py,
// one thread).
inline void search_k_min(const float *xt, int n_max, float *out_d, float *out_m) {
    const KGroups k(xt);
    constexpr int G = KGroups::G;
    const VF *x = k.x, *w = k.w;
    VF shifted[G];
    LaneSums sw_, swx_, swxx_;
    for (int i = 0; i < G; i += 8)
        for (int j = 0; j < 8; j++) {
            const VF t = w[i + j] * x[i + j];  // (w * g * g) is (w * g) * g
            sw_.add(j, w[i + j]), swx_.add(j, t), swxx_.add(j, t * x[i + j]);
        }
    const VF sw = sw_.total(), swx = swx_.total(), swxx = swxx_.total();
    VF mn = x[0], hi = x[0];
    for (int i = 1; i < G; i++) mn = x[i] < mn ? x[i] : mn, hi = x[i] > hi ? x[i] : hi;
    const VF lo = mn < 0 ? mn : VF{}, span = hi - lo;
    VF smax = VF{};  // the largest shifted value (|x - lo|), the codes' margin
    for (int i = 0; i < G; i++) shifted[i] = x[i] - lo, smax = abs(shifted[i]) > smax ? abs(shifted[i]) : smax;
    for (int i = 0; i < G; i++) smax = shifted[i] != shifted[i] ? shifted[i] : smax;  // a NaN: divided
    const HD span_lo = low_half(span), span_hi = high_half(span);
    VF best_err = VF{} + kInf, best_d = VF{}, best_m = VF{};
    for (int s = 0; s < 21; s++) {
        const double den = n_max + linspace(-1.0, 1.0, 21, s);
        const VF d0 = span > 0 ? join(span_lo / den, span_hi / den) : VF{};
        const VF dd = d0 != 0 ? d0 : VF{} + kInf;
        Divisor by(1.0f / dd, smax, false);
        by.d32 = dd;
        LaneSums swq_, swqq_, swqx_;
        for (int i = 0; i < G; i += 8) {
            VF q[8];
            by.codes(shifted + i, 0.0f, (float)n_max, q);
            for (int j = 0; j < 8; j++) {
                const VF wq = w[i + j] * q[j];
                swq_.add(j, wq), swqq_.add(j, wq * q[j]), swqx_.add(j, wq * x[i + j]);
            }
        }
        const VF swq = swq_.total(), swqq = swqq_.total(), swqx = swqx_.total();
        const VF det = sw * swqq - swq * swq;
        VF d = det > 0 ? (sw * swqx - swq * swx) / det : d0;
        VF m = sw > 0 ? (swx - d * swq) / sw : lo;
        const VI pos = m > 0;  // a minimum above 0 cannot be stored: refit the scale alone
        m = pos ? VF{} : m;
        d = pos ? (swqq > 0 ? swqx / swqq : d0) : d;
        const VF err = swxx - 2.0f * d * swqx - 2.0f * m * swx + d * d * swqq + 2.0f * d * m * swq + m * m * sw;
        const VI better = (err < best_err) & (d > 0);
        best_err = better ? err : best_err, best_d = better ? d : best_d, best_m = better ? m : best_m;
    }
    std::memcpy(out_d, &best_d, sizeof best_d);
    std::memcpy(out_m, &best_m, sizeof best_m);
}

// search_k_min's symmetric twin for q6k (codes in [-neg, pos]): numpy's scales and errors here are
// float64 (the largest |x| over a float64 step), so those run in halves of lanes as float64.
inline void search_k_sym(const float *xt, int neg, int pos, float *out_d) {
    const KGroups k(xt);
    constexpr int G = KGroups::G;
    const VF *x = k.x, *w = k.w;
    VF amax = VF{};
    for (int i = 0; i < G; i++) amax = abs(x[i]) > amax ? abs(x[i]) : amax;
    LaneSums swxx_;
    for (int i = 0; i < G; i += 8)
        for (int j = 0; j < 8; j++) swxx_.add(j, (w[i + j] * x[i + j]) * x[i + j]);
    const VF swxx = swxx_.total();
    const HD amax_lo = low_half(amax), amax_hi = high_half(amax), inf = HD{} + (double)kInf;
    const HD swxx_lo = low_half(swxx), swxx_hi = high_half(swxx);
    HD best_err[2] = {inf, inf}, best_d[2] = {HD{}, HD{}};
    for (int s = 0; s < 21; s++) {
        const double den = neg + linspace(-1.0, 1.0, 21, s);
        const HD d0[2] = {amax_lo / den, amax_hi / den};
        // r within 2^-24 (1 + 2^-28) of 1 / d0: Divisor's margin holds
        Divisor by(join(den / amax_lo, den / amax_hi), amax, true);
        by.d_lo = d0[0] != 0 ? d0[0] : inf, by.d_hi = d0[1] != 0 ? d0[1] : inf;
        const bool tie = half_integer(den);
        if (tie) by.pin(amax, (float)-neg, (float)pos);
        LaneSums swqq_, swqx_;
        for (int i = 0; i < G; i += 8) {
            VF q[8];
            tie ? by.codes<true>(x + i, (float)-neg, (float)pos, q) : by.codes(x + i, (float)-neg, (float)pos, q);
            for (int j = 0; j < 8; j++) {
                const VF wq = w[i + j] * q[j];
                swqq_.add(j, wq * q[j]), swqx_.add(j, wq * x[i + j]);
            }
        }
        const VF swqq = swqq_.total(), swqx = swqx_.total(), ratio = swqx / swqq;
        const HD swqq_h[2] = {low_half(swqq), high_half(swqq)}, swqx_h[2] = {low_half(swqx), high_half(swqx)};
        const HD ratio_h[2] = {low_half(ratio), high_half(ratio)}, swxx_h[2] = {swxx_lo, swxx_hi};
        for (int h = 0; h < 2; h++) {
            const HD d = swqq_h[h] > 0 ? ratio_h[h] : d0[h];
            const HD err = swxx_h[h] - 2 * d * swqx_h[h] + d * d * swqq_h[h];
            const auto better = (err < best_err[h]) & (d > 0);
            best_err[h] = better ? err : best_err[h], best_d[h] = better ? d : best_d[h];
        }
    }
    const VF d = join(best_d[0], best_d[1]);
    std::memcpy(out_d, &d, sizeof d);
}

}  // namespace fastllm::quant::FASTLLM_QUANT_NAMESPACE
