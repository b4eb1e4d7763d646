#include "vulkan/vk_device.h"

#include <cstdlib>
#include <cstring>

#include "base/error.h"
#include "base/log.h"
#include "platform/platform.h"

namespace fastllm::vk {

namespace {

constexpr uint64_t kChunk = 64ull << 20;   // sub-allocated buffers
constexpr uint64_t kStaging = 16ull << 20;  // copies to memory the host cannot map go through this

const char *result_name(VkResult r) {
    switch (r) {
    case VK_ERROR_OUT_OF_HOST_MEMORY: return "out of host memory";
    case VK_ERROR_OUT_OF_DEVICE_MEMORY: return "out of device memory";
    case VK_ERROR_INITIALIZATION_FAILED: return "initialization failed";
    case VK_ERROR_DEVICE_LOST: return "device lost";
    case VK_ERROR_INCOMPATIBLE_DRIVER: return "incompatible driver";
    case VK_ERROR_FEATURE_NOT_PRESENT: return "feature not present";
    case VK_ERROR_EXTENSION_NOT_PRESENT: return "extension not present";
    case VK_TIMEOUT: return "timeout";
    default: return "error";
    }
}

const char *type_name(VkPhysicalDeviceType t) {
    switch (t) {
    case VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU: return "discrete";
    case VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU: return "integrated";
    case VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU: return "virtual";
    case VK_PHYSICAL_DEVICE_TYPE_CPU: return "cpu";
    default: return "other";
    }
}

std::string vendor_name(uint32_t id) {
    switch (id) {
    case 0x10de: return "NVIDIA";
    case 0x1002: return "AMD";
    case 0x8086: return "Intel";
    case 0x13b5: return "ARM";
    case 0x5143: return "Qualcomm";
    case 0x106b: return "Apple";
    case 0x10005: return "Mesa";
    default: {
        char buf[16];
        std::snprintf(buf, sizeof buf, "0x%04x", id);
        return buf;
    }
    }
}

// The loader and an instance: shared by Device::get and Device::list. Empty `error` when usable.
struct Instance {
    Api api;
    PFN_vkGetInstanceProcAddr gipa = nullptr;  // the loader's
    VkInstance instance = VK_NULL_HANDLE;
    std::string error;
};

// The functions of an instance through gipa; false (and *missing) when one is absent.
bool load_functions(PFN_vkGetInstanceProcAddr gipa, VkInstance instance, Api &api, std::string *missing) {
#define FASTLLM_VK_LOAD(name) \
    if (!api.name) api.name = (PFN_##name)gipa(instance, #name);
    FASTLLM_VK_FUNCTIONS(FASTLLM_VK_LOAD)
#undef FASTLLM_VK_LOAD
#define FASTLLM_VK_CHECK(name) \
    if (!api.name && missing->empty()) *missing = #name;
    FASTLLM_VK_FUNCTIONS(FASTLLM_VK_CHECK)
#undef FASTLLM_VK_CHECK
    return missing->empty();
}

Instance &instance_of_loader() {
    static Instance *in = [] {
        auto *r = new Instance;  // never destroyed: drivers may run threads until the process ends
#if defined(_WIN32)
        const char *names[] = {"vulkan-1.dll"};
#elif defined(__APPLE__)
        const char *names[] = {"libvulkan.1.dylib", "libMoltenVK.dylib"};
#else
        const char *names[] = {"libvulkan.so.1", "libvulkan.so"};
#endif
        void *lib = nullptr;
        const char *own = std::getenv("FASTLLM_VULKAN_LOADER");  // another loader library, by path
        if (own && *own) names[0] = own;
        for (const char *n : names)
            if ((lib = platform::open_library(n)) || (own && *own)) break;
        auto gipa = (PFN_vkGetInstanceProcAddr)platform::library_symbol(lib, "vkGetInstanceProcAddr");
        r->gipa = gipa;
        if (!gipa) {
            r->error = std::string("no Vulkan loader (") + names[0] + ") on this machine";
            return r;
        }
        r->api.vkCreateInstance = (PFN_vkCreateInstance)gipa(nullptr, "vkCreateInstance");
        r->api.vkEnumerateInstanceVersion = (PFN_vkEnumerateInstanceVersion)gipa(nullptr, "vkEnumerateInstanceVersion");
        if (!r->api.vkEnumerateInstanceVersion)  // Wine's loader exports it without handing it out
            r->api.vkEnumerateInstanceVersion = (PFN_vkEnumerateInstanceVersion)platform::library_symbol(lib, "vkEnumerateInstanceVersion");
        if (!r->api.vkCreateInstance)
            r->api.vkCreateInstance = (PFN_vkCreateInstance)platform::library_symbol(lib, "vkCreateInstance");
        uint32_t version = VK_API_VERSION_1_0;
        if (r->api.vkEnumerateInstanceVersion) r->api.vkEnumerateInstanceVersion(&version);
        if (!r->api.vkCreateInstance) {
            r->error = "the Vulkan loader lacks vkCreateInstance";
            return r;
        }
        VkApplicationInfo app{VK_STRUCTURE_TYPE_APPLICATION_INFO};
        app.pApplicationName = "fastllm";
        app.apiVersion = VK_API_VERSION_1_2;
        VkInstanceCreateInfo ci{VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO};
        ci.pApplicationInfo = &app;
        // A loader reporting an older version may still create a 1.2 instance (Wine 8's says 1.0);
        // its devices' versions decide.
        const VkResult res = r->api.vkCreateInstance(&ci, nullptr, &r->instance);
        if (res != VK_SUCCESS) {
            r->error = std::string("cannot create a Vulkan 1.2 instance (the loader offers ") +
                       std::to_string(VK_API_VERSION_MAJOR(version)) + "." + std::to_string(VK_API_VERSION_MINOR(version)) +
                       "): " + result_name(res);
            return r;
        }
        std::string missing;
        if (!load_functions(gipa, r->instance, r->api, &missing)) r->error = "the Vulkan loader lacks " + missing;
        return r;
    }();
    return *in;
}

std::vector<VkQueueFamilyProperties> queue_families(const Api &api, VkPhysicalDevice pd) {
    uint32_t n = 0;
    api.vkGetPhysicalDeviceQueueFamilyProperties(pd, &n, nullptr);
    std::vector<VkQueueFamilyProperties> fams(n);
    api.vkGetPhysicalDeviceQueueFamilyProperties(pd, &n, fams.data());
    return fams;
}

// What a physical device is, and whether it has what the shaders need.
DeviceInfo describe(const Api &api, VkPhysicalDevice pd, int index, uint32_t *compute_family) {
    VkPhysicalDeviceProperties props;
    api.vkGetPhysicalDeviceProperties(pd, &props);
    VkPhysicalDeviceVulkan12Features f12{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES};
    VkPhysicalDeviceFeatures2 f{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2};
    VkPhysicalDeviceSubgroupProperties sub{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_PROPERTIES};
    if (props.apiVersion >= VK_API_VERSION_1_2) {
        f.pNext = &f12;
        api.vkGetPhysicalDeviceFeatures2(pd, &f);
        VkPhysicalDeviceProperties2 p2{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2};
        p2.pNext = &sub;
        api.vkGetPhysicalDeviceProperties2(pd, &p2);
    }
    VkPhysicalDeviceMemoryProperties mem;
    api.vkGetPhysicalDeviceMemoryProperties(pd, &mem);
    uint64_t biggest = 0;
    for (uint32_t i = 0; i < mem.memoryHeapCount; i++)
        if (mem.memoryHeaps[i].flags & VK_MEMORY_HEAP_DEVICE_LOCAL_BIT) biggest = std::max<uint64_t>(biggest, mem.memoryHeaps[i].size);
    const std::vector<VkQueueFamilyProperties> fams = queue_families(api, pd);
    const uint32_t n = (uint32_t)fams.size();
    int family = -1;
    for (uint32_t i = 0; i < n && family < 0; i++)
        if (fams[i].queueFlags & VK_QUEUE_COMPUTE_BIT) family = (int)i;
    if (compute_family) *compute_family = family < 0 ? 0 : (uint32_t)family;

    DeviceInfo d{index, props.deviceName, type_name(props.deviceType), vendor_name(props.vendorID), props.apiVersion, biggest, true, ""};
    auto lacks = [&](const char *what) {
        d.usable = false;
        d.missing += d.missing.empty() ? what : std::string(", ") + what;
    };
    if (props.apiVersion < VK_API_VERSION_1_2) lacks("Vulkan 1.2");
    else if (!f12.bufferDeviceAddress) lacks("bufferDeviceAddress");
    if (!f.features.shaderInt64) lacks("shaderInt64");
    if (props.apiVersion >= VK_API_VERSION_1_2 &&
        (!(sub.supportedStages & VK_SHADER_STAGE_COMPUTE_BIT) || !(sub.supportedOperations & VK_SUBGROUP_FEATURE_ARITHMETIC_BIT)))
        lacks("subgroup arithmetic in compute shaders");
    if (family < 0) lacks("a compute queue");
    return d;
}

int type_rank(const std::string &t) { return t == "discrete" ? 0 : t == "integrated" ? 1 : t == "virtual" ? 2 : 3; }

}  // namespace

std::vector<DeviceInfo> Device::list(std::string *why) {
    Instance &in = instance_of_loader();
    std::vector<DeviceInfo> out;
    if (!in.error.empty()) {
        if (why) *why = in.error;
        return out;
    }
    uint32_t n = 0;
    in.api.vkEnumeratePhysicalDevices(in.instance, &n, nullptr);
    std::vector<VkPhysicalDevice> pds(n);
    in.api.vkEnumeratePhysicalDevices(in.instance, &n, pds.data());
    for (uint32_t i = 0; i < n; i++) out.push_back(describe(in.api, pds[i], (int)i, nullptr));
    if (out.empty() && why) *why = "no Vulkan device";
    return out;
}

namespace {
std::mutex g_device_mutex;
Device *g_device = nullptr;                 // never destroyed, as the instance
std::map<int, std::string> g_device_errors;  // a device that failed fails the same way again
}  // namespace

Device &Device::get(int index) {
    std::lock_guard<std::mutex> lock(g_device_mutex);
    if (g_device) {
        if (index >= 0 && index != g_device->info_.index)
            fail(FASTLLM_ERR_UNSUPPORTED, "vulkan: device %d (%s) is in use; one Vulkan device per process",
                 g_device->info_.index, g_device->info_.name.c_str());
        return *g_device;
    }
    auto e = g_device_errors.find(index);
    if (e != g_device_errors.end()) fail(FASTLLM_ERR_UNSUPPORTED, "%s", e->second.c_str());
    try {
        g_device = new Device(index);
    } catch (const Error &err) {
        if (err.status() == FASTLLM_ERR_UNSUPPORTED) g_device_errors[index] = err.what();
        throw;
    }
    return *g_device;
}

void Device::adopt(VkInstance instance, VkPhysicalDevice physical, VkDevice device, uint32_t queue_family,
                   uint32_t queue_index, PFN_vkGetInstanceProcAddr gipa) {
    std::lock_guard<std::mutex> lock(g_device_mutex);
    if (g_device)
        fail(FASTLLM_ERR_INVALID_ARGUMENT, "vulkan: %s is in use already; hand over a device before any model uses Vulkan",
             g_device->info_.name.c_str());
    if (!instance || !physical || !device) fail(FASTLLM_ERR_INVALID_ARGUMENT, "vulkan: a NULL instance, physical device or device");
    g_device = new Device(instance, physical, device, queue_family, queue_index, gipa);
}

Device::Device(VkInstance instance, VkPhysicalDevice physical, VkDevice device, uint32_t queue_family,
               uint32_t queue_index, PFN_vkGetInstanceProcAddr gipa) {
    if (!gipa) {
        Instance &in = instance_of_loader();
        if (!in.gipa) fail(FASTLLM_ERR_UNSUPPORTED, "vulkan: %s", in.error.c_str());
        gipa = in.gipa;
    }
    std::string missing;
    if (!load_functions(gipa, instance, api_, &missing)) fail(FASTLLM_ERR_UNSUPPORTED, "vulkan: the host's instance lacks %s", missing.c_str());
    instance_ = instance, physical_ = physical, device_ = device;
    uint32_t compute_family = 0;
    info_ = describe(api_, physical_, -1, &compute_family);
    info_.name += " (the application's)";
    if (!info_.usable) fail(FASTLLM_ERR_UNSUPPORTED, "vulkan: the application's device %s lacks %s", info_.name.c_str(), info_.missing.c_str());
    const std::vector<VkQueueFamilyProperties> fams = queue_families(api_, physical_);
    if (queue_family >= fams.size() || !(fams[queue_family].queueFlags & VK_QUEUE_COMPUTE_BIT) || queue_index >= fams[queue_family].queueCount)
        fail(FASTLLM_ERR_INVALID_ARGUMENT, "vulkan: queue %u of family %u is not a compute queue of the device", queue_index, queue_family);
    queue_family_ = queue_family;
    api_.vkGetDeviceQueue(device_, queue_family_, queue_index, &queue_);
    init();
}

Device::Device(int index) {
    Instance &in = instance_of_loader();
    if (!in.error.empty()) fail(FASTLLM_ERR_UNSUPPORTED, "vulkan: %s", in.error.c_str());
    api_ = in.api;
    instance_ = in.instance;
    uint32_t n = 0;
    api_.vkEnumeratePhysicalDevices(instance_, &n, nullptr);
    std::vector<VkPhysicalDevice> pds(n);
    api_.vkEnumeratePhysicalDevices(instance_, &n, pds.data());
    if (n == 0) fail(FASTLLM_ERR_UNSUPPORTED, "vulkan: no Vulkan device on this machine");
    int pick = index;
    std::string why;
    if (pick >= 0) {
        if (pick >= (int)n) fail(FASTLLM_ERR_UNSUPPORTED, "vulkan: no device %d (this machine has %u)", pick, n);
        const DeviceInfo d = describe(api_, pds[pick], pick, nullptr);
        if (!d.usable) fail(FASTLLM_ERR_UNSUPPORTED, "vulkan: device %d (%s) lacks %s", pick, d.name.c_str(), d.missing.c_str());
    } else {
        for (uint32_t i = 0; i < n; i++) {
            const DeviceInfo d = describe(api_, pds[i], (int)i, nullptr);
            if (!d.usable) {
                why += (why.empty() ? "" : "; ") + d.name + " lacks " + d.missing;
                continue;
            }
            if (pick < 0 || type_rank(d.type) < type_rank(describe(api_, pds[pick], pick, nullptr).type)) pick = (int)i;
        }
        if (pick < 0) fail(FASTLLM_ERR_UNSUPPORTED, "vulkan: no usable device (%s)", why.c_str());
    }
    physical_ = pds[pick];
    info_ = describe(api_, physical_, pick, &queue_family_);

    const float priority = 1.0f;
    VkDeviceQueueCreateInfo qci{VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO};
    qci.queueFamilyIndex = queue_family_;
    qci.queueCount = 1;
    qci.pQueuePriorities = &priority;
    VkPhysicalDeviceVulkan12Features f12{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES};
    f12.bufferDeviceAddress = VK_TRUE;
    VkPhysicalDeviceFeatures2 f{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2};
    f.pNext = &f12;
    f.features.shaderInt64 = VK_TRUE;
    VkDeviceCreateInfo dci{VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO};
    dci.pNext = &f;
    dci.queueCreateInfoCount = 1;
    dci.pQueueCreateInfos = &qci;
    check(api_.vkCreateDevice(physical_, &dci, nullptr, &device_), "creating the device");
    api_.vkGetDeviceQueue(device_, queue_family_, 0, &queue_);
    init();
}

void Device::init() {
    api_.vkGetPhysicalDeviceMemoryProperties(physical_, &mem_props_);
    VkPhysicalDeviceProperties props{};
    api_.vkGetPhysicalDeviceProperties(physical_, &props);
    const std::vector<VkQueueFamilyProperties> fams = queue_families(api_, physical_);
    if (queue_family_ < fams.size() && fams[queue_family_].timestampValidBits > 0 && props.limits.timestampPeriod > 0)
        timestamp_ns_ = props.limits.timestampPeriod, timestamp_bits_ = fams[queue_family_].timestampValidBits;
    const char *st = std::getenv("FASTLLM_VULKAN_STAGING");
    staged_only_ = st && std::strcmp(st, "1") == 0;

    VkPushConstantRange range{VK_SHADER_STAGE_COMPUTE_BIT, 0, 128};
    VkPipelineLayoutCreateInfo lci{VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO};
    lci.pushConstantRangeCount = 1;
    lci.pPushConstantRanges = &range;
    check(api_.vkCreatePipelineLayout(device_, &lci, nullptr, &layout_), "creating the pipeline layout");

    VkCommandPoolCreateInfo pci{VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO};
    pci.flags = VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT;
    pci.queueFamilyIndex = queue_family_;
    check(api_.vkCreateCommandPool(device_, &pci, nullptr, &once_pool_), "creating a command pool");
    VkCommandBufferAllocateInfo ai{VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO};
    ai.commandPool = once_pool_;
    ai.level = VK_COMMAND_BUFFER_LEVEL_PRIMARY;
    ai.commandBufferCount = 1;
    check(api_.vkAllocateCommandBuffers(device_, &ai, &once_cb_), "allocating a command buffer");
    VkFenceCreateInfo fci{VK_STRUCTURE_TYPE_FENCE_CREATE_INFO};
    check(api_.vkCreateFence(device_, &fci, nullptr, &once_fence_), "creating a fence");
    log(FASTLLM_LOG_INFO, "vulkan: %s (%s %s, Vulkan %u.%u, %.0f MiB)%s", info_.name.c_str(), info_.vendor.c_str(), info_.type.c_str(),
             VK_API_VERSION_MAJOR(info_.api_version), VK_API_VERSION_MINOR(info_.api_version),
             info_.memory_bytes / 1048576.0, staged_only_ ? ", staged copies only" : "");
}

void Device::check(VkResult r, const char *what) const {
    if (r == VK_SUCCESS) return;
    const fastllm_status s = r == VK_ERROR_OUT_OF_DEVICE_MEMORY || r == VK_ERROR_OUT_OF_HOST_MEMORY ? FASTLLM_ERR_OUT_OF_MEMORY
                                                                                                    : FASTLLM_ERR_INTERNAL;
    fail(s, "vulkan (%s): %s: %s (VkResult %d)", info_.name.c_str(), what, result_name(r), (int)r);
}

uint32_t Device::memory_type(uint32_t bits, bool host_visible, bool *mapped) const {
    const VkMemoryPropertyFlags host = VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT;
    const VkMemoryPropertyFlags local = VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT;
    // In order of preference: host-visible memory for host buffers; for device memory, device-local
    // memory the host can map (unified memory, resizable BAR, lavapipe), then device-local alone.
    std::vector<VkMemoryPropertyFlags> wants;
    if (host_visible) wants = {host | local, host};
    else if (staged_only_) wants = {local};
    else wants = {local | host, local};
    for (VkMemoryPropertyFlags want : wants)
        for (uint32_t i = 0; i < mem_props_.memoryTypeCount; i++)
            if ((bits >> i & 1) && (mem_props_.memoryTypes[i].propertyFlags & want) == want) {
                const bool can_map = (mem_props_.memoryTypes[i].propertyFlags & host) == host;
                *mapped = can_map && !(staged_only_ && !host_visible);
                return i;
            }
    return UINT32_MAX;
}

Buffer Device::make_buffer(uint64_t bytes, bool host_visible) {
    Buffer b;
    b.bytes = bytes;
    VkBufferCreateInfo bci{VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO};
    bci.size = bytes;
    bci.usage = VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | VK_BUFFER_USAGE_TRANSFER_SRC_BIT | VK_BUFFER_USAGE_TRANSFER_DST_BIT |
                VK_BUFFER_USAGE_SHADER_DEVICE_ADDRESS_BIT;
    bci.sharingMode = VK_SHARING_MODE_EXCLUSIVE;
    if (api_.vkCreateBuffer(device_, &bci, nullptr, &b.buffer) != VK_SUCCESS) return Buffer{};
    VkMemoryRequirements req;
    api_.vkGetBufferMemoryRequirements(device_, b.buffer, &req);
    VkMemoryAllocateFlagsInfo flags{VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_FLAGS_INFO};
    flags.flags = VK_MEMORY_ALLOCATE_DEVICE_ADDRESS_BIT;
    VkMemoryAllocateInfo mai{VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO};
    mai.pNext = &flags;
    mai.allocationSize = req.size;
    bool mapped = false;
    mai.memoryTypeIndex = memory_type(req.memoryTypeBits, host_visible, &mapped);
    VkResult r = mai.memoryTypeIndex == UINT32_MAX ? VK_ERROR_OUT_OF_DEVICE_MEMORY : api_.vkAllocateMemory(device_, &mai, nullptr, &b.memory);
    if (r != VK_SUCCESS && !host_visible && mapped) {
        // The mappable device-local heap is small on a discrete GPU without resizable BAR (256 MiB):
        // the rest goes to plain device memory.
        for (uint32_t i = 0; i < mem_props_.memoryTypeCount; i++)
            if ((req.memoryTypeBits >> i & 1) && (mem_props_.memoryTypes[i].propertyFlags & VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT) &&
                !(mem_props_.memoryTypes[i].propertyFlags & VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT)) {
                mai.memoryTypeIndex = i, mapped = false;
                r = api_.vkAllocateMemory(device_, &mai, nullptr, &b.memory);
                break;
            }
    }
    if (r != VK_SUCCESS || api_.vkBindBufferMemory(device_, b.buffer, b.memory, 0) != VK_SUCCESS) {
        destroy(b);
        return Buffer{};
    }
    if (mapped && api_.vkMapMemory(device_, b.memory, 0, VK_WHOLE_SIZE, 0, (void **)&b.mapped) != VK_SUCCESS) b.mapped = nullptr;
    if (host_visible && !b.mapped) {
        destroy(b);
        return Buffer{};
    }
    VkBufferDeviceAddressInfo dai{VK_STRUCTURE_TYPE_BUFFER_DEVICE_ADDRESS_INFO};
    dai.buffer = b.buffer;
    b.address = api_.vkGetBufferDeviceAddress(device_, &dai);
    return b;
}

Buffer Device::make_host_buffer(uint64_t bytes) { return make_buffer(bytes, true); }

void Device::destroy(Buffer &b) {
    if (b.buffer) api_.vkDestroyBuffer(device_, b.buffer, nullptr);
    if (b.memory) api_.vkFreeMemory(device_, b.memory, nullptr);  // unmaps
    b = Buffer{};
}

void Device::submit(VkCommandBuffer cb, VkFence fence) {
    VkSubmitInfo si{VK_STRUCTURE_TYPE_SUBMIT_INFO};
    si.commandBufferCount = 1;
    si.pCommandBuffers = &cb;
    std::lock_guard<std::mutex> lock(queue_mutex_);
    check(api_.vkQueueSubmit(queue_, 1, &si, fence), "submitting work");
}

void Device::begin_once() {
    check(api_.vkResetCommandBuffer(once_cb_, 0), "resetting a command buffer");
    VkCommandBufferBeginInfo bi{VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO};
    bi.flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT;
    check(api_.vkBeginCommandBuffer(once_cb_, &bi), "recording a copy");
    full_barrier(api_, once_cb_);
}

void Device::end_once() {
    full_barrier(api_, once_cb_);
    check(api_.vkEndCommandBuffer(once_cb_), "recording a copy");
    check(api_.vkResetFences(device_, 1, &once_fence_), "resetting a fence");
    submit(once_cb_, once_fence_);
    check(api_.vkWaitForFences(device_, 1, &once_fence_, VK_TRUE, UINT64_MAX), "waiting for a copy");
}

VkPipeline Device::pipeline(Shader s, uint32_t dtype) {
    std::lock_guard<std::mutex> lock(pipeline_mutex_);
    auto it = pipelines_.find({(int)s, dtype});
    if (it != pipelines_.end()) return it->second;
    size_t bytes = 0;
    const uint32_t *code = shader_code(s, &bytes);
    VkShaderModuleCreateInfo mci{VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO};
    mci.codeSize = bytes;
    mci.pCode = code;
    VkShaderModule module;
    check(api_.vkCreateShaderModule(device_, &mci, nullptr, &module), "loading a shader");
    VkSpecializationMapEntry entry{0, 0, sizeof(uint32_t)};
    VkSpecializationInfo spec{1, &entry, sizeof(uint32_t), &dtype};
    VkComputePipelineCreateInfo ci{VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO};
    ci.stage.sType = VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO;
    ci.stage.stage = VK_SHADER_STAGE_COMPUTE_BIT;
    ci.stage.module = module;
    ci.stage.pName = "main";
    ci.stage.pSpecializationInfo = &spec;
    ci.layout = layout_;
    VkPipeline p;
    const VkResult r = api_.vkCreateComputePipelines(device_, VK_NULL_HANDLE, 1, &ci, nullptr, &p);
    api_.vkDestroyShaderModule(device_, module, nullptr);
    check(r, "compiling a pipeline");
    pipelines_.emplace(std::make_pair((int)s, dtype), p);
    return p;
}

void full_barrier(const Api &api, VkCommandBuffer cb) {
    VkMemoryBarrier mb{VK_STRUCTURE_TYPE_MEMORY_BARRIER};
    mb.srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_WRITE_BIT | VK_ACCESS_HOST_WRITE_BIT;
    mb.dstAccessMask = VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_READ_BIT |
                       VK_ACCESS_TRANSFER_WRITE_BIT | VK_ACCESS_HOST_READ_BIT;
    api.vkCmdPipelineBarrier(cb, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT | VK_PIPELINE_STAGE_HOST_BIT,
                             VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT | VK_PIPELINE_STAGE_HOST_BIT,
                             0, 1, &mb, 0, nullptr, 0, nullptr);
}

// ---- memory ----

DeviceMemory::Chunk *DeviceMemory::chunk_of(uint64_t addr) {
    auto it = chunks_.upper_bound(addr);
    if (it == chunks_.begin()) return nullptr;
    --it;
    return addr < it->first + it->second->buf.bytes ? it->second.get() : nullptr;
}

char *DeviceMemory::alloc(size_t bytes) {
    const uint64_t n = (std::max<uint64_t>(bytes, 1) + 63) / 64 * 64;
    std::lock_guard<std::mutex> lock(mutex_);
    auto place = [&](Chunk &c) -> uint64_t {
        for (auto it = c.free.begin(); it != c.free.end(); ++it)
            if (it->second >= n) {
                const uint64_t off = it->first, left = it->second - n;
                c.free.erase(it);
                if (left) c.free.emplace(off + n, left);
                return c.buf.address + off;
            }
        return 0;
    };
    if (limit_ && in_use_ + n > limit_) return nullptr;
    uint64_t addr = 0;
    if (n <= kChunk / 4)
        for (auto &c : chunks_)
            if (!c.second->own && (addr = place(*c.second))) break;
    if (!addr) {
        auto c = std::make_unique<Chunk>();
        c->own = n > kChunk / 4;
        c->buf = dev_.make_buffer((c->own ? n : kChunk) + 64, false);
        if (!c->buf.buffer) return nullptr;
        const uint64_t pad = (64 - c->buf.address % 64) % 64;  // addresses 64-aligned
        c->free.emplace(pad, c->buf.bytes - pad - (64 - pad));
        addr = place(*c);
        chunks_.emplace(c->buf.address, std::move(c));
    }
    sizes_[addr] = n;
    in_use_ += n;
    return (char *)(uintptr_t)addr;
}

void DeviceMemory::free(char *p) {
    if (!p) return;
    std::lock_guard<std::mutex> lock(mutex_);
    const uint64_t addr = (uint64_t)(uintptr_t)p;
    auto s = sizes_.find(addr);
    Chunk *c = s == sizes_.end() ? nullptr : chunk_of(addr);
    if (!c) return;  // not ours: nothing to free
    const uint64_t n = s->second;
    sizes_.erase(s);
    in_use_ -= n;
    uint64_t off = addr - c->buf.address, len = n;
    auto next = c->free.lower_bound(off);
    if (next != c->free.end() && next->first == off + len) len += next->second, next = c->free.erase(next);
    if (next != c->free.begin()) {
        auto prev = std::prev(next);
        if (prev->first + prev->second == off) off = prev->first, len += prev->second, c->free.erase(prev);
    }
    c->free.emplace(off, len);
    const uint64_t pad = (64 - c->buf.address % 64) % 64;
    if (c->free.size() == 1 && c->free.begin()->first == pad && c->free.begin()->second == c->buf.bytes - pad - (64 - pad)) {
        const uint64_t key = c->buf.address;
        dev_.destroy(c->buf);
        chunks_.erase(key);
    }
}

const Buffer &DeviceMemory::find(const void *addr, size_t bytes, uint64_t *offset) {
    std::lock_guard<std::mutex> lock(mutex_);
    const uint64_t a = (uint64_t)(uintptr_t)addr;
    Chunk *c = chunk_of(a);
    if (!c || a + bytes > c->buf.address + c->buf.bytes)
        fail(FASTLLM_ERR_INTERNAL, "vulkan: %zu bytes at %p are not device memory (a host pointer reached the device)", bytes, addr);
    *offset = a - c->buf.address;
    return c->buf;
}

void DeviceMemory::copy(char *dst, const char *src, size_t bytes) {
    uint64_t so, doff;
    const Buffer &s = find(src, bytes, &so), &d = find(dst, bytes, &doff);
    const VkBuffer sb = s.buffer, db = d.buffer;
    dev_.run_now([&](VkCommandBuffer cb) {
        VkBufferCopy region{so, doff, bytes};
        dev_.api().vkCmdCopyBuffer(cb, sb, db, 1, &region);
    });
}

void DeviceMemory::upload(void *dst, const void *src, size_t bytes) {
    uint64_t off;
    const Buffer &b = find(dst, bytes, &off);
    if (b.mapped) {
        std::memcpy(b.mapped + off, src, bytes);
        return;
    }
    std::lock_guard<std::mutex> lock(dev_.staging_mutex_);
    if (!dev_.staging_.buffer && !(dev_.staging_ = dev_.make_host_buffer(kStaging)).buffer)
        fail(FASTLLM_ERR_OUT_OF_MEMORY, "vulkan: cannot allocate a staging buffer");
    for (size_t done = 0; done < bytes; done += kStaging) {
        const size_t n = std::min<size_t>(kStaging, bytes - done);
        std::memcpy(dev_.staging_.mapped, (const char *)src + done, n);
        dev_.run_now([&](VkCommandBuffer cb) {
            VkBufferCopy region{0, off + done, n};
            dev_.api().vkCmdCopyBuffer(cb, dev_.staging_.buffer, b.buffer, 1, &region);
        });
    }
}

void DeviceMemory::download(void *dst, const void *src, size_t bytes) {
    uint64_t off;
    const Buffer &b = find(src, bytes, &off);
    if (b.mapped) {
        std::memcpy(dst, b.mapped + off, bytes);
        return;
    }
    std::lock_guard<std::mutex> lock(dev_.staging_mutex_);
    if (!dev_.staging_.buffer && !(dev_.staging_ = dev_.make_host_buffer(kStaging)).buffer)
        fail(FASTLLM_ERR_OUT_OF_MEMORY, "vulkan: cannot allocate a staging buffer");
    for (size_t done = 0; done < bytes; done += kStaging) {
        const size_t n = std::min<size_t>(kStaging, bytes - done);
        dev_.run_now([&](VkCommandBuffer cb) {
            VkBufferCopy region{off + done, 0, n};
            dev_.api().vkCmdCopyBuffer(cb, b.buffer, dev_.staging_.buffer, 1, &region);
        });
        std::memcpy((char *)dst + done, dev_.staging_.mapped, n);
    }
}

}  // namespace fastllm::vk
