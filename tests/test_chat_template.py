"""Chat templates rendered by the C++ library against transformers' apply_chat_template."""
import pytest
from transformers import AutoTokenizer

import fastllm
from fastllm import _lib as raw
from conftest import STORIES

# Templates of the families we recognise, as the model repositories ship them.
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
}

SYSTEM = {"role": "system", "content": "You are a terse pirate.\n"}
CONVERSATIONS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [SYSTEM, {"role": "user", "content": "  Hi there!  "}],
    [{"role": "user", "content": "Hello"}, {"role": "assistant", "content": " Ahoy, matey! "},
     {"role": "user", "content": "Où est la bibliothèque? 🙂\nLine two."}],
    [SYSTEM, {"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"}],
]

HF_TOKENIZER = AutoTokenizer.from_pretrained(STORIES / "hf")


def hf_render(template, messages, add_generation_prompt):
    return HF_TOKENIZER.apply_chat_template(messages, chat_template=template, tokenize=False,
                                            add_generation_prompt=add_generation_prompt)


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


def test_unknown_template_is_an_error(stories_model):
    with pytest.raises(fastllm.FastLLMError) as e:
        stories_model.apply_chat_template([{"role": "user", "content": "x"}],
                                          template="{{ messages[0]['content'] }} ### Response:")
    assert e.value.status == raw.ERR_UNSUPPORTED and "unknown chat template" in str(e.value)


def test_model_without_template(stories_model):
    assert stories_model.chat_template is None
    with pytest.raises(fastllm.FastLLMError) as e:
        stories_model.apply_chat_template([{"role": "user", "content": "x"}])
    assert e.value.status == raw.ERR_UNSUPPORTED
