"""The Vulkan backend (libfastllm/vulkan/, docs/gpu.md) on this machine's Vulkan device: in CI Mesa's
lavapipe (scripts/setup.sh installs it), which runs Vulkan compute on the CPU, 20-80x slower than
the CPU backend, so the models here are small. Its shaders are checked one by one against the
reference ops by test_kernels (ctest); here whole models: the CPU backend's logits for every weight
dtype and KV type, the suites of the core's behaviours through it, the device choice in the API,
and the failures (no loader, no device, out of device memory) as clear statuses."""
import json
import logging
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import BUILD, STORIES, convert

REPO = Path(__file__).resolve().parent.parent
PROMPT = "Once upon a time there was a little dog who liked to run in the park"


def _vulkan_devices():
    import fastllm
    return [d for d in fastllm.devices() if d["usable"]]


@pytest.fixture(scope="module")
def vulkan():
    """The usable Vulkan devices; the tests that need one say they did not run without."""
    found = _vulkan_devices()
    if not found:
        pytest.skip("no usable Vulkan device on this machine: not run (apt install mesa-vulkan-drivers)")
    return found


@pytest.fixture(scope="module", params=["f32", "f16", "bf16", "int8", "int4", "q4_k_m"])
def stories_dtype(request, tmp_path_factory):
    return convert(STORIES / "hf", tmp_path_factory.mktemp("vk") / f"stories-{request.param}.flm",
                   dtype=request.param), request.param


def _logits(path, device, kv_type="f32", prompt=PROMPT):
    import fastllm
    with fastllm.Model(path, threads=2, device=device) as m, m.session(kv_type=kv_type) as s:
        return s.eval(m.tokenize(prompt), logits="all"), m.info["backend"]


@pytest.mark.parametrize("kv_type", ["f32", "f16", "q8"])
def test_every_weight_dtype_and_kv_type_gives_the_cpu_logits(vulkan, stories_dtype, kv_type):
    path, dtype = stories_dtype
    cpu, cpu_backend = _logits(path, "cpu", kv_type)
    dev, dev_backend = _logits(path, "vulkan", kv_type)
    assert cpu_backend.startswith("cpu ") and dev_backend.startswith("vulkan "), (cpu_backend, dev_backend)
    err = np.abs(dev - cpu).max() / np.abs(cpu).max()
    # f32 sums in another order. An f16 / q8 KV row rounds what it stores, so an f32 difference
    # of one unit can become one unit of f16 (1e-3) and grow through the layers; quantized
    # weights multiply activations quantized to int8 as the CPU's kernels do, so a rounding flip
    # there moves a product by a step.
    bound = 1e-5 if kv_type == "f32" else 1e-3 if kv_type == "f16" else 2e-2
    if dtype not in ("f32", "f16", "bf16") and kv_type != "f32":
        bound = 5e-2
    assert err < bound, (dtype, kv_type, err)
    top2 = np.sort(cpu, axis=-1)[:, -2:]
    clear = top2[:, 1] - top2[:, 0] > 5e-2 * np.abs(cpu).max()
    assert clear.sum() > len(clear) // 2
    assert (dev.argmax(-1) == cpu.argmax(-1))[clear].all()


def test_stories260k_gives_the_golden_greedy_text(vulkan, stories_flm):
    import fastllm
    golden = json.loads((STORIES / "golden_greedy.json").read_text())
    with fastllm.Model(stories_flm, device="vulkan") as m, m.session() as s:
        text = s.generate(golden["prompt"], max_new_tokens=golden["greedy_max_new_tokens"], temperature=0.0)
    assert golden["prompt"] + text == golden["greedy_output_text"]


def test_greedy_tokens_and_states_cross_between_the_gpu_and_the_cpu(vulkan, stories_flm):
    """32 greedy tokens as on the CPU; a state saved on the GPU loads on the CPU and continues
    identically, and back."""
    import fastllm
    with fastllm.Model(stories_flm, threads=2) as cpu, fastllm.Model(stories_flm, device="vulkan") as gpu:
        with cpu.session() as a, gpu.session() as b:
            ta = a.generate(PROMPT, 32, temperature=0, ignore_eos=True)
            tb = b.generate(PROMPT, 32, temperature=0, ignore_eos=True)
            assert ta == tb
            state_gpu, state_cpu = b.save_state(), a.save_state()
            ca = a.generate([], 16, temperature=0, ignore_eos=True)
        with cpu.session() as c, gpu.session() as d:
            c.load_state(state_gpu)
            d.load_state(state_cpu)
            assert c.generate([], 16, temperature=0, ignore_eos=True) == ca
            assert d.generate([], 16, temperature=0, ignore_eos=True) == ca


