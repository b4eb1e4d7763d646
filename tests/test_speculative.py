"""Speculative decoding (fastllm_session_set_speculative): greedy output identical to decoding without
drafts, for a draft model and for prompt lookup, alone and stepping with other sessions, with stop
strings and grammars; sampled output with the same distribution (a two-sample chi-square test on
stories260K's 512-token vocabulary); bad options refused."""
import ctypes

import numpy as np
import pytest
from scipy.stats import chi2_contingency

import fastllm
from conftest import STORIES, convert
from fastllm import _lib as raw

lib = raw.lib
PROMPTS = ["Once upon a time", "Tom had a big dog", "The sun was", "Lily and Ben went to the park", "One day",
           "The little bird", "Sam saw a cat. Sam saw a cat. Sam saw a", "Mom said", "There was a tree",
           "The girl and the boy", "He ran and ran", "It was a sunny day"]


@pytest.fixture(scope="module")
def draft_model(tmp_path_factory):
    """stories260K at int8: the same vocabulary, slightly different numbers (most drafts kept)."""
    path = convert(STORIES / "hf", tmp_path_factory.mktemp("draft") / "stories-q8.flm", dtype="int8")
    with fastllm.Model(path, threads=2) as m:
        yield m


def run(model, prompt, n, draft=None, lookup=False, n_draft=5, **sampling):
    with model.session() as s:
        if draft is not None or lookup:
            s.speculative(draft, n_draft=n_draft)
        text = s.generate(prompt, n, **sampling)
        return s.tokens, text, s.speculative_stats(), s.last_result


@pytest.mark.parametrize("mode", ["draft", "lookup"])
def test_greedy_output_is_identical(stories_model, draft_model, mode):
    drafted = accepted = 0
    for prompt in PROMPTS:
        want, want_text, _, _ = run(stories_model, prompt, 48, temperature=0.0)
        got, text, stats, result = run(stories_model, prompt, 48, draft=draft_model if mode == "draft" else None,
                                       lookup=mode == "lookup", temperature=0.0)
        assert got == want and text == want_text, prompt
        assert result.n_generated_tokens == 48 or result.stop_reason != "max_tokens"
        drafted += stats["drafted"]
        accepted += stats["accepted"]
    assert 0 < accepted <= drafted
    if mode == "draft":  # the int8 copy nearly always agrees with the f32 model
        assert accepted / drafted > 0.8, (accepted, drafted)


def test_identical_with_stop_strings_max_tokens_and_grammar(stories_model, draft_model):
    for kw in (dict(stop=["Lily"]), dict(stop=[" the"]), dict(grammar='root ::= [a-zA-Z ,.]+ "."'),
               dict(grammar='root ::= " the" (" " [a-z]{1,8}){1,3} "."', grammar_triggers=[" the"])):
        for n in (1, 7, 40):
            want = run(stories_model, "Once upon a time", n, temperature=0.0, **kw)
            got = run(stories_model, "Once upon a time", n, draft=draft_model, temperature=0.0, **kw)
            assert got[:2] == want[:2], (kw, n)
            assert got[3].stop_reason == want[3].stop_reason and got[3].n_generated_tokens == want[3].n_generated_tokens


def greedy(n):
    p = lib.fastllm_sampling_default_params()
    p.temperature = 0.0
    p.max_new_tokens = n
    return p


def test_sessions_stepping_together_with_drafts_match_alone(stories_model, draft_model):
    """fastllm_generate_step over sessions with and without drafts (both kinds) in one pass."""
    n_new = [30, 12, 25, 40]
    prompts = PROMPTS[:4]
    sessions = [stories_model.session() for _ in prompts]
    sessions[0].speculative(draft_model)
    sessions[1].speculative(None, n_draft=3)
    sessions[3].speculative(draft_model, n_draft=16)
    for s, p, n in zip(sessions, prompts, n_new):
        toks = stories_model.tokenize(p)
        arr = (ctypes.c_int32 * len(toks))(*toks)
        params = greedy(n)
        assert lib.fastllm_session_begin_generation(s.handle, arr, len(toks), ctypes.byref(params), raw.StreamCallback(), None) == raw.OK
    handles = (ctypes.c_void_p * len(sessions))(*[s.handle for s in sessions])
    done = (ctypes.c_int32 * len(sessions))()
    for _ in range(100):
        live = [i for i in range(len(sessions)) if not done[i]]
        if not live:
            break
        hs = (ctypes.c_void_p * len(live))(*[handles[i] for i in live])
        d = (ctypes.c_int32 * len(live))()
        assert lib.fastllm_generate_step(hs, len(live), d) == raw.OK
        for j, i in enumerate(live):
            done[i] = d[j]
    for s, p, n in zip(sessions, prompts, n_new):
        assert s.tokens == run(stories_model, p, n, temperature=0.0)[0], p
    assert sessions[0].speculative_stats()["accepted"] > 0
    for s in sessions:
        s.close()


