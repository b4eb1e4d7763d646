"""Chat template rendering time: a 20-message conversation with tools, tool calls and tool results
through the library's Jinja engine (fastllm.render_template: parse and render; and a model's own
template, parsed once and cached: Model.apply_chat_template) against transformers' jinja2
(compiled once, as apply_chat_template caches it), alternating, median of the rounds, in ms.

    python3 bench/bench_templates.py [--template PATH.jinja] [--rounds 7] [--calls 200]

Default template: Qwen2.5-Instruct's (tests/test_chat_template.py). Prints the CPU's name.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "bench"), str(REPO / "tests"), str(REPO / "bindings" / "python")]
from bench_before_after import cpu_name  # noqa: E402


def conversation():
    from test_chat_template import TOOLS
    msgs = [{"role": "system", "content": "You are a shopkeeper NPC in a fantasy town."}]
    for k in range(6):
        msgs.append({"role": "user", "content": f"Question {k}: what does the blue potion cost, and is it in stock?"})
        msgs.append({"role": "assistant", "content": "", "tool_calls": [{"id": f"call_{k}", "type": "function", "function": {
            "name": "get_weather", "arguments": {"city": f"Town {k}", "unit": "c"}}}]})
        msgs.append({"role": "tool", "tool_call_id": f"call_{k}", "content": "{\"price\": 12, \"stock\": 3}"})
    msgs.append({"role": "user", "content": "Then I will take two."})
    return msgs[:20], TOOLS


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--template", type=Path)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--calls", type=int, default=200)
    args = ap.parse_args()
    import fastllm
    from test_chat_template import QWEN25, STORIES
    from transformers.utils.chat_template_utils import _compile_jinja_template
    template = args.template.read_text() if args.template else QWEN25
    messages, tools = conversation()
    kw = dict(messages=messages, tools=tools, add_generation_prompt=True, bos_token="<s>", eos_token="</s>")
    compiled = _compile_jinja_template(template)
    expected = compiled.render(**kw)
    model = fastllm.Model(str(REPO / "build" / "stories260K.flm")) if (REPO / "build" / "stories260K.flm").exists() else None

    def engine():
        return fastllm.render_template(template, messages, tools=tools, add_generation_prompt=True,
                                       bos_token="<s>", eos_token="</s>")

    def jinja2():
        return compiled.render(**kw)

    runs = {"fastllm render_template (parse + render)": engine, "transformers jinja2 (compiled once)": jinja2}
    assert engine() == expected
    times = {k: [] for k in runs}
    for r in range(args.rounds):
        order = list(runs) if r % 2 == 0 else list(runs)[::-1]
        for name in order:
            t = time.perf_counter()
            for _ in range(args.calls):
                runs[name]()
            times[name].append((time.perf_counter() - t) / args.calls * 1e3)
    print(f"CPU: {cpu_name()}; {len(messages)} messages, {len(tools)} tool(s), {len(expected)} characters of prompt")
    for name, ts in times.items():
        print(f"  {name:45s} median {statistics.median(ts):.3f} ms  (rounds: {', '.join(f'{t:.3f}' for t in ts)})")
    a, b = (statistics.median(times[k]) for k in runs)
    print(f"  ratio jinja2 / engine: {b / a:.2f}x")
    del model


if __name__ == "__main__":
    main()
