"""Threads, cycles and exhaustion (docs/reliability.md): the C programs tests/cpp/test_threads.cpp
and test_cycles.cpp on stories260K, and session creation beyond a process's address-space limit.
scripts/test_sanitizers.sh runs this file against the ASan build (leaks checked in the cycles) and
test_threads under ThreadSanitizer."""
import os
import re
import subprocess
import sys
import textwrap

import pytest

from conftest import BUILD, REPO, convert, run_binary
from hf_models import make_llama

ASAN = "asan" in BUILD.name  # RSS and address-space figures mean nothing under ASan's shadow memory


def test_eight_sessions_and_the_shared_model_on_many_threads(stories_flm):
    r = run_binary("test_threads", stories_flm, 3)
    assert r.returncode == 0, r.stdout + r.stderr
    m = re.search(r"(\d+) threads, 3 rounds: 0 differ; log messages (\d+) alone, (\d+) together", r.stdout)
    assert m and m.group(1) == "12" and int(m.group(2)) > 0, r.stdout


def test_load_and_session_cycles_do_not_grow(stories_flm):
    n_loads, n_sessions = 1000, 10000  # ~1 s in the release build, ~10 s under ASan
    env = dict(os.environ, ASAN_OPTIONS="halt_on_error=1:detect_leaks=1")
    env.pop("LD_PRELOAD", None)  # the program links its sanitizer runtime itself
    r = subprocess.run([str(BUILD / "test_cycles"), str(stories_flm), str(n_loads), str(n_sessions)],
                       capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 0, r.stdout + r.stderr  # LeakSanitizer fails the run on a leak
    figures = [tuple(map(int, m)) for m in re.findall(r"rss_kib after \d+ (\d+), at the end (\d+)", r.stdout)]
    assert len(figures) == 2, r.stdout
    print(r.stdout)
    if not ASAN:
        for warm, end in figures:
            assert end - warm < 2048, r.stdout  # KiB: flat after the first tenth


@pytest.fixture(scope="module")
def long_context_flm(tmp_path_factory):
    """A small model whose full context (2^20 positions) needs 8 GiB of KV cache."""
    tmp = tmp_path_factory.mktemp("long")
    folder = make_llama(tmp, tokenizer=True, hidden_size=256, intermediate_size=64, num_hidden_layers=4,
                        num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=1 << 20)
    return convert(folder, tmp / "long.flm")


@pytest.mark.skipif(ASAN, reason="ASan reserves terabytes of address space: no RLIMIT_AS can hold under it")
def test_session_beyond_the_address_space_limit_is_out_of_memory(long_context_flm):
    """In a child limited to 1 GiB more than it uses: a full-context session is created (its KV
    cache grows as used), but evaluating 300k tokens (2.3 GiB of f32 KV cache) fails with
    FASTLLM_ERR_OUT_OF_MEMORY before computing anything, the session stays empty and usable, the
    process goes on, and a small session still works."""
    code = textwrap.dedent(f"""
        import resource, sys
        sys.path[:0] = [{str(REPO / 'bindings' / 'python')!r}]
        import fastllm
        from fastllm import _lib as raw
        m = fastllm.Model({str(long_context_flm)!r}, threads=1)
        vm = int(open("/proc/self/statm").read().split()[0]) * resource.getpagesize()
        resource.setrlimit(resource.RLIMIT_AS, (vm + (1 << 30), resource.RLIM_INFINITY))
        big = m.session(n_ctx=1 << 20, kv_type="f32")
        try:
            big.eval([1] * 300000, logits=None)
            print("evaluated")
        except fastllm.FastLLMError as e:
            print("status", e.status == raw.ERR_OUT_OF_MEMORY, str(e))
        print("empty", big.n_tokens == 0, big.memory()["kv_bytes"] == 0)
        big.eval([1, 2], logits=None)
        s = m.session(n_ctx=64)
        print("small", len(s.generate("Hello", max_new_tokens=4, temperature=0)) >= 0)
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "status True" in r.stdout and "MiB" in r.stdout and "small True" in r.stdout, r.stdout
    assert "empty True True" in r.stdout, r.stdout
