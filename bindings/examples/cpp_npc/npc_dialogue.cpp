// npc_dialogue.cpp — a game-style demo of many NPCs over one model in memory:
//   - the world's description (the shared persona) is evaluated once; each NPC's session is forked
//     from it, sharing its KV cache blocks instead of evaluating or copying them;
//   - NPCs take turns: each says a line (streamed as it is generated), then acts by calling one of
//     the game's functions (tools: move_to, give_item, say), sampled under the tools' grammar so
//     that the call always parses and its arguments fit the function's schema;
//   - halfway through, the Merchant's conversation is saved to a file and its session freed, as a
//     game does when the player leaves; at its next turn it is restored from the file and goes on
//     exactly where it was (run with --no-save for the same game without it: the output is equal);
//   - with --adapter NAME=ADAPTER.flm, that NPC speaks through its own LoRA adapter (docs/lora.md),
//     a voice of its own over the same base model; its session evaluates the world under the
//     adapter instead of forking the shared one (KV made by the base model is not its KV), and its
//     saved state names the adapter, so it is restored under it.
// Usage: npc_dialogue MODEL.flm [turns] [tokens_per_line] [--no-save] [--adapter NAME=ADAPTER.flm]...
#include <algorithm>
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

// What an NPC may do after it speaks: the game's functions, as OpenAI's tools. The game runs the
// call it gets back.
const char *const kTools = R"([
  {"type": "function", "function": {"name": "move_to", "description": "Walk to a place in town.",
    "parameters": {"type": "object", "additionalProperties": false, "required": ["place"],
      "properties": {"place": {"enum": ["gate", "square", "river", "castle"]}}}}},
  {"type": "function", "function": {"name": "give_item", "description": "Give an item to someone.",
    "parameters": {"type": "object", "additionalProperties": false, "required": ["item", "to"],
      "properties": {"item": {"enum": ["apple", "sword", "coin"]},
                     "to": {"enum": ["Guard", "Merchant", "Smith", "player"]}}}}},
  {"type": "function", "function": {"name": "say", "description": "Shout a short word.",
    "parameters": {"type": "object", "additionalProperties": false, "required": ["word"],
      "properties": {"word": {"enum": ["hello", "halt", "bargain", "farewell"]}}}}}
])";

class Npc {
public:
    Npc(const fastllm::Session &world, std::string name, std::string intro, uint64_t seed, const std::string &grammar)
        : session_(world.fork()), name_(std::move(name)), pending_(" " + std::move(intro)), seed_(seed),
          grammar_(grammar) {}
    // An NPC with an adapter of its own: the world evaluated again, under it.
    Npc(const fastllm::Model &model, const std::vector<int32_t> &world, const fastllm::Adapter &adapter, std::string name,
        std::string intro, uint64_t seed, const std::string &grammar)
        : session_(with_adapter(model, &adapter)), name_(std::move(name)), pending_(" " + std::move(intro)),
          seed_(seed), grammar_(grammar), adapter_(&adapter) {
        session_.eval(world);
    }

    const std::string &name() const { return name_; }
    fastllm::Session &session() { return session_; }

    // Hears a line (appended to its context), answers with a streamed line of its own, then acts:
    // a call to one of kTools, sampled under their grammar (returned as the model wrote it).
    std::string speak(const std::string &heard, int max_tokens, std::string &call) {
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
        // Room for the longest call, so that it always ends: every value is an enum, so a call is a
        // few fixed strings plus at most 9 whitespace runs of 21 bytes: under 300 bytes, and a token
        // is at least a byte.
        act.max_new_tokens = 320;
        act.grammar = grammar_;
        call = session_.generate("\n" + name_ + " does:", act).text;
        return said.text;
    }

    // A saved game: the session goes to a file and is freed; restore() brings it back.
    void save(const std::string &path) {
        session_.save_state_file(path);
        session_ = fastllm::Session();
    }
    void restore(const fastllm::Model &model, const std::string &path) {
        session_ = with_adapter(model, adapter_);  // a state loads only under the adapters it was saved with
        session_.load_state_file(path);
    }
    bool saved() const { return !session_; }

private:
    static fastllm::Session with_adapter(const fastllm::Model &model, const fastllm::Adapter *adapter) {
        fastllm::Session s(model);
        if (adapter) s.set_adapters({{adapter, 1.0f}});
        return s;
    }

    fastllm::Session session_;
    std::string name_;
    std::string pending_;  // text this NPC has not seen yet: first its intro, then what it hears
    uint64_t seed_;
    const std::string &grammar_;
    const fastllm::Adapter *adapter_ = nullptr;
};

}  // namespace

