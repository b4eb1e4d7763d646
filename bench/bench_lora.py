"""LoRA adapters per character: decode tokens/s of N sessions stepping together, each with its own
rank-r adapter on every matrix (q, k, v, o, gate, up, down; --targets qv: peft's default for llama,
q and v), against the same N sessions without adapters, same model, same run, alternating, medians.

    python3 bench/bench_lora.py [--shape 110m] [--dtype int8] [--sessions 8] [--rank 16] [--adapter_dtype f32]
                                [--targets all|qv] [--repeat 3]

With --llama_cpp DIR (a llama.cpp source folder with build/bin/llama-server, llama-quantize and its
convert_*_to_gguf.py), also the servers: fastllm-server --lora against llama-server --lora on the
same weights (int8 / Q8_0 base; the same peft adapters, converted by each project's converter),
N concurrent completions of --gen tokens, each request naming its own adapter by id ("lora":
[{"id": i, "scale": 1}], the syntax both servers take), against the same requests on each server
started without adapters; alternating, medians.

Decoding a few sessions is bound by the bytes a step reads: the base's and every adapter's. The
last line says what that bound allows: base bytes / (base + adapters), with the base's bytes taken
as its file's (an upper bound on what a step reads, so the bound is generous to adapters).

The base is bench_speed.py's random checkpoint of --shape, converted to --dtype; the adapters are
random peft adapters (B not zero) converted with convert.py --adapter. Needs torch, transformers,
peft (requirements.txt).
"""
from __future__ import annotations

import argparse
import ctypes
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "bench"), str(REPO / "bindings" / "python"), str(REPO)]
from bench_before_after import cpu_name  # noqa: E402
from bench_speed import SHAPES, random_checkpoint  # noqa: E402

import fastllm  # noqa: E402
from fastllm import _lib as raw  # noqa: E402


TARGETS = {"all": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
           "qv": ["q_proj", "v_proj"]}


def make_adapters(base: Path, work: Path, n: int, rank: int, dtype: str, targets: str = "all") -> list:
    out = []
    for i in range(n):
        tag = f"r{rank}" + ("" if targets == "all" else f"-{targets}")
        flm = work / f"adapter-{tag}-{dtype}-{i}.flm"
        if not flm.exists():
            import peft
            import torch
            import transformers
            from converter.convert import convert_adapter
            torch.manual_seed(100 + i)
            model = transformers.AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
            pm = peft.get_peft_model(model, peft.LoraConfig(
                r=rank, lora_alpha=2 * rank, init_lora_weights=False, target_modules=TARGETS[targets]))
            pm.save_pretrained(work / f"peft-{tag}-{i}")
            convert_adapter(work / f"peft-{tag}-{i}", base, flm, dtype=dtype)
        out.append(flm)
    return out


