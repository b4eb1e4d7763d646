"""The KV cache of sliding-window layers keeps only their window (Gemma 3's 5 of 6 layers, Mistral,
Qwen2's windowed layers): logits of sequences many windows long equal transformers', the memory it
saves, and every session operation that goes back in time — truncation, forks, saved states,
context shifts — gives what a session keeping every position (swa_full) gives."""
import numpy as np
import pytest
import torch

import fastllm
from conftest import convert, rel_to_max
from hf_models import load_model, make_model

WINDOW = 8
SEQ = 300  # 37 windows, 10 cache blocks


@pytest.fixture(scope="module")
def gemma3(tmp_path_factory):
    """A random Gemma 3 text model: layers 0 and 2 see 8 positions (their own RoPE base), 1 and 3 all."""
    tmp = tmp_path_factory.mktemp("swa")
    hf = make_model(tmp / "hf", "gemma3", seed=3, num_attention_heads=4, num_key_value_heads=1, num_hidden_layers=4,
                    sliding_window=WINDOW, sliding_window_pattern=2, max_position_embeddings=512)
    ids = [int(x) for x in np.random.default_rng(0).integers(3, 512, SEQ)]
    with torch.no_grad():
        ref = load_model(hf).eval()(torch.tensor([ids])).logits[0].numpy()
    model = fastllm.Model(convert(hf, tmp / "m.flm"), threads=2)
    yield model, ids, ref
    model.close()


def test_long_sequence_matches_transformers_and_holds_only_the_windows(gemma3):
    m, ids, ref = gemma3
    with m.session(n_ctx=512, n_batch=64, kv_type="f32") as ring, \
            m.session(n_ctx=512, n_batch=64, kv_type="f32", swa_full=True) as full:
        got = ring.eval(ids[:-20], logits="all")
        steps = np.stack([ring.eval([t], logits="last") for t in ids[-20:]])  # the decode path
        full.eval(ids, logits=None)
        mr, mf = ring.memory(), full.memory()
        assert ring.n_cached == SEQ
    assert rel_to_max(got, ref[:-20]) < 1e-4
    assert rel_to_max(steps, ref[-20:]) < 1e-4
    # full: 10 blocks of the 4 layers; ring: the 2 full layers' 10 and the windowed layers' last few
    per_block = 32 * mr["kv_bytes_per_token"] // 4
    assert mf["kv_bytes"] == 10 * 4 * per_block
    assert mr["kv_bytes"] <= (10 * 2 + 3 * 2) * per_block, (mr["kv_bytes"], per_block)
    assert mr["kv_capacity_bytes"] < mf["kv_capacity_bytes"] / 1.5


def test_truncating_past_the_window_evaluates_again(gemma3):
    m, ids, ref = gemma3
    with m.session(n_ctx=512, kv_type="f32") as s:
        s.eval(ids, logits=None)
        s.truncate(SEQ - 10)  # within the block of slack kept before the window: nothing to redo
        assert s.n_cached == s.n_tokens == SEQ - 10
        near = s.eval(ids[SEQ - 10:], logits="all")
        s.truncate(100)  # the windowed layers dropped what a query at 100 sees
        assert s.n_tokens == 100 and s.n_cached == 0 and s.memory()["kv_bytes"] == 0
        far = s.eval(ids[100:130], logits="all")
        assert s.n_cached == 130
    assert rel_to_max(near, ref[SEQ - 10:]) < 1e-4
    assert rel_to_max(far, ref[100:130]) < 1e-4


def test_forks_of_old_and_recent_prefixes(gemma3):
    m, ids, ref = gemma3
    with m.session(n_ctx=512, kv_type="f32") as src:
        src.eval(ids[:200], logits=None)
        with src.fork(200) as recent, src.fork(50) as old:
            assert recent.n_cached == 200 and recent.memory()["kv_shared_bytes"] > 0
            assert old.n_tokens == 50 and old.n_cached == 0
            a = recent.eval(ids[200:220], logits="all")
            b = old.eval(ids[50:70], logits="all")
    assert rel_to_max(a, ref[200:220]) < 1e-4
    assert rel_to_max(b, ref[50:70]) < 1e-4


