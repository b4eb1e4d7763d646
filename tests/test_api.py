"""Behaviour of the C API through the Python binding: sessions, streaming, sampling, stop
conditions, ISA levels. stories260K is the model (fast and real)."""
import json
import os
import platform
import subprocess
import sys
import threading

import numpy as np
import pytest

import fastllm
from conftest import REPO, STORIES

GOLDEN = json.loads((STORIES / "golden_greedy.json").read_text())
PROMPT = GOLDEN["prompt"]


def test_version_and_isa():
    import re
    header = (REPO / "include" / "fastllm.h").read_text()  # the one place the version is written
    parts = [re.search(rf"#define FASTLLM_VERSION_{p} (\d+)", header).group(1) for p in ("MAJOR", "MINOR", "PATCH")]
    assert fastllm.__version__ == ".".join(parts)
    assert fastllm.isa() in ("scalar", "avx2", "avxvnni", "avx512", "amx")


def test_model_info(stories_model):
    info = stories_model.info
    assert (info["architecture"], info["vocab_size"], info["context_length"]) == ("llama", 512, 512)
    assert (info["num_layers"], info["num_heads"], info["num_kv_heads"], info["head_dim"]) == (5, 8, 4, 8)
    assert info["n_params"] == 260032 and info["weight_dtype"] == "f32"


def test_continuing_a_session_equals_one_shot(stories_model):
    with stories_model.session() as s:
        s.generate(PROMPT, 12, temperature=0.0)
        s.generate("", 12, temperature=0.0)  # an empty prompt continues where it stopped
        two_steps = s.tokens
    with stories_model.session() as s:
        s.generate(PROMPT, 24, temperature=0.0)
        assert s.tokens == two_steps


def test_stream_equals_plain(stories_model):
    pieces = list(stories_model.generate(PROMPT, 30, temperature=0.0, stream=True))
    assert len(pieces) > 5
    assert "".join(pieces) == stories_model.generate(PROMPT, 30, temperature=0.0)


def test_stream_can_stop_early(stories_model):
    with stories_model.session() as s:
        it = s.generate(PROMPT, 100, temperature=0.0, stream=True)
        got = [next(it) for _ in range(3)]
        it.close()
        assert len(got) == 3
        assert s.last_result.stop_reason == "callback"
        assert s.last_result.n_generated_tokens < 10


def test_an_interrupt_in_a_chat_stream_stops_the_generation(stories_model, monkeypatch):
    """A KeyboardInterrupt raised in the stream's own frame (the Ctrl-C of `fastllm chat`) stops
    the generation at once, even while the caught exception's traceback keeps that frame alive
    (before, the worker generated on, and the session freed under it crashed the process)."""
    monkeypatch.setattr(stories_model, "apply_chat_template", lambda messages, add_generation_prompt: "Once")
    for make in (lambda s: s.chat("Hi", 100000, stream=True, temperature=1.0, ignore_eos=True),
                 lambda s: stories_model.generate(PROMPT, 100000, stream=True, temperature=1.0, ignore_eos=True)):
        with stories_model.session() as s:
            threads = threading.active_count()
            it = make(s)
            next(it)
            assert threading.active_count() == threads + 1  # the worker running the C call
            try:
                it.throw(KeyboardInterrupt)
            except KeyboardInterrupt as e:
                kept = e  # noqa: F841 -- the traceback holds the interrupted frames, as an except block does
                assert threading.active_count() == threads  # the worker was stopped and joined


def test_closing_a_session_stops_its_streams(stories_model):
    """A stream left suspended when its session closes: its worker is stopped before the session is
    freed, and the iterator ends."""
    s = stories_model.session()
    threads = threading.active_count()
    it = s.generate(PROMPT, 100000, stream=True, temperature=1.0, ignore_eos=True)
    next(it)
    s.close()
    assert threading.active_count() == threads
    assert list(it) == [] and s.last_result.stop_reason == "callback"


def test_seed_reproducibility(stories_model):
    a = stories_model.generate(PROMPT, 40, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=7)
    b = stories_model.generate(PROMPT, 40, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=7)
    c = stories_model.generate(PROMPT, 40, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=8)
    assert a == b
    assert a != c


def test_stop_string(stories_model):
    with stories_model.session() as s:
        text = s.generate(PROMPT, 40, temperature=0.0, stop=["Lily", "never appears"])
        assert text == ", there was a little girl named "
        assert s.last_result.stop_reason == "stop_string"


def test_max_tokens_and_result(stories_model):
    with stories_model.session() as s:
        s.generate(PROMPT, 7, temperature=0.0)
        r = s.last_result
        assert (r.n_prompt_tokens, r.n_generated_tokens, r.stop_reason) == (5, 7, "max_tokens")
        assert s.n_tokens == 12


def test_context_full_stops_generation(stories_model):
    with stories_model.session(n_ctx=10) as s:
        s.generate(PROMPT, 50, temperature=0.0)
        assert s.last_result.stop_reason == "context_full"
        assert s.n_tokens == 10


def test_eos_stops_generation(tmp_path):
    """A random model whose config names, as EOS, the token greedy decoding emits 5th: generation
    stops right there; with ignore_eos it goes on."""
    from conftest import convert
    from hf_models import edit_config, make_llama
    hf = make_llama(tmp_path / "hf")
    prompt = [1, 50, 60, 70]
    with fastllm.Model(convert(hf, tmp_path / "a.flm")) as m, m.session() as s:
        s.generate(prompt, 10, temperature=0.0, ignore_eos=True)
        greedy = s.tokens[len(prompt):]
    eos = greedy[4]
    edit_config(hf, eos_token_id=[2, eos])
    with fastllm.Model(convert(hf, tmp_path / "b.flm")) as m, m.session() as s:
        s.generate(prompt, 10, temperature=0.0)
        assert s.last_result.stop_reason == "eos"
        assert s.tokens[len(prompt):] == greedy[:greedy.index(eos) + 1]
        s.reset()
        s.generate(prompt, 10, temperature=0.0, ignore_eos=True)
        assert s.last_result.stop_reason == "max_tokens" and s.tokens[len(prompt):] == greedy


