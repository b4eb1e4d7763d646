"""Every supported family against HuggingFace transformers (PyTorch, float32) on random-weight
checkpoints of several configurations each, converted from the HF folder and from a GGUF file
written by the `gguf` package: logits at every position, greedy generations, the rounded dtypes,
and the session features (incremental decoding, step-wise batching across sessions)."""
import zlib

import numpy as np
import pytest
import torch

import fastllm
from conftest import convert, rewrite_flm
import gguf_models
from hf_models import load_model, make_model

SEQ = 64
F32_BOUND = 1e-4           # largest |logit difference| relative to the largest |logit|, as for LLaMA
ROUNDED_BOUND = 1e-4       # f16/bf16 files against HF on the same rounded weights
DTYPE_LOSS_BOUND = {"f16": 2e-3, "bf16": 2e-2}  # ... and against the f32 weights (test_parity_hf.py)
# int8 / int4 against our own f32 file: top-1 agreement and mean KL (the LLaMA random-model bounds of
# test_quantization.py, on these smaller models)
QUANT_BOUNDS = {"int8": (0.96, 1e-4), "int4": (0.60, 5e-3), "q4_k_m": (0.60, 5e-3)}
# Gemma 3's random models have flat logits (int4 KL 6e-4 - 9e-4, well inside the bound, but top-1
# agreement 0.59 - 0.68; Gemma 2's 0.63 - 0.78, the other families' 0.79 - 1.0): top-1 flips on
# near-ties there
QUANT_BOUNDS_GEMMA3_INT4 = (0.55, 5e-3)

# (family, name) -> transformers config overrides. Each family: GQA and MHA, tied and untied, its
# own features (biases, q/k norms, head_dim != hidden / heads, a window shorter than the sequence,
# partial rotary, LongRoPE evaluated past original_max_position_embeddings).
CASES = {
    ("qwen2", "gqa_bias"): dict(num_attention_heads=8, num_key_value_heads=2, intermediate_size=160),
    ("qwen2", "mha_tied"): dict(num_attention_heads=4, num_key_value_heads=4, tie_word_embeddings=True),
    ("qwen2", "sliding_layers"): dict(num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=3,
                                      use_sliding_window=True, sliding_window=12, max_window_layers=1),
    ("qwen3", "gqa_head_dim"): dict(num_attention_heads=4, num_key_value_heads=2, head_dim=24),
    ("qwen3", "mha_tied"): dict(num_attention_heads=4, num_key_value_heads=4, head_dim=16, tie_word_embeddings=True),
    ("qwen3", "bias_odd"): dict(num_attention_heads=6, num_key_value_heads=3, head_dim=12, hidden_size=72,
                                intermediate_size=123, attention_bias=True, num_hidden_layers=3),
    ("mistral", "window"): dict(num_attention_heads=8, num_key_value_heads=2, sliding_window=16),
    ("mistral", "head_dim"): dict(num_attention_heads=4, num_key_value_heads=2, head_dim=32, sliding_window=None),
    ("mistral", "mha_tied_window"): dict(num_attention_heads=4, num_key_value_heads=4, tie_word_embeddings=True,
                                         sliding_window=5),
    ("phi3", "plain"): dict(num_attention_heads=4, num_key_value_heads=4),
    ("phi3", "longrope"): dict(num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                               original_max_position_embeddings=32,
                               rope_scaling=dict(type="longrope", short_factor=[1.0 + 0.1 * i for i in range(8)],
                                                 long_factor=[2.0 + 0.5 * i for i in range(8)])),
    ("phi3", "partial_tied"): dict(num_attention_heads=4, num_key_value_heads=2, partial_rotary_factor=0.75,
                                   tie_word_embeddings=True),
    # Gemma: (1 + w) norms, GELU-tanh, scaled embeddings (tied by default); soft-caps small enough
    # to bend these random models' scores and logits (0.02 changes the logits by 10%)
    ("gemma", "mqa_tied"): dict(num_attention_heads=4, num_key_value_heads=1, tie_word_embeddings=True),
    ("gemma", "mha_untied"): dict(num_attention_heads=4, num_key_value_heads=4, tie_word_embeddings=False),
    ("gemma", "bias_head_dim"): dict(num_attention_heads=4, num_key_value_heads=2, head_dim=24, attention_bias=True),
    ("gemma2", "window_softcap"): dict(num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=3,
                                       sliding_window=12, attn_logit_softcapping=0.02, final_logit_softcapping=1.0,
                                       tie_word_embeddings=True),
    # query_pre_attn_scalar = head_dim != hidden / heads (what llama.cpp's GGUF loader assumes)
    ("gemma2", "mqa_untied"): dict(num_attention_heads=4, num_key_value_heads=1, tie_word_embeddings=False,
                                   head_dim=24, query_pre_attn_scalar=24, sliding_window=5),
    ("gemma2", "mha_default_caps"): dict(num_attention_heads=4, num_key_value_heads=4, sliding_window=100),
    ("gemma3", "pattern_window"): dict(num_attention_heads=4, num_key_value_heads=1, num_hidden_layers=3,
                                       sliding_window=12, sliding_window_pattern=3, tie_word_embeddings=True),
    ("gemma3", "linear_rope"): dict(num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=4,
                                    sliding_window=8, layer_types=["sliding_attention", "full_attention"] * 2,
                                    rope_parameters={"full_attention": {"rope_type": "linear", "factor": 4.0,
                                                                        "rope_theta": 10000.0},
                                                     "sliding_attention": {"rope_type": "default",
                                                                           "rope_theta": 100.0}}),
    ("gemma3", "softcap_untied"): dict(num_attention_heads=4, num_key_value_heads=4, tie_word_embeddings=False,
                                       sliding_window=6, sliding_window_pattern=2, final_logit_softcapping=1.0),
    # GLM: q/k/v biases (or not), interleaved RoPE over half of each head (or a quarter), MQA
    ("glm", "gqa_bias"): dict(num_attention_heads=4, num_key_value_heads=2),
    ("glm", "mqa_tied"): dict(num_attention_heads=4, num_key_value_heads=1, tie_word_embeddings=True),
    ("glm", "mha_nobias_quarter"): dict(num_attention_heads=4, num_key_value_heads=4, hidden_size=128, head_dim=32,
                                        attention_bias=False, partial_rotary_factor=0.25),
    # GLM-4-0414: the same plus the post-attention and post-MLP norms
    ("glm4", "gqa_bias"): dict(num_attention_heads=4, num_key_value_heads=2),
    ("glm4", "mqa_tied"): dict(num_attention_heads=4, num_key_value_heads=1, tie_word_embeddings=True),
    ("glm4", "mha_head_dim24"): dict(num_attention_heads=4, num_key_value_heads=4, head_dim=24),
}


