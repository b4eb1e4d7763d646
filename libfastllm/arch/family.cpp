#include "arch/family.h"

namespace fastllm {

namespace {
const Family kFamilies[] = {
    {"llama", llama_hparams}, {"mistral", mistral_hparams}, {"qwen2", qwen2_hparams},
    {"qwen3", qwen3_hparams}, {"phi3", phi3_hparams},   {"gemma", gemma_hparams},
    {"gemma2", gemma2_hparams}, {"gemma3", gemma3_hparams}, {"glm", glm_hparams}, {"glm4", glm4_hparams},
    {"bert", bert_hparams},
};
}  // namespace

const Family *find_family(const std::string &arch) {
    for (const Family &f : kFamilies)
        if (arch == f.arch) return &f;
    return nullptr;
}

std::string supported_families() {
    std::string s;
    for (const Family &f : kFamilies) s += (s.empty() ? "" : ", ") + std::string(f.arch);
    return s;
}

}  // namespace fastllm
