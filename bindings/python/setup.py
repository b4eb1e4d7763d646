"""Builds the wheel: the fastllm package, libfastllm.so (compiled by CMake from this checkout) and
the converter (as fastllm/converter), tagged py3-none-<platform> because ctypes needs no Python ABI.

Environment:
  FASTLLM_CMAKE_BUILD_DIR  reuse this CMake build folder (only the library target is brought up to
                           date); default: <checkout>/build/wheel, configured here.
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


def build_library() -> Path:
    build_dir = Path(os.environ.get("FASTLLM_CMAKE_BUILD_DIR") or ROOT / "build" / "wheel")
    if not (build_dir / "CMakeCache.txt").exists():
        subprocess.run(["cmake", "-S", str(ROOT), "-B", str(build_dir), "-DCMAKE_BUILD_TYPE=Release",
                        "-DFASTLLM_BUILD_TESTS=OFF", "-DFASTLLM_BUILD_EXAMPLES=OFF", "-DFASTLLM_SERVER=OFF"],
                       check=True)
    subprocess.run(["cmake", "--build", str(build_dir), "--target", "fastllm", "-j", str(os.cpu_count() or 2)],
                   check=True)
    return (build_dir / "libfastllm.so").resolve()  # the real file, not the symlink


class BuildPyWithLibrary(build_py):
    def run(self):
        super().run()
        package = Path(self.build_lib) / "fastllm"
        shutil.copyfile(build_library(), package / "libfastllm.so")
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
        return "py3", "none", platform


setup(version=version(), distclass=DistributionWithLibrary, cmdclass={"build_py": BuildPyWithLibrary, "bdist_wheel": PlatformWheel})
