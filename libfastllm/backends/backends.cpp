// backends.cpp — the one place that knows the concrete backends of this build.
#include "backends/backends.h"

#include <cstdlib>
#include <cstring>

#include "base/error.h"
#include "cpu/backend_cpu.h"
#include "cpu/kernels.h"
#include "refdev/backend_refdev.h"
#ifdef FASTLLM_VULKAN
#include "vulkan/backend_vulkan.h"
#endif

namespace fastllm {

std::unique_ptr<Backend> make_backend(const BackendOptions &o) {
    // FASTLLM_BACKEND names the backend while there is no device choice in the public params: cpu
    // (the default) or refdev (the reference device, for the seam's tests).
    const char *name = std::getenv("FASTLLM_BACKEND");
    if (!name || !*name || std::strcmp(name, "cpu") == 0) return std::make_unique<CpuBackend>(kernels(), o.n_threads);
    if (std::strcmp(name, "refdev") == 0) return make_refdev_backend(o.n_threads);
#ifdef FASTLLM_VULKAN
    if (std::strcmp(name, "vulkan") == 0) return make_vulkan_backend();
    fail(FASTLLM_ERR_INVALID_ARGUMENT, "FASTLLM_BACKEND=%s: no such backend (cpu, refdev, vulkan)", name);
#else
    if (std::strcmp(name, "vulkan") == 0)
        fail(FASTLLM_ERR_UNSUPPORTED, "FASTLLM_BACKEND=vulkan: this build has no Vulkan backend (built without the Vulkan headers or glslc)");
    fail(FASTLLM_ERR_INVALID_ARGUMENT, "FASTLLM_BACKEND=%s: no such backend (cpu, refdev)", name);
#endif
}

const char *cpu_kernels_name() { return isa_name(kernels().isa); }

}  // namespace fastllm