def test_memory_is_the_devices(vulkan, stories_flm):
    import fastllm
    with fastllm.Model(stories_flm, device="vulkan") as gpu, fastllm.Model(stories_flm) as cpu:
        assert cpu.info["device_weight_bytes"] == 0
        # every weight once (stories260K's embedding is tied to its output)
        assert 0.9 * 260e3 * 4 < gpu.info["device_weight_bytes"] < 1.1 * 300e3 * 4
        with gpu.session() as s:
            s.eval(gpu.tokenize(PROMPT))
            m = s.memory()
            assert m["kv_bytes"] > 0 and m["compute_bytes"] > 0


def test_gpu_layers_split_the_model_between_the_cpu_and_the_device(vulkan, stories_flm):
    """n_gpu_layers: the last n layers and the head on the device, the rest on the CPU; the same
    logits and tokens as either alone, states crossing, the device holding only its layers."""
    import fastllm
    with fastllm.Model(stories_flm, threads=2) as m, m.session(kv_type="f32") as s:
        want = s.eval(m.tokenize(PROMPT), logits="all")
        cpu_state = s.save_state()
        want_text = s.generate([], 16, temperature=0, ignore_eos=True)
    sizes = {}
    for n, layers in ((0, None), (1, "4-4"), (2, "3-4"), (4, "1-4"), (-1, None), (99, None)):
        with fastllm.Model(stories_flm, threads=2, device="vulkan", gpu_layers=n) as m, m.session(kv_type="f32") as s:
            backend = m.info["backend"]
            if n == 0:
                assert backend.startswith("cpu ") and " + " not in backend
            elif layers is None:
                assert backend.startswith("vulkan ") and " + " not in backend
            else:
                assert backend.startswith("cpu ") and f"(layers 0-{int(layers[0]) - 1}) + vulkan " in backend, backend
                assert backend.endswith(f"(layers {layers})"), backend
            sizes[n] = m.info["device_weight_bytes"]
            got = s.eval(m.tokenize(PROMPT), logits="all")
            assert np.abs(got - want).max() / np.abs(want).max() < 1e-5, (n, backend)
            assert s.generate([], 16, temperature=0, ignore_eos=True) == want_text
            split_state = s.save_state()
            cont = s.generate([], 8, temperature=0, ignore_eos=True)
            s.load_state(cpu_state)  # a CPU session's state goes on here as there
            assert s.generate([], 16, temperature=0, ignore_eos=True) == want_text
        with fastllm.Model(stories_flm, threads=2) as m, m.session(kv_type="f32") as s:
            s.load_state(split_state)  # and this one's on the CPU
            assert s.generate([], 8, temperature=0, ignore_eos=True) == cont
    assert sizes[0] == 0 < sizes[1] < sizes[2] < sizes[4] < sizes[-1] == sizes[99]
    with pytest.raises(fastllm.FastLLMError) as e:
        fastllm.Model(stories_flm, device="vulkan", gpu_layers=-2)
    assert e.value.status_name == "FASTLLM_ERR_INVALID_ARGUMENT"
    with pytest.raises(fastllm.FastLLMError) as e:
        fastllm.Model(stories_flm, device="tpu")
    assert e.value.status_name == "FASTLLM_ERR_INVALID_ARGUMENT" and "device 'tpu': no such device" in str(e.value)


def test_auto_never_picks_a_cpu_device_and_says_why(vulkan, stories_flm, caplog):
    import fastllm
    with caplog.at_level(logging.INFO, logger="fastllm"), fastllm.Model(stories_flm, device="auto") as m:
        gpus = [d for d in vulkan if d["type"] != "cpu"]
        if gpus:
            assert m.info["backend"].startswith("vulkan ")
        else:
            assert m.info["backend"].startswith("cpu ")
            assert any("device auto: the CPU" in r.getMessage() and "is a CPU device" in r.getMessage()
                       for r in caplog.records)


