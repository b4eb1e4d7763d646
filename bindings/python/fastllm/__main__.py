"""Command line: `fastllm` (or `python -m fastllm`) {convert,generate,chat,serve,bench,perplexity,info,devices} ..."""
from __future__ import annotations

import argparse
import sys

from . import FastLLMError, Model, devices, isa


def cmd_generate(args) -> int:
    with Model(args.model, threads=args.threads, **device_of(args)) as m:
        sys.stdout.write(args.prompt)
        for piece in m.generate(args.prompt, args.max_new_tokens, stream=True, **sampling_of(args)):
            sys.stdout.write(piece)
            sys.stdout.flush()
        sys.stdout.write("\n")
    return 0


def device_of(args) -> dict:
    return dict(device=args.device, gpu_layers=args.gpu_layers)


def add_device_flags(p) -> None:
    p.add_argument("--device", help="cpu (default), vulkan, vulkan:N or auto (fastllm devices lists them)")
    p.add_argument("--gpu-layers", type=int, default=-1, help="layers on the device (-1 = all, 0 = none)")


def cmd_devices(args) -> int:
    """The machine's Vulkan devices, as `--device vulkan:N` names them."""
    found = devices()
    if not found:
        from ._lib import lib
        print(f"no Vulkan device: {lib.fastllm_last_error().decode() or 'none found'}")
        return 0
    for d in found:
        state = "usable" if d["usable"] else f"not usable: lacks {d['missing']}"
        print(f"vulkan:{d['index']}  {d['name']}  ({d['vendor']} {d['type']}, Vulkan {d['api_version']}, "
              f"{d['memory_bytes'] / 2**20:.0f} MiB)  {state}")
    return 0


def sampling_of(args) -> dict:
    return dict(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p,
                repetition_penalty=args.repetition_penalty, seed=args.seed, stop=args.stop or None)


def cmd_chat(args) -> int:
    """Interactive chat: each reply streams; Ctrl-C stops the reply, not the program; /reset forgets;
    /quit or end of input leaves."""
    with Model(args.model, threads=args.threads, **device_of(args)) as m, m.session() as s:
        if args.system:
            s.messages = [{"role": "system", "content": args.system}]
        print("fastllm chat: /reset starts over, /quit leaves, Ctrl-C stops a reply.", file=sys.stderr)
        while True:
            try:
                line = input("> ")
            except (EOFError, KeyboardInterrupt):
                print()
                return 0
            if line.strip() in ("/quit", "/exit"):
                return 0
            if line.strip() == "/reset":
                system = s.messages[:1] if args.system else []
                s.reset()
                s.messages = system
                print("(conversation cleared)", file=sys.stderr)
                continue
            if not line.strip():
                continue
            pieces = s.chat(line, args.max_new_tokens, stream=True, **sampling_of(args))
            try:
                for piece in pieces:
                    sys.stdout.write(piece)
                    sys.stdout.flush()
            except KeyboardInterrupt:
                pieces.close()  # asks the library to stop; the interrupted exchange is left out of the conversation
                sys.stdout.write(" [stopped]")
            sys.stdout.write("\n")


def cmd_perplexity(args) -> int:
    from .perplexity import perplexity
    with open(args.text, encoding="utf-8") as f:
        text = f.read()
    with Model(args.model, threads=args.threads, **device_of(args)) as m:
        r = perplexity(m, text, separator=args.separator.encode().decode("unicode_escape"),
                       max_documents=args.max_documents, n_ctx=args.n_ctx)
    print(f"perplexity {r.perplexity:.4f}  (mean NLL {r.mean_nll:.4f} nats over {r.n_tokens} tokens, "
          f"{r.n_documents} documents)")
    return 0