def start(cmd: list, ready: str, url_of) -> tuple:
    """Starts a server; (process, base url) once it answers."""
    import subprocess
    import urllib.request
    proc = subprocess.Popen([str(c) for c in cmd], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = url_of(proc)
    for _ in range(600):
        try:
            with urllib.request.urlopen(url + ready, timeout=2) as r:
                if r.status == 200:
                    return proc, url
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise SystemExit(f"{cmd[0]} did not start")


def free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_rate(url: str, n: int, n_gen: int, lora: bool) -> float:
    """Generated tokens/s of n concurrent completions of n_gen tokens (request i with adapter i)."""
    import http.client
    import json
    from concurrent.futures import ThreadPoolExecutor
    from urllib.parse import urlparse
    u = urlparse(url)

    def one(i):
        body = {"model": "bench", "prompt": f"Once upon a time there was a little girl number {i}.", "max_tokens": n_gen,
                "temperature": 0, "ignore_eos": True}
        if lora:
            body["lora"] = [{"id": i, "scale": 1.0}]
        c = http.client.HTTPConnection(u.hostname, u.port, timeout=600)
        c.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
        r = c.getresponse()
        data = json.loads(r.read())
        assert r.status == 200, data
        return data["usage"]["completion_tokens"]
    with ThreadPoolExecutor(n) as pool:
        t0 = time.perf_counter()
        tokens = sum(pool.map(one, range(n)))
        return tokens / (time.perf_counter() - t0)


def bench_servers(args, base: Path, flm: Path, peft_dirs: list, adapters: list) -> None:
    """fastllm-server against llama-server, each without and with N adapters (see the module's doc)."""
    import subprocess
    llama = args.llama_cpp
    sys.path.insert(0, str(REPO / "bench"))
    from bench_llamacpp import llama_cpp_models
    gguf = llama_cpp_models(llama, base, args.work_dir, ["Q8_0"])["Q8_0"]
    loras = []
    for d in peft_dirs:
        outtype = {"int8": "q8_0"}.get(args.adapter_dtype, args.adapter_dtype)
        out = args.work_dir / f"{d.name}-{outtype}.gguf"
        if not out.exists():
            subprocess.run([sys.executable, str(llama / "convert_lora_to_gguf.py"), str(d), "--base", str(base),
                            "--outfile", str(out), "--outtype", outtype], check=True, capture_output=True)
        loras.append(out)
    n_ctx = 64 + args.gen

    def fastllm_server(with_lora):
        port = free_port()
        cmd = [REPO / "build" / "fastllm-server", flm, "--port", port, "--threads", args.threads, "--max-sessions",
               args.sessions, "--n-ctx", n_ctx, "--model-name", "bench"]
        for i, a in enumerate(adapters if with_lora else []):
            cmd += ["--lora", f"a{i}={a}"]
        return start(cmd, "/health", lambda p: f"http://127.0.0.1:{port}")

    def llama_server(with_lora):
        port = free_port()
        cmd = [llama / "build" / "bin" / "llama-server", "-m", gguf, "--port", port, "-t", args.threads, "-np",
               args.sessions, "-c", args.sessions * n_ctx, "--no-webui"]
        for a in loras if with_lora else []:
            cmd += ["--lora", a]
        if with_lora:
            cmd.append("--lora-init-without-apply")  # applied per request, as fastllm's
        return start(cmd, "/health", lambda p: f"http://127.0.0.1:{port}")

    rates = {}
    for _ in range(args.repeat):
        for name, launch in (("fastllm-server", fastllm_server), ("llama-server", llama_server)):
            for with_lora in (False, True):
                proc, url = launch(with_lora)
                try:
                    server_rate(url, args.sessions, 4, with_lora)  # warm-up
                    rates.setdefault((name, with_lora), []).append(server_rate(url, args.sessions, args.gen, with_lora))
                finally:
                    proc.terminate()
                    proc.wait(30)
    print(f"servers: {args.sessions} concurrent completions of {args.gen} tokens; base {flm.name} / {gguf.name}; "
          f"median of {args.repeat} (tokens/s, prompt included)")
    med = {k: statistics.median(v) for k, v in rates.items()}
    for name in ("fastllm-server", "llama-server"):
        b, a = med[(name, False)], med[(name, True)]
        print(f"  {name:15s} without {b:7.1f}   {args.sessions} different adapters {a:7.1f}   ratio {a / b:.2f}   "
              f"({', '.join(f'{v:.1f}' for v in rates[(name, True)])})")
    print(f"  fastllm-server / llama-server with adapters: {med[('fastllm-server', True)] / med[('llama-server', True)]:.2f}x; "
          f"without: {med[('fastllm-server', False)] / med[('llama-server', False)]:.2f}x")


def decode_rate(model, sets, prompt, n_gen) -> float:
    """Tokens/s of len(sets) sessions generating n_gen tokens each, stepped together."""
    lib = raw.lib
    sessions = [model.session(n_ctx=len(prompt) + n_gen + 1, adapters=s) for s in sets]
    params = lib.fastllm_sampling_default_params()
    params.temperature, params.max_new_tokens, params.ignore_eos = 0.0, n_gen, 1
    ids, n = fastllm.model._ids_array(prompt)
    for s in sessions:
        assert lib.fastllm_session_begin_generation(s.handle, ids, n, ctypes.byref(params), raw.StreamCallback(), None) == 0
    handles = (ctypes.c_void_p * len(sessions))(*[s.handle.value for s in sessions])
    done = (ctypes.c_int32 * len(sessions))()
    assert lib.fastllm_generate_step(handles, len(sessions), done) == 0  # the first token (after the prompts)
    t0 = time.perf_counter()
    steps = 1
    while not all(done):
        assert lib.fastllm_generate_step(handles, len(sessions), done) == 0, lib.fastllm_last_error()
        steps += 1
    rate = len(sessions) * (steps - 1) / (time.perf_counter() - t0)
    for s in sessions:
        s.close()
    return rate


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", choices=sorted(SHAPES), default="110m")
    ap.add_argument("--dtype", default="int8")
    ap.add_argument("--sessions", type=int, default=8)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--adapter_dtype", choices=("f32", "f16", "int8"), default="f32")
    ap.add_argument("--targets", choices=sorted(TARGETS), default="all")
    ap.add_argument("--gen", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--work_dir", type=Path, default=Path("/tmp/fastllm-bench"))
    ap.add_argument("--llama_cpp", type=Path, default=None,
                    help="a llama.cpp source folder with build/bin/llama-server: also compare the servers")
    args = ap.parse_args()
    args.work_dir.mkdir(parents=True, exist_ok=True)
    from converter.convert import convert
    base = random_checkpoint(args.shape, args.work_dir)
    flm = args.work_dir / f"{args.shape}-{args.dtype}.flm"
    if not flm.exists():
        convert(str(base), str(flm), dtype=args.dtype, progress=False)
    files = make_adapters(base, args.work_dir, args.sessions, args.rank, args.adapter_dtype, args.targets)
    prompt = list(range(1, 17))
    with fastllm.Model(flm, threads=args.threads) as m:
        adapters = [m.load_adapter(f) for f in files]
        with_sets = [{a: 1.0} for a in adapters]
        without = [{} for _ in adapters]
        decode_rate(m, without, prompt, 4)  # warm-up
        rates = {"without": [], "with": []}
        for _ in range(args.repeat):
            rates["without"].append(decode_rate(m, without, prompt, args.gen))
            rates["with"].append(decode_rate(m, with_sets, prompt, args.gen))
    a, b = statistics.median(rates["with"]), statistics.median(rates["without"])
    # what a pass reads of one: the file's matrices, or (int8) their q8 rows made from the file's f32
    adapter_mb = sum(f.stat().st_size for f in files) / len(files) / 1e6 * (1.125 / 4 if args.adapter_dtype == "int8" else 1)
    base_mb = flm.stat().st_size / 1e6
    print(f"{cpu_name()}; {args.threads} threads; {args.shape} {args.dtype} ({base_mb:.0f} MB); "
          f"{args.sessions} sessions x {args.gen} tokens, stepped together; rank {args.rank} on "
          f"{'every matrix' if args.targets == 'all' else '+'.join(TARGETS[args.targets])}, "
          f"{args.adapter_dtype} ({adapter_mb:.1f} MB per adapter); median of {args.repeat}")
    print(f"  without adapters           {b:8.1f} tokens/s  ({', '.join(f'{v:.1f}' for v in rates['without'])})")
    print(f"  {args.sessions} different adapters       {a:8.1f} tokens/s  ({', '.join(f'{v:.1f}' for v in rates['with'])})"
          f"   ratio {a / b:.2f}")
    bound = base_mb / (base_mb + args.sessions * adapter_mb)
    print(f"  bytes a step: base <= {base_mb:.0f} MB, adapters {args.sessions * adapter_mb:.0f} MB: a memory-bound "
          f"step allows at most ratio {bound:.2f}")
    if args.llama_cpp:
        tag = f"r{args.rank}" + ("" if args.targets == "all" else f"-{args.targets}")
        bench_servers(args, base, flm, [args.work_dir / f"peft-{tag}-{i}" for i in range(args.sessions)], files)
    return 0


if __name__ == "__main__":
    sys.exit(main())
