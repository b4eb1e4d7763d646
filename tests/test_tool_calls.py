"""Tool calls: each format's parser on real output strings (and malformed ones, which stay text),
the grammars of tool_choice "required" / named (sampled calls parse and their arguments validate
with jsonschema), and the server's tools through the official openai client."""
import json

import jsonschema
import pytest

import fastllm
from test_chat_template import QWEN25, TEMPLATES

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city.",
    "parameters": {"type": "object", "additionalProperties": False, "required": ["city"],
                   "properties": {"city": {"type": "string", "maxLength": 12},
                                  "unit": {"type": "string", "enum": ["c", "f"]}}}}}
MOVE = {"type": "function", "function": {
    "name": "move_to", "description": "Walk to a place.",
    "parameters": {"type": "object", "additionalProperties": False, "required": ["x", "y"],
                   "properties": {"x": {"type": "integer", "minimum": 0, "maximum": 99},
                                  "y": {"type": "integer", "minimum": 0, "maximum": 99}}}}}
TOOLS = [WEATHER, MOVE]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}

# A template of each format, as far as the format's detection reads it
FORMAT_TEMPLATES = {
    "hermes": QWEN25,
    "glm4.5": "{# <tool_call>{{ name }}<arg_key>k</arg_key> #}",
    "mistral": "{{ '[TOOL_CALLS]' }}",
    "functools": "{{ '<|tool|>' }}",
    "llama3": "{{ '<|start_header_id|>' }}{{ '<|python_tag|>' }}",
    "glm4": "[gMASK]<sop>{{ '<|observation|>' }}",
    "generic": "{% for m in messages %}{{ m.content }}{% endfor %}",
}

PARAMS = '{"city": "Paris", "unit": "c"}'
OUTPUTS = [  # (format, reply, content, [(name, arguments)])
    ("hermes", '<tool_call>\n{"name": "get_weather", "arguments": ' + PARAMS + '}\n</tool_call>', "",
     [("get_weather", PARAMS)]),
    ("hermes", 'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>\n'
               '<tool_call>\n{"name": "move_to", "arguments": {"x": 1, "y": 2}}\n</tool_call>', "Let me check.",
     [("get_weather", '{"city": "Rome"}'), ("move_to", '{"x": 1, "y": 2}')]),
    ("hermes", '<tool_call>\n{"name": "get_weather", "arguments": "{\\"city\\": \\"Oslo\\"}"}', "",
     [("get_weather", '{"city": "Oslo"}')]),  # arguments as text; the reply ended before </tool_call>
    ("glm4.5", "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n<arg_key>unit</arg_key>"
               "\n<arg_value>c</arg_value>\n</tool_call>", "", [("get_weather", PARAMS)]),
    ("mistral", '[TOOL_CALLS][{"name": "get_weather", "arguments": ' + PARAMS + '}]', "", [("get_weather", PARAMS)]),
    ("mistral", 'Sure. [TOOL_CALLS]get_weather[ARGS]' + PARAMS + '[TOOL_CALLS]move_to[ARGS]{"x": 3, "y": 4}', "Sure.",
     [("get_weather", PARAMS), ("move_to", '{"x": 3, "y": 4}')]),
    ("functools", 'functools[{"name": "get_weather", "arguments": ' + PARAMS + '}]', "", [("get_weather", PARAMS)]),
    ("llama3", '{"name": "get_weather", "parameters": ' + PARAMS + '}', "", [("get_weather", PARAMS)]),
    ("llama3", '<|python_tag|>{"name": "move_to", "parameters": {"x": 5, "y": 6}}; {"name": "get_weather", '
               '"parameters": {"city": "Lima"}}', "", [("move_to", '{"x": 5, "y": 6}'), ("get_weather", '{"city": "Lima"}')]),
    ("glm4", 'get_weather\n' + PARAMS, "", [("get_weather", PARAMS)]),
    ("generic", '{"name": "get_weather", "arguments": ' + PARAMS + '}', "", [("get_weather", PARAMS)]),
    ("generic", '{"tool_calls": [{"name": "move_to", "arguments": {"x": 0, "y": 9}}]}', "", [("move_to", '{"x": 0, "y": 9}')]),
]