def test_context_shift_and_generation_equal_swa_full(gemma3):
    """Context shifts keep the first n_keep positions in every layer (the windowed ones too), so a
    generation running through several shifts is the same whether the windowed layers keep their
    window or everything."""
    m, ids, _ = gemma3
    out = {}
    for swa_full in (False, True):
        with m.session(n_ctx=256, context_shift=True, n_keep=40, swa_full=swa_full) as s:
            out[swa_full] = s.generate(ids[:60], max_new_tokens=500, temperature=0, ignore_eos=True)
            assert s.n_tokens <= 256
            out[swa_full, "kv"] = s.memory()["kv_bytes"]
    assert out[False] == out[True] and len(out[False]) > 0
    assert out[False, "kv"] < out[True, "kv"]


@pytest.mark.parametrize("load_swa_full", [False, True])
def test_saved_state_holds_the_windows_and_resumes_the_same(gemma3, load_swa_full):
    """A state saved mid-generation holds the windowed layers' windows only (smaller than
    swa_full's), and resumes the same generation in a session of either kind."""
    import ctypes
    from fastllm import _lib as raw
    lib = raw.lib
    m, ids, _ = gemma3
    p = lib.fastllm_sampling_default_params()
    p.temperature, p.max_new_tokens, p.ignore_eos, p.seed = 1.0, 60, 1, 7
    prompt, n = fastllm.model._ids_array(ids[:250])
    none = raw.StreamCallback(lambda text, length, user: 0)

    def run(session, steps):
        done = ctypes.c_int32(0)
        for _ in range(steps):
            assert lib.fastllm_generate_step((ctypes.c_void_p * 1)(session.handle.value), 1, ctypes.byref(done)) == 0
        return session.tokens

    with m.session(n_ctx=512) as a, m.session(n_ctx=512, swa_full=True) as full:
        assert lib.fastllm_session_begin_generation(a.handle, prompt, n, ctypes.byref(p), none, None) == 0
        assert lib.fastllm_session_begin_generation(full.handle, prompt, n, ctypes.byref(p), none, None) == 0
        run(a, 20), run(full, 20)
        state, full_state = a.save_state(), full.save_state()
        assert len(state) < 0.75 * len(full_state)
        want = run(a, 30)
        with m.session(n_ctx=512, swa_full=load_swa_full) as b:
            b.load_state(state)
            assert b.n_cached == b.n_tokens == 270
            assert run(b, 30) == want


def test_state_whose_layers_disagree_on_held_blocks_is_refused_without_a_crash(gemma3):
    """Layers 0 and 2 share their window's blocks: a state (checksum made valid) in which layer 2
    claims a block layer 0 left out is read without writing into a released block."""
    from test_session_share import _fnv1a
    m, ids, _ = gemma3
    with m.session(n_ctx=512) as a:
        a.eval(ids[:270], logits=None)
        state = bytearray(a.save_state())
    n_blocks, row = (270 + 31) // 32, 2 * 16  # f16 rows of one KV head of 16
    layer0 = 8 + 4 + 8 + 4 + 6 * 4 + 4 * 270  # magic, version, fingerprint, no adapters, header, tokens
    assert list(state[layer0:layer0 + n_blocks]) == [0] * 7 + [1, 1]  # the window and its slack block
    held0 = 270 - 7 * 32  # rows layer 0 saved, keys then values
    layer1 = layer0 + n_blocks + 2 * held0 * row
    layer2 = layer1 + n_blocks + 2 * 270 * row
    assert list(state[layer2:layer2 + n_blocks]) == [0] * 7 + [1, 1]
    state[layer2] = 1
    body = bytes(state[:-8])
    with m.session(n_ctx=512) as b:
        b.eval([5, 6, 7], logits=None)
        with pytest.raises(fastllm.FastLLMError) as e:
            b.load_state(body + _fnv1a(body).to_bytes(8, "little"))
        assert e.value.status_name == "FASTLLM_ERR_BAD_FORMAT"
        assert b.tokens == [5, 6, 7]
