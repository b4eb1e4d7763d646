"""The C# binding (bindings/csharp, P/Invoke over the C ABI), compiled with Mono's C# compiler and run
with mono: its own test program (bindings/csharp/tests/Tests.cs) against stories260K and
SmolLM2-135M, and what it writes checked against references outside it: the struct layouts against
the C compiler's, the golden greedy text, a JSON action against jsonschema, chat templates against
transformers' jinja2, the NPC sample's calls against the tools' schemas."""
import json
import os
import re
import shutil
import subprocess

import jsonschema
import pytest

from conftest import BUILD, REPO, STORIES

CSHARP = REPO / "bindings" / "csharp"
GOLDEN = json.loads((STORIES / "golden_greedy.json").read_text())
# Every test method of Tests.cs (Test<Name>): one that is missing or renamed fails here.
TESTS = ["Layout", "VersionAndAbi", "GoldenGreedy", "StreamingPiecesEqualTheText", "EvalLogits", "JsonSchemaAction",
         "ForkSaveLoadContinues", "CancelStopsALongPrompt", "CyclesKeepMemoryFlat", "ModelOutlivesItsSessions",
         "DomainReloads", "ErrorsAreFastLLMExceptions", "InfoMemoryLog", "ChatTemplatesAndTools", "NpcSample",
         "Embeddings"]


def _tool(name):
    path = shutil.which(name)
    if path is None:  # not a skip: scripts/setup.sh installs mono-devel, so its absence is a broken setup
        pytest.fail(f"`{name}` not found: the C# tests need Mono (scripts/setup.sh installs mono-devel)")
    return path


