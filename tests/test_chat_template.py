"""Chat templates rendered by the C++ library against transformers' apply_chat_template."""
import ctypes
import shutil
import subprocess

import pytest
from transformers import AutoTokenizer

import fastllm
from fastllm import _lib as raw
from conftest import REPO, STORIES
from hf_models import GLM4_TEMPLATE

# Templates of the families we recognise, as the model repositories ship them (tokenizer_config.json's
# chat_template). The long ones are raw strings: a "\n" in them is Jinja's escape, a line break a line break.

# Qwen/Qwen2.5-7B-Instruct (the Qwen2.5-Instruct line shares it)
QWEN25 = r"""{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}
    {%- else %}
        {{- '<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\n<tool_call>\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- message.content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
"""

# Qwen/Qwen3-0.6B (the Qwen3 line as first released)
QWEN3 = r"""{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content + '\n\n' }}
    {%- endif %}
    {{- "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0].role == 'system' %}
        {{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" and not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {%- set content = message.content %}
        {%- set reasoning_content = '' %}
        {%- if message.reasoning_content is defined and message.reasoning_content is not none %}
            {%- set reasoning_content = message.reasoning_content %}
        {%- else %}
            {%- if '</think>' in message.content %}
                {%- set content = message.content.split('</think>')[-1].lstrip('\n') %}
                {%- set reasoning_content = message.content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') %}
            {%- endif %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index %}
            {%- if loop.last or (not loop.last and reasoning_content) %}
                {{- '<|im_start|>' + message.role + '\n<think>\n' + reasoning_content.strip('\n') + '\n</think>\n\n' + content.lstrip('\n') }}
            {%- else %}
                {{- '<|im_start|>' + message.role + '\n' + content }}
            {%- endif %}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\n' + content }}
        {%- endif %}
        {%- if message.tool_calls %}
            {%- for tool_call in message.tool_calls %}
                {%- if (loop.first and content) or (not loop.first) %}
                    {{- '\n' }}
                {%- endif %}
                {%- if tool_call.function %}
                    {%- set tool_call = tool_call.function %}
                {%- endif %}
                {{- '<tool_call>\n{"name": "' }}
                {{- tool_call.name }}
                {{- '", "arguments": ' }}
                {%- if tool_call.arguments is string %}
                    {{- tool_call.arguments }}
                {%- else %}
                    {{- tool_call.arguments | tojson }}
                {%- endif %}
                {{- '}\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- message.content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\n\n</think>\n\n' }}
    {%- endif %}
{%- endif %}"""

# mistralai/Mistral-7B-Instruct-v0.1 as first released (the copy in TheBloke/Mistral-7B-Instruct-v0.1-GPTQ)
MISTRAL_V01 = (r"{{ bos_token }}{% for message in messages %}"
               r"{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
               r"{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
               r"{% endif %}{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
               r"{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token + ' ' }}{% else %}"
               r"{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}")

# mistralai/Mistral-7B-Instruct-v0.2 as first released, and Mixtral-8x7B-Instruct-v0.1
MISTRAL_V02 = (r"{{ bos_token }}{% for message in messages %}"
               r"{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
               r"{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
               r"{% endif %}{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
               r"{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token}}{% else %}"
               r"{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}")

# mistralai/Mistral-7B-Instruct-v0.1 and -v0.2 as shipped now (Mistral's 'v1' template)
MISTRAL_V1 = r"""{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content'] %}
    {%- set loop_messages = messages[1:] %}
{%- else %}
    {%- set loop_messages = messages %}
{%- endif %}

{{- bos_token }}
{%- for message in loop_messages %}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}
        {{- raise_exception('After the optional system message, conversation roles must alternate user/assistant/user/assistant/...') }}
    {%- endif %}
    {%- if message['role'] == 'user' %}
        {%- if loop.first and system_message is defined %}
            {{- ' [INST] ' + system_message + '\n\n' + message['content'] + ' [/INST]' }}
        {%- else %}
            {{- ' [INST] ' + message['content'] + ' [/INST]' }}
        {%- endif %}
    {%- elif message['role'] == 'assistant' %}
        {{- ' ' + message['content'] + eos_token}}
    {%- else %}
        {{- raise_exception('Only user and assistant roles are supported, with the exception of an initial optional system message!') }}
    {%- endif %}
{%- endfor %}
"""

