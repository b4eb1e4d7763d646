"""Added tokens of SentencePiece models (Phi-3's <|user|>, <|end|>, ...) against transformers.

The test tokenizer is stories260K's SentencePiece model (512 pieces) with Phi-3-style added tokens
(ids 512+, the role tokens with rstrip as Phi-3 declares them, plus a non-special token, an lstrip
token and two tokens of which one is the other's prefix), saved with `tokenizers`, in a tiny
random LLaMA converted by the converter. transformers 5 tokenizes such a folder three ways,
and the .flm says which (tokenizer.prefix_after_added):
  never         LlamaTokenizer, legacy=False: text after an added token gets no dummy prefix
  unless_space  LlamaTokenizer, legacy=True: it gets one unless it starts with a space
  always        the tokenizer.json as is (how transformers loads a Phi-3 folder) whose normalizer
                prepends "▁" to every piece of text, as Llama 2's and Phi-3's tokenizer.json do
"""
import json
import shutil

import pytest
import sentencepiece as spm
from tokenizers import AddedToken, Tokenizer
from transformers import AutoTokenizer

import fastllm
from conftest import STORIES, convert, rewrite_flm
from converter.flm_reader import read_flm
from hf_models import make_llama

PHI3_ROLES = ["<|assistant|>", "<|placeholder1|>", "<|system|>", "<|end|>", "<|user|>"]
ADDED = (  # (text, special, lstrip, rstrip) from id 512 on
    [("<|endoftext|>", True, False, False)] + [(t, True, False, True) for t in PHI3_ROLES] +
    [("<my tok>", False, False, False), ("<lstrip>", True, True, False), ("<|ab|>", True, False, False),
     ("<|ab|>c", True, False, False)])
VOCAB = 512 + len(ADDED)
PHI3_TEMPLATE = ("{% for message in messages %}{% if message['role'] == 'system' %}"
                 "{{'<|system|>\n' + message['content'] + '<|end|>\n'}}{% elif message['role'] == 'user' %}"
                 "{{'<|user|>\n' + message['content'] + '<|end|>\n'}}{% elif message['role'] == 'assistant' %}"
                 "{{'<|assistant|>\n' + message['content'] + '<|end|>\n'}}{% endif %}{% endfor %}"
                 "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% else %}{{ eos_token }}{% endif %}")
PREPEND_NORMALIZER = {"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "▁"},
                                                          {"type": "Replace", "pattern": {"String": " "},
                                                           "content": "▁"}]}


def write_tokenizer(path, scheme):
    """stories260K's tokenizer with ADDED, as tokenizer.json + tokenizer_config.json."""
    tok = Tokenizer.from_file(str(STORIES / "hf" / "tokenizer.json"))
    for text, special, lstrip, rstrip in ADDED:
        token = AddedToken(text, lstrip=lstrip, rstrip=rstrip, normalized=False, special=special)
        assert (tok.add_special_tokens if special else tok.add_tokens)([token]) == 1
    data = json.loads(tok.to_str())
    if scheme == "always":  # Llama 2's / Phi-3's tokenizer.json: the normalizer prefixes each piece
        data["normalizer"], data["pre_tokenizer"] = PREPEND_NORMALIZER, None
    (path / "tokenizer.json").write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
    shutil.copy(STORIES / "hf" / "tokenizer.model", path / "tokenizer.model")
    decoder = {str(a["id"]): {k: v for k, v in a.items() if k != "id"} for a in data["added_tokens"]}
    config = {"add_bos_token": False, "add_eos_token": False, "added_tokens_decoder": decoder, "bos_token": "<s>",
              "chat_template": PHI3_TEMPLATE, "clean_up_tokenization_spaces": False, "eos_token": "<|endoftext|>",
              "legacy": scheme == "unless_space", "pad_token": "<|endoftext|>", "tokenizer_class": "LlamaTokenizer",
              "unk_token": "<unk>"}
    (path / "tokenizer_config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
    (path / "special_tokens_map.json").write_text(json.dumps(
        {"bos_token": "<s>", "eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>", "unk_token": "<unk>"}))


def reference_tokenizer(folder, scheme, tmp_path):
    if scheme != "always":
        return AutoTokenizer.from_pretrained(folder)  # LlamaTokenizer, built from the vocabulary
    # transformers loads the tokenizer.json of a Phi-3 folder as it is (model_type phi3)
    ref = tmp_path / "phi3-tokenizer"
    ref.mkdir()
    for f in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(folder / f, ref / f)
    (ref / "config.json").write_text(json.dumps({"model_type": "phi3", "vocab_size": VOCAB}))
    return AutoTokenizer.from_pretrained(ref)


def added_token_keys(scheme):
    """The tokenizer keys that say how the added tokens behave (what the converter is to write)."""
    return {"tokenizer.added_lstrip": [512 + i for i, a in enumerate(ADDED) if a[2]],
            "tokenizer.added_rstrip": [512 + i for i, a in enumerate(ADDED) if a[3]],
            "tokenizer.prefix_after_added": scheme}


class Case:
    def __init__(self, scheme, converted, flm, ref):
        self.scheme = scheme
        self.converted = converted  # the converter's .flm
        self.flm = flm              # the model loaded from it
        self.ref = ref              # transformers' tokenizer


@pytest.fixture(scope="module", params=["never", "unless_space", "always"])
def case(request, tmp_path_factory):
    scheme = request.param
    tmp = tmp_path_factory.mktemp(f"added-{scheme}")
    folder = make_llama(tmp, tokenizer=False, vocab_size=VOCAB, bos_token_id=1, eos_token_id=512, pad_token_id=512)
    write_tokenizer(folder, scheme)
    if scheme == "always":  # transformers loads a phi3 folder's tokenizer.json as is
        config = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps({**config, "model_type": "phi3"}))
    converted = convert(folder, tmp / "converted.flm")
    with fastllm.Model(converted, threads=1) as m:
        yield Case(scheme, converted, m, reference_tokenizer(folder, scheme, tmp))


