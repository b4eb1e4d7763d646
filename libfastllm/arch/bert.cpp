// bert.cpp — BERT encoders (BertModel; sentence-transformers' all-MiniLM, bge, e5; with a
// classification head, cross-encoder rerankers). The metadata says what differs from a decoder,
// and read_common_hparams reads it: LayerNorm with biases (`bert.layer_norm_eps`), bidirectional
// attention (`bert.causal` 0), a norm after each residual add (`bert.post_norm` 1), learned
// absolute positions and token types (`bert.position_embedding` learned), the non-gated erf-GELU
// MLP (`bert.ffn_gated` 0, `bert.ffn_activation` gelu_erf). No output head: a BERT embeds.
#include "arch/family.h"

namespace fastllm {

void bert_hparams(const FlmFile &f, DecoderConfig &c) { read_common_hparams(f, c); }

}  // namespace fastllm
