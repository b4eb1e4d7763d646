"""Shared pytest fixtures: import paths, the built library, converted models."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BUILD = Path(os.environ.get("FASTLLM_BUILD_DIR", REPO / "build"))
SHARED = Path(os.environ.get("FASTLLM_SHARED", REPO.parent / "shared"))  # data beside the checkout
STORIES = SHARED / "models" / "stories260K"

sys.path.insert(0, str(REPO / "bindings" / "python"))
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

# Tests that import fastllm need the built library (cmake -S . -B build && cmake --build build);
# the converter tests do not.
if (BUILD / "libfastllm.so").exists():
    os.environ.setdefault("FASTLLM_LIBRARY", str(BUILD / "libfastllm.so"))


def convert(model_dir, out_path, dtype="f32"):
    from converter.convert import convert as run
    run(str(model_dir), str(out_path), dtype=dtype, progress=False)
    return Path(out_path)


@pytest.fixture(scope="session")
def stories_flm(tmp_path_factory):
    """stories260K converted from its HF folder to f32 .flm."""
    return convert(STORIES / "hf", tmp_path_factory.mktemp("stories") / "stories260K.flm")


@pytest.fixture(scope="session")
def stories_model(stories_flm):
    import fastllm
    with fastllm.Model(stories_flm, threads=2) as m:
        yield m


def run_binary(name, *args, **kw):
    return subprocess.run([str(BUILD / name), *map(str, args)], capture_output=True, text=True, timeout=120, **kw)
