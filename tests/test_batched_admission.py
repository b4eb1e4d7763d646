"""Batched prompt admission (fastllm_session_begin_generation_deferred + fastllm_generate_step_ex):
prompts evaluated in chunks inside the steps that decode other sessions give every session exactly
what it gets alone, the step's prompt budget is shared in the order listed, and a queued prompt can
be cancelled, is refused by eval / save_state, and works with sliding windows and speculation."""
import ctypes

import pytest

import fastllm
from fastllm import _lib as raw
from test_sliding_window import gemma3  # noqa: F401 (a fixture)

lib = raw.lib
TEXT = ("Once upon a time, there was a little girl named Lily. She loved to play outside in the sun. One day, "
        "she saw a big red ball in the park. She ran to get it, but a dog took it first. Lily was sad, so her mom "
        "gave her a hug and they went home to eat some cake.")


def greedy(n):
    p = lib.fastllm_sampling_default_params()
    p.temperature = 0.0
    p.max_new_tokens = n
    return p


def budget(n):
    p = lib.fastllm_step_default_params()
    p.max_prompt_tokens = n
    return p


def alone(model, ids, n, **options):
    with model.session(**options) as s:
        s.generate(ids, n, temperature=0.0)
        return s.tokens


class Job:
    def __init__(self, model, ids, n_new, join=0, deferred=True, **options):
        self.s = model.session(**options)
        self.ids, self.n_new, self.join, self.deferred = ids, n_new, join, deferred
        self.text = []
        self.cb = raw.StreamCallback(lambda t, l, _u: self.text.append(ctypes.string_at(t, l)) or 0)
        self.trace = []  # (n_cached, n_generated) after each step

    def begin(self):
        ids, n = fastllm.model._ids_array(self.ids)
        f = lib.fastllm_session_begin_generation_deferred if self.deferred else lib.fastllm_session_begin_generation
        assert f(self.s.handle, ids, n, ctypes.byref(greedy(self.n_new)), self.cb, None) == 0, lib.fastllm_last_error()

    def result(self):
        r = raw.GenerationResult()
        assert lib.fastllm_session_generation_result(self.s.handle, ctypes.byref(r)) == 0
        return r


def run(jobs, max_prompt_tokens):
    """Steps the jobs together, each joining at its step; returns the number of steps."""
    active, steps = [], 0
    while active or any(j.join >= steps for j in jobs):
        for j in jobs:
            if j.join == steps:
                j.begin()
                active.append(j)
        if active:
            handles = (ctypes.c_void_p * len(active))(*[j.s.handle.value for j in active])
            done = (ctypes.c_int32 * len(active))()
            rc = lib.fastllm_generate_step_ex(handles, len(active), ctypes.byref(budget(max_prompt_tokens)), done)
            assert rc == 0, lib.fastllm_last_error()
            for j in active:
                j.trace.append((j.s.n_cached, j.result().n_generated_tokens))
            active = [j for j, d in zip(active, done) if not d]
        steps += 1
    return steps


@pytest.mark.parametrize("max_prompt_tokens", [1, 7, 256])
def test_prompts_admitted_in_steps_match_alone(stories_model, max_prompt_tokens):
    long = stories_model.tokenize(TEXT)
    assert len(long) > 60
    jobs = [Job(stories_model, stories_model.tokenize("Tom had a big dog"), 30, deferred=False),
            Job(stories_model, long, 12, join=2),
            Job(stories_model, stories_model.tokenize("The sun was"), 20, join=2),
            Job(stories_model, long[:40], 8, join=5),
            Job(stories_model, [1], 10, join=6)]  # a one-token prompt
    run(jobs, max_prompt_tokens)
    for j in jobs:
        assert j.s.tokens == alone(stories_model, j.ids, j.n_new), j.ids[:5]
        r = j.result()
        assert r.n_generated_tokens == j.n_new and raw.STOP_REASONS[r.stop_reason] == "max_tokens"
        assert r.prompt_ms > 0 and lib.fastllm_session_is_generating(j.s.handle) == 0
        assert b"".join(j.text).decode() == stories_model.generate(j.ids, j.n_new, temperature=0.0)
        j.s.close()


