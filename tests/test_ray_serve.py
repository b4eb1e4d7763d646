"""fastllm-server replicas on Ray Serve (`fastllm serve --ray`, fastllm.ray_serve), on a local Ray
cluster that this module starts on loopback (2 CPUs): two replicas of one thread each, driven with
the official `openai` client through Ray's HTTP proxy and compared with one plain fastllm-server.
Ray is a dependency of these tests (scripts/setup.sh installs fastllm[serve]): no skipping."""
import os

# Before ray is imported: the cluster's processes talk over loopback (Ray on Linux otherwise uses
# the address of the default route).
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"

import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import openai
import pytest
import ray

from conftest import REPO
from test_server import PROMPTS, Server

# SmolLM2-135M (tests/conftest.py's smollm_flm), not stories260K: its streams take seconds on one
# thread, so that those of a replica killed mid-run are still being generated (a stories260K server
# had written whole streams before Ray relayed their first events).
MODEL = "smollm2"

PYTHONPATH = str(REPO / "bindings" / "python")
REPLICA_HEADER = "x-fastllm-replica"
# A story opening of ~90 tokens: requests that share it should meet it in one replica's cache.
SHARED_PREFIX = ("Once upon a time, there was a little girl named Lily. She loved to play outside in the sunshine. "
                 "One day, she saw a big red ball in the park. She ran to it and kicked it very high. Her friend Tom "
                 "came to play with her, and they laughed and ran all day long until the sun went down. ")


def fastllm_serve(*args, **kw):
    return subprocess.run([sys.executable, "-m", "fastllm", "serve", *map(str, args)], capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=PYTHONPATH), timeout=60, **kw)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def processes() -> dict:
    """pid -> (parent pid, command line) of every process."""
    out = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                stat = (d / "stat").read_text()
                cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
            except OSError:
                continue
            fields = stat[stat.rindex(")") + 2:].split()
            if fields[0] != "Z":  # a zombie holds nothing; its parent reaps it
                out[int(d.name)] = (int(fields[1]), cmd)
    return out


def replica_servers() -> dict:
    """fastllm-server pid -> its replica's pid, for every replica of the app."""
    procs = processes()
    replicas = {pid for pid, (_, cmd) in procs.items() if cmd.startswith("ray::ServeReplica:fastllm:FastllmReplica")}
    return {pid: ppid for pid, (ppid, cmd) in procs.items() if "fastllm-server" in cmd and ppid in replicas}


def cluster_processes(session_dir: str) -> dict:
    """The cluster's processes: its GCS and raylet, and all they started (workers, replicas and
    their fastllm-servers)."""
    procs = processes()
    ours = {pid for pid, (_, cmd) in procs.items() if session_dir in cmd}
    grew = True
    while grew:
        more = {pid for pid, (ppid, _) in procs.items() if ppid in ours} - ours
        ours |= more
        grew = bool(more)
    return {pid: procs[pid][1] for pid in ours}


@pytest.fixture(scope="module")
def cluster():
    """A local Ray cluster: 2 CPUs, a small object store, no dashboard. After the module: nothing
    it started may be left running."""
    ctx = ray.init(address="local", num_cpus=2, object_store_memory=80 << 20, include_dashboard=False,
                   logging_level="WARNING", log_to_driver=False)
    session_dir = ctx.address_info["session_dir"]
    yield ctx.address_info["gcs_address"]
    started = cluster_processes(session_dir)
    ray.shutdown()
    deadline = time.time() + 30
    while time.time() < deadline and set(started) & set(processes()):
        time.sleep(0.5)
    left = {pid: cmd for pid, cmd in started.items() if pid in processes()}
    assert not left, f"left running after ray.shutdown(): {left}"


