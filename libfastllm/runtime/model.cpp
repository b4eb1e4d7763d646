#include "runtime/model.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <thread>

#include "base/error.h"
#include "arch/family.h"
#include "base/log.h"
#include "base/fnv.h"

namespace fastllm {

Model::Model(std::unique_ptr<FlmFile> file, const ModelOptions &o) : file_(std::move(file)) {
    const auto t0 = std::chrono::steady_clock::now();
    const std::string &path = file_->path();
    if (file_->kind() == FlmFile::kKindAdapter)
        fail(FASTLLM_ERR_BAD_FORMAT, "%s is a LoRA adapter, not a model: load a model, then the adapter with "
             "fastllm_adapter_load", path.c_str());
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
    n_threads_ = o.n_threads > 0 ? o.n_threads : (int)std::max(1u, std::thread::hardware_concurrency());
    fingerprint_ = compute_fingerprint();
    device_ = resolve_device(o.device);
    const int n_layers = decoder_->config().num_layers;
    int gpu_layers = o.n_gpu_layers;
    if (!o.device || !*o.device)  // the default device, as the tests' FASTLLM_BACKEND=vulkan makes it: a split too
        if (const char *e = std::getenv("FASTLLM_GPU_LAYERS"); e && *e) gpu_layers = std::atoi(e);
    device_layers_ = !device_is_gpu(device_) ? 0 : gpu_layers < 0 ? n_layers : std::min(gpu_layers, n_layers);
    if (device_is_gpu(device_) && device_layers_ == 0) device_ = "cpu";
    // The backends take the weights now: one that cannot run them fails the load.
    backend_name_ = compute(n_threads_).describe();
    if (device_is_gpu(device_)) {
        std::vector<const void *> seen;
        for (const Tensor *t : decoder_->weights(n_layers - device_layers_, n_layers, device_layers_ == n_layers, true)) {
            if (std::find(seen.begin(), seen.end(), t->data) != seen.end()) continue;
            seen.push_back(t->data);
            device_weight_bytes_ += dtype_is_quantized(t->dtype) ? tensor_bytes(t->dtype, t->rows(), t->cols())
                                                                 : (uint64_t)t->n_elements() * dtype_size(t->dtype);
        }
    }
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    log(FASTLLM_LOG_INFO, "loaded %s: %s, %.1fM parameters, %s weights, %.1f MiB %s in %.1f ms; %s",
        path.c_str(), architecture_.c_str(), decoder_->n_params() / 1e6, dtype_name(decoder_->weight_dtype()),
        file_->size() / 1048576.0, file_->mapped() ? "mapped" : "read", ms, backend_name_.c_str());
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
    if (device_is_gpu(device_)) n_threads = n_threads_;
    std::lock_guard<std::mutex> lock(compute_mutex_);
    for (auto &c : computes_)
        if (c.first == n_threads) return *c.second;
    computes_.emplace_back(n_threads, std::make_unique<Compute>(*decoder_, ComputeOptions{n_threads, device_, device_layers_}));
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
