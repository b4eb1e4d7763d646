// qwen2.cpp — Qwen2 / Qwen2.5 (Qwen2ForCausalLM): LLaMA's layers with q/k/v biases
// (`attn_qkv.bias`) and none on the output projection; sliding windows on the layers the config
// names (`qwen2.sliding_window_layers`, written only when use_sliding_window is set).
#include "arch/family.h"

namespace fastllm {

void qwen2_hparams(const FlmFile &f, DecoderConfig &c) { read_common_hparams(f, c); }

}  // namespace fastllm