def test_the_budget_is_shared_in_the_order_listed_and_decoding_goes_on(stories_model):
    long = stories_model.tokenize(TEXT)
    runner = Job(stories_model, stories_model.tokenize("One day"), 40, deferred=False)
    a, b = Job(stories_model, long, 3, join=1), Job(stories_model, long[:20], 3, join=1)
    run([runner, a, b], 16)
    n = len(long)
    # a takes the whole budget of each step until its prompt is in; b waits, then gets the rest
    steps_a = -(-n // 16)
    assert [c for c, _ in a.trace[:steps_a]] == [min(16 * (k + 1), n) for k in range(steps_a)]
    assert all(g == 0 for _, g in a.trace[:steps_a]) and a.trace[steps_a][1] == 1  # first token: the next step
    assert b.trace[0] == (0, 0) and b.trace[steps_a - 2][0] == 0
    assert b.trace[steps_a - 1][0] == min(20, 16 - n % 16 if n % 16 else 0)
    # the running generation got one token every step meanwhile
    assert [g for _, g in runner.trace[1:steps_a + 2]] == list(range(2, steps_a + 3))
    for j in (runner, a, b):
        assert j.s.tokens == alone(stories_model, j.ids, j.n_new)
        j.s.close()


def test_cancel_while_queued_keeps_the_evaluated_part(stories_model):
    long = stories_model.tokenize(TEXT)
    with stories_model.session() as s:
        s.eval(long[:5], logits=None)
        job = Job(stories_model, long[5:], 4)
        job.s.close()
        job.s = s
        job.begin()
        handle = (ctypes.c_void_p * 1)(s.handle.value)
        done = (ctypes.c_int32 * 1)()
        assert lib.fastllm_generate_step_ex(handle, 1, ctypes.byref(budget(10)), done) == 0 and not done[0]
        assert (s.n_tokens, s.n_cached) == (len(long), 15)  # queued tokens are in the context, not yet evaluated
        # queued: no evaluation, no saved state, no zero budget
        with pytest.raises(fastllm.FastLLMError, match="deferred prompt"):
            s.eval([5], logits=None)
        with pytest.raises(fastllm.FastLLMError, match="deferred prompt"):
            s.save_state()
        assert lib.fastllm_generate_step_ex(handle, 1, ctypes.byref(budget(0)), done) == raw.ERR_INVALID_ARGUMENT
        assert b"max_prompt_tokens" in lib.fastllm_last_error()
        assert lib.fastllm_session_cancel_generation(s.handle) == 0
        r = job.result()
        assert raw.STOP_REASONS[r.stop_reason] == "cancelled" and r.n_generated_tokens == 0
        assert s.tokens == long[:15] and s.n_cached == 15
        # the session goes on from there as one that evaluated those 15 tokens
        s.generate([], 6, temperature=0.0)
        assert s.tokens == alone(stories_model, long[:15], 6)


def test_cancel_from_another_thread_ends_it_at_the_next_step(stories_model):
    long = stories_model.tokenize(TEXT)
    job = Job(stories_model, long, 4)
    job.begin()
    assert lib.fastllm_session_cancel(job.s.handle) == 0  # what another thread would call
    handle = (ctypes.c_void_p * 1)(job.s.handle.value)
    done = (ctypes.c_int32 * 1)()
    assert lib.fastllm_generate_step_ex(handle, 1, None, done) == 0 and done[0] == 1
    assert raw.STOP_REASONS[job.result().stop_reason] == "cancelled"
    assert job.s.n_tokens == 0
    job.s.close()


def test_nothing_to_sample_ends_after_the_prompt(stories_model):
    job = Job(stories_model, stories_model.tokenize(TEXT)[:30], 0)
    steps = run([job], 8)
    assert steps == 4 and job.s.n_cached == 30  # 8 + 8 + 8 + 6, done with the last chunk
    assert raw.STOP_REASONS[job.result().stop_reason] == "max_tokens"
    job.s.close()


def test_a_full_context_is_refused_when_queued(stories_model):
    with stories_model.session(n_ctx=16) as s:
        ids, n = fastllm.model._ids_array(stories_model.tokenize(TEXT))
        assert lib.fastllm_session_begin_generation_deferred(s.handle, ids, n, ctypes.byref(greedy(4)),
                                                             raw.StreamCallback(), None) == raw.ERR_CONTEXT_FULL
        assert s.n_tokens == 0 and lib.fastllm_session_is_generating(s.handle) == 0


def test_sliding_window_layers_admitted_in_chunks(gemma3):  # noqa: F811
    m, ids, _ = gemma3
    opts = dict(n_ctx=512, kv_type="f32")
    jobs = [Job(m, ids[:50], 20, deferred=False, **opts), Job(m, ids[:250], 10, join=3, **opts),
            Job(m, ids[100:190], 10, join=4, **opts)]
    run(jobs, 13)  # chunks cross the 8-position windows and the 32-position blocks
    for j in jobs:
        assert j.s.tokens == alone(m, j.ids, j.n_new, **opts)
        j.s.close()


def test_speculative_sessions_admitted_in_steps(stories_model):
    long = stories_model.tokenize(TEXT)
    jobs = [Job(stories_model, long, 24, join=0), Job(stories_model, long[:30], 24, join=1)]
    for j in jobs:
        j.s.speculative()  # prompt lookup: the story repeats itself
    run(jobs, 32)
    for j in jobs:
        assert j.s.tokens == alone(stories_model, j.ids, j.n_new)
        assert j.s.speculative_stats()["drafted"] > 0
        j.s.close()


def test_prompt_chunks_leave_room_for_the_decode_rows_in_a_pass(stories_flm):
    """Passes of 64 rows (every session's n_batch): with 5 sessions decoding, a 64-token budget
    admits 59 prompt tokens, so that the step stays one pass; alone, the prompt gets all 64."""
    with fastllm.Model(stories_flm) as m:
        long = m.tokenize(TEXT * 3)
        runners = [Job(m, m.tokenize(p), 10, deferred=False, n_batch=64) for p in ("One day", "Tom", "The sun was",
                                                                                       "Lily", "Mom said")]
        new, alone_ = Job(m, long, 4, join=1, n_batch=64), Job(m, long, 4, n_batch=64)
        run(runners + [new], 64)
        run([alone_], 64)
        assert new.trace[0][0] == 59 and alone_.trace[0][0] == 64
        for j in runners + [new, alone_]:
            assert j.s.tokens == alone(m, j.ids, j.n_new)
            j.s.close()