@pytest.fixture(scope="module")
def smollm_q4m(smollm_gguf, tmp_path_factory):
    """SmolLM2 at the GGUF's own q4m bits: its products give a token the same bits whatever tokens
    go with it, so a row's logits show its attention's bits."""
    path = convert(smollm_gguf, tmp_path_factory.mktemp("smollm-q4m") / "smollm2-q4m.flm", dtype="auto")
    with fastllm.Model(path, threads=2) as m:
        yield m


@pytest.fixture(scope="module")
def gemma3_windowed(tmp_path_factory):
    """A random Gemma 3 text model at int4 (its output head q8, which gives each token the same bits
    whatever tokens go with it, as the int4 products do): layers 0 and 2 see 16 positions, 1 and 3 all."""
    from hf_models import make_model
    tmp = tmp_path_factory.mktemp("gemma3-window")
    hf = make_model(tmp / "hf", "gemma3", seed=3, num_attention_heads=4, num_key_value_heads=1, num_hidden_layers=4,
                    sliding_window=16, sliding_window_pattern=2, max_position_embeddings=1024)
    with fastllm.Model(convert(hf, tmp / "m.flm", dtype="int4"), threads=2) as m:
        yield m


@pytest.fixture(scope="module")
def qwen2_group7(tmp_path_factory):
    """A random Qwen2 at int4 with 7 query heads a KV head: its decoding rows go in blocks."""
    from hf_models import make_model
    tmp = tmp_path_factory.mktemp("qwen2-group7")
    hf = make_model(tmp / "hf", "qwen2", seed=5, hidden_size=224, num_attention_heads=14, num_key_value_heads=2,
                    max_position_embeddings=1024)
    with fastllm.Model(convert(hf, tmp / "m.flm", dtype="int4"), threads=2) as m:
        yield m


@pytest.mark.parametrize("which", ["smollm2", "smollm2-q8-kv", "smollm2-f32", "gemma3-window", "qwen2-group7"])
def test_rows_together_give_each_row_its_logits_alone(smollm_q4m, smollm, gemma3_windowed, qwen2_group7, which):
    """A verification step's rows (up to 17: a token and 16 drafts) read the KV cache once for all
    of them (attend_direct) and each weight once (f32 weights: dot_rows_multi); every row's logits
    are bit for bit those it gets evaluated alone, as greedy output with drafts needs: at depths
    where a row's keys go in parts (SmolLM2's 3 KV heads, 512 keys or more), where one more key
    moves a part's bound (1024, 1536), with a sliding window (each row's first key its own), with a
    q8 cache, with plain f32 weights, and where a KV head's 7 query heads take the blocked path."""
    m = {"gemma3-window": gemma3_windowed, "smollm2-f32": smollm, "qwen2-group7": qwen2_group7}.get(which, smollm_q4m)
    kv = "q8" if which == "smollm2-q8-kv" else "f16"
    cases = {"gemma3-window": [(40, 9), (300, 17)], "qwen2-group7": [(100, 6), (600, 17)]}.get(
        which, [(100, 6), (700, 4), (1019, 6), (1533, 17)])
    rng = np.random.default_rng(7)
    for depth, k in cases:
        ids = [int(x) for x in rng.integers(3, min(m.info["vocab_size"], 30000), depth + k)]
        with m.session(n_ctx=depth + k + 8, n_batch=512, kv_type=kv) as s:
            s.eval(ids[:depth], logits=None)
            together = s.eval(ids[depth:], logits="all")
            s.truncate(depth)
            alone = np.stack([s.eval([t], logits="all")[0] for t in ids[depth:]])
        assert np.array_equal(together, alone), (which, depth, k, float(np.abs(together - alone).max()))


