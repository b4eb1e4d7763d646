// grammar.h — constrained output. A grammar in llama.cpp's GBNF syntax (docs/grammar.md) is
// parsed into rules (Grammar), and a GrammarMatcher follows the text generated so far with
// pushdown stacks over its UTF-8 characters, as llama.cpp does. Its main job is the token mask:
// which tokens of the vocabulary keep the text a valid prefix of the grammar.
//
// The matcher is a lazily built DFA over bytes: each of its states is a set of parse stacks plus
// the bytes of a UTF-8 character seen so far, interned once, with a row of 256 transitions that
// are computed on first use. A mask walks the vocabulary's byte trie (token_trie.h) depth first,
// one table lookup per trie node, and skips every subtree whose first byte is dead. Stacks do not
// grow on right recursion (a rule reference in tail position is not pushed), so `x ::= [a-z] x |`
// loops on one state.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace fastllm {

class TokenTrie;

class Grammar {
public:
    // Parses GBNF text; every problem throws Error(FASTLLM_ERR_INVALID_ARGUMENT,
    // "grammar: line L col C: ..."): bad syntax, an undefined rule, no `root` rule, left recursion
    // (the matcher cannot follow it), a rule that can never finish (`x ::= "a" x`) reachable from
    // root, a repetition of something that can match empty text, a character class that matches
    // no character, groups nested deeper than 256, or a grammar too large (over 2^20 symbols once
    // repetitions are expanded).
    static std::shared_ptr<const Grammar> parse(std::string_view text);

    const std::string &source() const { return source_; }

    // The flattened form the matcher runs on: each rule alternative is a run of elements ending
    // with kEnd; a position is an index into elems().
    enum Kind : uint8_t { kEnd, kRule, kChars };
    struct Elem {
        Kind kind;
        uint32_t arg;  // kRule: the rule; kChars: the character class
    };
    struct CharClass {
        std::vector<std::pair<uint32_t, uint32_t>> ranges;  // sorted, disjoint, inclusive code points
        uint64_t ascii[2] = {0, 0};                         // the same for code points < 128
        bool contains(uint32_t cp) const;
        bool intersects(uint32_t lo, uint32_t hi) const;
    };
    const std::vector<Elem> &elems() const { return elems_; }
    const std::vector<uint32_t> &alternatives(uint32_t rule) const { return alts_[rule]; }
    const CharClass &char_class(uint32_t id) const { return classes_[id]; }
    uint32_t root() const { return root_; }
    // Code points that every class either contains or not alike share a group (the ranges'
    // boundaries cut the code space into them): the matcher advances once per group.
    uint32_t char_group(uint32_t cp) const;

private:
    friend class GrammarParser;
    std::string source_;
    std::vector<Elem> elems_;
    std::vector<std::vector<uint32_t>> alts_;  // per rule: where each alternative starts
    std::vector<CharClass> classes_;
    std::vector<uint32_t> boundaries_;  // sorted: where some class starts or ends + 1
    uint32_t root_ = 0;
};

class GrammarMatcher {
public:
    explicit GrammarMatcher(std::shared_ptr<const Grammar> grammar);
    // A lazy matcher, as llama.cpp's lazy grammars for tool calls: the text is free until one of
    // the triggers appears in it, and the grammar follows the text from that trigger's first byte
    // on (its matches begin with the trigger). A trigger "^x" counts only where x begins the text
    // after leading whitespace. Until a trigger, mask() disallows only the tokens that would
    // complete one with text the grammar rejects. Throws FASTLLM_ERR_INVALID_ARGUMENT for an
    // empty trigger.
    GrammarMatcher(std::shared_ptr<const Grammar> grammar, const std::vector<std::string> &triggers);

    // Follows bytes (any split of UTF-8, a character may end in a later call). Returns false and
    // changes nothing if they do not continue a valid prefix.
    bool accept(std::string_view bytes);
    // Whether accept(bytes) would succeed; the state stays as it is.
    bool allows(std::string_view bytes);
    // The text so far is a complete match (not in the middle of a character), or no trigger yet.
    bool complete() const;
    // Some more text could still follow (always before a trigger).
    bool can_continue() const;
    // A lazy matcher that has seen no trigger yet.
    bool waiting() const { return waiting_; }
    // Complete and nothing may follow: generation is over.
    bool finished() const { return complete() && !can_continue(); }

