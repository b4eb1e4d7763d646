"""fastllm-server: the OpenAI-compatible HTTP server, driven with the official `openai` client and
raw HTTP on loopback. Servers start on a free port (--port 0; the port is read from the first line
they print). Greedy outputs are compared with the Python binding's on the same model."""
import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from conftest import BUILD, REPO, STORIES

openai = pytest.importorskip("openai")

SERVER = BUILD / "fastllm-server"
pytestmark = pytest.mark.skipif(not SERVER.exists(), reason="fastllm-server not built (apt install "
                                "libcpp-httplib-dev nlohmann-json3-dev, then rebuild)")

CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
          "'<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
PROMPTS = ["Once upon a time", "Tom had a big dog", "The sun was", "Lily and Ben went to the park", "One day",
           "The cat sat", "Mom said", "There was a bird", "Sam liked to", "The little girl", "In the garden",
           "A big red ball", "Tim and Sue", "The dog ran", "It was a sunny day", "Anna found a box"]


class Server:
    """A fastllm-server process on a free loopback port."""

    def __init__(self, model, *args, env=None):
        cmd = [str(SERVER), str(model), "--port", "0", "--threads", "1", *map(str, args)]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     env=dict(os.environ, **(env or {})))
        line = self.proc.stdout.readline()
        m = re.search(r"http://([\d.]+):(\d+)", line)
        if not m:
            self.proc.kill()
            raise RuntimeError(f"server did not start: {line!r} {self.proc.stderr.read()}")
        self.host, self.port = m[1], int(m[2])
        self.url = f"http://{self.host}:{self.port}"

    def client(self, api_key="none", **kw):
        return openai.OpenAI(base_url=self.url + "/v1", api_key=api_key, max_retries=0, timeout=60, **kw)

    def request(self, method, path, body=None, headers=None):
        """Raw HTTP: (status, parsed JSON or text)."""
        c = http.client.HTTPConnection(self.host, self.port, timeout=60)
        if isinstance(body, (dict, list)):
            body = json.dumps(body).encode()
        c.request(method, path, body=body, headers={"Content-Type": "application/json", **(headers or {})})
        r = c.getresponse()
        data = r.read()
        c.close()
        return r.status, (json.loads(data) if "json" in (r.getheader("Content-Type") or "") else data.decode())

    def metrics(self, headers=None) -> dict:
        status, text = self.request("GET", "/metrics", headers=headers)
        assert status == 200
        out = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, value = line.rsplit(" ", 1)
                out[name] = float(value)
        return out

    def wait_metric(self, name, predicate, timeout=10.0):
        deadline = time.time() + timeout
        while time.time() < deadline:
            value = self.metrics().get(name)
            if predicate(value):
                return value
            time.sleep(0.02)
        raise AssertionError(f"{name} = {self.metrics().get(name)} after {timeout} s")

    def stop(self, sig=signal.SIGTERM, timeout=30):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout=timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
            self.proc.stdout.close()
            self.proc.stderr.close()


def open_stream(server, path, body):
    """Sends a streaming request on a raw socket; returns it and what came so far once the first event arrived."""
    data = json.dumps(body).encode()
    s = socket.create_connection((server.host, server.port), timeout=30)
    s.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
    got = b""
    while b"data: " not in got:
        chunk = s.recv(4096)
        assert chunk, got
        got += chunk
    assert got.startswith(b"HTTP/1.1 200"), got
    return s, got


def read_to_end(sock, got=b""):
    """Reads a chunked response to its last chunk."""
    while not got.endswith(b"0\r\n\r\n"):
        chunk = sock.recv(65536)
        if not chunk:
            break
        got += chunk
    sock.close()
    return got


@pytest.fixture(scope="module")
def server(stories_flm):
    s = Server(stories_flm, "--max-sessions", 8, "--max-queue", 64)
    yield s
    assert s.stop() == 0


