"""The converter's readers on damaged files (docs/reliability.md): the GGUF importer and the .flm
reader, driven by hypothesis over a small valid file of each — truncated, bytes overwritten, runs
of bytes inserted or deleted. A damaged GGUF is a ConversionError (the converter's one error type,
printed as one line), a damaged .flm a ValueError naming the file; anything else (IndexError,
struct.error, numpy errors, OverflowError, MemoryError ...) is a finding."""
import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import convert
from converter.errors import ConversionError
from converter.flm_reader import read_flm
from gguf_models import write_gguf
from hf_models import make_model

MICRO = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
             num_key_value_heads=1)
# per test in the suite; FASTLLM_PYFUZZ_EXAMPLES=5000 for a longer campaign (docs/reliability.md)
EXAMPLES = int(os.environ.get("FASTLLM_PYFUZZ_EXAMPLES", 150))


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("pyfuzz")
    hf = make_model(tmp, "qwen2", **MICRO)
    gguf = write_gguf(hf, tmp / "m.gguf")
    flm = convert(hf, tmp / "m.flm", dtype="int8")
    return tmp, gguf.read_bytes(), flm.read_bytes()


def damage():
    """(kind, position fraction, bytes) describing one damage."""
    return st.tuples(st.sampled_from(["truncate", "overwrite", "insert", "delete"]),
                     st.floats(0, 1, allow_nan=False), st.binary(min_size=1, max_size=16))


def apply(data: bytes, changes) -> bytes:
    for kind, where, blob in changes:
        i = int(where * (len(data) - 1)) if data else 0
        if kind == "truncate":
            data = data[:i]
        elif kind == "overwrite":
            data = data[:i] + blob + data[i + len(blob):]
        elif kind == "insert":
            data = data[:i] + blob + data[i:]
        else:
            data = data[:i] + data[i + len(blob):]
    return data


SETTINGS = settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


@SETTINGS
@given(changes=st.lists(damage(), min_size=1, max_size=3))
def test_damaged_gguf_is_a_conversion_error(files, changes):
    tmp, gguf, _ = files
    bad = tmp / "bad.gguf"
    bad.write_bytes(apply(gguf, changes))
    out = tmp / "bad-out.flm"
    try:
        convert(bad, out)
    except ConversionError as e:
        assert str(e)  # a message, naming the problem
    finally:
        out.unlink(missing_ok=True)


@SETTINGS
@given(changes=st.lists(damage(), min_size=1, max_size=3))
def test_damaged_flm_is_a_value_error(files, changes):
    tmp, _, flm = files
    bad = tmp / "bad.flm"
    bad.write_bytes(apply(flm, changes))
    try:
        meta, tensors = read_flm(bad)
        for t in tensors.values():  # the views must lie inside the file
            bytes(memoryview(t.data)[:1])
    except ValueError as e:
        assert "bad.flm" in str(e)
