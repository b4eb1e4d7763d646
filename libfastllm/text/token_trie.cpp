#include "text/token_trie.h"

#include <algorithm>
#include <string>

#include "text/tokenizer.h"

namespace fastllm {

TokenTrie::TokenTrie(const Tokenizer &tok) : vocab_size_(tok.vocab_size()) {
    // Sorted byte strings give the preorder directly: a prefix sorts before its extensions, and
    // each subtree is one contiguous run.
    std::vector<std::pair<std::string, int32_t>> pieces;
    pieces.reserve((size_t)vocab_size_);
    for (int32_t id = 0; id < vocab_size_; id++) {
        if (tok.is_eos(id)) {
            eos_ids_.push_back(id);
            continue;
        }
        std::string bytes = tok.piece_bytes(id);
        if (bytes.empty() || bytes.size() > UINT16_MAX) continue;  // control tokens; nothing is that long
        pieces.emplace_back(std::move(bytes), id);
    }
    std::sort(pieces.begin(), pieces.end());

    nodes_.push_back(Node{0, 0, 0, 0});
    std::vector<uint32_t> path{0};  // path[d]: the node at depth d on the way to the last piece
    const std::string *prev = nullptr;
    for (const auto &[bytes, id] : pieces) {
        size_t common = 0;
        if (prev)
            while (common < prev->size() && common < bytes.size() && (*prev)[common] == bytes[common]) common++;
        while (path.size() > common + 1) {  // close the subtrees this piece leaves
            nodes_[path.back()].end = (uint32_t)nodes_.size();
            path.pop_back();
        }
        for (size_t d = common; d < bytes.size(); d++) {
            path.push_back((uint32_t)nodes_.size());
            nodes_.push_back(Node{0, (uint32_t)tokens_.size(), (uint16_t)(d + 1), (uint8_t)bytes[d]});
        }
        tokens_.push_back(id);  // its node is path.back(), created now or by an equal piece just before
        max_depth_ = std::max(max_depth_, bytes.size());
        prev = &bytes;
    }
    while (!path.empty()) {
        nodes_[path.back()].end = (uint32_t)nodes_.size();
        path.pop_back();
    }
    nodes_.push_back(Node{(uint32_t)nodes_.size() + 1, (uint32_t)tokens_.size(), 0, 0});  // sentinel
}

}  // namespace fastllm