@pytest.fixture(scope="module")
def client(server):
    with server.client() as c:
        yield c


@pytest.fixture(scope="module")
def model(stories_flm):
    """The binding on one thread (as the servers here run): the reference outputs."""
    import fastllm
    with fastllm.Model(stories_flm, threads=1) as m:
        yield m


@pytest.fixture(scope="module")
def chat_flm(tmp_path_factory):
    """stories260K with a ChatML chat template and an 8192-token context (long generations take
    seconds: the slow requests of the queue and disconnect tests)."""
    import shutil
    from conftest import convert
    d = tmp_path_factory.mktemp("chat") / "hf"
    shutil.copytree(STORIES / "hf", d)
    for p in d.iterdir():
        p.chmod(0o644)
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    cfg["chat_template"] = CHATML
    cfg["model_max_length"] = 8192
    (d / "tokenizer_config.json").write_text(json.dumps(cfg))
    cfg = json.loads((d / "config.json").read_text())
    cfg["max_position_embeddings"] = 8192
    (d / "config.json").write_text(json.dumps(cfg))
    return convert(d, d.parent / "stories-chat.flm")


@pytest.fixture(scope="module")
def chat_model(chat_flm):
    import fastllm
    with fastllm.Model(chat_flm, threads=1) as m:
        yield m


@pytest.fixture(scope="module")
def chat_server(chat_flm):
    s = Server(chat_flm, "--max-sessions", 4)
    yield s
    assert s.stop() == 0


@pytest.fixture(scope="module")
def chat_client(chat_server):
    with chat_server.client() as c:
        yield c


# -- basics -----------------------------------------------------------------------------------------

def test_health_and_models(server, client):
    status, body = server.request("GET", "/health")
    assert status == 200 and body["status"] == "ok" and body["sessions"]["max"] == 8
    models = client.models.list().data
    assert [m.id for m in models] == ["stories260K"]
    assert client.models.retrieve("stories260K").id == "stories260K"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-4")


def test_completion_greedy_equals_binding(server, client, model):
    prompt = "Once upon a time"
    r = client.completions.create(model="stories260K", prompt=prompt, max_tokens=40, temperature=0)
    assert r.object == "text_completion" and r.model == "stories260K" and r.id.startswith("cmpl-")
    assert r.choices[0].text == model.generate(prompt, 40, temperature=0.0)
    assert r.choices[0].finish_reason == "length"
    assert r.usage.prompt_tokens == len(model.tokenize(prompt)) == 5
    assert r.usage.completion_tokens == 40 and r.usage.total_tokens == 45
    timings = r.model_extra["timings"]  # extension: where the time went
    assert 0 <= timings["queued_ms"] <= timings["first_token_ms"] <= timings["total_ms"]


def test_completion_token_prompt_and_default_max_tokens(client, model):
    ids = model.tokenize("The sun was")
    r = client.completions.create(model="stories260K", prompt=ids, temperature=0)
    assert r.usage.completion_tokens == 16  # OpenAI's default max_tokens for completions
    assert r.choices[0].text == model.generate(ids, 16, temperature=0.0)


