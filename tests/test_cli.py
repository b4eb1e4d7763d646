"""The command lines: converter errors and `python -m fastllm`."""
import json
import os
import select
import signal
import subprocess
import sys
import time

import pytest

from conftest import REPO, STORIES

GOLDEN = json.loads((STORIES / "golden_greedy.json").read_text())
ENV = dict(os.environ, PYTHONPATH=str(REPO / "bindings" / "python"))


def run(*args):
    return subprocess.run([sys.executable, *map(str, args)], capture_output=True, text=True, env=ENV, timeout=300)


def test_generate_command(stories_flm):
    r = run("-m", "fastllm", "generate", stories_flm, GOLDEN["prompt"], "--max-new-tokens", "40", "--temperature", "0")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == GOLDEN["greedy_output_text"]


def test_bench_generates_after_the_prompt_or_from_an_empty_context(stories_flm):
    from fastllm.bench import bench
    after, empty = (bench(stories_flm, 16, 8, 1, 1, gen_from_empty=e) for e in (False, True))
    assert after.final_context == 16 + 8 and empty.final_context == 1 + 8  # llama-bench's tg: no prompt
    assert min(after.prompt_tok_s, after.generate_tok_s, empty.generate_tok_s) > 0


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


CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
          "'<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")


@pytest.fixture(scope="module")
def chat_flm(tmp_path_factory):
    """A random model with a ChatML template and a long context: replies run until stopped."""
    from conftest import convert
    from hf_models import make_llama
    d = make_llama(tmp_path_factory.mktemp("chat") / "hf", hidden_size=256, intermediate_size=512,
                   num_hidden_layers=4, max_position_embeddings=16384)
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    cfg["chat_template"] = CHATML
    (d / "tokenizer_config.json").write_text(json.dumps(cfg))
    return convert(d, d.parent / "chat.flm")


def test_chat_command_turns_and_reset(chat_flm):
    r = subprocess.run([sys.executable, "-m", "fastllm", "chat", str(chat_flm), "--max-new-tokens", "8",
                        "--temperature", "0"], input="Hello\n/reset\nTell me a story\n/quit\n", capture_output=True,
                       text=True, env=ENV, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "(conversation cleared)" in r.stderr
    assert r.stdout.count("> ") >= 3


def _read_for(pipe, n, seconds):
    """Up to n bytes from the pipe, or what came within the time: never blocks past it."""
    fd, got, deadline = pipe.fileno(), b"", time.monotonic() + seconds
    while len(got) < n:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            break
        chunk = os.read(fd, n - len(got))
        if not chunk:
            break
        got += chunk
    return got


def test_chat_command_ctrl_c_stops_the_reply_not_the_program(chat_flm):
    # Which tokens a seed samples depends on the ISA's rounding, and the random model may sample its
    # end-of-sequence early: then the reply ends before Ctrl-C, which lands on the prompt and ends
    # the program (still with 0). So the read is bounded, and another seed is tried; one of three
    # replies must be the one Ctrl-C stops.
    stopped = []
    for seed in range(3):
        p = subprocess.Popen([sys.executable, "-m", "fastllm", "chat", str(chat_flm), "--max-new-tokens", "100000",
                              "--temperature", "1", "--threads", "1", "--seed", str(seed)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV,
                             errors="replace",  # the bounded read may end inside a character
                             # a suite started in the background (nohup, `&`) ignores SIGINT, and the
                             # child would inherit that: give it the default, as a terminal does
                             preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        try:
            p.stdin.write("Tell me a long story\n")
            p.stdin.flush()
            _read_for(p.stdout, 40, 60)  # the reply is streaming
            p.send_signal(signal.SIGINT)
            out, err = p.communicate("/quit\n", timeout=60)
        finally:
            p.kill()
        assert p.returncode == 0, err
        if "[stopped]" in out:
            stopped.append(seed)
            break
    assert stopped
