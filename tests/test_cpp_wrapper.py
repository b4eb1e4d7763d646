"""The header-only C++ wrapper (bindings/examples/cpp/fastllm.hpp) and the NPC demo that uses it.

The programs are compiled here with g++ against the in-tree headers and build/libfastllm.so (the
out-of-tree builds against `cmake --install` are in test_packaging.py)."""
import json
import re
import subprocess

import pytest

from conftest import BUILD, REPO, STORIES

GOLDEN = json.loads((STORIES / "golden_greedy.json").read_text())
HPP_DIR = REPO / "bindings" / "examples" / "cpp"
NPC_DIR = REPO / "bindings" / "examples" / "cpp_npc"

def compile_cpp(source, out, sanitize=False):
    cmd = ["g++", "-std=c++17", "-Wall", "-Wextra", "-Werror", "-g", "-O1",
           "-I", str(REPO / "include"), "-I", str(HPP_DIR), str(source),
           "-L", str(BUILD), "-lfastllm", f"-Wl,-rpath,{BUILD}", "-o", str(out)]
    if sanitize:  # a double free or a leaked handle in the wrapper fails the run
        r = subprocess.run(cmd[:1] + ["-fsanitize=address,undefined", "-fno-sanitize-recover=all"] + cmd[1:],
                           capture_output=True, text=True, timeout=300)
        if r.returncode == 0:
            return out
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return out


def run(*args):
    return subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def hpp_check(stories_flm, tmp_path_factory):
    """Runs tests/cpp/hpp_check.cpp once; its "key=value" lines as a dict."""
    tmp = tmp_path_factory.mktemp("hpp")
    exe = compile_cpp(REPO / "tests" / "cpp" / "hpp_check.cpp", tmp / "hpp_check", sanitize=True)
    missing = tmp / "no_such_model.flm"
    r = run(exe, stories_flm, GOLDEN["prompt"], GOLDEN["greedy_max_new_tokens"], missing)
    assert r.returncode == 0, r.stdout + r.stderr
    out = dict(line.split("=", 1) for line in r.stdout.splitlines())
    assert out.get("done") == "1"
    out["_missing"] = str(missing)
    return out


@pytest.fixture(scope="module")
def npc_exe(tmp_path_factory):
    return compile_cpp(NPC_DIR / "npc_dialogue.cpp", tmp_path_factory.mktemp("npc") / "npc_dialogue")


def test_tokenizer(hpp_check):
    assert int(hpp_check["tokenize.n"]) == len(GOLDEN["input_ids"])
    assert hpp_check["tokenize.bos_first"] == "1"
    assert int(hpp_check["tokenize.no_bos_n"]) == len(GOLDEN["input_ids"]) - 1
    assert hpp_check["detokenize"] == GOLDEN["prompt"]
    assert hpp_check["pieces_joined"].strip() == GOLDEN["prompt"]


def test_greedy_matches_golden(hpp_check):
    n_new = GOLDEN["greedy_max_new_tokens"]
    assert GOLDEN["prompt"] + hpp_check["greedy.text"] == GOLDEN["greedy_output_text"]
    assert hpp_check["greedy.streamed_same"] == "1"
    assert int(hpp_check["greedy.n_prompt"]) == len(GOLDEN["input_ids"])
    assert int(hpp_check["greedy.n_generated"]) == n_new
    assert hpp_check["greedy.stop"] == "max_tokens"
    assert int(hpp_check["greedy.n_tokens"]) == len(GOLDEN["input_ids"]) + n_new
    assert hpp_check["greedy.tokens_match"] == "1"
    assert hpp_check["ids.text"] == hpp_check["greedy.text"]  # prompt given as ids


def test_callback_returning_false_stops(hpp_check):
    assert hpp_check["stop3.calls"] == "3"
    assert hpp_check["stop3.n_generated"] == "3"
    assert hpp_check["stop3.stop"] == "callback"


def test_stop_string(hpp_check):
    assert hpp_check["stopstr.stop"] == "stop_string"
    assert GOLDEN["greedy_output_text"].startswith(GOLDEN["prompt"] + hpp_check["stopstr.text"] + "Lily")


