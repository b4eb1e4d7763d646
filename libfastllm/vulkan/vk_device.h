// vk_device.h — the Vulkan device of this process: the loader opened at run time (a machine
// without Vulkan runs on the CPU), one instance, one device and compute queue, its memory, and the
// compute pipelines. Backends (backend_vulkan.cpp) of every model and thread count share it, so
// sessions of any of them share KV blocks as on the CPU.
//
// Memory is handed out as Vulkan buffer device addresses: the host's pointer arithmetic in a
// workspace or a KV block (arch/memory.h) is then the shaders' own, with no descriptor sets.
#pragma once

#define VK_NO_PROTOTYPES
#include <vulkan/vulkan_core.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "arch/memory.h"

namespace fastllm::vk {

// The functions used, loaded from the loader (global, instance and device level alike).
#define FASTLLM_VK_FUNCTIONS(X)                                                                                       \
    X(vkCreateInstance) X(vkEnumerateInstanceVersion) X(vkDestroyInstance) X(vkEnumeratePhysicalDevices)             \
    X(vkGetPhysicalDeviceProperties) X(vkGetPhysicalDeviceProperties2) X(vkGetPhysicalDeviceFeatures2) X(vkGetPhysicalDeviceQueueFamilyProperties)     \
    X(vkGetPhysicalDeviceMemoryProperties) X(vkCreateDevice) X(vkDestroyDevice) X(vkGetDeviceQueue)                  \
    X(vkCreateBuffer) X(vkDestroyBuffer) X(vkGetBufferMemoryRequirements) X(vkAllocateMemory) X(vkFreeMemory)        \
    X(vkBindBufferMemory) X(vkMapMemory) X(vkGetBufferDeviceAddress) X(vkCreateCommandPool)                          \
    X(vkDestroyCommandPool) X(vkAllocateCommandBuffers) X(vkBeginCommandBuffer) X(vkEndCommandBuffer)                \
    X(vkResetCommandBuffer) X(vkCmdBindPipeline) X(vkCmdPushConstants) X(vkCmdDispatch) X(vkCmdPipelineBarrier)      \
    X(vkCmdCopyBuffer) X(vkQueueSubmit) X(vkCreateFence) X(vkDestroyFence) X(vkWaitForFences) X(vkResetFences)       \
    X(vkCreateShaderModule) X(vkDestroyShaderModule) X(vkCreatePipelineLayout) X(vkCreateComputePipelines)        \
    X(vkCreateQueryPool) X(vkDestroyQueryPool) X(vkCmdResetQueryPool) X(vkCmdWriteTimestamp) X(vkGetQueryPoolResults)

struct Api {
#define FASTLLM_VK_MEMBER(name) PFN_##name name = nullptr;
    FASTLLM_VK_FUNCTIONS(FASTLLM_VK_MEMBER)
#undef FASTLLM_VK_MEMBER
};

// One physical device as `fastllm devices` lists it.
struct DeviceInfo {
    int index;
    std::string name, type, vendor;
    uint32_t api_version;
    uint64_t memory_bytes;  // its largest device-local heap
    bool usable;            // has what the backend needs (Vulkan 1.2, buffer device address, 64-bit ints,
                            // subgroup arithmetic in compute shaders)
    std::string missing;    // what it lacks, if not usable
};

// The compute shaders (vk_shaders.cpp embeds their SPIR-V).
enum class Shader { Matmul, MatmulRows, MatmulQuant, Embed, Norm, Glu, Softcap, QkvRope, KvStore, KvShift, Attention, Quantize, Count };

class Device;

// A buffer with its memory, mapped when the memory is host-visible.
struct Buffer {
    VkBuffer buffer = VK_NULL_HANDLE;
    VkDeviceMemory memory = VK_NULL_HANDLE;
    uint64_t address = 0, bytes = 0;
    char *mapped = nullptr;
};

// The device's memory (arch/memory.h): 64 MiB buffers sub-allocated first fit (a KV block is one
// allocation of hundreds of KiB; drivers limit the number of allocations), larger requests in
// buffers of their own.
class DeviceMemory final : public Memory {
public:
    // FASTLLM_VULKAN_MAX_MEMORY=bytes caps what it hands out: how the tests run out of device memory.
    explicit DeviceMemory(Device &d) : dev_(d) {
        if (const char *cap = std::getenv("FASTLLM_VULKAN_MAX_MEMORY")) limit_ = std::strtoull(cap, nullptr, 10);
    }
    char *alloc(size_t bytes) override;
    void free(char *p) override;
    void copy(char *dst, const char *src, size_t bytes) override;

