"""Load test of fastllm-server: a bounded number of streamed completions at concurrency levels
1, 2, 4, 8, 16 (asyncio; a minimal raw HTTP client, or the official openai one; loopback only). Reports requests/s, generated
tokens/s, p50/p99 latency and p50/p95 time to first token per level, and the throughput ratio 8 vs 1.

    python3 bench/bench_server.py --model model.flm                 # starts a server on a free port
    python3 bench/bench_server.py --model_path ../shared/models/stories260K/hf
    python3 bench/bench_server.py --random 110m                      # random weights (bench_speed's shapes)
    python3 bench/bench_server.py --url http://127.0.0.1:8080        # a server that is already running

Batched prompt admission, before (0: each prompt whole on admission) and after, alternating servers
in the same run, with prompts of 200 tokens each from Tiny Shakespeare (none shares a prefix):

    python3 bench/bench_server.py --model smollm2.flm --levels 1,8,32 --max_sessions 32 \
        --prompt_tokens 200 --prefill_chunk 0,256 --repeat 3

Every request streams exactly --max_tokens tokens (ignore_eos, greedy unless --temperature) from one of a few short
prompts, so the levels do the same work per request. Latency is measured by the client; the time to
first token is the server's (its "timings" extension), from a request's arrival to its first token. It stops by itself after
--requests x levels requests.
"""
from __future__ import annotations

import argparse
import asyncio
import hashlib
import ipaddress
import json
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import urlparse

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "bench"), str(REPO / "bindings" / "python"), str(REPO)]

SHAKESPEARE = REPO.parent / "shared" / "models" / "corpora" / "tinyshakespeare.txt"
PROMPTS = ["Once upon a time", "Tom had a big dog", "The sun was", "Lily and Ben went to the park", "One day",
           "The cat sat", "Mom said", "There was a bird"]


def percentile(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q / 100 * (len(s) - 1))))]


def model_file(args) -> Path:
    if args.model:
        return args.model
    from bench_speed import random_checkpoint
    from converter.convert import convert
    args.work_dir.mkdir(parents=True, exist_ok=True)
    hf_dir = args.model_path or random_checkpoint(args.random, args.work_dir)
    tag = hashlib.sha1(str(hf_dir.resolve()).encode()).hexdigest()[:8]
    flm = args.work_dir / f"{hf_dir.name}-{tag}-{args.dtype}.flm"
    if not flm.exists():
        convert(str(hf_dir), str(flm), dtype=args.dtype, progress=False)
    return flm


def long_prompts(flm: Path | None, n_tokens: int, count: int) -> list[str]:
    """count prompts of n_tokens tokens (about, without a model file) from distinct places of the
    corpus, so that no request finds another's prefix in the server's sessions."""
    text = SHAKESPEARE.read_text()
    step = len(text) // count
    pieces = [text[i * step:i * step + n_tokens * 6] for i in range(count)]
    if flm is None:
        return [p[:n_tokens * 4] for p in pieces]
    import fastllm
    with fastllm.Model(str(flm), threads=1) as m:
        return [m.detokenize(m.tokenize(p, add_bos=False)[:n_tokens]) for p in pieces]


