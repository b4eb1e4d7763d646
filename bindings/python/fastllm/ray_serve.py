"""fastllm-server replicas on Ray Serve: `fastllm serve MODEL.flm --ray --replicas 2` (docs/serving.md).

Each replica runs fastllm-server (continuous batching, prefix cache) on loopback; one ingress
forwards the OpenAI routes to them, choosing a replica by the prompt's first characters
(fastllm.ray_router). Options are checked here before Ray is imported or started, so a mistake
costs no cluster. Ray is an optional extra: pip install 'fastllm[serve]'.
"""
from __future__ import annotations

import os
import signal
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

APP_NAME = "fastllm"
SPECULATIVE_MODES = ("off", "lookup", "draft")
# How often Ray asks a replica whether its fastllm-server is alive (Ray's default is 10 s): a dead
# one is replaced within about this long.
HEALTH_CHECK_PERIOD_S = 2.0
# The ingress only awaits I/O; Ray's default limit of 5 would queue the sixth request in the proxy.
INGRESS_MAX_ONGOING_REQUESTS = 4096


@dataclass
class RayServeOptions:
    model: str
    replicas: int | None = None          # a fixed count (1 when neither this nor the bounds are given)
    min_replicas: int | None = None      # autoscaling bounds
    max_replicas: int | None = None
    target_ongoing_requests: float | None = None  # per replica, for the autoscaler (default: max_sessions)
    threads: int = 1                     # per replica; also the CPUs it reserves from Ray
    max_sessions: int = 4                # fastllm-server's own options, the same on every replica
    max_queue: int = 64
    n_ctx: int = 0
    api_key: str | None = None
    model_name: str | None = None
    max_body_bytes: int = 1 << 20
    draft_model: str | None = None
    speculative: str | None = None
    n_draft: int = 5
    prefill_chunk: int = 256
    device: str | None = None            # fastllm-server --device (docs/gpu.md)
    gpu_layers: int = -1
    embeddings: bool = False             # fastllm-server --embeddings: /v1/embeddings beside generation
    lora: tuple[str, ...] = ()           # fastllm-server --lora NAME=PATH[:SCALE], each (docs/lora.md)
    route_prefix_chars: int = 256        # prompt characters that choose the replica; 0 = least loaded
    host: str = "127.0.0.1"              # Ray's HTTP proxy
    port: int = 8080
    ray_address: str | None = None       # an existing cluster ("auto", "HOST:PORT"); None starts one here

    @property
    def autoscaling(self) -> bool:
        return self.min_replicas is not None or self.max_replicas is not None

    @property
    def initial_replicas(self) -> int:
        if self.autoscaling:
            return max(self.min_replicas or 0, 1)
        return 1 if self.replicas is None else self.replicas


def _range(problems, name, value, lo, hi):
    if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
        problems.append(f"{name} must be an integer in [{lo}, {hi}], not {value!r}")


def _model_problem(flag: str, path: str | None) -> str | None:
    """Why the library cannot open path as a model, or None."""
    if not path:
        return f"{flag}: no model given"
    if not Path(path).is_file():
        return f"{flag}: {path} is not a file"
    from . import FastLLMError, Model
    try:
        Model(path).close()  # maps the file and reads its header and tables: cheap even for big models
    except FastLLMError as e:
        return f"{flag}: {path} is not a model fastllm can open ({e})"
    return None


