"""The library's quantizer (fastllm_quantize) alone: ns a weight on one thread for each quantized
dtype, at several FASTLLM_ISA levels (the symmetric search's width: 16 groups a vector with AVX-512,
8 with AVX2, 4 at scalar), alternating the levels in each round.

    python3 bench/bench_quantize.py [--dtypes q8,q4,q4_g128,q4k] [--isa best,avx2,scalar] [--rounds 3]

The matrix is random normal (512 x 4096, scale 0.02, seed 0). Each figure is the median over the
rounds of the best of 3 calls; the ratio is the median of the per-round ratios to the first level.
Every level's bytes are checked to be the same.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "bench"), str(REPO)]
from bench_before_after import cpu_name  # noqa: E402
from converter import quantize  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dtypes", default="q8,q4,q4_g128,q4m,q4k,q6k")
    ap.add_argument("--isa", default="best,avx2,scalar", help="FASTLLM_ISA levels; best: unset")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--rows", type=int, default=512)
    ap.add_argument("--cols", type=int, default=4096)
    args = ap.parse_args()
    lib = quantize.native()
    if lib is None:
        print("libfastllm not found (build it, or set FASTLLM_LIBRARY)", file=sys.stderr)
        return 1
    w = (np.random.default_rng(0).standard_normal((args.rows, args.cols)) * 0.02).astype(np.float32)
    levels = args.isa.split(",")
    times = {(d, l): [] for d in args.dtypes.split(",") for l in levels}
    outputs = {}

    def run(dtype: str) -> tuple[float, bytes]:
        size = quantize.tensor_bytes(dtype, w.shape)
        out = np.empty(size, np.uint8)
        best = float("inf")
        for _ in range(3):
            t = time.perf_counter()
            status = lib.fastllm_quantize(dtype.encode(), w.ctypes.data, args.rows, args.cols, 0, args.rows, 1,
                                          out.ctypes.data, size)
            best = min(best, time.perf_counter() - t)
            if status != 0:
                raise SystemExit(f"fastllm_quantize {dtype}: {lib.fastllm_last_error().decode()}")
        return best / w.size * 1e9, out.tobytes()

    for _ in range(args.rounds):
        for dtype in args.dtypes.split(","):
            for level in levels:
                if level == "best":
                    os.environ.pop("FASTLLM_ISA", None)
                else:
                    os.environ["FASTLLM_ISA"] = level
                ns, data = run(dtype)
                times[(dtype, level)].append(ns)
                if outputs.setdefault(dtype, data) != data:
                    raise SystemExit(f"{dtype}: FASTLLM_ISA={level} gave other bytes")
    os.environ.pop("FASTLLM_ISA", None)
    print(f"{args.rows} x {args.cols}, one thread, {cpu_name()}; medians of {args.rounds} rounds, ns a weight")
    print("| dtype | " + " | ".join(levels) + " |\n|---|" + "---|" * len(levels))
    for dtype in args.dtypes.split(","):
        base = times[(dtype, levels[0])]
        cells = []
        for level in levels:
            t = times[(dtype, level)]
            ratio = statistics.median(a / b for a, b in zip(t, base))
            cells.append(f"{statistics.median(t):.1f}" + ("" if level == levels[0] else f" ({ratio:.2f}x)"))
        print(f"| {dtype} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