def start_server(flm: Path, args, prefill_chunk: int | None = None) -> tuple[subprocess.Popen, str]:
    binary = args.server or REPO / "build" / "fastllm-server"
    cmd = [str(binary), str(flm), "--host", "127.0.0.1", "--port", "0", "--threads", str(args.threads),
           "--max-sessions", str(args.max_sessions), "--max-queue", str(max(64, max(args.levels))),
           "--model-name", "bench"]
    if args.n_ctx:
        cmd += ["--n-ctx", str(args.n_ctx)]
    if prefill_chunk is not None:
        cmd += ["--prefill-chunk", str(prefill_chunk)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    m = re.search(r"http://[\d.]+:\d+", line)
    if not m:
        proc.kill()
        raise SystemExit(f"fastllm-server did not start: {line!r}")
    print(line.strip())
    return proc, m[0]


TEMPERATURE = 0.0  # --temperature: 0 greedy; 1 with top_p 1 is the OpenAI API's default sampling


def request_body(i: int, max_tokens: int) -> dict:
    return dict(model="bench", prompt=PROMPTS[i % len(PROMPTS)], max_tokens=max_tokens, temperature=TEMPERATURE,
                stream=True, stream_options={"include_usage": True}, ignore_eos=True)


class RawClient:
    """A minimal asyncio HTTP/1.1 client for the server's SSE stream: one connection per request and
    JSON parsed only where needed, so that on a small machine the client costs less than the server."""

    def __init__(self, url: str, api_key: str | None):
        u = urlparse(url)
        self.host, self.port = u.hostname, u.port or 80
        self.auth = f"Authorization: Bearer {api_key}\r\n" if api_key else ""

    async def request(self, i: int, max_tokens: int) -> tuple[float, float, int]:
        t0 = time.perf_counter()
        reader, writer = await asyncio.open_connection(self.host, self.port)
        body = json.dumps(request_body(i, max_tokens)).encode()
        writer.write(f"POST /v1/completions HTTP/1.1\r\nHost: {self.host}\r\nContent-Type: application/json\r\n"
                     f"{self.auth}Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body)
        status = await reader.readline()
        if b" 200 " not in status:
            raise RuntimeError(f"{status!r} {await reader.read()!r}")
        ttft, n = None, 0
        async for line in reader:  # chunk-size lines and SSE lines alike; only "data: " lines matter
            if line.startswith(b"data: [DONE]"):
                break
            if line.startswith(b"data: ") and b'"timings"' in line:
                ttft = json.loads(line[6:])["timings"]["first_token_ms"] / 1000
            if line.startswith(b"data: ") and b'"usage"' in line:
                n = json.loads(line[6:])["usage"]["completion_tokens"]
        writer.close()
        return time.perf_counter() - t0, ttft, n


async def one_request(client, i: int, max_tokens: int) -> tuple[float, float, int]:
    """(latency s, time to first token s, generated tokens) of one streamed completion. The time to
    first token is the server's ("timings" of the last chunk: arrival to first token), which does not
    depend on the token having any text (a random model's often has none)."""
    if isinstance(client, RawClient):
        return await client.request(i, max_tokens)
    t0 = time.perf_counter()
    ttft, n = None, 0
    body = request_body(i, max_tokens)
    extra = {"ignore_eos": body.pop("ignore_eos")}
    async for chunk in await client.completions.create(**body, extra_body=extra):
        timings = (chunk.model_extra or {}).get("timings")
        if timings:
            ttft = timings["first_token_ms"] / 1000
        if chunk.usage:
            n = chunk.usage.completion_tokens
    return time.perf_counter() - t0, ttft, n


async def run_level(client, concurrency: int, n_requests: int, max_tokens: int, first: int = 0) -> dict:
    queue = list(range(first, first + n_requests))
    results = []

    async def worker():
        while queue:
            i = queue.pop()
            results.append(await one_request(client, i, max_tokens))

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    wall = time.perf_counter() - t0
    lat = [r[0] for r in results]
    ttft = [r[1] for r in results]
    return dict(concurrency=concurrency, requests=len(results), wall=wall, rps=len(results) / wall,
                tps=sum(r[2] for r in results) / wall, p50=percentile(lat, 50), p99=percentile(lat, 99),
                ttft50=percentile(ttft, 50), ttft95=percentile(ttft, 95))


async def bench(url: str, args) -> list[dict]:
    import contextlib
    if args.client == "raw":
        ctx = contextlib.nullcontext(RawClient(url, args.api_key))
    else:
        import openai
        ctx = openai.AsyncOpenAI(base_url=url + "/v1", api_key=args.api_key or "none", max_retries=0,
                                 timeout=args.timeout)
    async with ctx as client:
        await one_request(client, len(PROMPTS) - 1, args.max_tokens)  # warm-up
        rows, first = [], 0
        for c in args.levels:
            n = max(args.requests, c)
            r = await run_level(client, c, n, args.max_tokens, first)
            first += n
            rows.append(r)
            print(f"{c:5d} {r['requests']:5d} {r['rps']:8.2f} {r['tps']:10.1f} {r['p50'] * 1000:9.0f} "
                  f"{r['p99'] * 1000:9.0f} {r['ttft50'] * 1000:9.0f} {r['ttft95'] * 1000:9.0f}", flush=True)
        return rows


def print_comparison(results: dict, levels: list[int]) -> None:
    """Medians over the repeats per --prefill_chunk value, and the last value against the first."""
    import statistics
    values = list(results)
    print("\nmedians over the repeats (gen tok/s, time to first token p50 / p95 in ms)")
    print(f"{'conc':>5} " + " ".join(f"{'chunk ' + str(v) + ': tok/s':>16} {'ttft50':>7} {'ttft95':>7}" for v in values)
          + f" {'tok/s ratio':>11} {'ttft50 ratio':>12} {'ttft95 ratio':>12}")
    for li, c in enumerate(levels):
        med = {v: {k: statistics.median(run[li][k] for run in results[v]) for k in ("tps", "ttft50", "ttft95")}
               for v in values}
        a, b = med[values[0]], med[values[-1]]
        print(f"{c:5d} " + " ".join(f"{m['tps']:16.1f} {m['ttft50'] * 1000:7.0f} {m['ttft95'] * 1000:7.0f}"
                                    for m in med.values())
              + f" {b['tps'] / a['tps']:10.2f}x {b['ttft50'] / a['ttft50']:11.2f}x {b['ttft95'] / a['ttft95']:11.2f}x")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", type=Path, help=".flm file")
    src.add_argument("--model_path", type=Path, help="HuggingFace checkpoint folder (converted, cached)")
    src.add_argument("--random", help="random-weight model of a bench_speed.py shape (110m, tinyllama)")
    src.add_argument("--url", help="a running server (loopback only)")
    ap.add_argument("--dtype", default="f32", help="converter dtype for --model_path / --random")
    ap.add_argument("--levels", default="1,2,4,8,16", help="concurrency levels")
    ap.add_argument("--requests", type=int, default=32, help="requests per level (at least the level)")
    ap.add_argument("--max_tokens", type=int, default=64)
    ap.add_argument("--temperature", type=float, default=0.0,
                    help="sampling temperature of every request (0: greedy; 1: the OpenAI API's default, no top-k)")
    ap.add_argument("--threads", type=int, default=2, help="server compute threads")
    ap.add_argument("--max_sessions", type=int, default=16)
    ap.add_argument("--n_ctx", type=int, default=0, help="server context per session (0 = the model's)")
    ap.add_argument("--server", type=Path, help="fastllm-server binary (default build/fastllm-server)")
    ap.add_argument("--api_key")
    ap.add_argument("--client", choices=["raw", "openai"], default="raw",
                    help="raw: a minimal asyncio HTTP client (default; cheap per event); openai: the official client")
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--work_dir", type=Path, default=Path(tempfile.gettempdir()) / "fastllm-bench")
    ap.add_argument("--prompt_tokens", type=int, default=0,
                    help="prompts of this many tokens from Tiny Shakespeare, one per request (default: short ones)")
    ap.add_argument("--prefill_chunk", help="comma list of the server's --prefill-chunk values, compared in one run")
    ap.add_argument("--repeat", type=int, default=1, help="runs per --prefill_chunk value, alternating their order")
    args = ap.parse_args()
    global TEMPERATURE
    TEMPERATURE = args.temperature
    args.levels = [int(x) for x in args.levels.split(",")]
    if args.url and args.prefill_chunk:
        raise SystemExit("--prefill_chunk starts its own servers: not with --url")

    flm = None if args.url else model_file(args)
    if args.prompt_tokens:
        PROMPTS[:] = long_prompts(flm, args.prompt_tokens, sum(max(args.requests, c) for c in args.levels) + 1)
    print(f"{args.max_tokens} tokens per request, streamed, greedy; latency and TTFT in ms")
    header = (f"{'conc':>5} {'reqs':>5} {'req/s':>8} {'gen tok/s':>10} {'p50':>9} {'p99':>9} {'ttft p50':>9} "
              f"{'ttft p95':>9}")
    if args.url:
        host = urlparse(args.url).hostname or ""
        if host != "localhost" and not ipaddress.ip_address(host).is_loopback:
            raise SystemExit("--url must be a loopback address (127.0.0.0/8, ::1, localhost)")
        print(header)
        report(asyncio.run(bench(args.url.rstrip("/"), args)))
        return 0
    values = [int(v) for v in args.prefill_chunk.split(",")] if args.prefill_chunk else [None]
    results = {v: [] for v in values}
    for r in range(args.repeat):
        for v in values if r % 2 == 0 else values[::-1]:
            proc, url = start_server(flm, args, v)
            try:
                print(header)
                rows = asyncio.run(bench(url, args))
                report(rows)
                results[v].append(rows)
            finally:
                proc.send_signal(signal.SIGTERM)
                proc.wait(timeout=30)
    if len(values) > 1 or args.repeat > 1:
        print_comparison(results, args.levels)
    return 0


def report(rows: list[dict]) -> None:
    by_c = {r["concurrency"]: r for r in rows}
    if 1 in by_c and 8 in by_c:
        print(f"throughput 8 vs 1: {by_c[8]['tps'] / by_c[1]['tps']:.2f}x generated tokens/s, "
              f"{by_c[8]['rps'] / by_c[1]['rps']:.2f}x requests/s")


if __name__ == "__main__":
    sys.exit(main())