MALFORMED = [
    ("hermes", '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par'),      # cut inside the JSON
    ("hermes", '<tool_call>\n{"name": "launch_missiles", "arguments": {}}\n</tool_call>'),  # not a tool
    ("hermes", '<tool_call>\n{"name": "get_weather", "arguments": [1, 2]}\n</tool_call>'),  # not an object
    ("mistral", '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}'),
    ("llama3", 'The weather is {"sunny": true}'),
    ("generic", '{"answer": 42}'),
    ("generic", "Just text, no call."),
    ("glm4", "get_weather\nnot json"),
    ("hermes", '<tool_call>{"name": "get_weather", "arguments": {"city": ' + "[" * 50000 + "]" * 50000 + "}}</tool_call>"),
]


@pytest.mark.parametrize("fmt,reply,content,calls", OUTPUTS, ids=[f"{f}-{i}" for i, (f, *_ ) in enumerate(OUTPUTS)])
def test_each_format_parses_its_calls(stories_model, fmt, reply, content, calls):
    out = stories_model.parse_tool_calls(reply, TOOLS, template=FORMAT_TEMPLATES[fmt])
    assert out["format"] == fmt
    assert out["content"] == content
    got = [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in out["tool_calls"]]
    assert got == [(n, json.loads(a)) for n, a in calls]
    assert all(c["type"] == "function" and c["id"] for c in out["tool_calls"])


@pytest.mark.parametrize("fmt,reply", MALFORMED, ids=[f"{f}-{i}" for i, (f, _) in enumerate(MALFORMED)])
def test_malformed_calls_stay_text(stories_model, fmt, reply):
    out = stories_model.parse_tool_calls(reply, TOOLS, template=FORMAT_TEMPLATES[fmt])
    assert out["tool_calls"] == [] and out["content"] == reply


SAFE = [  # (format, text so far, bytes that may be streamed as text)
    ("hermes", "Hello", 5), ("hermes", "Hello <tool", 6), ("hermes", "Hello <tool_call>{", 6), ("hermes", "a < b", 5),
    ("mistral", "Sure [TOOL_", 5), ("functools", "ok functools[", 3),
    ("generic", "  {", 0), ("generic", "   ", 0), ("generic", "Hi {", 4), ("llama3", "[", 0), ("llama3", "Hi", 2),
    ("llama3", "Hi <|python_tag|>", 3), ("glm4", "get_weather", 0),
]


@pytest.mark.parametrize("fmt,text,safe", SAFE, ids=[f"{f}-{i}" for i, (f, *_ ) in enumerate(SAFE)])
def test_the_text_a_stream_may_send_before_calls(stories_model, fmt, text, safe):
    import ctypes
    from fastllm import _lib as raw
    n = ctypes.c_size_t()
    t = FORMAT_TEMPLATES[fmt].encode()
    assert raw.lib.fastllm_chat_tool_text_safe(stories_model.handle, t, text.encode(), 0, ctypes.byref(n)) == raw.OK
    assert n.value == safe
    assert raw.lib.fastllm_chat_tool_text_safe(stories_model.handle, t, text.encode(), 1, ctypes.byref(n)) == raw.OK
    assert n.value == len(text.encode())


def test_the_families_templates_have_their_formats(stories_model):
    expect = {"qwen2.5": "hermes", "qwen3": "hermes", "mistral-v0.3": "mistral"}
    for family, fmt in expect.items():
        assert stories_model.parse_tool_calls("x", template=TEMPLATES[family])["format"] == fmt, family