def test_completion_stream_equals_plain(client):
    kw = dict(model="stories260K", prompt="Tom had a big dog", max_tokens=30, temperature=0)
    plain = client.completions.create(**kw)
    chunks = list(client.completions.create(stream=True, stream_options={"include_usage": True}, **kw))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == plain.choices[0].text
    finals = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finals == ["length"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 30
    assert chunks[-1].usage.prompt_tokens == plain.usage.prompt_tokens


def test_stream_is_sse_ending_with_done(server, model):
    data = read_to_end(*open_stream(server, "/v1/completions", {"prompt": "One day", "max_tokens": 8, "stream": True,
                                                               "temperature": 0}))
    head, body = data.split(b"\r\n\r\n", 1)
    assert b"Content-Type: text/event-stream" in head and b"Transfer-Encoding: chunked" in head
    events = re.findall(rb"data: (.*?)\n\n", body)
    assert events[-1] == b"[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None] * (len(chunks) - 1) + ["length"]
    assert "".join(c["choices"][0]["text"] for c in chunks) == model.generate("One day", 8, temperature=0.0)


def test_stop_strings(client, model):
    prompt = "Once upon a time"
    full = model.generate(prompt, 40, temperature=0.0)  # ", there was a little girl named Lily. ..."
    for stop, cut in (("Lily", "Lily"), ([" girl", "was"], "was")):
        r = client.completions.create(model="stories260K", prompt=prompt, max_tokens=40, temperature=0, stop=stop)
        assert r.choices[0].text == full[:full.index(cut)]
        assert r.choices[0].finish_reason == "stop"
        chunks = list(client.completions.create(model="stories260K", prompt=prompt, max_tokens=40, temperature=0,
                                                stop=stop, stream=True))
        assert "".join(c.choices[0].text for c in chunks) == full[:full.index(cut)]
        assert chunks[-1].choices[0].finish_reason == "stop"


def test_seed_reproducibility(client, model):
    kw = dict(model="stories260K", prompt="The little girl", max_tokens=30, temperature=1.0)
    a = client.completions.create(seed=1234, **kw).choices[0].text
    assert client.completions.create(seed=1234, **kw).choices[0].text == a
    others = {client.completions.create(seed=s, **kw).choices[0].text for s in (1, 2, 3)}
    assert others - {a}
    # The server samples exactly as the library does alone: the binding with the same seed agrees.
    assert a == model.generate("The little girl", 30, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0,
                                       seed=1234)


def test_context_full_is_length(client, model):
    ids = model.tokenize("Once upon a time " * 200)[:500]
    r = client.completions.create(model="stories260K", prompt=ids, max_tokens=100, temperature=0,
                                  extra_body={"ignore_eos": True})
    assert r.choices[0].finish_reason == "length"
    assert r.usage.prompt_tokens == 500 and r.usage.completion_tokens == 12  # the context holds 512


def test_tokenize_detokenize(server, model):
    status, body = server.request("POST", "/tokenize", {"content": "Once upon a time"})
    assert status == 200 and body["tokens"] == model.tokenize("Once upon a time", add_bos=False)
    status, body = server.request("POST", "/tokenize", {"content": "Once upon a time", "add_special": True})
    assert body["tokens"] == model.tokenize("Once upon a time", add_bos=True)
    status, body = server.request("POST", "/detokenize", {"tokens": body["tokens"]})
    assert status == 200 and body == {"content": "Once upon a time"}


# -- chat ---------------------------------------------------------------------------------------------

def test_chat_completion_greedy_equals_binding(chat_client, chat_model):
    client = chat_client
    messages = [{"role": "system", "content": "You tell stories."}, {"role": "user", "content": "Tell me a story"}]
    r = client.chat.completions.create(model="stories-chat", messages=messages, max_tokens=30, temperature=0)
    assert r.object == "chat.completion" and r.id.startswith("chatcmpl-")
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].message.content == chat_model.chat(messages, 30, temperature=0.0)
    prompt = chat_model.tokenize(chat_model.apply_chat_template(messages), add_bos=False)
    assert r.usage.prompt_tokens == len(prompt) and r.usage.completion_tokens == 30
    assert r.choices[0].finish_reason == "length"

    chunks = list(client.chat.completions.create(model="stories-chat", messages=messages, max_tokens=30,
                                                 temperature=0, stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == r.choices[0].message.content
    assert chunks[-1].choices[0].finish_reason == "length"
    assert all(c.object == "chat.completion.chunk" and c.id == chunks[0].id for c in chunks)


def test_chat_stop_and_content_parts(chat_client, chat_model):
    client = chat_client
    messages = [{"role": "user", "content": [{"type": "text", "text": "Tell me "}, {"type": "text", "text": "a story"}]}]
    full = chat_model.chat([{"role": "user", "content": "Tell me a story"}], 30, temperature=0.0)
    word = full.split()[2]
    r = client.chat.completions.create(model="stories-chat", messages=messages, max_tokens=30, temperature=0,
                                       stop=word)
    assert r.choices[0].message.content == full[:full.index(word)] and r.choices[0].finish_reason == "stop"


def test_chat_without_template_is_400(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="stories260K", messages=[{"role": "user", "content": "hi"}])
    assert "no chat template" in e.value.message and e.value.code == "no_chat_template"


# -- concurrency ----------------------------------------------------------------------------------------

def test_16_concurrent_clients_get_their_greedy_output(server, client, model):
    expected = {p: model.generate(p, 200 + 2 * i, temperature=0.0) for i, p in enumerate(PROMPTS)}
    before = server.metrics()
    start = threading.Barrier(16)

    def one(i):
        p = PROMPTS[i]
        start.wait()
        if i % 2:
            chunks = list(client.completions.create(model="stories260K", prompt=p, max_tokens=200 + 2 * i,
                                                    temperature=0, stream=True, stream_options={"include_usage": True}))
            return p, "".join(c.choices[0].text for c in chunks if c.choices), chunks[-1].usage.completion_tokens
        r = client.completions.create(model="stories260K", prompt=p, max_tokens=200 + 2 * i, temperature=0)
        return p, r.choices[0].text, r.usage.completion_tokens

    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(one, range(16)))
    for p, text, _ in results:
        assert text == expected[p], p
    after = server.metrics()
    steps = after["fastllm_decode_steps_total"] - before["fastllm_decode_steps_total"]
    rows = after["fastllm_decode_step_sessions_total"] - before["fastllm_decode_step_sessions_total"]
    assert rows == sum(n for _, _, n in results)  # every generated token went through a step
    # ... and steps advanced several sessions together (5.7-7.5 of the 8 slots measured; with 24-token
    # replies, clients that came late found the early ones finished, and this fell to 1.5 at times)
    assert rows / steps > 3
    assert after["fastllm_active_sessions"] == 0 and after["fastllm_queue_depth"] == 0


LONG = ("Once upon a time, there was a little girl named Lily. She loved to play outside in the sun. One day, "
        "she saw a big red ball in the park. She ran to get it, but a dog took it first. Lily was sad. ")


def stream_text(raw: bytes) -> str:
    """The completion text of a raw chunked SSE response."""
    out = []
    for line in raw.split(b"\n"):
        if line.startswith(b"data: {"):
            out += [c["text"] for c in json.loads(line[6:])["choices"]]
    return "".join(out)


@pytest.mark.parametrize("chunk", [8, 0])
def test_a_long_prompt_is_admitted_beside_a_running_stream(smollm_flm, chunk):
    """SmolLM2-135M (steps of tens of ms, so that HTTP and client jitter do not matter). With
    --prefill-chunk 8 a 240-token prompt takes 30 steps, each also decoding the stream already
    running, which (14 tokens) ends before the new request's first token; with 0 (the whole prompt
    on admission) the running stream waits, and the new request's first token comes within a step,
    before it ends. Both get their greedy text. Raw sockets: the client reads each stream as it comes."""
    import fastllm
    with fastllm.Model(smollm_flm, threads=1) as model:
        long_prompt = model.detokenize(model.tokenize(LONG * 8)[:240])
        expected_a = model.generate("Tom had a big dog", 14, temperature=0.0, ignore_eos=True)
        expected_b = model.generate(long_prompt, 8, temperature=0.0)
    server = Server(smollm_flm, "--max-sessions", 2, "--prefill-chunk", chunk, "--model-name", "m")
    try:
        a_sock, a_got = open_stream(server, "/v1/completions", dict(
            model="m", prompt="Tom had a big dog", max_tokens=14, temperature=0, stream=True, ignore_eos=True))
        a = {}

        def running():
            a["raw"] = read_to_end(a_sock, a_got)
            a["end"] = time.perf_counter()

        t = threading.Thread(target=running)
        t.start()
        b_sock, b_got = open_stream(server, "/v1/completions", dict(
            model="m", prompt=long_prompt, max_tokens=8, temperature=0, stream=True))
        first = time.perf_counter()
        b_raw = read_to_end(b_sock, b_got)
        t.join(60)
        assert stream_text(a["raw"]) == expected_a
        assert stream_text(b_raw) == expected_b
        assert (a["end"] < first) == (chunk == 8), a["end"] - first
    finally:
        assert server.stop() == 0


def test_queue_full_gets_503_and_slots_come_back(chat_flm):
    s = Server(chat_flm, "--max-sessions", 1, "--max-queue", 1)
    try:
        slow, _ = open_stream(s, "/v1/completions", {"prompt": "Once upon a time", "max_tokens": 8000,
                                                  "ignore_eos": True, "stream": True})
        queued = {}
        t = threading.Thread(target=lambda: queued.update(r=s.request(
            "POST", "/v1/completions", {"prompt": "One day", "max_tokens": 5, "temperature": 0})))
        t.start()
        s.wait_metric("fastllm_queue_depth", lambda v: v == 1)
        status, body = s.request("POST", "/v1/completions", {"prompt": "Hi", "max_tokens": 5})
        assert status == 503 and body["error"]["code"] == "server_busy" and body["error"]["type"] == "server_error"
        with s.client() as c, pytest.raises(openai.InternalServerError):
            c.completions.create(model="stories-chat", prompt="Hi", max_tokens=5)
        slow.close()  # the slow client leaves: its session goes to the queued request
        t.join(timeout=20)
        assert queued["r"][0] == 200 and queued["r"][1]["usage"]["completion_tokens"] == 5
        s.wait_metric("fastllm_active_sessions", lambda v: v == 0)
        m = s.metrics()
        assert m['fastllm_requests_total{endpoint="/v1/completions",status="503"}'] == 2
        assert m["fastllm_generated_tokens_total"] < 4000  # the slow request was cut short
    finally:
        assert s.stop() == 0


def test_client_disconnect_mid_stream_frees_the_session(chat_server, chat_client):
    before = chat_server.metrics()["fastllm_generated_tokens_total"]
    sock, _ = open_stream(chat_server, "/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}],
                                                                "max_tokens": 8000, "ignore_eos": True, "stream": True})
    chat_server.wait_metric("fastllm_active_sessions", lambda v: v == 1)
    sock.close()
    chat_server.wait_metric("fastllm_active_sessions", lambda v: v == 0, timeout=5)
    generated = chat_server.metrics()["fastllm_generated_tokens_total"] - before
    assert generated < 4000  # cancelled, not run to its 8000 tokens
    # The session is reused by the next request.
    r = chat_client.chat.completions.create(model="stories-chat", max_tokens=5, extra_body={"ignore_eos": True},
                                            messages=[{"role": "user", "content": "Hi"}])
    assert r.usage.completion_tokens == 5  # ignore_eos: an end-of-sequence sampled early cannot cut it