def _in_subprocess(code, **env):
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, PYTHONPATH=str(REPO / "bindings" / "python"), **env))
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


TRY_DEVICES = """
import json, sys, fastllm
out = {}
for dev in ("vulkan", "auto"):
    try:
        with fastllm.Model(sys.argv[1] if len(sys.argv) > 1 else %r, device=dev) as m:
            out[dev] = m.info["backend"]
    except fastllm.FastLLMError as e:
        out[dev] = [e.status_name, str(e)]
out["devices"] = fastllm.devices()
print(json.dumps(out))
"""


def test_no_vulkan_loader_is_a_clear_error_and_auto_runs_on_the_cpu(stories_flm):
    out = _in_subprocess(TRY_DEVICES % str(stories_flm), FASTLLM_VULKAN_LOADER="/nonexistent/libvulkan.so.1")
    assert out["vulkan"][0] == "FASTLLM_ERR_UNSUPPORTED"
    assert "no Vulkan loader (/nonexistent/libvulkan.so.1)" in out["vulkan"][1]
    assert out["auto"].startswith("cpu ") and out["devices"] == []


def test_no_vulkan_driver_is_a_clear_error(stories_flm):
    out = _in_subprocess(TRY_DEVICES % str(stories_flm), VK_ICD_FILENAMES="/nonexistent/icd.json",
                         VK_DRIVER_FILES="/nonexistent/icd.json")
    assert out["vulkan"][0] == "FASTLLM_ERR_UNSUPPORTED" and out["vulkan"][1].startswith("vulkan: "), out
    assert out["auto"].startswith("cpu ")


LOGITS = """
import json, fastllm
with fastllm.Model(%r, device="vulkan") as m, m.session(kv_type="f16") as s:
    print(json.dumps(s.eval(m.tokenize(%r), logits="all").tolist()))
"""


def test_staged_copies_give_the_mapped_results(vulkan, stories_flm):
    """FASTLLM_VULKAN_STAGING=1: every upload and download through the staging buffer, as on a
    discrete GPU whose memory the host cannot map."""
    mapped = np.array(_in_subprocess(LOGITS % (str(stories_flm), PROMPT)))
    staged = np.array(_in_subprocess(LOGITS % (str(stories_flm), PROMPT), FASTLLM_VULKAN_STAGING="1"))
    assert mapped.shape == staged.shape and (mapped == staged).all()


OUT_OF_MEMORY = """
import json, fastllm
out = {}
try:
    fastllm.Model(%r, device="vulkan")
    out["load"] = "loaded"
except fastllm.FastLLMError as e:
    out["load"] = [e.status_name, str(e)]
print(json.dumps(out))
"""

KV_OUT_OF_MEMORY = """
import json, fastllm
out = {}
with fastllm.Model(%r, device="vulkan") as m, m.session(kv_type="f32") as s:
    ids = m.tokenize(%r)
    s.eval(ids)
    try:
        s.eval(ids * 18)  # more KV blocks than the device has room for
        out["long"] = "fit"
    except fastllm.FastLLMError as e:
        out["long"] = [e.status_name, str(e)]
    out["kept"] = len(s.tokens)
    out["next"] = s.generate([], 4, temperature=0, ignore_eos=True)  # the session goes on
with fastllm.Model(%r) as cpu, cpu.session(kv_type="f32") as c:
    c.eval(ids)
    out["cpu_next"] = c.generate([], 4, temperature=0, ignore_eos=True)
print(json.dumps(out))
"""


def test_out_of_device_memory_at_load_and_while_the_cache_grows(vulkan, stories_flm):
    out = _in_subprocess(OUT_OF_MEMORY % str(stories_flm), FASTLLM_VULKAN_MAX_MEMORY="100000")
    assert out["load"][0] == "FASTLLM_ERR_OUT_OF_MEMORY" and "out of device memory for" in out["load"][1], out
    assert vulkan[0]["name"] in out["load"][1]  # names the device
    # stories260K: 1.04 MB of weights, 1.13 MB of working memory; a KV block (32 positions,
    # 5 layers, f32) 40 KiB
    out = _in_subprocess(KV_OUT_OF_MEMORY % (str(stories_flm), PROMPT, str(stories_flm)), FASTLLM_VULKAN_MAX_MEMORY="2500000")
    assert out["long"][0] == "FASTLLM_ERR_OUT_OF_MEMORY", out
    assert out["next"] == out["cpu_next"], out