class RayApp:
    """`python -m fastllm serve --ray` on the cluster, until SIGTERM."""

    def __init__(self, tmp_path, *args):
        self.port = free_port()
        self.out, self.err = tmp_path / "serve.out", tmp_path / "serve.err"
        with open(self.out, "w") as out, open(self.err, "w") as err:
            self.proc = subprocess.Popen([sys.executable, "-m", "fastllm", "serve", *map(str, args),
                                          "--port", str(self.port)], stdout=out, stderr=err,
                                         env=dict(os.environ, PYTHONPATH=PYTHONPATH))  # with ray.init's RAY_AUTH_MODE
        deadline = time.time() + 150
        while "serving" not in self.out.read_text():
            if self.proc.poll() is not None or time.time() > deadline:
                self.proc.kill()
                raise RuntimeError(f"fastllm serve --ray did not start: {self.err.read_text()[-3000:]}")
            time.sleep(0.2)
        self.url = f"http://127.0.0.1:{self.port}"

    def client(self):
        return openai.OpenAI(base_url=self.url + "/v1", api_key="none", max_retries=0, timeout=60)

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=60)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()


@pytest.fixture(scope="module")
def app(cluster, smollm_flm, tmp_path_factory):
    a = RayApp(tmp_path_factory.mktemp("serve"), smollm_flm, "--ray", "--ray-address", cluster, "--replicas", 2,
               "--threads", 1, "--max-sessions", 4, "--model-name", MODEL, "--embeddings")
    yield a
    assert a.stop() == 0, a.err.read_text()[-3000:]
    assert not replica_servers()  # the replicas stopped their servers


@pytest.fixture(scope="module")
def client(app):
    with app.client() as c:
        yield c


@pytest.fixture(scope="module")
def reference(smollm_flm):
    """One plain fastllm-server on the same model: what Ray's answers must equal."""
    s = Server(smollm_flm, "--max-sessions", 4, "--model-name", MODEL, "--embeddings")
    with s.client() as c:
        yield c
    assert s.stop() == 0


def complete(client, prompt, **kw):
    """(text, replica, usage) of a greedy completion, read through the raw response for its headers."""
    raw = client.completions.with_raw_response.create(model=MODEL, prompt=prompt, temperature=0, **kw)
    r = raw.parse()
    return r.choices[0].text, raw.headers[REPLICA_HEADER], r.usage


def spread(client, prompts, max_tokens=4) -> list:
    """The replicas that served prompts sent 8 at a time."""
    with ThreadPoolExecutor(8) as pool:
        return list(pool.map(lambda p: complete(client, p, max_tokens=max_tokens)[1], prompts))


# -- same answers as one server ---------------------------------------------------------------------

def test_greedy_text_through_ray_equals_one_server(client, reference):
    for prompt in PROMPTS[:4]:
        kw = dict(model=MODEL, prompt=prompt, max_tokens=12, temperature=0)
        want = reference.completions.create(**kw).choices[0].text
        assert client.completions.create(**kw).choices[0].text == want
        assert "".join(c.choices[0].text for c in client.completions.create(stream=True, **kw)) == want
        kw = dict(model=MODEL, messages=[{"role": "user", "content": prompt}], max_tokens=10, temperature=0)
        want = reference.chat.completions.create(**kw).choices[0].message.content
        assert client.chat.completions.create(**kw).choices[0].message.content == want
        streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(stream=True, **kw))
        assert streamed == want


def test_errors_and_other_routes_pass_through(client, reference):
    for c in (client, reference):
        with pytest.raises(openai.BadRequestError) as e:
            c.completions.create(model=MODEL, prompt="Hi", max_tokens=0)
        assert e.value.status_code == 400 and e.value.code == "invalid_value" and e.value.param == "max_tokens"
        with pytest.raises(openai.NotFoundError):
            c.models.retrieve("gpt-4")
    assert [m.id for m in client.models.list().data] == [MODEL]


def test_embeddings_through_ray_equal_one_server(client, reference):
    """/v1/embeddings passes through (--embeddings reaches every replica): one server's vectors."""
    texts = ["The merchant sells swords.", "Where can I buy a blade?"]
    want = [d.embedding for d in reference.embeddings.create(model=MODEL, input=texts).data]
    got = [d.embedding for d in client.embeddings.create(model=MODEL, input=texts).data]
    assert len(got) == 2 and np.allclose(got, want, atol=1e-6)


