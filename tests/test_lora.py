"""LoRA adapters (docs/lora.md) against peft on transformers: random-weight base models of real
architectures, random adapters (peft's LoraConfig with init_lora_weights=False, so that B is not
zero), converted with convert.py --adapter and applied unmerged by the library."""
import ctypes
import math
import os

import numpy as np
import pytest
import torch

import fastllm
from fastllm import _lib as raw
from conftest import convert
from converter.convert import ConversionError, convert_adapter
from hf_models import load_model, make_model

peft = pytest.importorskip("peft")

PROMPT = [1, 5, 9, 23, 7, 100, 42, 3, 17, 64, 11, 2]
ALL = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def make_adapter(base_dir, out_dir, seed, **lora):
    """A peft adapter of random A and B on the base at base_dir, saved to out_dir; returns the
    peft model (the reference) and the folder."""
    torch.manual_seed(seed)
    model = load_model(base_dir)
    cfg = peft.LoraConfig(init_lora_weights=False, **lora)
    pm = peft.get_peft_model(model, cfg).eval()
    with torch.no_grad():  # B of the same size as A's effect: a change well above f32 noise
        for name, p in pm.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn_like(p) * 0.2)
    pm.save_pretrained(out_dir)
    return pm, out_dir


def reference_logits(model, ids):
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float().numpy()


def rel(a, b):
    return float(np.abs(a - b).max() / np.abs(b).max())


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    d = tmp_path_factory.mktemp("lora_llama")
    base = make_model(d, "llama", num_key_value_heads=2)
    return d, base, convert(base, d / "base.flm")


@pytest.mark.parametrize("rank,targets,rslora", [(8, ALL, False), (1, ["q_proj", "v_proj"], False),
                                                 (16, ["k_proj", "o_proj", "up_proj", "down_proj"], True)])
def test_logits_match_peft(llama, tmp_path, rank, targets, rslora):
    d, base, flm = llama
    pm, folder = make_adapter(base, tmp_path / "adapter", seed=rank, r=rank, lora_alpha=2 * rank,
                              target_modules=targets, use_rslora=rslora)
    convert_adapter(folder, base, tmp_path / "a.flm")
    want = reference_logits(pm, PROMPT)
    with fastllm.Model(flm, threads=2) as m:
        adapter = m.load_adapter(tmp_path / "a.flm")
        with m.session(kv_type="f32", adapters={adapter: 1.0}) as s:
            got = s.eval(PROMPT, logits="all")
        with m.session(kv_type="f32") as s:  # the base model, and the adapter's effect well above the bound
            base_logits = s.eval(PROMPT, logits="all")
    assert rel(got, want) < 1e-4, rel(got, want)
    assert rel(base_logits, want) > 1e-2


def test_scales_combine_as_peft_weighted_sum(llama, tmp_path):
    """scale 0 is the base model; two adapters at once are their sum, each times its scale."""
    d, base, flm = llama
    pa, fa = make_adapter(base, tmp_path / "a", seed=1, r=4, lora_alpha=8, target_modules=["q_proj", "down_proj"])
    pb, fb = make_adapter(base, tmp_path / "b", seed=2, r=8, lora_alpha=8, target_modules=["v_proj", "gate_proj"])
    convert_adapter(fa, base, tmp_path / "a.flm")
    convert_adapter(fb, base, tmp_path / "b.flm")
    # the reference: both adapters on one peft model, their scalings multiplied as fastllm's scales
    ref = peft.PeftModel.from_pretrained(load_model(base), fa, adapter_name="a")
    ref.load_adapter(fb, adapter_name="b")
    ref.base_model.set_adapter(["a", "b"])
    for mod in ref.modules():
        if hasattr(mod, "scaling") and isinstance(mod.scaling, dict):
            for name, factor in (("a", 0.5), ("b", -1.5)):
                if name in mod.scaling:
                    mod.scaling[name] *= factor
    want = reference_logits(ref.eval(), PROMPT)
    base_want = reference_logits(load_model(base), PROMPT)
    with fastllm.Model(flm, threads=2) as m:
        a, b = m.load_adapter(tmp_path / "a.flm"), m.load_adapter(tmp_path / "b.flm")
        with m.session(kv_type="f32", adapters={a: 0.5, b: -1.5}) as s:
            got = s.eval(PROMPT, logits="all")
        with m.session(kv_type="f32", adapters={a: 0.0}) as s:
            zero = s.eval(PROMPT, logits="all")
    assert rel(got, want) < 1e-4, rel(got, want)
    assert rel(zero, base_want) < 1e-4


@pytest.mark.parametrize("family,targets,rank", [
    ("qwen2", ["k_proj", "v_proj", "up_proj"], 8), ("phi3", ["qkv_proj", "gate_up_proj", "o_proj"], 8),
    ("mistral", "all-linear", 8), ("qwen3", "all-linear", 8), ("gemma", "all-linear", 64), ("gemma2", "all-linear", 8),
    ("gemma3", "all-linear", 8), ("glm", "all-linear", 8), ("glm4", "all-linear", 8)])
