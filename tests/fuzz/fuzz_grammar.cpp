// The grammar parser, the JSON Schema converter and the matcher on any input: up to the first NUL
// a GBNF grammar (or, when the first byte is '{', '[', 't' or 'f', a JSON schema), after it bytes
// fed to the matcher in pieces whose sizes the bytes choose. Checked at every step, beyond
// "no crash": a refused piece changes nothing; the token mask over the byte-level BPE model's
// vocabulary agrees with accepting each token (all allowed ones, a sample of the others; accept on
// a copy now and then, else allows(), which follows the same transitions); EOS is
// allowed exactly when the text is complete; and a complete match of a schema's grammar is JSON.
// A feed that begins with byte 0xFF makes the matcher lazy: the next byte k, then a trigger of
// 1 + k % 16 bytes, then the pieces.
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/error.h"
#include "fuzz_common.h"
#include "runtime/model.h"
#include "text/grammar.h"
#include "text/json_schema.h"
#include "text/token_trie.h"

static std::unique_ptr<fastllm::Model> g_model;

extern "C" int LLVMFuzzerInitialize(int *, char ***) {
    fastllm_model_free(fuzz_model("FASTLLM_FUZZ_BPE"));  // the same checks and message as the other targets
    g_model = std::make_unique<fastllm::Model>(std::make_unique<fastllm::FlmFile>(std::getenv("FASTLLM_FUZZ_BPE"), true), fastllm::ModelOptions{1});
    return 0;
}

static void check_mask(fastllm::GrammarMatcher &m, bool schema) {
    const fastllm::TokenTrie &trie = g_model->token_trie();
    const fastllm::Tokenizer &tok = g_model->tokenizer();
    const size_t vocab = (size_t)g_model->config().vocab_size;
    std::vector<uint8_t> ok = m.allowed(trie, vocab, true);
    for (size_t id = 0; id < vocab; id++) {
        if (tok.is_eos((int32_t)id)) {
            if ((ok[id] != 0) != m.complete()) __builtin_trap();  // EOS exactly when complete
            continue;
        }
        if (!ok[id] && id % 7) continue;  // a sample of the refused ones
        const std::string bytes = tok.piece_bytes((int32_t)id);
        const bool accepted = bytes.empty() ? m.waiting() : m.allows(bytes);  // before a trigger, any token
        if (accepted != (ok[id] != 0)) __builtin_trap();  // the mask and accept disagree
        if (ok[id] && id % 5 == 0) {  // and, now and then, accept itself on a copy
            fastllm::GrammarMatcher copy = m;
            if (!copy.accept(bytes) || copy.accepted() != m.accepted() + bytes) __builtin_trap();
        }
    }
    if (schema && m.complete()) {
        try {
            const nlohmann::json value = nlohmann::json::parse(m.accepted());
            (void)value;
        } catch (const nlohmann::json::parse_error &) {
            __builtin_trap();  // not JSON
        } catch (const nlohmann::json::out_of_range &) {
            // JSON, with a number beyond a double (1e999): valid syntax, which nlohmann refuses to hold
        }
    }
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    std::string input(reinterpret_cast<const char *>(data), size);
    const size_t nul = input.find('\0');
    std::string text = input.substr(0, nul);
    std::string feed = nul == std::string::npos ? "" : input.substr(nul + 1);
    std::vector<std::string> triggers;
    if (feed.size() >= 2 && (unsigned char)feed[0] == 0xFF) {
        const size_t k = 1 + (unsigned char)feed[1] % 16;
        triggers.push_back(feed.substr(2, k));
        feed.erase(0, std::min(feed.size(), 2 + k));
    }
    const bool schema = !text.empty() && (text[0] == '{' || text[0] == '[' || text[0] == 't' || text[0] == 'f');
    std::shared_ptr<const fastllm::Grammar> grammar;
    try {
        if (schema) text = fastllm::json_schema_to_grammar(text);
        grammar = fastllm::Grammar::parse(text);
    } catch (const fastllm::Error &) {
        return 0;  // refused cleanly
    }
    try {
        fastllm::GrammarMatcher m(grammar, triggers);
        const bool json_text = schema && triggers.empty();  // a lazy match has free text before it
        check_mask(m, json_text);
        for (size_t at = 0; at < feed.size();) {
            const size_t n = 1 + (unsigned char)feed[at] % 4;  // pieces of 1-4 bytes, splitting characters
            const std::string piece = feed.substr(at + 1, n);
            at += 1 + n;
            const std::string before = m.accepted();
            const bool complete = m.complete(), more = m.can_continue();
            if (!m.accept(piece)) {
                if (m.accepted() != before || m.complete() != complete || m.can_continue() != more) __builtin_trap();
                continue;
            }
            if (m.accepted() != before + piece) __builtin_trap();
            if (!m.complete() && !m.can_continue()) __builtin_trap();  // alive means something can follow
            check_mask(m, json_text);
        }
        // a saved state's replay: the text in one piece reaches the same state
        fastllm::GrammarMatcher replay(grammar, triggers);
        if (!replay.accept(m.accepted()) || replay.waiting() != m.waiting() || replay.complete() != m.complete() ||
            replay.can_continue() != m.can_continue())
            __builtin_trap();
    } catch (const fastllm::Error &) {
        // "too ambiguous": a clean refusal of a pathological grammar
    }
    return 0;
}
