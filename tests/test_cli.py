"""The command lines: converter errors and `python -m fastllm`."""
import json
import os
import subprocess
import sys

from conftest import REPO, STORIES

GOLDEN = json.loads((STORIES / "golden_greedy.json").read_text())
ENV = dict(os.environ, PYTHONPATH=str(REPO / "bindings" / "python"))


def run(*args):
    return subprocess.run([sys.executable, *map(str, args)], capture_output=True, text=True, env=ENV, timeout=300)


def test_generate_command(stories_flm):
    r = run("-m", "fastllm", "generate", stories_flm, GOLDEN["prompt"], "--max-new-tokens", "40", "--temperature", "0")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == GOLDEN["greedy_output_text"]


def test_info_command(stories_flm):
    r = run("-m", "fastllm", "info", stories_flm)
    assert r.returncode == 0 and "vocab_size: 512" in r.stdout and "num_kv_heads: 4" in r.stdout


def test_generate_command_bad_model(tmp_path):
    bad = tmp_path / "x.flm"
    bad.write_bytes(b"FASTLLM\0" + b"\1\0\0\0" + b"\0" * 6)
    r = run("-m", "fastllm", "generate", bad, "hi")
    assert r.returncode == 1 and "truncated" in r.stderr and "Traceback" not in r.stderr


def test_converter_cli_errors(tmp_path):
    out = tmp_path / "out.flm"
    r = run(REPO / "converter" / "convert.py", "--model_path", tmp_path / "missing", "--out_path", out)
    assert r.returncode == 1 and "does not exist" in r.stderr and "Traceback" not in r.stderr
    (tmp_path / "empty").mkdir()
    r = run(REPO / "converter" / "convert.py", "--model_path", tmp_path / "empty", "--out_path", out)
    assert r.returncode == 1 and "config.json" in r.stderr and "Traceback" not in r.stderr
    assert not out.exists()
