"""Reads a SentencePiece `tokenizer.model` (a serialized sentencepiece ModelProto).

The sentencepiece package's `sentencepiece_model_pb2.ModelProto` needs the protobuf package,
which is not a dependency of this project, and SentencePieceProcessor does not expose the
normalizer and trainer options. So this module decodes the protobuf wire format itself; it only
needs the handful of fields below (field numbers from sentencepiece_model.proto):

    ModelProto:      1 pieces (repeated SentencePiece), 2 trainer_spec, 3 normalizer_spec
    SentencePiece:   1 piece (string), 2 score (float), 3 type (enum, default NORMAL=1)
    TrainerSpec:     3 model_type (enum: 1 UNIGRAM (default), 2 BPE, 3 WORD, 4 CHAR),
                     35 byte_fallback (bool, default false),
                     40 unk_id (default 0), 41 bos_id (1), 42 eos_id (2), 43 pad_id (-1)
    NormalizerSpec:  3 add_dummy_prefix (bool, default true),
                     4 remove_extra_whitespaces (bool, default true)

Unknown fields are skipped, as protobuf itself does.
"""

from __future__ import annotations

import re

import struct
from dataclasses import dataclass, field
from pathlib import Path

from .errors import ConversionError

# SentencePiece piece types (also the values of `tokenizer.token_types`)
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
MODEL_TYPES = {1: "unigram", 2: "bpe", 3: "word", 4: "char"}


class _WireError(ValueError):
    pass


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    result = 0
    shift = 0
    while True:
        if pos >= len(buf):
            raise _WireError("truncated varint")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise _WireError("varint longer than 10 bytes")


def _fields(buf: bytes):
    """Yields (field_number, wire_type, value) for each field of a message: value is an int for
    varint (0), bytes for length-delimited (2), the raw 4 / 8 bytes for fixed32 (5) / fixed64 (1)."""
    pos = 0
    n = len(buf)
    while pos < n:
        key, pos = _varint(buf, pos)
        number, wire = key >> 3, key & 7
        if number == 0:
            raise _WireError("field number 0")
        if wire == 0:
            value, pos = _varint(buf, pos)
        elif wire == 1:
            value, pos = buf[pos:pos + 8], pos + 8
        elif wire == 2:
            length, pos = _varint(buf, pos)
            value, pos = buf[pos:pos + length], pos + length
        elif wire == 5:
            value, pos = buf[pos:pos + 4], pos + 4
        else:  # groups (3, 4) are not used by sentencepiece
            raise _WireError(f"unsupported wire type {wire}")
        if pos > n:
            raise _WireError("truncated field")
        yield number, wire, value


def _int32(v: int) -> int:
    """A varint-encoded int32 (negative values are sign-extended to 64 bits)."""
    v &= (1 << 64) - 1
    if v >= 1 << 63:
        v -= 1 << 64
    return v


def _expect(wire: int, expected: int, what: str) -> None:
    if wire != expected:
        raise _WireError(f"{what}: wire type {wire}, expected {expected}")


@dataclass
class SpmModel:
    pieces: list = field(default_factory=list)      # str
    scores: list = field(default_factory=list)      # float (f32 values)
    types: list = field(default_factory=list)       # int, see NORMAL..BYTE
    model_type: str = "unigram"
    unk_id: int = 0
    bos_id: int = 1
    eos_id: int = 2
    pad_id: int = -1
    byte_fallback: bool = False
    add_dummy_prefix: bool = True
    remove_extra_whitespaces: bool = True

    def __len__(self) -> int:
        return len(self.pieces)


def _parse_piece(buf: bytes) -> tuple[str, float, int]:
    piece, score, ptype = "", 0.0, NORMAL
    for number, wire, value in _fields(buf):
        if number == 1:
            _expect(wire, 2, "piece")
            piece = value.decode("utf-8")
        elif number == 2:
            _expect(wire, 5, "score")
            score = struct.unpack("<f", value)[0]
        elif number == 3:
            _expect(wire, 0, "type")
            ptype = value
    return piece, score, ptype


def parse_model_proto(data: bytes) -> SpmModel:
    """Decodes the fields listed in the module docstring; raises ValueError when malformed."""
    m = SpmModel()
    for number, wire, value in _fields(data):
        if number == 1:
            _expect(wire, 2, "pieces")
            piece, score, ptype = _parse_piece(value)
            m.pieces.append(piece)
            m.scores.append(score)
            m.types.append(ptype)
        elif number == 2:
            _expect(wire, 2, "trainer_spec")
            for n, w, v in _fields(value):
                if n == 3 and w == 0:
                    m.model_type = MODEL_TYPES.get(v, f"unknown({v})")
                elif n == 35 and w == 0:
                    m.byte_fallback = bool(v)
                elif n == 40 and w == 0:
                    m.unk_id = _int32(v)
                elif n == 41 and w == 0:
                    m.bos_id = _int32(v)
                elif n == 42 and w == 0:
                    m.eos_id = _int32(v)
                elif n == 43 and w == 0:
                    m.pad_id = _int32(v)
        elif number == 3:
            _expect(wire, 2, "normalizer_spec")
            for n, w, v in _fields(value):
                if n == 3 and w == 0:
                    m.add_dummy_prefix = bool(v)
                elif n == 4 and w == 0:
                    m.remove_extra_whitespaces = bool(v)
    return m


_TIKTOKEN_LINE = re.compile(rb"[A-Za-z0-9+/]+=* \d+\r?\n")


def load_spm(path) -> SpmModel:
    """Reads and checks a tokenizer.model; problems are ConversionErrors naming the file."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise ConversionError(f"missing {path.name}: {path} does not exist") from None
    if _TIKTOKEN_LINE.match(data[:200]):
        # THUDM's glm-4-9b remote-code folders: base64 token, space, rank, per line
        raise ConversionError(f"{path}: a tiktoken BPE file (base64 token and rank per line), not a "
                              f"sentencepiece model; tiktoken tokenizers are not supported (for "
                              f"glm-4-9b, convert its -hf version, whose tokenizer.json is read)")
    try:
        m = parse_model_proto(data)
    except (ValueError, UnicodeDecodeError) as e:
        raise ConversionError(f"{path}: not a valid sentencepiece model: {e}") from None
    if not m.pieces:
        raise ConversionError(f"{path}: sentencepiece model has no pieces")
    if m.model_type != "bpe":
        raise ConversionError(f"{path}: sentencepiece model type is {m.model_type}; only BPE "
                              f"models are supported")
    for i, t in enumerate(m.types):
        if not NORMAL <= t <= BYTE:
            raise ConversionError(f"{path}: piece {i} ({m.pieces[i]!r}) has unknown type {t}")
    # the special ids are trainer options; -1 (or anything out of range) means "none"
    n = len(m.pieces)
    for attr in ("unk_id", "bos_id", "eos_id", "pad_id"):
        v = getattr(m, attr)
        if not 0 <= v < n:
            setattr(m, attr, -1)
    return m
