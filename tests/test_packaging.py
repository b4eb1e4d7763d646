"""What users install: the Python wheel (built, repaired by auditwheel, installed in a fresh venv and
used from outside the checkout), `cmake --install` with its CMake package and pkg-config file (the
NPC demo built out of tree against it both ways), and the library's log routing."""
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import venv
import zipfile

import pytest

from conftest import BUILD, REPO, STORIES, run_binary, wheel_build_lock

GOLDEN = json.loads((STORIES / "golden_greedy.json").read_text())


def sh(*args, **kw):
    kw.setdefault("timeout", 600)
    r = subprocess.run([str(a) for a in args], capture_output=True, text=True, **kw)
    assert r.returncode == 0, f"{args} failed ({r.returncode}):\n{r.stdout}\n{r.stderr}"
    return r


def clean_env(**extra):
    """No FASTLLM_* variable, no PYTHONPATH: what a user's shell has."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FASTLLM_") and k != "PYTHONPATH"}
    env.update(extra)
    return env


# -- Python wheel ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    """The repaired wheel. FASTLLM_CMAKE_BUILD_DIR reuses the suite's build (the library is up to date)."""
    out = tmp_path_factory.mktemp("wheel")
    with wheel_build_lock():
        sh(sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", out / "raw",
           REPO / "bindings" / "python", env=dict(os.environ, FASTLLM_CMAKE_BUILD_DIR=str(BUILD)))
    (raw,) = (out / "raw").glob("*.whl")
    assert raw.name.endswith("-py3-none-linux_x86_64.whl"), raw.name  # no Python ABI in the tag
    sh(sys.executable, "-m", "auditwheel", "repair", "-w", out / "repaired", raw)
    (repaired,) = (out / "repaired").glob("*.whl")
    return repaired


@pytest.fixture(scope="module")
def venv_python(wheel, tmp_path_factory):
    """A fresh virtual environment with only the wheel (and numpy, its one dependency) installed."""
    env_dir = tmp_path_factory.mktemp("venv")
    venv.create(env_dir, with_pip=True)
    python = env_dir / "bin" / "python"
    sh(python, "-m", "pip", "install", "-q", "--disable-pip-version-check", wheel, env=clean_env())
    return python


def test_wheel_is_self_contained(wheel):
    assert "-py3-none-manylinux_" in wheel.name
    names = zipfile.ZipFile(wheel).namelist()
    assert "fastllm/libfastllm.so" in names and "fastllm/converter/convert.py" in names
    # nothing for auditwheel to graft: the library links only glibc, libstdc++ and libgcc, which every
    # manylinux system has
    assert not any(n.startswith("fastllm.libs/") for n in names), names
    show = sh(sys.executable, "-m", "auditwheel", "show", wheel).stdout
    assert "manylinux_" in show
    meta = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("METADATA"))).decode()
    assert "Requires-Dist: numpy" in meta and "Provides-Extra: convert" in meta
    assert "Requires-Dist: torch" in meta and 'extra == "convert"' in meta  # torch only with [convert]


def test_installed_wheel_generates_from_outside_the_checkout(venv_python, stories_flm, tmp_path):
    code = f"""
import fastllm
print(fastllm.library_path)
with fastllm.Model({str(stories_flm)!r}) as m:
    print(m.generate({GOLDEN['prompt']!r}, {GOLDEN['greedy_max_new_tokens']}, temperature=0.0))
"""
    r = sh(venv_python, "-c", code, cwd=tmp_path, env=clean_env())
    library, text = r.stdout.splitlines()[:2]
    assert library.startswith(str(venv_python.parents[1])), library  # the bundled copy, not build/
    assert GOLDEN["prompt"] + text == GOLDEN["greedy_output_text"]


def test_console_script(venv_python, stories_flm, tmp_path):
    fastllm = venv_python.parent / "fastllm"
    env = clean_env()
    for sub in ["convert", "generate", "chat", "serve", "bench", "perplexity", "info"]:
        r = subprocess.run([fastllm, sub, "--help"], capture_output=True, text=True, cwd=tmp_path, env=env)
        if sub == "convert":  # the converter needs the [convert] extra, which this venv lacks: it says so
            assert r.returncode == 1 and "pip install 'fastllm[convert]'" in r.stderr, r.stderr
        else:
            assert r.returncode == 0 and "usage: fastllm " + sub in r.stdout, (sub, r.stderr)
    info = sh(fastllm, "info", stories_flm, cwd=tmp_path, env=env).stdout
    assert "llama.vocab_size = 512" in info and "blk.0.attn_qkv.weight" in info and "isa:" in info
    same = sh(venv_python, "-m", "fastllm", "info", stories_flm, "--no-tensors", cwd=tmp_path, env=env).stdout
    assert "llama.vocab_size = 512" in same and "blk.0" not in same
    bench = sh(fastllm, "bench", stories_flm, "--prompt-tokens", "16", "--gen-tokens", "8", "--repeat", "1",
               cwd=tmp_path, env=env).stdout
    assert "pp16:" in bench and "tg8:" in bench


