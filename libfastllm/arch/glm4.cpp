// glm4.cpp — GLM-4-0414 (Glm4ForCausalLM): GLM's layers (glm.cpp: q/k/v biases, interleaved
// partial RoPE) with a norm on the attention output and on the MLP output before each residual
// add (post_self_attn_layernorm, post_mlp_layernorm: `blk.N.post_attention_norm.weight`,
// `blk.N.post_ffw_norm.weight`, the sandwich norms).
#include "arch/family.h"

namespace fastllm {

void glm4_hparams(const FlmFile &f, DecoderConfig &c) {
    read_common_hparams(f, c);
    c.rope.interleaved = true;
    c.sandwich_norms = true;  // the decoder now requires both post norms of every layer
}

}  // namespace fastllm
