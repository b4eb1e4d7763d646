// embedding.h — texts to vectors: the hidden states of whole inputs (an encoder's, or a decoder's
// last token's), pooled per input and L2-normalised, several inputs of different lengths in one
// pass (each its own run of rows with its own short-lived KV cache).
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "runtime/model.h"

namespace fastllm {

enum class Pooling { None, Mean, Cls, Last };

struct EmbedOptions {
    Pooling pooling = Pooling::Mean;
    bool normalize = true;
    int n_threads = 0;  // 0: the model's
    int n_batch = 0;    // rows per pass; 0: 512 (an encoder's pass holds at least its longest input)
};

// The pooling a model's file asks for (`{arch}.pooling`: none, mean, cls, last), else cls for an
// encoder and last for a decoder.
Pooling model_pooling(const Model &m);
const char *pooling_name(Pooling p);

// inputs: token ids (validated here), each at most the model's context length. out: one row of
// hidden_size floats per input, or (Pooling::None) per token of every input in order.
void embed(const Model &m, const std::vector<std::vector<int32_t>> &inputs, const EmbedOptions &o, float *out);

struct RerankOptions {
    bool normalize = true;  // the sigmoid of the score (a probability), as sentence-transformers' CrossEncoder
    bool truncate = true;   // a pair past the context is cut longest first, as tokenizers cuts it; else CONTEXT_FULL
    int n_threads = 0, n_batch = 0;
    const char *instruction = nullptr;  // a decoder reranker's task; nullptr: the file's
};

// Each document's score for the query. A cross-encoder (an encoder with a one-label classifier):
// [CLS] query [SEP] document [SEP], token types 0 then 1, the classifier over [CLS]. A decoder
// reranker (`{arch}.rerank.*`: Qwen3-Reranker): its prompt with the instruction, query and
// document filled in, the logit of its "yes" token minus that of its "no" at the last position.
void rerank(const Model &m, std::string_view query, const std::vector<std::string_view> &documents,
            const RerankOptions &o, float *scores);

// The ids of text with the model's special tokens where add_special; an encoding longer than the
// context keeps its first tokens and every special token around them (as the reference's
// truncation), or, without truncate, is FASTLLM_ERR_CONTEXT_FULL.
std::vector<int32_t> embed_tokens_of(const Model &m, const char *text, size_t len, bool add_special, bool truncate);

}  // namespace fastllm
