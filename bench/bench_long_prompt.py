#!/usr/bin/env python3
"""Long prompts: tokens/s of evaluating prompts of several lengths, 512 tokens a pass (as a server
or llama-bench evaluates them), each length's share of the shortest's rate, and, given two
libraries, their ratio. Each round runs every library once, in turn, in a fresh process; the
figures are medians over the rounds, the ratio the median of the per-round ratios.

    python3 bench/bench_long_prompt.py --shape qwen2.5-0.5b --lengths 512,2048,8192 \\
        [--before OLD/libfastllm.so] [--rounds 3] [--gen 64]

--gen N also generates N tokens after each prompt: decoding at that depth (tgN@depth; llama-bench's -d).
--from_state (with --gen) evaluates each prompt once, saves the session's state, and has every round
load it and only generate: decoding at depth in more rounds than the prompts' time would allow
(the state's format must be the same in both builds).
--step_rows 1,6,17 also times passes of that many rows after each prompt (a speculative step's token
and drafts, or a short turn; `--step_reps` passes each, the cache truncated back after each): rows a
second of the median pass (stepK@depth). --flm PATH takes that model instead of a random shape.

The model is a random-weight checkpoint of the shape, converted by this tree's converter (cached in
--work_dir). Nothing is downloaded.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))
sys.path.insert(0, str(REPO))


def step_rows(s, prompt, rows: list[int], reps: int, n: int, out: dict) -> None:
    """Passes of k rows after the n tokens in s (the cache truncated back after each): rows/s of the median."""
    extra = prompt[:max(rows)]  # any tokens will do: the pass's cost, not its text
    for k in rows:
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            s.eval(extra[:k], logits="all")
            times.append(time.perf_counter() - t0)
            s.truncate(n)
        out[f"step{k}@{n}"] = k / statistics.median(times)


def child(flm: str, lengths: list[int], threads: int, n_batch: int, n_gen: int, state: str | None,
          rows: list[int], reps: int) -> None:
    from fastllm import Model
    from fastllm.bench import synthetic_prompt
    out = {}
    with Model(flm, threads=threads) as m:
        info = m.info
        if state:  # decoding only, from the saved prompts (made first if missing)
            for n in lengths:
                path = f"{state}-{n}.bin"
                with m.session(n_ctx=n + n_gen + 8, n_batch=n_batch) as s:
                    if not os.path.exists(path):
                        s.eval(synthetic_prompt(info["vocab_size"], n, info["bos_id"]))
                        s.save_state_file(path)
                        continue
                    s.load_state_file(path)
                    s.generate([], 4, temperature=0.0, ignore_eos=True)  # the weights' pages faulted in
                    s.generate([], n_gen, temperature=0.0, ignore_eos=True)
                    r = s.last_result
                    out[f"tg{n_gen}@{n}"] = r.n_generated_tokens / (r.generate_ms / 1000)
            print(json.dumps(out))
            return
        # a pass first, so that no length pays for faulting in the mapped weights (it made the first
        # length's figure swing by 30%)
        with m.session(n_ctx=72, n_batch=64) as s:
            s.eval(synthetic_prompt(info["vocab_size"], 64, info["bos_id"]))
        for n in lengths:
            prompt = synthetic_prompt(info["vocab_size"], n, info["bos_id"])
            with m.session(n_ctx=n + max([n_gen] + rows) + 8, n_batch=n_batch) as s:
                t0 = time.perf_counter()
                s.eval(prompt)
                out[f"pp{n}"] = n / (time.perf_counter() - t0)
                if rows:
                    step_rows(s, prompt, rows, reps, n, out)
                if n_gen:
                    s.generate([], n_gen, temperature=0.0, ignore_eos=True)
                    r = s.last_result
                    out[f"tg{n_gen}@{n}"] = r.n_generated_tokens / (r.generate_ms / 1000)
    print(json.dumps(out))


def main() -> int:
    from bench_before_after import cpu_name
    from bench_llamacpp import SHAPES, random_checkpoint
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", choices=sorted(SHAPES), default="qwen2.5-0.5b")
    ap.add_argument("--dtype", default="int8", help="converter --dtype")
    ap.add_argument("--lengths", default="512,2048,8192")
    ap.add_argument("--before", type=Path, help="a baseline libfastllm.so to compare with")
    ap.add_argument("--after", type=Path, default=REPO / "build" / "libfastllm.so")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--n_batch", type=int, default=512)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--gen", type=int, default=0,
                    help="also generate this many tokens after each prompt: decoding at that depth (tgN@depth)")
    ap.add_argument("--from_state", action="store_true",
                    help="with --gen: the prompts evaluated once and saved; the rounds load them and only generate")
    ap.add_argument("--step_rows", default="", help="also time passes of these many rows after each prompt")
    ap.add_argument("--step_reps", type=int, default=15)
    ap.add_argument("--flm", type=Path, help="this model rather than a random one of --shape")
    ap.add_argument("--work_dir", type=Path, default=Path("/tmp/fastllm-bench"))
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--state", help=argparse.SUPPRESS)
    args = ap.parse_args()
    lengths = [int(n) for n in args.lengths.split(",")]
    rows = [int(k) for k in args.step_rows.split(",") if k]
    if args.child:
        child(args.child, lengths, args.threads, args.n_batch, args.gen, args.state, rows, args.step_reps)
        return 0
    if args.from_state and not args.gen:
        ap.error("--from_state needs --gen")
    from converter.convert import convert
    args.work_dir.mkdir(parents=True, exist_ok=True)
    flm = args.flm or args.work_dir / f"random-{args.shape}-{args.dtype}.flm"
    if not flm.exists():
        convert(str(random_checkpoint(args.shape, args.work_dir)), str(flm), dtype=args.dtype, progress=False)
    libs = {"after": args.after} if args.before is None else {"before": args.before, "after": args.after}
    model = args.flm.name if args.flm else f"random {args.shape} {args.dtype}"
    print(f"{cpu_name()}, {args.threads} threads; {model}, {args.n_batch} tokens a pass, "
          f"{args.rounds} rounds" + (", decoding from saved prompts" if args.from_state else ""))

    def run(lib: Path) -> dict | None:
        env = dict(os.environ, FASTLLM_LIBRARY=str(lib), PYTHONPATH=str(REPO / "bindings" / "python"))
        cmd = [sys.executable, __file__, "--child", str(flm), "--lengths", args.lengths, "--threads", str(args.threads),
               "--n_batch", str(args.n_batch), "--gen", str(args.gen), "--step_rows", args.step_rows,
               "--step_reps", str(args.step_reps)]
        if args.from_state:
            cmd += ["--state", str(args.work_dir / f"state-{flm.stem}")]
        p = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if p.returncode != 0:
            print(p.stderr, file=sys.stderr)
            return None
        return json.loads(p.stdout)

    if args.from_state and run(args.after) is None:  # saves the prompts not saved before
        return 1
    got: dict[str, list[dict]] = {k: [] for k in libs}
    for r in range(args.rounds):
        for name, lib in libs.items():
            out = run(lib)
            if out is None:
                return 1
            got[name].append(out)
            print(f"  round {r + 1} {name}: " + ", ".join(f"{k} {v:.1f}" for k, v in got[name][-1].items()), flush=True)
    keys = list(got["after"][0])
    for name in libs:
        med = {k: statistics.median(x[k] for x in got[name]) for k in keys}
        # each figure's share of the shortest length's: prompts of pp, generation of tg at the least depth
        first: dict[str, float] = {}
        for k in keys:
            first.setdefault(k[:2], med[k])
        print(f"{name:>6}: " + ", ".join(f"{k} {v:.1f} tok/s ({100 * v / first[k[:2]]:.0f}%)" for k, v in med.items()))
    if "before" in libs:
        print(" ratio: " + ", ".join(
            f"{k} {statistics.median(a[k] / b[k] for a, b in zip(got['after'], got['before'])):.3f}x" for k in keys))
    return 0


if __name__ == "__main__":
    sys.exit(main())
