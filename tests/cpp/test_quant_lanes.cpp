// test_quant_lanes — the quantizer's searches at 16 lanes against 4, on any CPU. quantize_lanes.h is
// built here twice with plain vector types (the compiler splits 16 lanes into what the CPU has), so
// the 16-lane logic that only an AVX-512 machine runs in the library (the reciprocal's product with
// its tie test, where 8 and 4 lanes divide) is checked where there is none: every search gives the
// same scales, minimums and codes for 16 groups at once as for four batches of 4. Built, like the
// quantizer, without fused multiply-adds. Run by ctest.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "format/quantize_common.h"
#define FASTLLM_QUANT_LANES 4
#define FASTLLM_QUANT_NAMESPACE lanes4
#include "format/quantize_lanes.h"
#undef FASTLLM_QUANT_LANES
#undef FASTLLM_QUANT_NAMESPACE
#define FASTLLM_QUANT_LANES 16
#define FASTLLM_QUANT_NAMESPACE lanes16
#include "format/quantize_lanes.h"

using namespace fastllm::quant;

static int g_passed = 0, g_failed = 0;

static bool same_bits(const float *a, const float *b, int n) {
    return std::memcmp(a, b, sizeof(float) * (size_t)n) == 0;
}

// 16 groups of G values, the kinds of data the Python tests use too.
static std::vector<float> groups(int kind, int G, std::mt19937 &rng) {
    std::vector<float> x((size_t)16 * G);
    std::normal_distribution<float> nd;
    std::uniform_int_distribution<int> pick(0, 3), half(-16, 16);
    const float extremes[4] = {-1.0f, 1.0f, 0.3f, -0.55f};
    for (int g = 0; g < 16; g++)
        for (int i = 0; i < G; i++) {
            float &v = x[(size_t)g * G + i];
            switch (kind) {
            case 0: v = nd(rng) * 0.02f; break;                               // normal
            case 1: v = nd(rng) * nd(rng) * nd(rng) * 0.1f; break;            // heavy tails
            case 2: v = i == 0 ? 8.0f : (float)half(rng) / 2; break;          // half-integers: ties
            case 3: v = extremes[pick(rng)] * 0.02f; break;                   // the extreme many times
            // 4: zeros of both signs, a constant, subnormal values
            case 4: v = g % 4 == 0 ? 0.0f : g % 4 == 1 ? 1.5f : g % 4 == 2 ? nd(rng) * 1e-42f : -0.0f; break;
            default: v = std::fabs(nd(rng)) * (g % 2 ? 3e4f : 1e-30f); break;  // one sign, large and tiny
            }
        }
    return x;
}

// Lane-major copies (xt[i * W + l]) of groups g0 .. g0 + W - 1.
static std::vector<float> transpose(const std::vector<float> &x, int G, int g0, int W) {
    std::vector<float> xt((size_t)G * W);
    for (int l = 0; l < W; l++)
        for (int i = 0; i < G; i++) xt[(size_t)i * W + l] = x[(size_t)(g0 + l) * G + i];
    return xt;
}

#define CHECK(cond, what, kind, G)                                                         \
    do {                                                                                   \
        if (cond) {                                                                        \
            g_passed++;                                                                    \
        } else {                                                                           \
            g_failed++;                                                                    \
            std::printf("FAIL %s, data kind %d, groups of %d: 16 lanes differ from 4\n", what, kind, G); \
        }                                                                                  \
    } while (0)

int main() {
    std::mt19937 rng(7);
    for (int kind = 0; kind < 6; kind++) {
        for (int G : {32, 64, 128}) {
            const std::vector<float> x = groups(kind, G, rng);
            const std::vector<float> x16 = transpose(x, G, 0, 16);
            // the symmetric searches: q8, q6, q4 (codes in [-neg, pos] around zero)
            for (int bits : {8, 6, 4}) {
                const int neg = bits == 8 ? 127 : 1 << (bits - 1), pos = (1 << (bits - 1)) - 1;
                const int zero = bits == 8 ? 128 : neg;
                float d16[16], d4[16];
                std::vector<uint8_t> c16((size_t)16 * G), c4((size_t)16 * G);
                lanes16::search_symmetric(x16.data(), G, neg, pos, zero, d16, c16.data());
                for (int g0 = 0; g0 < 16; g0 += 4)
                    lanes4::search_symmetric(transpose(x, G, g0, 4).data(), G, neg, pos, zero, d4 + g0,
                                             c4.data() + (size_t)g0 * G);
                const char *what[] = {"search_symmetric q4", "search_symmetric q6", "search_symmetric q8"};
                CHECK(same_bits(d16, d4, 16) && c16 == c4, what[bits / 2 - 2], kind, G);
            }
            float d16[16], m16[16], d4[16], m4[16];
            lanes16::search_q4m(x16.data(), G, d16, m16);
            for (int g0 = 0; g0 < 16; g0 += 4) lanes4::search_q4m(transpose(x, G, g0, 4).data(), G, d4 + g0, m4 + g0);
            CHECK(same_bits(d16, d4, 16) && same_bits(m16, m4, 16), "search_q4m", kind, G);
            if (G != 32) continue;  // the K formats' groups are 32
            for (int n_max : {7, 15, 31}) {  // q3k, q4k, q5k
                lanes16::search_k_min(x16.data(), n_max, d16, m16);
                for (int g0 = 0; g0 < 16; g0 += 4)
                    lanes4::search_k_min(transpose(x, G, g0, 4).data(), n_max, d4 + g0, m4 + g0);
                CHECK(same_bits(d16, d4, 16) && same_bits(m16, m4, 16), "search_k_min", kind, G);
            }
            lanes16::search_k_sym(x16.data(), 32, 31, d16);
            for (int g0 = 0; g0 < 16; g0 += 4) lanes4::search_k_sym(transpose(x, G, g0, 4).data(), 32, 31, d4 + g0);
            CHECK(same_bits(d16, d4, 16), "search_k_sym q6k", kind, G);
        }
    }
    std::printf("%d passed, %d failed\n", g_passed, g_failed);
    return g_failed ? 1 : 0;
}