def rel_diff(a, b):
    return float(np.abs(a - b).max() / np.abs(b).max())


def input_ids(vocab, seed=0, n=SEQ):
    return np.random.default_rng(seed).integers(3, vocab, size=n).tolist()


def hf_logits(model, ids):
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float().numpy()


def hf_greedy(model, ids, n):
    """transformers' generate with its KV cache, EOS not special (min_new_tokens would forbid it)."""
    from transformers import GenerationConfig
    config = GenerationConfig(max_new_tokens=n, do_sample=False, eos_token_id=None, pad_token_id=0)
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), generation_config=config)
    assert out.shape[1] == len(ids) + n
    return out[0, len(ids):].tolist()


@pytest.fixture(scope="module", params=sorted(CASES), ids=lambda c: f"{c[0]}-{c[1]}")
def case(request, tmp_path_factory):
    family, name = request.param
    tmp = tmp_path_factory.mktemp(f"{family}-{name}")
    hf_dir = make_model(tmp / "hf", family, seed=zlib.crc32(name.encode()) % 1000, **CASES[request.param])
    ref = load_model(hf_dir).eval()
    return family, hf_dir, ref, convert(hf_dir, tmp / "f32.flm")


def test_architecture_and_logits_f32(case):
    family, hf_dir, ref, flm = case
    ids = input_ids(ref.config.vocab_size)
    with fastllm.Model(flm, threads=2) as m:
        assert m.info["architecture"] == family
        ours = m.forward(ids)
    expected = hf_logits(ref, ids)
    assert ours.shape == expected.shape
    assert rel_diff(ours, expected) < F32_BOUND


def test_incremental_equals_batched(case):
    """The decode path (one token a pass) and the prompt path agree (20 tokens: within LongRoPE's
    original context, where both use the short factors)."""
    family, hf_dir, ref, flm = case
    ids = input_ids(ref.config.vocab_size, seed=1, n=20)
    with fastllm.Model(flm, threads=2) as m:
        batched = m.forward(ids)
        with m.session(n_ctx=32, kv_type="f32") as s:
            step = np.stack([s.eval([t], logits="last") for t in ids])
    assert rel_diff(step, batched) < 1e-5


def test_greedy_generation(case):
    """16 prompt tokens + 32 generated: the LongRoPE case crosses its original context (32) while
    generating, where transformers switches to the long factors for the new tokens only."""
    family, hf_dir, ref, flm = case
    ids = input_ids(ref.config.vocab_size, seed=2, n=16)
    with fastllm.Model(flm, threads=2) as m, m.session() as s:
        s.generate(ids, max_new_tokens=32, temperature=0.0, ignore_eos=True)
        ours = s.tokens[len(ids):]
    assert ours == hf_greedy(ref, ids, 32)


