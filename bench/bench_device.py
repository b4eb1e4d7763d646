"""The Vulkan backend against the CPU backend on the same machine, same model, same run: prompt
tokens/s (pp, one eval of n_prompt tokens) and generation tokens/s (tg, n_gen greedy tokens), each
round in fresh processes, alternating which device goes first; prints each round and the medians,
with the GPU's and the CPU's names.

    python3 bench/bench_device.py --shape tinyllama --variants f16,int8,q4_k_m --n_prompt 512 --n_gen 128 [--profile]

--profile adds a round with FASTLLM_VULKAN_PROFILE=1 and prints each shader's device time.

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


def one_round(model: Path, device: str, args, profile: bool = False) -> dict:
    code = ROUND.format(python=str(REPO / "bindings" / "python"), model=str(model), n_prompt=args.n_prompt,
                        n_gen=args.n_gen, threads=args.threads, device=device, profile=profile)
    env = dict(os.environ, FASTLLM_VULKAN_PROFILE="1") if profile else None
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
        rounds = {"cpu": [], args.device: []}
        for i in range(args.repeat + 1):
            order = ["cpu", args.device] if i % 2 == 0 else [args.device, "cpu"]
            for device in order:
                r = one_round(model, device, args)
                if i > 0:
                    rounds[device].append(r)
                print(f"  {variant} round {i} {device:8s} pp {r['pp']:9.1f}  tg {r['tg']:8.2f}  ({r['backend']})", flush=True)
        med = {d: (statistics.median(x["pp"] for x in v), statistics.median(x["tg"] for x in v)) for d, v in rounds.items()}
        (cp, ct), (gp, gt) = med["cpu"], med[args.device]
        print(f"{variant}: cpu pp {cp:.1f} tg {ct:.2f} | {args.device} pp {gp:.1f} tg {gt:.2f} | "
              f"{args.device}/cpu pp {gp / cp:.2f}x tg {gt / ct:.2f}x", flush=True)
        if args.profile:  # apart from the timed rounds: the timestamps add a little work to each dispatch
            print(f"  {variant} profile (pp{args.n_prompt} + tg{args.n_gen}):", flush=True)
            one_round(model, args.device, args, profile=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
