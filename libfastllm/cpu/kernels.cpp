// Run-time choice of the kernel table (the CPU's features, platform/cpu_features.cpp, then the
// FASTLLM_ISA override).
#include <cstdlib>
#include <cstring>

#include "cpu/kernels.h"
#include "platform/platform.h"

namespace fastllm {

const char *isa_name(Isa isa) {
    switch (isa) {
    case Isa::Scalar: return "scalar";
    case Isa::Avx2: return "avx2";
    case Isa::AvxVnni: return "avxvnni";
    case Isa::Avx512: return "avx512";
    case Isa::Neon: return "neon";
    case Isa::NeonDot: return "neon_dotprod";
    case Isa::Amx: return "amx";
    }
    return "?";
}

namespace {

// This architecture's levels, best first; FASTLLM_ISA lowers the choice to one of them.
#if defined(__x86_64__)
constexpr Isa kLevels[] = {Isa::Amx, Isa::Avx512, Isa::AvxVnni, Isa::Avx2, Isa::Scalar};
#elif defined(__aarch64__)
constexpr Isa kLevels[] = {Isa::NeonDot, Isa::Neon, Isa::Scalar};
#else
constexpr Isa kLevels[] = {Isa::Scalar};
#endif
constexpr int kNumLevels = sizeof kLevels / sizeof *kLevels;

bool cpu_supports(Isa isa) {
    const platform::CpuFeatures &f = platform::cpu_features();
    switch (isa) {
    case Isa::Scalar: return true;
    case Isa::Avx2: return f.avx2;
    case Isa::AvxVnni: return f.avx_vnni;
    case Isa::Avx512: return f.avx512;
    case Isa::Neon: return f.neon;
    case Isa::NeonDot: return f.neon_dotprod;
    case Isa::Amx: return f.amx;
    }
    return false;
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
    case Isa::AvxVnni: return avxvnni_kernels();
    case Isa::Avx512: return avx512_kernels();
    case Isa::Neon: return neon_kernels();
    case Isa::NeonDot: return neon_dot_kernels();
    case Isa::Amx: return amx_kernels();
    }
    return nullptr;
}

const KernelTable &kernels() {
    static const KernelTable *table = select();
    return *table;
}

}  // namespace fastllm
