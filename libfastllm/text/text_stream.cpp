#include "text/text_stream.h"

#include <algorithm>

#include "text/tokenizer.h"

namespace fastllm {

bool TextStream::emit(size_t n) {
    if (n == 0) return false;
    std::string text = sanitize_utf8(pending_.substr(0, n));
    pending_.erase(0, n);
    if (callback_ && callback_(text.data(), text.size(), user_data_) != 0) stopped_by_callback_ = true;
    return stopped_by_callback_;
}

bool TextStream::push(const std::string &bytes) {
    pending_ += bytes;
    size_t first = std::string::npos;
    for (const auto &s : stops_)
        if (!s.empty()) first = std::min(first, pending_.find(s));
    if (first != std::string::npos) {
        stopped_by_string_ = true;
        emit(first);
        pending_.clear();
        return true;
    }
    // Hold back the longest tail that is a proper prefix of some stop string.
    size_t hold = 0;
    for (const auto &s : stops_)
        for (size_t k = std::min(s.size() - (s.empty() ? 0 : 1), pending_.size()); k > hold; k--)
            if (pending_.compare(pending_.size() - k, k, s, 0, k) == 0) {
                hold = k;
                break;
            }
    size_t n = utf8_complete_prefix(std::string_view(pending_).substr(0, pending_.size() - hold));
    return emit(n);
}

void TextStream::finish() {
    if (!stopped_by_string_) emit(pending_.size());
}

}  // namespace fastllm
