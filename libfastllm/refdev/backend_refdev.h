// backend_refdev.h — the reference device: a Backend that behaves as a GPU's would towards the rest
// of the core, computed with the slow reference ops (cpu/ops.h, namespace ref). Every buffer it
// serves — the weights prepare_weights copies, the working memory, the KV blocks — is its own
// memory, at addresses in a range host allocations do not use (from 2^46 on), which the host cannot
// dereference; an op given an address it did not hand out fails with FASTLLM_ERR_INTERNAL. So when the suite passes through
// it (FASTLLM_BACKEND=refdev, tests/test_backend_seam.py), the decoder, the session and the saved
// state touch no model memory directly, and a new backend has a worked example of the seam.
// For tests: slow (double-precision loops) and a second copy of the weights.
#pragma once

#include <memory>

#include "arch/backend.h"

namespace fastllm {

std::unique_ptr<Backend> make_refdev_backend(int n_threads);

}  // namespace fastllm
