// npc_dialogue.cpp — a game-style demo of many NPCs over one model in memory:
//   - the world's description (the shared persona) is evaluated once; each NPC's session is forked
//     from it, sharing its KV cache blocks instead of evaluating or copying them;
//   - NPCs take turns: each says a line (streamed as it is generated), then picks an action, which
//     is JSON under a schema (constrained sampling: it always parses and fits);
//   - halfway through, the Merchant's conversation is saved to a file and its session freed, as a
//     game does when the player leaves; at its next turn it is restored from the file and goes on
//     exactly where it was (run with --no-save for the same game without it: the output is equal).
// Usage: npc_dialogue MODEL.flm [turns] [tokens_per_line] [--no-save]
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "fastllm.hpp"

namespace {

const char *const kWorld =
    "Once upon a time, there was a small town with a castle. At the gate stood a guard, in the square a "
    "merchant sold apples from a cart, and by the river a smith made swords. Every day they talked.";

// What an NPC may do after it speaks; the game reads this JSON.
const char *const kActionSchema = R"({
  "type": "object",
  "properties": {
    "action": {"enum": ["talk", "trade", "guard", "leave"]},
    "target": {"enum": ["Guard", "Merchant", "Smith", "player"]},
    "mood": {"enum": ["calm", "angry", "happy"]}
  },
  "required": ["action", "target", "mood"],
  "additionalProperties": false
})";

class Npc {
public:
    Npc(const fastllm::Session &world, std::string name, std::string intro, uint64_t seed)
        : session_(world.fork()), name_(std::move(name)), pending_(" " + std::move(intro)), seed_(seed) {}

    const std::string &name() const { return name_; }
    fastllm::Session &session() { return session_; }

    // Hears a line (appended to its context), answers with a streamed line of its own, then
    // decides on an action (JSON under kActionSchema).
    std::string speak(const std::string &heard, int max_tokens) {
        if (!heard.empty()) pending_ += " " + heard;
        fastllm::SamplingParams line;
        line.temperature = 0.7f;
        line.seed = seed_++;
        line.max_new_tokens = max_tokens;
        line.stop = {"\n"};
        std::printf("%s: ", name_.c_str());
        const auto said = session_.generate(pending_ + "\n" + name_ + " said:", line, [](std::string_view piece) {
            std::fwrite(piece.data(), 1, piece.size(), stdout);
            std::fflush(stdout);
            return true;
        });
        std::printf("\n");
        pending_.clear();

        fastllm::SamplingParams act;
        act.temperature = 0.7f;
        act.seed = seed_++;
        // Room for the longest action, so that it always ends: "{" and "}", 7 whitespace runs of at
        // most 21 bytes (a newline and 20 spaces or tabs), the three keys, ":" and "," and the longest
        // values come to 200 bytes, and a token is at least a byte.
        act.max_new_tokens = 256;
        act.json_schema = kActionSchema;
        std::string action = session_.generate("\n" + name_ + " does:", act).text;
        // One line a turn: a newline or tab of the JSON's whitespace becomes a space (still the same JSON;
        // strings hold neither unescaped).
        for (char &c : action)
            if (c == '\n' || c == '\t') c = ' ';
        std::printf("%s does: %s\n", name_.c_str(), action.c_str());
        return said.text;
    }

    // A saved game: the session goes to a file and is freed; restore() brings it back.
    void save(const std::string &path) {
        session_.save_state_file(path);
        session_ = fastllm::Session();
    }
    void restore(const fastllm::Model &model, const std::string &path) {
        session_ = fastllm::Session(model);
        session_.load_state_file(path);
    }
    bool saved() const { return !session_; }

private:
    fastllm::Session session_;
    std::string name_;
    std::string pending_;  // text this NPC has not seen yet: first its intro, then what it hears
    uint64_t seed_;
};

}  // namespace

int main(int argc, char **argv) {
    std::vector<const char *> args;
    bool save = true;
    for (int i = 1; i < argc; i++) {
        if (std::strcmp(argv[i], "--no-save") == 0) save = false;
        else args.push_back(argv[i]);
    }
    if (args.empty()) {
        std::fprintf(stderr, "usage: %s MODEL.flm [turns] [tokens_per_line] [--no-save]\n", argv[0]);
        return 2;
    }
    const int turns = args.size() > 1 ? std::atoi(args[1]) : 6;
    const int tokens = args.size() > 2 ? std::atoi(args[2]) : 24;
    const std::string save_path = (std::filesystem::temp_directory_path() / "fastllm_npc_merchant.state").string();
    try {
        fastllm::Model model(args[0]);
        fastllm::Session world(model);
        world.eval(model.tokenize(kWorld));  // the persona, evaluated once for all of them
        std::vector<Npc> npcs;
        npcs.emplace_back(world, "Guard", "The guard was grumpy.", 1);
        npcs.emplace_back(world, "Merchant", "The merchant was cheerful.", 100);
        npcs.emplace_back(world, "Smith", "The smith was tired.", 200);
        const fastllm_session_memory_info m = npcs[0].session().memory();

        std::string line;
        for (int t = 0; t < turns; t++) {
            Npc &npc = npcs[t % npcs.size()];
            if (npc.saved()) {
                npc.restore(model, save_path);
                std::printf("[restored %s: %d tokens]\n", npc.name().c_str(), npc.session().n_tokens());
            }
            line = npc.speak(line, tokens);
            if (save && t == 1) {  // the Merchant has spoken once: save it, free its session
                npcs[1].save(save_path);
                std::printf("[saved Merchant to %s]\n", save_path.c_str());
            }
        }
        std::remove(save_path.c_str());
        std::printf("[%d turns, %zu NPCs sharing one model and a %d-token world (%.0f KiB of KV cache each shared)]\n",
                    turns, npcs.size(), world.n_tokens(), m.kv_shared_bytes / 1024.0);
        return 0;
    } catch (const std::exception &e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        return 1;
    }
}