# mistralai/Mistral-7B-Instruct-v0.3
MISTRAL_V03 = r"""{%- if messages[0]["role"] == "system" %}
    {%- set system_message = messages[0]["content"] %}
    {%- set loop_messages = messages[1:] %}
{%- else %}
    {%- set loop_messages = messages %}
{%- endif %}
{%- if not tools is defined %}
    {%- set tools = none %}
{%- endif %}
{%- set user_messages = loop_messages | selectattr("role", "equalto", "user") | list %}

{#- This block checks for alternating user/assistant messages, skipping tool calling messages #}
{%- set ns = namespace() %}
{%- set ns.index = 0 %}
{%- for message in loop_messages %}
    {%- if not (message.role == "tool" or message.role == "tool_results" or (message.tool_calls is defined and message.tool_calls is not none)) %}
        {%- if (message["role"] == "user") != (ns.index % 2 == 0) %}
            {{- raise_exception("After the optional system message, conversation roles must alternate user/assistant/user/assistant/...") }}
        {%- endif %}
        {%- set ns.index = ns.index + 1 %}
    {%- endif %}
{%- endfor %}

{{- bos_token }}
{%- for message in loop_messages %}
    {%- if message["role"] == "user" %}
        {%- if tools is not none and (message == user_messages[-1]) %}
            {{- "[AVAILABLE_TOOLS] [" }}
            {%- for tool in tools %}
                {%- set tool = tool.function %}
                {{- '{"type": "function", "function": {' }}
                {%- for key, val in tool.items() if key != "return" %}
                    {%- if val is string %}
                        {{- '"' + key + '": "' + val + '"' }}
                    {%- else %}
                        {{- '"' + key + '": ' + val|tojson }}
                    {%- endif %}
                    {%- if not loop.last %}
                        {{- ", " }}
                    {%- endif %}
                {%- endfor %}
                {{- "}}" }}
                {%- if not loop.last %}
                    {{- ", " }}
                {%- else %}
                    {{- "]" }}
                {%- endif %}
            {%- endfor %}
            {{- "[/AVAILABLE_TOOLS]" }}
            {%- endif %}
        {%- if loop.last and system_message is defined %}
            {{- "[INST] " + system_message + "\n\n" + message["content"] + "[/INST]" }}
        {%- else %}
            {{- "[INST] " + message["content"] + "[/INST]" }}
        {%- endif %}
    {%- elif message.tool_calls is defined and message.tool_calls is not none %}
        {{- "[TOOL_CALLS] [" }}
        {%- for tool_call in message.tool_calls %}
            {%- set out = tool_call.function|tojson %}
            {{- out[:-1] }}
            {%- if not tool_call.id is defined or tool_call.id|length != 9 %}
                {{- raise_exception("Tool call IDs should be alphanumeric strings with length 9!") }}
            {%- endif %}
            {{- ', "id": "' + tool_call.id + '"}' }}
            {%- if not loop.last %}
                {{- ", " }}
            {%- else %}
                {{- "]" + eos_token }}
            {%- endif %}
        {%- endfor %}
    {%- elif message["role"] == "assistant" %}
        {{- " " + message["content"]|trim + eos_token}}
    {%- elif message["role"] == "tool_results" or message["role"] == "tool" %}
        {%- if message.content is defined and message.content.content is defined %}
            {%- set content = message.content.content %}
        {%- else %}
            {%- set content = message.content %}
        {%- endif %}
        {{- '[TOOL_RESULTS] {"content": ' + content|string + ", " }}
        {%- if not message.tool_call_id is defined or message.tool_call_id|length != 9 %}
            {{- raise_exception("Tool call IDs should be alphanumeric strings with length 9!") }}
        {%- endif %}
        {{- '"call_id": "' + message.tool_call_id + '"}[/TOOL_RESULTS]' }}
    {%- else %}
        {{- raise_exception("Only user and assistant roles are supported, with the exception of an initial optional system message!") }}
    {%- endif %}
{%- endfor %}
"""

