// gemma.cpp — Gemma, Gemma 2, Gemma 3 text (GemmaForCausalLM, Gemma2ForCausalLM, Gemma3ForCausalLM).
// The numbers are metadata that read_common_hparams reads: the GELU-tanh GLU
// (`{arch}.ffn_activation`), the embedding scale sqrt(hidden) as transformers rounds it, the
// query-key scale (query_pre_attn_scalar^-1/2), the soft-caps, the sliding windows and Gemma 3's
// second RoPE set for its sliding layers. Gemma's (1 + w) norm weights are stored with the 1 added.
// What the files add is structure: Gemma 2 and 3 norm the attention and MLP outputs before each
// residual add (`blk.N.post_attention_norm`, `blk.N.post_ffw_norm`), Gemma 3 norms every q and k
// head (`blk.N.attn_q_norm`, `blk.N.attn_k_norm`, also (1 + w)).
#include "arch/family.h"

namespace fastllm {

void gemma_hparams(const FlmFile &f, DecoderConfig &c) { read_common_hparams(f, c); }

void gemma2_hparams(const FlmFile &f, DecoderConfig &c) {
    read_common_hparams(f, c);
    c.sandwich_norms = true;
}

void gemma3_hparams(const FlmFile &f, DecoderConfig &c) {
    gemma2_hparams(f, c);
    c.qk_norm = true;
}

}  // namespace fastllm
