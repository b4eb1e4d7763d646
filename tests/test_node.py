"""The Node.js client (bindings/examples/node, koffi over the C ABI): its own node:test suite against
stories260K, the streaming example, and its struct layouts against the header's."""
import json
import os
import re
import shutil
import subprocess

import pytest

from conftest import BUILD, REPO, STORIES

NODE_DIR = REPO / "bindings" / "examples" / "node"
GOLDEN_PATH = STORIES / "golden_greedy.json"
GOLDEN = json.loads(GOLDEN_PATH.read_text())
STRUCTS = ["fastllm_model_params", "fastllm_model_info", "fastllm_session_params", "fastllm_sampling_params",
           "fastllm_generation_result", "fastllm_session_memory_info", "fastllm_embed_params",
           "fastllm_rerank_params"]


def _tool(name):
    path = shutil.which(name)
    if path is None:  # not a skip: scripts/setup.sh installs Node.js, so its absence is a broken setup
        pytest.fail(f"`{name}` not found on PATH: the Node.js client's tests need Node.js >= 18 and npm "
                    "(scripts/setup.sh installs them)")
    return path


def _show(r):
    return f"exit code {r.returncode}\n--- stdout ---\n{r.stdout}\n--- stderr ---\n{r.stderr}"


@pytest.fixture(scope="module")
def node():
    """The node binary, with the example's dependencies (koffi) installed from package-lock.json."""
    node = _tool("node")
    installed = NODE_DIR / "node_modules" / ".package-lock.json"  # written by npm install / npm ci
    lock = NODE_DIR / "package-lock.json"
    if not installed.exists() or installed.stat().st_mtime < lock.stat().st_mtime:
        r = subprocess.run([_tool("npm"), "ci", "--no-audit", "--no-fund"], cwd=NODE_DIR, capture_output=True,
                           text=True, timeout=300)
        assert r.returncode == 0, "npm ci failed in bindings/examples/node:\n" + _show(r)
    return node


@pytest.fixture(scope="module")
def node_env():
    env = dict(os.environ)
    env["FASTLLM_LIBRARY"] = str(BUILD / "libfastllm.so")
    return env


def test_node_suite(node, node_env, stories_flm):
    env = dict(node_env, FASTLLM_MODEL=str(stories_flm), FASTLLM_GOLDEN=str(GOLDEN_PATH))
    r = subprocess.run([node, "--test"], cwd=NODE_DIR, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, "node --test failed in bindings/examples/node:\n" + _show(r)
    assert "# fail 0" in r.stdout and "# pass 0" not in r.stdout, _show(r)


def test_node_example_streams_the_greedy_golden(node, node_env, stories_flm):
    r = subprocess.run([node, "example.js", str(stories_flm), GOLDEN["prompt"], "--max-tokens",
                        str(GOLDEN["greedy_max_new_tokens"]), "--temperature", "0", "--threads", "2"],
                       cwd=NODE_DIR, env=node_env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, _show(r)
    assert r.stdout.startswith(GOLDEN["greedy_output_text"]), _show(r)
    assert "stopped by max_tokens" in r.stderr, _show(r)


def test_node_example_reports_a_missing_model(node, node_env, tmp_path):
    r = subprocess.run([node, "example.js", str(tmp_path / "missing.flm"), "hi"], cwd=NODE_DIR, env=node_env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1, _show(r)
    assert "FASTLLM_ERR_IO" in r.stderr and "missing.flm" in r.stderr, _show(r)


def test_node_struct_layouts_match_the_header(node, node_env, tmp_path):
    """koffi's layout of each struct (size, field offsets) equals the C compiler's for include/fastllm.h."""
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        pytest.fail("no C compiler (cc) on PATH; the build needs one")
    # One line per struct ("name size N") and per field ("name field OFFSET"), from the compiler.
    printfs = []
    for s in STRUCTS:
        printfs.append(f'printf("{s} size %zu\\n", sizeof({s}));')
        printfs += [f'printf("{s} {f} %zu\\n", offsetof({s}, {f}));' for f in _struct_fields(s)]
    src = tmp_path / "layout.c"
    src.write_text('#include <stddef.h>\n#include <stdio.h>\n#include "fastllm.h"\n'
                   "int main(void) {\n    " + "\n    ".join(printfs) + "\n    return 0;\n}\n")
    exe = tmp_path / "layout"
    r = subprocess.run([cc, "-I", str(REPO / "include"), str(src), "-o", str(exe)], capture_output=True, text=True)
    assert r.returncode == 0, _show(r)
    c_layout = {}
    for line in subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout.splitlines():
        struct, key, value = line.split()
        c_layout.setdefault(struct, {})[key] = int(value)

    script = ("const { types } = require('./fastllm');"
              "const out = {};"
              "for (const [name, t] of Object.entries(types)) {"
              "  out[name] = { size: t.size };"
              "  for (const m of Object.values(t.members)) out[name][m.name] = m.offset;"
              "}"
              "console.log(JSON.stringify(out));")
    r = subprocess.run([node, "-e", script], cwd=NODE_DIR, env=node_env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, _show(r)
    assert json.loads(r.stdout) == c_layout


def _struct_fields(name):
    """Field names of `typedef struct name {...} name;` in include/fastllm.h, in order."""
    text = (REPO / "include" / "fastllm.h").read_text()
    start = text.index(f"typedef struct {name} {{")
    body = text[text.index("{", start) + 1:text.index(f"}} {name};", start)]
    body = re.sub(r"/\*.*?\*/", "", body, flags=re.S)  # comments, also those of several lines
    return [decl.replace("*", " ").split()[-1] for decl in body.split(";") if decl.strip()]
