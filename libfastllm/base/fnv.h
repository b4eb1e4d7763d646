// fnv.h — FNV-1a, 64 bits: the model's fingerprint and the saved state's checksum (fast, no table,
// and a changed byte changes the value).
#pragma once

#include <cstddef>
#include <cstdint>

namespace fastllm {

struct Fnv1a {
    uint64_t h = 0xcbf29ce484222325ull;
    void add(const void *p, size_t n) {
        for (size_t i = 0; i < n; i++) h = (h ^ ((const uint8_t *)p)[i]) * 0x100000001b3ull;
    }
    template <typename T>
    void add_value(T v) { add(&v, sizeof v); }
};

}  // namespace fastllm
