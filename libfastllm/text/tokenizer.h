// tokenizer.h — text <-> token ids. The concrete tokenizer is chosen by the .flm metadata key
// `tokenizer.model` (make_tokenizer); the rest of the library sees only this interface.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace fastllm {

class FlmFile;

// Added tokens (special tokens such as <|im_start|>, <|end|>) are cut out of the raw text before
// the model's own encoding, as HuggingFace tokenizers' AddedVocabulary does: the leftmost match
// wins, the longest of those starting there; a token with lstrip / rstrip also takes the
// whitespace (Unicode White_Space) before / after it, which then gives no tokens. Text that lies
// between matches is encoded by the tokenizer; `after_token` says whether it follows a match.
class AddedTokens {
public:
    // Adds a token text (non-empty); the first id added for a text wins.
    void add(const std::string &text, int32_t id);
    void set_strip(int32_t id, bool lstrip, bool rstrip);
    bool empty() const { return trie_[0].next.empty(); }

    struct Piece {
        std::string_view text;  // text to encode (id < 0), or the matched text
        int32_t id;             // the added token, -1 for text
        bool after_token;       // text that follows an added token (not the start of the input)
    };
    // The pieces of text in order: runs of text (never empty) and added tokens.
    std::vector<Piece> split(std::string_view text) const;

private:
    struct Node {
        int32_t id = -1;                                // added token ending here
        std::vector<std::pair<uint8_t, int32_t>> next;  // byte -> child node
    };
    // Leftmost-longest token in text at or after `from`; false if none.
    bool find(std::string_view text, size_t from, size_t &start, size_t &len, int32_t &id) const;

    std::vector<Node> trie_{1};
    bool first_byte_[256] = {};
    std::vector<int32_t> lstrip_, rstrip_;  // ids, sorted
};

class Tokenizer {
public:
    virtual ~Tokenizer() = default;

    // Token ids of text (UTF-8), optionally with BOS first.
    virtual std::vector<int32_t> encode(std::string_view text, bool add_bos) const = 0;
    // Text of ids as the reference tokenizer's decode gives it (control tokens give nothing).
    virtual std::string decode(const int32_t *ids, size_t n) const = 0;
    // Raw bytes one token adds to a stream of text (may be part of a UTF-8 character).
    virtual std::string piece_bytes(int32_t id) const = 0;

    int32_t vocab_size() const { return (int32_t)pieces_.size(); }
    const std::string &piece(int32_t id) const { return pieces_[id]; }
    int32_t bos_id() const { return bos_id_; }
    // The separator between the two texts of a pair ([CLS] a [SEP] b [SEP]); -1: none (a
    // tokenizer that encodes no pairs).
    virtual int32_t sep_id() const { return -1; }
    int32_t eos_id() const { return eos_id_; }
    bool add_bos_default() const { return add_bos_; }
    bool is_eos(int32_t id) const;

protected:
    // Reads and range-checks tokenizer.bos_id / eos_id / eos_ids / add_bos (shared by every
    // tokenizer); returns tokenizer.unk_id (-1 if absent).
    int32_t read_special_ids(const FlmFile &file, int64_t vocab_size, bool add_bos_default);
    // The lstrip / rstrip flags of added tokens: the optional id lists tokenizer.added_lstrip and
    // tokenizer.added_rstrip (ids out of range are a format error; flags of ids that are not
    // added tokens have no effect).
    void read_added_strip(const FlmFile &file, AddedTokens &added) const;

    std::vector<std::string> pieces_;
    int32_t bos_id_ = -1, eos_id_ = -1;
    std::vector<int32_t> eos_ids_;  // every id that ends generation
    bool add_bos_ = true;
};

// Reads the tokenizer stored in a .flm file; vocab_size is the model's (the tokenizer must match).
std::unique_ptr<Tokenizer> make_tokenizer(const FlmFile &file, int64_t vocab_size);

// Replaces invalid UTF-8 sequences with U+FFFD, as the reference decoders do.
std::string sanitize_utf8(const std::string &bytes);
// Length of the longest prefix of s that ends on a UTF-8 character boundary (for streaming).
size_t utf8_complete_prefix(std::string_view s);

}  // namespace fastllm
