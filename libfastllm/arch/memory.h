// memory.h — memory a backend allocates: the KV cache's blocks and the working memory of passes
// come from it. Host memory for the CPU backend; a device backend's own memory, at addresses only
// that backend dereferences (the decoder and the KV block table compute addresses in it, never
// read it).
#pragma once

#include <cstddef>

namespace fastllm {

class Memory {
public:
    virtual ~Memory() = default;
    // `bytes` of memory aligned to 64, or nullptr when they are not available.
    virtual char *alloc(size_t bytes) = 0;
    virtual void free(char *p) = 0;
    // Copies bytes within this memory (a KV block's copy on write).
    virtual void copy(char *dst, const char *src, size_t bytes) = 0;
};

// The host's memory (platform::aligned_alloc): the CPU backend's.
Memory &host_memory();

}  // namespace fastllm
