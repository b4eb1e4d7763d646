// AVX2 + FMA + F16C kernels. This file alone is compiled with -mavx2 -mfma -mf16c; its table is
// used only when CPUID reports those features.
#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>

#include <cstring>

#include "kernels.h"

namespace fastllm {

namespace {

inline __m256 load8_f32(const void *p, int i) { return _mm256_loadu_ps((const float *)p + i); }
inline __m256 load8_f16(const void *p, int i) {
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)p + i)));
}
inline __m256 load8_bf16(const void *p, int i) {
    __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)((const uint16_t *)p + i)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
}
inline float load1_f32(const void *p, int i) { return ((const float *)p)[i]; }
inline float load1_f16(const void *p, int i) { return f16_to_f32(((const uint16_t *)p)[i]); }
inline float load1_bf16(const void *p, int i) { return bf16_to_f32(((const uint16_t *)p)[i]); }

inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

// Four rows at a time share each load of x; two accumulators per row hide FMA latency.
template <__m256 (*Load8)(const void *, int), float (*Load1)(const void *, int)>
void dot_rows(const void *w, size_t stride, int rows, const float *x, int n, float *y) {
    const char *base = (const char *)w;
    int r = 0;
    for (; r + 4 <= rows; r += 4) {
        const void *w0 = base + (size_t)r * stride, *w1 = base + (size_t)(r + 1) * stride;
        const void *w2 = base + (size_t)(r + 2) * stride, *w3 = base + (size_t)(r + 3) * stride;
        __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(), a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
        int i = 0;
        for (; i + 8 <= n; i += 8) {
            __m256 xv = _mm256_loadu_ps(x + i);
            a0 = _mm256_fmadd_ps(Load8(w0, i), xv, a0);
            a1 = _mm256_fmadd_ps(Load8(w1, i), xv, a1);
            a2 = _mm256_fmadd_ps(Load8(w2, i), xv, a2);
            a3 = _mm256_fmadd_ps(Load8(w3, i), xv, a3);
        }
        float s0 = hsum(a0), s1 = hsum(a1), s2 = hsum(a2), s3 = hsum(a3);
        for (; i < n; i++) {
            s0 += Load1(w0, i) * x[i];
            s1 += Load1(w1, i) * x[i];
            s2 += Load1(w2, i) * x[i];
            s3 += Load1(w3, i) * x[i];
        }
        y[r] = s0, y[r + 1] = s1, y[r + 2] = s2, y[r + 3] = s3;
    }
    for (; r < rows; r++) {
        const void *wr = base + (size_t)r * stride;
        __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
        int i = 0;
        for (; i + 16 <= n; i += 16) {
            a0 = _mm256_fmadd_ps(Load8(wr, i), _mm256_loadu_ps(x + i), a0);
            a1 = _mm256_fmadd_ps(Load8(wr, i + 8), _mm256_loadu_ps(x + i + 8), a1);
        }
        for (; i + 8 <= n; i += 8) a0 = _mm256_fmadd_ps(Load8(wr, i), _mm256_loadu_ps(x + i), a0);
        float s = hsum(_mm256_add_ps(a0, a1));
        for (; i < n; i++) s += Load1(wr, i) * x[i];
        y[r] = s;
    }
}

template <__m256 (*Load8)(const void *, int), float (*Load1)(const void *, int)>
void to_f32(const void *src, float *dst, int n) {
    int i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, Load8(src, i));
    for (; i < n; i++) dst[i] = Load1(src, i);
}

void axpy(float a, const float *x, float *y, int n) {
    __m256 av = _mm256_set1_ps(a);
    int i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_fmadd_ps(av, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    for (; i < n; i++) y[i] += a * x[i];
}

const KernelTable kTable = {
    Isa::Avx2,
    {dot_rows<load8_f32, load1_f32>, dot_rows<load8_f16, load1_f16>, dot_rows<load8_bf16, load1_bf16>},
    {to_f32<load8_f32, load1_f32>, to_f32<load8_f16, load1_f16>, to_f32<load8_bf16, load1_bf16>},
    axpy};

}  // namespace

const KernelTable *avx2_kernels() { return &kTable; }

}  // namespace fastllm
#else
#include "kernels.h"
namespace fastllm {
const KernelTable *avx2_kernels() { return nullptr; }
}  // namespace fastllm
#endif
