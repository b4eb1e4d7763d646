// Run-time choice of the kernel table (CPUID or the aarch64 HWCAP bits, then the FASTLLM_ISA override).
#include <cstdlib>
#include <cstring>

#include "cpu/kernels.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#endif
#if defined(__aarch64__) && defined(__linux__)
#include <asm/hwcap.h>
#include <sys/auxv.h>
#endif

namespace fastllm {

const char *isa_name(Isa isa) {
    switch (isa) {
    case Isa::Scalar: return "scalar";
    case Isa::Avx2: return "avx2";
    case Isa::Avx512: return "avx512";
    case Isa::Neon: return "neon";
    case Isa::NeonDot: return "neon_dotprod";
    }
    return "?";
}

namespace {

// This architecture's levels, best first; FASTLLM_ISA lowers the choice to one of them.
#if defined(__x86_64__)
constexpr Isa kLevels[] = {Isa::Avx512, Isa::Avx2, Isa::Scalar};
#elif defined(__aarch64__)
constexpr Isa kLevels[] = {Isa::NeonDot, Isa::Neon, Isa::Scalar};
#else
constexpr Isa kLevels[] = {Isa::Scalar};
#endif
constexpr int kNumLevels = sizeof kLevels / sizeof *kLevels;

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
// CPUID leaf 1, ECX bit 29; clang 14's __builtin_cpu_supports does not know "f16c".
bool cpu_has_f16c() {
    unsigned a, b, c, d;
    return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
}
#endif

bool cpu_supports(Isa isa) {
    if (isa == Isa::Scalar) return true;
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    __builtin_cpu_init();
    switch (isa) {
    case Isa::Avx2:
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && cpu_has_f16c();
    case Isa::Avx512:
        return cpu_supports(Isa::Avx2) && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
    default: return false;
    }
#elif defined(__aarch64__) && defined(__linux__)
    const unsigned long hw = getauxval(AT_HWCAP);
    switch (isa) {
    case Isa::Neon: return hw & HWCAP_ASIMD;
    case Isa::NeonDot: return (hw & HWCAP_ASIMD) && (hw & HWCAP_ASIMDDP);
    default: return false;
    }
#elif defined(__aarch64__)
    return isa == Isa::Neon;  // ASIMD is part of every aarch64 CPU; without getauxval, no DotProd
#else
    return false;
#endif
}

const KernelTable *select() {
    int first = 0;
    if (const char *env = std::getenv("FASTLLM_ISA"))
        for (int i = 0; i < kNumLevels; i++)
            if (!std::strcmp(env, isa_name(kLevels[i]))) first = i;
    for (int i = first; i < kNumLevels; i++)
        if (const KernelTable *t = kernels_for(kLevels[i])) return t;
    return scalar_kernels();
}

}  // namespace

const KernelTable *kernels_for(Isa isa) {
    if (!cpu_supports(isa)) return nullptr;
    switch (isa) {
    case Isa::Scalar: return scalar_kernels();
    case Isa::Avx2: return avx2_kernels();
    case Isa::Avx512: return avx512_kernels();
    case Isa::Neon: return neon_kernels();
    case Isa::NeonDot: return neon_dot_kernels();
    }
    return nullptr;
}

const KernelTable &kernels() {
    static const KernelTable *table = select();
    return *table;
}

}  // namespace fastllm
