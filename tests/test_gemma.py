"""Gemma's tokenizer and chat template, and the checkpoints fastllm refuses, on a Gemma-style
folder: a SentencePiece BPE model trained here as Gemma's is built (byte fallback, no dummy prefix,
whitespace kept, <pad> <eos> <bos> <unk> <mask> at 0..4, <start_of_turn> <end_of_turn> user-defined), the
tokenizer.json transformers writes for it, Gemma 3's chat template, and a random Gemma3ForCausalLM.
The references: transformers' GemmaTokenizer (tokenizers) and apply_chat_template, sentencepiece."""
import io
import json
import shutil
import warnings

import pytest

import fastllm
from conftest import SHAKESPEARE_TXT, STORIES, convert
from hf_models import edit_config, make_model
from test_chat_template import GEMMA3

SHAKESPEARE = SHAKESPEARE_TXT.read_text(encoding="utf-8")
VOCAB = 600
START_OF_TURN, END_OF_TURN = 5, 6  # after <pad> <eos> <bos> <unk> <mask>, as Gemma's 106, 107

TEXTS = [
    "Hello world", " leading space", "two  spaces and\ttab", "trailing space ", "\n\nnewlines\n",
    "<start_of_turn>user\nHi there<end_of_turn>\n<start_of_turn>model\n", "no<start_of_turn>space",
    "bytes: 🙂 é ß 東京 ☃", "digits 1234567 3.14", "", " ", "<end_of_turn>",
    "<bos> is text here", "ÿ\x01\x7f control bytes",
]


def train_gemma_spm() -> bytes:
    import sentencepiece as spm
    out = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(SHAKESPEARE[:200_000].splitlines()), model_writer=out, vocab_size=VOCAB,
        model_type="bpe", byte_fallback=True, add_dummy_prefix=False, remove_extra_whitespaces=False,
        normalization_rule_name="identity", split_digits=True, allow_whitespace_only_pieces=True,
        character_coverage=1.0, pad_id=0, eos_id=1, bos_id=2, unk_id=3, pad_piece="<pad>", eos_piece="<eos>",
        bos_piece="<bos>", unk_piece="<unk>", control_symbols=["<mask>"],
        user_defined_symbols=["<start_of_turn>", "<end_of_turn>"],
        minloglevel=2)
    return out.getvalue()


@pytest.fixture(scope="module")
def gemma(tmp_path_factory):
    """(HF folder, its transformers tokenizer, the converted fastllm model)."""
    from transformers import AutoTokenizer
    tmp = tmp_path_factory.mktemp("gemma")
    hf = make_model(tmp, "gemma3", name="hf", tokenizer=None, vocab_size=VOCAB, bos_token_id=2, eos_token_id=1,
                    pad_token_id=0, num_attention_heads=4, num_key_value_heads=1, sliding_window=16)
    (hf / "tokenizer.model").write_bytes(train_gemma_spm())
    (hf / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "GemmaTokenizer", "bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>",
        "unk_token": "<unk>", "mask_token": "<mask>", "add_bos_token": True, "add_eos_token": False, "chat_template": GEMMA3}))
    tok = AutoTokenizer.from_pretrained(hf)
    tok.save_pretrained(hf)  # the tokenizer.json (and config) transformers writes for Gemma
    (hf / "generation_config.json").write_text(json.dumps({"bos_token_id": 2, "eos_token_id": [1, END_OF_TURN]}))
    model = fastllm.Model(convert(hf, tmp / "m.flm"), threads=2)
    yield hf, tok, model
    model.close()


def corpus():
    texts = list(TEXTS)
    texts += [SHAKESPEARE[i:i + 700] for i in range(300_000, 340_000, 4000)]  # text the model was not trained on
    texts += [(STORIES / "text" / "tinystories_sample.txt").read_text(encoding="utf-8")[:3000]]
    return texts


def test_tokenizer_matches_transformers_and_sentencepiece(gemma):
    import sentencepiece as spm
    hf, tok, m = gemma
    sp = spm.SentencePieceProcessor(model_file=str(hf / "tokenizer.model"))
    for text in corpus():
        want = tok(text).input_ids
        assert m.tokenize(text) == want, text
        ids = want[1:]
        if "<bos>" not in text:  # sentencepiece reads "<bos>" in text as text
            assert ids == sp.encode(text), text
        # decoding drops control pieces (<bos> ...) as sentencepiece does; transformers keeps them
        assert m.detokenize(ids) == sp.decode(ids), text
        if "<bos>" not in text:
            assert m.detokenize(ids) == tok.decode(ids), text
    # the turn markers are single ids in text, and end a turn
    ids = m.tokenize("<start_of_turn>model\n<end_of_turn>", add_bos=False)
    assert ids[0] == START_OF_TURN and ids[-1] == END_OF_TURN


def test_chat_template_as_transformers_renders_it(gemma):
    hf, tok, m = gemma
    conversations = [
        [{"role": "system", "content": "You are a blacksmith in Riverwood.\n"},
         {"role": "user", "content": " Can you mend my sword? "}],
        [{"role": "user", "content": "Hello"}, {"role": "assistant", "content": "Greetings, traveller."},
         {"role": "user", "content": "What news?"}],
    ]
    for messages in conversations:
        text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        assert m.apply_chat_template(messages) == text
        # the rendered prompt starts with <bos> as text: tokenized without adding another
        assert m.tokenize(text, add_bos=False) == tok(text, add_special_tokens=False).input_ids
    assert text.startswith("<bos><start_of_turn>user\n")


