// backend_vulkan.h — the Backend (arch/backend.h) on a Vulkan device (vk_device.h): weights, working
// memory and KV blocks in device memory, every op a compute shader (vulkan/shaders/), recorded into
// command buffers that run while the host records the next layers. Sampling stays on the host;
// only the logits rows a pass asks for come back.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "arch/backend.h"

namespace fastllm {

// A backend on the process's Vulkan device (index: of vulkan_devices; -1: the best usable one),
// made on first use. FASTLLM_ERR_UNSUPPORTED (no loader, no usable device, the device lacking a
// feature: the message says which) when there is none.
std::unique_ptr<Backend> make_vulkan_backend(int index);

struct VulkanDeviceInfo {
    int index;
    std::string name, type, vendor;  // type: discrete, integrated, virtual, cpu, other
    uint32_t api_version;
    uint64_t memory_bytes;
    bool usable;
    std::string missing;
};
// A host application's device, made the process's (before any backend opened one).
struct VulkanHandles {
    void *instance, *physical_device, *device;
    uint32_t queue_family, queue_index;
    void *get_instance_proc_addr;
};
void adopt_vulkan_device(const VulkanHandles &handles);

// The machine's Vulkan devices; empty, with *why, without a loader or instance.
std::vector<VulkanDeviceInfo> vulkan_devices(std::string *why);

}  // namespace fastllm