def test_exception_in_callback_propagates(hpp_check):
    assert hpp_check["throw.caught"] == "Boom2"  # the lambda's own exception type, out of generate()
    assert hpp_check["throw.calls"] == "2"  # generation stopped at once
    assert int(hpp_check["throw.n_tokens"]) == len(GOLDEN["input_ids"]) + 2
    assert GOLDEN["prompt"] + hpp_check["throw.after_text"] == GOLDEN["greedy_output_text"]


def test_errors_carry_status(hpp_check):
    assert hpp_check["missing.status"] == "FASTLLM_ERR_IO"
    what = hpp_check["missing.what"]
    assert what.startswith("FASTLLM_ERR_IO: ") and hpp_check["_missing"] in what
    assert hpp_check["badtoken.status"] == "FASTLLM_ERR_TOKEN_OUT_OF_RANGE"
    assert hpp_check["empty.status"] == "FASTLLM_ERR_INVALID_ARGUMENT"


def test_eval_truncate_chat(hpp_check):
    assert hpp_check["eval.n_logits"] == hpp_check["eval.vocab"]
    assert hpp_check["truncate.n_tokens"] == "1"
    assert hpp_check["session.n_ctx"] == "256"
    assert int(hpp_check["chat.text_len"]) == len("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")


def test_moved_handles(hpp_check):
    assert hpp_check["moved.model_empty"] == "1"
    assert hpp_check["moved.session_empty"] == "1"
    assert GOLDEN["prompt"] + hpp_check["moved.text"] == GOLDEN["greedy_output_text"]
    assert hpp_check["moved.assign_ok"] == "1"


def npc_tools():
    """The demo's kTools, read from its source."""
    src = (NPC_DIR / "npc_dialogue.cpp").read_text()
    return json.loads(src.split('kTools = R"(', 1)[1].split(')";', 1)[0])


def test_npc_demo_forks_acts_through_tools_and_restores_a_saved_npc(npc_exe, stories_flm):
    import jsonschema
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in npc_tools()}
    r = run(npc_exe, stories_flm, 6, 12)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    spoken = [l for l in lines if not l.startswith("[")]
    names = ["Guard", "Merchant", "Smith"] * 2
    assert [l.split(":")[0] for l in spoken] == [x for n in names for x in (n, n + " does")], r.stdout
    for l in spoken[1::2]:  # every action is a call to one of the tools, its arguments valid
        name, args = l.split(" does: ", 1)[1].split(" ", 1)
        jsonschema.validate(json.loads(args), schemas[name])
    saved = [i for i, l in enumerate(lines) if l.startswith("[saved Merchant")]
    restored = [i for i, l in enumerate(lines) if l.startswith("[restored Merchant")]
    assert len(saved) == len(restored) == 1 and saved[0] < restored[0], r.stdout
    m = re.match(r"\[6 turns, 3 NPCs sharing one model and a (\d+)-token world \((\d+) KiB", lines[-1])
    assert m and int(m.group(1)) > 50 and int(m.group(2)) > 0, lines[-1]
    # the same game without the save: the same lines, so the restored Merchant went on exactly
    plain = run(npc_exe, stories_flm, 6, 12, "--no-save")
    assert [l for l in plain.stdout.splitlines() if not l.startswith("[")] == spoken


def test_npc_demo_reports_a_missing_model(npc_exe, tmp_path):
    missing = tmp_path / "missing.flm"
    r = run(npc_exe, missing)
    assert r.returncode != 0
    assert "FASTLLM_ERR_IO" in r.stderr and str(missing) in r.stderr
    r = run(npc_exe)
    assert r.returncode != 0 and "usage" in r.stderr


def test_sessions_for_npcs(hpp_check):
    assert int(hpp_check["fork.n_tokens"]) == len(GOLDEN["input_ids"])
    assert hpp_check["fork.shared"] == "1"
    assert hpp_check["state.same_text"] == "1"
    assert hpp_check["state.truncated"] == "FASTLLM_ERR_BAD_FORMAT"
    assert hpp_check["cancel.idle"] == "0"
    assert hpp_check["fork.types"] == "FASTLLM_ERR_INVALID_ARGUMENT"
