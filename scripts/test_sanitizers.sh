#!/usr/bin/env bash
# The sanitizer job (docs/reliability.md), run by scripts/test.sh: builds the library, its tests,
# the fuzz replay programs and fastllm-server with AddressSanitizer + UndefinedBehaviorSanitizer
# into build-asan/ (every report fatal), then runs the C++ tests (leaks checked too, but for
# lavapipe's own: scripts/lsan.supp) and the
# pytest files that drive the C API hardest against that build. Python loads the ASan runtime
# first, and libstdc++ with it, so that ASan can intercept exceptions (LD_PRELOAD); leak checking
# is off there, as CPython itself keeps memory at exit.
# Two pytest workers as in scripts/test.sh: 134 s against 178 s serially (AMD EPYC, 2 cores,
# 2026-12-06, one after the other).
# Then the 8-session thread test under ThreadSanitizer (build-tsan/).
set -euo pipefail
cd "$(dirname "$0")/.."
# -O1 (and CMakeLists.txt's -g1, line tables: what a report's stack needs): the ASan build took 3 min
# 48 s instead of 7 min 10 s at -O2 -g, its kernel tests 19 s instead of 13, its pytest run the same
# 3 min 8 s (AMD EPYC, 2 cores, 2026-12-06).
OPT=(-DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O1 -DNDEBUG" -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -DNDEBUG")
cmake -S . -B build-asan "${OPT[@]}" -DFASTLLM_SANITIZE=address >/dev/null
# Only what the runs below use: the library, the kernel tests, fastllm-server, the fuzz replays and
# the programs test_reliability.py starts (not the examples, benches and other tools).
cmake --build build-asan -j2 --target fastllm test_kernels test_quant_lanes fastllm-server test_cycles test_threads \
  fuzz_flm_replay fuzz_tokenizer_replay fuzz_chat_template_replay fuzz_grammar_replay fuzz_server_request_replay \
  >/dev/null
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
export LSAN_OPTIONS="suppressions=$PWD/scripts/lsan.supp"  # the Vulkan driver's own leaks only
ASAN_OPTIONS=halt_on_error=1:detect_leaks=1 ctest --test-dir build-asan --output-on-failure
ASAN_OPTIONS=halt_on_error=1:detect_leaks=0 LD_PRELOAD="$(gcc -print-file-name=libasan.so) $(gcc -print-file-name=libstdc++.so)" \
  FASTLLM_BUILD_DIR="$PWD/build-asan" FASTLLM_LIBRARY="$PWD/build-asan/libfastllm.so" \
  python3 -m pytest -q -p no:cacheprovider -n "${FASTLLM_TEST_WORKERS:-2}" --dist loadfile \
    tests/test_api.py tests/test_bad_input.py tests/test_tokenizer_spm.py tests/test_tokenizer_bpe.py \
    tests/test_special_tokens.py tests/test_chat_template.py tests/test_batched_generation.py \
    tests/test_server.py tests/test_fuzz_corpus.py tests/test_reliability.py tests/test_session_share.py \
    tests/test_sliding_window.py tests/test_speculative.py tests/test_batched_admission.py \
    -k "not long_prompt_is_admitted and not many_forks_cost_one_prefix and not context_shift_on_a_real_model" "$@"
# Left out above, SmolLM2's (an f32 file of 538 MB): its streams, whose timing alone differs from the other
# server tests', and its forks' sharing and context shift's closeness, whose memory paths the small
# models' tests of the same files take (the last two took 37 and 18 s of 139 under ASan).

# The CPU backend's threads only: no server, examples or Vulkan backend (test_threads runs none of them)
cmake -S . -B build-tsan "${OPT[@]}" -DFASTLLM_SANITIZE=thread \
  -DFASTLLM_SERVER=OFF -DFASTLLM_BUILD_EXAMPLES=OFF -DFASTLLM_VULKAN=OFF >/dev/null
cmake --build build-tsan -j2 --target test_threads >/dev/null
SHARED="${FASTLLM_SHARED:-$PWD/../shared}"
[ -f build-tsan/stories260K.flm ] || python3 converter/convert.py --model_path "$SHARED/models/stories260K/hf" \
  --out_path build-tsan/stories260K.flm >/dev/null
TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 build-tsan/test_threads build-tsan/stories260K.flm 2