# microsoft/Phi-3-mini-4k-instruct and -128k-instruct
PHI3 = (r"{% for message in messages %}{% if message['role'] == 'system' %}"
        r"{{'<|system|>\n' + message['content'] + '<|end|>\n'}}{% elif message['role'] == 'user' %}"
        r"{{'<|user|>\n' + message['content'] + '<|end|>\n'}}{% elif message['role'] == 'assistant' %}"
        r"{{'<|assistant|>\n' + message['content'] + '<|end|>\n'}}{% endif %}{% endfor %}"
        r"{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% else %}{{ eos_token }}{% endif %}")

# microsoft/Phi-3.5-mini-instruct
PHI35 = (r"{% for message in messages %}{% if message['role'] == 'system' and message['content'] %}"
         r"{{'<|system|>\n' + message['content'] + '<|end|>\n'}}{% elif message['role'] == 'user' %}"
         r"{{'<|user|>\n' + message['content'] + '<|end|>\n'}}{% elif message['role'] == 'assistant' %}"
         r"{{'<|assistant|>\n' + message['content'] + '<|end|>\n'}}{% endif %}{% endfor %}"
         r"{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% else %}{{ eos_token }}{% endif %}")

# microsoft/Phi-3-small-8k-instruct
PHI3_SMALL = (r"{{ bos_token }}{% for message in messages %}"
              r"{{'<|' + message['role'] + '|>' + '\n' + message['content'] + '<|end|>\n' }}{% endfor %}"
              r"{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% else %}{{ eos_token }}{% endif %}")

# microsoft/Phi-4-mini-instruct
PHI4_MINI = (r"{% for message in messages %}"
             r"{% if message['role'] == 'system' and 'tools' in message and message['tools'] is not none %}"
             r"{{ '<|' + message['role'] + '|>' + message['content'] + '<|tool|>' + message['tools'] + '<|/tool|>' + '<|end|>' }}"
             r"{% else %}{{ '<|' + message['role'] + '|>' + message['content'] + '<|end|>' }}{% endif %}"
             r"{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>' }}{% else %}{{ eos_token }}{% endif %}")

# The families and variants we render.
# google/gemma-3-1b-it's tokenizer_config.json: the system message goes before the first user turn
GEMMA3 = """{{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
    {%- if messages[0]['content'] is string -%}
        {%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}
    {%- else -%}
        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\n\n' -%}
    {%- endif -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set first_user_prefix = "" -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}
    {%- endif -%}
    {%- if (message['role'] == 'assistant') -%}
        {%- set role = "model" -%}
    {%- else -%}
        {%- set role = message['role'] -%}
    {%- endif -%}
    {{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else "") }}
    {%- if message['content'] is string -%}
        {{ message['content'] | trim }}
    {%- elif message['content'] is iterable -%}
        {%- for item in message['content'] -%}
            {%- if item['type'] == 'image' -%}
                {{ '<start_of_image>' }}
            {%- elif item['type'] == 'text' -%}
                {{ item['text'] | trim }}
            {%- endif -%}
        {%- endfor -%}
    {%- else -%}
        {{ raise_exception("Invalid content type") }}
    {%- endif -%}
    {{ '<end_of_turn>\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{'<start_of_turn>model\n'}}
{%- endif -%}
"""
# THUDM/chatglm3-6b (tokenizer_config.json, as llama.cpp's tests/test-chat-template.cpp quotes it)
CHATGLM3 = ("{% for message in messages %}{% if loop.first %}[gMASK]sop<|{{ message['role'] }}|>\n "
            "{{ message['content'] }}{% else %}<|{{ message['role'] }}|>\n {{ message['content'] }}{% endif %}"
            "{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}")
# THUDM/glm-4-9b-chat(-hf) (tests/hf_models.py quotes it from the same source)
GLM4 = GLM4_TEMPLATE

