"""The Jinja engine (libfastllm/text/jinja.cpp) construct by construct against jinja2 in
transformers' environment (transformers.utils.chat_template_utils: ImmutableSandboxedEnvironment,
trim_blocks, lstrip_blocks, loop controls, its tojson, raise_exception, strftime_now)."""
import ctypes
import json
import time

import pytest
from transformers.utils.chat_template_utils import _compile_jinja_template

import fastllm
from fastllm import _lib as raw


def ours(template: str, **variables) -> str:
    text = json.dumps(variables, ensure_ascii=False).encode()
    n = ctypes.c_size_t()
    cap = 1 << 16
    while True:
        buf = ctypes.create_string_buffer(cap)
        status = raw.lib.fastllm_template_render(template.encode(), text, buf, cap, ctypes.byref(n))
        if status != raw.ERR_BUFFER_TOO_SMALL:
            if status != raw.OK:
                raise fastllm.FastLLMError(status, raw.lib.fastllm_last_error().decode())
            return buf.raw[: n.value].decode()
        cap = n.value + 1


def theirs(template: str, **variables) -> str:
    return _compile_jinja_template(template).render(**variables)


MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi, ünïcödé 🙂"},
            {"role": "assistant", "content": " Hello! ", "tool_calls": [
                {"type": "function", "function": {"name": "f", "arguments": {"x": 1, "y": [1.5, None, True]}}}]},
            {"role": "tool", "content": "{\"ok\": true}"}]
VARS = {"messages": MESSAGES, "n": 7, "f": 2.5, "s": "  Hello, World  ", "items": [3, 1, 2], "names": ["b", "A", "c", "a"],
        "d": {"z": 1, "a": {"k": [1, 2]}, "m": "text"}, "empty": [], "t": True, "none": None,
        "words": "one two  three\tfour", "big": 1e20, "small": 1.5e-7, "neg": -7}

