"""The KV cache's element types (f32, f16, q8), its memory (allocated as the context grows, the
memory query), the default context length, and the worker threads sessions share."""
import os

import pytest

import fastllm
from conftest import SHAKESPEARE_TXT, STORIES, rel_to_max
from fastllm.perplexity import perplexity

SAMPLE = (STORIES / "text" / "tinystories_sample.txt").read_text()
SHAKESPEARE = SHAKESPEARE_TXT.read_text()


@pytest.mark.parametrize("which", ["stories", "smollm"])
def test_f16_kv_logits_close_to_f32(which, stories_model, smollm):
    model = stories_model if which == "stories" else smollm
    ids = model.tokenize(SAMPLE[:1500] if which == "stories" else SHAKESPEARE[:1500])[:300]
    with model.session(kv_type="f32") as s32, model.session(kv_type="f16") as s16:
        ref, got = s32.eval(ids, logits="all"), s16.eval(ids, logits="all")
    err = rel_to_max(got, ref)
    assert err < 2e-3, err
    assert err > 0  # the f16 rows really were rounded


@pytest.mark.parametrize("which", ["stories", "smollm"])
def test_q8_kv_perplexity_within_half_a_percent(which, stories_model, smollm):
    if which == "stories":
        model, text, kw = stories_model, SAMPLE, dict(max_documents=40)
    else:  # 4 windows of 256 tokens of the shared Shakespeare text
        model, text, kw = smollm, SHAKESPEARE[:5000], dict(separator=None, n_ctx=256)
    base = perplexity(model, text, kv_type="f32", **kw)
    q8 = perplexity(model, text, kv_type="q8", **kw)
    f16 = perplexity(model, text, kv_type="f16", **kw)
    assert base.n_tokens == q8.n_tokens > 500
    assert q8.perplexity <= base.perplexity * 1.005, (base.perplexity, q8.perplexity)
    assert q8.perplexity != base.perplexity
    assert abs(f16.perplexity / base.perplexity - 1) < 1e-3, (base.perplexity, f16.perplexity)


def test_kv_types_mixed_and_generation(stories_model):
    """K and V of different types; greedy generation with q8 runs and stays plausible (most
    tokens equal to f32's on a short continuation)."""
    with stories_model.session(kv_type="f32") as a, stories_model.session(type_k="q8", type_v="f16") as b:
        ta = a.generate("Once upon a time", 40, temperature=0)
        tb = b.generate("Once upon a time", 40, temperature=0)
    assert ta[:20] == tb[:20]


def test_bad_kv_type(stories_model):
    with pytest.raises(ValueError):
        stories_model.session(kv_type="q4")
    from fastllm import _lib as raw
    import ctypes
    p = raw.lib.fastllm_session_default_params()
    p.type_k = 7
    h = ctypes.c_void_p()
    assert raw.lib.fastllm_session_create(stories_model.handle, ctypes.byref(p), ctypes.byref(h)) == raw.ERR_INVALID_ARGUMENT
    assert b"KV cache type 7" in raw.lib.fastllm_last_error()
    assert not h.value


def test_default_context_and_memory_grow_with_tokens(smollm, stories_model):
    with smollm.session() as s:
        assert s.n_ctx == 4096  # not SmolLM2's 8192
        m0 = s.memory()
        assert m0["kv_bytes"] == 0
        # SmolLM2: 30 layers x 3 KV heads x 64 x 2 (K and V) x 2 bytes
        assert m0["kv_bytes_per_token"] == 30 * 192 * 2 * 2
        assert m0["kv_capacity_bytes"] == 4096 * m0["kv_bytes_per_token"]
        s.eval(smollm.tokenize(SHAKESPEARE[:2000])[:100], logits=None)
        m1 = s.memory()
        assert m1["kv_bytes"] == 128 * m0["kv_bytes_per_token"]  # 100 tokens: 4 blocks of 32
        assert m1["session_bytes"] < 2 << 20 and m1["compute_bytes"] > 0
        s.truncate(10)
        assert s.memory()["kv_bytes"] == 32 * m0["kv_bytes_per_token"]
        s.reset()
        assert s.memory()["kv_bytes"] == 0
    assert stories_model.session().n_ctx == stories_model.context_length  # shorter than 4096
    with smollm.session(kv_type="q8") as q, smollm.session(kv_type="f32") as f:
        assert q.memory()["kv_bytes_per_token"] == 30 * 2 * (192 // 32) * 36
        assert f.memory()["kv_bytes_per_token"] == 30 * 192 * 2 * 4


def threads_now():
    return len(os.listdir("/proc/self/task"))


def test_sessions_share_the_models_threads(stories_flm):
    with fastllm.Model(stories_flm, threads=2) as model:
        before = threads_now()
        sessions = [model.session() for _ in range(64)]
        for s in sessions[:4]:
            s.eval([1, 2, 3], logits=None)
        grown = threads_now() - before
        assert grown <= 1, f"64 sessions started {grown} threads"  # the model's one worker
        assert len({s.memory()["compute_bytes"] for s in sessions}) == 1
        three = model.session(threads=3)  # another thread count: another pool, shared again
        more = [model.session(threads=3) for _ in range(8)]
        assert threads_now() - before <= 1 + 2
        for s in sessions + [three] + more:
            s.close()
