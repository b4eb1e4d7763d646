// mistral.cpp — Mistral (MistralForCausalLM): LLaMA's layers with sliding-window attention when
// the config sets `sliding_window` (`mistral.sliding_window`: a query at position p sees keys
// p - window + 1 .. p, as transformers masks them).
#include "arch/family.h"

namespace fastllm {

void mistral_hparams(const FlmFile &f, DecoderConfig &c) { read_common_hparams(f, c); }

}  // namespace fastllm
