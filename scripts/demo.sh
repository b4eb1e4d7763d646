#!/usr/bin/env bash
# The main job on the default model: convert stories260K (from ../shared, no download) and generate.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p models
python3 converter/convert.py --model_path ../shared/models/stories260K/hf --out_path models/stories260K.flm
PYTHONPATH=bindings/python python3 -m fastllm generate models/stories260K.flm "Once upon a time" \
  --max-new-tokens 64 --temperature 0
