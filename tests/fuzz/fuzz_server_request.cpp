// The server's request parsing on any body: parse_body, then each endpoint's parser. Every
// problem must be an ApiError (a 4xx); any other exception escaping is a finding.
#include <cstdint>
#include <string>

#include "request.h"

using namespace fastllm_server;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const std::string body((const char *)data, size);
    json j;
    try {
        j = parse_body(body);
    } catch (const ApiError &e) {
        if (e.status < 400 || e.status > 499) __builtin_trap();
        return 0;
    }
    for (int endpoint = 0; endpoint < 4; endpoint++) {
        try {
            if (endpoint == 0) parse_completion_request(j);
            if (endpoint == 1) parse_chat_request(j);
            if (endpoint == 2) parse_tokenize_request(j);
            if (endpoint == 3) parse_detokenize_request(j);
        } catch (const ApiError &e) {
            if (e.status < 400 || e.status > 499) __builtin_trap();
        }
    }
    return 0;
}
