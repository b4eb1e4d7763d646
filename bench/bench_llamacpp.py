"""fastllm against llama.cpp on the same random-weight model, same machine, same run.

    python3 bench/bench_llamacpp.py --shape 110m --llama_cpp /path/to/llama.cpp
    python3 bench/bench_llamacpp.py --shape tinyllama --llama_cpp /path/to/llama.cpp --repeat 3
    python3 bench/bench_llamacpp.py --shape gemma3-1b --llama_cpp /path/to/llama.cpp --variants int8,int4

--llama_cpp is a llama.cpp source tree built outside this repository (it needs
build/bin/llama-bench, build/bin/llama-quantize and convert_hf_to_gguf.py); without it the llama.cpp
rows are skipped, saying so. Pairs: fastllm int8 vs Q8_0 (int8 keeps the output head at f16, more
bytes than Q8_0's Q8_0 head), fastllm int8 with its head at q8 vs Q8_0 (equal bits), fastllm int4
(g32) vs Q4_0 (int4 keeps the head at q8, more bytes than Q4_0's Q6_K head), fastllm int4 with its
head at q6 vs Q4_0 (about equal bytes), fastllm int4 g128 (4.125 bits) vs Q4_0, and the K presets
against llama.cpp's of the same name (q4_k_m vs Q4_K_M, q4_k_s vs Q4_K_S, q3_k_m vs Q3_K_M, q5_k_m
vs Q5_K_M, q5_k_s vs Q5_K_S, q6_k vs Q6_K; each made by its own converter from the same checkpoint,
no imatrix). For each pair the two engines take turns, one round each, --repeat times. Generation
starts from an empty context in both (llama-bench's tg test; fastllm.bench's gen_from_empty). Prints
prompt tok/s (pp) and generation tok/s (tg) (medians), the median of the per-round ratios, weight
bytes read per generated token, the fraction of the read-bandwidth limit (measured here) that tg
reaches, and fastllm's peak RSS and warm load time.

--depth D measures generation after D tokens of context instead (the pp column is then the D-token
prompt's rate): fastllm evaluates a D-token prompt and generates after it; llama.cpp runs
`llama-bench -d D -p 0` with flash attention (-fa 1), its fastest at depth. tg at depth is what a
long conversation or a document tool decodes at.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "bench"), str(REPO / "bindings" / "python"), str(REPO)]
from bench_speed import SHAPES, random_checkpoint  # noqa: E402
from fastllm.bench import bench  # noqa: E402

# (name, --dtype, --group_size, --dtype_config, the llama.cpp file to compare with)
FASTLLM_VARIANTS = [("int8", "int8", 32, [], "Q8_0"), ("int8_q8head", "int8", 32, ["output.weight=q8"], "Q8_0"),
                    ("int4", "int4", 32, [], "Q4_0"), ("int4_q6head", "int4", 32, ["output.weight=q6"], "Q4_0"),
                    ("int4_g128", "int4", 128, [], "Q4_0"),
                    ("q4_k_m", "q4_k_m", 32, [], "Q4_K_M"), ("q4_k_s", "q4_k_s", 32, [], "Q4_K_S"),
                    ("q3_k_m", "q3_k_m", 32, [], "Q3_K_M"), ("q5_k_m", "q5_k_m", 32, [], "Q5_K_M"),
                    ("q5_k_s", "q5_k_s", 32, [], "Q5_K_S"), ("q6_k", "q6_k", 32, [], "Q6_K")]


class ReadBandwidth:
    """GB/s of reading a buffer far larger than the caches, split over threads: the median of `repeat`
    passes of numpy's maximum over bytes (a SIMD reduction that streams at the memory's rate; on a
    2-core AVX2 EPYC, summing float64 as this bench did before read 83-87% of its figure, which
    overstated every engine's share of the bandwidth)."""

    def __init__(self, threads: int, gib: float = 1.0):
        self.a = np.ones(int(gib * (1 << 30)), dtype=np.uint8)
        self.parts = np.array_split(self.a, threads)

    def __call__(self, repeat: int = 5) -> float:
        out = []
        for _ in range(repeat + 1):
            ts = [threading.Thread(target=np.max, args=(p,)) for p in self.parts]
            t0 = time.perf_counter()
            for t in ts:
                t.start()
            for t in ts:
                t.join()
            out.append(self.a.nbytes / (time.perf_counter() - t0) / 1e9)
        return statistics.median(out[1:])