def step_together(model, prompts, n, adapters=None, speculative=None):
    """Greedy generations of the prompts, one session each (with adapters[i], Session's option, and
    Session.speculative(**speculative[i]) where given), advanced together by fastllm_generate_step."""
    import ctypes
    from fastllm import _lib as raw
    lib = raw.lib
    p = lib.fastllm_sampling_default_params()
    p.temperature, p.max_new_tokens, p.ignore_eos = 0.0, n, 1
    sessions = [model.session(n_ctx=64, adapters=adapters[i] if adapters else None) for i in range(len(prompts))]
    for s, spec in zip(sessions, speculative or []):
        if spec is not None:
            s.speculative(**spec)
    no_text = raw.StreamCallback(lambda text, length, user: 0)
    for s, prompt in zip(sessions, prompts):
        ids, k = fastllm.model._ids_array(prompt)
        assert lib.fastllm_session_begin_generation(s.handle, ids, k, ctypes.byref(p), no_text, None) == 0
    active = list(range(len(prompts)))
    while active:
        handles = (ctypes.c_void_p * len(active))(*[sessions[i].handle.value for i in active])
        done = (ctypes.c_int32 * len(active))()
        assert lib.fastllm_generate_step(handles, len(active), done) == 0, lib.fastllm_last_error()
        active = [i for i, d in zip(active, done) if not d]
    out = [s.tokens for s in sessions]
    for s in sessions:
        s.close()
    return out


def test_sessions_step_together(case):
    """Two sessions of different lengths decoded in shared passes give each its own greedy output."""
    family, hf_dir, ref, flm = case
    prompts = [input_ids(ref.config.vocab_size, seed=3, n=5), input_ids(ref.config.vocab_size, seed=4, n=11)]
    with fastllm.Model(flm, threads=2) as m:
        alone = []
        for p in prompts:
            with m.session(n_ctx=64) as s:
                s.generate(p, max_new_tokens=12, temperature=0.0, ignore_eos=True)
                alone.append(s.tokens)
        together = step_together(m, prompts, 12)
    assert together == alone


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_logits_half_precision(case, tmp_path, dtype):
    family, hf_dir, ref, flm = case
    ids = input_ids(ref.config.vocab_size, seed=5)
    with fastllm.Model(convert(hf_dir, tmp_path / f"m_{dtype}.flm", dtype=dtype), threads=2) as m:
        assert m.info["weight_dtype"] == dtype
        ours = m.forward(ids)
    torch_dtype = torch.float16 if dtype == "f16" else torch.bfloat16
    rounded = load_model(hf_dir).eval()
    with torch.no_grad():
        for p in rounded.parameters():
            if p.dim() == 2:
                p.copy_(p.to(torch_dtype).float())
    assert rel_diff(ours, hf_logits(rounded, ids)) < ROUNDED_BOUND
    assert rel_diff(ours, hf_logits(ref, ids)) < DTYPE_LOSS_BOUND[dtype]


def agreement_and_kl(ref, q):
    def log_softmax(x):
        x = x.astype(np.float64)
        m = x.max(axis=1, keepdims=True)
        return x - m - np.log(np.exp(x - m).sum(axis=1, keepdims=True))
    lp, lq = log_softmax(ref), log_softmax(q)
    return float((ref.argmax(1) == q.argmax(1)).mean()), float((np.exp(lp) * (lp - lq)).sum(1).mean())


@pytest.mark.parametrize("dtype", ["int8", "int4", "q4_k_m"])
def test_quantized(case, tmp_path, dtype):
    family, hf_dir, ref, flm = case
    ids = [input_ids(ref.config.vocab_size, seed=6 + i) for i in range(4)]
    with fastllm.Model(flm, threads=2) as f, fastllm.Model(convert(hf_dir, tmp_path / "q.flm", dtype), threads=2) as q:
        agree, kl = agreement_and_kl(np.concatenate([f.forward(x) for x in ids]),
                                     np.concatenate([q.forward(x) for x in ids]))
    min_agree, max_kl = QUANT_BOUNDS_GEMMA3_INT4 if (family, dtype) == ("gemma3", "int4") else QUANT_BOUNDS[dtype]
    assert agree >= min_agree and kl <= max_kl, (agree, kl)


def test_gguf_file_of_the_family(case, tmp_path):
    """The same model written as llama.cpp writes the family's GGUF files gives transformers' logits."""
    family, hf_dir, ref, flm = case
    gguf = gguf_models.write_gguf(hf_dir, tmp_path / "m.gguf")
    ids = input_ids(ref.config.vocab_size, seed=7)
    with fastllm.Model(convert(gguf, tmp_path / "from_gguf.flm"), threads=2) as m:
        ours = m.forward(ids)
    assert rel_diff(ours, hf_logits(ref, ids)) < F32_BOUND


