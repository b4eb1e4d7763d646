"""Step-wise generation of several sessions together (continuous batching): each session gets
exactly what it would get alone, while sessions join and leave between steps."""
import ctypes

import pytest

import fastllm
from fastllm import _lib as raw

lib = raw.lib
PROMPTS = ["Once upon a time", "Tom had a big dog", "The sun was", "Lily and Ben went to the park", "One day"]


def greedy(n):
    p = lib.fastllm_sampling_default_params()
    p.temperature = 0.0
    p.max_new_tokens = n
    return p


def alone(model, prompt, n):
    with model.session() as s:
        s.generate(prompt, n, temperature=0.0)
        return s.tokens


def test_sessions_stepping_together_match_alone(stories_model):
    n_new = [20, 5, 30, 12, 25]
    sessions = [stories_model.session() for _ in PROMPTS]
    texts = [[] for _ in PROMPTS]
    callbacks = []
    for i, (s, prompt) in enumerate(zip(sessions, PROMPTS)):
        ids, n = fastllm.model._ids_array(stories_model.tokenize(prompt))
        cb = raw.StreamCallback(lambda t, l, _u, i=i: texts[i].append(ctypes.string_at(t, l)) or 0)
        callbacks.append(cb)
        if i < 3:  # the last two join later
            assert lib.fastllm_session_begin_generation(s.handle, ids, n, ctypes.byref(greedy(n_new[i])), cb, None) == 0
    active = [0, 1, 2]
    joined, steps = False, 0
    while active:
        handles = (ctypes.c_void_p * len(active))(*[sessions[i].handle.value for i in active])
        done = (ctypes.c_int32 * len(active))()
        assert lib.fastllm_generate_step(handles, len(active), done) == 0, lib.fastllm_last_error()
        active = [i for i, d in zip(active, done) if not d]
        steps += 1
        if steps == 3 and not joined:
            for i in (3, 4):
                ids, n = fastllm.model._ids_array(stories_model.tokenize(PROMPTS[i]))
                assert lib.fastllm_session_begin_generation(sessions[i].handle, ids, n,
                                                            ctypes.byref(greedy(n_new[i])), callbacks[i], None) == 0
                active.append(i)
            joined = True
    for i, s in enumerate(sessions):
        assert s.tokens == alone(stories_model, PROMPTS[i], n_new[i]), PROMPTS[i]
        assert lib.fastllm_session_is_generating(s.handle) == 0
        r = raw.GenerationResult()
        lib.fastllm_session_generation_result(s.handle, ctypes.byref(r))
        assert r.n_generated_tokens == n_new[i] and raw.STOP_REASONS[r.stop_reason] == "max_tokens"
        assert b"".join(texts[i]).decode() == stories_model.generate(PROMPTS[i], n_new[i], temperature=0.0)
        s.close()


def test_step_rejects_bad_batches(stories_model):
    a, b = stories_model.session(), stories_model.session()
    done = (ctypes.c_int32 * 2)()
    both = (ctypes.c_void_p * 2)(a.handle.value, b.handle.value)
    assert lib.fastllm_generate_step(both, 2, done) == raw.ERR_INVALID_ARGUMENT  # nothing begun
    assert b"no generation in progress" in lib.fastllm_last_error()
    ids, n = fastllm.model._ids_array([1, 403])
    assert lib.fastllm_session_begin_generation(a.handle, ids, n, ctypes.byref(greedy(5)), raw.StreamCallback(), None) == 0
    twice = (ctypes.c_void_p * 2)(a.handle.value, a.handle.value)
    assert lib.fastllm_generate_step(twice, 2, done) == raw.ERR_INVALID_ARGUMENT
    assert lib.fastllm_session_cancel_generation(a.handle) == 0
    r = raw.GenerationResult()
    lib.fastllm_session_generation_result(a.handle, ctypes.byref(r))
    assert raw.STOP_REASONS[r.stop_reason] == "cancelled" and lib.fastllm_session_is_generating(a.handle) == 0
    a.close()
    b.close()


def test_sessions_of_two_models_cannot_share_a_step(stories_flm, stories_model):
    with fastllm.Model(stories_flm) as other:
        a, b = stories_model.session(), other.session()
        ids, n = fastllm.model._ids_array([1, 403])
        for s in (a, b):
            lib.fastllm_session_begin_generation(s.handle, ids, n, ctypes.byref(greedy(5)), raw.StreamCallback(), None)
        done = (ctypes.c_int32 * 2)()
        pair = (ctypes.c_void_p * 2)(a.handle.value, b.handle.value)
        assert lib.fastllm_generate_step(pair, 2, done) == raw.ERR_INVALID_ARGUMENT
        assert b"another model" in lib.fastllm_last_error()
        a.close()
        b.close()
