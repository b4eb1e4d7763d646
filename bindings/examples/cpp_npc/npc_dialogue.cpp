// npc_dialogue.cpp — a game-style demo: one model in memory, two NPCs, each with its own session
// (its own KV cache and persona), taking turns. Each NPC's lines stream as they are generated.
// Usage: npc_dialogue MODEL.flm [turns] [tokens_per_line]
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <string_view>
#include <utility>

#include "fastllm.hpp"

namespace {

class Npc {
public:
    Npc(const fastllm::Model &model, std::string name, std::string persona, uint64_t seed)
        : session_(model, {/*n_ctx=*/512}), name_(std::move(name)), pending_(std::move(persona)) {
        params_.temperature = 0.7f;
        params_.seed = seed;
        params_.stop = {"\n"};  // one line per turn
    }

    // Hears a line (appended to its context) and answers with a streamed line of its own.
    std::string speak(const std::string &heard, int max_tokens) {
        if (!heard.empty()) pending_ += " " + heard;
        params_.max_new_tokens = max_tokens;
        // A rough bound (a token is at least one byte); a real game would summarise, the demo starts over.
        if (session_.n_tokens() + static_cast<int>(pending_.size()) + max_tokens > session_.n_ctx()) session_.reset();
        std::printf("%s: ", name_.c_str());
        auto result = session_.generate(pending_, params_, [](std::string_view piece) {
            std::fwrite(piece.data(), 1, piece.size(), stdout);
            std::fflush(stdout);
            return true;
        });
        std::printf("\n");
        pending_.clear();
        params_.seed++;  // a different line next time
        return result.text;
    }

private:
    fastllm::Session session_;
    std::string name_;
    std::string pending_;  // text this NPC has not seen yet: first its persona, then what it hears
    fastllm::SamplingParams params_;
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
        fastllm::Model model(argv[1]);
        Npc guard(model, "Guard", "Once upon a time, a grumpy guard stood at the castle gate.", 1);
        Npc merchant(model, "Merchant", "Once upon a time, a cheerful merchant came to town with a cart.", 2);
        std::string line;
        for (int t = 0; t < turns; t++) line = (t % 2 == 0 ? guard : merchant).speak(line, tokens);
        std::printf("[%d turns, two sessions sharing one model]\n", turns);
        return 0;
    } catch (const std::exception &e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        return 1;
    }
}