# -- bad input ------------------------------------------------------------------------------------------

BAD = [
    # (path, body, status, error.param)
    ("/v1/completions", b'{"prompt": ', 400, None),
    ("/v1/completions", b"[1, 2]", 400, None),
    ("/v1/completions", b"\xff\xfe{}", 400, None),
    ("/v1/completions", b"", 400, None),
    ("/v1/completions", b"[" * 100000, 400, None),
    ("/v1/completions", b'{"prompt": [1, 488e8888888]}', 400, None),  # a number JSON cannot hold (fuzz_server_request)
    ("/v1/completions", {}, 400, "prompt"),
    ("/v1/completions", {"prompt": 5}, 400, "prompt"),
    ("/v1/completions", {"prompt": []}, 400, "prompt"),
    ("/v1/completions", {"prompt": ["a", "b"]}, 400, "prompt"),
    ("/v1/completions", {"prompt": [1, 99999]}, 400, "prompt"),
    ("/v1/completions", {"prompt": [1, -3]}, 400, "prompt[1]"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": 0}, 400, "max_tokens"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": -5}, 400, "max_tokens"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": "10"}, 400, "max_tokens"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": 1.5}, 400, "max_tokens"),
    ("/v1/completions", {"prompt": "hi", "temperature": "hot"}, 400, "temperature"),
    ("/v1/completions", {"prompt": "hi", "temperature": 5}, 400, "temperature"),
    ("/v1/completions", {"prompt": "hi", "top_p": 0}, 400, "top_p"),
    ("/v1/completions", {"prompt": "hi", "top_k": -1}, 400, "top_k"),
    ("/v1/completions", {"prompt": "hi", "seed": "x"}, 400, "seed"),
    ("/v1/completions", {"prompt": "hi", "stop": 5}, 400, "stop"),
    ("/v1/completions", {"prompt": "hi", "stop": ["a", 1]}, 400, "stop[1]"),
    ("/v1/completions", {"prompt": "hi", "stream": "yes"}, 400, "stream"),
    ("/v1/completions", {"prompt": "hi", "n": 2}, 400, "n"),
    ("/v1/completions", {"prompt": "hi", "logprobs": 3}, 400, "logprobs"),
    ("/v1/completions", {"prompt": "hi", "model": "gpt-4"}, 404, "model"),
    ("/v1/completions", {"prompt": "hi", "model": 7}, 400, "model"),
    ("/v1/completions", {"prompt": "Once upon a time " * 200}, 400, "prompt"),
    ("/v1/chat/completions", {}, 400, "messages"),
    ("/v1/chat/completions", {"messages": "hi"}, 400, "messages"),
    ("/v1/chat/completions", {"messages": []}, 400, "messages"),
    ("/v1/chat/completions", {"messages": [{"content": "hi"}]}, 400, "messages[0].role"),
    ("/v1/chat/completions", {"messages": [{"role": "wizard", "content": "hi"}]}, 400, "messages[0].role"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": 5}]}, 400, "messages[0].content"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "n": 3}, 400, "n"),
    ("/tokenize", {}, 400, "content"),
    ("/tokenize", {"content": 5}, 400, "content"),
    ("/detokenize", {"tokens": "abc"}, 400, "tokens"),
    ("/detokenize", {"tokens": [1, 100000]}, 400, "tokens"),
    ("/detokenize", {"tokens": [-1]}, 400, "tokens[0]"),
    ("/nope", {}, 404, None),
]


