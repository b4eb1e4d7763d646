"""Builds the wheel: the fastllm package, the shared library (compiled by CMake from this checkout)
and the converter (as fastllm/converter), tagged py3-none-<platform> because ctypes needs no Python ABI.

Environment:
  FASTLLM_CMAKE_BUILD_DIR  reuse this CMake build folder (only the library target is brought up to
                           date); default: <checkout>/build/wheel[-<target>], configured here.
  FASTLLM_WHEEL_TARGET     cross-build the library for another platform with the project's
                           toolchain files (README "Platforms"): win_amd64 (fastllm.dll, MinGW-w64,
                           its runtime linked in statically) or linux_aarch64 (libfastllm.so,
                           libstdc++ and libgcc linked in statically, so that only glibc is needed;
                           `auditwheel repair` then gives the manylinux tag). Default: this machine.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

from setuptools import Distribution, setup
from setuptools.command.bdist_wheel import bdist_wheel
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


def version() -> str:
    header = (ROOT / "include" / "fastllm.h").read_text()
    parts = [re.search(rf"#define FASTLLM_VERSION_{p} (\d+)", header).group(1) for p in ("MAJOR", "MINOR", "PATCH")]
    return ".".join(parts)


# FASTLLM_WHEEL_TARGET -> (CMake toolchain file, library file name, extra CMake options)
TARGETS = {
    "win_amd64": ("cmake/toolchain-mingw-w64-x86_64.cmake", "fastllm.dll", []),
    "linux_aarch64": ("cmake/toolchain-aarch64-linux-gnu.cmake", "libfastllm.so",
                      ["-DCMAKE_SHARED_LINKER_FLAGS=-static-libstdc++ -static-libgcc"]),
}


def target():
    name = os.environ.get("FASTLLM_WHEEL_TARGET") or None
    if name is not None and name not in TARGETS:
        raise SystemExit(f"FASTLLM_WHEEL_TARGET={name!r}: expected one of {', '.join(TARGETS)} (or unset)")
    return name


def library_file() -> str:
    return TARGETS[target()][1] if target() else "libfastllm.so"


def build_library() -> Path:
    default = ROOT / "build" / ("wheel-" + target() if target() else "wheel")
    build_dir = Path(os.environ.get("FASTLLM_CMAKE_BUILD_DIR") or default)
    if not (build_dir / "CMakeCache.txt").exists():
        cross = []
        if target():
            toolchain, _, options = TARGETS[target()]
            cross = [f"-DCMAKE_TOOLCHAIN_FILE={ROOT / toolchain}", *options]
        subprocess.run(["cmake", "-S", str(ROOT), "-B", str(build_dir), "-DCMAKE_BUILD_TYPE=Release",
                        "-DFASTLLM_BUILD_TESTS=OFF", "-DFASTLLM_BUILD_EXAMPLES=OFF", "-DFASTLLM_SERVER=OFF", *cross],
                       check=True)
    subprocess.run(["cmake", "--build", str(build_dir), "--target", "fastllm", "-j", str(os.cpu_count() or 2)],
                   check=True)
    return (build_dir / library_file()).resolve()  # the real file, not the symlink


class BuildPyWithLibrary(build_py):
    def run(self):
        super().run()
        package = Path(self.build_lib) / "fastllm"
        for stale in {"libfastllm.so", "fastllm.dll"} - {library_file()}:  # of an earlier build for another target
            (package / stale).unlink(missing_ok=True)
        shutil.copyfile(build_library(), package / library_file())
        # the converter package, sub-packages included, as fastllm.converter (a fresh copy: no
        # module deleted from the checkout lingers from an earlier build)
        shutil.rmtree(package / "converter", ignore_errors=True)
        for source in (ROOT / "converter").rglob("*.py"):
            target = package / "converter" / source.relative_to(ROOT / "converter")
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, target)


class DistributionWithLibrary(Distribution):
    def has_ext_modules(self):
        return True  # it carries a native library: platlib, a platform tag


class PlatformWheel(bdist_wheel):
    def get_tag(self):
        _, _, platform = super().get_tag()
        return "py3", "none", target() or platform


setup(version=version(), distclass=DistributionWithLibrary, cmdclass={"build_py": BuildPyWithLibrary, "bdist_wheel": PlatformWheel})
