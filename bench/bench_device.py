"""The Vulkan backend against the CPU backend on the same machine, same model, same run: prompt
tokens/s (pp, one eval of n_prompt tokens) and generation tokens/s (tg, n_gen greedy tokens), each
round in fresh processes, alternating which device goes first; prints each round and the medians,
with the GPU's and the CPU's names.

    python3 bench/bench_device.py --shape tinyllama --variants f16,int8,q4_k_m --n_prompt 512 --n_gen 128 [--profile]

--profile adds a round with FASTLLM_VULKAN_PROFILE=1 and prints each shader's device time.
--before OLD.so compares another build's library on the device with this build's (alternating
rounds, both on --device) instead of the device with the CPU: a shader change's before and after.

The models are random-weight checkpoints of the shape (bench_speed.SHAPES), converted by this
tree's converter (needs torch and transformers to make the checkpoint).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "bench"), str(REPO), str(REPO / "bindings" / "python")]

ROUND = """
import json, logging, sys
sys.path.insert(0, {python!r})
if {profile}:  # the Vulkan backend's per-shader table, logged when the model is freed
    class Lines(logging.Handler):
        def emit(self, record):
            if record.getMessage().startswith("vulkan profile"):
                print(record.getMessage(), flush=True)
    logging.getLogger("fastllm").addHandler(Lines())
    logging.getLogger("fastllm").setLevel(logging.INFO)
from fastllm.bench import bench
r = bench({model!r}, n_prompt={n_prompt}, n_gen={n_gen}, threads={threads}, repeat=1, device={device!r})
print(json.dumps({{"pp": r.prompt_tok_s, "tg": r.generate_tok_s, "backend": r.backend}}))
"""


def one_round(model: Path, device: str, args, profile: bool = False, library: Path | None = None) -> dict:
    code = ROUND.format(python=str(REPO / "bindings" / "python"), model=str(model), n_prompt=args.n_prompt,
                        n_gen=args.n_gen, threads=args.threads, device=device, profile=profile)
    env = dict(os.environ)
    if profile:
        env["FASTLLM_VULKAN_PROFILE"] = "1"
    if library:
        env["FASTLLM_LIBRARY"] = str(library)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env).stdout
    lines = out.strip().splitlines()
    for line in lines[:-1] if profile else []:
        print("    " + line, flush=True)
    return json.loads(lines[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="tinyllama")
    ap.add_argument("--variants", default="f16,int8,q4_k_m", help="converter --dtype values")
    ap.add_argument("--n_prompt", type=int, default=512)
    ap.add_argument("--n_gen", type=int, default=128)
    ap.add_argument("--threads", type=int, default=0, help="the CPU backend's (0 = all cores)")
    ap.add_argument("--repeat", type=int, default=2, help="rounds per device after one warm-up")
    ap.add_argument("--device", default="vulkan")
    ap.add_argument("--work_dir", type=Path, default=Path("/tmp/fastllm-device-bench"))
    ap.add_argument("--profile", action="store_true",
                    help="then one more device round with FASTLLM_VULKAN_PROFILE=1: each shader's share of its device time")
    ap.add_argument("--before", type=Path, help="another build's library: its device rounds against this build's, not the CPU's")
    args = ap.parse_args()

    from bench_before_after import cpu_name
    from bench_speed import random_checkpoint
    from converter.convert import convert
    import fastllm
    gpus = [d for d in fastllm.devices() if d["usable"]]
    print(f"GPU: {gpus[0]['name'] if gpus else 'none'}; CPU: {cpu_name()}, {args.threads or os.cpu_count()} threads; "
          f"{args.shape}, pp{args.n_prompt}, tg{args.n_gen}", flush=True)
    args.work_dir.mkdir(parents=True, exist_ok=True)
    hf = random_checkpoint(args.shape, args.work_dir)
    for variant in args.variants.split(","):
        model = args.work_dir / f"{args.shape}-{variant}.flm"
        if not model.exists():
            convert(str(hf), str(model), dtype=variant, progress=False)
        # (label, device, library): the two sides of the comparison, alternating which goes first
        sides = [("before", args.device, args.before.resolve()), ("after", args.device, None)] if args.before else \
            [("cpu", "cpu", None), (args.device, args.device, None)]
        rounds = {label: [] for label, _, _ in sides}
        for i in range(args.repeat + 1):
            for label, device, library in sides if i % 2 == 0 else sides[::-1]:
                r = one_round(model, device, args, library=library)
                if i > 0:
                    rounds[label].append(r)
                print(f"  {variant} round {i} {label:8s} pp {r['pp']:9.1f}  tg {r['tg']:8.2f}  ({r['backend']})", flush=True)
        med = {k: (statistics.median(x["pp"] for x in v), statistics.median(x["tg"] for x in v)) for k, v in rounds.items()}
        (a, (a_pp, a_tg)), (b, (b_pp, b_tg)) = med.items()
        print(f"{variant}: {a} pp {a_pp:.1f} tg {a_tg:.2f} | {b} pp {b_pp:.1f} tg {b_tg:.2f} | "
              f"{b}/{a} pp {b_pp / a_pp:.2f}x tg {b_tg / a_tg:.2f}x", flush=True)
        if args.profile:  # apart from the timed rounds: the timestamps add a little work to each dispatch
            print(f"  {variant} profile (pp{args.n_prompt} + tg{args.n_gen}):", flush=True)
            one_round(model, args.device, args, profile=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