def test_eval_modes_and_reset(stories_model):
    ids = GOLDEN["input_ids"]
    with stories_model.session(n_ctx=64) as s:
        all_logits = s.eval(ids, logits="all")
        assert all_logits.shape == (len(ids), 512)
        s.reset()
        assert s.n_tokens == 0
        assert s.eval(ids[:2], logits=None) is None
        last = s.eval(ids[2:], logits="last")
    np.testing.assert_allclose(last, all_logits[-1], rtol=0, atol=1e-5)


def test_prompt_split_into_batches(stories_model):
    ids = stories_model.tokenize((STORIES / "text" / "tinystories_sample.txt").read_text()[:300])
    whole = stories_model.forward(ids)
    with stories_model.session(n_batch=7, kv_type="f32") as s:
        np.testing.assert_allclose(s.eval(ids, logits="all"), whole, rtol=0, atol=1e-4)


def test_sessions_are_independent(stories_model):
    with stories_model.session() as a, stories_model.session() as b:
        a.generate(PROMPT, 5, temperature=0.0)
        b.generate("Tom had a dog", 5, temperature=0.0)
        a.generate("", 5, temperature=0.0)
        b.generate("", 5, temperature=0.0)
        ta, tb = a.tokens, b.tokens
    with stories_model.session() as s:
        s.generate(PROMPT, 10, temperature=0.0)
        assert s.tokens == ta
    with stories_model.session() as s:
        s.generate("Tom had a dog", 10, temperature=0.0)
        assert s.tokens == tb


def test_threads_and_no_mmap_give_the_same_logits(stories_flm, stories_model):
    ids = GOLDEN["input_ids"]
    ref = stories_model.forward(ids)
    with fastllm.Model(stories_flm, threads=1, use_mmap=False) as m:
        np.testing.assert_allclose(m.forward(ids), ref, rtol=0, atol=1e-5)


def test_close_twice_and_use_after_close(stories_flm):
    m = fastllm.Model(stories_flm)
    s = m.session()
    m.close()
    m.close()
    s.close()
    with pytest.raises(fastllm.FastLLMError):
        m.tokenize("x")
    with pytest.raises(fastllm.FastLLMError):
        s.eval([1])


# Each architecture's kernel levels, lowest first (kernels.cpp); elsewhere only scalar.
ISA_LEVELS = {"x86_64": ["scalar", "avx2", "avxvnni", "avx512", "amx"], "AMD64": ["scalar", "avx2", "avxvnni", "avx512", "amx"],
              "aarch64": ["scalar", "neon", "neon_dotprod"], "arm64": ["scalar", "neon", "neon_dotprod"]}


@pytest.mark.parametrize("isa", ["scalar", "avx2", "avxvnni", "avx512", "amx", "neon", "neon_dotprod"])
def test_every_isa_level_generates_the_golden_text(stories_flm, isa):
    """FASTLLM_ISA forces a lower level; levels the CPU lacks fall back to the best it has below,
    and a level of another architecture is ignored."""
    code = ("import fastllm, sys; m = fastllm.Model(sys.argv[1], threads=2); "
            "print(fastllm.isa()); print(m.generate(sys.argv[2], 40, temperature=0.0))")
    env = dict(os.environ, FASTLLM_ISA=isa, PYTHONPATH=str(REPO / "bindings" / "python"))
    r = subprocess.run([sys.executable, "-c", code, str(stories_flm), PROMPT], capture_output=True, text=True,
                       env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    used, text = r.stdout.split("\n", 1)
    order = ISA_LEVELS.get(platform.machine(), ["scalar"])
    assert used in order
    if isa in order:
        assert order.index(used) <= order.index(isa)
    assert PROMPT + text.rstrip("\n") == GOLDEN["greedy_output_text"]


# Every struct the Python package mirrors, against the header compiled by the C compiler.
STRUCTS = {"ModelParams": "fastllm_model_params", "ModelInfo": "fastllm_model_info", "DeviceInfo": "fastllm_device_info",
           "SessionParams": "fastllm_session_params", "SessionMemoryInfo": "fastllm_session_memory_info",
           "SpeculativeParams": "fastllm_speculative_params", "GenerationResult": "fastllm_generation_result",
           "ChatMessage": "fastllm_chat_message", "ChatParams": "fastllm_chat_params", "StepParams": "fastllm_step_params"}


def test_python_structs_match_the_header(tmp_path):
    import ctypes
    from fastllm import _lib as raw
    lines = ["#include <stddef.h>", "#include <stdio.h>", '#include "fastllm.h"', "int main(void) {"]
    want = []
    for py, c in STRUCTS.items():
        cls = getattr(raw, py)
        lines.append(f'    printf("%zu\\n", sizeof({c}));')
        want.append(ctypes.sizeof(cls))
        for f, _ in cls._fields_:
            lines.append(f'    printf("%zu\\n", offsetof({c}, {f}));')
            want.append(getattr(cls, f).offset)
    (tmp_path / "layout.c").write_text("\n".join(lines) + "\n}\n")
    exe = tmp_path / "layout"
    subprocess.run(["cc", "-I", str(REPO / "include"), str(tmp_path / "layout.c"), "-o", str(exe)], check=True)
    got = [int(x) for x in subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout.split()]
    assert got == want
