"""The real stories260K model (../shared/models/stories260K): converted from its HF folder, it must
reproduce transformers' greedy output and logits, and its tokenizer must match sentencepiece."""
import json

import numpy as np
import torch

from conftest import STORIES, run_binary
from hf_models import load_model

GOLDEN = json.loads((STORIES / "golden_greedy.json").read_text())


def test_tokenize_prompt(stories_model):
    assert stories_model.tokenize(GOLDEN["prompt"]) == GOLDEN["input_ids"]


def test_last_logits_match_golden(stories_model):
    ours = stories_model.forward(GOLDEN["input_ids"])[-1]
    ref = np.array(GOLDEN["last_position_logits"], dtype=np.float32)
    assert np.abs(ours - ref).max() / np.abs(ref).max() < 1e-4


def test_argmax_per_position(stories_model):
    key = next(k for k in GOLDEN if "argmax" in k)
    assert stories_model.forward(GOLDEN["input_ids"]).argmax(axis=1).tolist() == GOLDEN[key]


def test_greedy_matches_golden_and_live_transformers(stories_model):
    n_new = GOLDEN["greedy_max_new_tokens"]
    with stories_model.session() as s:
        text = s.generate(GOLDEN["prompt"], max_new_tokens=n_new, temperature=0.0)
        ids = s.tokens
    assert ids[:len(GOLDEN["greedy_output_ids"])] == GOLDEN["greedy_output_ids"]
    assert GOLDEN["prompt"] + text == GOLDEN["greedy_output_text"]
    # and transformers, run now on the same checkpoint
    ref = load_model(STORIES / "hf").eval()
    with torch.no_grad():
        out = ref.generate(torch.tensor([GOLDEN["input_ids"]]), max_new_tokens=n_new, do_sample=False)
    assert ids == out[0].tolist()[:len(ids)]


def test_c_example_streams_the_same_text(stories_flm):
    r = run_binary("simple_c", stories_flm, GOLDEN["prompt"], GOLDEN["greedy_max_new_tokens"])
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(GOLDEN["greedy_output_text"])


def test_cpp_npc_demo_built_by_cmake_runs(stories_flm):
    r = run_binary("npc_dialogue", stories_flm, 4, 16)
    assert r.returncode == 0, r.stderr
    lines = [l for l in r.stdout.splitlines() if not l.startswith("[")]
    assert [l.split(":")[0] for l in lines] == ["Guard", "Guard does", "Merchant", "Merchant does", "Smith",
                                                "Smith does", "Guard", "Guard does"]
    assert "3 NPCs sharing one model" in r.stdout.splitlines()[-1]


def test_c_example_reports_a_bad_model(tmp_path):
    bad = tmp_path / "bad.flm"
    bad.write_bytes(b"not a model at all")
    r = run_binary("simple_c", bad, "hi")
    assert r.returncode == 1 and "bad magic" in r.stderr
