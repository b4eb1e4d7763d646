// npc_dialogue.cpp — a game-style demo: one model in memory, two NPCs, each with its own session
// (its own KV cache and persona), taking turns. Each NPC's lines stream as they are generated.
// Usage: npc_dialogue MODEL.flm [turns] [tokens_per_line]
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "fastllm.h"

namespace {

void check(fastllm_status st) {
    if (st != FASTLLM_OK) throw std::runtime_error(std::string(fastllm_status_name(st)) + ": " + fastllm_last_error());
}

struct ModelDeleter {
    void operator()(fastllm_model *m) const { fastllm_model_free(m); }
};
struct SessionDeleter {
    void operator()(fastllm_session *s) const { fastllm_session_free(s); }
};

std::vector<int32_t> tokenize(const fastllm_model *model, const std::string &text, bool bos) {
    size_t n = 0;
    fastllm_tokenize(model, text.data(), text.size(), bos, nullptr, 0, &n);
    std::vector<int32_t> ids(n);
    check(fastllm_tokenize(model, text.data(), text.size(), bos, ids.data(), ids.size(), &n));
    return ids;
}

class Npc {
public:
    Npc(const fastllm_model *model, std::string name, const std::string &persona, uint64_t seed)
        : model_(model), name_(std::move(name)), seed_(seed) {
        fastllm_session *s = nullptr;
        fastllm_session_params p = fastllm_session_default_params();
        p.n_ctx = 512;
        check(fastllm_session_create(model, &p, &s));
        session_.reset(s);
        pending_ = tokenize(model, persona, true);  // the persona opens this NPC's own context
    }

    // Hears a line (appended to its context) and answers with a streamed line of its own.
    std::string speak(const std::string &heard, int max_tokens) {
        if (!heard.empty()) {
            auto ids = tokenize(model_, " " + heard, false);
            pending_.insert(pending_.end(), ids.begin(), ids.end());
        }
        fastllm_sampling_params sp = fastllm_sampling_default_params();
        sp.max_new_tokens = max_tokens;
        sp.temperature = 0.7f;
        sp.seed = seed_++;
        const char *stops[] = {"\n"};
        sp.stop = stops;
        sp.n_stop = 1;
        if (fastllm_session_n_tokens(session_.get()) + (int)pending_.size() + max_tokens >
            fastllm_session_n_ctx(session_.get())) {
            fastllm_session_reset(session_.get());  // a real game would summarise; the demo starts over
        }
        std::printf("%s: ", name_.c_str());
        std::string line;
        auto on_text = [](const char *text, size_t len, void *user) -> int {
            static_cast<std::string *>(user)->append(text, len);
            std::fwrite(text, 1, len, stdout);
            std::fflush(stdout);
            return 0;
        };
        fastllm_generation_result res;
        check(fastllm_session_generate(session_.get(), pending_.data(), pending_.size(), &sp, on_text, &line, &res));
        pending_.clear();
        std::printf("\n");
        return line;
    }

private:
    const fastllm_model *model_;
    std::unique_ptr<fastllm_session, SessionDeleter> session_;
    std::string name_;
    uint64_t seed_;
    std::vector<int32_t> pending_;
};

}  // namespace

int main(int argc, char **argv) {
    if (argc < 2) {
        std::fprintf(stderr, "usage: %s MODEL.flm [turns] [tokens_per_line]\n", argv[0]);
        return 2;
    }
    const int turns = argc > 2 ? std::atoi(argv[2]) : 4;
    const int tokens = argc > 3 ? std::atoi(argv[3]) : 24;
    try {
        fastllm_model *raw = nullptr;
        check(fastllm_model_load(argv[1], nullptr, &raw));
        std::unique_ptr<fastllm_model, ModelDeleter> model(raw);

        Npc guard(model.get(), "Guard", "Once upon a time, a grumpy guard stood at the castle gate.", 1);
        Npc merchant(model.get(), "Merchant", "Once upon a time, a cheerful merchant came to town with a cart.", 2);
        std::string line;
        for (int t = 0; t < turns; t++) line = (t % 2 == 0 ? guard : merchant).speak(line, tokens);
        std::printf("[%d turns, two sessions sharing one model]\n", turns);
        return 0;
    } catch (const std::exception &e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        return 1;
    }
}
