// NEON with the Armv8.2 int8 dot product (SDOT). This file alone is compiled with
// -march=armv8.2-a+dotprod; its table is used only when the kernel reports ASIMDDP (HWCAP). It is
// the NEON table with the quantized dots on SDOT: one instruction where plain NEON takes three.
#if defined(__aarch64__)
#include <arm_neon.h>

#include "cpu/kernels.h"
#include "cpu/kernels_neon.h"

namespace fastllm {

namespace {

// Lane i of acc += the dot of row i's 4 codes in w (a quad, kernels_neon.h) with bytes 4L .. 4L + 3 of a.
struct DotProd {
    template <int L>
    static int32x4_t lane(int32x4_t acc, int8x16_t w, int8x16_t a) { return vdotq_laneq_s32(acc, w, a, L); }
};

}  // namespace

const KernelTable *neon_dot_kernels() {
    static const KernelTable *table = []() -> const KernelTable * {
        const KernelTable *plain = neon_kernels();
        if (!plain) return nullptr;
        static KernelTable t = with_quant_kernels(*plain, quant_for_bits<DotProd>);
        t.isa = Isa::NeonDot;
        return &t;
    }();
    return table;
}

}  // namespace fastllm
#else
#include "cpu/kernels.h"
namespace fastllm {
const KernelTable *neon_dot_kernels() { return nullptr; }
}  // namespace fastllm
#endif