@pytest.mark.parametrize("fmt", ["hermes", "mistral", "functools", "llama3", "generic"])
@pytest.mark.parametrize("choice", ["required", "move_to"])
def test_constrained_calls_parse_and_validate(stories_model, fmt, choice):
    template = FORMAT_TEMPLATES[fmt]
    # one call: a random model would go on adding calls until max_new_tokens
    grammar = stories_model.tool_call_grammar(TOOLS, choice, template=template)
    for seed in (1, 2, 3):
        text = stories_model.generate("Once upon a time", 300, grammar=grammar, temperature=1.0, seed=seed)
        out = stories_model.parse_tool_calls(text, TOOLS, template=template)
        assert out["tool_calls"], text
        for call in out["tool_calls"]:
            name = call["function"]["name"]
            assert choice == "required" or name == choice
            jsonschema.validate(json.loads(call["function"]["arguments"]), SCHEMAS[name])


def test_each_format_has_its_auto_triggers(stories_model):
    want = {"hermes": ["<tool_call>"], "mistral": ["[TOOL_CALLS]"], "functools": ["functools"], "llama3": ["^{"],
            "generic": ["^{", "^["]}
    for fmt, triggers in want.items():
        assert stories_model.tool_call_triggers(template=FORMAT_TEMPLATES[fmt]) == triggers, fmt
        # the grammars begin where the triggers are: a required call matches from a trigger on
        grammar = stories_model.tool_call_grammar(TOOLS, parallel=True, template=FORMAT_TEMPLATES[fmt])
        text = stories_model.generate("Once upon a time", 300, grammar=grammar, temperature=1.0, seed=4)
        assert any(text.lstrip().startswith(t.lstrip("^")) if t.startswith("^") else text.startswith(t)
                   for t in triggers), (fmt, text)
    for fmt in ("glm4", "glm4.5"):
        with pytest.raises(fastllm.FastLLMError) as e:
            stories_model.tool_call_triggers(template=FORMAT_TEMPLATES[fmt])
        assert e.value.status_name == "FASTLLM_ERR_UNSUPPORTED"


def test_grammar_errors_are_clear(stories_model):
    with pytest.raises(fastllm.FastLLMError) as e:
        stories_model.tool_call_grammar(TOOLS, "no_such_tool", template=QWEN25)
    assert "no_such_tool" in str(e.value)
    with pytest.raises(fastllm.FastLLMError) as e:
        stories_model.tool_call_grammar(TOOLS, template=FORMAT_TEMPLATES["glm4"])
    assert e.value.status_name == "FASTLLM_ERR_UNSUPPORTED"


def test_session_chat_with_tools_returns_the_call(stories_model):
    with stories_model.session() as s:
        s.messages = []
        # stories260K has no template: the Qwen2.5 one is given through the model-free path
        prompt = stories_model.apply_chat_template([{"role": "user", "content": "Weather in Paris?"}], template=QWEN25,
                                                   tools=TOOLS)
        assert "get_weather" in prompt and "<tools>" in prompt


# -- the server, through the official openai client (SmolLM2: its template has no tool format, so
#    calls are the generic JSON object) -------------------------------------------------------------

@pytest.fixture(scope="module")
def smollm_server(smollm_flm):
    from test_server import Server
    s = Server(smollm_flm, "--max-sessions", 2)
    yield s
    assert s.stop() == 0


MESSAGES = [{"role": "user", "content": "What is the weather in Paris? Use the tool."}]


def test_server_required_and_named_calls_validate(smollm_server):
    with smollm_server.client() as c:
        name = c.models.list().data[0].id
        for choice in ("required", {"type": "function", "function": {"name": "move_to"}}):
            for seed in (1, 2):
                # one call: with parallel calls allowed, SmolLM2-135M lists calls until max_tokens
                r = c.chat.completions.create(model=name, messages=MESSAGES, tools=TOOLS, tool_choice=choice,
                                              parallel_tool_calls=False, max_tokens=200, seed=seed)
                msg = r.choices[0].message
                assert r.choices[0].finish_reason == "tool_calls", msg
                assert msg.tool_calls, msg
                for call in msg.tool_calls:
                    assert call.id.startswith("call_") and call.type == "function"
                    assert choice == "required" or call.function.name == "move_to"
                    jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


