#!/usr/bin/env bash
# Builds the C# binding with Mono's compiler (Debian's mono-devel; scripts/setup.sh installs it):
#   bindings/csharp/build.sh [OUT_DIR]          FastLLM.dll (default OUT_DIR: build/csharp)
#   bindings/csharp/build.sh --tests [OUT_DIR]  also FastLLMTests.exe (tests/Tests.cs with the NPC
#                                               sample's logic) and the sample's MonoBehaviour,
#                                               compiled against tests/UnityEngineStub.cs
#   bindings/csharp/build.sh --unity-plugins    builds the native library for Linux x86-64 and
#                                               ARM64 and Windows x86-64 (build-plugin-*/) into
#                                               Plugins/, with their .meta files
# The library is compiled against Mono's .NET Framework 4.7.1 reference assemblies with C# 7.2, a
# subset of what Unity (.NET Standard 2.0 profile, C# 9) and .NET compile: it uses only APIs that
# .NET Standard 2.0 has.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
TESTS=0
if [ "${1:-}" = "--unity-plugins" ]; then
  # A plugin ships inside a game, so it may need nothing the player lacks: libstdc++ and libgcc linked in (the Linux
  # libraries need only glibc; the MinGW DLL only Windows' own DLLs, tests/test_platforms.py).
  plugin() {  # plugin BUILD_DIR TOOLCHAIN|"" DEST
    local dir="$REPO/$1" options=(-DCMAKE_BUILD_TYPE=Release -DFASTLLM_SERVER=OFF
      -DFASTLLM_BUILD_TESTS=OFF -DFASTLLM_BUILD_EXAMPLES=OFF)
    [ -n "$2" ] && options+=("-DCMAKE_TOOLCHAIN_FILE=$REPO/$2")
    # -s: no symbol table in a library that ships (2.0 -> 1.6 MiB on Linux x86-64)
    if [[ "$2" != *mingw* ]]; then options+=("-DCMAKE_SHARED_LINKER_FLAGS=-static-libstdc++ -static-libgcc -s")
    else options+=("-DCMAKE_SHARED_LINKER_FLAGS=-s"); fi
    cmake -S "$REPO" -B "$dir" "${options[@]}" >/dev/null
    cmake --build "$dir" -j2 --target fastllm >/dev/null
    local lib="$dir/libfastllm.so"
    [ -f "$lib" ] || lib="$dir/fastllm.dll"
    mkdir -p "$(dirname "$HERE/$3")"
    cp -L "$lib" "$HERE/$3"
    echo "$HERE/$3 ($(du -k "$HERE/$3" | cut -f1) KiB)"
  }
  plugin build-plugin-linux-x86_64 "" Plugins/Linux/x86_64/libfastllm.so
  plugin build-plugin-linux-arm64 cmake/toolchain-aarch64-linux-gnu.cmake Plugins/Linux/ARM64/libfastllm.so
  plugin build-plugin-windows-x86_64 cmake/toolchain-mingw-w64-x86_64.cmake Plugins/Windows/x86_64/fastllm.dll
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