def _show(r):
    return f"exit code {r.returncode}\n--- stdout ---\n{r.stdout[-6000:]}\n--- stderr ---\n{r.stderr[-6000:]}"


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    _tool("mcs")
    out = tmp_path_factory.mktemp("csharp")
    r = subprocess.run(["bash", str(CSHARP / "build.sh"), "--tests", str(out)], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, "bindings/csharp/build.sh --tests failed:\n" + _show(r)
    return out


def run_tests(built, stories_flm, smollm_flm, *names, env=None):
    outdir = built / "out"
    outdir.mkdir(exist_ok=True)
    env = dict(os.environ if env is None else env)
    env["LD_LIBRARY_PATH"] = str(BUILD) + os.pathsep + env.get("LD_LIBRARY_PATH", "")
    r = subprocess.run([_tool("mono"), "--debug", str(built / "FastLLMTests.exe"), str(stories_flm), str(smollm_flm),
                        str(outdir), *names], capture_output=True, text=True, env=env, timeout=600)
    return r, outdir


@pytest.fixture(scope="module")
def suite(built, stories_flm, smollm_flm):
    env = {k: v for k, v in os.environ.items() if k != "FASTLLM_LOG"}
    r, outdir = run_tests(built, stories_flm, smollm_flm, env=env)
    results = {}
    for line in r.stdout.splitlines():
        m = re.match(r"(ok|FAIL) (\w+)", line)
        if m:
            results[m.group(2)] = m.group(1)
    return results, r, outdir


@pytest.mark.parametrize("name", TESTS)
def test_csharp(suite, name):
    results, r, _ = suite
    assert results.get(name) == "ok", f"Tests.cs {name}: {results.get(name, 'did not run')}\n" + _show(r)


def test_csharp_runs_no_test_this_file_does_not_know(suite):
    results, r, _ = suite
    assert sorted(results) == sorted(TESTS), _show(r)


# -- what Tests.cs writes, against references -----------------------------------------------------

def test_structs_match_the_header(suite, tmp_path):
    """Marshal.SizeOf / OffsetOf of every struct of Native.cs against sizeof / offsetof of the C
    compiler, and every struct of the header mirrored."""
    *_, outdir = suite
    rows = [line.split() for line in (outdir / "Layout.txt").read_text().splitlines()]
    header = (REPO / "include" / "fastllm.h").read_text()
    assert sorted(r[0] for r in rows) == sorted(set(re.findall(r"typedef struct (fastllm_\w+) \{", header)))
    lines = ["#include <stddef.h>", "#include <stdio.h>", '#include "fastllm.h"', "int main(void) {"]
    want = []
    for name, size, *fields in rows:
        lines.append(f'    printf("%zu\\n", sizeof({name}));')
        want.append(int(size))
        for f in fields:
            field, offset = f.split("=")
            lines.append(f'    printf("%zu\\n", offsetof({name}, {field}));')
            want.append(int(offset))
    (tmp_path / "layout.c").write_text("\n".join(lines) + "\n}\n")
    exe = tmp_path / "layout"
    subprocess.run(["cc", "-I", str(REPO / "include"), str(tmp_path / "layout.c"), "-o", str(exe)], check=True)
    got = [int(x) for x in subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout.split()]
    assert got == want


def test_embeddings_are_the_python_bindings(suite, stories_flm):
    """Model.Embed's vectors (written by Tests.cs) equal the Python binding's for the same texts."""
    import numpy as np
    import fastllm
    *_, outdir = suite
    got = np.array([[float(x) for x in line.split()] for line in (outdir / "Embeddings.txt").read_text().splitlines()])
    with fastllm.Model(stories_flm, threads=2) as m:
        want = m.embed(["Once upon a time", "The dog ran to the park.", "héllo"])
    np.testing.assert_allclose(got, want, atol=1e-6)


def test_version_and_abi_match_the_header(suite):
    *_, outdir = suite
    header = (REPO / "include" / "fastllm.h").read_text()
    version = ".".join(re.search(rf"#define FASTLLM_VERSION_{p} (\d+)", header).group(1) for p in ("MAJOR", "MINOR", "PATCH"))
    assert (outdir / "VersionAndAbi.txt").read_text().splitlines()[0] == version
    abi = re.search(r"#define FASTLLM_ABI_VERSION (\d+)", header).group(1)
    assert f"public const int AbiVersion = {abi};" in (CSHARP / "Runtime" / "Native.cs").read_text()
    package = json.loads((CSHARP / "package.json").read_text())
    assert package["version"] == version


def test_golden_greedy_text(suite):
    *_, outdir = suite
    assert (outdir / "GoldenGreedy.txt").read_text() == GOLDEN["greedy_output_text"]


def test_json_action_validates(suite):
    *_, outdir = suite
    schema, text = (outdir / "JsonSchemaAction.txt").read_text().split("\u0001")
    jsonschema.validate(json.loads(text), json.loads(schema))


def test_chat_templates_match_transformers(suite):
    """The ChatML and tool templates Tests.cs renders, against transformers' jinja2 environment."""
    from transformers.utils.chat_template_utils import _compile_jinja_template
    *_, outdir = suite
    text, with_tools = (outdir / "ChatTemplatesAndTools.txt").read_text().split("\u0001")
    source = (CSHARP / "tests" / "Tests.cs").read_text()
    chatml = _cs_const(source, "ChatMl")
    hermes = _cs_const(source, "Hermes") + chatml
    messages = [{"role": "system", "content": "You are a guard."}, {"role": "user", "content": "Héllo, 世界"}]
    assert text == _compile_jinja_template(chatml).render(messages=messages, add_generation_prompt=True)
    tools = json.loads(_cs_verbatim(source=(CSHARP / "Samples~" / "NpcDialogue" / "NpcTown.cs").read_text(), name="Tools"))
    want = _compile_jinja_template(hermes).render(messages=[{"role": "user", "content": "Open the gate"}], tools=tools,
                                                  add_generation_prompt=True, bos_token="<s>", eos_token="</s>")
    assert with_tools == want


def _cs_const(source, name):
    """The value of `const string NAME = "..." + "...";` (regular C# string literals)."""
    m = re.search(rf'const string {name} = (.*?);\n', source, re.S)
    parts = re.findall(r'"((?:[^"\\]|\\.)*)"', m.group(1))
    return "".join(json.loads(f'"{p}"') for p in parts)


def _cs_verbatim(source, name):
    m = re.search(rf'const string {name} = @"(.*?)";\n', source, re.S)
    return m.group(1).replace('""', '"')


def test_npc_sample_calls_fit_the_tools(suite):
    *_, outdir = suite
    tools = {t["function"]["name"]: t["function"]["parameters"]
             for t in json.loads(_cs_verbatim((CSHARP / "Samples~" / "NpcDialogue" / "NpcTown.cs").read_text(), "Tools"))}
    calls = re.findall(r"^(\w+) does: (\w+) (.*)$", (outdir / "NpcSample.txt").read_text(), re.M)
    assert len(calls) == 5
    for _, name, args in calls:
        jsonschema.validate(json.loads(args), tools[name])


def test_cancel_and_cycle_figures(suite):
    *_, outdir = suite
    print((outdir / "CancelStopsALongPrompt.txt").read_text())
    print((outdir / "CyclesKeepMemoryFlat.txt").read_text())
    ms = [float(x) for x in re.findall(r"([\d.]+) ms after the cancel", (outdir / "CancelStopsALongPrompt.txt").read_text())]
    assert len(ms) == 2 and max(ms) < 150


def test_a_missing_library_is_a_fastllm_exception(built, stories_flm, tmp_path):
    """Without libfastllm on the library path: FastLLMException (IO) saying where to put it, not .NET's
    DllNotFoundException."""
    env = dict(os.environ, LD_LIBRARY_PATH="")
    (tmp_path / "out").mkdir()
    r = subprocess.run([_tool("mono"), str(built / "FastLLMTests.exe"), str(stories_flm), "-", str(tmp_path / "out"),
                        "NoLibrary"], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert "ok NoLibrary" in r.stdout, _show(r)


def test_domain_reload_takes_the_log_callback_back(built, stories_flm, smollm_flm):
    """After 10 AppDomains subscribed to the log and were unloaded without unsubscribing, the library
    has no callback into them: with FASTLLM_LOG=info, the next model's messages reach stderr (with a
    stale callback they would go to the unloaded domain)."""
    r, _ = run_tests(built, stories_flm, smollm_flm, "DomainReloads", env=dict(os.environ, FASTLLM_LOG="info"))
    assert "ok DomainReloads" in r.stdout, _show(r)
    assert re.search(r"fastllm info: loaded .*stories", r.stderr), _show(r)


def test_unity_package_has_its_meta_files():
    """Every asset of the package has a .meta file (an immutable package ignores those without),
    as unity_meta.py writes them, and no two share a GUID."""
    r = subprocess.run(["python3", str(CSHARP / "unity_meta.py"), "--check"], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout
    guids = [re.search(r"guid: (\w+)", m.read_text()).group(1) for m in CSHARP.rglob("*.meta")]
    assert len(guids) == len(set(guids)) >= 10
    asmdef = json.loads((CSHARP / "Runtime" / "FastLLM.asmdef").read_text())
    assert asmdef["name"] == "FastLLM" and asmdef["noEngineReferences"]


def test_adapters_are_the_python_bindings(built, stories_flm, smollm_flm, tmp_path):
    """Model.LoadAdapter and Session.SetAdapters: a peft adapter on stories260K gives the C# session
    the greedy tokens the Python binding gives with it (at scales 1 and 0.5, and none); the rest of
    AloneAdapters (a disposed adapter, bad scales, bad files) checks itself."""
    import fastllm
    from converter.convert import convert_adapter
    from test_lora import ALL, make_adapter
    _, folder = make_adapter(STORIES / "hf", tmp_path / "peft", seed=60, r=4, lora_alpha=8, target_modules=ALL)
    path = convert_adapter(folder, STORIES / "hf", tmp_path / "a.flm")
    r, outdir = run_tests(built, stories_flm, smollm_flm, "Adapters", env=dict(os.environ, FASTLLM_TEST_ADAPTER=path))
    assert "ok Adapters" in r.stdout, _show(r)
    got = [[int(t) for t in line.split(",")] for line in (outdir / "Adapters.txt").read_text().splitlines()]
    with fastllm.Model(stories_flm) as m:
        a = m.load_adapter(path)
        want = []
        for ads in ({a: 1.0}, {a: 0.5}, {}):
            with m.session(adapters=ads) as s:
                s.generate("Once upon a time", 12, temperature=0)
                want.append(s.tokens)
    assert got == want and len({tuple(t) for t in want}) == 3
