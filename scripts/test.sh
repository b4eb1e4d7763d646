#!/usr/bin/env bash
# The whole test suite: C++ kernel tests (ctest), everything else (pytest), then the sanitizer
# job (scripts/test_sanitizers.sh: ASan + UBSan and TSan builds; FASTLLM_SKIP_SANITIZERS=1 skips it
# for a quick local run — CI always runs it).
set -euo pipefail
cd "$(dirname "$0")/.."
ctest --test-dir build --output-on-failure
# Two pytest workers, a file each at a time (--dist loadfile: a file's module and session fixtures,
# such as test_platforms.py's cross builds into build-<name>/, stay in one process). On the 2-core
# CI machine class the serial run took 16.5-20 min, the two workers 10.8 (AMD EPYC, 2026-12-06):
# much of the suite waits on subprocesses, compilers, QEMU and lavapipe with a core idle.
# FASTLLM_TEST_WORKERS=0 runs serially (pytest-xdist's -n 0).
python3 -m pytest tests -q -n "${FASTLLM_TEST_WORKERS:-2}" --dist loadfile --durations=50
if [ "${FASTLLM_SKIP_SANITIZERS:-0}" != 1 ]; then
  bash scripts/test_sanitizers.sh
fi
