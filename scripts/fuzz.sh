#!/usr/bin/env bash
# Runs the libFuzzer targets of tests/fuzz (docs/reliability.md):
#   bash scripts/fuzz.sh TARGET SECONDS     TARGET: flm, tokenizer, chat_template, server_request, grammar or all
# Builds them with clang (installed from Debian's packages when missing) into build-fuzz/, with
# ASan + UBSan, runs each for SECONDS on one core, growing build-fuzz/corpus/TARGET from the
# committed seeds in tests/fuzz/corpus/TARGET, and prints libFuzzer's final figures. A crash
# leaves its input in build-fuzz/crashes/TARGET/: minimise it (the program's -minimize_crash=1),
# fix the library, and commit the input to tests/fuzz/regressions/TARGET/ (the test suite runs it).
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -eq 2 ] || { sed -n 2,3p "$0"; exit 2; }
TARGETS="$1"; SECONDS_EACH="$2"
[ "$TARGETS" = all ] && TARGETS="flm tokenizer chat_template server_request grammar"

SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
if ! command -v clang++-14 >/dev/null || ! dpkg -s libclang-rt-14-dev >/dev/null 2>&1; then
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq clang-14 libclang-rt-14-dev >/dev/null
fi
cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_C_COMPILER=clang-14 \
  -DCMAKE_CXX_COMPILER=clang++-14 -DFASTLLM_FUZZ=ON -DFASTLLM_SERVER=OFF \
  -DFASTLLM_BUILD_EXAMPLES=OFF >/dev/null
for t in $TARGETS; do cmake --build build-fuzz -j2 --target "fuzz_$t" >/dev/null; done
python3 tests/fuzz/make_models.py build-fuzz/models >/dev/null
export FASTLLM_FUZZ_SPM=$PWD/build-fuzz/models/spm.flm FASTLLM_FUZZ_BPE=$PWD/build-fuzz/models/bpe.flm
export ASAN_OPTIONS=halt_on_error=1:detect_leaks=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1

for t in $TARGETS; do
  mkdir -p "build-fuzz/corpus/$t" "build-fuzz/crashes/$t"
  extra=()
  [ -f "tests/fuzz/$t.dict" ] && extra+=("-dict=tests/fuzz/$t.dict")
  echo "== fuzz_$t: ${SECONDS_EACH} s"
  build-fuzz/fuzz/fuzz_$t -max_total_time="$SECONDS_EACH" -print_final_stats=1 -rss_limit_mb=4096 \
    -timeout=30 -artifact_prefix="build-fuzz/crashes/$t/" "${extra[@]}" "build-fuzz/corpus/$t" "tests/fuzz/corpus/$t" \
    2>&1 | grep -E "^(#[0-9]+.*(DONE|pulse)|stat::|==[0-9]+==|SUMMARY|.*ERROR)" | tail -20
done
