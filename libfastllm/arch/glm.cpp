// glm.cpp — GLM-4 (GlmForCausalLM) and THUDM's ChatGLM2 / ChatGLM3 / glm-4-9b checkpoints, which
// the converter maps onto the same tensors: q/k/v biases (`attn_qkv.bias`), fused gate|up, RoPE
// over the first `glm.rope.dim` (head_dim / 2) dims of each head in interleaved pairs
// (2i, 2i + 1), as transformers' Glm rotate_half (x[0::2], x[1::2]) and ChatGLM's rotary
// cache pair them. The pairing is the family's, so it is set here, not stored in the file.
#include "arch/family.h"

namespace fastllm {

void glm_hparams(const FlmFile &f, DecoderConfig &c) {
    read_common_hparams(f, c);
    c.rope.interleaved = true;
}

}  // namespace fastllm