def test_sampled_tokens_have_the_same_distribution(stories_model, draft_model):
    """Tokens 2 and 3 of a sampled reply (drafted, kept or redrawn), 1,500 seeds with and without
    drafts: a chi-square test of homogeneity per position. A rule that kept every draft, or redrew
    from the whole distribution after a rejection, shifts these distributions far beyond the test's
    reach (see the counter-check below)."""
    n_seeds = 1500

    def samples(draft):
        out = []
        with stories_model.session() as s:
            if draft is not None:
                s.speculative(draft, n_draft=4)
            for seed in range(n_seeds):
                s.reset()
                s.generate("The little bird", 3, temperature=1.0, seed=seed + (0 if draft is None else 10**6))
                out.append(s.tokens[-2:])
        return np.array(out)

    plain, spec = samples(None), samples(draft_model)
    for pos in range(2):
        values = sorted(set(plain[:, pos]) | set(spec[:, pos]))
        table = np.array([[np.sum(x[:, pos] == v) for v in values] for x in (plain, spec)])
        keep = table.sum(axis=0) >= 10  # pool the rare tokens, as the test needs
        table = np.column_stack([table[:, keep], table[:, ~keep].sum(axis=1)])
        p = chi2_contingency(table)[1]
        assert p > 1e-3, (pos, p, table)
    # counter-check: the greedy pick's share differs clearly from a sampled one
    greedy_tok = run(stories_model, "The little bird", 3, temperature=0.0)[0][-1]
    share = np.mean(spec[:, 1] == greedy_tok)
    assert share < 0.9, share


def test_bad_options_are_refused(stories_model, draft_model, smollm):
    with stories_model.session() as s:
        for n_draft in (0, 17, -1):
            with pytest.raises(fastllm.FastLLMError, match="n_draft"):
                s.speculative(None, n_draft=n_draft)
        for ngram in ((0, 3), (3, 2), (1, 17)):
            with pytest.raises(fastllm.FastLLMError, match="n-grams"):
                s.speculative(None, ngram=ngram)
        with pytest.raises(fastllm.FastLLMError, match="vocabulary"):
            s.speculative(smollm)
        with pytest.raises(fastllm.FastLLMError, match="own model"):
            s.speculative(stories_model)
        with pytest.raises(fastllm.FastLLMError, match="p_min"):
            s.speculative(draft_model, p_min=1.5)
        # still usable, without drafts
        assert s.generate("Once", 4, temperature=0.0)
        assert s.speculative_stats() == {"drafted": 0, "accepted": 0}
    assert lib.fastllm_session_set_speculative(None, None) == raw.ERR_INVALID_ARGUMENT


# -- fastllm-server: "speculative" per server (--draft-model, --speculative) and per request ----------

def test_server_speculative_greedy_equals_plain(stories_flm, smollm_flm, tmp_path):
    import subprocess
    from test_server import SERVER, Server
    draft_path = convert(STORIES / "hf", tmp_path / "draft.flm", dtype="int8")
    s = Server(stories_flm, "--max-sessions", 2, "--draft-model", draft_path)
    try:
        with s.client() as c:
            def text(**extra):
                r = c.completions.create(model="stories260K", prompt="Once upon a time", max_tokens=40, temperature=0,
                                         extra_body=extra)
                return r.choices[0].text
            plain = text(speculative="off")
            assert s.metrics()["fastllm_draft_tokens_total"] == 0
            assert text() == plain  # the server's default here: draft
            m = s.metrics()
            assert 0 < m["fastllm_draft_tokens_accepted_total"] <= m["fastllm_draft_tokens_total"]
            assert text(speculative="lookup", n_draft=3) == plain
            assert text(speculative="draft", n_draft=16) == plain
            import openai
            for bad in ({"speculative": "maybe"}, {"n_draft": 0}, {"n_draft": 17}, {"speculative": 1}):
                with pytest.raises(openai.BadRequestError):
                    text(**bad)
    finally:
        assert s.stop() == 0
    # options are validated before anything starts
    r = subprocess.run([str(SERVER), str(stories_flm), "--draft-model", str(smollm_flm)], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 1 and "vocabulary" in r.stderr
    r = subprocess.run([str(SERVER), str(stories_flm), "--speculative", "draft"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "--draft-model" in r.stderr
    r = subprocess.run([str(SERVER), str(stories_flm), "--n-draft", "40"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "--n-draft" in r.stderr