    // The buffer holding [addr, addr + bytes) and the offset of addr in it; FASTLLM_ERR_INTERNAL if
    // that range is not device memory (a host pointer reached the device).
    const Buffer &find(const void *addr, size_t bytes, uint64_t *offset);
    void upload(void *dst, const void *src, size_t bytes);
    void download(void *dst, const void *src, size_t bytes);
    size_t bytes_in_use() const { return in_use_; }

private:
    struct Chunk {
        Buffer buf;
        bool own = false;                 // one allocation's alone
        std::map<uint64_t, uint64_t> free;  // offset -> bytes
    };
    Chunk *chunk_of(uint64_t addr);
    Device &dev_;
    std::mutex mutex_;
    std::map<uint64_t, std::unique_ptr<Chunk>> chunks_;  // by device address
    std::map<uint64_t, uint64_t> sizes_;                 // allocated address -> bytes
    size_t in_use_ = 0, limit_ = 0;
};

class Device {
public:
    // The process's device, made on first use: device `index` of list(), or (-1) the first
    // discrete GPU, then integrated, then any usable one. Throws FASTLLM_ERR_UNSUPPORTED with what
    // is missing (no loader, no usable device, a feature), and for an index other than the one in
    // use (one Vulkan device per process).
    static Device &get(int index);
    // A host application's own device becomes the process's (fastllm_vulkan_set_device): before
    // any get(); never destroyed by fastllm.
    static void adopt(VkInstance instance, VkPhysicalDevice physical, VkDevice device, uint32_t queue_family,
                      uint32_t queue_index, PFN_vkGetInstanceProcAddr gipa);
    // The physical devices, or an empty list (and *why) without a loader or instance.
    static std::vector<DeviceInfo> list(std::string *why);

    const Api &api() const { return api_; }
    VkDevice device() const { return device_; }
    const DeviceInfo &info() const { return info_; }
    DeviceMemory &memory() { return memory_; }
    VkPipelineLayout layout() const { return layout_; }
    // The pipeline of a shader, specialised by `dtype` (its constant 0), made on first use.
    VkPipeline pipeline(Shader s, uint32_t dtype = 0);

    // Host-visible memory for a backend's per-pass parameters (coherent, mapped).
    Buffer make_host_buffer(uint64_t bytes);
    // Device memory; host_visible: mapped, else device-local preferred (staged copies).
    Buffer make_buffer(uint64_t bytes, bool host_visible);
    void destroy(Buffer &b);

    // Queue submission (the queue is shared: one submitter at a time).
    void submit(VkCommandBuffer cb, VkFence fence);
    // A command buffer of its own, run to completion (copies outside passes).
    template <typename F>
    void run_now(F &&record) {
        std::lock_guard<std::mutex> lock(once_mutex_);
        begin_once();
        record(once_cb_);
        end_once();
    }
    void check(VkResult r, const char *what) const;
    uint32_t queue_family() const { return queue_family_; }
    // Nanoseconds a tick of the queue's timestamps and the ticks' valid bits (0: the queue has none).
    double timestamp_ns() const { return timestamp_ns_; }
    uint32_t timestamp_bits() const { return timestamp_bits_; }

private:
    explicit Device(int index);
    Device(VkInstance instance, VkPhysicalDevice physical, VkDevice device, uint32_t queue_family, uint32_t queue_index,
           PFN_vkGetInstanceProcAddr gipa);
    void init();  // what both constructors share, once the device and queue are there
    void begin_once();
    void end_once();
    uint32_t memory_type(uint32_t bits, bool host_visible, bool *mapped) const;

    Api api_;
    VkInstance instance_ = VK_NULL_HANDLE;
    VkPhysicalDevice physical_ = VK_NULL_HANDLE;
    VkDevice device_ = VK_NULL_HANDLE;
    VkQueue queue_ = VK_NULL_HANDLE;
    uint32_t queue_family_ = 0;
    VkPhysicalDeviceMemoryProperties mem_props_{};
    double timestamp_ns_ = 0;
    uint32_t timestamp_bits_ = 0;
    DeviceInfo info_;
    bool staged_only_ = false;  // FASTLLM_VULKAN_STAGING=1: never map device memory (tests the staged path)
    VkPipelineLayout layout_ = VK_NULL_HANDLE;
    std::mutex pipeline_mutex_, queue_mutex_, once_mutex_;
    std::map<std::pair<int, uint32_t>, VkPipeline> pipelines_;
    VkCommandPool once_pool_ = VK_NULL_HANDLE;
    VkCommandBuffer once_cb_ = VK_NULL_HANDLE;
    VkFence once_fence_ = VK_NULL_HANDLE;
    DeviceMemory memory_{*this};
    Buffer staging_;  // for copies to and from memory the host cannot map
    std::mutex staging_mutex_;
    friend class DeviceMemory;
};

// Barrier: the writes of every command before it visible to every command after it.
void full_barrier(const Api &api, VkCommandBuffer cb);

// The embedded SPIR-V of a shader, its name (its .comp file's), and whether its constant 0 is a
// weight dtype (the matmuls, embed) rather than unused.
const uint32_t *shader_code(Shader s, size_t *bytes);
const char *shader_name(Shader s);
bool shader_by_dtype(Shader s);

}  // namespace fastllm::vk