def check(o: RayServeOptions) -> list[str]:
    """Everything wrong with the options, in words; empty when they may start."""
    problems = []
    if o.replicas is not None and o.autoscaling:
        problems.append("give either replicas (a fixed count) or min/max replicas (autoscaling), not both")
    if o.replicas is not None:
        _range(problems, "replicas", o.replicas, 1, 1024)
    if o.autoscaling:
        if o.min_replicas is not None:
            _range(problems, "min replicas", o.min_replicas, 0, 1024)
        if o.max_replicas is None:
            problems.append("autoscaling needs max replicas")
        else:
            _range(problems, "max replicas", o.max_replicas, 1, 1024)
            if isinstance(o.min_replicas, int) and isinstance(o.max_replicas, int) and o.min_replicas > o.max_replicas:
                problems.append(f"min replicas ({o.min_replicas}) is more than max replicas ({o.max_replicas})")
    elif o.target_ongoing_requests is not None:
        problems.append("target ongoing requests needs autoscaling (min/max replicas)")
    if o.target_ongoing_requests is not None and not (isinstance(o.target_ongoing_requests, (int, float))
                                                      and o.target_ongoing_requests > 0):
        problems.append(f"target ongoing requests must be a number above 0, not {o.target_ongoing_requests!r}")
    _range(problems, "threads", o.threads, 1, 1024)  # 0 (all cores) would not say what to reserve from Ray
    _range(problems, "max sessions", o.max_sessions, 1, 1024)  # the ranges of fastllm-server's options
    _range(problems, "max queue", o.max_queue, 0, 100000)
    _range(problems, "n_ctx", o.n_ctx, 0, 1 << 24)
    _range(problems, "max body bytes", o.max_body_bytes, 1024, 1 << 30)
    _range(problems, "n_draft", o.n_draft, 1, 16)
    _range(problems, "prefill chunk", o.prefill_chunk, 0, 1 << 20)
    _range(problems, "route prefix chars", o.route_prefix_chars, 0, 1 << 20)
    _range(problems, "port", o.port, 1, 65535)
    if o.speculative is not None and o.speculative not in SPECULATIVE_MODES:
        problems.append(f"speculative must be one of {', '.join(SPECULATIVE_MODES)}, not {o.speculative!r}")
    if o.speculative == "draft" and not o.draft_model:
        problems.append("speculative 'draft' needs a draft model")
    for flag, path in (("model", o.model), ("draft model", o.draft_model)):
        if flag == "model" or path:
            problem = _model_problem(flag, path)
            if problem:
                problems.append(problem)
    from .__main__ import find_server
    if find_server() is None:
        problems.append("fastllm-server was not found next to the library or in build/ (build it with cmake, "
                        "or set FASTLLM_SERVER_BINARY)")
    if o.ray_address is None and isinstance(o.threads, int) and not problems:
        need, cores = o.initial_replicas * o.threads, os.cpu_count() or 1
        if need > cores:
            problems.append(f"{o.initial_replicas} replicas of {o.threads} threads need {need} CPUs; this machine "
                            f"has {cores} (give fewer, or join a cluster with --ray-address)")
    return problems


def server_args(o: RayServeOptions) -> list[str]:
    """fastllm-server's options (model, host, port and API key aside): each replica's, and those of
    plain `fastllm serve`."""
    args = ["--threads", o.threads, "--max-sessions", o.max_sessions, "--max-queue", o.max_queue, "--n-ctx", o.n_ctx,
            "--max-body-bytes", o.max_body_bytes, "--n-draft", o.n_draft, "--prefill-chunk", o.prefill_chunk]
    if o.model_name:
        args += ["--model-name", o.model_name]
    if o.draft_model:
        args += ["--draft-model", os.path.abspath(o.draft_model)]
    if o.speculative:
        args += ["--speculative", o.speculative]
    if o.device:
        args += ["--device", o.device, "--gpu-layers", o.gpu_layers]
    if o.embeddings:
        args.append("--embeddings")
    for spec in o.lora:
        args += ["--lora", _absolute_lora(spec)]
    return [str(a) for a in args]


def _absolute_lora(spec: str) -> str:
    """NAME=PATH[:SCALE] with PATH made absolute (replicas run elsewhere than this directory)."""
    name, eq, rest = spec.partition("=")
    if not eq:
        name, rest = "", spec
    path, colon, scale = rest.rpartition(":")
    try:
        float(scale)
    except ValueError:
        path, colon, scale = rest, "", ""
    return (f"{name}=" if eq else "") + os.path.abspath(path) + colon + scale


def _runtime_env() -> dict:
    """What the replicas' processes need from this one's environment to import fastllm and find
    the library and fastllm-server, when those are not installed where every Python looks."""
    env = {k: os.environ[k] for k in ("FASTLLM_LIBRARY", "FASTLLM_SERVER_BINARY") if k in os.environ}
    package_parent = Path(__file__).resolve().parents[1]
    if package_parent.name not in ("site-packages", "dist-packages"):  # a source checkout
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(package_parent), os.environ.get("PYTHONPATH")]))
    return {"env_vars": env} if env else {}


