// What the CPU can run, for the kernel tables (cpu/kernels.cpp): CPUID on x86-64 (any OS; gcc's
// and clang's builtins), the auxiliary vector on ARM64 Linux, IsProcessorFeaturePresent on ARM64
// Windows.
#include "platform/platform.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif
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
    // AVX-VNNI (leaf 7 subleaf 1, EAX bit 4): vpdpbusd on 256-bit vectors, VEX-encoded
    f.avx_vnni = f.avx2 && __get_cpuid_count(7, 1, &a, &b, &c, &d) && (a >> 4 & 1);
    // CPUID leaf 7, EDX bits 24 and 25: AMX-TILE, AMX-INT8. Linux hands out the tiles' 8 KiB of
    // state only to a process that asks (arch_prctl ARCH_REQ_XCOMP_PERM for XFEATURE_XTILEDATA,
    // 18); it refuses where the system does not save that state, or a thread's signal stack is too
    // small for it, and the AVX-512 level is used then. Other systems: no AMX level.
    const bool amx_cpu = __get_cpuid_count(7, 0, &a, &b, &c, &d) && (d >> 24 & 1) && (d >> 25 & 1);
#if defined(__linux__)
    f.amx = f.avx512 && amx_cpu && syscall(SYS_arch_prctl, 0x1023, 18) == 0;
    // AMX-BF16 (leaf 7, EDX bit 22) and AVX512-BF16 (leaf 7 subleaf 1, EAX bit 5), which splits
    // f32 operands into the bf16 halves the tiles take
    const bool amx_bf16 = d >> 22 & 1;
    f.amx_bf16 = f.amx && amx_bf16 && __get_cpuid_count(7, 1, &a, &b, &c, &d) && (a >> 5 & 1);
#else
    (void)amx_cpu;
#endif
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