    // Sets logits[id] to -INFINITY for every token id < n_logits that would not keep the text a
    // valid prefix (those of the trie that are dead, the ones the trie leaves out, and the
    // end-of-sequence tokens unless allow_eos and the text is complete). Returns how many are
    // still allowed.
    size_t mask(const TokenTrie &trie, float *logits, size_t n_logits, bool allow_eos);
    // The same decision as a vector of 0/1 per token id < n (for tests and the benchmark).
    std::vector<uint8_t> allowed(const TokenTrie &trie, size_t n, bool allow_eos);

    // What a saved session needs to rebuild this matcher: the grammar, and the bytes accepted
    // so far, before a trigger too (a new matcher of source() and the same triggers that accepts
    // accepted() is in the same state).
    const Grammar &grammar() const { return *grammar_; }
    const std::string &accepted() const { return accepted_; }

private:
    using Stack = std::vector<uint32_t>;  // positions, top last; a top is always a kChars element
    struct StackSet {
        std::vector<Stack> stacks;
        bool accepting = false;  // the empty stack was reached: the text may end here
    };
    struct State {
        uint32_t set;     // into sets_
        uint32_t prefix;  // the bits of a UTF-8 character read so far
        uint8_t need;     // its continuation bytes still to come (0: between characters)
        uint8_t len;      // its total length in bytes
    };
    static constexpr int32_t kDead = -1, kUnknown = -2;

    void mark_allowed(const TokenTrie &trie, bool allow_eos);
    int32_t next(int32_t state, uint8_t byte) {
        int32_t t = next_[(size_t)state * 256 + byte];
        return t != kUnknown ? t : compute(state, byte);
    }
    int32_t compute(int32_t state, uint8_t byte);
    int32_t intern_state(uint32_t set, uint32_t prefix, uint8_t need, uint8_t len);
    uint32_t intern_set(StackSet &&set);
    // The stacks that result from each of stacks' tops consuming cp, expanded to terminal tops.
    StackSet advance(const StackSet &from, uint32_t cp) const;
    void expand(Stack stack, StackSet &out) const;
    bool any_top_intersects(const StackSet &set, uint32_t lo, uint32_t hi) const;
    void compact_if_large();
    // The state after bytes (kDead if refused); triggered: a lazy matcher's trigger completed in them.
    int32_t state_after(std::string_view bytes, bool &triggered);
    // Lazy matching: whether an anchored trigger may still begin the text; where the first
    // trigger begins in window (accepted_'s last bytes that can hold the start of one, then more),
    // or npos; the tokens that can complete a trigger (found once, on the first mask).
    bool anchored_armed() const;
    size_t trigger_in(std::string_view more, std::string &window) const;
    void find_candidates(const TokenTrie &trie);

    std::shared_ptr<const Grammar> grammar_;
    std::vector<StackSet> sets_;
    std::unordered_map<std::string, uint32_t> set_ids_;
    std::vector<State> states_;
    std::unordered_map<uint64_t, int32_t> state_ids_;
    std::unordered_map<uint64_t, int32_t> after_group_;  // (set, char group) -> the state after it
    std::vector<int32_t> next_;  // 256 per state: the state after a byte, kDead, or kUnknown
    int32_t current_ = 0;
    std::string accepted_;
    struct Trigger {
        std::string text;
        bool anchored;
    };
    std::vector<Trigger> triggers_;
    bool waiting_ = false;
    size_t longest_trigger_ = 0;
    bool have_candidates_ = false;
    std::vector<std::pair<int32_t, std::string>> candidates_;  // token id, its bytes
    std::vector<int32_t> path_;    // the state at each depth of the trie walk
    std::vector<uint8_t> allowed_;  // per token id, filled by mark_allowed
};

}  // namespace fastllm