TEMPLATES = {
    "chatml": "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
              "'<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
              "{% endif %}",
    "smollm2": "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
               "{{ '<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
               "<|im_end|>\\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
               "'<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
               "{% endif %}",
    "llama2": "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}{% set system_message = "
              "messages[0]['content'] %}{% else %}{% set loop_messages = messages %}{% set system_message = false %}"
              "{% endif %}{% for message in loop_messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0)"
              " %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
              "{% endif %}{% if loop.index0 == 0 and system_message != false %}{% set content = '<<SYS>>\\n' + "
              "system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}{% else %}{% set content = "
              "message['content'] %}{% endif %}{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + "
              "content.strip() + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ ' '  + content.strip() + "
              "' ' + eos_token }}{% endif %}{% endfor %}",
    "llama3": "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
              "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + "
              "'<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}"
              "{{ content }}{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant"
              "<|end_header_id|>\\n\\n' }}{% endif %}",
    "zephyr": "{% for message in messages %}\n{% if message['role'] == 'user' %}\n{{ '<|user|>\n' + message['content']"
              " + eos_token }}\n{% elif message['role'] == 'system' %}\n{{ '<|system|>\n' + message['content'] + "
              "eos_token }}\n{% elif message['role'] == 'assistant' %}\n{{ '<|assistant|>\n'  + message['content'] + "
              "eos_token }}\n{% endif %}\n{% if loop.last and add_generation_prompt %}\n{{ '<|assistant|>' }}\n"
              "{% endif %}\n{% endfor %}",
    "gemma": "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}"
             "{% endif %}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
             "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
             "{% if (message['role'] == 'assistant') %}{% set role = 'model' %}{% else %}{% set role = "
             "message['role'] %}{% endif %}{{ '<start_of_turn>' + role + '\\n' + message['content'] | trim + "
             "'<end_of_turn>\\n' }}{% endfor %}{% if add_generation_prompt %}{{'<start_of_turn>model\\n'}}{% endif %}",
    "gemma3": GEMMA3,
    "qwen2.5": QWEN25,
    "qwen3": QWEN3,
    "mistral-v0.1": MISTRAL_V01,
    "mistral-v0.2": MISTRAL_V02,
    "mistral-v1": MISTRAL_V1,
    "mistral-v0.3": MISTRAL_V03,
    "phi3": PHI3,
    "phi3.5": PHI35,
    "phi3-small": PHI3_SMALL,
    "phi4-mini": PHI4_MINI,
    "chatglm3": CHATGLM3,
    "glm4": GLM4,
}

SYSTEM = {"role": "system", "content": "You are a terse pirate.\n"}
CONVERSATIONS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [SYSTEM, {"role": "user", "content": "  Hi there!  "}],
    [{"role": "user", "content": "Hello"}, {"role": "assistant", "content": " Ahoy, matey! "},
     {"role": "user", "content": "Où est la bibliothèque? 🙂\nLine two."}],
    [SYSTEM, {"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"}],
    # ends with the assistant (Mistral v0.3 then drops the system message)
    [SYSTEM, {"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"},
     {"role": "assistant", "content": "d\n"}],
    # Unicode whitespace at the edges (Jinja's trim and str.strip() remove it, U+001F included)
    [{"role": "user", "content": "\u00a0nbsp\u3000"}, {"role": "assistant", "content": "\u2003em space\x1f \n"},
     {"role": "user", "content": "\t\u200bzero width stays\u200b"}],
    # an empty system message (Phi-3.5 leaves it out), empty content, a lone system message
    [{"role": "system", "content": ""}, {"role": "user", "content": ""}],
    [{"role": "system", "content": "only a system message"}],
    # a system message after the first turn, a role no template names
    [{"role": "user", "content": "a"}, {"role": "system", "content": "late system"}],
    [{"role": "user", "content": "a"}, {"role": "narrator", "content": "b"}],
    # Jinja and template syntax in content is text
    [{"role": "user", "content": "{{ bos_token }} {% if %} [INST] <|im_end|> <|end|> <<SYS>>"}],
]

