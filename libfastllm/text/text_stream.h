// text_stream.h — turns the bytes of generated tokens into callback-sized pieces of text:
// only whole UTF-8 characters go out, and text that may begin a stop string is held back until
// it is known either to be one (then generation stops, the stop string is not emitted) or not.
#pragma once

#include <string>
#include <vector>

#include "fastllm.h"

namespace fastllm {

class TextStream {
public:
    TextStream(std::vector<std::string> stops, fastllm_stream_callback callback, void *user_data)
        : stops_(std::move(stops)), callback_(callback), user_data_(user_data) {}

    // Adds bytes; returns true when generation must stop (stop string found or callback said so).
    bool push(const std::string &bytes);
    // Emits whatever is still held back (call when generation ends for another reason).
    void finish();

    // Text held back (a partial character, or what may begin a stop string), for saved state.
    const std::string &held() const { return pending_; }
    void restore_held(std::string s) { pending_ = std::move(s); }

    bool stopped_by_string() const { return stopped_by_string_; }
    bool stopped_by_callback() const { return stopped_by_callback_; }

private:
    bool emit(size_t n);  // sends pending_[0, n) and drops it; returns the callback's "stop"

    std::vector<std::string> stops_;
    fastllm_stream_callback callback_;
    void *user_data_;
    std::string pending_;
    bool stopped_by_string_ = false, stopped_by_callback_ = false;
};

}  // namespace fastllm
