"""How often int8 picks the f32 model's next token, next to what llama.cpp's Q8_0 arithmetic would.

    python3 bench/int8_agreement.py

On stories260K (the first 40 TinyStories validation stories) and on the tests' random-weight model
(tests/test_quantization.py: hidden 256, 2 layers, 6 x 256 random tokens) it prints the top-1
agreement with the f32 model of:
- fastllm int8 and int8 + --calib (tinystories_sample.txt), run by the library;
- llama.cpp Q8_0, simulated exactly in PyTorch: weights d = max|w| / 127 (f16) per block of 32,
  codes round(w / d); every matrix's input quantized the same way per block of 32 (as its
  quantize_row_q8_0 does), the output head Q8_0 too (llama.cpp keeps Q8_0 files' head at Q8_0);
- the same with float activations, and plain f16 weights, to show which rounding costs what.
"""
from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "bindings" / "python"), str(REPO), str(REPO / "tests")]

import fastllm  # noqa: E402
from converter.convert import convert  # noqa: E402
from hf_models import make_llama  # noqa: E402
from transformers import LlamaForCausalLM  # noqa: E402

STORIES = REPO.parent / "shared" / "models" / "stories260K"


def q8_0(w: torch.Tensor) -> torch.Tensor:
    b = w.reshape(*w.shape[:-1], -1, 32)
    d = (b.abs().amax(-1, keepdim=True) / 127).half().float()
    return (torch.where(d > 0, torch.round(b / d), 0) * d).reshape(w.shape)


def simulated(path, weights, acts: bool):
    """The HF model with every matrix (and the head) passed through `weights`, and, with acts,
    every matrix input through Q8_0. Rows not a multiple of 32 stay f16, as in both libraries."""
    m = LlamaForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    if m.lm_head.weight.data_ptr() == m.model.embed_tokens.weight.data_ptr():
        m.lm_head.weight = torch.nn.Parameter(m.lm_head.weight.detach().clone())
    m.model.embed_tokens.weight.data = m.model.embed_tokens.weight.data.half().float()
    for module in m.modules():
        if isinstance(module, torch.nn.Linear):
            if module.weight.shape[1] % 32:
                module.weight.data = module.weight.data.half().float()
                continue
            module.weight.data = weights(module.weight.data)
            if acts:
                module.register_forward_pre_hook(lambda mod, inp: (q8_0(inp[0]),))
    return m


def main() -> int:
    tmp = Path(tempfile.mkdtemp())
    random_hf = make_llama(tmp / "random", hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512, seed=5)
    docs = [d for d in (STORIES / "text" / "tinystories_valid_head.txt").read_text().split("\n\n")
            if d.strip()][:40]
    f16 = lambda w: w.half().float()  # noqa: E731
    for label, hf, calib in (("stories260K", STORIES / "hf", STORIES / "text" / "tinystories_sample.txt"),
                             ("random model", random_hf, None)):
        with fastllm.Model(convert(hf, tmp / "f32.flm", "f32", progress=False)) as m:
            seqs = ([m.tokenize(d) for d in docs] if label == "stories260K" else
                    np.random.default_rng(0).integers(3, 512, size=(6, 256)).tolist())
            ref = np.concatenate([m.forward(s) for s in seqs]).argmax(1)
        print(f"{label}: {len(ref)} positions, top-1 agreement with f32")
        runs = [("fastllm int8", "int8", None)] + ([("fastllm int8 + calib", "int8", calib)] if calib else [])
        for name, dtype, cal in runs:
            with fastllm.Model(convert(hf, tmp / "q.flm", dtype, progress=False, calib=cal)) as m:
                got = np.concatenate([m.forward(s) for s in seqs]).argmax(1)
            print(f"  {name:40s} {100 * (got == ref).mean():6.2f}%")
        for name, weights, acts in (("llama.cpp Q8_0 (simulated)", q8_0, True),
                                    ("Q8_0 weights, float activations", q8_0, False),
                                    ("f16 weights", f16, False)):
            with torch.no_grad():
                model = simulated(hf, weights, acts)
                got = torch.cat([model(torch.tensor([s])).logits[0] for s in seqs]).argmax(1).numpy()
            print(f"  {name:40s} {100 * (got == ref).mean():6.2f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
