"""Bad input gets a status code and a message naming the problem; the process survives."""
import ctypes
import random
import struct

import pytest

import fastllm
from fastllm import _lib as raw
from converter.flm_reader import load_flm

lib = raw.lib


def load_error(path) -> fastllm.FastLLMError:
    with pytest.raises(fastllm.FastLLMError) as e:
        fastllm.Model(path)
    return e.value


def tensor_field_pos(data: bytes, name: str, field: str) -> int:
    """File position of a tensor-table field ('offset' or 'dims') of the named tensor."""
    enc = struct.pack("<Q", len(name)) + name.encode()
    pos = data.index(enc) + len(enc)
    n_dims = struct.unpack_from("<I", data, pos + 4)[0]
    return pos + 8 if field == "dims" else pos + 8 + 8 * n_dims


@pytest.fixture
def good(stories_flm):
    return stories_flm.read_bytes()


def write(tmp_path, data, name="bad.flm"):
    p = tmp_path / name
    p.write_bytes(data)
    return p


def test_missing_file(tmp_path):
    e = load_error(tmp_path / "nope.flm")
    assert e.status == raw.ERR_IO and "nope.flm" in str(e)


def test_empty_file(tmp_path):
    assert load_error(write(tmp_path, b"")).status == raw.ERR_BAD_FORMAT


def test_wrong_magic(tmp_path, good):
    e = load_error(write(tmp_path, b"GGUF\x03\x00\x00\x00" + good[8:]))
    assert e.status == raw.ERR_BAD_FORMAT and "bad magic" in str(e)


def test_wrong_version(tmp_path, good):
    e = load_error(write(tmp_path, good[:8] + struct.pack("<I", 99) + good[12:]))
    assert e.status == raw.ERR_BAD_FORMAT and "version 99" in str(e)


