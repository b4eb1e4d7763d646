"""Server soak (docs/reliability.md): N requests at concurrency C against fastllm-server on
loopback, a mix of good and bad ones, while a watcher asks /health every 0.2 s.

    python3 bench/soak_server.py [--server build/fastllm-server] [--requests 10000] [--concurrency 32]
                                 [--warmup 1000] [--max-seconds 1800]

The model is stories260K (../shared/models, or $FASTLLM_SHARED) with a ChatML template, converted
once into /tmp. The mix, drawn with a fixed seed: chat and completion, plain and streamed, clients
that close the connection mid-stream, malformed JSON, wrong types, bodies over --max-body-bytes,
a wrong API key, unknown paths and methods. Checked, and printed: no connection refused or reset
by the server (it stays up), no 5xx but 503 back-pressure, each bad request its 4xx, every stream
ends with [DONE], /health answering within 2 s throughout, the server's RSS at the end within 5%
of its RSS after the warm-up (not under ASan, whose quarantine keeps freed memory), and SIGTERM
exiting 0 (under ASan, with LeakSanitizer on: no leak at exit either).
Exit status 0 when every check holds."""
import argparse
import collections
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO)]
SHARED = Path(os.environ.get("FASTLLM_SHARED", REPO.parent / "shared"))
CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
          "'<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
KEY = "soak-key"
MAX_BODY = 65536
PROMPTS = ["Once upon a time", "Tom had a big dog", "The sun was", "Lily and Ben went", "One day", "The cat sat"]


def chat_model() -> Path:
    out = Path("/tmp/fastllm-soak/stories-chat.flm")
    if out.exists():
        return out
    from converter.convert import convert
    d = out.parent / "hf"
    shutil.rmtree(d, ignore_errors=True)
    shutil.copytree(SHARED / "models" / "stories260K" / "hf", d)
    for p in d.iterdir():
        p.chmod(0o644)
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    cfg["chat_template"] = CHATML
    (d / "tokenizer_config.json").write_text(json.dumps(cfg))
    convert(str(d), str(out), progress=False)
    return out


def http(port, method, path, body=b"", headers=(), read_stream=None, timeout=60):
    """One request on its own connection: (status, body bytes). read_stream=n closes the
    connection after n bytes of the answer (a client going away mid-stream)."""
    head = [f"{method} {path} HTTP/1.1", f"Host: 127.0.0.1:{port}", "Connection: close",
            f"Content-Length: {len(body)}", *headers]
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    try:
        s.sendall(("\r\n".join(head) + "\r\n\r\n").encode() + body)
        data = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
            if read_stream is not None and len(data) >= read_stream:
                return None, data
    finally:
        s.close()
    m = re.match(rb"HTTP/1\.[01] (\d{3})", data)
    head, _, body = data.partition(b"\r\n\r\n")
    if re.search(rb"(?im)^transfer-encoding:\s*chunked", head):
        body = dechunk(body)
    return (int(m[1]) if m else -1), body


def dechunk(body: bytes) -> bytes:
    out, pos = b"", 0
    while True:
        end = body.find(b"\r\n", pos)
        if end < 0:
            return out + b"[truncated chunked body]"
        n = int(body[pos:end].split(b";")[0] or b"0", 16)
        if n == 0:
            return out
        out += body[end + 2:end + 2 + n]
        pos = end + 2 + n + 2


AUTH = (f"Authorization: Bearer {KEY}",)


def one(port, kind, rng):
    """Sends one request of the kind; returns (kind, outcome) where outcome is 'ok' or a problem."""
    chat = {"messages": [{"role": "user", "content": rng.choice(PROMPTS)}], "max_tokens": rng.randint(1, 24),
            "temperature": rng.choice([0, 0.8]), "seed": rng.randint(0, 99)}
    comp = {"prompt": rng.choice(PROMPTS), "max_tokens": rng.randint(1, 24), "temperature": 0}
    expect = {"chat": (200,), "completion": (200,), "chat_stream": (200,), "completion_stream": (200,),
              "bad_json": (400,), "bad_type": (400,), "too_large": (413,), "bad_key": (401,), "no_path": (404,),
              "bad_method": (405,), "tokenize": (200,)}
    if kind == "disconnect":
        http(port, "POST", "/v1/chat/completions", json.dumps({**chat, "stream": True, "max_tokens": 64}).encode(),
             AUTH, read_stream=rng.randint(1, 300))
        return kind, "ok"
    if kind in ("chat", "chat_stream"):
        path, body = "/v1/chat/completions", {**chat, "stream": kind == "chat_stream"}
    elif kind in ("completion", "completion_stream"):
        path, body = "/v1/completions", {**comp, "stream": kind == "completion_stream"}
    elif kind == "tokenize":
        path, body = "/tokenize", {"content": rng.choice(PROMPTS)}
    elif kind == "bad_json":
        path, body = "/v1/chat/completions", b'{"messages": [{"role": "user", "content": "x"}'
    elif kind == "bad_type":
        path, body = "/v1/completions", {"prompt": "x", "max_tokens": "many"}
    elif kind == "too_large":
        path, body = "/v1/completions", {"prompt": "x" * (MAX_BODY + 10)}
    elif kind == "no_path":
        path, body = "/v1/nothing", {}
    else:  # bad_method, bad_key
        path, body = "/v1/completions", comp
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    method = "GET" if kind == "bad_method" else "POST"
    headers = ("Authorization: Bearer wrong",) if kind == "bad_key" else AUTH
    status, data = http(port, method, path, raw, headers)
    if status == 503 and kind in ("chat", "completion", "chat_stream", "completion_stream", "tokenize"):
        return kind, "ok-503"
    if status not in expect[kind]:
        return kind, f"status {status}: {data[:200]!r}"
    if kind.endswith("_stream") and not data.rstrip().endswith(b"data: [DONE]"):
        return kind, f"stream without [DONE]: {data[-200:]!r}"
    if status == 200 and not kind.endswith("_stream"):
        json.loads(data)
    return kind, "ok"


