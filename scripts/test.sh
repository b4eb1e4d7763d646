#!/usr/bin/env bash
# The whole test suite: C++ kernel tests (ctest), everything else (pytest), then the sanitizer
# job (scripts/test_sanitizers.sh: ASan + UBSan and TSan builds; FASTLLM_SKIP_SANITIZERS=1 skips it
# for a quick local run — CI always runs it).
set -euo pipefail
cd "$(dirname "$0")/.."
ctest --test-dir build --output-on-failure
python3 -m pytest tests -q --durations=50
if [ "${FASTLLM_SKIP_SANITIZERS:-0}" != 1 ]; then
  bash scripts/test_sanitizers.sh
fi
