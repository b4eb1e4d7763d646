// pass.h — the one place a forward pass's rows are built: tokens of any sessions, each with the
// cache it extends, its position and where its logits go (ForwardRow), run in passes of at most
// `capacity` rows through the model's compute. The caller holds the compute's mutex and has made the
// rows' cache positions writable (KvCache::prepare).
#pragma once

#include <atomic>
#include <cstdint>

#include "arch/decoder.h"
#include "arch/kv_cache.h"
#include "runtime/compute.h"

namespace fastllm {

class Pass {
public:
    // capacity <= c.max_batch(); with `cancel`, a pass checks it between layers.
    Pass(const Decoder &d, Compute &c, int capacity, const std::atomic<bool> *cancel = nullptr)
        : d_(d), c_(c), capacity_(capacity), cancel_(cancel) {}

    // Adds a row (logits, hidden: nullptr when not needed); runs the pass when it is full. False
    // when that run was cancelled (its rows' cache entries are then incomplete).
    bool add(KvCache &cache, int pos, int32_t token, float *logits, float *hidden = nullptr, int type = 0,
             const LoraSet *lora = nullptr) {
        c_.rows[(size_t)n_] = ForwardRow{&cache, pos, logits, hidden, type, lora};
        c_.tokens[(size_t)n_] = token;
        return ++n_ < capacity_ || flush();
    }
    // Runs the rows added since the last run; false when cancelled.
    bool flush() {
        const int n = n_;
        n_ = 0;
        return n == 0 || d_.forward(c_.stages, c_.tokens.data(), c_.rows.data(), n, cancel_);
    }

private:
    const Decoder &d_;
    Compute &c_;
    int capacity_, n_ = 0;
    const std::atomic<bool> *cancel_;
};

}  // namespace fastllm