HF_TOKENIZER = AutoTokenizer.from_pretrained(STORIES / "hf")


def hf_render(template, messages, add_generation_prompt, **kwargs):
    return HF_TOKENIZER.apply_chat_template(messages, chat_template=template, tokenize=False,
                                            add_generation_prompt=add_generation_prompt, **kwargs)


@pytest.mark.parametrize("family", sorted(TEMPLATES))
@pytest.mark.parametrize("conv", range(len(CONVERSATIONS)))
@pytest.mark.parametrize("gen", [True, False])
def test_rendering_matches_transformers(stories_model, family, conv, gen):
    messages = CONVERSATIONS[conv]
    try:
        expected = hf_render(TEMPLATES[family], messages, gen)
    except Exception:  # the template itself rejects this conversation (e.g. Gemma and a system role)
        with pytest.raises(fastllm.FastLLMError) as e:
            stories_model.apply_chat_template(messages, gen, template=TEMPLATES[family])
        assert e.value.status == raw.ERR_INVALID_ARGUMENT
        return
    assert stories_model.apply_chat_template(messages, gen, template=TEMPLATES[family]) == expected


def test_roles_must_alternate(stories_model):
    bad = [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]
    for family in ("llama2", "gemma"):
        with pytest.raises(Exception):
            hf_render(TEMPLATES[family], bad, True)
        with pytest.raises(fastllm.FastLLMError) as e:
            stories_model.apply_chat_template(bad, template=TEMPLATES[family])
        assert "alternate" in str(e.value)


def test_any_template_renders_as_transformers(stories_model):
    """No template is "unknown": the engine runs whatever the model ships."""
    template = "{{ messages[0]['content'] }} ### Response:{% if add_generation_prompt %} {% endif %}"
    messages = [{"role": "user", "content": "x"}]
    assert stories_model.apply_chat_template(messages, template=template) == hf_render(template, messages, True)


def test_model_without_template(stories_model):
    assert stories_model.chat_template is None
    with pytest.raises(fastllm.FastLLMError) as e:
        stories_model.apply_chat_template([{"role": "user", "content": "x"}])
    assert e.value.status == raw.ERR_UNSUPPORTED


def test_every_new_family_renders_most_conversations():
    """The parity test above is not passing by refusals: each template renders most conversations."""
    for family in ("qwen2.5", "qwen3", "mistral-v1", "mistral-v0.3", "phi3", "phi3.5", "phi3-small", "phi4-mini",
                   "gemma3", "chatglm3", "glm4"):
        rendered = 0
        for messages in CONVERSATIONS:
            try:
                hf_render(TEMPLATES[family], messages, True)
                rendered += 1
            except Exception:
                pass
        assert rendered >= len(CONVERSATIONS) // 2, family


def test_qwen25_inserts_its_default_system_message(stories_model):
    text = stories_model.apply_chat_template([{"role": "user", "content": "Hi"}], template=QWEN25)
    assert text.startswith("<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
                           "assistant.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n")


# Qwen3: an assistant turn after the last user query keeps its reasoning in a <think> block (the
# last turn always gets one, empty if need be), earlier turns only their answer; reasoning comes
# from reasoning_content, else from a <think>...</think> block in the content.
def _u(text):
    return {"role": "user", "content": text}


def _a(text, **extra):
    return {"role": "assistant", "content": text, **extra}


