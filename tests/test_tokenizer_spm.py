"""The C++ SentencePiece tokenizer against the sentencepiece package, id for id."""
import pytest
import sentencepiece as spm

from conftest import SHARED, STORIES

SP = spm.SentencePieceProcessor(model_file=str(STORIES / "hf" / "tokenizer.model"))

SAMPLES = [
    "", " ", "  ", "Hello world", "Hello, world!", " leading space", "  two  spaces", "trailing space ",
    "tabs\tand\nnewlines\n\n", "\n", "multiple\n\n\nblank lines", "naïve café résumé Ångström", "Straße über Öl",
    "日本語のテキスト", "中文分词测试", "한국어", "emoji 🙂🚀 and 👍🏽 skin tone", "Ωμέγα русский العربية עברית",
    "digits 1234567890 3.14159 -42 1e10", "2024-11-30T17:27:06Z", "x = a**2 + b_c; // code!", "<s> </s> <unk>",
    "a" * 300, "The quick brown fox jumps over the lazy dog. " * 5, "\u2581 literal block char", "\x00\x01 control",
]


def corpus_lines():
    lines = []
    for path in (STORIES / "text" / "tinystories_sample.txt", SHARED / "models" / "corpora" / "tinyshakespeare.txt"):
        lines += path.read_text(encoding="utf-8").splitlines()[:400]
    return [l for l in lines if l.strip()]


@pytest.mark.parametrize("text", SAMPLES)
def test_encode_matches_sentencepiece(stories_model, text):
    assert stories_model.tokenize(text, add_bos=False) == SP.encode(text)


def test_corpus_lines_match(stories_model):
    lines = corpus_lines()
    assert len(lines) > 300
    bad = [l for l in lines if stories_model.tokenize(l, add_bos=False) != SP.encode(l)]
    assert bad == []


def test_long_text_matches(stories_model):
    text = (STORIES / "text" / "tinystories_valid_head.txt").read_text(encoding="utf-8")[:20000]
    assert stories_model.tokenize(text, add_bos=False) == SP.encode(text)


@pytest.mark.parametrize("text", SAMPLES)
def test_decode_matches_sentencepiece(stories_model, text):
    ids = SP.encode(text)
    assert stories_model.detokenize(ids) == SP.decode(ids)


def test_bos_handling(stories_model):
    assert stories_model.tokenize("Hi", add_bos=True) == [SP.bos_id()] + SP.encode("Hi")
    assert stories_model.tokenize("Hi") == [SP.bos_id()] + SP.encode("Hi")  # the model's default
    assert stories_model.detokenize([SP.bos_id()] + SP.encode("Hi there")) == "Hi there"


def test_streaming_pieces_rebuild_text(stories_model):
    ids = SP.encode("naïve 日本 🙂 text")
    raw = b"".join(stories_model.token_to_piece(i) for i in ids)
    assert raw.decode() == " " + SP.decode(ids)