def cmd_info(args) -> int:
    """The file's metadata and tensor table, then what the library makes of the model."""
    flm_reader = import_converter_module("flm_reader")
    f = flm_reader.load_flm(args.model)
    print(f"{args.model}: .flm version {f.version}, {f.file_size / 2**20:.1f} MiB, "
          f"{len(f.metadata)} metadata keys, {len(f.tensors)} tensors")
    for key, value in f.metadata.items():
        if key == "general.quantization":  # how a GGUF file's tensors came over: always in full
            pass
        elif isinstance(value, str) and ("\n" in value or len(value) > 100):
            value = f"<text of {len(value)} characters>"
        elif not isinstance(value, (str, int, float)):
            value = f"<{f.meta_types[key]} of {len(value)}>"
        print(f"  {key} = {value}")
    matrices = {n: t for n, t in f.tensors.items() if len(t.shape) == 2}
    if matrices:
        counts = {}
        for t in matrices.values():
            counts[t.dtype] = counts.get(t.dtype, 0) + 1
        n_weights = sum(t.shape[0] * t.shape[1] for t in matrices.values())
        n_bytes = sum(f.locations[n].n_bytes for n in matrices)
        print(f"  weights: {8 * n_bytes / n_weights:.3f} bits per weight over {len(matrices)} matrices ("
              + ", ".join(f"{d} {c}" for d, c in sorted(counts.items())) + ")")
    if args.tensors:
        print(f"  {'tensor':<36} {'dtype':>6} {'shape':>14} {'offset':>12} {'MiB':>8}")
        for name, t in f.tensors.items():
            loc = f.locations[name]
            print(f"  {name:<36} {t.dtype:>6} {'x'.join(map(str, t.shape)):>14} {loc.offset:>12} "
                  f"{loc.n_bytes / 2**20:8.2f}")
    with Model(args.model) as m:
        print("loaded by the library:")
        for key, value in m.info.items():
            print(f"  {key}: {value}")
        print(f"  chat_template: {'yes' if m.chat_template else 'no'}")
        print(f"  isa: {isa()}")
        with m.session() as s, m.session(swa_full=True) as full:  # their KV caches grow as used: free now
            cap, cap_full = s.memory()["kv_capacity_bytes"], full.memory()["kv_capacity_bytes"]
            line = f"  kv_cache: at most {cap / 2**20:.1f} MiB a session at n_ctx {s.n_ctx} (f16)"
            if cap != cap_full:
                line += f"; sliding-window layers keep only their window ({cap_full / 2**20:.1f} MiB with swa_full)"
            print(line)
    return 0


def import_converter_module(name: str):
    """A module of the converter package: `fastllm.converter` in an installed wheel, else the source
    checkout's converter/, loaded from its folder as the package `converter` (nothing goes on sys.path)."""
    import importlib
    import importlib.util
    from pathlib import Path
    here = Path(__file__).resolve().parent
    if (here / "converter" / "__init__.py").is_file():
        return importlib.import_module(f"{__package__}.converter.{name}")
    folder = here.parents[2] / "converter"
    if not (folder / "__init__.py").is_file():
        raise ImportError("the converter is not installed with this package")
    if "converter" not in sys.modules:
        spec = importlib.util.spec_from_file_location("converter", folder / "__init__.py",
                                                      submodule_search_locations=[str(folder)])
        package = importlib.util.module_from_spec(spec)
        sys.modules["converter"] = package
        spec.loader.exec_module(package)
    return importlib.import_module(f"converter.{name}")


def cmd_bench(args) -> int:
    from .bench import bench
    r = bench(args.model, args.prompt_tokens, args.gen_tokens, args.threads, args.repeat, **device_of(args))
    print(f"{args.model}: {r.backend}, load {r.load_ms:.1f} ms")
    print(f"pp{r.prompt_tokens}: {r.prompt_tok_s:10.1f} tok/s   (median of {args.repeat})")
    print(f"tg{r.generated_tokens}: {r.generate_tok_s:10.1f} tok/s   (median of {args.repeat})")
    return 0


def cmd_convert(argv: list[str]) -> int:
    try:
        convert = import_converter_module("convert")
    except ImportError as e:
        print(f"error: the converter cannot be imported ({e}); install its packages with "
              "pip install 'fastllm[convert]'", file=sys.stderr)
        return 1
    return convert.main(argv, prog="fastllm convert")


