// llama.cpp — LLaMA (LlamaForCausalLM; TinyLlama, SmolLM, Llama 2/3): RMSNorm, SwiGLU, rotate-half
// RoPE (its scaling folded into the stored frequencies), optional q/k/v, o and MLP biases.
#include "arch/family.h"

namespace fastllm {

void llama_hparams(const FlmFile &f, DecoderConfig &c) { read_common_hparams(f, c); }

}  // namespace fastllm