def build_app(o: RayServeOptions):
    """The Ray Serve application (for serve.run); ValueError when the options are wrong."""
    problems = check(o)
    if problems:
        raise ValueError("; ".join(problems))
    return _application(o)


def _application(o: RayServeOptions):
    """build_app for options already checked."""
    from ray.serve.config import RequestRouterConfig

    from .ray_app import FastllmIngress, FastllmReplica
    from .ray_router import PrefixAffinityRouter
    if o.autoscaling:
        scaling = {"autoscaling_config": {
            "min_replicas": o.min_replicas or 0, "max_replicas": o.max_replicas, "initial_replicas": o.initial_replicas,
            "target_ongoing_requests": o.target_ongoing_requests or o.max_sessions}}
    else:
        scaling = {"num_replicas": o.initial_replicas}
    runtime_env = _runtime_env()
    replicas = FastllmReplica.options(
        ray_actor_options={"num_cpus": o.threads, "runtime_env": runtime_env},
        # what its server takes without answering 503 busy; more wait in Ray's router
        max_ongoing_requests=o.max_sessions + o.max_queue,
        health_check_period_s=HEALTH_CHECK_PERIOD_S,
        request_router_config=RequestRouterConfig(request_router_class=PrefixAffinityRouter,
                                                  request_router_kwargs={"free_sessions": o.max_sessions}),
        **scaling,
    ).bind(os.path.abspath(o.model), server_args(o), o.api_key)
    return FastllmIngress.options(ray_actor_options={"num_cpus": 0, "runtime_env": runtime_env},
                                  max_ongoing_requests=INGRESS_MAX_ONGOING_REQUESTS,
                                  ).bind(replicas, o.route_prefix_chars)


def serve(o: RayServeOptions) -> int:
    """Checks the options, deploys the application, serves until SIGINT or SIGTERM, then removes
    it (and stops the cluster if it started one). The exit code of `fastllm serve --ray`."""
    problems = check(o)
    if problems:
        for p in problems:
            print(f"fastllm serve --ray: error: {p}", file=sys.stderr)
        return 2
    if o.ray_address is None:
        # The cluster started here is this machine's alone: Ray's processes talk over loopback
        # (on Linux Ray otherwise uses the address of the default route; read when ray is imported).
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    try:
        import ray
        from ray import serve as ray_serve
    except ImportError as e:
        print(f"fastllm serve --ray: error: Ray is not installed ({e}); pip install 'fastllm[serve]'", file=sys.stderr)
        return 2
    ray.init(address=o.ray_address, logging_level="WARNING")
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):  # after ray.init, which sets handlers of its own
        signal.signal(sig, lambda *_: stop.set())
    try:
        cpus = ray.cluster_resources().get("CPU", 0)
        if o.initial_replicas * o.threads > cpus:
            print(f"fastllm serve --ray: error: {o.initial_replicas} replicas of {o.threads} threads need "
                  f"{o.initial_replicas * o.threads} CPUs; the cluster has {cpus:g}", file=sys.stderr)
            return 1
        ray_serve.start(http_options={"host": o.host, "port": o.port})
        try:
            ray_serve.run(_application(o), name=APP_NAME, route_prefix="/")
        except RuntimeError as e:  # the replicas failed to start (their logs say why)
            print(f"fastllm serve --ray: error: {e}", file=sys.stderr)
            ray_serve.delete(APP_NAME)
            return 1
        name = o.model_name or Path(o.model).name.removesuffix(".flm")
        scaling = (f"{o.min_replicas or 0} to {o.max_replicas} replicas" if o.autoscaling
                   else f"{o.initial_replicas} replicas")
        routing = (f"prompts' first {o.route_prefix_chars} characters choose the replica" if o.route_prefix_chars
                   else "least loaded replica")
        print(f"fastllm serve --ray: serving '{name}' on http://{o.host}:{o.port}/v1 ({scaling} of fastllm-server, "
              f"{o.threads} threads each; {routing})", flush=True)
        while not stop.wait(1.0):
            pass
        print("fastllm serve --ray: stopping", file=sys.stderr, flush=True)
        ray_serve.delete(APP_NAME)
        if o.ray_address is None:
            ray_serve.shutdown()
        return 0
    finally:
        ray.shutdown()
