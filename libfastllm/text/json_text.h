// json_text.h — JSON text into a value, for every part of the library that reads JSON (schemas, tool
// calls, the C API's arguments): one parser, where each file calling nlohmann's parse compiled its
// own (a file's compile under ASan + UBSan, -O1: 17.6 s with it, 11.3 s without).
#pragma once

#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace fastllm {

enum class JsonParse { Ok, Invalid, TooDeep };

// Parses text into out (keys in their order). Nesting past max_depth is refused while parsing: the
// library walks what it parsed recursively. On Invalid, error (if given) says where and why.
JsonParse parse_json(std::string_view text, int max_depth, nlohmann::ordered_json &out, std::string *error = nullptr);

}  // namespace fastllm
