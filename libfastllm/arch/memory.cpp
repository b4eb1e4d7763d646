#include "arch/memory.h"

#include <cstring>

#include "platform/platform.h"

namespace fastllm {

namespace {
struct HostMemory final : Memory {
    char *alloc(size_t bytes) override { return (char *)platform::aligned_alloc(64, bytes); }
    void free(char *p) override { platform::aligned_free(p); }
    void copy(char *dst, const char *src, size_t bytes) override { std::memcpy(dst, src, bytes); }
};
}  // namespace

Memory &host_memory() {
    static HostMemory host;
    return host;
}

}  // namespace fastllm
