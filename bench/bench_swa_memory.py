"""KV cache memory of a session whose sliding-window layers keep only their window, against one
keeping every position (swa_full, as llama.cpp's --swa-full), on a random model of Gemma-3-1B's shape
(26 layers, 22 with a window of 512, 1 KV head of 256).

    python3 bench/bench_swa_memory.py [--n_ctx 8192] [--dtype int4] [--kv_type f16]

Each session evaluates n_ctx - 64 prompt tokens, then generates 64; the script prints what
fastllm_session_memory reports (kv_bytes held, kv_capacity_bytes at a full n_ctx), the ratio, and
the prompt time (the windowed session drops blocks as it goes, the other does not).
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "bench"), str(REPO / "bindings" / "python"), str(REPO)]
from bench_speed import random_checkpoint  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", default="gemma3-1b")
    ap.add_argument("--n_ctx", type=int, default=8192)
    ap.add_argument("--dtype", default="int4", help="weights (the KV cache does not depend on them)")
    ap.add_argument("--kv_type", default="f16")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--work_dir", type=Path, default=Path(tempfile.gettempdir()) / "fastllm-bench")
    args = ap.parse_args()

    import fastllm
    from converter.convert import convert
    from fastllm.bench import synthetic_prompt
    args.work_dir.mkdir(parents=True, exist_ok=True)
    hf_dir = random_checkpoint(args.shape, args.work_dir)
    flm = args.work_dir / f"random-{args.shape}-{args.dtype}.flm"
    if not flm.exists():
        convert(str(hf_dir), str(flm), dtype=args.dtype, progress=False)
    with fastllm.Model(flm, threads=args.threads) as m:
        prompt = synthetic_prompt(m.vocab_size, args.n_ctx - 64, 1)
        rows = {}
        for swa_full in (False, True):
            with m.session(n_ctx=args.n_ctx, n_batch=512, kv_type=args.kv_type, swa_full=swa_full) as s:
                t0 = time.perf_counter()
                s.eval(prompt, logits=None)
                prompt_s = time.perf_counter() - t0
                s.generate(prompt[-1:], max_new_tokens=63, temperature=0, ignore_eos=True)
                rows[swa_full] = (s.memory(), prompt_s, s.n_tokens)
    mib = 1 << 20
    print(f"random {args.shape} ({args.dtype} weights), KV {args.kv_type}, n_ctx {args.n_ctx}, {args.threads} threads")
    print(f"{'':<22}{'tokens':>8}{'kv held MiB':>13}{'capacity MiB':>14}{'prompt s':>10}")
    for swa_full, name in ((False, "windows only"), (True, "swa_full")):
        mem, prompt_s, n = rows[swa_full]
        print(f"{name:<22}{n:>8}{mem['kv_bytes'] / mib:>13.1f}{mem['kv_capacity_bytes'] / mib:>14.1f}{prompt_s:>10.1f}")
    ring, full = rows[False][0], rows[True][0]
    print(f"ratio (swa_full / windows only): held {full['kv_bytes'] / ring['kv_bytes']:.2f}x, "
          f"capacity {full['kv_capacity_bytes'] / ring['kv_capacity_bytes']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