def test_bad_input_gets_4xx_in_openai_shape_and_the_server_keeps_serving(server, client):
    for path, body, status, param in BAD:
        got, err = server.request("POST", path, body)
        assert got == status, (path, body if len(str(body)) < 200 else "...", err)
        assert set(err["error"]) == {"message", "type", "param", "code"}, err
        assert err["error"]["message"] and err["error"]["param"] == param, (body, err)
    got, err = server.request("POST", "/v1/completions", b'{"prompt": "' + b"a" * (2 << 20) + b'"}')
    assert got == 413 and err["error"]["code"] == "request_too_large"
    got, err = server.request("GET", "/v1/completions")
    assert got == 405
    # curl -d without a Content-Type sends a form-encoded type: still read as JSON, past 8 KiB too
    got, body = server.request("POST", "/v1/completions", json.dumps({"prompt": "hi", "max_tokens": 2,
                                                                      "ignore_eos": True,
                                                                      "user": "x" * 20000}).encode(),
                               headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert got == 200 and body["usage"]["completion_tokens"] == 2
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model="stories260K", prompt="hi", n=2)
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="no-such-model", prompt="hi")
    # Nothing leaked: no session busy, nothing queued, and generation still works.
    m = server.metrics()
    assert m["fastllm_active_sessions"] == 0 and m["fastllm_queue_depth"] == 0
    assert client.completions.create(model="stories260K", prompt="hi", max_tokens=3,
                                     extra_body={"ignore_eos": True}).usage.completion_tokens == 3
    status, body = server.request("GET", "/health")
    assert status == 200


