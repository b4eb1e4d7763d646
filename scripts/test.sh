#!/usr/bin/env bash
# The whole test suite: C++ kernel tests (ctest), then everything else (pytest).
set -euo pipefail
cd "$(dirname "$0")/.."
ctest --test-dir build --output-on-failure
python3 -m pytest tests -q
