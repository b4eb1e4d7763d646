#include "runtime/model.h"

#include <algorithm>
#include <chrono>
#include <thread>

#include "base/error.h"
#include "arch/family.h"
#include "base/log.h"
#include "base/fnv.h"

namespace fastllm {

Model::Model(std::unique_ptr<FlmFile> file, int n_threads) : file_(std::move(file)) {
    const auto t0 = std::chrono::steady_clock::now();
    const std::string &path = file_->path();
    architecture_ = file_->get_string("general.architecture");
    const Family *family = find_family(architecture_);
    if (!family)
        fail(FASTLLM_ERR_UNSUPPORTED, "%s: architecture '%s' is not supported (supported: %s)", path.c_str(),
             architecture_.c_str(), supported_families().c_str());
    name_ = file_->get_string("general.name", "");
    DecoderConfig config;
    config.arch = architecture_;
    family->read_hparams(*file_, config);
    decoder_ = std::make_unique<Decoder>(*file_, std::move(config));
    tokenizer_ = make_tokenizer(*file_, decoder_->config().vocab_size);
    has_chat_template_ = file_->has("tokenizer.chat_template");
    chat_template_ = file_->get_string("tokenizer.chat_template", "");
    n_threads_ = n_threads > 0 ? n_threads : (int)std::max(1u, std::thread::hardware_concurrency());
    fingerprint_ = compute_fingerprint();
    compute(n_threads_);  // the backend takes the weights now: one that cannot run them fails the load
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    log(FASTLLM_LOG_INFO, "loaded %s: %s, %.1fM parameters, %s weights, %.1f MiB %s in %.1f ms; %d threads",
        path.c_str(), architecture_.c_str(), decoder_->n_params() / 1e6, dtype_name(decoder_->weight_dtype()),
        file_->size() / 1048576.0, file_->mapped() ? "mapped" : "read", ms, n_threads_);
}

// 4 KiB at each end of every tensor: a different checkpoint of the same shape differs there
// (about 2 MiB read for a 1B model, a few ms once at load).
uint64_t Model::compute_fingerprint() const {
    Fnv1a f;
    f.add(architecture_.data(), architecture_.size());
    for (const auto &kv : file_->tensors()) {
        const Tensor &t = kv.second;
        f.add(kv.first.data(), kv.first.size() + 1);
        f.add_value((uint32_t)t.dtype);
        for (int d = 0; d < t.n_dims; d++) f.add_value(t.dims[d]);
        const uint64_t bytes = dtype_is_quantized(t.dtype) ? tensor_bytes(t.dtype, t.rows(), t.cols())
                                                           : (uint64_t)t.n_elements() * dtype_size(t.dtype);
        const uint64_t sample = std::min<uint64_t>(bytes, 4096);
        f.add(t.data, sample);
        f.add((const char *)t.data + (bytes - sample), sample);
    }
    for (int32_t id = 0; id < tokenizer_->vocab_size(); id++) f.add(tokenizer_->piece(id).data(), tokenizer_->piece(id).size() + 1);
    return f.h;
}

Compute &Model::compute(int n_threads) const {
    std::lock_guard<std::mutex> lock(compute_mutex_);
    for (auto &c : computes_)
        if (c.first == n_threads) return *c.second;
    computes_.emplace_back(n_threads, std::make_unique<Compute>(*decoder_, n_threads));
    return *computes_.back().second;
}

void Model::check_token_ids(const int32_t *ids, size_t n) const {
    const int vocab = decoder_->config().vocab_size;
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= vocab)
            fail(FASTLLM_ERR_TOKEN_OUT_OF_RANGE, "token %d at index %zu is outside the vocabulary [0, %d)", ids[i], i,
                 vocab);
}

}  // namespace fastllm
