"""Logits and greedy generations against HuggingFace transformers (PyTorch, float32) on
random-weight LLaMA checkpoints of several shapes, converted with converter/convert.py."""
import zlib

import numpy as np
import pytest
import torch

import fastllm
from conftest import convert
from hf_models import load_model, make_llama

SEQ = 64
# Bounds: the largest |logit difference| relative to the largest |logit|.
F32_BOUND = 1e-4
# f16/bf16 files against HF run on the same rounded weights (our arithmetic is still f32) ...
ROUNDED_BOUND = 1e-4
# ... and against the original f32 weights (the rounding itself): measured about 2e-4 (f16) and
# 3e-3 (bf16) on these models; the bounds leave room.
DTYPE_LOSS_BOUND = {"f16": 2e-3, "bf16": 2e-2}

CONFIGS = {
    "mha": dict(num_attention_heads=4, num_key_value_heads=4),
    "gqa": dict(num_attention_heads=8, num_key_value_heads=2, hidden_size=64, intermediate_size=160),
    "tied": dict(tie_word_embeddings=True, num_key_value_heads=2),
    "llama3_rope": dict(rope_theta=500000.0, max_position_embeddings=256,
                        rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                                          high_freq_factor=4.0, original_max_position_embeddings=32)),
    "odd_sizes": dict(vocab_size=515, hidden_size=72, intermediate_size=123, num_attention_heads=6,
                      num_key_value_heads=3, num_hidden_layers=3),
    "head_dim_bias_linear": dict(head_dim=24, num_attention_heads=4, num_key_value_heads=2, attention_bias=True,
                                 mlp_bias=True, rope_scaling=dict(rope_type="linear", factor=2.0)),
}


def rel_diff(a, b):
    return float(np.abs(a - b).max() / np.abs(b).max())


def input_ids(vocab, seed=0):
    return np.random.default_rng(seed).integers(3, vocab, size=SEQ).tolist()


def hf_logits(model, ids):
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float().numpy()


def hf_greedy(model, ids, n):
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False, min_new_tokens=n,
                             pad_token_id=0)
    return out[0, len(ids):].tolist()


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def case(request, tmp_path_factory):
    tmp = tmp_path_factory.mktemp(request.param)
    hf_dir = make_llama(tmp / "hf", seed=zlib.crc32(request.param.encode()) % 1000, **CONFIGS[request.param])
    return request.param, hf_dir, load_model(hf_dir).eval()


def test_logits_f32(case, tmp_path):
    name, hf_dir, ref = case
    ids = input_ids(ref.config.vocab_size)
    with fastllm.Model(convert(hf_dir, tmp_path / "m.flm"), threads=2) as m:
        ours = m.forward(ids)
    expected = hf_logits(ref, ids)
    assert ours.shape == expected.shape
    assert rel_diff(ours, expected) < F32_BOUND, name


def test_logits_batched_equals_incremental(case, tmp_path):
    """The prompt path (batched) and the decode path (one token at a time) agree."""
    name, hf_dir, ref = case
    ids = input_ids(ref.config.vocab_size, seed=1)[:20]
    with fastllm.Model(convert(hf_dir, tmp_path / "m.flm"), threads=2) as m:
        batched = m.forward(ids)
        with m.session(n_ctx=32, kv_type="f32") as s:
            step = np.stack([s.eval([t], logits="last") for t in ids])
    assert rel_diff(step, batched) < 1e-5, name


def test_greedy_generation(case, tmp_path):
    name, hf_dir, ref = case
    ids = input_ids(ref.config.vocab_size, seed=2)[:16]
    with fastllm.Model(convert(hf_dir, tmp_path / "m.flm"), threads=2) as m, m.session() as s:
        s.generate(ids, max_new_tokens=32, temperature=0.0, ignore_eos=True)
        ours = s.tokens[len(ids):]
    assert ours == hf_greedy(ref, ids, 32), name


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_logits_half_precision(case, tmp_path, dtype):
    name, hf_dir, ref = case
    ids = input_ids(ref.config.vocab_size, seed=3)
    with fastllm.Model(convert(hf_dir, tmp_path / f"m_{dtype}.flm", dtype=dtype), threads=2) as m:
        assert m.info["weight_dtype"] == dtype
        ours = m.forward(ids)
    expected_f32 = hf_logits(ref, ids)
    # HF on the same rounded weights (matrices rounded, norms/biases kept f32 as in our file).
    torch_dtype = torch.float16 if dtype == "f16" else torch.bfloat16
    rounded = load_model(hf_dir).eval()
    with torch.no_grad():
        for pname, p in rounded.named_parameters():
            if p.dim() == 2:
                p.copy_(p.to(torch_dtype).float())
    assert rel_diff(ours, hf_logits(rounded, ids)) < ROUNDED_BOUND, name
    assert rel_diff(ours, expected_f32) < DTYPE_LOSS_BOUND[dtype], name