# The suites that run through the Vulkan backend too, on their tiny models; conftest.py deselects
# their SmolLM2 tests there (lavapipe takes seconds a token), except the demo's question below.
# lavapipe spends about 0.3 ms a dispatch, 14 ms a stories260K token: the session features run
# through a few tests each (the reference device runs their whole suites through the seam).
SUITES = [
    # the families' computations (their file, tool and server tests are the CPU run's); Qwen3 at
    # every quantized dtype
    ("tests/test_families.py", "(logits or greedy or step_together or quantized) and not server and (not quantized or qwen3)"),
    ("tests/test_families_glm.py", None),
    ("tests/test_gemma.py", None),
    ("tests/test_session_share.py", "not damaged"),  # the parser of damaged states is the CPU's
    ("tests/test_kv_cache.py", None),
    ("tests/test_sliding_window.py", "not context_shift"),  # shifts: test_session_share's (52 s here)
    ("tests/test_batched_generation.py", None),
    ("tests/test_batched_admission.py", "cancel_from_another_thread"),
    ("tests/test_speculative.py", "sessions_stepping_together"),
    # split: the last layer and the head on the device, the rest on the CPU (FASTLLM_GPU_LAYERS);
    # Gemma 3's windowed layers keep their KV blocks on both
    ("tests/test_session_share.py:split", "fork or round_trip or re_rotates or other_kv_types"),
    ("tests/test_sliding_window.py:split", "long_sequence or saved_state"),
]


@pytest.mark.parametrize("suite,select", SUITES, ids=[Path(s).stem + s.partition(":")[1].replace(":", "-split") for s, _ in SUITES])
def test_the_suite_passes_through_vulkan(vulkan, suite, select):
    path, _, split = suite.partition(":")
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", path]
    if select:
        cmd += ["-k", select]
    env = dict(os.environ, FASTLLM_BACKEND="vulkan", **({"FASTLLM_GPU_LAYERS": "1"} if split else {}))
    r = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    tail = r.stdout[-3000:] + r.stderr[-2000:]
    assert r.returncode == 0, tail
    summary = re.search(r"(\d+) passed", r.stdout)
    assert summary and int(summary.group(1)) > 0, tail
    assert " failed" not in r.stdout.splitlines()[-1], tail


def test_smollm_answers_the_demos_question(vulkan, smollm_flm):
    import fastllm
    with fastllm.Model(smollm_flm, device="vulkan") as m:
        reply = m.chat([{"role": "user", "content": "What is the capital of France?"}], max_new_tokens=6,
                       temperature=0)
    assert "Paris" in reply, reply


PROFILE = """
import json, logging, sys, fastllm
lines = []
class Keep(logging.Handler):
    def emit(self, record):
        lines.append(record.getMessage())
logging.getLogger("fastllm").addHandler(Keep())
logging.getLogger("fastllm").setLevel(logging.INFO)
with fastllm.Model(%r, device="vulkan") as m:
    layers = m.info["num_layers"]
    with m.session() as s:
        tokens = m.tokenize("Once upon a time")
        s.eval(tokens)  # one pass
        for t in tokens[:3]:  # and three more
            s.eval([t])
print(json.dumps({"layers": layers, "lines": [l for l in lines if l.startswith("vulkan profile")]}))
"""


def _profile(stories_flm, **env):
    out = _in_subprocess(PROFILE % str(stories_flm), **env)
    rows = {}
    for line in out["lines"][1:]:
        m = re.match(r"vulkan profile: (\S+) +(\S*) +(\d+) dispatches +([\d.]+) ms +([\d.]+) us each +([\d.]+)%", line)
        assert m, line
        rows[(m.group(1), m.group(2))] = (int(m.group(3)), float(m.group(4)))
    return out, rows