def test_eos_ids_include_end_of_turn(gemma, tmp_path):
    from converter.flm_reader import load_flm
    hf, tok, m = gemma
    md = load_flm(sorted(hf.parent.glob("*.flm"))[0]).metadata
    assert set(md["tokenizer.eos_ids"]) >= {1, END_OF_TURN}
    assert md["tokenizer.add_dummy_prefix"] == 0 and md["tokenizer.byte_fallback"] == 1


def test_gguf_tokenizer_round_trip(gemma, tmp_path):
    """llama.cpp's Gemma GGUF (add_space_prefix false) gives the same tokens."""
    import gguf_models
    hf, tok, m = gemma
    with fastllm.Model(convert(gguf_models.write_gguf(hf, tmp_path / "g.gguf"), tmp_path / "g.flm")) as g:
        for text in corpus()[:20]:
            assert g.tokenize(text) == m.tokenize(text), text


def test_multimodal_checkpoint_converts_as_its_language_model(tmp_path):
    """Gemma3ForConditionalGeneration (gemma-3-4b-it's class): text_config, language_model.model.*
    tensors, the vision tower and projector left out with a warning; logits of text equal the
    multimodal model's own; --calib refuses it."""
    import numpy as np
    import torch
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration
    from converter.convert import ConversionError, convert as convert_hf
    from hf_models import TOKENIZER_FILES, STORIES_HF
    text = dict(vocab_size=512, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
                num_key_value_heads=1, head_dim=16, query_pre_attn_scalar=16, sliding_window=8, sliding_window_pattern=3,
                max_position_embeddings=128, bos_token_id=1, eos_token_id=2)
    vision = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=1, num_attention_heads=2, image_size=28,
                  patch_size=14)
    config = Gemma3Config(text_config=text, vision_config=vision, mm_tokens_per_image=4, image_token_index=300,
                          boi_token_index=301, eoi_token_index=302)
    torch.manual_seed(0)
    ref = Gemma3ForConditionalGeneration(config).eval()
    with torch.no_grad():
        for name, p in ref.named_parameters():
            p.copy_(0.1 * torch.randn(p.shape) if name.endswith("norm.weight") else 0.02 * torch.randn(p.shape))
    hf = tmp_path / "mm"
    ref.save_pretrained(hf)
    for f in TOKENIZER_FILES:
        shutil.copy(STORIES_HF / f, hf / f)
    with pytest.warns(UserWarning, match="vision tower and projector are left out"):
        flm = convert_hf(hf, tmp_path / "mm.flm", progress=False)
    ids = [int(x) for x in np.random.default_rng(0).integers(3, 512, 40)]
    with torch.no_grad():
        want = ref(input_ids=torch.tensor([ids])).logits[0].numpy()
    with fastllm.Model(flm, threads=2) as m:
        assert m.info["architecture"] == "gemma3"
        got = m.forward(ids)
    assert float(np.abs(got - want).max() / np.abs(want).max()) < 1e-4
    calib = tmp_path / "calib.txt"
    calib.write_text(SHAKESPEARE[:2000])
    with pytest.raises(ConversionError, match="multimodal"):
        convert_hf(hf, tmp_path / "c.flm", dtype="int4", calib=str(calib), progress=False)


def test_refused_variants(tmp_path):
    from converter.convert import ConversionError, convert as convert_hf
    hf = make_model(tmp_path, "gemma3", name="vision", num_attention_heads=4, num_key_value_heads=1)
    edit_config(hf, use_bidirectional_attention=True)
    with pytest.raises(ConversionError, match="use_bidirectional_attention"):
        convert_hf(hf, tmp_path / "b.flm", progress=False)
    edit_config(hf, use_bidirectional_attention=False, hidden_activation="relu")
    with pytest.raises(ConversionError, match="activation 'relu' is not supported"):
        convert_hf(hf, tmp_path / "r.flm", progress=False)
    edit_config(hf, hidden_activation="gelu_pytorch_tanh", query_pre_attn_scalar=None)
    with pytest.raises(ConversionError, match="query_pre_attn_scalar must be a positive number"):
        convert_hf(hf, tmp_path / "q.flm", progress=False)
    edit_config(hf, query_pre_attn_scalar=16, layer_types=None, sliding_window_pattern=0)
    with pytest.raises(ConversionError, match="sliding_window_pattern must be a positive integer"):
        convert_hf(hf, tmp_path / "p.flm", progress=False)
    assert not any(tmp_path.glob("*.flm"))


def test_gemma3_attention_softcap_is_ignored_as_transformers_does(tmp_path):
    from converter.families import FAMILIES
    hf = make_model(tmp_path, "gemma3", num_attention_heads=4, num_key_value_heads=1)
    config = json.loads((hf / "config.json").read_text())
    config["attn_logit_softcapping"] = 50.0
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        hp = FAMILIES["gemma3"].read_hparams(config)
    assert hp.attn_softcap is None and any("ignored" in str(x.message) for x in w)
    g2 = json.loads((make_model(tmp_path, "gemma2", name="g2") / "config.json").read_text())
    for key in ("attn_logit_softcapping", "final_logit_softcapping"):
        g2.pop(key)
    hp2 = FAMILIES["gemma2"].read_hparams(g2)
    assert hp2.attn_softcap == 50.0 and hp2.final_softcap == 30.0  # Gemma 2's defaults apply