CASES = [
    # output, literals, whitespace control, trim_blocks / lstrip_blocks, comments, raw
    "plain text only",
    "{{ 'a' }}{{ \"b\" }}{{ 1 }}{{ 1.0 }}{{ 2.50 }}{{ true }}{{ none }}{{ [1, 'x', none] }}{{ {'k': 'v'} }}",
    "{{ 'it\\'s' }} {{ \"quote \\\" \\n \\t \\\\ \\u00e9 \\x41\" }} {{ 'adj' 'acent' }}",
    "a  {{- ' b ' -}}  c\n  {%- if t %} d {% endif -%}\n  e",
    "line\n    {% if t %}\n    inside\n    {% endif %}\nafter\n",
    "x {# a comment #} y\n  {# own line #}\nz",
    "{% raw %}{{ not rendered }} {% if %}{% endraw %}!",
    "keep {%+ if t %}plus{% endif +%}\nnext",
    "trailing newline of the template is dropped\n",
    "windows\r\nline\r\nbreaks\r\n{{ 'x' }}",
    # numbers and operators
    "{{ 3 ** 4 }} {{ (-2) ** 5 }} {{ 1 ** 99999 }} {{ 0 ** 0 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 7 / 2 }} {{ 2 ** 10 }} {{ 1 + 2 * 3 - 4 }} {{ (1 + 2) * 3 }}",
    "{{ f * 2 }} {{ n + f }} {{ 0.1 + 0.2 }} {{ big }} {{ small }} {{ 1e3 }} {{ neg }} {{ -neg }} {{ 10 / 4 }} {{ 3.0 // 2 }}",
    "{{ 'ab' ~ 1 ~ none ~ t }} {{ 'a' + 'b' }} {{ 'ab' * 3 }} {{ [1] + [2, 3] }}",
    "{{ 1 < 2 }} {{ 'a' < 'b' }} {{ 1 == 1.0 }} {{ 1 != 2 }} {{ 'x' in 'xyz' }} {{ 2 in items }} {{ 'z' in d }} {{ 5 not in items }}",
    "{{ t and 'yes' }} {{ none or 'fallback' }} {{ not t }} {{ 0 or '' or 'last' }} {{ 'a' if t else 'b' }} {{ 'a' if none }}",
    # names, attributes, items, slices
    "{{ messages[0].role }} {{ messages[0]['content'] }} {{ messages[-1].role }} {{ d.a.k[1] }} {{ d['m'] }}",
    "{{ items[1:] }} {{ items[:-1] }} {{ items[::-1] }} {{ s[2:7] }} {{ 'héllo'[1:3] }} {{ 'héllo'[::-1] }} {{ items[5:] }}",
    "{{ missing }}|{{ d.nothing }}|{{ messages[0].tool_calls is defined }}|{{ missing is undefined }}",
    # if / elif / else, for with loop.*, else, filters in the loop, unpacking, break / continue
    "{% if n > 10 %}big{% elif n > 5 %}medium{% else %}small{% endif %}",
    "{% for m in messages %}{{ loop.index }}/{{ loop.length }} {{ loop.index0 }} {{ loop.revindex }} {{ loop.revindex0 }} "
    "{{ loop.first }} {{ loop.last }} {{ m.role }}|{% endfor %}",
    "{% for m in messages if m.role != 'system' %}{{ loop.index }}:{{ m.role }} {% endfor %}",
    "{% for x in empty %}never{% else %}empty{% endfor %}",
    "{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}",
    "{% for x in items %}{% if x == 1 %}{% continue %}{% endif %}{% if x == 2 %}{% break %}{% endif %}{{ x }}{% endfor %}",
    "{% for x in items %}{{ loop.previtem }}>{{ x }}>{{ loop.nextitem }} {{ loop.cycle('odd', 'even') }};{% endfor %}",
    "{% for a in [1, 2] %}{% for b in 'xy' %}{{ a }}{{ b }}{{ loop.index }}{% endfor %}{% endfor %}",
    "{% for c in 'héllo' %}[{{ c }}]{% endfor %}{% for k in d %}{{ k }}{% endfor %}",
    # set, namespace, block set, scoping
    "{% set x = 1 %}{% for i in range(3) %}{{ x }}{% set x = i + 5 %}{{ x }}|{% endfor %}{{ x }}",
    "{% set ns = namespace(found=false, count=0) %}{% for m in messages %}{% if m.role == 'tool' %}"
    "{% set ns.found = true %}{% endif %}{% set ns.count = ns.count + 1 %}{% endfor %}{{ ns.found }} {{ ns.count }}",
    "{% set block %}inside {{ n }}{% endset %}[{{ block }}]",
    "{% if t %}{% set y = 'set in if' %}{% endif %}{{ y }}",
    # macros and call blocks
    "{% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}{{ greet('A') }} {{ greet('B', '?') }} "
    "{{ greet(name='C', punct='.') }}",
    "{% macro outer() %}<{{ caller() }}>{% endmacro %}{% call outer() %}called {{ n }}{% endcall %}",
    "{% macro m(a) %}{{ a }}{{ n }}{% endmacro %}{% for n in [0] %}{{ m(1) }}{% endfor %}",
    "{% macro rec(k) %}{% if k > 0 %}{{ k }}{{ rec(k - 1) }}{% endif %}{% endmacro %}{{ rec(5) }}",
    # tests
    "{{ n is number }} {{ s is string }} {{ d is mapping }} {{ items is iterable }} {{ items is sequence }} {{ none is none }} "
    "{{ t is boolean }} {{ t is true }} {{ t is false }} {{ n is integer }} {{ f is float }} {{ n is odd }} {{ n is even }} "
    "{{ 9 is divisibleby 3 }} {{ 9 is divisibleby(4) }} {{ n is eq 7 }} {{ 'abc' is lower }} {{ 'ABC' is upper }} "
    "{{ 1 is in items }} {{ n is not string }} {{ range is callable }} {{ n is ge(7) }} {{ none is sameas none }}",
    # filters
    "{{ s|trim }}|{{ s|trim('  H') }}|{{ s|length }}|{{ items|length }}|{{ d|count }}|{{ missing|default('dflt') }}|"
    "{{ ''|default('e', true) }}|{{ names|join(', ') }}|{{ items|first }}|{{ items|last }}|{{ 'abc'|list }}",
    "{{ names|sort }}|{{ names|sort(reverse=true) }}|{{ names|sort(case_sensitive=true) }}|{{ names|unique|list }}|"
    "{{ items|max }}|{{ items|min }}|{{ items|sum }}|{{ items|reverse|list }}|{{ 'abc'|reverse }}",
    "{{ s|lower }}|{{ s|upper }}|{{ 'hello wORLD-x (y)'|title }}|{{ 'hello World'|capitalize }}|{{ s|replace('l', 'L') }}|"
    "{{ s|replace('l', 'L', 1) }}|{{ n|string }}|{{ '42'|int + 1 }}|{{ '4.5'|float }}|{{ 'x'|int }}|{{ f|int }}|{{ neg|abs }}",
    "{{ messages|map(attribute='role')|join(',') }}|{{ messages|selectattr('role', 'equalto', 'user')|list|length }}|"
    "{{ messages|rejectattr('role', 'in', ['system', 'tool'])|map(attribute='role')|list }}|"
    "{{ items|select('odd')|list }}|{{ items|reject('odd')|list }}|{{ ['a', 'B']|map('upper')|list }}|"
    "{{ messages|selectattr('tool_calls')|list|length }}|{{ messages|selectattr('tool_calls', 'defined')|list|length }}",
    "{{ d|dictsort }}|{{ d|items|list }}|{{ items|batch(2)|list }}|{{ items|batch(2, 0)|list }}|{{ 3.14159|round(2) }}|"
    "{{ 2.5|round }}|{{ 3.7|round(0, 'floor') }}|{{ 'a b c'|wordcount }}|{{ '<a&b>'|e }}|{{ '<x>'|safe }}",
    "{{ 'l1\nl2\n\nl4'|indent }}|{{ 'l1\nl2'|indent(2, true) }}|{{ 'l1\n\nl3'|indent(width=3, blank=true) }}|"
    "{{ 'l1\nl2'|indent('> ') }}",
    # tojson as transformers defines it
    "{{ d|tojson }}|{{ messages[2]|tojson }}|{{ 'ünï \"q\" \\\\ \n'|tojson }}|{{ [1.0, 1e-05, 1e16, -0.0]|tojson }}",
    "{{ d|tojson(indent=2) }}|{{ d|tojson(indent=4, sort_keys=true) }}|{{ d|tojson(separators=(',', ':')) }}|"
    "{{ empty|tojson(indent=2) }}|{{ {}|tojson }}",
    # str / list / dict methods
    "{{ s.strip() }}|{{ s.lstrip() }}|{{ s.rstrip() }}|{{ 'xxaxx'.strip('x') }}|{{ s.upper() }}|{{ s.lower() }}|"
    "{{ s.startswith('  He') }}|{{ s.endswith(('x', 'd  ')) }}|{{ s.replace('o', '0') }}|{{ s.find('World') }}|"
    "{{ s.count('l') }}|{{ s.title() }}|{{ 'abc'.capitalize() }}|{{ 'x'.join(['a', 'b']) }}",
    "{{ words.split() }}|{{ words.split(' ') }}|{{ 'a,b,,c'.split(',') }}|{{ 'a,b,c'.split(',', 1) }}|"
    "{{ 'a,b,c'.rsplit(',', 1) }}|{{ 'l1\nl2\r\nl3'.splitlines() }}|{{ '12'.isdigit() }}|{{ ' '.isspace() }}|"
    "{{ '{} and {}'.format('x', 1) }}",
    "{{ d.keys()|list }}|{{ d.values()|list|length }}|{{ d.get('m') }}|{{ d.get('none', 'dflt') }}|{{ d.get('none') }}|"
    "{{ items.index(2) }}|{{ items.count(3) }}",
    # globals
    "{{ range(3)|list }}|{{ range(1, 7, 2)|list }}|{{ range(5, 0, -2)|list }}|{{ dict(a=1, b='x') }}|"
    "{{ namespace(a=1).a }}",
    # python str() of values inside text
    "{{ messages[2].tool_calls }} {{ [none, t, 1.5, 'q\\'s', \"d\\\"q\"] }} {{ {'a': [1, {'b': none}]} }}",
    # the generation tag transformers adds
    "{% for m in messages %}{% if m.role == 'assistant' %}{% generation %}{{ m.content }}{% endgeneration %}"
    "{% endif %}{% endfor %}",
    # filter blocks
    "{% filter upper %}shout {{ n }}{% endfilter %}",
    # markupsafe: Markup + str escapes the str (functionary's template relies on it)
    "{{ \"'\"|safe + d|tojson }}|{{ 'a<' + '>b'|safe }}|{{ ('<'|e) + '<' }}|{{ '<'|e|e }}|{{ '<'|safe ~ '<' }}",
    # dictionaries with other keys than strings (ByteDance Seed-OSS's budget table)
    "{% set t = {0: 'zero', 512: 'half', 1.5: 'f', none: 'n'} %}{{ t[512] }} {{ t[0] }} {{ 512 in t }} {{ t }} {{ t|tojson }}",
    # filters of the select / map family on none: nothing
    "{% set x = none %}{{ x|selectattr('type', 'equalto', 'a')|list }}{{ x|map(attribute='a')|list }}",
]


