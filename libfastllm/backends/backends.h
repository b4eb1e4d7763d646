// backends.h — the backends of this build, made by name-free requests: the runtime and the C API
// include this, never a concrete backend's header (backends.cpp is the one place that knows them).
#pragma once

#include <memory>

#include "arch/backend.h"

namespace fastllm {

struct BackendOptions {
    int n_threads = 1;
};
// A backend for a model's passes: the CPU's, or the one FASTLLM_BACKEND names (cpu, refdev).
// Throws Error when it cannot be made.
std::unique_ptr<Backend> make_backend(const BackendOptions &options);
// The instruction-set level the CPU backend's kernels use ("avx512", "avx2", "neon", "scalar").
const char *cpu_kernels_name();

}  // namespace fastllm
