"""The device seam (libfastllm/arch/backend.h) through its second backend, the reference device
(libfastllm/refdev/, FASTLLM_BACKEND=refdev): its weights, working memory and KV blocks are its
own memory at addresses the host cannot dereference, computed with the reference ops. The same
model gives the CPU backend's logits through it, and the suites of the core's behaviours —
family parity with transformers, fork, save/load, context shift, sliding windows, batching,
speculative decoding, batched admission, cancel — pass through it as they pass through the CPU.
A Decoder, Session or saved state that touched model memory directly would fail here: the
device's addresses are no host memory, and an op given a host address errors."""
import logging
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import STORIES, convert

REPO = Path(__file__).resolve().parent.parent

PROMPT = "Once upon a time there was a little dog who liked to run in the park"


@pytest.fixture(scope="module", params=["f32", "f16", "int8", "int4"])
def stories_dtype_flm(request, tmp_path_factory):
    return convert(STORIES / "hf", tmp_path_factory.mktemp("seam") / f"stories-{request.param}.flm",
                   dtype=request.param), request.param


def _logits(path, backend, monkeypatch, caplog):
    import fastllm
    monkeypatch.setenv("FASTLLM_BACKEND", backend)
    with caplog.at_level(logging.INFO, logger="fastllm"), fastllm.Model(path, threads=2) as m:
        with m.session(kv_type="f32") as s:
            logits = s.eval(m.tokenize(PROMPT), logits="all")
    sessions = [r.getMessage() for r in caplog.records if r.getMessage().startswith("session:")]
    caplog.clear()
    return logits, sessions


def test_the_reference_device_gives_the_cpu_backends_logits(stories_dtype_flm, monkeypatch, caplog):
    path, dtype = stories_dtype_flm
    cpu, cpu_log = _logits(path, "cpu", monkeypatch, caplog)
    dev, dev_log = _logits(path, "refdev", monkeypatch, caplog)
    assert cpu_log and all(" cpu " in line for line in cpu_log), cpu_log
    assert dev_log and all("refdev (reference device)" in line for line in dev_log), dev_log
    # The reference ops sum in double precision (the bound the family tests hold fastllm to against
    # transformers), and quantize the activations as the kernels do.
    err = np.abs(dev - cpu).max() / np.abs(cpu).max()
    assert err < (1e-4 if dtype in ("f32", "f16") else 2e-3), (dtype, err)
    # The same next token wherever the CPU's choice is not a near tie.
    top2 = np.sort(cpu, axis=-1)[:, -2:]
    clear = top2[:, 1] - top2[:, 0] > 1e-3 * np.abs(cpu).max()
    assert clear.sum() > len(clear) // 2
    assert (dev.argmax(-1) == cpu.argmax(-1))[clear].all()


def test_an_unknown_backend_is_a_clear_error_at_load(stories_flm, monkeypatch):
    import fastllm
    monkeypatch.setenv("FASTLLM_BACKEND", "warp-drive")
    with pytest.raises(fastllm.FastLLMError) as e:
        fastllm.Model(stories_flm)
    assert "FASTLLM_BACKEND=warp-drive: no such backend (cpu, refdev" in str(e.value)
    assert e.value.status_name == "FASTLLM_ERR_INVALID_ARGUMENT"


# The suites that run through the reference device too, on their tiny models (stories260K, the
# random-weight models of test_parity_hf); conftest.py deselects their SmolLM2 tests there (135M
# parameters take minutes a token in double-precision loops), which the CPU run covers. The
# families, their sliding windows, KV types, forks, saved states and batched steps go through a
# device in tests/test_vulkan.py (on lavapipe, which CI installs) and are left out here to keep the
# suite's time (they took 150 s here on top of those); so are test_quantization and test_kquants
# (their larger random models take minutes through the reference ops) and the speculative
# chi-square test (a sampler statistic, 48 s here).
SUITES = [
    ("tests/test_parity_hf.py", None),
    ("tests/test_stories260k.py", None),
    ("tests/test_api.py", None),
    ("tests/test_bad_input.py", None),
    ("tests/test_batched_admission.py", None),
    ("tests/test_speculative.py", "not same_distribution"),
]


@pytest.mark.parametrize("suite,select", SUITES, ids=[Path(s).stem for s, _ in SUITES])
def test_the_suite_passes_through_the_reference_device(suite, select):
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", suite]
    if select:
        cmd += ["-k", select]
    env = dict(os.environ, FASTLLM_BACKEND="refdev")
    r = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    tail = r.stdout[-3000:] + r.stderr[-2000:]
    assert r.returncode == 0, tail
    summary = re.search(r"(\d+) passed", r.stdout)
    assert summary and int(summary.group(1)) > 0, tail
    assert " failed" not in r.stdout.splitlines()[-1], tail