# -- routing ----------------------------------------------------------------------------------------

def test_different_prompts_are_spread_over_both_replicas(client):
    assert len(set(spread(client, PROMPTS))) == 2
    # one at a time (no replica busy), the same prompt goes to the same replica
    replicas = [complete(client, p, max_tokens=4)[1] for p in PROMPTS]
    assert [complete(client, p, max_tokens=4)[1] for p in PROMPTS] == replicas and len(set(replicas)) == 2


def test_requests_sharing_a_prefix_go_to_one_replica_and_hit_its_cache(client):
    endings = ["The end.", "Lily was happy.", "Tom said goodbye.", "They went home.", "It was fun."]
    first = complete(client, SHARED_PREFIX + endings[0], max_tokens=4)
    rest = [complete(client, SHARED_PREFIX + e, max_tokens=4) for e in endings[1:]]
    assert {replica for _, replica, _ in rest} == {first[1]}
    assert first[2].prompt_tokens > 64  # two cache blocks and more
    # the shared part was not evaluated again: at least one 32-token block of it came from the cache
    assert all(usage.prompt_tokens_details.cached_tokens >= 32 for _, _, usage in rest), [u for *_, u in rest]


# -- failures ---------------------------------------------------------------------------------------

def long_streams(app, client, on_started):
    """Streamed completions of 120 tokens, 3 on each replica (prompts the router sends there), from 6
    threads: fewer than a replica's sessions, so that none waits in a queue. Calls on_started once
    every one has its first chunk, then returns [(replica, "ok" | error message)]."""
    by_replica = {}
    for p in PROMPTS:  # one at a time: each goes where its key does
        by_replica.setdefault(complete(client, p, max_tokens=1)[1], []).append(p)
    assert len(by_replica) == 2, by_replica
    prompts = [p for ps in by_replica.values() for p in ps[:3]]
    started = threading.Barrier(len(prompts) + 1)

    def one(i):
        with app.client() as client:
            raw = client.completions.with_raw_response.create(model=MODEL, prompt=prompts[i], max_tokens=120,
                                                         temperature=0, stream=True, extra_body={"ignore_eos": True})
            replica, chunks = raw.headers[REPLICA_HEADER], iter(raw.parse())
            try:
                next(chunks)
                started.wait(timeout=60)
                finish = [c.choices[0].finish_reason for c in chunks if c.choices]
                return replica, "ok" if finish[-1:] == ["length"] else f"ended early: {finish[-1:]}"
            except openai.APIError as e:
                return replica, str(e)

    with ThreadPoolExecutor(len(prompts)) as pool:
        futures = [pool.submit(one, i) for i in range(len(prompts))]
        started.wait(timeout=60)
        on_started()
        return [f.result(timeout=120) for f in futures]


def recover(client, before: set) -> set:
    """The replicas serving once Ray has replaced one of `before`: every request meanwhile succeeds."""
    deadline = time.time() + 60
    while time.time() < deadline:
        now = set(spread(client, PROMPTS))
        if len(now) == 2 and now != before:
            return now
        time.sleep(0.5)
    raise AssertionError(f"no replacement replica within 60 s (serving: {now})")


def check_only_the_victims_streams_failed(results, victim):
    """The other replica's streams all end well; the victim's fail with the clear error, at least one
    of them (a stream whose server had written all of it before the kill may still arrive whole)."""
    assert {replica for replica, _ in results} >= {victim} and len({r for r, _ in results}) == 2, results
    failed = 0
    for replica, outcome in results:
        if replica == victim and outcome != "ok":
            assert "the replica serving this request failed" in outcome and "not retried" in outcome, outcome
            failed += 1
        else:
            assert outcome == "ok", outcome
    assert failed >= 1, results