@pytest.mark.parametrize("case", range(len(CASES)))
def test_construct_renders_as_jinja2(case):
    template = CASES[case]
    assert ours(template, **VARS) == theirs(template, **VARS)


def test_strftime_now_is_todays_date():
    template = "{{ strftime_now('%d %b %Y') }}"
    before = theirs(template)
    got = ours(template)
    assert got in (before, theirs(template))  # the same day unless midnight passed between


ERRORS = [
    ("{% if x %}", "missing {% endif %}"),
    ("{{ 'unterminated }}", "unterminated string"),
    ("{{ x | no_such_filter }}", "no filter named 'no_such_filter'"),
    ("{{ x is no_such_test }}", "no test named 'no_such_test'"),
    ("{% frobnicate %}", "unknown statement 'frobnicate'"),
    ("line one\n  {{ 1 + }}", "line 2, column"),
    ("{{ raise_exception('Conversation roles must alternate') }}", "Conversation roles must alternate"),
    ("{{ missing.attr }}", "'missing' is undefined"),
    ("{{ 1 // 0 }}", "division or modulo by zero"),
    ("{{ 'a' + 1 }}", "unsupported operand type(s) for +"),
    ("{% set ns = 3 %}{% set ns.a = 1 %}", "non-namespace"),
    ("{{ [1].append(2) }}", "unsafe"),
    ("{{ (1,2,3,4,5,6,7,8,9,10)|tojson(indent=2) }} {% for %}", "expected a name"),
    ("{{" + "(" * 5000 + "1" + ")" * 5000 + "}}", "nested too deeply"),
]