def test_missing_family_tensor_is_a_clear_error(tmp_path):
    """A qwen3 file without one of its q_norm tensors: FASTLLM_ERR_BAD_FORMAT naming it."""
    hf_dir = make_model(tmp_path / "hf", "qwen3", num_attention_heads=4, num_key_value_heads=2, head_dim=16)
    bad = rewrite_flm(convert(hf_dir, tmp_path / "ok.flm"), tmp_path / "bad.flm", drop={"blk.1.attn_q_norm.weight"})
    with pytest.raises(fastllm.FastLLMError) as e:
        fastllm.Model(bad)
    assert e.value.status_name == "FASTLLM_ERR_BAD_FORMAT" and "blk.1.attn_q_norm.weight" in str(e.value)


def test_unknown_architecture_lists_the_supported_ones(tmp_path):
    hf_dir = make_model(tmp_path / "hf", "qwen2", num_attention_heads=4, num_key_value_heads=2)
    bad = rewrite_flm(convert(hf_dir, tmp_path / "ok.flm"), tmp_path / "x.flm",
                      metadata={"general.architecture": "qwen9"})
    with pytest.raises(fastllm.FastLLMError) as e:
        fastllm.Model(bad)
    assert e.value.status_name == "FASTLLM_ERR_UNSUPPORTED" and "qwen9" in str(e.value)
    for arch in ("llama", "mistral", "qwen2", "qwen3", "phi3", "glm", "glm4"):
        assert arch in str(e.value)


def test_version2_llama_files_still_load(tmp_path):
    """Version 2 (LLaMA only) used the same `llama.*` keys and tensors that version 3 writes for
    LLaMA: such a file loads and computes the same logits."""
    from hf_models import make_llama
    flm = convert(make_llama(tmp_path / "hf"), tmp_path / "v3.flm")
    data = bytearray(flm.read_bytes())
    assert data[8:12] == (3).to_bytes(4, "little")
    data[8:12] = (2).to_bytes(4, "little")
    (tmp_path / "v2.flm").write_bytes(bytes(data))
    ids = input_ids(512, seed=8)
    with fastllm.Model(flm) as a, fastllm.Model(tmp_path / "v2.flm") as b:
        np.testing.assert_array_equal(a.forward(ids), b.forward(ids))


@pytest.fixture(scope="module", params=["qwen2", "qwen3", "mistral", "phi3", "gemma3", "glm", "glm4"])
def family_flm(request, tmp_path_factory):
    tmp = tmp_path_factory.mktemp(f"tools-{request.param}")
    window = dict(sliding_window=16) if request.param == "gemma3" else {}
    hf_dir = make_model(tmp / "hf", request.param, num_attention_heads=4, num_key_value_heads=2, **window)
    return request.param, convert(hf_dir, tmp / "m.flm", dtype="int8")


def test_command_line_tools(family_flm, tmp_path):
    """`fastllm info`, `perplexity` and `bench` on each family's file."""
    import subprocess
    import sys
    from conftest import REPO
    family, flm = family_flm
    env = dict(__import__("os").environ, PYTHONPATH=str(REPO / "bindings" / "python"))

    def run(*args):
        r = subprocess.run([sys.executable, "-m", "fastllm", *map(str, args)], capture_output=True, text=True,
                           env=env, timeout=300)
        assert r.returncode == 0, r.stderr
        return r.stdout

    info = run("info", flm)
    assert f"architecture: {family}" in info and "num_kv_heads: 2" in info
    assert ("keep only their window" in info) == (family == "gemma3"), info  # the cache it saves
    text = tmp_path / "t.txt"
    text.write_text("Once upon a time there was a little dog.\n\nIt liked to run in the park.\n")
    assert "perplexity " in run("perplexity", flm, text)
    assert "tok/s" in run("bench", flm, "--prompt-tokens", "16", "--gen-tokens", "8", "--repeat", "1")


def test_server_serves_every_family(family_flm):
    """fastllm-server's greedy completion equals the binding's on the same file."""
    from test_server import SERVER, Server
    if not SERVER.exists():
        pytest.skip("fastllm-server not built")
    family, flm = family_flm
    server = Server(flm)
    try:
        with fastllm.Model(flm, threads=1) as m:
            expected = m.generate("Once upon a time", 24, temperature=0.0)
        r = server.client().completions.create(model=flm.stem, prompt="Once upon a time", max_tokens=24, temperature=0)
        assert r.choices[0].text == expected
    finally:
        server.proc.terminate()
        server.proc.wait(timeout=10)
