// json_schema.h — JSON Schema -> GBNF grammar (grammar.h), for structured output: the grammar
// matches JSON texts the schema accepts, in compact form with bounded whitespace (at most one
// space, or a newline and up to 20 spaces or tabs, between tokens), so that sampling at any
// temperature ends. docs/grammar.md lists the keywords and the choices made.
#pragma once

#include <string>
#include <string_view>

namespace fastllm {

// schema: the schema's JSON text. Throws Error: FASTLLM_ERR_INVALID_ARGUMENT for text that is not
// JSON, a schema that is malformed or that nothing can match ("json_schema: ... at /path");
// FASTLLM_ERR_UNSUPPORTED for a keyword this converter does not implement ("json_schema:
// unsupported keyword 'pattern' at /properties/name").
std::string json_schema_to_grammar(std::string_view schema);
// The same grammar with its top rule named root_name (and the rules it makes named after it), to
// be used inside another grammar; "root" gives the above.
std::string json_schema_to_grammar(std::string_view schema, const std::string &root_name);

}  // namespace fastllm
