"""One build of libfastllm against another, same model, same machine, same run: for a change that
must not cost speed or memory (a refactor), the baseline built from the commit before it.

    git worktree add /tmp/before <commit> && cmake -S /tmp/before -B /tmp/before/build -DCMAKE_BUILD_TYPE=Release \\
        && cmake --build /tmp/before/build -j2
    python3 bench/bench_before_after.py --before /tmp/before/build/libfastllm.so --shape 110m --repeat 5

Or one build at two kernel levels (FASTLLM_ISA), e.g. the AMX tiles against AVX-512 VNNI:

    python3 bench/bench_before_after.py --before_isa avx512 --shape tinyllama --n_prompt 512 --n_gen 16

Each round runs the two libraries one after the other (alternating which goes first) in fresh
processes on the same .flm (converted by this tree's converter from a random-weight checkpoint of
the shape): prompt tokens/s (pp, one eval of n_prompt tokens), generation tokens/s (tg, n_gen greedy
tokens after the prompt), and the process's peak RSS. Prints each round's after/before ratios and
their medians.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "bench"), str(REPO)]
from bench_speed import SHAPES, random_checkpoint  # noqa: E402

ROUND = """
import json, sys, time
sys.path.insert(0, {python!r})
import fastllm
from fastllm.bench import bench
r = bench({model!r}, n_prompt={n_prompt}, n_gen={n_gen}, threads={threads}, repeat=1)
hwm = open("/proc/self/status").read().split("VmHWM:")[1].split()[0]
print(json.dumps({{"pp": r.prompt_tok_s, "tg": r.generate_tok_s, "rss": int(hwm) / 1024}}))
"""


def cpu_name() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def one_round(lib: Path, model: Path, args, isa: str | None) -> dict:
    code = ROUND.format(python=str(REPO / "bindings" / "python"), model=str(model), n_prompt=args.n_prompt,
                        n_gen=args.n_gen, threads=args.threads)
    env = dict(os.environ, FASTLLM_LIBRARY=str(lib))
    env.pop("FASTLLM_ISA", None)
    if isa:
        env["FASTLLM_ISA"] = isa
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", type=Path, help="the baseline's libfastllm.so (default: --after's)")
    ap.add_argument("--after", type=Path, default=REPO / "build" / "libfastllm.so")
    ap.add_argument("--before_isa", help="FASTLLM_ISA for the baseline's runs (scalar, avx2, avx512, ...)")
    ap.add_argument("--after_isa", help="FASTLLM_ISA for the other runs (default: the CPU's best level)")
    ap.add_argument("--shape", choices=sorted(SHAPES), default="110m")
    ap.add_argument("--variants", default="int8,q4_k_m", help="converter --dtype values, comma-separated")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--n_prompt", type=int, default=128)
    ap.add_argument("--n_gen", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--work_dir", type=Path, default=Path(tempfile.gettempdir()) / "fastllm-bench")
    args = ap.parse_args()
    if args.before is None and args.before_isa is None:
        ap.error("give --before (another build) or --before_isa (another kernel level), or both")
    args.before = args.before or args.after
    for lib in (args.before, args.after):
        if not lib.is_file():
            ap.error(f"{lib} is not a file")
    from converter.convert import convert
    args.work_dir.mkdir(parents=True, exist_ok=True)
    hf = random_checkpoint(args.shape, args.work_dir)
    print(f"{cpu_name()}, {args.threads} threads; {args.shape}, pp{args.n_prompt}, tg{args.n_gen}, "
          f"{args.repeat} rounds alternating\n  before {args.before} (ISA {args.before_isa or 'best'})\n"
          f"  after  {args.after} (ISA {args.after_isa or 'best'})")
    for variant in args.variants.split(","):
        model = args.work_dir / f"{args.shape}-{variant}.flm"
        if not model.exists():
            convert(str(hf), str(model), dtype=variant, progress=False)
        rounds = []
        for i in range(args.repeat):
            order = ("before", "after") if i % 2 == 0 else ("after", "before")
            got = {side: one_round(args.before if side == "before" else args.after, model, args,
                                   args.before_isa if side == "before" else args.after_isa) for side in order}
            rounds.append(got)
            print(f"  {variant} round {i + 1}: pp {got['before']['pp']:.1f} -> {got['after']['pp']:.1f} "
                  f"({got['after']['pp'] / got['before']['pp']:.3f}x), tg {got['before']['tg']:.2f} -> "
                  f"{got['after']['tg']:.2f} ({got['after']['tg'] / got['before']['tg']:.3f}x), peak RSS "
                  f"{got['before']['rss']:.0f} -> {got['after']['rss']:.0f} MiB", flush=True)
        med = {k: statistics.median(r["after"][k] / r["before"][k] for r in rounds) for k in ("pp", "tg", "rss")}
        side = {s: {k: statistics.median(r[s][k] for r in rounds) for k in ("pp", "tg", "rss")}
                for s in ("before", "after")}
        print(f"{variant}: pp {side['before']['pp']:.1f} -> {side['after']['pp']:.1f} tok/s (median ratio "
              f"{med['pp']:.3f}x), tg {side['before']['tg']:.2f} -> {side['after']['tg']:.2f} tok/s "
              f"({med['tg']:.3f}x), peak RSS {side['before']['rss']:.0f} -> {side['after']['rss']:.0f} MiB "
              f"({med['rss']:.3f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
