"""Writes the committed seed corpora of the fuzz targets into tests/fuzz/corpus/ (run once; the
fuzzers grow their own corpora from these in build-fuzz/). Usage: make_seeds.py"""
import json
import struct
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests"), str(REPO / "bindings" / "python")]

from converter.convert import convert  # noqa: E402
from hf_models import make_model  # noqa: E402

MICRO = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
             num_key_value_heads=1)


def write(target, name, data: bytes):
    d = HERE / "corpus" / target
    d.mkdir(parents=True, exist_ok=True)
    (d / name).write_bytes(data)


def flm_seeds():
    """Micro models of the families (one layer, hidden 16), in the dtypes with their own code paths."""
    with tempfile.TemporaryDirectory() as tmp:
        for family, dtype in [("llama", "f32"), ("qwen2", "int8"), ("qwen3", "f16"), ("phi3", "bf16"),
                              ("mistral", "f32"), ("glm4", "f32"), ("gemma3", "f32")]:
            extra = dict(head_dim=8) if family in ("qwen3", "glm4") else {}
            if family == "gemma3":  # a window shorter than the fuzzer's prompts, q/k and sandwich norms
                extra = dict(head_dim=8, query_pre_attn_scalar=8, sliding_window=2)
            folder = make_model(tmp, family, name=family, **MICRO, **extra)
            out = Path(tmp) / f"{family}.flm"
            convert(str(folder), str(out), dtype=dtype, progress=False)
            write("flm", f"{family}-{dtype}", out.read_bytes())  # no .flm: *.flm is ignored


def tokenizer_seeds():
    texts = ["Hello world", "<|im_start|>user\nHi<|im_end|>\n", "<|user|>\nHi there<|end|>\n<|assistant|>\n",
             "  two  spaces\tand tab\n\n", "日本語 é 🙂", "123456 3.14 don't", "\xff\xfe invalid"]
    for i, t in enumerate(texts):
        data = t.encode("utf-8", "surrogateescape") if "\xff" not in t else b"\xff\xfe invalid \x00 nul"
        for model in (0, 1):
            write("tokenizer", f"encode-{i}-{model}", bytes([model | (i % 2) << 1]) + data)
    for model in (0, 1):
        write("tokenizer", f"decode-{model}", bytes([model | 2 << 1]) + struct.pack("<6i", 1, 2, 300, 515, -1, 1 << 30))
        write("tokenizer", f"pieces-{model}", bytes([model | 3 << 1]) + struct.pack("<4i", 0, 3, 259, 516))


def chat_template_seeds():
    from test_chat_template import TEMPLATES
    convo = ["system", "Be brief.", "user", "Hi <think>x</think>", "assistant", "<think>\nhmm\n</think>\n\nHello",
             "user", "And then?"]
    for name, text in TEMPLATES.items():
        for flags in (1, 0 | 2 << 1, 1 | 8):
            write("chat_template", f"{name}-{flags}", bytes([flags]) + "\0".join([text] + convo).encode())
    write("chat_template", "own-template", bytes([1]) + "\0".join([""] + convo[2:4]).encode())
    # the Jinja engine's constructs (tests/test_jinja.py) and hostile templates that end at a limit
    from test_jinja import CASES
    for i, text in enumerate(CASES):
        write("chat_template", f"jinja-{i}", bytes([1]) + "\0".join([text] + convo).encode())
    # replies in each tool-call format, for the parser (the last message's content)
    from test_tool_calls import FORMAT_TEMPLATES, OUTPUTS, MALFORMED
    for i, (fmt, reply, *_) in enumerate(OUTPUTS + MALFORMED):
        write("chat_template", f"tool-reply-{i}", bytes([1 | 16]) + "\0".join([FORMAT_TEMPLATES[fmt], "user", "x",
                                                                               "assistant", reply]).encode())
    hostile = ["{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}", "{{" + "(" * 300 + "1" + ")" * 300 + "}}",
               "{% set s = 'x' * 4000000 %}{% for i in range(10) %}{{ s }}{% endfor %}", "{% if %}", "{{ 'a' ~ }}"]
    for i, text in enumerate(hostile):
        write("chat_template", f"jinja-hostile-{i}", bytes([1]) + "\0".join([text] + convo).encode())