int main(int argc, char **argv) {
    std::vector<const char *> args;
    std::vector<std::pair<std::string, std::string>> adapter_files;  // NPC name, adapter file
    bool save = true;
    for (int i = 1; i < argc; i++) {
        if (std::strcmp(argv[i], "--no-save") == 0) {
            save = false;
        } else if (std::strcmp(argv[i], "--adapter") == 0) {
            const std::string spec = i + 1 < argc ? argv[++i] : "";
            const size_t eq = spec.find('=');
            if (eq == std::string::npos || eq == 0) {
                std::fprintf(stderr, "--adapter needs NAME=ADAPTER.flm, not '%s'\n", spec.c_str());
                return 2;
            }
            for (const auto &named : adapter_files)
                if (named.first == spec.substr(0, eq)) {
                    std::fprintf(stderr, "--adapter: %s has an adapter already\n", named.first.c_str());
                    return 2;
                }
            adapter_files.emplace_back(spec.substr(0, eq), spec.substr(eq + 1));
        } else {
            args.push_back(argv[i]);
        }
    }
    if (args.empty()) {
        std::fprintf(stderr, "usage: %s MODEL.flm [turns] [tokens_per_line] [--no-save] [--adapter NAME=ADAPTER.flm]...\n",
                     argv[0]);
        return 2;
    }
    for (const auto &[name, path] : adapter_files)
        if (name != "Guard" && name != "Merchant" && name != "Smith") {
            std::fprintf(stderr, "--adapter %s=%s: there is no NPC named %s (Guard, Merchant, Smith)\n", name.c_str(),
                         path.c_str(), name.c_str());
            return 2;
        }
    const int turns = args.size() > 1 ? std::atoi(args[1]) : 6;
    const int tokens = args.size() > 2 ? std::atoi(args[2]) : 24;
    const std::string save_path = (std::filesystem::temp_directory_path() / "fastllm_npc_merchant.state").string();
    try {
        fastllm::Model model(args[0]);
        const std::vector<int32_t> world_tokens = model.tokenize(kWorld);
        fastllm::Session world(model);
        world.eval(world_tokens);  // the persona, evaluated once for all of them
        // The calls' format is the one the model's chat template teaches (the generic JSON object
        // for a model without one); the grammar makes every action a valid call.
        const std::string grammar = model.tool_call_grammar(kTools);
        const std::pair<const char *, const char *> cast[] = {
            {"Guard", "The guard was grumpy."}, {"Merchant", "The merchant was cheerful."}, {"Smith", "The smith was tired."}};
        std::vector<fastllm::Adapter> adapters;  // loaded once; an NPC's session applies its own
        adapters.reserve(adapter_files.size());
        std::vector<Npc> npcs;
        for (size_t i = 0; i < std::size(cast); i++) {
            const uint64_t seed = i == 0 ? 1 : 100 * i;
            const fastllm::Adapter *adapter = nullptr;
            for (const auto &[name, path] : adapter_files)
                if (name == cast[i].first) {
                    adapters.emplace_back(model, path);  // checked against the model: a bad file throws
                    adapter = &adapters.back();
                    std::printf("[%s speaks through the adapter %s]\n", name.c_str(), path.c_str());
                }
            if (adapter) npcs.emplace_back(model, world_tokens, *adapter, cast[i].first, cast[i].second, seed, grammar);
            else npcs.emplace_back(world, cast[i].first, cast[i].second, seed, grammar);
        }
        double shared_kib = 0;  // the world's KV that a forked NPC shares (one with an adapter has its own)
        for (auto &npc : npcs) shared_kib = std::max(shared_kib, npc.session().memory().kv_shared_bytes / 1024.0);

        std::string line;
        for (int t = 0; t < turns; t++) {
            Npc &npc = npcs[t % npcs.size()];
            if (npc.saved()) {
                npc.restore(model, save_path);
                std::printf("[restored %s: %d tokens]\n", npc.name().c_str(), npc.session().n_tokens());
            }
            std::string call;
            line = npc.speak(line, tokens, call);
            // The game reads the call: the library's JSON {"tool_calls": [{"name", "arguments"}]},
            // printed as one line ("Guard does: move_to {"place":"gate"}").
            const std::string parsed = model.parse_tool_calls(call, kTools);
            const size_t at = parsed.find("\"tool_calls\":[{\"name\":\"");
            if (at == std::string::npos) {
                std::printf("%s does nothing (no call in %s)\n", npc.name().c_str(), call.c_str());
            } else {
                const size_t name_at = at + 23, name_end = parsed.find('"', name_at);
                const size_t args_at = parsed.find("\"arguments\":", name_end) + 12;
                const size_t args_end = parsed.rfind("}]}");  // the arguments' JSON text, quoted
                std::string args = parsed.substr(args_at, args_end - args_at);
                std::string plain;  // unquoted: the JSON object itself
                for (size_t k = 1; k + 1 < args.size(); k++) {
                    if (args[k] == '\\' && k + 2 < args.size()) k++;
                    plain += args[k];
                }
                std::printf("%s does: %s %s\n", npc.name().c_str(), parsed.substr(name_at, name_end - name_at).c_str(),
                            plain.c_str());
            }
            if (save && t == 1) {  // the Merchant has spoken once: save it, free its session
                npcs[1].save(save_path);
                std::printf("[saved Merchant to %s]\n", save_path.c_str());
            }
        }
        std::remove(save_path.c_str());
        std::printf("[%d turns, %zu NPCs sharing one model and a %d-token world (%.0f KiB of KV cache each shared)]\n",
                    turns, npcs.size(), world.n_tokens(), shared_kib);
        return 0;
    } catch (const std::exception &e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        return 1;
    }
}
