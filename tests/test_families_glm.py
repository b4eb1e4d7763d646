"""THUDM's own ChatGLM2 / ChatGLM3 checkpoints (the remote-code layout: transformer.encoder...,
ChatGLMConfig's fields) converted onto the glm decoder, against transformers' GlmForCausalLM
(the same arithmetic) on the original weights; ChatGLM3's SentencePiece tokenizer with the
special tokens its code adds; GLM-4's byte-level BPE tokenizer.json; what is refused.

The ChatGLM3 folder is written here from a random GlmForCausalLM by hand, with the names and
fields of THUDM's modeling_chatglm.py / configuration_chatglm.py (not with the converter's table,
so that a wrong table fails): query_key_value = q rows | k rows | v rows (multi_query_attention),
dense_h_to_4h = gate_up_proj, rope base 10000 * rope_ratio over kv_channels // 2 dims; the
tokenizer is stories260K's SentencePiece model (512 pieces) with ChatGLM3's nine special tokens
at 512..520, as THUDM's SPTokenizer numbers them, and the vocabulary padded to 528
(padded_vocab_size)."""
import json
import re
import shutil

import numpy as np
import pytest
import sentencepiece as spm
import torch

import fastllm
import gguf_models
from conftest import STORIES, convert
from converter.errors import ConversionError
from hf_models import edit_config, load_model, make_model
from test_chat_template import CHATGLM3
from test_families import F32_BOUND, hf_greedy, hf_logits, input_ids, rel_diff

SPECIAL = ["[MASK]", "[gMASK]", "[sMASK]", "sop", "eop", "<|system|>", "<|user|>", "<|assistant|>", "<|observation|>"]
N_PIECES, PADDED_VOCAB = 512, 528
ID = {t: N_PIECES + k for k, t in enumerate(SPECIAL)}
SP = spm.SentencePieceProcessor(model_file=str(STORIES / "hf" / "tokenizer.model"))


