// arena.h — one allocation, carved into aligned buffers when a session is created, so the
// forward pass never allocates. Plan with reserve(), then allocate once, then take() in order.
#pragma once

#include <cstddef>
#include <cstdlib>
#include <new>

namespace fastllm {

class Arena {
public:
    static constexpr size_t kAlign = 64;

    Arena() = default;
    ~Arena() { std::free(base_); }
    Arena(const Arena &) = delete;
    Arena &operator=(const Arena &) = delete;

    // Allocates `floats` floats' worth of memory plus alignment slack for `n_buffers` buffers.
    // Returns false if the memory is not available.
    bool allocate(size_t floats, size_t n_buffers) {
        size_t bytes = floats * sizeof(float) + n_buffers * kAlign;
        if (posix_memalign(&base_, kAlign, bytes) != 0) return false;
        capacity_ = bytes;
        return true;
    }
    float *take(size_t floats) {
        size_t bytes = (floats * sizeof(float) + kAlign - 1) / kAlign * kAlign;
        if (used_ + bytes > capacity_) throw std::bad_alloc();  // a planning bug, caught at session creation
        float *p = (float *)((char *)base_ + used_);
        used_ += bytes;
        return p;
    }
    size_t bytes() const { return capacity_; }

private:
    void *base_ = nullptr;
    size_t capacity_ = 0, used_ = 0;
};

}  // namespace fastllm