def test_server_streamed_calls_reassemble_to_the_unstreamed_ones(smollm_server):
    with smollm_server.client() as c:
        name = c.models.list().data[0].id
        kw = dict(model=name, messages=MESSAGES, tools=TOOLS, tool_choice="required", parallel_tool_calls=False,
                  max_tokens=200, temperature=0)
        whole = c.chat.completions.create(**kw).choices[0].message.tool_calls
        calls, finish = {}, None
        for chunk in c.chat.completions.create(stream=True, **kw):
            if not chunk.choices:
                continue
            for d in chunk.choices[0].delta.tool_calls or []:
                entry = calls.setdefault(d.index, {"name": "", "arguments": ""})
                entry["name"] += d.function.name or ""
                entry["arguments"] += d.function.arguments or ""
            finish = chunk.choices[0].finish_reason or finish
        assert finish == "tool_calls"
        assert [(calls[i]["name"], json.loads(calls[i]["arguments"])) for i in sorted(calls)] == \
            [(t.function.name, json.loads(t.function.arguments)) for t in whole]


def test_server_takes_tool_results_and_auto_never_fails(smollm_server):
    with smollm_server.client() as c:
        name = c.models.list().data[0].id
        messages = MESSAGES + [
            {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {
                "name": "get_weather", "arguments": json.dumps({"city": "Paris"})}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": json.dumps({"temperature": 21})}]
        for choice in ("auto", "none"):
            r = c.chat.completions.create(model=name, messages=messages, tools=TOOLS, tool_choice=choice, max_tokens=24,
                                          seed=3)
            msg = r.choices[0].message
            assert r.choices[0].finish_reason in ("stop", "length", "tool_calls")
            assert msg.content or msg.tool_calls
            if choice == "none":
                assert not msg.tool_calls
        # auto, streamed: text is sent as it comes (up to where a call could begin) and adds up to
        # the unstreamed reply
        kw = dict(model=name, messages=messages, tools=TOOLS, max_tokens=24, temperature=0)
        whole = c.chat.completions.create(**kw).choices[0].message
        pieces = [ch.choices[0].delta.content or "" for ch in c.chat.completions.create(stream=True, **kw) if ch.choices]
        if not whole.tool_calls:
            assert "".join(pieces) == whole.content


def _shot(question, call):
    return [{"role": "user", "content": question}, {"role": "assistant", "content": json.dumps(call)}]


# SmolLM2-135M answers in its own words when told about tools, but after three calls in the generic
# format it begins its reply with '{' nearly always; free, the arguments it then writes often break
# the schema (city for move_to, "country" for get_weather).
FEW_SHOT = (_shot("What is the weather in Rome?", {"name": "get_weather", "arguments": {"city": "Rome"}})
            + _shot("Walk to 3, 4.", {"name": "move_to", "arguments": {"x": 3, "y": 4}})
            + _shot("What is the weather in Oslo?", {"name": "get_weather", "arguments": {"city": "Oslo"}})
            + [{"role": "user", "content": "What is the weather in Paris?"}])


def _valid_or_text(content, calls):
    """auto: a reply that begins a call (generic format: '{' or '[') is calls that validate."""
    if calls:
        for c in calls:
            jsonschema.validate(json.loads(c["function"]["arguments"]), SCHEMAS[c["function"]["name"]])
        return 1
    assert not (content or "").lstrip().startswith(("{", "[")), content
    return 0


def test_session_chat_auto_constrains_a_call_once_it_begins(smollm):
    n_calls = 0
    for seed in (0, 1, 5):
        with smollm.session() as s:
            r = s.chat(FEW_SHOT, 60, tools=TOOLS, temperature=1.0, seed=seed)
            n_calls += _valid_or_text(r["content"], r.get("tool_calls"))
    assert n_calls >= 2


def test_server_auto_constrains_a_call_once_it_begins(smollm_server):
    with smollm_server.client() as c:
        name = c.models.list().data[0].id
        n_calls = 0
        for seed in (1, 2, 5):
            r = c.chat.completions.create(model=name, messages=FEW_SHOT, tools=TOOLS, max_tokens=60, seed=seed,
                                          temperature=1.0)
            msg = r.choices[0].message
            calls = [t.model_dump() for t in msg.tool_calls or []]
            n_calls += _valid_or_text(msg.content, calls)
            if calls:
                assert r.choices[0].finish_reason == "tool_calls"
        assert n_calls >= 2
        # streamed: the same calls
        kw = dict(model=name, messages=FEW_SHOT, tools=TOOLS, max_tokens=60, seed=2, temperature=1.0)
        whole = c.chat.completions.create(**kw).choices[0].message.tool_calls or []
        calls = {}
        for chunk in c.chat.completions.create(stream=True, **kw):
            for d in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
                entry = calls.setdefault(d.index, {"name": "", "arguments": ""})
                entry["name"] += d.function.name or ""
                entry["arguments"] += d.function.arguments or ""
        assert [(calls[i]["name"], json.loads(calls[i]["arguments"])) for i in sorted(calls)] == \
            [(t.function.name, json.loads(t.function.arguments)) for t in whole]


@pytest.fixture(scope="module")
def hermes_server(tmp_path_factory):
    """stories260K carrying a template of the hermes format (its chat_template.jinja; Qwen2.5's own
    lists the tools in more tokens than stories260K's 512 of context): the hermes format served."""
    import shutil
    from conftest import STORIES, convert
    from test_server import Server
    hf = tmp_path_factory.mktemp("hermes") / "hf"
    shutil.copytree(STORIES / "hf", hf)
    (hf / "chat_template.jinja").write_text(
        "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}{# tool calls: <tool_call> #}"
        "{% if add_generation_prompt %}assistant: {% endif %}")
    s = Server(convert(hf, hf.parent / "stories-hermes.flm"), "--max-sessions", 2)
    yield s
    assert s.stop() == 0


def test_server_hermes_calls_validate_and_stream(hermes_server):
    with hermes_server.client() as c:
        name = c.models.list().data[0].id
        # one call (with parallel calls a random model lists calls until max_tokens) to move_to,
        # whose longest call (whitespace runs of up to 21 bytes at its 9 places, 2-digit numbers)
        # is under 260 bytes, so under 300 tokens whatever this ISA samples
        for choice, tools in (("required", TOOLS[1:]), ({"type": "function", "function": {"name": "move_to"}}, TOOLS)):
            r = c.chat.completions.create(model=name, messages=MESSAGES, tools=tools, tool_choice=choice, seed=7,
                                          parallel_tool_calls=False, max_tokens=300, temperature=1.0)
            msg = r.choices[0].message
            assert r.choices[0].finish_reason == "tool_calls" and msg.tool_calls, msg
            for call in msg.tool_calls:
                assert choice == "required" or call.function.name == "move_to"
                jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])
        # auto, streamed: a story (stories260K never writes <tool_call>), sent as it comes
        kw = dict(model=name, messages=MESSAGES, tools=TOOLS, max_tokens=40, temperature=0)
        whole = c.chat.completions.create(**kw).choices[0].message
        pieces = [ch.choices[0].delta.content or "" for ch in c.chat.completions.create(stream=True, **kw) if ch.choices]
        assert not whole.tool_calls and len(pieces) > 2 and "".join(pieces) == whole.content


def test_server_rejects_bad_tools_with_400(smollm_server):
    import openai
    with smollm_server.client() as c:
        name = c.models.list().data[0].id
        bad = [dict(tools=[{"type": "function", "function": {}}]),
               dict(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "fly"}}),
               dict(tools=TOOLS, tool_choice="sometimes"),
               dict(tools=TOOLS, tool_choice="required", response_format={"type": "json_object"})]
        for kw in bad:
            with pytest.raises(openai.BadRequestError):
                c.chat.completions.create(model=name, messages=MESSAGES, max_tokens=4, **kw)
