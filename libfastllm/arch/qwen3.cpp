// qwen3.cpp — Qwen3 (Qwen3ForCausalLM): LLaMA's layers plus an RMSNorm of every q and k head over
// head_dim before RoPE (`blk.N.attn_q_norm.weight`, `blk.N.attn_k_norm.weight`, [head_dim]),
// with an explicit head_dim (128 for hidden 1024 in Qwen3-0.6B).
#include "arch/family.h"

namespace fastllm {

void qwen3_hparams(const FlmFile &f, DecoderConfig &c) {
    read_common_hparams(f, c);
    c.qk_norm = true;
}

}  // namespace fastllm
