#!/usr/bin/env bash
# Builds the C# binding with Mono's compiler (Debian's mono-devel; scripts/setup.sh installs it):
#   bindings/csharp/build.sh [OUT_DIR]          FastLLM.dll (default OUT_DIR: build/csharp)
#   bindings/csharp/build.sh --tests [OUT_DIR]  also FastLLMTests.exe (tests/Tests.cs with the NPC
#                                               sample's logic) and the sample's MonoBehaviour,
#                                               compiled against tests/UnityEngineStub.cs
#   bindings/csharp/build.sh --unity-plugins    copies the native libraries built in build/,
#                                               build-aarch64/ and build-windows/ into Plugins/
# The library is compiled against Mono's .NET Framework 4.7.1 reference assemblies with C# 7.2, a
# subset of what Unity (.NET Standard 2.0 profile, C# 9) and .NET compile: it uses only APIs that
# .NET Standard 2.0 has.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
TESTS=0
if [ "${1:-}" = "--unity-plugins" ]; then
  copy() {  # copy SRC DEST: a library that was built goes into the package
    if [ -f "$1" ]; then mkdir -p "$(dirname "$2")"; cp "$1" "$2"; echo "$2"; else echo "not built: $1 (skipped)"; fi
  }
  copy "$REPO/build/libfastllm.so" "$HERE/Plugins/Linux/x86_64/libfastllm.so"
  copy "$REPO/build-aarch64/libfastllm.so" "$HERE/Plugins/Linux/ARM64/libfastllm.so"
  copy "$REPO/build-windows/fastllm.dll" "$HERE/Plugins/Windows/x86_64/fastllm.dll"
  python3 "$HERE/unity_meta.py"  # the plugins' .meta files: which platform loads each
  exit 0
fi
if [ "${1:-}" = "--tests" ]; then TESTS=1; shift; fi
OUT="${1:-$REPO/build/csharp}"
mkdir -p "$OUT"
# CS1591 (a public member without an XML comment) is allowed: the raw layer mirrors the header,
# whose comments say what each member is.
MCS=(mcs -langversion:7.2 -sdk:4.7.1-api -warnaserror+ -nowarn:1591 -nologo)
"${MCS[@]}" -target:library -doc:"$OUT/FastLLM.xml" -out:"$OUT/FastLLM.dll" "$HERE"/Runtime/*.cs
if [ "$TESTS" = 1 ]; then
  "${MCS[@]}" -r:"$OUT/FastLLM.dll" -out:"$OUT/FastLLMTests.exe" "$HERE/tests/Tests.cs" "$HERE/Samples~/NpcDialogue/NpcTown.cs"
  # The MonoBehaviour, type-checked against the few UnityEngine members it uses.
  "${MCS[@]}" -target:library -r:"$OUT/FastLLM.dll" -out:"$OUT/NpcDialogueCheck.dll" "$HERE/tests/UnityEngineStub.cs" \
    "$HERE/Samples~/NpcDialogue/NpcTown.cs" "$HERE/Samples~/NpcDialogue/NpcDialogue.cs"
fi