def test_truncated_everywhere(tmp_path, good):
    """Cuts in the header, the metadata, the tensor table and the data: all refused cleanly."""
    data_offset = load_flm_offset(good)
    cuts = [4, 12, 30, 39, 41, 100, 1000, 5000, data_offset - 1, data_offset + 10, len(good) // 2, len(good) - 1]
    for cut in cuts:
        e = load_error(write(tmp_path, good[:cut]))
        assert e.status == raw.ERR_BAD_FORMAT, (cut, str(e))
        assert "truncated" in str(e) or "past the end" in str(e) or "data offset" in str(e), (cut, str(e))


def load_flm_offset(data: bytes) -> int:
    return struct.unpack_from("<Q", data, 32)[0]


def test_tensor_offset_past_the_end(tmp_path, good):
    pos = tensor_field_pos(good, "blk.2.ffn_down.weight", "offset")
    bad = good[:pos] + struct.pack("<Q", 1 << 40) + good[pos + 8:]
    e = load_error(write(tmp_path, bad))
    assert e.status == raw.ERR_BAD_FORMAT
    assert "blk.2.ffn_down.weight" in str(e) and "past the end" in str(e)


def test_tensor_shape_not_matching_config(tmp_path, good):
    # Swap the two dims of a matrix: sizes still agree, the shape contradicts the config.
    pos = tensor_field_pos(good, "blk.0.attn_output.weight", "dims")
    d0, d1 = struct.unpack_from("<QQ", good, pos)
    bad = good[:pos] + struct.pack("<QQ", d1 + 1, d0) + good[pos + 16:]
    e = load_error(write(tmp_path, bad))
    assert e.status == raw.ERR_BAD_FORMAT and "blk.0.attn_output.weight" in str(e)


def test_implausible_count(tmp_path, good):
    bad = good[:16] + struct.pack("<Q", 1 << 60) + good[24:]
    e = load_error(write(tmp_path, bad))
    assert e.status == raw.ERR_BAD_FORMAT and "implausible" in str(e)


def test_random_corruption_never_crashes(tmp_path, good):
    """Flip bytes in the header and tables at random: each file loads or is refused, no crash."""
    rng = random.Random(0)
    end = load_flm_offset(good)
    refused = 0
    for i in range(300):
        data = bytearray(good)
        for _ in range(rng.randint(1, 4)):
            data[rng.randrange(end)] = rng.randrange(256)
        try:
            with fastllm.Model(write(tmp_path, bytes(data), f"c{i}.flm")) as m:
                m.generate([1, 20, 30], 3, temperature=0.0)
        except fastllm.FastLLMError as e:
            assert e.status in (raw.ERR_BAD_FORMAT, raw.ERR_UNSUPPORTED), str(e)
            refused += 1
    assert refused > 50


def test_foreign_architecture(tmp_path, stories_flm):
    """A valid file of an architecture we don't run is 'unsupported', naming it."""
    data = stories_flm.read_bytes()
    bad = data.replace(struct.pack("<Q", 5) + b"llama", struct.pack("<Q", 5) + b"gpt2x", 1)
    e = load_error(write(tmp_path, bad))
    assert e.status == raw.ERR_UNSUPPORTED and "gpt2x" in str(e)


def test_null_handles():
    out = ctypes.c_void_p()
    n = ctypes.c_size_t()
    assert lib.fastllm_model_load(None, None, ctypes.byref(out)) == raw.ERR_INVALID_ARGUMENT
    assert b"path" in lib.fastllm_last_error()
    assert lib.fastllm_model_load(b"x.flm", None, None) == raw.ERR_INVALID_ARGUMENT
    assert lib.fastllm_session_create(None, None, ctypes.byref(out)) == raw.ERR_INVALID_ARGUMENT
    assert lib.fastllm_tokenize(None, b"hi", 2, 1, None, 0, ctypes.byref(n)) == raw.ERR_INVALID_ARGUMENT
    assert lib.fastllm_detokenize(None, None, 0, None, 0, ctypes.byref(n)) == raw.ERR_INVALID_ARGUMENT
    assert lib.fastllm_session_eval(None, None, 0, raw.LOGITS_NONE, None) == raw.ERR_INVALID_ARGUMENT
    assert lib.fastllm_session_generate(None, None, 0, None, raw.StreamCallback(), None, None) == \
        raw.ERR_INVALID_ARGUMENT
    assert lib.fastllm_session_reset(None) == raw.ERR_INVALID_ARGUMENT
    assert lib.fastllm_model_get_info(None, None) == raw.ERR_INVALID_ARGUMENT
    assert lib.fastllm_model_chat_template(None) is None
    # the calls of many-session games
    info = raw.SessionMemoryInfo()
    null_cb = raw.StreamCallback()
    assert lib.fastllm_session_fork(None, 0, None, ctypes.byref(out)) == raw.ERR_INVALID_ARGUMENT
    assert lib.fastllm_session_memory(None, ctypes.byref(info)) == raw.ERR_INVALID_ARGUMENT
    assert lib.fastllm_session_save_state(None, None, 0, ctypes.byref(n)) == raw.ERR_INVALID_ARGUMENT
    assert lib.fastllm_session_load_state(None, b"x", 1, null_cb, None) == raw.ERR_INVALID_ARGUMENT
    assert lib.fastllm_session_save_state_file(None, b"/tmp/x") == raw.ERR_INVALID_ARGUMENT
    assert lib.fastllm_session_load_state_file(None, b"/tmp/x", null_cb, None) == raw.ERR_INVALID_ARGUMENT
    assert lib.fastllm_session_cancel(None) == raw.ERR_INVALID_ARGUMENT
    lib.fastllm_model_free(None)
    lib.fastllm_session_free(None)


def test_tokens_out_of_range(stories_model):
    with stories_model.session() as s:
        for bad in ([-1], [512], [1, 2, 100000]):
            with pytest.raises(fastllm.FastLLMError) as e:
                s.eval(bad)
            assert e.value.status == raw.ERR_TOKEN_OUT_OF_RANGE
            with pytest.raises(fastllm.FastLLMError):
                s.generate(bad, 3)
        assert s.n_tokens == 0  # nothing was appended
    with pytest.raises(fastllm.FastLLMError) as e:
        stories_model.detokenize([5, 9999])
    assert e.value.status == raw.ERR_TOKEN_OUT_OF_RANGE and "9999" in str(e.value)


def test_prompt_longer_than_context(stories_model):
    with stories_model.session(n_ctx=16) as s:
        with pytest.raises(fastllm.FastLLMError) as e:
            s.eval(list(range(3, 20)))
        assert e.value.status == raw.ERR_CONTEXT_FULL and "16" in str(e.value)
        assert s.n_tokens == 0
        assert s.eval(list(range(3, 19))).shape == (512,)  # exactly full still works
    with pytest.raises(fastllm.FastLLMError) as e:
        stories_model.generate("word " * 600, 5)
    assert e.value.status == raw.ERR_CONTEXT_FULL


def test_buffers_too_small(stories_model):
    h = stories_model.handle
    n = ctypes.c_size_t()
    buf = (ctypes.c_int32 * 2)()
    text = b"Once upon a time"
    assert lib.fastllm_tokenize(h, text, len(text), 1, buf, 2, ctypes.byref(n)) == raw.ERR_BUFFER_TOO_SMALL
    assert n.value == 5 and b"5 needed" in lib.fastllm_last_error()
    ids = (ctypes.c_int32 * 5)(1, 403, 407, 261, 378)
    small = ctypes.create_string_buffer(4)
    assert lib.fastllm_detokenize(h, ids, 5, small, 4, ctypes.byref(n)) == raw.ERR_BUFFER_TOO_SMALL
    assert n.value == len("Once upon a time")
    exact = ctypes.create_string_buffer(n.value + 1)
    assert lib.fastllm_detokenize(h, ids, 5, exact, n.value + 1, ctypes.byref(n)) == raw.OK
    assert exact.value == b"Once upon a time"


def test_bad_parameters(stories_model):
    with pytest.raises(fastllm.FastLLMError) as e:
        stories_model.session(n_ctx=100000)
    assert e.value.status == raw.ERR_INVALID_ARGUMENT and "context length" in str(e.value)
    with pytest.raises(fastllm.FastLLMError):
        stories_model.session(n_ctx=-1)
    with stories_model.session() as s:
        with pytest.raises(fastllm.FastLLMError):
            s.generate("Hi", -1)
        with pytest.raises(fastllm.FastLLMError):
            s.generate([], 5)  # nothing to continue from
        assert lib.fastllm_session_eval(s.handle, (ctypes.c_int32 * 1)(1), 1, 7, None) == raw.ERR_INVALID_ARGUMENT
        with pytest.raises(fastllm.FastLLMError):
            s.eval([])
    with pytest.raises(fastllm.FastLLMError):
        fastllm.Model(__file__, threads=-3)


# -- loading from memory ------------------------------------------------------------------------

def test_load_from_memory_equals_the_file(stories_flm, good):
    with fastllm.Model(stories_flm, threads=1) as a:
        buf = bytearray(good)
        with fastllm.Model.from_bytes(buf, threads=1) as b:
            buf[:] = b"\0" * len(buf)  # the library took a copy: the caller's buffer may change
            ids = a.tokenize("Once upon a time", add_bos=True)
            assert b.tokenize("Once upon a time", add_bos=True) == ids
            assert (a.forward(ids) == b.forward(ids)).all()
            assert b.generate("Once", max_new_tokens=8, temperature=0) == a.generate("Once", max_new_tokens=8,
                                                                                     temperature=0)


def test_load_from_memory_refuses_what_the_file_loader_refuses(good):
    for data, words in [(b"", "empty"), (good[:30], "truncated"), (b"GGUF" + good[4:], "bad magic"),
                        (good[:len(good) // 2], "past the end")]:
        with pytest.raises(fastllm.FastLLMError) as e:
            fastllm.Model.from_bytes(data)
        assert e.value.status == raw.ERR_BAD_FORMAT and words in str(e.value) and "<memory>" in str(e.value)
    handle = ctypes.c_void_p(1)
    assert lib.fastllm_model_load_from_memory(None, 10, None, ctypes.byref(handle)) == raw.ERR_INVALID_ARGUMENT
    assert handle.value is None and "data" in lib.fastllm_last_error().decode()


def test_session_state_null_arguments(stories_model):
    with stories_model.session() as s:
        n = ctypes.c_size_t()
        info = raw.SessionMemoryInfo()
        assert lib.fastllm_session_memory(s.handle, None) == raw.ERR_INVALID_ARGUMENT
        assert lib.fastllm_session_save_state(s.handle, None, 0, None) == raw.ERR_INVALID_ARGUMENT
        assert lib.fastllm_session_load_state(s.handle, None, 10, raw.StreamCallback(), None) == raw.ERR_INVALID_ARGUMENT
        assert lib.fastllm_session_save_state_file(s.handle, None) == raw.ERR_INVALID_ARGUMENT
        assert lib.fastllm_session_save_state_file(s.handle, b"/nonexistent-dir/x.state") == raw.ERR_IO
        assert lib.fastllm_session_fork(s.handle, 0, None, None) == raw.ERR_INVALID_ARGUMENT
        assert lib.fastllm_session_memory(s.handle, ctypes.byref(info)) == raw.OK
        assert lib.fastllm_session_save_state(s.handle, None, 0, ctypes.byref(n)) == raw.ERR_BUFFER_TOO_SMALL
        assert n.value > 0
