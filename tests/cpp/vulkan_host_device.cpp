// vulkan_host_device.cpp — a host application (a game) that has its own Vulkan device hands it to
// fastllm (fastllm_vulkan_set_device) instead of letting it open a second one; run by
// tests/test_vulkan.py. Prints the greedy continuation of a prompt on its device and on the CPU.
//   vulkan_host_device MODEL.flm PROMPT N
#include <vulkan/vulkan.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "fastllm.h"

static void die(const char *what) {
    std::printf("error: %s\n", what);
    std::exit(1);
}

static std::string generate(const char *path, const char *device, const char *prompt, int n, std::string *backend) {
    fastllm_model_params mp = fastllm_model_default_params();
    mp.device = device;
    mp.n_threads = 2;
    fastllm_model *model = nullptr;
    if (fastllm_model_load(path, &mp, &model) != FASTLLM_OK) die(fastllm_last_error());
    fastllm_model_info info;
    fastllm_model_get_info(model, &info);
    *backend = info.backend;
    fastllm_session *s = nullptr;
    if (fastllm_session_create(model, nullptr, &s) != FASTLLM_OK) die(fastllm_last_error());
    std::vector<int32_t> ids(1024);
    size_t n_ids = 0;
    if (fastllm_tokenize(model, prompt, std::strlen(prompt), -1, ids.data(), ids.size(), &n_ids) != FASTLLM_OK)
        die(fastllm_last_error());
    fastllm_sampling_params sp = fastllm_sampling_default_params();
    sp.temperature = 0;
    sp.max_new_tokens = n;
    sp.ignore_eos = 1;
    std::string text;
    auto collect = [](const char *piece, size_t len, void *user) -> int {
        ((std::string *)user)->append(piece, len);
        return 0;
    };
    if (fastllm_session_generate(s, ids.data(), n_ids, &sp, collect, &text, nullptr) != FASTLLM_OK) die(fastllm_last_error());
    fastllm_session_free(s);
    fastllm_model_free(model);
    return text;
}

int main(int argc, char **argv) {
    if (argc != 4) die("usage: vulkan_host_device MODEL.flm PROMPT N");
    // The application's instance and device, with the features fastllm needs enabled.
    VkApplicationInfo app{VK_STRUCTURE_TYPE_APPLICATION_INFO};
    app.pApplicationName = "game";
    app.apiVersion = VK_API_VERSION_1_2;
    VkInstanceCreateInfo ici{VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO};
    ici.pApplicationInfo = &app;
    VkInstance instance;
    if (vkCreateInstance(&ici, nullptr, &instance) != VK_SUCCESS) die("vkCreateInstance");
    uint32_t n = 1;
    VkPhysicalDevice physical;
    if (vkEnumeratePhysicalDevices(instance, &n, &physical) < 0 || n == 0) die("no Vulkan device");
    uint32_t nf = 0;
    vkGetPhysicalDeviceQueueFamilyProperties(physical, &nf, nullptr);
    std::vector<VkQueueFamilyProperties> fams(nf);
    vkGetPhysicalDeviceQueueFamilyProperties(physical, &nf, fams.data());
    uint32_t family = 0;
    while (family < nf && !(fams[family].queueFlags & VK_QUEUE_COMPUTE_BIT)) family++;
    if (family == nf) die("no compute queue");
    const float priority = 1.0f;
    VkDeviceQueueCreateInfo qci{VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO};
    qci.queueFamilyIndex = family;
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
    VkDevice device;
    if (vkCreateDevice(physical, &dci, nullptr, &device) != VK_SUCCESS) die("vkCreateDevice");

    fastllm_vulkan_handles h{};
    h.instance = instance;
    h.physical_device = physical;
    h.device = device;
    h.queue_family = family;
    h.queue_index = 0;
    if (fastllm_vulkan_set_device(&h) != FASTLLM_OK) die(fastllm_last_error());
    std::string backend_gpu, backend_cpu;
    const std::string gpu = generate(argv[1], "vulkan", argv[2], std::atoi(argv[3]), &backend_gpu);
    const std::string cpu = generate(argv[1], "cpu", argv[2], std::atoi(argv[3]), &backend_cpu);
    // Once a device is in use, another cannot be handed over.
    const fastllm_status again = fastllm_vulkan_set_device(&h);
    std::printf("backend: %s\ngpu: %s\ncpu: %s\nagain: %s %s\n", backend_gpu.c_str(), gpu.c_str(), cpu.c_str(),
                fastllm_status_name(again), fastllm_last_error());
    // The application's device is still its own: it can wait on it and destroy it.
    if (vkDeviceWaitIdle(device) != VK_SUCCESS) die("vkDeviceWaitIdle");
    return 0;
}