def test_families(tmp_path, family, targets, rank):
    """Every family: Qwen2 (q/k/v biases), Phi-3 and GLM, whose checkpoints fuse q|k|v or gate|up
    already (the adapted rows land where the fused tensors keep them), and the rest with peft's
    "all-linear" (every matrix of every layer); rank 64 on Gemma."""
    base = make_model(tmp_path, family, num_key_value_heads=2)
    flm = convert(base, tmp_path / "base.flm")
    pm, folder = make_adapter(base, tmp_path / "adapter", seed=3, r=rank, lora_alpha=16, target_modules=targets)
    convert_adapter(folder, base, tmp_path / "a.flm")
    want = reference_logits(pm, PROMPT)
    with fastllm.Model(flm, threads=2) as m:
        with m.session(kv_type="f32", adapters={m.load_adapter(tmp_path / "a.flm"): 1.0}) as s:
            got = s.eval(PROMPT, logits="all")
    assert rel(got, want) < 1e-4, rel(got, want)


def test_sessions_with_different_adapters_step_together(llama, tmp_path):
    """Greedy generations of sessions with different adapters (and none) advancing in the same
    passes give each what it gives alone."""
    from test_families import step_together
    d, base, flm = llama
    files = []
    for i, targets in enumerate((["q_proj", "up_proj"], ["v_proj", "down_proj"])):
        _, folder = make_adapter(base, tmp_path / f"ad{i}", seed=10 + i, r=8, lora_alpha=16, target_modules=targets)
        files.append(convert_adapter(folder, base, tmp_path / f"ad{i}.flm"))
    with fastllm.Model(flm, threads=2) as m:
        adapters = [m.load_adapter(f) for f in files]
        sets = [{adapters[0]: 1.0}, {}, {adapters[1]: 0.7}, {adapters[0]: 0.3, adapters[1]: 1.0}]
        alone = []
        for ads in sets:
            with m.session(adapters=ads) as s:
                s.generate(PROMPT[:5], 12, temperature=0, ignore_eos=True)
                alone.append(s.tokens)
        together = step_together(m, [PROMPT[:5]] * len(sets), 12, adapters=sets)
    assert together == alone
    assert len({tuple(t) for t in alone}) > 1  # the adapters change what is generated
    # with speculation, the target's adapters decide: a draft model without them (the base) and
    # prompt lookup change nothing greedy
    prompts = [PROMPT * 2] * len(sets)
    with fastllm.Model(flm, threads=2) as m, fastllm.Model(flm, threads=2) as draft:
        adapters = [m.load_adapter(f) for f in files]
        sets = [{adapters[0]: 1.0}, {adapters[1]: 0.7}, {adapters[0]: 0.3, adapters[1]: 1.0}, {adapters[0]: 1.0}]
        plain = step_together(m, prompts, 12, adapters=sets)
        spec = [{"draft": draft, "n_draft": 4}, {"draft": None, "n_draft": 3}, {"draft": draft}, None]
        assert step_together(m, prompts, 12, adapters=sets, speculative=spec) == plain