def find_server() -> str | None:
    """The fastllm-server executable: $FASTLLM_SERVER_BINARY, else next to the library, else in the
    source checkout's build/."""
    import os
    from pathlib import Path

    from . import library_path
    candidates = [os.environ.get("FASTLLM_SERVER_BINARY"), Path(library_path).parent / "fastllm-server",
                  Path(__file__).resolve().parents[3] / "build" / "fastllm-server"]
    for c in candidates:
        if c and Path(c).is_file() and os.access(c, os.X_OK):
            return str(c)
    return None


RAY_FLAGS = ("ray_address", "replicas", "min_replicas", "max_replicas", "target_ongoing_requests", "route_prefix_chars")


def cmd_serve(args) -> int:
    """Runs the C++ server in place of this process (signals reach it directly); with --ray, its
    replicas on Ray Serve (fastllm.ray_serve)."""
    import os

    from .ray_serve import RayServeOptions, serve, server_args  # imports no Ray until serve() runs
    fields = {k: v for k, v in vars(args).items() if k in RayServeOptions.__dataclass_fields__ and v is not None}
    if args.ray:
        return serve(RayServeOptions(**fields))
    given = [k for k in RAY_FLAGS if getattr(args, k) is not None]
    if given:
        print(f"error: --{given[0].replace('_', '-')} needs --ray", file=sys.stderr)
        return 2
    binary = find_server()
    if binary is None:
        print("error: fastllm-server was not found next to the library or in build/; build it with cmake "
              "(it needs: apt install libcpp-httplib-dev nlohmann-json3-dev) or set FASTLLM_SERVER_BINARY",
              file=sys.stderr)
        return 1
    fields["threads"] = args.threads or 0  # all cores, unlike a replica
    argv = [binary, args.model, "--host", args.host, "--port", str(args.port), *server_args(RayServeOptions(**fields))]
    if args.api_key:
        argv += ["--api-key", args.api_key]
    sys.stdout.flush()
    os.execv(binary, argv)


