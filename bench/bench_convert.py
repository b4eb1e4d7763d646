"""How long the converter takes against llama.cpp's llama-quantize, same model, same machine, same run.

    python3 bench/bench_convert.py --shape tinyllama --llama_cpp /path/to/llama.cpp --repeat 3
    python3 bench/bench_convert.py --shape 110m --llama_cpp /path/to/llama.cpp --numpy

Pairs: fastllm int8 vs Q8_0, int4 vs Q4_0, q4_k_m vs Q4_K_M (--pairs picks). fastllm converts the
random-weight HF folder (float32, as bench_speed.py makes it) and, with --from_gguf, the f16 GGUF
that llama.cpp's convert_hf_to_gguf.py made of it, which is what llama-quantize starts from (its
time excludes making that GGUF), and with --from_bf16 a bfloat16 copy of the folder (as most
HuggingFace checkpoints are stored; made once, beside the float32 one). Each round runs every
variant once, in turn; the figures are the medians of wall seconds over --repeat rounds and the
median of the per-round ratios to llama-quantize. --numpy also times the converter with its numpy
search (FASTLLM_CONVERTER_NATIVE=0, the reference twin of the library's quantizer: the same bytes,
slower). llama-quantize runs on --threads threads; the converter's quantizer takes one per core.

Every run writes to a path that does not exist: the output is removed before each. llama-quantize
truncates an existing output and writes into the pages that frees, while the converter writes a
temporary file and renames it over the old one (so a failed conversion loses nothing), which needs
as many pages again while the old file holds its own. On a VM that hands free memory back to its
host, those pages are slow to touch: a 1.1B int8 conversion took 12.4-17.5 s with the old output
in place and 7.5-7.7 s without it (6.6-11.3 s of system time against 1.4; 2026-12-05, Intel Xeon,
2 cores), the difference all in copying the file's bytes into the page cache.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "bench"), str(REPO / "bindings" / "python"), str(REPO)]
from bench_before_after import cpu_name  # noqa: E402
from bench_speed import SHAPES, random_checkpoint  # noqa: E402

PAIRS = {"int8": "Q8_0", "int4": "Q4_0", "q4_k_m": "Q4_K_M"}


def timed(cmd, env=None) -> float:
    t = time.perf_counter()
    subprocess.run([str(c) for c in cmd], check=True, capture_output=True, env=env)
    return time.perf_counter() - t


def bf16_copy(hf: Path) -> Path:
    """hf's weights as bfloat16 (rounded by torch), its other files as they are."""
    import json
    import shutil

    import torch
    from safetensors.torch import load_file, save_file
    out = hf.with_name(hf.name + "-bf16")
    if (out / "model.safetensors").exists():
        return out
    out.mkdir(exist_ok=True)
    for f in hf.iterdir():
        if f.name != "model.safetensors":
            shutil.copy(f, out / f.name)
    save_file({k: v.to(torch.bfloat16) for k, v in load_file(hf / "model.safetensors").items()},
              out / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((out / "config.json").read_text())
    config["torch_dtype"] = config["dtype"] = "bfloat16"
    (out / "config.json").write_text(json.dumps(config, indent=2))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", choices=sorted(SHAPES), default="110m")
    ap.add_argument("--llama_cpp", type=Path, required=True, help="llama.cpp source tree with build/bin/llama-quantize")
    ap.add_argument("--pairs", default=",".join(PAIRS), help="comma-separated fastllm dtypes: " + ", ".join(PAIRS))
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--from_gguf", action="store_true", help="also convert the f16 GGUF with fastllm's converter")
    ap.add_argument("--from_bf16", action="store_true", help="also convert a bfloat16 copy of the folder")
    ap.add_argument("--numpy", action="store_true", help="also time the converter's numpy search")
    ap.add_argument("--work_dir", type=Path, default=Path("/tmp/fastllm-bench"))
    args = ap.parse_args()
    args.work_dir.mkdir(parents=True, exist_ok=True)
    hf = random_checkpoint(args.shape, args.work_dir)
    f16 = args.work_dir / f"{hf.name}-f16.gguf"
    if not f16.exists():
        subprocess.run([sys.executable, args.llama_cpp / "convert_hf_to_gguf.py", hf, "--outfile", f16, "--outtype", "f16"],
                       check=True, capture_output=True)
    bf16 = bf16_copy(hf) if args.from_bf16 else None
    quantize = args.llama_cpp / "build" / "bin" / "llama-quantize"
    out = args.work_dir / "bench-convert.out"
    env = dict(os.environ)
    numpy_env = dict(env, FASTLLM_CONVERTER_NATIVE="0")
    convert = lambda src, dtype: [sys.executable, REPO / "converter" / "convert.py", "--model_path", src,
                                  "--out_path", out, "--dtype", dtype, "--quiet"]
    variants = {}  # name -> (command, env), in the order of a round
    for dtype in args.pairs.split(","):
        variants[f"llama-quantize {PAIRS[dtype]}"] = ([quantize, f16, out, PAIRS[dtype], args.threads], env)
        variants[f"fastllm {dtype}"] = (convert(hf, dtype), env)
        if args.from_gguf:
            variants[f"fastllm {dtype} from the f16 GGUF"] = (convert(f16, dtype), env)
        if bf16 is not None:
            variants[f"fastllm {dtype} from the bf16 folder"] = (convert(bf16, dtype), env)
        if args.numpy:
            variants[f"fastllm {dtype}, numpy search"] = (convert(hf, dtype), numpy_env)
    times = {name: [] for name in variants}
    for r in range(args.repeat):
        for name, (cmd, e) in variants.items():
            out.unlink(missing_ok=True)  # each writes a new file (below)
            times[name].append(timed(cmd, e))
            print(f"round {r + 1}: {name}: {times[name][-1]:.1f} s", flush=True)
    out.unlink(missing_ok=True)
    print(f"\n{args.shape} shape, {cpu_name()}, {os.cpu_count()} cores; medians of {args.repeat} rounds")
    print("| conversion | seconds | ratio to llama-quantize |\n|---|---|---|")
    for name, t in times.items():
        dtype = name.split()[1].rstrip(",")
        base = times.get(f"llama-quantize {PAIRS.get(dtype, '')}")
        ratio = "" if base is None or name.startswith("llama") else \
            f"{statistics.median(a / b for a, b in zip(t, base)):.2f}x"
        print(f"| {name} | {statistics.median(t):.1f} | {ratio} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