THINK = "<think>\nI should greet back.\n</think>\n\nHello!"
TOOL_RESPONSE = "<tool_response>\n{\"temperature\": 21}\n</tool_response>"
QWEN3_CONVERSATIONS = [
    [_u("Hi"), _a(THINK), _u("And now?")],                                  # before the last query: answer only
    [_u("Hi"), _a(THINK)],                                                  # after it and last: the block stays
    [_u("Hi"), _a("No thinking here.")],                                    # last: an empty block is added
    [SYSTEM, _u("a"), _a("plain"), _a("<think>r</think>second")],           # after the query: plain, then a block
    [_u("a"), _a("<think>\n\nreason\n\n</think>\n\n\nans\n"), _a("last")],  # newlines around the parts trimmed
    [_u("a"), _a("x</think>y</think>\nz")],                                 # several </think>: first and last cut
    [_u("a"), _a("no open tag</think>answer")],
    [_u("q"), _a("<think>a</think>b"), _u(TOOL_RESPONSE), _a("c")],         # a tool response is not a query
    [_u("q"), _a("ans", reasoning_content="\nthought\n")],                  # reasoning_content wins
    [_u("q"), _a("<think>cut</think>ans", reasoning_content="given")],     # ... over a block in the content
    [_u("q"), _a("ans", reasoning_content=""), _u("q2"), _a("b", reasoning_content="r2"), _u("q3")],
    [_u("q"), _a("ans", reasoning_content=None)],                           # None: as if absent
    [_u("Où? 🙂"), _a("<think>\n思考\n</think>\n\n答え"), _u("  spaces  "), _a("  ")],
    [SYSTEM, _u("a"), {"role": "system", "content": "late"}, _a("b")],
]


@pytest.mark.parametrize("conv", range(len(QWEN3_CONVERSATIONS)))
@pytest.mark.parametrize("gen", [True, False])
@pytest.mark.parametrize("thinking", [None, False, True])
def test_qwen3_thinking_matches_transformers(stories_model, conv, gen, thinking):
    messages = QWEN3_CONVERSATIONS[conv]
    kwargs = {} if thinking is None else {"enable_thinking": thinking}
    expected = hf_render(QWEN3, messages, gen, **kwargs)
    assert stories_model.apply_chat_template(messages, gen, template=QWEN3, enable_thinking=thinking) == expected


def test_qwen3_without_thinking_opens_an_empty_block(stories_model):
    text = stories_model.apply_chat_template([_u("Hi")], template=QWEN3, enable_thinking=False)
    assert text == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"


@pytest.mark.parametrize("family", sorted(TEMPLATES))
def test_templates_that_ignore_enable_thinking_ignore_it(stories_model, family):
    messages = CONVERSATIONS[3]
    try:
        expected = hf_render(TEMPLATES[family], messages, True, enable_thinking=False)
    except Exception:
        return
    assert stories_model.apply_chat_template(messages, template=TEMPLATES[family], enable_thinking=False) == expected
    with_reasoning = [dict(m, reasoning_content="r") if m["role"] == "assistant" else m for m in messages]
    assert stories_model.apply_chat_template(with_reasoning, template=TEMPLATES[family]) == \
        hf_render(TEMPLATES[family], with_reasoning, True)


TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "The city"},
                                                     "unit": {"type": "string", "enum": ["c", "f"]}},
                   "required": ["city"]}}}]
