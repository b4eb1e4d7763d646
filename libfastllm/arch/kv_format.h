// kv_format.h — the row format of the KV cache: what a backend stores a key or value row as.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

namespace fastllm {

// Element types of a session's KV cache (the values of fastllm_kv_type). A row of n values takes
// n floats (f32), n halves (f16), or (q8) per block of 32 values a float scale then 32 int8 codes
// (the last block zero-padded): 1.125 bytes a value, read in place by the attention kernels.
enum class KvType : int { F32 = 0, F16 = 1, Q8 = 2 };
constexpr int kNumKvTypes = 3;
constexpr int kKvQ8Block = 32;
constexpr size_t kKvQ8BlockBytes = 4 + kKvQ8Block;
inline const char *kv_type_name(KvType t) {
    static const char *const names[kNumKvTypes] = {"f32", "f16", "q8"};
    return (int)t >= 0 && (int)t < kNumKvTypes ? names[(int)t] : "?";
}
// Block b of a q8 row: its scale, and its 32 codes.
inline float kv_q8_scale(const char *row, int b) {
    float d;
    __builtin_memcpy(&d, row + (size_t)b * kKvQ8BlockBytes, 4);
    return d;
}
inline const int8_t *kv_q8_codes(const char *row, int b) { return (const int8_t *)row + (size_t)b * kKvQ8BlockBytes + 4; }
// Writes n values as a q8 row: per block, amax / 127 and the codes rounded half to even (the
// portable form; every ISA's kv_store reads and writes the same bytes).
inline void kv_q8_store_row(const float *x, int n, void *row) {
    for (int b = 0; b * kKvQ8Block < n; b++) {
        const int len = std::min(kKvQ8Block, n - b * kKvQ8Block);
        const float *xb = x + b * kKvQ8Block;
        float amax = 0;
        for (int i = 0; i < len; i++) amax = std::max(amax, std::fabs(xb[i]));
        const float d = amax / 127.0f, id = amax > 0 ? 127.0f / amax : 0.0f;
        char *blk = (char *)row + (size_t)b * kKvQ8BlockBytes;
        std::memcpy(blk, &d, 4);
        int8_t *c = (int8_t *)blk + 4;
        for (int i = 0; i < kKvQ8Block; i++) c[i] = i < len ? (int8_t)std::nearbyint(xb[i] * id) : 0;
    }
}
inline size_t kv_row_bytes(KvType t, int n) {
    if (t == KvType::F32) return (size_t)n * 4;
    if (t == KvType::F16) return (size_t)n * 2;
    return (size_t)(n + kKvQ8Block - 1) / kKvQ8Block * kKvQ8BlockBytes;
}

}  // namespace fastllm