def add_sampling_flags(p) -> None:
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--temperature", type=float, default=0.8, help="0 = greedy")
    p.add_argument("--top-k", type=int, default=40)
    p.add_argument("--top-p", type=float, default=0.95)
    p.add_argument("--min-p", type=float, default=0.05)
    p.add_argument("--repetition-penalty", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--stop", action="append", help="stop string (repeatable)")
    p.add_argument("--threads", type=int, default=0, help="0 = all cores")
    add_device_flags(p)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["convert"]:
        return cmd_convert(argv[1:])
    p = argparse.ArgumentParser(prog="fastllm", description="fastllm command line (also: python -m fastllm)")
    sub = p.add_subparsers(dest="command", required=True)
    # `convert` is dispatched before parsing (its arguments are the converter's own); listed for --help.
    sub.add_parser("convert", help="HuggingFace folder or GGUF file -> .flm (fastllm convert --help)")
    g = sub.add_parser("generate", help="continue a prompt, streaming the text")
    g.add_argument("model", help=".flm file")
    g.add_argument("prompt")
    add_sampling_flags(g)
    g.set_defaults(func=cmd_generate)
    c = sub.add_parser("chat", help="interactive chat with the model's chat template")
    c.add_argument("model", help=".flm file")
    c.add_argument("--system", help="system message")
    add_sampling_flags(c)
    c.set_defaults(func=cmd_chat)
    pp = sub.add_parser("perplexity", help="perplexity of a model on a text file")
    pp.add_argument("model", help=".flm file")
    pp.add_argument("text", help="UTF-8 text file")
    pp.add_argument("--separator", default="\\n\\n", help="document separator (escapes allowed); '' = one document")
    pp.add_argument("--max-documents", type=int, default=None)
    pp.add_argument("--n-ctx", type=int, default=None, help="window length (default: the model's context)")
    pp.add_argument("--threads", type=int, default=0)
    add_device_flags(pp)
    pp.set_defaults(func=cmd_perplexity)
    sv = sub.add_parser("serve", help="OpenAI-compatible HTTP server (runs fastllm-server; --ray: replicas on Ray)")
    sv.add_argument("model", help=".flm file")
    sv.add_argument("--host", default="127.0.0.1", help="with --ray: of Ray's HTTP proxy")
    sv.add_argument("--port", type=int, default=8080, help="0 = any free port (printed at start; not with --ray)")
    sv.add_argument("--threads", type=int, help="0 = all cores (default); with --ray: per replica, default 1")
    sv.add_argument("--device", help="cpu (default), vulkan, vulkan:N or auto")
    sv.add_argument("--gpu-layers", type=int, help="layers on the device (-1 = all, 0 = none)")
    sv.add_argument("--max-sessions", type=int, default=4, help="requests decoding together (per replica)")
    sv.add_argument("--max-queue", type=int, default=64, help="requests that may wait; more get 503")
    sv.add_argument("--n-ctx", type=int, default=0, help="context length per session (0 = the model's)")
    sv.add_argument("--api-key", help="demand 'Authorization: Bearer KEY'")
    sv.add_argument("--model-name", help="model id for clients (default: the file name)")
    sv.add_argument("--max-body-bytes", type=int, default=1 << 20, help="larger request bodies get 413")
    sv.add_argument("--draft-model", help="a smaller model of the same vocabulary, for speculative decoding")
    sv.add_argument("--speculative", help="requests' default: off, lookup or draft")
    sv.add_argument("--n-draft", type=int, default=5, help="most tokens drafted a step (1 to 16)")
    sv.add_argument("--lora", action="append", metavar="NAME=PATH[:SCALE]",
                    help="a LoRA adapter that requests name as their model or in 'lora' (repeatable; docs/lora.md)")
    sv.add_argument("--embeddings", action="store_true",
                    help="also serve /v1/embeddings with a generating model (an embedding model serves only it)")
    sv.add_argument("--prefill-chunk", type=int, default=256,
                    help="new requests' prompt tokens evaluated a step beside the running ones (0 = whole, on admission)")
    r = sv.add_argument_group("Ray Serve (pip install 'fastllm[serve]'; docs/serving.md)")
    r.add_argument("--ray", action="store_true", help="serve replicas of fastllm-server on Ray Serve")
    r.add_argument("--ray-address", help="join this cluster ('auto', HOST:PORT); default: start one here")
    r.add_argument("--replicas", type=int, help="a fixed number of replicas (default 1)")
    r.add_argument("--min-replicas", type=int, help="autoscaling: fewest replicas (with --max-replicas)")
    r.add_argument("--max-replicas", type=int, help="autoscaling: most replicas")
    r.add_argument("--target-ongoing-requests", type=float,
                   help="autoscaling: requests per replica to aim for (default: --max-sessions)")
    r.add_argument("--route-prefix-chars", type=int,
                   help="prompt characters that choose the replica (default 256; 0 = least loaded)")
    sv.set_defaults(func=cmd_serve)
    b = sub.add_parser("bench", help="prompt and generation speed of a model (tokens/s, medians)")
    b.add_argument("model", help=".flm file")
    b.add_argument("--prompt-tokens", type=int, default=128)
    b.add_argument("--gen-tokens", type=int, default=64)
    b.add_argument("--repeat", type=int, default=3, help="rounds after a warm-up round")
    b.add_argument("--threads", type=int, default=0, help="0 = all cores")
    add_device_flags(b)
    b.set_defaults(func=cmd_bench)
    i = sub.add_parser("info", help="print a .flm file's metadata and tensor table")
    i.add_argument("model", help=".flm file")
    i.add_argument("--no-tensors", dest="tensors", action="store_false", help="leave out the tensor table")
    i.set_defaults(func=cmd_info)
    d = sub.add_parser("devices", help="list the machine's Vulkan devices (for --device vulkan:N)")
    d.set_defaults(func=cmd_devices)
    args = p.parse_args(argv)
    try:
        return args.func(args)
    except (FastLLMError, OSError, ValueError) as e:  # a bad or missing file: a message, not a traceback
        print(f"error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