def chatglm3_folder(glm_dir, out, rope_ratio):
    """THUDM's layout of the GlmForCausalLM in glm_dir (pytorch_model.bin, as THUDM ships it)."""
    cfg = json.loads((glm_dir / "config.json").read_text())
    sd = {k: v for k, v in load_model(glm_dir).state_dict().items()}
    out.mkdir()
    t = {"transformer.embedding.word_embeddings.weight": sd["model.embed_tokens.weight"],
         "transformer.encoder.final_layernorm.weight": sd["model.norm.weight"],
         "transformer.output_layer.weight": sd["lm_head.weight"],
         "transformer.rotary_pos_emb.inv_freq": torch.arange(cfg["head_dim"] // 4, dtype=torch.float32)}
    for i in range(cfg["num_hidden_layers"]):
        g, c = f"model.layers.{i}.", f"transformer.encoder.layers.{i}."
        t[c + "input_layernorm.weight"] = sd[g + "input_layernorm.weight"]
        for kind in ("weight", "bias"):
            t[c + f"self_attention.query_key_value.{kind}"] = torch.cat(
                [sd[g + f"self_attn.{p}_proj.{kind}"] for p in "qkv"])
        t[c + "self_attention.dense.weight"] = sd[g + "self_attn.o_proj.weight"]
        t[c + "post_attention_layernorm.weight"] = sd[g + "post_attention_layernorm.weight"]
        t[c + "mlp.dense_h_to_4h.weight"] = sd[g + "mlp.gate_up_proj.weight"]
        t[c + "mlp.dense_4h_to_h.weight"] = sd[g + "mlp.down_proj.weight"]
    torch.save({k: v.clone().contiguous() for k, v in t.items()}, out / "pytorch_model.bin")
    config = {
        "_name_or_path": "THUDM/chatglm3-6b", "architectures": ["ChatGLMModel"], "model_type": "chatglm",
        "auto_map": {"AutoConfig": "configuration_chatglm.ChatGLMConfig",
                     "AutoModel": "modeling_chatglm.ChatGLMForConditionalGeneration"},
        "add_bias_linear": False, "add_qkv_bias": True, "apply_query_key_layer_scaling": True,
        "apply_residual_connection_post_layernorm": False, "attention_dropout": 0.0, "attention_softmax_in_fp32": True,
        "bias_dropout_fusion": True, "ffn_hidden_size": cfg["intermediate_size"], "fp32_residual_connection": False,
        "hidden_dropout": 0.0, "hidden_size": cfg["hidden_size"], "kv_channels": cfg["head_dim"],
        "layernorm_epsilon": cfg["rms_norm_eps"], "multi_query_attention": True,
        "multi_query_group_num": cfg["num_key_value_heads"], "num_attention_heads": cfg["num_attention_heads"],
        "num_layers": cfg["num_hidden_layers"], "original_rope": True, "padded_vocab_size": cfg["vocab_size"],
        "post_layer_norm": True, "rmsnorm": True, "rope_ratio": rope_ratio, "seq_length": cfg["max_position_embeddings"],
        "use_cache": True, "torch_dtype": "float32", "tie_word_embeddings": False, "eos_token_id": 2,
        "pad_token_id": 0, "quantization_bit": 0, "pre_seq_len": None, "prefix_projection": False,
    }
    (out / "config.json").write_text(json.dumps(config, indent=2))
    (out / "generation_config.json").write_text(json.dumps(
        {"eos_token_id": [2, ID["<|user|>"], ID["<|observation|>"]], "pad_token_id": 0}))
    shutil.copy(STORIES / "hf" / "tokenizer.model", out / "tokenizer.model")
    (out / "tokenizer_config.json").write_text(json.dumps({
        "auto_map": {"AutoTokenizer": ["tokenization_chatglm.ChatGLMTokenizer", None]}, "chat_template": CHATGLM3,
        "clean_up_tokenization_spaces": False, "do_lower_case": False, "eos_token": "</s>", "pad_token": "<unk>",
        "padding_side": "left", "remove_space": False, "tokenizer_class": "ChatGLMTokenizer", "unk_token": "<unk>"}))
    return out


@pytest.fixture(scope="module")
def chatglm3(tmp_path_factory):
    """(the GlmForCausalLM reference, its ChatGLM3-layout folder, that folder's .flm)."""
    tmp = tmp_path_factory.mktemp("chatglm3")
    glm_dir = make_model(tmp / "glm", "glm", seed=3, tokenizer=None, vocab_size=PADDED_VOCAB, bos_token_id=1,
                         eos_token_id=2, pad_token_id=0, num_attention_heads=4, num_key_value_heads=2,
                         rope_parameters=dict(rope_type="default", rope_theta=20000.0, partial_rotary_factor=0.5))
    ref = load_model(glm_dir).eval()
    assert ref.model.rotary_emb.inv_freq.shape == (4,)  # head_dim 16: 8 rotated dims
    folder = chatglm3_folder(glm_dir, tmp / "chatglm3-6b", rope_ratio=2)
    return ref, folder, convert(folder, tmp / "chatglm3.flm")


def test_chatglm3_layout_matches_glm_for_causal_lm(chatglm3):
    ref, folder, flm = chatglm3
    ids = input_ids(PADDED_VOCAB)
    with fastllm.Model(flm, threads=2) as m:
        assert m.info["architecture"] == "glm"
        ours = m.forward(ids)
        prompt = input_ids(PADDED_VOCAB, seed=2, n=16)
        with m.session() as s:
            s.generate(prompt, max_new_tokens=32, temperature=0.0, ignore_eos=True)
            generated = s.tokens[len(prompt):]
    assert rel_diff(ours, hf_logits(ref, ids)) < F32_BOUND
    assert generated == hf_greedy(ref, prompt, 32)


def test_chatglm_config_without_architectures_is_found_by_model_type(chatglm3):
    from converter.convert import detect_model_type
    ref, folder, flm = chatglm3
    config = json.loads((folder / "config.json").read_text())
    del config["architectures"]
    assert detect_model_type(config) == "glm"


def test_chatglm3_layout_int8(chatglm3, tmp_path):
    ref, folder, flm = chatglm3
    ids = input_ids(PADDED_VOCAB, seed=6)
    with fastllm.Model(flm) as f, fastllm.Model(convert(folder, tmp_path / "q.flm", "int8")) as q:
        a, b = f.forward(ids), q.forward(ids)
    assert (a.argmax(1) == b.argmax(1)).mean() >= 0.9


def chatglm3_encode(text):
    """THUDM's SPTokenizer.tokenize(text, encode_special_tokens=True) as ids: the special tokens
    found anywhere in the text, each piece of text between them encoded on its own."""
    out, last = [], 0
    for m in re.finditer("|".join(map(re.escape, SPECIAL)), text):
        if last < m.start():
            out += SP.encode(text[last:m.start()])
        out.append(ID[m.group()])
        last = m.end()
    if last < len(text):
        out += SP.encode(text[last:])
    return out


def build_chat_input(query, history):
    """THUDM's ChatGLMTokenizer.build_chat_input(query, history, role="user") (ChatGLM3):
    [gMASK] sop, then per message <|role|> + encode(metadata + "\\n") + encode(content), then
    <|user|> turn of the query, then <|assistant|>."""
    ids = [ID["[gMASK]"], ID["sop"]]
    for role, content in history + [("user", query)]:
        ids += [ID[f"<|{role}|>"]] + SP.encode("\n") + SP.encode(content)
    return ids + [ID["<|assistant|>"]]


TEXTS = ["[gMASK]sop<|user|>\n Hello<|assistant|>", "<|system|>\n You are a helpful assistant<|observation|>",
         "[MASK] and [sMASK]eop", "isopropyl sop", "  two spaces<|user|>  after", "<|user|><|assistant|>",
         "Once upon a time, there was a little girl.\n\nShe liked to play."]


def test_chatglm3_tokenizer_finds_its_special_tokens_in_text(chatglm3):
    ref, folder, flm = chatglm3
    corpus = (STORIES / "text" / "tinystories_valid_head.txt").read_text(encoding="utf-8").split("\n\n")[:40]
    with fastllm.Model(flm) as m:
        assert m.info["vocab_size"] == PADDED_VOCAB
        for text in TEXTS + corpus:
            assert m.tokenize(text, add_bos=False) == chatglm3_encode(text), text
        assert m.detokenize([ID["<|user|>"]]) in ("", "<|user|>")


def test_chatglm3_chat_prompt_is_what_build_chat_input_builds(chatglm3):
    """The fixture: ChatGLM3's chat format for a system message and a question, as text (the
    template's rendering, which llama.cpp's tests quote too) and as the ids of THUDM's
    build_chat_input."""
    ref, folder, flm = chatglm3
    messages = [{"role": "system", "content": "You are a helpful assistant"}, {"role": "user", "content": "Hello"}]
    with fastllm.Model(flm) as m:
        text = m.apply_chat_template(messages)
        assert text == "[gMASK]sop<|system|>\n You are a helpful assistant<|user|>\n Hello<|assistant|>"
        assert m.tokenize(text, add_bos=False) == build_chat_input(
            "Hello", [("system", "You are a helpful assistant")])


def test_chatglm2_folders_get_chatglm2s_five_special_tokens(chatglm3, tmp_path):
    """ChatGLM2's tokenizer code appends [MASK] [gMASK] [sMASK] sop eop only: <|user|> is text."""
    ref, folder, flm = chatglm3
    v2 = tmp_path / "chatglm2-6b"
    shutil.copytree(folder, v2)
    edit_config(v2, _name_or_path="THUDM/chatglm2-6b")
    with fastllm.Model(convert(v2, tmp_path / "v2.flm")) as m:
        assert m.tokenize("[gMASK]sop<|user|>", add_bos=False) == [ID["[gMASK]"], ID["sop"]] + SP.encode("<|user|>")


def test_chatglm3_generation_stops_at_its_role_tokens(chatglm3, tmp_path):
    from converter.flm_reader import read_flm
    ref, folder, flm = chatglm3
    meta, _ = read_flm(flm)
    assert list(meta["tokenizer.eos_ids"]) == [2, ID["<|user|>"], ID["<|observation|>"]]
    assert meta["glm.rope.dim"] == 8 and meta["tokenizer.add_bos"] == 0


@pytest.mark.parametrize("family", ["glm", "glm4"])
def test_glm4_bpe_tokenizer_matches_tokenizers(tmp_path, family):
    """GLM-4's byte-level BPE (Llama 3's split pattern; GLM-4-0414 with ignore_merges) against
    the `tokenizers` library on the same tokenizer.json, added tokens included."""
    from tokenizers import Tokenizer
    hf_dir = make_model(tmp_path / "hf", family, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=1)
    ref = Tokenizer.from_file(str(hf_dir / "tokenizer.json"))
    corpus = (STORIES / "text" / "tinystories_valid_head.txt").read_text(encoding="utf-8").split("\n\n")[:60]
    texts = corpus + ["[gMASK]<sop><|system|>\nYou are terse.<|user|>\nHi 12345 don't<|assistant|>\n",
                      "Où est la bibliothèque? 🙂\r\n\tLine two.   ", "<|endoftext|>[MASK][sMASK]<eop><|observation|>"]
    gguf = convert(gguf_models.write_gguf(hf_dir, tmp_path / "m.gguf"), tmp_path / "g.flm")  # chatglm-bpe / glm4
    with fastllm.Model(convert(hf_dir, tmp_path / "m.flm")) as m, fastllm.Model(gguf) as g:
        for text in texts:
            ids = ref.encode(text, add_special_tokens=False).ids
            assert m.tokenize(text, add_bos=False) == ids == g.tokenize(text, add_bos=False), text
            assert m.detokenize(ids) == ref.decode(ids, skip_special_tokens=True)


# ---- refused ------------------------------------------------------------------------------------

@pytest.mark.parametrize("change, message", [
    (dict(multi_query_attention=False), "multi_query_attention = false"),
    (dict(rmsnorm=False), "rmsnorm = false"),
    (dict(add_bias_linear=True), "add_bias_linear = true"),
    (dict(apply_residual_connection_post_layernorm=True), "apply_residual_connection_post_layernorm"),
    (dict(quantization_bit=4), "quantization_bit = 4"),
    (dict(pre_seq_len=128), "P-tuning"),
    (dict(multi_query_group_num=3), "multi_query_group_num"),
])
def test_chatglm_variants_glm_does_not_compute_are_refused(chatglm3, tmp_path, change, message):
    ref, folder, flm = chatglm3
    bad = tmp_path / "bad"
    shutil.copytree(folder, bad)
    edit_config(bad, **change)
    with pytest.raises(ConversionError) as e:
        convert(bad, tmp_path / "x.flm")
    assert message in str(e.value)


def test_chatglm_tensor_the_table_does_not_know_is_refused(chatglm3, tmp_path):
    ref, folder, flm = chatglm3
    bad = tmp_path / "bad"
    shutil.copytree(folder, bad)
    sd = torch.load(bad / "pytorch_model.bin")
    sd["transformer.prefix_encoder.embedding.weight"] = torch.zeros(4, 8)
    torch.save(sd, bad / "pytorch_model.bin")
    with pytest.raises(ConversionError) as e:
        convert(bad, tmp_path / "x.flm")
    assert "transformer.prefix_encoder.embedding.weight" in str(e.value)


def test_glm_rope_scaling_is_refused(tmp_path):
    hf_dir = make_model(tmp_path / "hf", "glm", num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=1)
    edit_config(hf_dir, rope_parameters=dict(rope_type="linear", factor=2.0, rope_theta=10000.0,
                                             partial_rotary_factor=0.5))
    with pytest.raises(ConversionError) as e:
        convert(hf_dir, tmp_path / "x.flm")
    assert "unsupported rope type 'linear'" in str(e.value)


def chatglm3_gguf(folder, path):
    """The ChatGLM3 folder as llama.cpp's ChatGLMModel writes THUDM/chatglm3-6b: architecture
    chatglm, THUDM's fused attn_qkv (q, k, v rows) and ffn_up (dense_h_to_4h), its keys, and
    set_vocab_chatglm3's vocabulary (<unk> <bos> <eos> renamed, the special tokens as control
    tokens, [PADn] up to padded_vocab_size) with the chatglm-spm pre-tokenizer."""
    import gguf
    from gguf_models import _chatglm_hparams
    cfg = json.loads((folder / "config.json").read_text())
    sd = torch.load(folder / "pytorch_model.bin")
    w = gguf.GGUFWriter(str(path), "chatglm")
    w.add_string("general.name", folder.name)
    _chatglm_hparams(w, "chatglm", cfg, {})
    tokens, scores, types = [], [], []
    for i in range(cfg["padded_vocab_size"]):
        if i < N_PIECES:
            piece = {0: "<unk>", 1: "<bos>", 2: "<eos>"}.get(i, SP.id_to_piece(i))
            kind = 2 if SP.is_unknown(i) else 3 if SP.is_control(i) else 6 if SP.is_byte(i) else 1
            tokens.append(piece), scores.append(SP.get_score(i)), types.append(kind)
        elif i < N_PIECES + len(SPECIAL):
            tokens.append(SPECIAL[i - N_PIECES]), scores.append(0.0), types.append(3)
        else:
            tokens.append(f"[PAD{i}]"), scores.append(0.0), types.append(5)
    w.add_string("tokenizer.ggml.model", "llama")
    w.add_string("tokenizer.ggml.pre", "chatglm-spm")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_uint32("tokenizer.ggml.eos_token_id", 2)
    w.add_uint32("tokenizer.ggml.padding_token_id", 0)
    w.add_string("tokenizer.chat_template", CHATGLM3)
    names = {"embedding.word_embeddings": "token_embd", "encoder.final_layernorm": "output_norm",
             "output_layer": "output", "input_layernorm": "attn_norm", "self_attention.query_key_value": "attn_qkv",
             "self_attention.dense": "attn_output", "post_attention_layernorm": "ffn_norm",
             "mlp.dense_h_to_4h": "ffn_up", "mlp.dense_4h_to_h": "ffn_down"}
    for name, t in sd.items():
        if name.endswith("rotary_pos_emb.inv_freq"):
            continue
        m = re.fullmatch(r"transformer\.(?:encoder\.layers\.(\d+)\.)?(.+)\.(weight|bias)", name)
        layer, base, kind = m.groups()
        w.add_tensor((f"blk.{layer}." if layer else "") + names[base] + "." + kind, t.float().numpy())
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_chatglm3_gguf_as_llama_cpp_writes_it(chatglm3, tmp_path):
    ref, folder, flm = chatglm3
    ids = input_ids(PADDED_VOCAB, seed=7)
    gguf_flm = convert(chatglm3_gguf(folder, tmp_path / "chatglm3.gguf"), tmp_path / "from_gguf.flm")
    with fastllm.Model(gguf_flm) as g, fastllm.Model(flm) as h:
        assert g.info["architecture"] == "glm"
        assert rel_diff(g.forward(ids), hf_logits(ref, ids)) < F32_BOUND
        for text in TEXTS:
            assert g.tokenize(text, add_bos=False) == h.tokenize(text, add_bos=False) == chatglm3_encode(text), text


def test_glm4_9b_tiktoken_tokenizer_is_refused_by_name(chatglm3, tmp_path):
    """THUDM/glm-4-9b(-chat) as published (model_type chatglm) ships a tiktoken tokenizer.model."""
    import base64
    ref, folder, flm = chatglm3
    bad = tmp_path / "glm-4-9b-chat"
    shutil.copytree(folder, bad)
    (bad / "tokenizer.model").write_bytes(b"".join(base64.b64encode(bytes([i])) + b" %d\n" % i for i in range(256)))
    with pytest.raises(ConversionError) as e:
        convert(bad, tmp_path / "x.flm")
    assert "tiktoken" in str(e.value) and "-hf" in str(e.value)
