// jinja.h — a Jinja template engine for chat templates.
//
// A model's chat template is a Jinja program written for transformers' apply_chat_template, which
// runs it in jinja2's ImmutableSandboxedEnvironment with trim_blocks, lstrip_blocks, the loop
// controls (break / continue), its own `tojson` (ensure_ascii=False, indent, separators,
// sort_keys), `raise_exception` and `strftime_now`. This engine implements that environment —
// the statements, expressions, filters, tests and str / list / dict methods templates use — so
// that any template renders byte-identically to transformers (tests/test_jinja.py). Values are
// Python's: none, bool, int, float, str, list, dict, callables; the variables come in as JSON.
//
// Rendering is bounded (Limits): a hostile template fails with an error instead of running away
// or exhausting memory. Every error is FASTLLM_ERR_INVALID_ARGUMENT with "line L, column C" of the
// template; raise_exception's message is passed through.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

namespace fastllm {
namespace jinja {

struct Limits {
    size_t max_output = size_t(32) << 20;  // bytes of output, and of any one string built
    uint64_t max_steps = 5'000'000;        // loop iterations, macro calls and items made by range()
    int max_depth = 100;                  // nested macro calls, and of the parser: nested expressions and blocks
};

class Template {
public:
    // Parses source; throws Error(FASTLLM_ERR_INVALID_ARGUMENT, "template line L, column C: ...").
    explicit Template(const std::string &source, const Limits &limits = {});
    ~Template();
    Template(const Template &) = delete;
    Template &operator=(const Template &) = delete;

    // Renders with the members of variables (a JSON object) as the template's variables. Safe to
    // call from several threads at once.
    std::string render(const nlohmann::ordered_json &variables) const;

    struct Impl;

private:
    std::unique_ptr<Impl> impl_;
};

}  // namespace jinja
}  // namespace fastllm
