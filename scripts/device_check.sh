#!/usr/bin/env bash
# The Vulkan backend on a machine with a real GPU (docs/gpu.md): the prepared check for the device
# tool's NVIDIA H200 machine (16 cores, an NVIDIA driver, no network, no Vulkan loader installed).
#
#   here, with network:  bash scripts/device_check.sh --prepare
#       builds build-device/ (Release, Vulkan) and
#       downloads the Vulkan loader's .deb into .gl/ (ignored by git; both travel as `carry`)
#   there:               bash scripts/device_check.sh OUT_DIR      (carry: .gl, build-device)
#       unpacks the loader, lists the devices, runs the Vulkan op tests (test_kernels) and
#       tests/test_vulkan.py's model tests, then benchmarks the TinyLlama-1.1B shape (f16, int8,
#       q4_k_m: pp512 / tg128, every layer on the GPU) against the same machine's CPU
#       (bench/bench_device.py; needs python3 with numpy, torch and transformers there, else it
#       says so). Logs go to OUT_DIR. About 6 minutes.
set -uo pipefail
cd "$(dirname "$0")/.."

if [ "${1:-}" = "--prepare" ]; then
  set -e
  cmake -S . -B build-device -DCMAKE_BUILD_TYPE=Release -DFASTLLM_SERVER=OFF >/dev/null
  cmake --build build-device -j2 --target fastllm test_kernels
  grep -qx '/.gl/' .git/info/exclude || echo /.gl/ >> .git/info/exclude
  grep -qx '/build-device/' .git/info/exclude || echo /build-device/ >> .git/info/exclude
  mkdir -p .gl /tmp/amd64/partial
  o='-oAPT::Architecture=amd64 -oAPT::Architectures=amd64 -oDir::State::Lists=/tmp/amd64'
  apt-get $o update -qq && (cd .gl && apt-get $o download libvulkan1)
  echo "prepared: run 'bash scripts/device_check.sh \$OUT' with carry [.gl, build-device]"
  exit 0
fi

OUT=${1:?usage: scripts/device_check.sh OUT_DIR | --prepare}
mkdir -p "$OUT"
exec > >(tee "$OUT/device_check.log") 2>&1
for f in .gl/*.deb; do [ -e "$f" ] && dpkg -x "$f" /; done
ldconfig
if [ -z "${VK_DRIVER_FILES:-}" ] && [ -f /usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json ]; then
  export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
fi
export FASTLLM_LIBRARY=$PWD/build-device/libfastllm.so PYTHONUNBUFFERED=1
export FASTLLM_BUILD_DIR=$PWD/build-device
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>/dev/null
lscpu | grep -m1 'Model name'

echo "== devices"
PYTHONPATH=bindings/python python3 -m fastllm devices
echo "== Vulkan ops against the reference (test_kernels)"
timeout 120 build-device/test_kernels scalar | grep -E "backend vulkan|FAIL|passed"
echo "== model tests (tests/test_vulkan.py, without the lavapipe-sized suites)"
timeout 240 python3 -m pytest -q -p no:cacheprovider tests/test_vulkan.py -k "not suite_passes and not server" \
  2>&1 | tail -15
echo "== TinyLlama-1.1B shape, every layer on the GPU, against this machine's CPU"
timeout 420 python3 bench/bench_device.py --shape tinyllama --variants f16,int8,q4_k_m --n_prompt 512 --n_gen 128 \
  --repeat 1 --profile --work_dir /tmp/fastllm-device-bench
echo "== done"
