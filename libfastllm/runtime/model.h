// model.h — what fastllm_model is: the mapped file, the decoder of its architecture (weights and
// hyperparameters) and the tokenizer.
// Immutable after construction (but for the compute its sessions share, which locks itself), so any
// number of sessions and threads may share it.
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "format/flm_file.h"
#include "arch/decoder.h"
#include "runtime/compute.h"
#include "text/token_trie.h"
#include "text/tokenizer.h"

namespace fastllm {

// What fastllm_model_params asks for.
struct ModelOptions {
    int n_threads = 0;          // 0: all cores
    const char *device = nullptr;  // see backends.h's resolve_device
    int n_gpu_layers = -1;
};

class Model {
public:
    // Takes the opened file (a path's or a buffer's); throws for what it cannot run.
    Model(std::unique_ptr<FlmFile> file, const ModelOptions &options);

    const FlmFile &file() const { return *file_; }
    const Decoder &decoder() const { return *decoder_; }
    const DecoderConfig &config() const { return decoder_->config(); }
    const Tokenizer &tokenizer() const { return *tokenizer_; }
    const std::string &architecture() const { return architecture_; }
    const std::string &name() const { return name_; }
    const std::string &chat_template() const { return chat_template_; }
    bool has_chat_template() const { return has_chat_template_; }
    int n_threads() const { return n_threads_; }
    // The resolved device ("cpu", "vulkan", "vulkan:N"), what runs the passes (Compute::describe),
    // and the bytes of weights copied to a device (0 on the CPU).
    const std::string &device() const { return device_; }
    const std::string &backend_name() const { return backend_name_; }
    uint64_t device_weight_bytes() const { return device_weight_bytes_; }
    // Throws FASTLLM_ERR_TOKEN_OUT_OF_RANGE naming the first id outside the vocabulary.
    void check_token_ids(const int32_t *ids, size_t n) const;
    // The vocabulary as a byte trie, for grammar masks (token_trie.h); built on first use.
    const TokenTrie &token_trie() const { return token_trie_.get(*tokenizer_); }
    // The threads and working memory of this model's sessions of n_threads threads (compute.h),
    // made on first use; it lives as long as the model. With layers on a device, one for every
    // thread count (one copy of the weights on the device; the CPU's layers on the model's threads).
    Compute &compute(int n_threads) const;
    // Identifies the weights, config and vocabulary (saved session state names the model it belongs
    // to): a hash of the tensor table, the first and last 4 KiB of every tensor and the vocabulary.
    uint64_t fingerprint() const { return fingerprint_; }

private:
    uint64_t compute_fingerprint() const;

    std::unique_ptr<FlmFile> file_;
    std::unique_ptr<Decoder> decoder_;
    std::unique_ptr<Tokenizer> tokenizer_;
    std::string architecture_, name_, chat_template_, device_, backend_name_;
    uint64_t device_weight_bytes_ = 0;
    int device_layers_ = 0;  // the last layers, on the device
    bool has_chat_template_ = false;
    int n_threads_ = 1;
    LazyTokenTrie token_trie_;
    uint64_t fingerprint_ = 0;
    mutable std::mutex compute_mutex_;
    mutable std::vector<std::pair<int, std::unique_ptr<Compute>>> computes_;  // by thread count
};

}  // namespace fastllm