def test_bad_adapters(llama, tmp_path):
    d, base, flm = llama
    other = make_model(tmp_path, "llama", name="wider", hidden_size=96, num_key_value_heads=2)
    _, folder = make_adapter(other, tmp_path / "wide", seed=5, r=4, lora_alpha=4, target_modules=["q_proj"])
    with pytest.raises(ConversionError, match="do not fit"):
        convert_adapter(folder, base, tmp_path / "x.flm")
    convert_adapter(folder, other, tmp_path / "wide.flm")
    qwen = make_model(tmp_path, "qwen2", num_key_value_heads=2)
    _, qfolder = make_adapter(qwen, tmp_path / "q", seed=6, r=4, lora_alpha=4, target_modules=["q_proj"])
    convert_adapter(qfolder, qwen, tmp_path / "qwen.flm")
    _, good = make_adapter(base, tmp_path / "good", seed=7, r=4, lora_alpha=4, target_modules=["q_proj"])
    good_flm = convert_adapter(good, base, tmp_path / "good.flm")
    data = open(good_flm, "rb").read()
    open(tmp_path / "cut.flm", "wb").write(data[: len(data) - 100])
    with fastllm.Model(flm, threads=2) as m, fastllm.Model(flm) as m2:
        for path, status, words in ((tmp_path / "wide.flm", raw.ERR_BAD_FORMAT, "do not fit"),
                                    (tmp_path / "qwen.flm", raw.ERR_BAD_FORMAT, "qwen2"),
                                    (tmp_path / "cut.flm", raw.ERR_BAD_FORMAT, ""),
                                    (flm, raw.ERR_BAD_FORMAT, "is a model"),
                                    (tmp_path / "missing.flm", raw.ERR_IO, "")):
            with pytest.raises(fastllm.FastLLMError) as e:
                m.load_adapter(path)
            assert e.value.status == status and words in str(e.value), str(e.value)
        with pytest.raises(fastllm.FastLLMError) as e:  # a model file is not an adapter, nor the reverse
            fastllm.Model(good_flm)
        assert "LoRA adapter" in str(e.value)
        a = m.load_adapter(good_flm)
        with m.session() as s:
            s.eval(PROMPT[:4])
            for scale in (math.inf, math.nan):
                with pytest.raises(fastllm.FastLLMError, match="not finite"):
                    s.set_adapters({a: scale})
            assert s.adapters == {}  # nothing changed
            with pytest.raises(fastllm.FastLLMError, match="another model"):
                s.set_adapters({m2.load_adapter(good_flm): 1.0})
        # hostile names and pairs: a layer or row past any integer, a b without its a
        from converter.flm_writer import KIND_ADAPTER, FlmWriter
        a32 = np.ones((4, 64), np.float32)
        for tensors in ({"blk.4294967295.attn_qkv.weight.lora_a.0": a32,
                         "blk.4294967295.attn_qkv.weight.lora_b.0": np.ones((8, 4), np.float32)},
                        {"blk.0.attn_qkv.weight.lora_a.9223372036854775807": a32,
                         "blk.0.attn_qkv.weight.lora_b.9223372036854775807": np.ones((1, 4), np.float32)},
                        {"blk.0.attn_qkv.weight.lora_a.0": a32, "blk.0.attn_qkv.weight.lora_b.0": np.ones((8, 4), np.float32),
                         "blk.1.ffn_down.weight.lora_b.0": np.ones((8, 4), np.float32)}):
            w = FlmWriter(tmp_path / "hostile.flm", kind=KIND_ADAPTER)
            w.add_string("general.architecture", "llama")
            w.add_string("adapter.type", "lora")
            for name, arr in tensors.items():
                w.add_tensor(name, "f32", arr.shape, lambda arr=arr: arr)
            w.write()
            with pytest.raises(fastllm.FastLLMError) as e:
                m.load_adapter(tmp_path / "hostile.flm")
            assert e.value.status == raw.ERR_BAD_FORMAT, str(e.value)
        # freeing an adapter that a session still applies is deferred: the session goes on with it
        s = m.session(kv_type="f32", adapters={a: 1.0})
        first = s.eval(PROMPT, logits="last")
        a.close()
        s.reset()
        assert np.array_equal(s.eval(PROMPT, logits="last"), first)
        s.close()


