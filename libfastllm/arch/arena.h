// arena.h — one allocation, carved into aligned buffers when the working memory of a model's
// passes is reserved (runtime/compute.h), so the forward pass never allocates. The memory plan is
// derived, not kept in sync by hand: the same carve function runs twice, first on a planning arena
// (take() only adds up the sizes and returns nullptr), then, after allocate(), on the real memory.
#pragma once

#include <cstddef>
#include <cstdlib>
#include <new>

#include "arch/memory.h"

namespace fastllm {

class Arena {
public:
    static constexpr size_t kAlign = 64;

    // The buffers come from `memory` (a backend's; the host's by default).
    explicit Arena(Memory &memory = host_memory()) : memory_(memory) {}
    ~Arena() { memory_.free((char *)base_); }
    Arena(const Arena &) = delete;
    Arena &operator=(const Arena &) = delete;

    // Planning: nullptr, the size recorded. After allocate(): the next buffer, in the same order.
    template <typename T = float>
    T *take(size_t n) {
        const size_t bytes = (n * sizeof(T) + kAlign - 1) / kAlign * kAlign;
        if (!base_) {
            planned_ += bytes;
            return nullptr;
        }
        if (used_ + bytes > capacity_) throw std::bad_alloc();  // a carve that differs from its plan
        T *p = (T *)((char *)base_ + used_);
        used_ += bytes;
        return p;
    }
    // Allocates what the planning takes added up; false if the memory is not available.
    bool allocate() {
        if (base_ || planned_ == 0) return base_ != nullptr || planned_ == 0;
        if (!(base_ = memory_.alloc(planned_))) return false;
        capacity_ = planned_;
        return true;
    }
    // Whether take() only plans (before allocate()).
    bool planning() const { return base_ == nullptr; }
    size_t planned_bytes() const { return planned_; }
    size_t bytes() const { return capacity_; }

private:
    Memory &memory_;
    void *base_ = nullptr;
    size_t planned_ = 0, capacity_ = 0, used_ = 0;
};

}  // namespace fastllm
