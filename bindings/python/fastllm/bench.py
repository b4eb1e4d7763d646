"""Prompt-processing and generation speed of one .flm file (`fastllm bench`, bench/bench_speed.py).

The prompt is a fixed sequence of ordinary token ids (the text does not change the cost); generation
is greedy with EOS ignored, so every round does the same work. Each figure is the median over
`repeat` rounds after one warm-up round (which also brings the file into the page cache).
Generation follows the prompt (its attention reads the prompt's KV cache too), or, with
gen_from_empty, starts from a one-token prompt, as llama-bench's tg test does.
"""
from __future__ import annotations

import os
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

from .model import Model


@dataclass
class BenchResult:
    prompt_tokens: int
    generated_tokens: int
    threads: int
    prompt_tok_s: float  # median
    generate_tok_s: float  # median
    load_ms: float  # loading the model (warm page cache after the first run on this file)
    final_context: int  # tokens in the context when generation ended (what its attention last read)
    backend: str = ""  # what ran it (fastllm_model_info.backend)


def synthetic_prompt(vocab_size: int, n: int, bos_id: int) -> list[int]:
    return [max(bos_id, 0)] + [(7 * i + 11) % (vocab_size - 3) + 3 for i in range(n - 1)]


def bench(model_path: str | Path, n_prompt: int = 128, n_gen: int = 64, threads: int = 0,
          repeat: int = 3, gen_from_empty: bool = False, device: str | None = None, gpu_layers: int = -1) -> BenchResult:
    t0 = time.perf_counter()
    with Model(model_path, threads=threads, device=device, gpu_layers=gpu_layers) as m:
        load_ms = (time.perf_counter() - t0) * 1000
        info = m.info
        n_prompt = max(1, min(n_prompt, info["context_length"] - n_gen - 1))
        prompt = synthetic_prompt(info["vocab_size"], n_prompt, info["bos_id"])
        pp, tg = [], []
        for _ in range(repeat + 1):
            with m.session(n_ctx=n_prompt + n_gen + 1, n_batch=n_prompt) as s:
                t0 = time.perf_counter()
                s.eval(prompt)
                pp.append(n_prompt / (time.perf_counter() - t0))
                if gen_from_empty:
                    s.reset()
                s.generate(prompt[:1] if gen_from_empty else [], n_gen, temperature=0.0, ignore_eos=True)
                r = s.last_result
                tg.append(r.n_generated_tokens / (r.generate_ms / 1000))
                final_context = len(s.tokens)
        return BenchResult(n_prompt, n_gen, threads or os.cpu_count() or 1, statistics.median(pp[1:]),
                           statistics.median(tg[1:]), load_ms, final_context, info["backend"])