def bytes_per_token(path: Path) -> int:
    """Weight bytes one decode step reads: every tensor but the embedding (one row of it)."""
    from converter.flm_reader import load_flm
    f = load_flm(path)
    arch = f.metadata["general.architecture"]
    tied = f.metadata.get(f"{arch}.tie_word_embeddings", 0)
    return sum(loc.n_bytes for name, loc in f.locations.items() if name != "token_embd.weight" or tied)


def gguf_bytes_per_token(path: Path) -> int:
    import gguf
    tensors = {t.name: int(t.n_bytes) for t in gguf.GGUFReader(str(path)).tensors}
    tied = "output.weight" not in tensors
    return sum(n for name, n in tensors.items() if name != "token_embd.weight" or tied)


def fastllm_memory(path: Path, threads: int) -> tuple[float, float]:
    """(peak RSS MiB, warm load ms) of a fresh process that loads the model and generates 64 tokens."""
    code = f"""
import sys, time
sys.path.insert(0, {str(REPO / 'bindings' / 'python')!r})
import fastllm
fastllm.Model({str(path)!r}).close()                # warms the page cache
t0 = time.perf_counter(); m = fastllm.Model({str(path)!r}, threads={threads}); load = time.perf_counter() - t0
with m.session(n_ctx=256) as s:
    s.generate([1, 2, 3], 64, temperature=0.0, ignore_eos=True)
hwm = open("/proc/self/status").read().split("VmHWM:")[1].split()[0]  # peak RSS of this process image, kB
print(int(hwm) / 1024, load * 1000)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    return float(out[0]), float(out[1])


def llama_cpp_models(llama_cpp: Path, hf_dir: Path, work: Path, types) -> dict[str, Path]:
    f16 = work / f"{hf_dir.name}-f16.gguf"
    if not f16.exists():
        subprocess.run([sys.executable, str(llama_cpp / "convert_hf_to_gguf.py"), str(hf_dir), "--outfile", str(f16),
                        "--outtype", "f16"], check=True, capture_output=True)
    models = {}
    for q in sorted(types):
        out = work / f"{hf_dir.name}-{q}.gguf"
        if not out.exists():
            subprocess.run([str(llama_cpp / "build" / "bin" / "llama-quantize"), str(f16), str(out), q], check=True,
                           capture_output=True)
        models[q] = out
    return models


def bench_llama_cpp(llama_cpp: Path, gguf: Path, threads: int, n_prompt: int, n_gen: int, repeat: int,
                    depth: int = 0):
    """(pp, tg) tokens/s of llama-bench (its own warm-up run, then `repeat` measured ones); with depth,
    (nan, tg after depth tokens of context, flash attention on)."""
    extra = ["-d", str(depth), "-fa", "1"] if depth else []
    r = subprocess.run([str(llama_cpp / "build" / "bin" / "llama-bench"), "-m", str(gguf), "-t", str(threads),
                        "-p", str(0 if depth else n_prompt), "-n", str(n_gen), "-r", str(repeat), "-o", "json", *extra],
                       check=True, capture_output=True, text=True)
    rows = json.loads(r.stdout)
    pp = next((x["avg_ts"] for x in rows if x["n_prompt"] > 0), float("nan"))
    tg = next(x["avg_ts"] for x in rows if x["n_gen"] > 0)
    return pp, tg


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", choices=sorted(SHAPES), default="110m")
    ap.add_argument("--llama_cpp", type=Path, help="llama.cpp source tree with a build/ (outside this repo)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt_len", type=int, default=128)
    ap.add_argument("--gen", type=int, default=64)
    ap.add_argument("--depth", type=int, default=0, help="generation after this many tokens of context")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--work_dir", type=Path, default=Path("/tmp/fastllm-bench"))
    ap.add_argument("--variants", help="comma-separated fastllm variants to run (default: all: "
                    + ", ".join(v[0] for v in FASTLLM_VARIANTS) + ")")
    args = ap.parse_args()
    variants = FASTLLM_VARIANTS
    if args.variants:
        names = args.variants.split(",")
        unknown = sorted(set(names) - {v[0] for v in FASTLLM_VARIANTS})
        if unknown:
            ap.error(f"unknown variants {', '.join(unknown)}")
        variants = [v for v in FASTLLM_VARIANTS if v[0] in names]

    from converter.convert import convert
    args.work_dir.mkdir(parents=True, exist_ok=True)
    hf_dir = random_checkpoint(args.shape, args.work_dir)
    read_bw = ReadBandwidth(args.threads)
    bw = read_bw()
    if args.depth:
        args.prompt_len = args.depth
    print(f"model random-{args.shape}, {args.threads} threads, pp{args.prompt_len} / tg{args.gen}"
          f"{f' after {args.depth} tokens of context' if args.depth else ''}, "
          f"read bandwidth {bw:.1f} GB/s (median; measured again each round, beside the engines: "
          f"'% of bw' is the median of the rounds' shares)")

    have_llama = args.llama_cpp is not None and (args.llama_cpp / "build" / "bin" / "llama-bench").exists()
    gguf = llama_cpp_models(args.llama_cpp, hf_dir, args.work_dir, {v[4] for v in variants}) if have_llama else {}
    if not have_llama:
        print("llama.cpp: skipped (pass --llama_cpp PATH to a built llama.cpp tree)")

    print(f"{'engine':<22}{'MiB':>8}{'pp tok/s':>10}{'tg tok/s':>10}{'MB/token':>10}{'% of bw':>9}{'RSS MiB':>9}{'load ms':>9}")
    for name, dtype, group, dtype_config, peer in variants:
        flm = args.work_dir / f"random-{args.shape}-{name}.flm"
        if not flm.exists():
            convert(str(hf_dir), str(flm), dtype=dtype, group_size=group, dtype_config=dtype_config,
                    progress=False)
        peer_file = gguf.get(peer)
        # fastllm and llama.cpp take turns, one round each (the host's bandwidth drifts over tens of
        # seconds, so back-to-back blocks of runs can land in different phases)
        ours, theirs, bws = [], [], []
        for _ in range(args.repeat):
            bws.append(read_bw(3))
            r = bench(flm, args.prompt_len, args.gen, args.threads, 1, gen_from_empty=not args.depth)  # as llama-bench
            ours.append((r.prompt_tok_s, r.generate_tok_s))
            if peer_file:
                theirs.append(bench_llama_cpp(args.llama_cpp, peer_file, args.threads, args.prompt_len, args.gen, 1,
                                              args.depth))
        pp, tg = (statistics.median(x[i] for x in ours) for i in (0, 1))
        mb = bytes_per_token(flm) / 1e6
        rss, load = fastllm_memory(flm, args.threads)
        share = statistics.median(mb * o[1] / 1e3 / b for o, b in zip(ours, bws))
        print(f"{'fastllm ' + name:<22}{flm.stat().st_size / 2**20:8.0f}{pp:10.1f}{tg:10.1f}{mb:10.1f}"
              f"{100 * share:8.0f}%{rss:9.0f}{load:9.1f}")
        if peer_file:
            lpp, ltg = (statistics.median(x[i] for x in theirs) for i in (0, 1))
            lmb = gguf_bytes_per_token(peer_file) / 1e6
            lshare = statistics.median(lmb * t[1] / 1e3 / b for t, b in zip(theirs, bws))
            print(f"{'  llama.cpp ' + peer:<22}{peer_file.stat().st_size / 2**20:8.0f}{lpp:10.1f}{ltg:10.1f}{lmb:10.1f}"
                  f"{100 * lshare:8.0f}%")
            ratio = [statistics.median(o[i] / t[i] for o, t in zip(ours, theirs)) for i in (0, 1)]
            print(f"{'  ratio, per round':<22}{'':8}{ratio[0]:9.2f}x{ratio[1]:9.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
