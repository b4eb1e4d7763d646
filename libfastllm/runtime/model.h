// model.h — what fastllm_model is: the mapped file, the decoder of its architecture (weights and
// hyperparameters) and the tokenizer.
// Immutable after construction, so any number of sessions and threads may share it.
#pragma once

#include <memory>
#include <string>

#include "format/flm_file.h"
#include "arch/decoder.h"
#include "text/tokenizer.h"

namespace fastllm {

class Model {
public:
    // Takes the opened file (a path's or a buffer's); throws for what it cannot run.
    Model(std::unique_ptr<FlmFile> file, int n_threads);

    const FlmFile &file() const { return *file_; }
    const Decoder &decoder() const { return *decoder_; }
    const DecoderConfig &config() const { return decoder_->config(); }
    const Tokenizer &tokenizer() const { return *tokenizer_; }
    const std::string &architecture() const { return architecture_; }
    const std::string &name() const { return name_; }
    const std::string &chat_template() const { return chat_template_; }
    bool has_chat_template() const { return has_chat_template_; }
    int n_threads() const { return n_threads_; }
    // Throws FASTLLM_ERR_TOKEN_OUT_OF_RANGE naming the first id outside the vocabulary.
    void check_token_ids(const int32_t *ids, size_t n) const;

private:
    std::unique_ptr<FlmFile> file_;
    std::unique_ptr<Decoder> decoder_;
    std::unique_ptr<Tokenizer> tokenizer_;
    std::string architecture_, name_, chat_template_;
    bool has_chat_template_ = false;
    int n_threads_ = 1;
};

}  // namespace fastllm