def test_metrics_prometheus_text(server, client):
    before = server.metrics()
    r = client.completions.create(model="stories260K", prompt="Once upon a time", max_tokens=10, temperature=0)
    status, text = server.request("GET", "/metrics")
    assert "# TYPE fastllm_requests_total counter" in text and "# TYPE fastllm_queue_depth gauge" in text
    m = server.metrics()
    key = 'fastllm_requests_total{endpoint="/v1/completions",status="200"}'
    assert m[key] == before.get(key, 0) + 1
    assert m["fastllm_prompt_tokens_total"] - before["fastllm_prompt_tokens_total"] == r.usage.prompt_tokens
    assert m["fastllm_generated_tokens_total"] - before["fastllm_generated_tokens_total"] == 10
    assert m["fastllm_tokens_per_second"] > 0 and m["fastllm_max_sessions"] == 8
    assert m["fastllm_time_to_first_token_seconds_count"] > before["fastllm_time_to_first_token_seconds_count"]


# -- options, lifecycle ------------------------------------------------------------------------------

def test_api_key(stories_flm):
    s = Server(stories_flm, "--api-key", "sekret", "--model-name", "tiny")
    try:
        with s.client(api_key="wrong") as c, pytest.raises(openai.AuthenticationError):
            c.completions.create(model="tiny", prompt="hi", max_tokens=2)
        status, body = s.request("POST", "/v1/completions", {"prompt": "hi"})
        assert status == 401 and body["error"]["type"] == "authentication_error"
        assert s.request("GET", "/metrics")[0] == 401 and s.request("POST", "/tokenize", {"content": "a"})[0] == 401
        assert s.request("GET", "/health")[0] == 200  # exempt
        with s.client(api_key="sekret") as c:
            r = c.completions.create(model="tiny", prompt="hi", max_tokens=2, extra_body={"ignore_eos": True})
        assert r.model == "tiny" and r.usage.completion_tokens == 2
    finally:
        assert s.stop() == 0