def test_library_next_to_package_wins_over_build(tmp_path):
    """A copy of the package with its own library: that library is loaded, even inside a checkout."""
    pkg = tmp_path / "fastllm"
    shutil.copytree(REPO / "bindings" / "python" / "fastllm", pkg)
    shutil.copyfile(BUILD / "libfastllm.so", pkg / "libfastllm.so")
    code = "import fastllm; print(fastllm.library_path)"
    r = sh(sys.executable, "-c", code, cwd=tmp_path, env=clean_env(PYTHONPATH=str(tmp_path)))
    assert r.stdout.strip() == str(pkg / "libfastllm.so")
    # FASTLLM_LIBRARY still overrides
    r = sh(sys.executable, "-c", code, cwd=tmp_path,
           env=clean_env(PYTHONPATH=str(tmp_path), FASTLLM_LIBRARY=str(BUILD / "libfastllm.so")))
    assert r.stdout.strip() == str(BUILD / "libfastllm.so")


def test_abi_mismatch_is_an_import_error_naming_both_versions(tmp_path):
    pkg = tmp_path / "fastllm"
    shutil.copytree(REPO / "bindings" / "python" / "fastllm", pkg)
    lib_py = pkg / "_lib.py"
    abi = re.search(r"#define FASTLLM_ABI_VERSION (\d+)", (REPO / "include" / "fastllm.h").read_text()).group(1)
    lib_py.write_text(lib_py.read_text().replace(f"FASTLLM_ABI_VERSION = {abi}", "FASTLLM_ABI_VERSION = 99"))
    r = subprocess.run([sys.executable, "-c", "import fastllm"], capture_output=True, text=True, cwd=tmp_path,
                       env=clean_env(PYTHONPATH=str(tmp_path), FASTLLM_LIBRARY=str(BUILD / "libfastllm.so")))
    assert r.returncode == 1 and "ImportError" in r.stderr
    assert f"library ABI version {abi}, this Python package needs 99" in r.stderr


# -- logging --------------------------------------------------------------------------------------

def test_library_messages_reach_python_logging(stories_flm, caplog):
    import fastllm
    with caplog.at_level(logging.DEBUG, logger="fastllm"):
        with fastllm.Model(stories_flm, threads=1) as m:
            m.generate("Once", 4, temperature=0.0)
        with pytest.raises(fastllm.FastLLMError):
            fastllm.Model(stories_flm.parent / "missing.flm")
    records = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "fastllm"]
    assert any(lvl == logging.INFO and msg.startswith(f"loaded {stories_flm}") for lvl, msg in records), records
    assert any(lvl == logging.INFO and msg.startswith("session: n_ctx") for lvl, msg in records), records
    assert any(lvl == logging.DEBUG and "stopped by max_tokens" in msg for lvl, msg in records), records
    assert any(lvl == logging.ERROR and "FASTLLM_ERR_IO" in msg and "missing.flm" in msg for lvl, msg in records)


def test_library_prints_nothing_unless_asked(stories_flm, tmp_path):
    code = f"""
import fastllm
with fastllm.Model({str(stories_flm)!r}) as m:
    m.generate("Once", 8, temperature=0.0)
try:
    fastllm.Model("missing.flm")
except fastllm.FastLLMError:
    pass
"""
    env = clean_env(PYTHONPATH=str(REPO / "bindings" / "python"), FASTLLM_LIBRARY=str(BUILD / "libfastllm.so"))
    r = sh(sys.executable, "-c", code, cwd=tmp_path, env=env)
    assert r.stdout == "" and r.stderr == ""
    # A C program with no callback: silent by default, stderr when FASTLLM_LOG asks
    quiet = run_binary("simple_c", stories_flm, "Once", 4)
    assert quiet.returncode == 0 and "fastllm info" not in quiet.stderr + quiet.stdout
    loud = run_binary("simple_c", stories_flm, "Once", 4, env=dict(os.environ, FASTLLM_LOG="info"))
    assert loud.returncode == 0 and f"fastllm info: loaded {stories_flm}" in loud.stderr
    assert "fastllm info" not in loud.stdout


