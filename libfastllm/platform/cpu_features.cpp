// What the CPU can run, for the kernel tables (cpu/kernels.cpp): CPUID on x86-64 (any OS; gcc's
// and clang's builtins), the auxiliary vector on ARM64 Linux, IsProcessorFeaturePresent on ARM64
// Windows.
#include "platform/platform.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#elif defined(__aarch64__) && defined(__linux__)
#include <asm/hwcap.h>
#include <sys/auxv.h>
#elif defined(__aarch64__) && defined(_WIN32)
#include <windows.h>
#endif

namespace fastllm::platform {

namespace {

CpuFeatures detect() {
    CpuFeatures f;
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    __builtin_cpu_init();
    unsigned a, b, c, d;  // CPUID leaf 1, ECX bit 29: clang 14's __builtin_cpu_supports does not know "f16c"
    const bool f16c = __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
    f.avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c;
    f.avx512 = f.avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
#elif defined(__aarch64__) && defined(__linux__)
    const unsigned long hw = getauxval(AT_HWCAP);
    f.neon = hw & HWCAP_ASIMD;
    f.neon_dotprod = f.neon && (hw & HWCAP_ASIMDDP);
#elif defined(__aarch64__) && defined(_WIN32)
    f.neon = true;
    f.neon_dotprod = IsProcessorFeaturePresent(PF_ARM_V82_DP_INSTRUCTIONS_AVAILABLE);
#elif defined(__aarch64__)
    f.neon = true;  // ASIMD is part of every ARM64 CPU; no portable way to ask for the dot product
#endif
    return f;
}

}  // namespace

const CpuFeatures &cpu_features() {
    static const CpuFeatures f = detect();
    return f;
}

}  // namespace fastllm::platform
