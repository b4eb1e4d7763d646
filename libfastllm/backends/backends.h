// backends.h — the backends of this build, made by name-free requests: the runtime and the C API
// include this, never a concrete backend's header (backends.cpp is the one place that knows them).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "arch/backend.h"

namespace fastllm {

struct BackendOptions {
    int n_threads = 1;
    std::string device = "cpu";  // as resolve_device gives it
};
// The device a model's params ask for (fastllm_model_params.device), resolved: nullptr (the
// default): "cpu", unless FASTLLM_BACKEND names another backend (cpu, refdev, vulkan: how the tests
// run whole suites through one); "cpu": "cpu"; "auto": "vulkan" when a usable Vulkan GPU exists, else "cpu" (logged);
// "vulkan" or "vulkan:N" as given. Throws FASTLLM_ERR_INVALID_ARGUMENT for another name, and
// FASTLLM_ERR_UNSUPPORTED for Vulkan in a build without it.
std::string resolve_device(const char *requested);
bool device_is_gpu(const std::string &device);
// A backend for a model's passes on a resolved device. Throws Error when it cannot be made (a
// Vulkan device missing or lacking a feature: FASTLLM_ERR_UNSUPPORTED naming it).
std::unique_ptr<Backend> make_backend(const BackendOptions &options);
// The instruction-set level the CPU backend's kernels use ("avx512", "avxvnni", "avx2", "neon", "scalar").
const char *cpu_kernels_name();

// The machine's GPU devices (Vulkan); empty, with *why, when there are none or no Vulkan.
struct DeviceInfo {
    int index;
    std::string name, type, vendor, missing;
    uint32_t api_version;
    uint64_t memory_bytes;
    bool usable;
};
std::vector<DeviceInfo> list_devices(std::string *why);

// A host application's own Vulkan device (fastllm_vulkan_handles' fields), made the process's.
struct HostVulkanDevice {
    void *instance, *physical_device, *device;
    uint32_t queue_family, queue_index;
    void *get_instance_proc_addr;
};
void use_host_vulkan_device(const HostVulkanDevice &handles);

}  // namespace fastllm
