"""The Ray Serve deployments of fastllm.ray_serve: replicas that each run fastllm-server, and the
ingress that forwards HTTP requests to them.

Two tiers, because Ray's HTTP proxy routes a request before its body is read: the ingress reads
the body, takes the prompt's first characters as the routing key, and calls a replica through a
handle whose router (PrefixAffinityRouter) sees that key. A replica relays the request to its
fastllm-server on loopback and streams the answer back unchanged (status, body, SSE events), so
the OpenAI routes, their validation and errors are the server's own.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading

import aiohttp
from ray import serve
from ray.exceptions import RayActorError, RayTaskError
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from .__main__ import find_server

REPLICA_HEADER = "x-fastllm-replica"  # on every answer: which replica served it
GENERATION_PATHS = ("/v1/completions", "/v1/chat/completions")
# Per connection, not end to end: never relayed (HTTP/1.1, RFC 9110 7.6.1), nor the length either
# side recomputes.
HOP_BY_HOP = {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "trailer", "upgrade",
              "host", "content-length"}


class ReplicaFailed(Exception):
    """A replica's fastllm-server is gone or broke the connection."""


def route_key(path: str, body: bytes, n_chars: int) -> str | None:
    """The first n_chars characters of a generation request's prompt (chat: its messages in
    order); None for other requests and for bodies the server will refuse anyway."""
    if n_chars == 0 or path not in GENERATION_PATHS:
        return None
    try:
        req = json.loads(body)
    except ValueError:
        return None
    if not isinstance(req, dict):
        return None
    if path == "/v1/completions":
        prompt = req.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        elif isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
            prompt = ",".join(map(str, prompt))  # token ids: equal leading ids, equal leading text
        return prompt[:n_chars] if isinstance(prompt, str) else None
    messages = req.get("messages")
    if not isinstance(messages, list):
        return None
    text = []
    for m in messages:
        if not isinstance(m, dict):
            return None
        content = m.get("content")
        if isinstance(content, list):
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
        text.append(f"{m.get('role')}\n{content}\n")
        if sum(map(len, text)) >= n_chars:
            break
    return "".join(text)[:n_chars]