def test_sigterm_during_a_stream_exits_0(chat_flm):
    s = Server(chat_flm)
    sock, got = open_stream(s, "/v1/completions", {"prompt": "Once", "max_tokens": 8000, "ignore_eos": True,
                                                   "stream": True})
    t0 = time.time()
    s.proc.send_signal(signal.SIGTERM)
    rest = read_to_end(sock, got)
    assert s.stop(timeout=20) == 0 and time.time() - t0 < 10
    assert b"shutting_down" in rest and b"data: [DONE]" in rest  # the stream ended with an error event
    with pytest.raises(OSError):
        socket.create_connection((s.host, s.port), timeout=5).close()


def test_sigint_idle_exits_0(stories_flm):
    s = Server(stories_flm)
    assert s.request("GET", "/health")[0] == 200
    assert s.stop(signal.SIGINT) == 0


def test_parent_pid_stops_the_server_when_its_parent_is_killed(tmp_path, stories_flm):
    # The parent starts the server with --parent-pid and is then killed with SIGKILL: the server,
    # now an orphan, shuts down by itself (fastllm.ray_app starts a replica's server this way).
    parent = subprocess.Popen([sys.executable, "-c", f"""
import os, subprocess, sys, time
p = subprocess.Popen([{str(SERVER)!r}, {str(stories_flm)!r}, "--port", "0", "--threads", "1",
                      "--parent-pid", str(os.getpid())], stdout=subprocess.PIPE, stderr=open({str(tmp_path / "err")!r}, "w"), text=True)
print(p.pid, p.stdout.readline(), flush=True)
time.sleep(600)
"""], stdout=subprocess.PIPE, text=True)
    pid, line = parent.stdout.readline().split(" ", 1)
    assert "serving" in line
    server_stat = Path(f"/proc/{pid}/stat")

    def running() -> bool:  # (a zombie has exited: a container's pid 1 may never reap it)
        try:
            stat = server_stat.read_text()
        except OSError:
            return False
        return stat[stat.rindex(")") + 2] != "Z"
    assert running()
    parent.kill()
    parent.wait()
    deadline = time.time() + 10
    while running() and time.time() < deadline:
        time.sleep(0.05)
    if running():
        os.kill(int(pid), signal.SIGKILL)
        pytest.fail("the server outlived its parent by 10 s")
    assert f"its parent process (pid {parent.pid}) ended, shutting down" in (tmp_path / "err").read_text()


