// phi3.cpp — Phi-3 / Phi-3.5 / Phi-4-mini (Phi3ForCausalLM): fused qkv_proj and gate_up_proj stored
// as they are (already our attn_qkv / ffn_gate_up layout), partial rotary
// (`phi3.rope.dim` = head_dim * partial_rotary_factor) and LongRoPE (`phi3.rope.long_inv_freq`
// used by passes that reach past `phi3.rope.original_context_length`), tied head in Phi-4-mini.
#include "arch/family.h"

namespace fastllm {

void phi3_hparams(const FlmFile &f, DecoderConfig &c) { read_common_hparams(f, c); }

}  // namespace fastllm
