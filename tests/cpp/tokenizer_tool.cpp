// tokenizer_tool.cpp — a .flm file's tokenizer alone, for tests/test_tokenizer_wordpiece.py (an
// encoder's tokenizer is tested before the model that carries it): reads UTF-8 lines from stdin,
// writes for each its ids (with the special tokens when --special) and the hex of their decode.
// Usage: tokenizer_tool FILE.flm [--special] < lines
#include <cstdio>
#include <cstring>
#include <iostream>
#include <string>

#include "base/error.h"
#include "format/flm_file.h"
#include "text/tokenizer.h"

int main(int argc, char **argv) {
    if (argc < 2) {
        std::fprintf(stderr, "usage: %s FILE.flm [--special] < lines\n", argv[0]);
        return 2;
    }
    const bool special = argc > 2 && std::strcmp(argv[2], "--special") == 0;
    try {
        fastllm::FlmFile file(argv[1], true);
        auto tok = fastllm::make_tokenizer(file, (int64_t)file.get_strings("tokenizer.tokens").size());
        std::string line;
        while (std::getline(std::cin, line)) {
            auto ids = tok->encode(line, special);
            for (size_t i = 0; i < ids.size(); i++) std::printf(i ? " %d" : "%d", ids[i]);
            std::printf("\n");
            for (unsigned char c : tok->decode(ids.data(), ids.size())) std::printf("%02x", c);
            std::printf("\n");
        }
    } catch (const fastllm::Error &e) {
        std::fprintf(stderr, "%s\n", e.what());
        return 1;
    }
    return 0;
}
