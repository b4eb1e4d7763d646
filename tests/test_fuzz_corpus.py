"""The fuzz targets (tests/fuzz/) over their committed seeds and every crash input found so far
(tests/fuzz/regressions/TARGET/), through the *_replay programs of the normal build; under the
sanitizer build (scripts/test_sanitizers.sh) with ASan + UBSan. Fuzzing itself: scripts/fuzz.sh."""
import os
import subprocess
import sys

import pytest

from conftest import BUILD, REPO

FUZZ = REPO / "tests" / "fuzz"
TARGETS = ["flm", "tokenizer", "chat_template", "server_request", "grammar"]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    out = tmp_path_factory.mktemp("fuzz-models")
    subprocess.run([sys.executable, str(FUZZ / "make_models.py"), str(out)], check=True, capture_output=True)
    return out


@pytest.mark.parametrize("target", TARGETS)
def test_replay(target, models):
    program = BUILD / "fuzz" / f"fuzz_{target}_replay"
    if target == "server_request" and not program.exists():
        pytest.skip("fastllm-server's JSON library is not installed (nlohmann-json3-dev)")
    folders = [d for d in (FUZZ / "corpus" / target, FUZZ / "regressions" / target) if d.is_dir()]
    n = sum(len([f for f in d.iterdir() if f.is_file()]) for d in folders)
    assert n >= 3, f"the {target} corpus is missing"
    env = dict(os.environ, FASTLLM_FUZZ_SPM=str(models / "spm.flm"), FASTLLM_FUZZ_BPE=str(models / "bpe.flm"))
    r = subprocess.run([str(program), *map(str, folders)], capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert r.stdout.strip().endswith(f"{n} inputs")