@serve.deployment
class FastllmReplica:
    """One fastllm-server on a free loopback port. server_args: its options (fastllm.ray_serve
    .server_args); api_key goes in its environment, not on its command line."""

    def __init__(self, model: str, server_args: list[str], api_key: str | None = None):
        binary = find_server()
        if binary is None:
            raise RuntimeError("fastllm-server was not found on this node (build it, or set FASTLLM_SERVER_BINARY)")
        self.replica_id = serve.get_replica_context().replica_id.unique_id
        env = dict(os.environ)
        env.pop("FASTLLM_API_KEY", None)
        if api_key:
            env["FASTLLM_API_KEY"] = api_key
        # --parent-pid: the server goes with this process, even when it is killed. (No preexec_fn: a
        # Ray worker runs gRPC, and a child forked from it that runs Python before exec can abort in
        # gRPC's fork handlers; without one, Popen starts the server by vfork + exec.)
        self.proc = subprocess.Popen([binary, model, "--host", "127.0.0.1", "--port", "0", "--parent-pid",
                                      str(os.getpid()), *server_args], stdout=subprocess.PIPE, text=True, env=env)
        line = self.proc.stdout.readline()  # "fastllm-server: serving ... on http://127.0.0.1:PORT ..."
        self.proc.stdout.close()
        m = re.search(r"http://127\.0\.0\.1:(\d+)", line)
        if not m:
            self.proc.kill()
            raise RuntimeError(f"fastllm-server did not start (exit code {self.proc.wait()}); its stderr is in "
                               "this replica's log")
        self.url = f"http://127.0.0.1:{m[1]}"
        self._http = None  # made on the replica's event loop, at the first request
        self._stopping = False
        threading.Thread(target=self._exit_with_server, daemon=True).start()

    def _exit_with_server(self):
        # A replica whose server died ends its own process: Ray notices that at once, sends new
        # requests elsewhere (retrying those it had just sent here) and starts a replacement. Its
        # health check would take three failed periods, and answer errors meanwhile.
        code = self.proc.wait()
        if not self._stopping:
            print(f"fastllm replica {self.replica_id}: fastllm-server ended (exit status {code}); "
                  "ending the replica so that Ray replaces it", file=sys.stderr, flush=True)
            os._exit(1)

    def _client(self) -> aiohttp.ClientSession:
        if self._http is None:
            # No total timeout: a generation takes as long as it takes; the server bounds its reads and writes.
            # The body passes through as the server encoded it, for the encodings the client accepts.
            self._http = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                               timeout=aiohttp.ClientTimeout(total=None, sock_connect=10),
                                               auto_decompress=False, skip_auto_headers=("Accept-Encoding",))
        return self._http

    def _failure(self, what: str) -> ReplicaFailed:
        code = self.proc.poll()
        if code is None:
            return ReplicaFailed(f"replica {self.replica_id}: {what}")
        how = f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"
        return ReplicaFailed(f"replica {self.replica_id}: its fastllm-server {how}")

    async def forward(self, route_key: str | None, method: str, path: str, query: str, headers: dict,
                      body: bytes):
        """Yields the answer's head ({"status", "headers", "stream", "replica"}), then its body:
        event by event for a stream, whole otherwise. route_key is for the router only."""
        if self.proc.poll() is not None:
            raise self._failure("its fastllm-server is not running")
        url = self.url + path + (f"?{query}" if query else "")
        try:
            async with self._client().request(method, url, headers=headers, data=body) as r:
                head = {"status": r.status, "replica": self.replica_id,
                        "headers": {k: v for k, v in r.headers.items() if k.lower() not in HOP_BY_HOP},
                        "stream": r.content_type == "text/event-stream"}
                if not head["stream"]:
                    data = await r.read()
                    yield head
                    yield data
                    return
                yield head
                async for chunk in r.content.iter_any():
                    yield chunk
        except aiohttp.ClientError as e:
            raise self._failure(f"the connection to its fastllm-server broke ({e})") from None

    async def check_health(self):
        """Ray replaces a replica whose check fails: its server gone, or not answering /health."""
        if self.proc.poll() is not None:
            raise self._failure("its fastllm-server is not running")
        async with self._client().get(self.url + "/health", timeout=aiohttp.ClientTimeout(total=5)) as r:
            if r.status != 200:
                raise ReplicaFailed(f"replica {self.replica_id}: /health answered {r.status}")

    async def __del__(self):
        # Serve calls this once the replica's requests are done: the server stops gracefully.
        if not hasattr(self, "url"):  # __init__ failed: nothing started, or the child is already reaped
            return
        self._stopping = True
        if self._http is not None:
            await self._http.close()
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def failure_message(e: Exception) -> str:
    cause = e.cause if isinstance(e, RayTaskError) else e
    if isinstance(cause, ReplicaFailed):
        detail = str(cause)
    elif isinstance(cause, RayActorError):
        detail = "its process died"
    else:
        detail = f"{type(cause).__name__}: {cause}"
    return f"the replica serving this request failed ({detail}); the request was not retried"


def failure_json(e: Exception) -> dict:
    return {"error": {"message": failure_message(e), "type": "server_error", "param": None, "code": "replica_failed"}}


@serve.deployment
class FastllmIngress:
    """Takes every HTTP request from Ray's proxy and forwards it to a replica. A replica that fails
    before the answer began: 502 replica_failed; during a stream: an error event, then [DONE]."""

    def __init__(self, replicas, route_prefix_chars: int):
        self.replicas = replicas.options(stream=True)
        self.route_prefix_chars = route_prefix_chars

    async def __call__(self, request: Request) -> Response:
        body = await request.body()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP}
        answer = self.replicas.forward.remote(route_key=route_key(request.url.path, body, self.route_prefix_chars),
                                              method=request.method, path=request.url.path,
                                              query=request.url.query, headers=headers, body=body)
        try:
            head = await answer.__anext__()
            headers = dict(head["headers"], **{REPLICA_HEADER: head["replica"]})
            if not head["stream"]:
                return Response(b"".join([chunk async for chunk in answer]), head["status"], headers)
        except (RayTaskError, RayActorError) as e:
            return Response(json.dumps(failure_json(e)), 502, {"content-type": "application/json"})
        return StreamingResponse(self._relay(answer), head["status"], headers)

    @staticmethod
    async def _relay(answer):
        try:
            async for chunk in answer:
                yield chunk
        except (RayTaskError, RayActorError) as e:
            yield f"data: {json.dumps(failure_json(e))}\n\ndata: [DONE]\n\n".encode()