def test_parent_pid_not_the_parent_stops_the_server_at_once(stories_flm):
    s = Server(stories_flm, "--parent-pid", 1)  # the parent ended before the server looked: not pid 1
    assert s.proc.wait(timeout=10) == 0
    assert "its parent process (pid 1) ended, shutting down" in s.proc.stderr.read()
    s.stop()


def test_bad_command_lines(tmp_path, stories_flm):
    r = subprocess.run([str(SERVER)], capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "no model given" in r.stderr
    r = subprocess.run([str(SERVER), str(stories_flm), "--max-sessions", "0"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "--max-sessions" in r.stderr
    r = subprocess.run([str(SERVER), str(stories_flm), "--parent-pid", "0"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "--parent-pid needs an integer" in r.stderr
    r = subprocess.run([str(SERVER), str(tmp_path / "missing.flm")], capture_output=True, text=True, timeout=30)
    assert r.returncode == 1 and "cannot load" in r.stderr


def test_python_serve_command(stories_flm):
    env = dict(os.environ, PYTHONPATH=str(REPO / "bindings" / "python"))
    p = subprocess.Popen([sys.executable, "-m", "fastllm", "serve", str(stories_flm), "--port", "0", "--threads", "1"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        m = re.search(r"http://([\d.]+):(\d+)", p.stdout.readline())
        assert m, p.stderr.read()
        c = http.client.HTTPConnection(m[1], int(m[2]), timeout=30)
        c.request("GET", "/health")
        assert c.getresponse().status == 200
        c.close()
        p.send_signal(signal.SIGTERM)  # exec'd: the signal reaches the server itself
        assert p.wait(timeout=20) == 0
    finally:
        p.kill()
        p.communicate()


def test_python_serve_without_binary(monkeypatch, capsys, stories_flm):
    from fastllm import __main__ as cli
    monkeypatch.setattr(cli, "find_server", lambda: None)
    assert cli.main(["serve", str(stories_flm)]) == 1
    assert "fastllm-server was not found" in capsys.readouterr().err


def test_prompt_prefix_is_reused_and_reported_as_cached(server, client, model):
    """A prompt that begins with what a session already holds evaluates only the rest (its own
    slot's conversation, or another slot's, forked): usage.prompt_tokens_details.cached_tokens
    says how much, and the text is what a fresh evaluation gives."""
    story = model.tokenize((STORIES / "text" / "tinystories_sample.txt").read_text()[:600])[:120]
    first = client.completions.create(model="stories260K", prompt=story + [13], max_tokens=8, temperature=0)
    assert first.usage.prompt_tokens == 121
    second = client.completions.create(model="stories260K", prompt=story + [29], max_tokens=8, temperature=0)
    assert second.usage.prompt_tokens == 121
    assert second.usage.prompt_tokens_details.cached_tokens >= 120
    assert second.choices[0].text == model.generate(story + [29], 8, temperature=0.0)
    other = client.completions.create(model="stories260K", prompt=[300, 301, 302], max_tokens=2, temperature=0)
    assert other.usage.prompt_tokens_details.cached_tokens == 0