# -- cmake --install: CMake package and pkg-config ------------------------------------------------

@pytest.fixture(scope="module")
def prefix(tmp_path_factory):
    p = tmp_path_factory.mktemp("prefix")
    sh("cmake", "--install", BUILD, "--prefix", p)
    return p


def test_install_tree(prefix):
    for f in ["include/fastllm.h", "include/fastllm.hpp", "lib/libfastllm.a", "lib/cmake/fastllm/fastllmConfig.cmake",
              "lib/cmake/fastllm/fastllmConfigVersion.cmake", "lib/cmake/fastllm/fastllmTargets.cmake",
              "lib/pkgconfig/fastllm.pc"]:
        assert (prefix / f).is_file(), f
    assert (prefix / "lib" / "libfastllm.so").resolve().is_file()
    if (BUILD / "fastllm-server").exists():  # installed beside lib/, found through its RPATH
        r = sh(prefix / "bin" / "fastllm-server", "--help", env=clean_env())
        assert "usage" in (r.stdout + r.stderr).lower()
    pc = sh("pkg-config", "--modversion", "fastllm", env=clean_env(PKG_CONFIG_PATH=str(prefix / "lib" / "pkgconfig")))
    import fastllm
    assert pc.stdout.strip() == fastllm.__version__


def run_npc(binary, model, **env):
    r = subprocess.run([binary, model, "2", "12"], capture_output=True, text=True, timeout=120, env=clean_env(**env))
    assert r.returncode == 0, r.stderr
    assert [line.split(":")[0] for line in r.stdout.splitlines()[:4]] == ["Guard", "Guard does", "Merchant",
                                                                         "Merchant does"], r.stdout
    return r.stdout


def test_npc_demo_out_of_tree_with_cmake(prefix, stories_flm, tmp_path):
    sh("cmake", "-S", REPO / "bindings" / "examples" / "cpp_npc", "-B", tmp_path / "build",
       f"-DCMAKE_PREFIX_PATH={prefix}", "-DCMAKE_BUILD_TYPE=Release")
    sh("cmake", "--build", tmp_path / "build")
    run_npc(tmp_path / "build" / "npc_dialogue", stories_flm)  # the installed library, through RPATH
    bad = subprocess.run([tmp_path / "build" / "npc_dialogue", tmp_path / "missing.flm"], capture_output=True,
                         text=True, timeout=60)
    assert bad.returncode != 0 and "missing.flm" in bad.stderr


def test_npc_demo_out_of_tree_with_pkg_config(prefix, stories_flm, tmp_path):
    src = tmp_path / "cpp_npc"
    shutil.copytree(REPO / "bindings" / "examples" / "cpp_npc", src)
    sh("make", "-C", src, env=clean_env(PKG_CONFIG_PATH=str(prefix / "lib" / "pkgconfig")))
    run_npc(src / "npc_dialogue", stories_flm, LD_LIBRARY_PATH=str(prefix / "lib"))


def test_static_library_through_the_cmake_package(prefix, stories_flm, tmp_path):
    """fastllm::fastllm_static: a C program linked with libfastllm.a runs without libfastllm.so."""
    (tmp_path / "src").mkdir()
    shutil.copyfile(REPO / "bindings" / "examples" / "c" / "simple.c", tmp_path / "src" / "simple.c")
    header = (REPO / "include" / "fastllm.h").read_text()
    version = ".".join(re.search(rf"#define FASTLLM_VERSION_{p} (\d+)", header).group(1) for p in ("MAJOR", "MINOR"))
    (tmp_path / "src" / "CMakeLists.txt").write_text(
        "cmake_minimum_required(VERSION 3.16)\nproject(static_check C CXX)\n"
        f"find_package(fastllm {version} REQUIRED)\n"
        "add_executable(simple simple.c)\ntarget_link_libraries(simple PRIVATE fastllm::fastllm_static)\n")
    sh("cmake", "-S", tmp_path / "src", "-B", tmp_path / "build", f"-DCMAKE_PREFIX_PATH={prefix}")
    sh("cmake", "--build", tmp_path / "build")
    exe = tmp_path / "build" / "simple"
    assert "libfastllm" not in sh("ldd", exe).stdout
    r = sh(exe, stories_flm, GOLDEN["prompt"], GOLDEN["greedy_max_new_tokens"], env=clean_env())
    assert r.stdout.startswith(GOLDEN["greedy_output_text"])
