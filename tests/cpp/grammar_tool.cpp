// grammar_tool.cpp — the grammar matcher from the command line, for tests/test_grammar.py and
// bench/bench_grammar.py (which compare it with other engines and time it):
//
//   grammar_tool match GRAMMAR            stdin: one hex-encoded text per line; prints for each
//                                         "reject", "prefix" (valid, not complete), "complete"
//                                         (complete, more may follow) or "final" (nothing may follow)
//   grammar_tool mask MODEL GRAMMAR [TRIGGER...]
//                                         stdin: one hex-encoded prefix per line; prints the tokens
//                                         allowed after it (EOS included when complete) as a hex
//                                         bitmap (bit i of byte k: token 8k + i), or "reject";
//                                         flushed line by line, so a test can walk step by step;
//                                         with triggers, of a lazy matcher (grammar.h)
//   grammar_tool bench MODEL GRAMMAR TEXT [ROUNDS [TRIGGER...]]
//                                         follows TEXT token by token (the model's tokenization),
//                                         timing the mask before each token; each round starts a
//                                         new matcher; prints the mask times
//
// GRAMMAR is a file of GBNF, or of a JSON schema when its name ends in .json. Errors go to stderr
// as "error STATUS_NAME: message", exit status 1.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "base/error.h"
#include "runtime/model.h"
#include "text/grammar.h"
#include "text/json_schema.h"
#include "text/token_trie.h"

using namespace fastllm;

namespace {

std::string read_file(const std::string &path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) fail(FASTLLM_ERR_IO, "cannot read %s", path.c_str());
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

std::string grammar_of(const std::string &path) {
    std::string text = read_file(path);
    bool json = path.size() > 5 && path.compare(path.size() - 5, 5, ".json") == 0;
    return json ? json_schema_to_grammar(text) : text;
}

std::string unhex(const std::string &line) {
    std::string out;
    for (size_t i = 0; i + 1 < line.size(); i += 2) out += (char)std::stoi(line.substr(i, 2), nullptr, 16);
    return out;
}

std::unique_ptr<Model> load(const std::string &path) {
    return std::make_unique<Model>(std::make_unique<FlmFile>(path, true), ModelOptions{1});
}

int match(const std::string &grammar_path) {
    auto grammar = Grammar::parse(grammar_of(grammar_path));
    std::string line;
    while (std::getline(std::cin, line)) {
        GrammarMatcher m(grammar);
        if (!m.accept(unhex(line))) std::puts("reject");
        else std::puts(m.finished() ? "final" : m.complete() ? "complete" : "prefix");
        std::fflush(stdout);
    }
    return 0;
}

int mask(const std::string &model_path, const std::string &grammar_path, const std::vector<std::string> &triggers) {
    auto model = load(model_path);
    auto grammar = Grammar::parse(grammar_of(grammar_path));
    const TokenTrie &trie = model->token_trie();
    const size_t vocab = (size_t)model->config().vocab_size;
    std::string line;
    while (std::getline(std::cin, line)) {
        GrammarMatcher m(grammar, triggers);
        if (!m.accept(unhex(line))) {
            std::puts("reject");
            std::fflush(stdout);
            continue;
        }
        std::vector<uint8_t> ok = m.allowed(trie, vocab, true);
        std::string out((vocab + 7) / 8 * 2, '0');
        static const char kHex[] = "0123456789abcdef";
        for (size_t k = 0; k < (vocab + 7) / 8; k++) {
            unsigned byte = 0;
            for (size_t i = 0; i < 8 && 8 * k + i < vocab; i++) byte |= (unsigned)ok[8 * k + i] << i;
            out[2 * k] = kHex[byte >> 4], out[2 * k + 1] = kHex[byte & 15];
        }
        std::puts(out.c_str());
        std::fflush(stdout);
    }
    return 0;
}

int bench(const std::string &model_path, const std::string &grammar_path, const std::string &text_path, int rounds,
          const std::vector<std::string> &triggers) {
    auto model = load(model_path);
    auto grammar = Grammar::parse(grammar_of(grammar_path));
    const std::string text = read_file(text_path);
    const std::vector<int32_t> ids = model->tokenizer().encode(text, false);
    const size_t vocab = (size_t)model->config().vocab_size;
    std::vector<float> logits(vocab);
    using clock = std::chrono::steady_clock;
    auto t0 = clock::now();
    const TokenTrie &trie = model->token_trie();
    const double trie_ms = std::chrono::duration<double, std::milli>(clock::now() - t0).count();
    std::printf("trie: %zu nodes, %zu tokens of %zu bytes at most, built in %.1f ms\n", trie.size(),
                (size_t)trie.nodes()[trie.size()].first_token, trie.max_depth(), trie_ms);
    for (int r = 0; r < rounds; r++) {
        GrammarMatcher m(grammar, triggers);
        std::vector<double> ms;
        size_t allowed_sum = 0;
        for (int32_t id : ids) {
            std::fill(logits.begin(), logits.end(), 0.0f);
            auto t = clock::now();
            allowed_sum += m.mask(trie, logits.data(), vocab, true);
            ms.push_back(std::chrono::duration<double, std::milli>(clock::now() - t).count());
            if (logits[(size_t)id] == -INFINITY || !m.accept(model->tokenizer().piece_bytes(id)))
                fail(FASTLLM_ERR_INVALID_ARGUMENT, "token %zu (%d) of the text is not allowed by the grammar",
                     (size_t)(&id - ids.data()), id);
        }
        std::vector<double> sorted = ms;
        std::sort(sorted.begin(), sorted.end());
        double sum = 0;
        for (double x : ms) sum += x;
        std::printf("round %d: %zu masks, median %.3f ms, mean %.3f ms, max %.3f ms, first %.3f ms, "
                    "%.0f tokens allowed on average\n",
                    r + 1, ms.size(), sorted[sorted.size() / 2], sum / (double)ms.size(), sorted.back(), ms[0],
                    (double)allowed_sum / (double)ms.size());
    }
    return 0;
}

}  // namespace

int main(int argc, char **argv) {
    try {
        std::string cmd = argc > 1 ? argv[1] : "";
        if (cmd == "match" && argc == 3) return match(argv[2]);
        if (cmd == "mask" && argc >= 4) return mask(argv[2], argv[3], std::vector<std::string>(argv + 4, argv + argc));
        if (cmd == "bench" && argc >= 5)
            return bench(argv[2], argv[3], argv[4], argc >= 6 ? std::atoi(argv[5]) : 3,
                         std::vector<std::string>(argv + std::min(argc, 6), argv + argc));
        std::fprintf(stderr, "usage: grammar_tool match GRAMMAR | mask MODEL GRAMMAR [TRIGGER...] | bench MODEL GRAMMAR TEXT [ROUNDS [TRIGGER...]]\n");
        return 2;
    } catch (const Error &e) {
        std::fprintf(stderr, "error %s: %s\n", fastllm_status_name(e.status()), e.what());
        return 1;
    }
}