KINDS = {"chat": 25, "completion": 15, "chat_stream": 20, "completion_stream": 10, "disconnect": 8, "tokenize": 4,
         "bad_json": 4, "bad_type": 4, "too_large": 3, "bad_key": 3, "no_path": 2, "bad_method": 2}


def rss_kib(pid):
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return -1


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--server", default=str(REPO / "build" / "fastllm-server"))
    ap.add_argument("--requests", type=int, default=10000)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--warmup", type=int, default=1000)
    ap.add_argument("--max-seconds", type=float, default=1800)
    args = ap.parse_args()

    model = chat_model()
    asan = "libasan" in subprocess.run(["ldd", args.server], capture_output=True, text=True).stdout
    env = dict(os.environ, ASAN_OPTIONS="halt_on_error=1:detect_leaks=1", UBSAN_OPTIONS="halt_on_error=1")
    env.pop("LD_PRELOAD", None)
    proc = subprocess.Popen([args.server, str(model), "--port", "0", "--threads", "2", "--max-sessions", "8",
                             "--max-queue", "64", "--api-key", KEY, "--max-body-bytes", str(MAX_BODY)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    line = proc.stdout.readline()
    m = re.search(r"http://[\d.]+:(\d+)", line)
    if not m:
        sys.exit(f"server did not start: {line!r} {proc.stderr.read()[-2000:]}")
    port = int(m[1])
    stderr_tail = collections.deque(maxlen=50)
    threading.Thread(target=lambda: [stderr_tail.append(l) for l in proc.stderr], daemon=True).start()

    stop = threading.Event()
    health = {"checks": 0, "slowest_s": 0.0, "failures": []}

    def watch():
        while not stop.is_set():
            t = time.monotonic()
            try:
                status, _ = http(port, "GET", "/health", timeout=5)
            except OSError as e:
                status = str(e)
            dt = time.monotonic() - t
            health["checks"] += 1
            health["slowest_s"] = max(health["slowest_s"], dt)
            if status != 200 or dt > 2:
                health["failures"].append((status, round(dt, 2)))
            time.sleep(0.2)
    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()

    rng = random.Random(1234)
    plan = rng.choices(list(KINDS), weights=list(KINDS.values()), k=args.requests)
    seeds = [rng.randint(0, 1 << 30) for _ in plan]
    outcomes = collections.Counter()
    problems = []
    rss_warm = None
    t0 = time.monotonic()
    done = 0

    def run(i):
        try:
            return one(port, plan[i], random.Random(seeds[i]))
        except OSError as e:  # refused / reset: the server is down or dropped a connection
            return plan[i], f"connection: {e!r}"

    with ThreadPoolExecutor(args.concurrency) as pool:
        for kind, outcome in pool.map(run, range(len(plan))):
            done += 1
            outcomes[(kind, outcome if outcome.startswith("ok") else "problem")] += 1
            if not outcome.startswith("ok"):
                problems.append((kind, outcome))
            if done == args.warmup:
                rss_warm = rss_kib(proc.pid)
            if time.monotonic() - t0 > args.max_seconds:
                problems.append(("time", f"stopped after {done} requests: --max-seconds"))
                break
    elapsed = time.monotonic() - t0
    rss_end = rss_kib(proc.pid)
    stop.set()
    watcher.join()
    proc.send_signal(signal.SIGTERM)
    try:
        code = proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        code = "hung after SIGTERM"

    print(f"{done} requests in {elapsed:.0f} s ({done / elapsed:.0f}/s) at concurrency {args.concurrency}, "
          f"server {args.server}")
    for kind in KINDS:
        row = {o: n for (k, o), n in outcomes.items() if k == kind}
        print(f"  {kind:18s} {row}")
    growth = (rss_end - rss_warm) / rss_warm * 100 if rss_warm else float("nan")
    print(f"RSS after {args.warmup} requests {rss_warm} KiB, at the end {rss_end} KiB ({growth:+.1f}%)")
    print(f"/health: {health['checks']} checks, slowest {health['slowest_s']:.2f} s, {len(health['failures'])} failed")
    print(f"SIGTERM: exit {code}")
    ok = True
    if problems:
        ok = False
        print(f"{len(problems)} problems, first ones:", *problems[:10], sep="\n  ")
    if health["failures"]:
        ok = False
        print("health failures:", health["failures"][:10])
    if asan:
        print("ASan build: RSS grows with ASan's quarantine of freed memory, so it is not compared; a leak "
              "would show as LeakSanitizer's report and a non-zero exit after SIGTERM")
    elif rss_warm and abs(growth) > 5:
        ok = False
        print("RSS grew by more than 5%")
    if code != 0:
        ok = False
        print("server stderr:", *list(stderr_tail)[-20:], sep="\n  ")
    print("PASS" if ok else "FAIL")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