def test_a_replica_whose_server_is_killed_is_replaced(client, app):
    before = set(spread(client, PROMPTS))
    servers = replica_servers()
    assert len(servers) == 2
    victim_server = min(servers)
    results = long_streams(app, client, lambda: os.kill(victim_server, signal.SIGKILL))
    after = recover(client, before)
    (victim,) = before - after
    check_only_the_victims_streams_failed(results, victim)
    assert len(replica_servers()) == 2 and victim_server not in replica_servers()


def test_a_replica_whose_process_is_killed_takes_its_server_along(client, app):
    before = set(spread(client, PROMPTS))
    servers = replica_servers()
    victim_server, victim_process = min(servers.items())
    results = long_streams(app, client, lambda: os.kill(victim_process, signal.SIGKILL))
    after = recover(client, before)
    (victim,) = before - after
    check_only_the_victims_streams_failed(results, victim)
    deadline = time.time() + 10  # it went with its replica (no orphan), once its graceful stop was done
    while victim_server in processes() and time.time() < deadline:
        time.sleep(0.2)
    assert victim_server not in processes()
    assert len(replica_servers()) == 2


# -- bad options: refused before Ray starts ----------------------------------------------------------

@pytest.mark.parametrize("args, message", [
    (["--replicas", 0], "replicas must be an integer in [1, 1024], not 0"),
    (["--min-replicas", 3, "--max-replicas", 2], "min replicas (3) is more than max replicas (2)"),
    (["--replicas", 2, "--max-replicas", 4], "not both"),
    (["--min-replicas", 1], "autoscaling needs max replicas"),
    (["--target-ongoing-requests", 2], "needs autoscaling"),
    (["--threads", -1], "threads must be an integer in [1, 1024], not -1"),
    (["--threads", 0], "threads must be an integer in [1, 1024], not 0"),
    (["--max-sessions", 0], "max sessions must be"),
    (["--port", 0], "port must be"),
    (["--route-prefix-chars", -5], "route prefix chars must be"),
    (["--speculative", "fast"], "speculative must be one of off, lookup, draft"),
    (["--speculative", "draft"], "needs a draft model"),
    (["--prefill-chunk", -1], "prefill chunk must be an integer in [0, 1048576], not -1"),
])
def test_bad_options_exit_before_ray_starts(smollm_flm, args, message):
    # Ray at an address where nothing listens: had it been contacted, the error would be another.
    r = fastllm_serve(smollm_flm, "--ray", "--ray-address", "127.0.0.1:1", *args)
    assert r.returncode == 2 and message in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_bad_model_files_exit_before_ray_starts(tmp_path):
    (tmp_path / "notes.txt").write_text("not a model")
    for model, message in [(tmp_path / "missing.flm", "is not a file"),
                           (tmp_path / "notes.txt", "is not a model fastllm can open"),
                           (tmp_path, "is not a file")]:
        r = fastllm_serve(model, "--ray", "--ray-address", "127.0.0.1:1", "--replicas", 2)
        assert r.returncode == 2 and f"model: {model} {message}" in r.stderr, r.stderr


def test_the_python_api_checks_the_same(smollm_flm):
    from fastllm.ray_serve import RayServeOptions, build_app
    build_app(RayServeOptions(model=str(smollm_flm), min_replicas=0, max_replicas=3, target_ongoing_requests=2))
    with pytest.raises(ValueError, match=r"max replicas must be an integer in \[1, 1024\], not 0"):
        build_app(RayServeOptions(model=str(smollm_flm), max_replicas=0))


def test_ray_options_need_ray(smollm_flm):
    r = fastllm_serve(smollm_flm, "--replicas", 2)
    assert r.returncode == 2 and "--replicas needs --ray" in r.stderr


def test_the_serve_extra_pins_the_ray_tested_here():
    import tomllib
    extra = tomllib.loads((REPO / "bindings" / "python" / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]["serve"]
    required = [line.split("#")[0].strip() for line in (REPO / "requirements.txt").read_text().splitlines()
                if line.startswith("ray")]
    assert extra == required == [f"ray[serve]=={ray.__version__}"]