TOOL_CONVERSATIONS = [
    [_u("What is the weather in Paris?")],
    [SYSTEM, _u("What is the weather in Paris?"),
     {"role": "assistant", "content": "", "tool_calls": [
         {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
     {"role": "tool", "tool_call_id": "call_1", "name": "get_weather", "content": "{\"temperature\": 21}"},
     _a("It is 21 degrees in Paris.")],
    [_u("Paris and Rome?"),
     {"role": "assistant", "content": "Checking both.", "tool_calls": [
         {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
         {"id": "call_2", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Rome", "unit": "c"}}}]},
     {"role": "tool", "tool_call_id": "call_1", "content": "21"},
     {"role": "tool", "tool_call_id": "call_2", "content": "25"}],
    # content as a list of parts
    [{"role": "user", "content": [{"type": "text", "text": "Describe this."}]}],
]


@pytest.mark.parametrize("family", sorted(TEMPLATES))
@pytest.mark.parametrize("conv", range(len(TOOL_CONVERSATIONS)))
@pytest.mark.parametrize("with_tools", [True, False])
def test_tools_tool_calls_and_tool_messages_render_as_transformers(stories_model, family, conv, with_tools):
    messages = TOOL_CONVERSATIONS[conv]
    tools = TOOLS if with_tools else None
    try:
        expected = hf_render(TEMPLATES[family], messages, True, tools=tools)
    except Exception:
        with pytest.raises(fastllm.FastLLMError):
            stories_model.apply_chat_template(messages, template=TEMPLATES[family], tools=tools)
        return
    assert stories_model.apply_chat_template(messages, template=TEMPLATES[family], tools=tools) == expected


@pytest.mark.parametrize("family", sorted(TEMPLATES))
def test_an_empty_conversation_is_refused_as_by_transformers(stories_model, family):
    with pytest.raises(ValueError):
        hf_render(TEMPLATES[family], [], True)
    with pytest.raises(fastllm.FastLLMError) as e:
        stories_model.apply_chat_template([], template=TEMPLATES[family])
    assert e.value.status == raw.ERR_INVALID_ARGUMENT and "empty conversation" in str(e.value)


def test_mistral_roles_must_alternate_after_the_system_message(stories_model):
    bad = [SYSTEM, _u("a"), _u("b")]
    for family in ("mistral-v0.2", "mistral-v1", "mistral-v0.3"):
        with pytest.raises(Exception):
            hf_render(TEMPLATES[family], bad, True)
        with pytest.raises(fastllm.FastLLMError) as e:
            stories_model.apply_chat_template(bad, template=TEMPLATES[family])
        assert e.value.status == raw.ERR_INVALID_ARGUMENT and "alternate" in str(e.value)


# Variants of the families above that the hand-written renderers before the engine refused.
VARIANTS = {
    # GLM-4-0414-style: system messages first, metadata and observation turns (not rendered)
    "glm4-0414-style": (r"[gMASK]<sop>{%- for msg in messages %}{%- if msg.role == 'system' %}<|system|>" "\n"
                        r"{{ msg.content }}{%- endif %}{%- endfor %}{%- for message in messages if message.role != "
                        r"'system' %}<|{{ message.role }}|>" "\n" r"{{ message.content }}{%- endfor %}"
                        r"{% if add_generation_prompt %}<|assistant|>{% endif %}"),
    # ChatGLM3 without the space before the content
    "chatglm3-no-space": CHATGLM3.replace("|>\n {{", "|>\n{{"),
    # Mistral-7B-Instruct-v0.3's earlier template (spaces around [INST], no system message)
    "mistral-v0.3-2024-05": (r"{{- bos_token }}{%- for message in messages %}{%- if message['role'] == 'user' %}"
                             r"{{- ' [INST] ' + message['content'] + ' [/INST]' }}{%- elif message['role'] == 'assistant' %}"
                             r"{{- ' ' + message.content + ' ' + eos_token}}{%- endif %}{%- endfor %}"),
    # Mistral-Large-Instruct-2411 ('v7': [SYSTEM_PROMPT])
    "mistral-v7": (r"{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}"
                   r"{{ '[INST] ' + message['content'] + '[/INST]' }}{% elif message['role'] == 'system' %}"
                   r"{{ '[SYSTEM_PROMPT] ' + message['content'] + '[/SYSTEM_PROMPT]' }}"
                   r"{% elif message['role'] == 'assistant' %}{{ ' ' + message['content'] + eos_token }}{% else %}"
                   r"{{ raise_exception('Only user, system and assistant roles are supported!') }}{% endif %}{% endfor %}"),
    # Qwen1.5-Chat: the last turn is left open without a generation prompt
    "qwen1.5": (r"{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
                r"{{ '<|im_start|>system\nYou are a helpful assistant<|im_end|>\n' }}{% endif %}"
                r"{{'<|im_start|>' + message['role'] + '\n' + message['content']}}"
                r"{% if (loop.last and add_generation_prompt) or not loop.last %}{{ '<|im_end|>' + '\n'}}{% endif %}"
                r"{% endfor %}{% if add_generation_prompt and messages[-1]['role'] != 'assistant' %}"
                r"{{ '<|im_start|>assistant\n' }}{% endif %}"),
    # phi-4 (14B): ChatML-like with <|im_sep|>
    "phi-4": (r"{% for message in messages %}{% if (message['role'] == 'system') %}"
              r"{{'<|im_start|>system<|im_sep|>' + message['content'] + '<|im_end|>'}}{% elif (message['role'] == 'user') %}"
              r"{{'<|im_start|>user<|im_sep|>' + message['content'] + '<|im_end|><|im_start|>assistant<|im_sep|>'}}"
              r"{% elif (message['role'] == 'assistant') %}{{message['content'] + '<|im_end|>'}}{% endif %}{% endfor %}"),
    # Phi-3-medium: the assistant tag follows every user turn
    "phi3-medium": (r"{% for message in messages %}{% if (message['role'] == 'user') %}"
                    r"{{'<|user|>' + '\n' + message['content'] + '<|end|>' + '\n' + '<|assistant|>' + '\n'}}"
                    r"{% elif (message['role'] == 'assistant') %}{{message['content'] + '<|end|>' + '\n'}}{% endif %}"
                    r"{% endfor %}"),
    # a Qwen3-like template whose thinking block differs
    "qwen3-edited": QWEN3.replace("'\\n</think>\\n\\n'", "'</think>'"),
}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
@pytest.mark.parametrize("conv", [0, 2, 3])
def test_variants_render_as_transformers(stories_model, variant, conv):
    template, messages = VARIANTS[variant], CONVERSATIONS[conv]
    try:
        expected = hf_render(template, messages, True)
    except Exception:
        with pytest.raises(fastllm.FastLLMError):
            stories_model.apply_chat_template(messages, template=template)
        return
    assert stories_model.apply_chat_template(messages, template=template) == expected


def test_chat_params_defaults_and_checks(stories_model):
    p = raw.lib.fastllm_chat_default_params()
    assert (p.add_generation_prompt, p.enable_thinking, bool(p.reasoning_content)) == (1, raw.THINKING_UNSET, False)
    msgs = (raw.ChatMessage * 1)(raw.ChatMessage(b"user", b"Hi"))
    out, n = ctypes.create_string_buffer(256), ctypes.c_size_t()
    assert raw.lib.fastllm_chat_apply_template_v2(stories_model.handle, QWEN3.encode(), msgs, 1, None, out, 256,
                                                  ctypes.byref(n)) == raw.OK
    assert out.value.decode() == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    p.enable_thinking = 2
    assert raw.lib.fastllm_chat_apply_template_v2(stories_model.handle, QWEN3.encode(), msgs, 1, ctypes.byref(p), out,
                                                  256, ctypes.byref(n)) == raw.ERR_INVALID_ARGUMENT
    assert "enable_thinking" in raw.lib.fastllm_last_error().decode()


def test_chat_params_layout_matches_the_header(tmp_path):
    """The ctypes struct has the C compiler's size and field offsets for include/fastllm.h."""
    cc = shutil.which("cc") or shutil.which("gcc")
    assert cc, "no C compiler on PATH; the build needs one"
    fields = [name for name, _ in raw.ChatParams._fields_]
    src = tmp_path / "layout.c"
    src.write_text('#include <stddef.h>\n#include <stdio.h>\n#include "fastllm.h"\nint main(void) {\n'
                   '    printf("%zu\\n", sizeof(fastllm_chat_params));\n' +
                   "".join(f'    printf("%zu\\n", offsetof(fastllm_chat_params, {f}));\n' for f in fields) +
                   "    return 0;\n}\n")
    exe = tmp_path / "layout"
    subprocess.run([cc, "-I", str(REPO / "include"), str(src), "-o", str(exe)], check=True)
    c_layout = [int(x) for x in subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout.split()]
    assert c_layout == [ctypes.sizeof(raw.ChatParams)] + [getattr(raw.ChatParams, f).offset for f in fields]


def test_line_breaks_inside_string_literals_count_as_the_escape(stories_model):
    """A template whose Jinja strings hold real line breaks instead of \\n renders the same."""
    template = PHI3.replace("\\n", "\n")
    assert template != PHI3
    for messages in CONVERSATIONS[:4]:
        for gen in (True, False):
            assert stories_model.apply_chat_template(messages, gen, template=template) == \
                hf_render(template, messages, gen)
