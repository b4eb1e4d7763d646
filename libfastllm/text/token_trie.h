// token_trie.h — the vocabulary as a byte trie, for grammar-constrained sampling (grammar.h).
// Every token's bytes as the text stream delivers them (Tokenizer::piece_bytes) are laid out in
// depth-first preorder, so a token mask is one forward sweep over an array that jumps over a
// dead subtree in one step. Built once per model, on first use (LazyTokenTrie).
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

namespace fastllm {

class Tokenizer;

class TokenTrie {
public:
    // Tokens whose piece_bytes are empty (control tokens) are left out; so are the end-of-sequence
    // tokens, which eos_ids() lists instead: a grammar allows them only when it is complete.
    explicit TokenTrie(const Tokenizer &tokenizer);

    struct Node {
        uint32_t end;          // index just past this node's subtree
        uint32_t first_token;  // this node's tokens are tokens()[first_token, next node's first_token)
        uint16_t depth;        // bytes from the root (the root, node 0, has depth 0)
        uint8_t byte;          // the byte on the edge from the parent
    };
    // nodes()[0] is the root; nodes()[size()] is a sentinel whose first_token ends the last list.
    const Node *nodes() const { return nodes_.data(); }
    size_t size() const { return nodes_.size() - 1; }
    const int32_t *tokens() const { return tokens_.data(); }
    size_t max_depth() const { return max_depth_; }
    int32_t vocab_size() const { return vocab_size_; }
    const std::vector<int32_t> &eos_ids() const { return eos_ids_; }

private:
    std::vector<Node> nodes_;
    std::vector<int32_t> tokens_;
    std::vector<int32_t> eos_ids_;
    size_t max_depth_ = 0;
    int32_t vocab_size_ = 0;
};

// The trie of a model's vocabulary, built on the first get() by whichever thread comes first
// (std::call_once: the others wait), then shared read-only. A Model owns one.
class LazyTokenTrie {
public:
    const TokenTrie &get(const Tokenizer &tokenizer) const {
        std::call_once(once_, [&] { trie_ = std::make_unique<TokenTrie>(tokenizer); });
        return *trie_;
    }

private:
    mutable std::once_flag once_;
    mutable std::unique_ptr<TokenTrie> trie_;
};

}  // namespace fastllm