def test_profile_gives_each_shaders_device_time(vulkan, stories_flm):
    """FASTLLM_VULKAN_PROFILE=1: each shader's dispatches and their device time (timestamps around
    every dispatch), logged when the model is freed; nothing without it."""
    out, rows = _profile(stories_flm, FASTLLM_VULKAN_PROFILE="1")
    passes, layers = 4, out["layers"]
    head = re.match(r"vulkan profile \((.+)\): (\d+) dispatches, ([\d.]+) ms of device time", out["lines"][0])
    assert head, out["lines"]
    assert rows[("attention", "")][0] == layers * passes  # one a layer a pass
    assert rows[("embed", "f32")][0] == passes
    # a layer's matmuls (q/k/v, o, up/gate, down): the prompt's rows on matmul_rows, a token's on
    # matmul, as is the head (the prompt's last row only)
    per_pass = rows[("matmul_rows", "f32")][0]
    assert per_pass >= 4 * layers and per_pass % layers == 0
    assert rows[("matmul", "f32")][0] == (passes - 1) * (per_pass + 1) + 1
    assert {"norm", "qkv_rope", "kv_store", "glu"} <= {name for name, _ in rows}
    assert sum(n for n, _ in rows.values()) == int(head.group(2))
    assert all(ms > 0 for _, ms in rows.values())
    assert sum(ms for _, ms in rows.values()) == pytest.approx(float(head.group(3)), rel=1e-3, abs=0.01)
    assert _profile(stories_flm)[0]["lines"] == []


def test_quantized_matmuls_run_on_matmul_quant(vulkan, tmp_path):
    """A quantized weight's matmuls, a prompt's rows and a token's alike, go to matmul_quant.comp,
    the shader of the tile layout; none to the float weights' shaders."""
    path = convert(STORIES / "hf", tmp_path / "stories-int8.flm", dtype="int8")
    out, rows = _profile(path, FASTLLM_VULKAN_PROFILE="1")
    passes, layers = 4, out["layers"]
    n = rows[("matmul_quant", "q8")][0]  # stories260K's ffn rows (172) are no multiple of 32: f16
    assert n >= 3 * layers * passes and n % (layers * passes) == 0, rows
    assert not [k for k in rows if k[0] in ("matmul", "matmul_rows") and k[1] == "q8"], rows


def test_the_server_runs_on_the_device(vulkan, stories_flm):
    """fastllm-server --device vulkan answers as the CPU does (greedy)."""
    import urllib.request
    texts = {}
    for device in ("cpu", "vulkan"):
        p = subprocess.Popen([str(BUILD / "fastllm-server"), str(stories_flm), "--port", "0", "--device", device],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            port = None
            for line in p.stdout:
                m = re.search(r"on http://\S+?:(\d+) \(", line)
                if m:
                    port = int(m.group(1))
                    break
            assert port, "the server did not start"
            body = json.dumps({"prompt": PROMPT, "max_tokens": 24, "temperature": 0}).encode()
            req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", body,
                                         {"Content-Type": "application/json"})
            texts[device] = json.loads(urllib.request.urlopen(req, timeout=120).read())["choices"][0]["text"]
        finally:
            p.terminate()
            p.wait(timeout=30)
    assert texts["vulkan"] == texts["cpu"] and texts["cpu"]


def test_a_game_hands_its_own_device_over(vulkan, stories_flm):
    """fastllm_vulkan_set_device: a program that made its own instance and device on the Vulkan
    device gives them to fastllm, which runs there (the same text as the CPU) and refuses a second
    handover once in use; the program's device stays usable (vulkan_host_device.cpp)."""
    binary = BUILD / "vulkan_host_device"
    assert binary.exists(), "built with the Vulkan backend (CMake finds the Vulkan loader library)"
    r = subprocess.run([str(binary), str(stories_flm), "Once upon a time", "24"], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    out = dict(line.split(": ", 1) for line in r.stdout.splitlines() if ": " in line)
    assert out["backend"].startswith("vulkan ") and "(the application's)" in out["backend"], out
    assert out["gpu"] == out["cpu"] and len(out["gpu"]) > 20, out
    assert out["again"].startswith("FASTLLM_ERR_INVALID_ARGUMENT") and "is in use already" in out["again"], out
