// backends.cpp — the one place that knows the concrete backends of this build.
#include "backends/backends.h"

#include <cstdlib>
#include <cstring>

#include "base/error.h"
#include "base/log.h"
#include "cpu/backend_cpu.h"
#include "cpu/kernels.h"
#include "refdev/backend_refdev.h"
#ifdef FASTLLM_VULKAN
#include "vulkan/backend_vulkan.h"
#endif

namespace fastllm {

namespace {

#ifdef FASTLLM_VULKAN
constexpr const char *kNames = "cpu, vulkan, vulkan:N, auto";
#else
constexpr const char *kNames = "cpu, auto; this build has no Vulkan backend";
#endif

// "vulkan" -> -1, "vulkan:N" -> N; -2 for anything else.
int vulkan_index(const std::string &d) {
    if (d == "vulkan") return -1;
    if (d.rfind("vulkan:", 0) != 0 || d.size() == 7) return -2;
    for (size_t i = 7; i < d.size(); i++)
        if (d[i] < '0' || d[i] > '9' || i > 12) return -2;
    return std::atoi(d.c_str() + 7);
}

}  // namespace

std::string resolve_device(const char *requested) {
    std::string d = requested ? requested : "";
    if (d.empty()) {
        const char *env = std::getenv("FASTLLM_BACKEND");
        if (!env || !*env) return "cpu";
        d = env;
        if (d == "refdev") return d;
        if (d != "cpu" && vulkan_index(d) < -1) fail(FASTLLM_ERR_INVALID_ARGUMENT, "FASTLLM_BACKEND=%s: no such backend (cpu, refdev, vulkan)", env);
    }
    if (d == "cpu") return d;
    if (d == "auto") {
        std::string why;
        for (const DeviceInfo &i : list_devices(&why)) {
            if (i.usable && i.type != "cpu") return "vulkan:" + std::to_string(i.index);
            why += (why.empty() ? "" : "; ") + i.name + (i.usable ? " is a CPU device" : " lacks " + i.missing);
        }
        log(FASTLLM_LOG_INFO, "device auto: the CPU (no usable GPU: %s)", why.empty() ? "no Vulkan device" : why.c_str());
        return "cpu";
    }
    if (vulkan_index(d) >= -1) {
#ifndef FASTLLM_VULKAN
        fail(FASTLLM_ERR_UNSUPPORTED, "device '%s': this build has no Vulkan backend (built without the Vulkan headers or glslc)", d.c_str());
#endif
        return d;
    }
    fail(FASTLLM_ERR_INVALID_ARGUMENT, "device '%s': no such device (%s)", d.c_str(), kNames);
}

bool device_is_gpu(const std::string &device) { return vulkan_index(device) >= -1; }

std::unique_ptr<Backend> make_backend(const BackendOptions &o) {
    if (o.device == "cpu") return std::make_unique<CpuBackend>(kernels(), o.n_threads);
    if (o.device == "refdev") return make_refdev_backend(o.n_threads);
#ifdef FASTLLM_VULKAN
    if (vulkan_index(o.device) >= -1) return make_vulkan_backend(vulkan_index(o.device));
#endif
    fail(FASTLLM_ERR_INVALID_ARGUMENT, "device '%s': no such device (%s)", o.device.c_str(), kNames);
}

const char *cpu_kernels_name() { return isa_name(kernels().isa); }

std::vector<DeviceInfo> list_devices(std::string *why) {
    std::vector<DeviceInfo> out;
#ifdef FASTLLM_VULKAN
    for (const VulkanDeviceInfo &d : vulkan_devices(why))
        out.push_back(DeviceInfo{d.index, d.name, d.type, d.vendor, d.missing, d.api_version, d.memory_bytes, d.usable});
#else
    if (why) *why = "this build has no Vulkan backend";
#endif
    return out;
}

void use_host_vulkan_device(const HostVulkanDevice &h) {
#ifdef FASTLLM_VULKAN
    adopt_vulkan_device(VulkanHandles{h.instance, h.physical_device, h.device, h.queue_family, h.queue_index,
                                      h.get_instance_proc_addr});
#else
    (void)h;
    fail(FASTLLM_ERR_UNSUPPORTED, "this build has no Vulkan backend");
#endif
}

}  // namespace fastllm
