// fuzz_common.h — what the fuzz targets share: the models the text targets run on.
//
// Each target is a libFuzzer entry point (LLVMFuzzerTestOneInput). scripts/fuzz.sh builds them
// with clang -fsanitize=fuzzer,address,undefined and runs them; the normal build links the same
// files with replay_main.cpp into *_replay programs that run the committed corpus and every
// crash found so far (tests/test_fuzz_corpus.py). A target returns 0 for any input the library
// refuses cleanly; a crash, a sanitizer report, a leak or an exception escaping is a finding.
#pragma once

#include <cstdio>
#include <cstdlib>

#include "fastllm.h"

// The model named by the environment variable var (a .flm path), loaded once; exits with a
// message when it is not set or does not load (a setup error, not a finding).
inline fastllm_model *fuzz_model(const char *var) {
    const char *path = std::getenv(var);
    if (!path) {
        std::fprintf(stderr, "set %s to a .flm model (scripts/fuzz.sh makes them)\n", var);
        std::exit(2);
    }
    fastllm_model_params p = fastllm_model_default_params();
    p.n_threads = 1;
    fastllm_model *m = nullptr;
    if (fastllm_model_load(path, &p, &m) != FASTLLM_OK) {
        std::fprintf(stderr, "%s=%s: %s\n", var, path, fastllm_last_error());
        std::exit(2);
    }
    return m;
}