def server_request_seeds():
    bodies = [
        {"model": "m", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8, "stream": True,
         "stream_options": {"include_usage": True}, "temperature": 0.5, "stop": ["\n", "END"], "seed": 3},
        {"prompt": "Once upon", "max_tokens": 4, "top_p": 0.9, "top_k": 40, "min_p": 0.05, "repetition_penalty": 1.1},
        {"prompt": [1, 2, 3], "max_tokens": 2, "ignore_eos": True, "n": 1, "logprobs": None},
        {"messages": [{"role": "developer", "content": [{"type": "text", "text": "x"}]}], "response_format": {"type": "text"}},
        {"content": "Hello", "add_special": True},
        {"tokens": [1, 2, 3]},
    ]
    for i, b in enumerate(bodies):
        write("server_request", f"body-{i}.json", json.dumps(b).encode())
    write("server_request", "not-json", b'{"prompt": "x", ')


def grammar_seeds():
    """GBNF grammars and JSON schemas (from tests/test_grammar.py), each with text to feed after a NUL."""
    from test_grammar import ARITHMETIC, LIST, MIXED, NESTED_SCHEMA, NPC_SCHEMA, UNICODE
    seeds = {
        "arithmetic": (ARITHMETIC, "12*(3+-4)/5"), "list": (LIST, "Shopping list:\n- eggs\n- milk\n"),
        "unicode": (UNICODE, "αβ 中文😀é."), "mixed": (MIXED, "<abc>x!!ab\\"),
        "any": ("root ::= .* [^a-z]{2,4} \"\\u00e9\" \"\\U0001F600\"", "xyz 12é😀"),
        "npc": (json.dumps(NPC_SCHEMA), '{"action": "say", "text": "Hi\\n", "mood": -3}'),
        "nested": (json.dumps(NESTED_SCHEMA), '{"items": [{"id": 120, "tags": ["a"]}], "kind": null, "zz": 5}'),
        "object": ('{"type": "object"}', '{\n  "a": [1, 2.5e-3, true, null, {"b": "c"}]\n}'),
        "formats": ('{"type": "array", "items": {"type": "string", "format": "date-time"}, "maxItems": 2}',
                    '["2024-01-31T12:00:00Z"]'),
    }
    lazy = {  # a trigger (after byte 0xFF and its length - 1) and free text before the match
        "lazy_tag": ('root ::= "<tool_call>{" [a-z]{1,5} "}</tool_call>"', "<tool_call>", "Sure. <tool_call>{abc}</tool_call>"),
        "lazy_json": (json.dumps(NPC_SCHEMA), "^{", ' {"action": "give", "text": "a"}'),
    }
    for name, (text, trigger, feed) in lazy.items():
        seeds[name] = (text, feed)
    for name, (text, feed) in seeds.items():
        data, pieces, at = feed.encode(), b"", 0
        while at < len(data):  # pieces of 1, 2, 3, 4, 1, ... bytes, each after a byte giving its size - 1
            n = 1 + len(pieces) % 4
            pieces += bytes([n - 1]) + data[at:at + n]
            at += n
        head = bytes([0xFF, len(lazy[name][1]) - 1]) + lazy[name][1].encode() if name in lazy else b""
        write("grammar", name, text.encode() + b"\0" + head + pieces)


if __name__ == "__main__":
    flm_seeds()
    tokenizer_seeds()
    chat_template_seeds()
    server_request_seeds()
    grammar_seeds()
    for d in sorted((HERE / "corpus").iterdir()):
        files = list(d.iterdir())
        print(d.name, len(files), "files", sum(f.stat().st_size for f in files), "bytes")
