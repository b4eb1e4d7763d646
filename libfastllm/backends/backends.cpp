// backends.cpp — the one place that knows the concrete backends of this build.
#include "backends/backends.h"

#include "cpu/backend_cpu.h"
#include "cpu/kernels.h"

namespace fastllm {

std::unique_ptr<Backend> make_backend(const BackendOptions &o) {
    return std::make_unique<CpuBackend>(kernels(), o.n_threads);
}

const char *cpu_kernels_name() { return isa_name(kernels().isa); }

}  // namespace fastllm