@pytest.mark.parametrize("template,message", ERRORS, ids=[m for _, m in ERRORS])
def test_errors_are_clear_and_name_the_place(template, message):
    with pytest.raises(fastllm.FastLLMError) as e:
        ours(template, x=1)
    assert e.value.status == raw.ERR_INVALID_ARGUMENT
    assert message in str(e.value)
    assert "line" in str(e.value) or "alternate" in message


HOSTILE = [
    ("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", "steps"),
    ("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}", "nested deeper"),
    ("{% set s = 'x' * 1000000 %}{% for i in range(100) %}{{ s }}{% endfor %}", "bytes"),
    ("{{ 'x' * 100000000000 }}", "bytes"),
    ("{% set ns = namespace(s='ab') %}{% for i in range(60) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}", "bytes"),
    ("{{ range(100000000)|length }}", "steps"),
    ("{{ 1 ** 1000000000000000 }}{{ 'x'|center(1000000000000) }}", "bytes"),
    ("{{ 'a\nb'|indent(1000000000000) }}", "bytes"),
    ("{{ [1]|tojson(indent=1000000000000) }}", "bytes"),
    # values nested a million deep (printing or freeing them would recurse that deep), and cycles
    ("{% set ns = namespace(x=1) %}{% for i in range(1000000) %}{% set ns.x = [ns.x] %}{% endfor %}{{ ns.x }}",
     "nested deeper"),
    ("{% set a = 1 %}" + "{% set a = [a] %}" * 2000 + "{{ a }}", "nested deeper"),
    ("{% set ns = namespace(x=1) %}{% set ns.x = [ns] %}{{ ns }}", "nested deeper"),
    ("{% set ns = namespace(x=1) %}{% for i in range(1000000) %}{% set ns.x = [ns.x]|batch(1)|list %}{% endfor %}",
     "nested deeper"),
    # a 30 MB string copied again and again: the copies' bytes count as steps
    ("{% set ns = namespace(s='x' * 30000000) %}{% for i in range(1000000) %}{% set ns.t = ns.s ~ 'y' %}{% endfor %}",
     "steps"),
]


@pytest.mark.parametrize("template,what", HOSTILE, ids=[w + str(i) for i, (_, w) in enumerate(HOSTILE)])
def test_hostile_templates_end_with_an_error(template, what):
    start = time.monotonic()
    with pytest.raises(fastllm.FastLLMError) as e:
        ours(template)
    assert what in str(e.value)
    assert time.monotonic() - start < 30


def test_bad_variables_are_errors_not_crashes():
    deep = b"{\"a\": " + b"[" * 100000 + b"]" * 100000 + b"}"  # converted recursively: refused, not a stack overflow
    for text in (b"not json", b"[1, 2]", b"{\"a\": ", deep):
        n = ctypes.c_size_t()
        buf = ctypes.create_string_buffer(64)
        assert raw.lib.fastllm_template_render(b"{{ a }}", text, buf, 64, ctypes.byref(n)) == raw.ERR_INVALID_ARGUMENT
    assert raw.lib.fastllm_template_render(None, b"{}", None, 0, ctypes.byref(n)) == raw.ERR_INVALID_ARGUMENT


def test_render_template_from_python_needs_no_model():
    template = "{{ bos_token }}{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}" \
               "{% if add_generation_prompt %}<assistant>{% endif %}{{ tools|length if tools else 'no tools' }}"
    messages = [{"role": "user", "content": "hi"}]
    kwargs = dict(bos_token="<s>")
    assert fastllm.render_template(template, messages, add_generation_prompt=True, **kwargs) == \
        theirs(template, messages=messages, add_generation_prompt=True, **kwargs)
    tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
    assert fastllm.render_template(template, messages, tools=tools, **kwargs) == \
        theirs(template, messages=messages, tools=tools, add_generation_prompt=False, **kwargs)
    with pytest.raises(fastllm.FastLLMError) as e:
        fastllm.render_template("{% if %}", messages)
    assert "line 1, column" in str(e.value)