def test_the_converter_stores_the_added_tokens_at_their_ids(case):
    meta = read_flm(case.converted)[0]
    tokens, types = meta["tokenizer.tokens"], meta["tokenizer.token_types"].tolist()
    assert len(tokens) == VOCAB
    for i, (text, special, _, _) in enumerate(ADDED):
        assert (tokens[512 + i], types[512 + i]) == (text, 3 if special else 4)
    assert types[:3] == [2, 3, 3]  # <unk>, <s>, </s> keep SentencePiece's types
    assert meta["tokenizer.eos_id"] == 512 and meta["tokenizer.add_bos"] == 0


def test_the_converter_writes_how_added_tokens_behave(case):
    meta = read_flm(case.converted)[0]
    for key, value in added_token_keys(case.scheme).items():
        assert (meta[key].tolist() if hasattr(meta[key], "tolist") else meta[key]) == value


HAND = [
    "<|user|>\nHi there<|end|>\n<|assistant|>\n", "<|user|>", "<|end|><|end|>", "Hi<|end|>x", "Hi<|end|> x",
    "Hi <|end|>  x", "x<|endoftext|> y", "x <|endoftext|>\n\ny", "a <lstrip>b", "a\n\n<lstrip>  b", "<lstrip>x",
    "<my tok>x <my tok> y", "a<my tok>", "<|user|>  \n \t x", "<|user|>\u3000\u00a0x", "é<|end|>é", "日本<|end|>語",
    "<|ab|> <|ab|>c <|ab|>cd <|abc", "<|<|end|>", "<|en", "<|end", "end|>", "<|user|>\n\n", "\n<|user|>",
    "tabs\t<|end|>\tand", "🙂<|system|>🙂", "<|user|>   ", "  <lstrip>", "<0x41> byte piece",
]


@pytest.mark.parametrize("text", HAND)
def test_encode_matches_transformers(case, text):
    assert case.flm.tokenize(text, add_bos=False) == case.ref.encode(text, add_special_tokens=False), text


def corpus_prompts():
    lines = [l for l in (STORIES / "text" / "tinystories_sample.txt").read_text(encoding="utf-8").splitlines()
             if l.strip()][:150]
    return ["<|system|>\nBe brief.<|end|>\n<|user|>\n" + a + "<|end|>\n<|assistant|>\n" + b + "<|end|>\n"
            for a, b in zip(lines[::2], lines[1::2])]


def test_corpus_prompts_match(case):
    bad = [p for p in corpus_prompts() if case.flm.tokenize(p, add_bos=False) != case.ref.encode(
        p, add_special_tokens=False)]
    assert bad == []


def test_chat_template_prompts_match_apply_chat_template(case):
    conversations = [
        [{"role": "user", "content": "What is the capital of France?"}],
        [{"role": "system", "content": "You are a terse pirate.\n"}, {"role": "user", "content": "  Hi there!  "},
         {"role": "assistant", "content": " Ahoy, matey! "}, {"role": "user", "content": "Où? 🙂\nLine two."}],
    ]
    for messages in conversations:
        for gen in (True, False):
            prompt = case.flm.apply_chat_template(messages, gen)
            assert prompt == case.ref.apply_chat_template(messages, tokenize=False, add_generation_prompt=gen)
            expected = case.ref.apply_chat_template(messages, tokenize=True, add_generation_prompt=gen)
            expected = expected["input_ids"] if isinstance(expected, dict) or hasattr(expected, "keys") else expected
            assert case.flm.tokenize(prompt, add_bos=False) == list(expected)


def test_text_at_the_start_follows_sentencepiece(case):
    """The one difference: transformers' Metaspace gives text that starts with a space no dummy
    prefix, sentencepiece (and this tokenizer) always does."""
    sp = spm.SentencePieceProcessor(model_file=str(STORIES / "hf" / "tokenizer.model"))
    for text in (" x", "  two", " x<|end|>y"):
        assert case.flm.tokenize(text, add_bos=False)[:3] == sp.encode(text.split("<")[0])[:3]


def test_sentencepiece_control_tokens_stay_text(case):
    """<s>, </s> and <unk> in text are text, as the sentencepiece package treats them (transformers
    would give their ids)."""
    sp = spm.SentencePieceProcessor(model_file=str(STORIES / "hf" / "tokenizer.model"))
    ids = case.flm.tokenize("<s> </s> <unk>", add_bos=False)
    assert ids == sp.encode("<s> </s> <unk>") and not {0, 1, 2} & set(ids)


def test_decode_skips_control_tokens_and_keeps_user_defined_ones(case):
    ids = case.flm.tokenize("<|user|>\nHi<|end|>\n<my tok> there", add_bos=False)
    assert case.flm.detokenize(ids) == case.ref.decode(ids, skip_special_tokens=True)


def test_bad_prefix_mode_is_refused(case, tmp_path):
    bad = rewrite_flm(case.converted, tmp_path / "bad.flm", metadata={"tokenizer.prefix_after_added": "sometimes"})
    with pytest.raises(fastllm.FastLLMError) as e:
        fastllm.Model(bad, threads=1)
    assert "prefix_after_added" in str(e.value) and "sometimes" in str(e.value)
