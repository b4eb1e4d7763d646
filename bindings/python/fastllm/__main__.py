"""Command line: python -m fastllm {generate,info} ..."""
from __future__ import annotations

import argparse
import sys

from . import FastLLMError, Model, isa


def cmd_generate(args) -> int:
    with Model(args.model, threads=args.threads) as m:
        sys.stdout.write(args.prompt)
        for piece in m.generate(args.prompt, args.max_new_tokens, stream=True, temperature=args.temperature,
                                top_k=args.top_k, top_p=args.top_p, min_p=args.min_p,
                                repetition_penalty=args.repetition_penalty, seed=args.seed, stop=args.stop or None):
            sys.stdout.write(piece)
            sys.stdout.flush()
        sys.stdout.write("\n")
    return 0


def cmd_info(args) -> int:
    with Model(args.model) as m:
        for key, value in m.info.items():
            print(f"{key}: {value}")
        print(f"chat_template: {'yes' if m.chat_template else 'no'}")
        print(f"isa: {isa()}")
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m fastllm", description="fastllm command line")
    sub = p.add_subparsers(dest="command", required=True)
    g = sub.add_parser("generate", help="continue a prompt, streaming the text")
    g.add_argument("model", help=".flm file")
    g.add_argument("prompt")
    g.add_argument("--max-new-tokens", type=int, default=128)
    g.add_argument("--temperature", type=float, default=0.8, help="0 = greedy")
    g.add_argument("--top-k", type=int, default=40)
    g.add_argument("--top-p", type=float, default=0.95)
    g.add_argument("--min-p", type=float, default=0.05)
    g.add_argument("--repetition-penalty", type=float, default=1.0)
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--stop", action="append", help="stop string (repeatable)")
    g.add_argument("--threads", type=int, default=0, help="0 = all cores")
    g.set_defaults(func=cmd_generate)
    i = sub.add_parser("info", help="print a model's metadata")
    i.add_argument("model")
    i.set_defaults(func=cmd_info)
    args = p.parse_args(argv)
    try:
        return args.func(args)
    except FastLLMError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
