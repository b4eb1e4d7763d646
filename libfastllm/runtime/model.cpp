#include "runtime/model.h"

#include <chrono>
#include <thread>

#include "api/error.h"
#include "arch/family.h"
#include "cpu/kernels.h"
#include "api/log.h"

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
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    log(FASTLLM_LOG_INFO, "loaded %s: %s, %.1fM parameters, %s weights, %.1f MiB %s in %.1f ms; kernels %s, %d threads",
        path.c_str(), architecture_.c_str(), decoder_->n_params() / 1e6, dtype_name(decoder_->weight_dtype()),
        file_->size() / 1048576.0, file_->mapped() ? "mapped" : "read", ms, isa_name(kernels().isa), n_threads_);
}

void Model::check_token_ids(const int32_t *ids, size_t n) const {
    const int vocab = decoder_->config().vocab_size;
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= vocab)
            fail(FASTLLM_ERR_TOKEN_OUT_OF_RANGE, "token %d at index %zu is outside the vocabulary [0, %d)", ids[i], i,
                 vocab);
}

}  // namespace fastllm