def test_node_and_cpp_clients_apply_adapters(llama, tmp_path):
    """The Node client (Model.loadAdapter, Session.setAdapters) and the C++ header (Adapter,
    Session::set_adapters) generate what the Python binding generates with the same adapter."""
    import json
    import shutil
    import subprocess
    from conftest import BUILD, REPO
    from test_cpp_wrapper import compile_cpp
    d, base, flm = llama
    _, folder = make_adapter(base, tmp_path / "ad", seed=21, r=8, lora_alpha=16, target_modules=ALL)
    ad = convert_adapter(folder, base, tmp_path / "ad.flm")
    with fastllm.Model(flm, threads=2) as m:
        with m.session(adapters={m.load_adapter(ad): 0.8}) as s:
            want = s.generate(PROMPT[:4], 10, temperature=0, ignore_eos=True)
        base_text = m.generate(PROMPT[:4], 10, temperature=0, ignore_eos=True)
    assert want != base_text

    node_dir = REPO / "bindings" / "examples" / "node"
    script = (f"const f = require({json.dumps(str(node_dir / 'fastllm.js'))});"
              f"const m = f.Model.load({json.dumps(str(flm))}, {{ threads: 2 }});"
              f"const a = m.loadAdapter({json.dumps(str(ad))});"
              f"const s = m.createSession({{}}); s.setAdapters(new Map([[a, 0.8]]));"
              f"const r = s.generate({json.dumps(PROMPT[:4])}, {{ maxNewTokens: 10, temperature: 0, ignoreEos: true }});"
              f"process.stdout.write(JSON.stringify(r.text)); a.close(); s.free(); m.free();")
    node = shutil.which("node")
    assert node, "Node.js is missing (scripts/setup.sh installs it)"
    if not (node_dir / "node_modules" / "koffi").exists():
        subprocess.run(["npm", "ci", "--no-audit", "--no-fund"], cwd=node_dir, check=True, capture_output=True, timeout=300)
    r = subprocess.run([node, "-e", script], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "FASTLLM_LIBRARY": str(BUILD / "libfastllm.so")})
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == want

    src = tmp_path / "lora.cpp"
    src.write_text("""#include <cstdio>
#include "fastllm.hpp"
int main(int, char **argv) {
    fastllm::Model model(argv[1], 2);
    fastllm::Adapter adapter(model, argv[2]);
    fastllm::Session s(model);
    s.set_adapters({{&adapter, 0.8f}});
    fastllm::SamplingParams o;
    o.max_new_tokens = 10, o.temperature = 0, o.ignore_eos = true;
    std::fputs(s.generate(std::vector<int32_t>{""" + ", ".join(map(str, PROMPT[:4])) + """}, o).text.c_str(), stdout);
}
""")
    exe = compile_cpp(src, tmp_path / "lora")
    r = subprocess.run([str(exe), str(flm), str(ad)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout == want


def test_a_device_declines_adapters(llama, tmp_path):
    """Layers on a Vulkan device: setting an adapter is FASTLLM_ERR_UNSUPPORTED, nothing changed
    (adapters run on the CPU; never a silent CPU detour inside a device's pass)."""
    d, base, flm = llama
    if not any(dev["usable"] for dev in fastllm.devices()):
        pytest.skip("no Vulkan device on this machine: not run (apt install mesa-vulkan-drivers)")
    _, folder = make_adapter(base, tmp_path / "ad", seed=22, r=4, lora_alpha=4, target_modules=["q_proj"])
    ad = convert_adapter(folder, base, tmp_path / "ad.flm")
    with fastllm.Model(flm, threads=2, device="vulkan") as m:
        a = m.load_adapter(ad)
        with m.session() as s:
            with pytest.raises(fastllm.FastLLMError) as e:
                s.set_adapters({a: 1.0})
            assert e.value.status == raw.ERR_UNSUPPORTED and "run on the CPU" in str(e.value)
            assert s.adapters == {}


def test_c_api_null_arguments():
    lib = raw.lib
    out = ctypes.c_void_p()
    assert lib.fastllm_adapter_load(None, b"x.flm", ctypes.byref(out)) == raw.ERR_INVALID_ARGUMENT
    assert lib.fastllm_session_set_adapters(None, None, None, 0) == raw.ERR_INVALID_ARGUMENT
    lib.fastllm_adapter_free(None)  # harmless, as free(NULL)


def test_saved_state_names_its_adapters(llama, tmp_path):
    """A state saved under adapters loads only into a session with the same adapters and scales,
    and goes on as never stopped; under other adapters (or none) it is refused, nothing changed."""
    d, base, flm = llama
    files = []
    for i in range(2):
        _, folder = make_adapter(base, tmp_path / f"ad{i}", seed=30 + i, r=4, lora_alpha=8, target_modules=ALL)
        files.append(convert_adapter(folder, base, tmp_path / f"ad{i}.flm"))
    with fastllm.Model(flm, threads=2) as m:
        a, b = (m.load_adapter(f) for f in files)
        with m.session(kv_type="f32", adapters={a: 1.0}) as s:
            s.eval(PROMPT[:6])
            state = s.save_state()
            want = s.eval(PROMPT[6:], logits="all")
        for other in ({}, {b: 1.0}, {a: 0.5}, {a: 1.0, b: 1.0}):
            with m.session(kv_type="f32", adapters=other) as s:
                s.eval(PROMPT[:2])
                with pytest.raises(fastllm.FastLLMError) as e:
                    s.load_state(state)
                assert e.value.status == raw.ERR_BAD_FORMAT and "adapter" in str(e.value)
                assert s.n_tokens == 2
        with m.session(kv_type="f32", adapters={m.load_adapter(files[0]): 1.0}) as s:  # the same file, loaded again
            s.load_state(state)
            assert np.array_equal(s.eval(PROMPT[6:], logits="all"), want)


def dequantized_base(flm_path, hf_dir):
    """The transformers model with the weights as the .flm file stores them (rounded to its
    dtypes): the reference for a quantized base."""
    from converter import quantize
    from converter.flm_reader import load_flm
    f = load_flm(flm_path)
    model = load_model(hf_dir)
    cfg = model.config
    q = cfg.num_attention_heads * cfg.head_dim if getattr(cfg, "head_dim", None) else cfg.hidden_size
    kv = cfg.num_key_value_heads * (q // cfg.num_attention_heads)

    def weight(name):
        t = f.tensors[name]
        if t.dtype in ("f32", "f16"):
            return torch.tensor(np.asarray(t.data, dtype=np.float32))
        return torch.tensor(quantize.dequantize(np.asarray(t.data), t.dtype, t.shape))

    with torch.no_grad():
        model.model.embed_tokens.weight.copy_(weight("token_embd.weight"))
        if "output.weight" in f.tensors:
            model.lm_head.weight.copy_(weight("output.weight"))
        for i, layer in enumerate(model.model.layers):
            qkv, gu = weight(f"blk.{i}.attn_qkv.weight"), weight(f"blk.{i}.ffn_gate_up.weight")
            a, mlp = layer.self_attn, layer.mlp
            a.q_proj.weight.copy_(qkv[:q]), a.k_proj.weight.copy_(qkv[q:q + kv]), a.v_proj.weight.copy_(qkv[q + kv:])
            a.o_proj.weight.copy_(weight(f"blk.{i}.attn_output.weight"))
            n = gu.shape[0] // 2
            mlp.gate_proj.weight.copy_(gu[:n]), mlp.up_proj.weight.copy_(gu[n:])
            mlp.down_proj.weight.copy_(weight(f"blk.{i}.ffn_down.weight"))
    return model


@pytest.mark.parametrize("dtype,bound", [("int8", 0.015), ("q4_k_m", 0.03)])
def test_quantized_bases(llama, tmp_path, dtype, bound):
    """Unmerged over quantized weights: against peft over the same weights as the file rounds them,
    within what the quantized kernels' int8 activations cost (the base alone shows the bound)."""
    d, base, _ = llama
    flm = convert(base, tmp_path / f"base-{dtype}.flm", dtype=dtype)
    _, folder = make_adapter(base, tmp_path / "ad", seed=40, r=8, lora_alpha=16, target_modules=ALL)
    ad = convert_adapter(folder, base, tmp_path / "ad.flm")
    rounded = dequantized_base(flm, base)
    base_want = reference_logits(rounded, PROMPT)
    want = reference_logits(peft.PeftModel.from_pretrained(rounded, folder).eval(), PROMPT)
    with fastllm.Model(flm, threads=2) as m:
        with m.session(kv_type="f32", adapters={m.load_adapter(ad): 1.0}) as s:
            got = s.eval(PROMPT, logits="all")
        with m.session(kv_type="f32") as s:
            without = s.eval(PROMPT, logits="all")
    assert rel(without, base_want) < bound, rel(without, base_want)
    assert rel(got, want) < bound, rel(got, want)
    assert rel(got, base_want) > 3 * bound  # the adapter's effect is well above the bound


def test_merged_file_is_the_unmerged_run(llama, tmp_path):
    """convert.py --lora merges the adapter into the weights: the one file gives what the base with
    the adapter set gives (scale 0.5 both ways)."""
    d, base, flm = llama
    _, folder = make_adapter(base, tmp_path / "ad", seed=50, r=8, lora_alpha=16, target_modules=ALL)
    ad = convert_adapter(folder, base, tmp_path / "ad.flm")
    from converter.convert import convert as run
    merged = run(str(base), str(tmp_path / "merged.flm"), lora=str(folder), lora_scale=0.5, progress=False)
    with fastllm.Model(flm, threads=2) as m, fastllm.Model(merged, threads=2) as mm:
        with m.session(kv_type="f32", adapters={m.load_adapter(ad): 0.5}) as s:
            want = s.eval(PROMPT, logits="all")
        got = mm.forward(PROMPT)
    assert rel(got, want) < 1e-4, rel(got, want)
    with pytest.raises(ConversionError, match="without --calib"):
        run(str(base), str(tmp_path / "x.flm"), dtype="int8", lora=str(folder), calib=str(tmp_path / "none.txt"))


def test_f16_adapter_matrices(llama, tmp_path):
    """--dtype f16 for an adapter: half the bytes, within f16's rounding of the adapter's change."""
    d, base, flm = llama
    pm, folder = make_adapter(base, tmp_path / "ad", seed=60, r=8, lora_alpha=16, target_modules=ALL)
    f32, f16 = (convert_adapter(folder, base, tmp_path / f"ad-{t}.flm", dtype=t) for t in ("f32", "f16"))
    want = reference_logits(pm, PROMPT)
    with fastllm.Model(flm, threads=2) as m:
        with m.session(kv_type="f32", adapters={m.load_adapter(f16): 1.0}) as s:
            got = s.eval(PROMPT, logits="all")
    assert rel(got, want) < 2e-3, rel(got, want)
    assert os.path.getsize(f16) < 0.6 * os.path.getsize(f32)
    with pytest.raises(ConversionError, match="f32, f16 or int8"):
        convert_adapter(folder, base, tmp_path / "x.flm", dtype="q4")


def q8_rows(x):
    """Rows of x rounded as q8 rows (kv_format.h): blocks of 32, amax / 127, codes half to even."""
    x = np.asarray(x, np.float32)
    n = x.shape[-1]
    pad = np.zeros((*x.shape[:-1], -n % 32), np.float32)
    blocks = np.concatenate([x, pad], -1).reshape(*x.shape[:-1], -1, 32)
    amax = np.abs(blocks).max(-1, keepdims=True)
    d = (amax / np.float32(127)).astype(np.float32)
    inv = np.where(amax > 0, np.float32(127) / np.where(amax > 0, amax, 1), 0).astype(np.float32)
    codes = np.rint(blocks * inv)
    return (codes * d).reshape(*x.shape[:-1], -1)[..., :n]


def test_int8_adapter_matrices(llama, tmp_path):
    """--dtype int8 for an adapter: a's rows and b's columns as q8 rows of 32-value blocks at load
    (the pass reads 0.56x f16's bytes); logits within 1e-4 of peft with A and s B rounded the same
    way, so the check is of the q8 path, not of the rounding; the saved state knows the difference."""
    d, base, flm = llama
    pm, folder = make_adapter(base, tmp_path / "ad", seed=61, r=8, lora_alpha=16, target_modules=ALL)
    f32, q8 = (convert_adapter(folder, base, tmp_path / f"ad-{t}.flm", dtype=t) for t in ("f32", "int8"))
    s = 16 / 8
    with torch.no_grad():
        for name, p in pm.named_parameters():
            if "lora_A" in name:
                p.copy_(torch.from_numpy(q8_rows(p.numpy())))
            elif "lora_B" in name:  # s B held transposed: its columns are the rows rounded
                p.copy_(torch.from_numpy(q8_rows((p.numpy() * s).T).T / s))
    want = reference_logits(pm, PROMPT)
    with fastllm.Model(flm, threads=2) as m:
        a8, a32 = m.load_adapter(q8), m.load_adapter(f32)
        with m.session(kv_type="f32", adapters={a8: 1.0}) as s8:
            got = s8.eval(PROMPT, logits="all")
            state = s8.save_state()
        assert rel(got, want) < 1e-4, rel(got, want)
        with m.session(kv_type="f32", adapters={a32: 1.0}) as s32:
            assert rel(s32.eval(PROMPT, logits="all"), got) > 1e-3  # q8 rounds; f32 does not
            with pytest.raises(fastllm.FastLLMError, match="adapter"):
                s32.load_state(state)  # computed under the q8 adapter, not this one
    from converter.flm_reader import load_flm
    assert load_flm(q8).metadata["adapter.dtype"] == "q8"


def test_server_applies_adapters_per_request(llama, tmp_path):
    """fastllm-server --lora: a request picks adapters by "model" (vLLM's way) or "lora" (llama.cpp's),
    gets what the binding gives with the same adapters, in one batch with requests on other adapters;
    /v1/models lists them; the prefix cache never hands KV made under one adapter set to another."""
    from concurrent.futures import ThreadPoolExecutor
    from test_server import SERVER, Server
    if not SERVER.exists():
        pytest.skip("fastllm-server not built")
    d, base, flm = llama
    files = []
    for i, targets in enumerate((["q_proj", "v_proj", "down_proj"], ["k_proj", "o_proj", "up_proj"])):
        _, folder = make_adapter(base, tmp_path / f"s{i}", seed=20 + i, r=8, lora_alpha=16, target_modules=targets)
        files.append(convert_adapter(folder, base, tmp_path / f"s{i}.flm"))
    prompt = PROMPT[:6]
    with fastllm.Model(flm, threads=1) as m:
        a, b = (m.load_adapter(f) for f in files)

        def alone(adapters, p=prompt):
            with m.session(adapters=adapters) as s:
                return s.generate(p, 10, temperature=0, ignore_eos=True)
        want = {"base": alone({}), "guard": alone({a: 1.0}), "merchant": alone({b: 0.5}),
                "both": alone({a: 0.3, b: 1.0}), "long": alone({a: 1.0}, PROMPT * 4)}
    assert len({want[k] for k in ("base", "guard", "merchant", "both")}) == 4  # the adapters change the text
    srv = Server(flm, "--max-sessions", 4, "--model-name", "npc", "--lora", f"guard={files[0]}",
                 "--lora", f"merchant={files[1]}:0.5")
    try:
        status, models = srv.request("GET", "/v1/models")
        assert status == 200 and [x["id"] for x in models["data"]] == ["npc", "guard", "merchant"]
        assert models["data"][2]["parent"] == "npc" and models["data"][2]["meta"]["lora"]["scale"] == 0.5
        assert srv.request("GET", "/v1/models/merchant")[1]["meta"]["lora"] == {"scale": 0.5}

        def complete(extra, p=prompt):
            status, r = srv.request("POST", "/v1/completions", {"model": "npc", "prompt": p, "max_tokens": 10,
                                                                "temperature": 0, "ignore_eos": True, **extra})
            assert status == 200, r
            return r
        bodies = {"base": {}, "guard": {"model": "guard"}, "merchant": {"lora": [{"name": "merchant"}]},
                  "both": {"lora": [{"id": 1, "scale": 1.0}, {"name": "guard", "scale": 0.3}]}}
        for key, extra in bodies.items():  # one at a time, then all at once (stepping together)
            r = complete(extra)
            assert r["choices"][0]["text"] == want[key], key
            assert r["model"] == extra.get("model", "npc")
        with ThreadPoolExecutor(8) as pool:
            got = list(pool.map(lambda kv: (kv[0], complete(kv[1])["choices"][0]["text"]), list(bodies.items()) * 2))
        assert all(text == want[key] for key, text in got), got
        # a long prompt served under guard, then asked under base, merchant and guard at another
        # scale (each finds at most the short prompt it served itself), and under guard again
        long_prompt = PROMPT * 4
        assert complete({"model": "guard"}, long_prompt)["choices"][0]["text"] == want["long"]
        for extra in ({}, {"model": "merchant"}, {"lora": [{"name": "guard", "scale": 0.5}]}, {"model": "guard"}):
            r = complete(extra, long_prompt)
            cached = r["usage"]["prompt_tokens_details"]["cached_tokens"]
            assert cached >= len(long_prompt) - 1 if extra == {"model": "guard"} else cached <= len(prompt), (extra, cached)
        assert complete({"lora": [{"name": "guard", "scale": 0}]})["choices"][0]["text"] == want["base"]
        # bad requests: 4xx naming the field, nothing served wrongly after them
        for extra, status, code in (({"lora": [{"name": "nobody"}]}, 400, "lora_not_found"),
                                    ({"lora": [{"id": 2}]}, 400, "lora_not_found"),
                                    ({"lora": [{"id": -1}]}, 400, "invalid_value"),
                                    ({"lora": [{"name": "guard"}, {"id": 0}]}, 400, "invalid_value"),
                                    ({"lora": [{"name": "guard", "id": 0}]}, 400, "invalid_value"),
                                    ({"lora": [{"name": "guard", "scale": "high"}]}, 400, "invalid_type"),
                                    ({"lora": [{"name": "guard", "scale": 1e300}]}, 400, "invalid_value"),
                                    ({"lora": {"name": "guard"}}, 400, "invalid_type"),
                                    ({"model": "smith"}, 404, "model_not_found")):
            st, r = srv.request("POST", "/v1/completions", {"model": "npc", "prompt": prompt, "max_tokens": 2, **extra})
            assert st == status and r["error"]["code"] == code, (extra, r)
        assert complete({"model": "guard"})["choices"][0]["text"] == want["guard"]
    finally:
        assert srv.stop() == 0


def test_server_lora_command_lines(llama, tmp_path):
    import subprocess
    from test_server import SERVER
    if not SERVER.exists():
        pytest.skip("fastllm-server not built")
    d, base, flm = llama
    _, folder = make_adapter(base, tmp_path / "a", seed=30, r=4, lora_alpha=4, target_modules=["q_proj"])
    good = convert_adapter(folder, base, tmp_path / "a.flm")
    for args, rc, words in ((["--lora", f"x={tmp_path / 'missing.flm'}"], 1, "missing.flm"),
                            (["--lora", f"x={flm}"], 1, "is a model"),
                            (["--lora", f"x={good}", "--lora", f"x={good}:2"], 1, "two adapters are named 'x'"),
                            (["--lora", f"=={good}"], 2, "needs NAME=PATH"),
                            (["--lora", f"base={good}"], 1, "the model itself"),
                            (["--lora", f"x={good}:inf"], 2, "finite")):
        p = subprocess.run([str(SERVER), str(flm), "--port", "0", *args], capture_output=True, text=True, timeout=60)
        assert p.returncode == rc and words in p.stderr, (args, p.returncode, p.stderr)
    # `fastllm serve --lora` and Ray replicas pass them on, with absolute paths
    from fastllm.ray_serve import RayServeOptions, server_args
    args = server_args(RayServeOptions(model=str(flm), lora=("g=a.flm:0.5", "b.flm")))
    assert args[-4:] == ["--lora", f"g={os.path.abspath('a.flm')}:0.5", "--lora", os.path.abspath("b.flm")]


def test_npc_demo_gives_two_characters_their_own_adapters(stories_flm, tmp_path):
    """bindings/examples/cpp_npc: the Guard and the Merchant speak through adapters of their own
    (made with peft on stories260K); the Merchant's saved state is restored under its adapter, so
    the game with the save equals the game without it."""
    import subprocess
    from conftest import BUILD, STORIES
    exe = BUILD / "npc_dialogue"
    if not exe.exists():
        pytest.skip("npc_dialogue not built")
    flags = []
    for i, name in enumerate(("Guard", "Merchant")):
        _, folder = make_adapter(STORIES / "hf", tmp_path / name, seed=40 + i, r=4, lora_alpha=8, target_modules=ALL)
        flags += ["--adapter", f"{name}={convert_adapter(folder, STORIES / 'hf', tmp_path / f'{name}.flm')}"]

    def game(*args):
        r = subprocess.run([str(exe), str(stories_flm), "6", "12", *map(str, args)], capture_output=True, text=True,
                           timeout=120)
        assert r.returncode == 0, r.stderr
        return r.stdout.splitlines()
    plain, voiced, voiced_no_save = game(), game(*flags), game("--no-save", *flags)
    assert [l for l in voiced if "speaks through" in l] == [
        f"[Guard speaks through the adapter {tmp_path / 'Guard.flm'}]",
        f"[Merchant speaks through the adapter {tmp_path / 'Merchant.flm'}]"]
    said = lambda lines, who: [l for l in lines if l.startswith(who + ":")]
    assert said(voiced, "Guard")[0] != said(plain, "Guard")[0]  # its first line, from the same seed and world
    assert any(l.startswith("[restored Merchant") for l in voiced)
    assert [l for l in voiced if not l.startswith("[")] == [l for l in voiced_no_save if not l.startswith("[")]
    for args, words in (([f"Wizard={tmp_path / 'Guard.flm'}"], "no NPC named Wizard"), ([], "needs NAME="),
                        ([f"Guard={tmp_path / 'Guard.flm'}", "--adapter", f"Guard={tmp_path / 'Merchant.flm'}"],
                         "Guard has an adapter already")):
        r = subprocess.run([str(exe), str(stories_flm), "--adapter", *args], capture_output=True, text=True, timeout=60)
        assert r.returncode == 2 and words in r.stderr, (args, r.stderr)
    r = subprocess.run([str(exe), str(stories_flm), "--adapter", f"Guard={stories_flm}"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 1 and "is a model" in r.stderr


def _llama_cpp_lora(converter, adapter_dir, base_dir, out, outtype="f32"):
    """llama.cpp's convert_lora_to_gguf.py: the LoRA GGUF llama.cpp users have."""
    import subprocess
    import sys
    script = converter.parent / "convert_lora_to_gguf.py"
    r = subprocess.run([sys.executable, str(script), str(adapter_dir), "--base", str(base_dir), "--outfile", str(out),
                        "--outtype", outtype], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return out


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_llama_cpp_lora_gguf(family, tmp_path, llama_cpp_converter):
    """A peft adapter written to GGUF by llama.cpp's convert_lora_to_gguf.py (llama: B's q / k rows
    in llama.cpp's RoPE order) converts to the adapter the peft folder gives: logits within 1e-4 of
    peft, with an HF folder or llama.cpp's GGUF of the base as --model_path; F16 and Q8_0 files
    within their rounding."""
    from test_embeddings import _llama_cpp_gguf
    base = make_model(tmp_path, family, num_key_value_heads=2)
    flm = convert(base, tmp_path / "base.flm")
    import gguf
    from converter.gguf_import import read_gguf
    pm, folder = make_adapter(base, tmp_path / "peft", seed=50, r=8, lora_alpha=24, target_modules=ALL)
    if family == "llama":
        gguf_base = _llama_cpp_gguf(llama_cpp_converter, base, tmp_path / "base.gguf")
    else:  # llama.cpp's converter does not know the random tokenizer's pre-tokenizer: the tests' own writer
        from gguf_models import write_gguf
        gguf_base = write_gguf(base, tmp_path / "base.gguf")

    def rounded_as(kind):
        """peft's logits with its A and B rounded as llama.cpp's file of that kind holds them (Q8_0
        for rows of whole 32-blocks, else F16), so that the check is of the conversion, not of the rounding."""
        ref = peft.PeftModel.from_pretrained(load_model(base), folder).eval()
        with torch.no_grad():
            for name, p in ref.named_parameters():
                if "lora_" in name and kind != "f32":
                    x = p.detach().numpy()
                    q = gguf.GGMLQuantizationType.Q8_0 if kind == "q8_0" and x.shape[-1] % 32 == 0 else None
                    x = gguf.quants.dequantize(gguf.quants.quantize(x, q), q) if q else x.astype(np.float16)
                    p.copy_(torch.from_numpy(np.asarray(x, np.float32).reshape(p.shape)))
        return reference_logits(ref, PROMPT)
    with fastllm.Model(flm, threads=2) as m:
        for outtype, base_path in (("f32", base), ("f32", gguf_base), ("f16", base), ("q8_0", base)):
            lora = tmp_path / f"lora-{outtype}.gguf"  # f32's written once for both bases
            if not lora.exists():
                _llama_cpp_lora(llama_cpp_converter, folder, base, lora, outtype)
            if outtype == "q8_0":
                g = read_gguf(lora)
                assert {g.type_name(n) for n in g.tensors if n.endswith("lora_a")} == {"Q8_0"}
            out = convert_adapter(lora, base_path, tmp_path / f"from-{outtype}-{base_path.name}.flm")
            with m.session(kv_type="f32", adapters={m.load_adapter(out): 1.0}) as s:
                got = s.eval(PROMPT, logits="all")
            want = rounded_as(outtype)
            assert rel(got, want) < 1e-4, (outtype, base_path.name, rel(got, want))
    # what llama.cpp's files may hold that a .flm adapter cannot: told, nothing written
    with pytest.raises(ConversionError, match="not a LoRA adapter GGUF"):
        convert_adapter(gguf_base, base, tmp_path / "x.flm")
    other = make_model(tmp_path, "qwen2" if family == "llama" else "llama", name="other", num_key_value_heads=2)
    with pytest.raises(ConversionError, match="is an adapter for a"):
        convert_adapter(tmp_path / "lora-f32.gguf", other, tmp_path / "x.flm")
    assert not (tmp_path / "x.flm").exists()
