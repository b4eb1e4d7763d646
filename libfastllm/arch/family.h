// family.h — the architecture registry: the .flm `general.architecture` string -> the function
// that reads that family's metadata into the decoder's knobs (DecoderConfig). Adding a family is
// one short file in arch/ and one line in family.cpp's table.
#pragma once

#include <string>

#include "arch/decoder_config.h"

namespace fastllm {

struct Family {
    const char *arch;
    void (*read_hparams)(const FlmFile &f, DecoderConfig &c);
};

// nullptr for an unknown architecture.
const Family *find_family(const std::string &arch);
// "llama, mistral, ..." for error messages.
std::string supported_families();

// The family files.
void llama_hparams(const FlmFile &f, DecoderConfig &c);
void mistral_hparams(const FlmFile &f, DecoderConfig &c);
void qwen2_hparams(const FlmFile &f, DecoderConfig &c);
void qwen3_hparams(const FlmFile &f, DecoderConfig &c);
void phi3_hparams(const FlmFile &f, DecoderConfig &c);
void gemma_hparams(const FlmFile &f, DecoderConfig &c);
void gemma2_hparams(const FlmFile &f, DecoderConfig &c);
void gemma3_hparams(const FlmFile &f, DecoderConfig &c);
void glm_hparams(const FlmFile &f, DecoderConfig &c);
void glm4_hparams(const FlmFile &f, DecoderConfig &c);
void bert_hparams(const FlmFile &f, DecoderConfig &c);

}  // namespace fastllm
