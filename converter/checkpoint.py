"""Reads a HuggingFace checkpoint folder lazily, tensor by tensor.

Weights, in order of preference:
  model.safetensors                 one safetensors file
  model.safetensors.index.json      sharded safetensors ({"weight_map": {name: file}})
  pytorch_model.bin                 one torch.save'd state dict
  pytorch_model.bin.index.json      sharded state dicts

safetensors files are opened with safe_open (memory-mapped; a tensor is read when asked for);
.bin files are loaded with torch.load(mmap=True, weights_only=True), so their tensors are not read
either until they are used (old non-zip .bin files cannot be mmapped: they are loaded whole, one
shard at a time).

Also reads config.json (required), generation_config.json and tokenizer_config.json (optional).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import torch

from .errors import ConversionError

SAFETENSORS = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
PYTORCH_BIN = "pytorch_model.bin"
PYTORCH_BIN_INDEX = "pytorch_model.bin.index.json"
WEIGHT_FILES = (SAFETENSORS, SAFETENSORS_INDEX, PYTORCH_BIN, PYTORCH_BIN_INDEX)


def read_json(path: Path, required: bool):
    """The parsed JSON file, or None when it is absent and not required."""
    if not path.is_file():
        if required:
            raise ConversionError(f"missing {path.name}: {path} does not exist")
        return None
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ConversionError(f"{path}: invalid JSON: {e}") from None


class _SafetensorsFile:
    def __init__(self, path: Path):
        from safetensors import safe_open
        self.path = path
        try:
            self._f = safe_open(str(path), framework="pt")
        except Exception as e:  # safetensors raises its own error types
            raise ConversionError(f"{path}: cannot open safetensors file: {e}") from None
        self._keys = set(self._f.keys())
        self._info = None  # the header's offsets, read when first needed
        self._map = None

    def names(self):
        return list(self._f.keys())

    def has(self, name: str) -> bool:
        return name in self._keys

    def shape(self, name: str) -> tuple:
        return tuple(self._f.get_slice(name).get_shape())

    def get(self, name: str) -> torch.Tensor:
        """The tensor as a view of the mapped file where it is float32, float16 or bfloat16 (a
        private mapping: nothing is copied, or written back); safe_open's copy otherwise. Copying
        every tensor into fresh memory took a tenth of a 1.1B conversion to int8."""
        info = self._offsets().get(name)
        if info is None or info[0] not in _VIEWS or sys.byteorder != "little":
            return self._f.get_tensor(name)
        kind, shape, begin, end = info
        np_type, torch_type = _VIEWS[kind]
        if begin % np.dtype(np_type).itemsize:  # a tensor after one of an odd size: aligned by a copy
            return self._f.get_tensor(name)
        if self._map is None:
            self._map = np.memmap(self.path, dtype=np.uint8, mode="c")
        t = torch.from_numpy(self._map[begin:end].view(np_type).reshape(shape))
        return t.view(torch_type) if torch_type is not None else t

    def _offsets(self) -> dict:
        """name -> (dtype, shape, first byte, end) in the file, from its header (which safe_open
        has checked)."""
        if self._info is None:
            with open(self.path, "rb") as f:
                n = int.from_bytes(f.read(8), "little")
                header = json.loads(f.read(n))
            self._info = {k: (v["dtype"], tuple(v["shape"]), 8 + n + v["data_offsets"][0], 8 + n + v["data_offsets"][1])
                          for k, v in header.items() if k != "__metadata__"}
        return self._info


# safetensors dtypes the reader maps in place: (numpy view, torch view of it or None)
_VIEWS = {"F32": (np.float32, None), "F16": (np.float16, None), "BF16": (np.int16, torch.bfloat16)}


class _TorchBinFile:
    """A torch.save'd state dict; mmapped when the file is in the zip format."""

    def __init__(self, path: Path):
        self.path = path
        self._sd = None
        self._mmapped = False
        self._meta = None  # name -> shape, kept when the state dict itself is dropped

    def _load(self) -> dict:
        if self._sd is None:
            try:
                sd = torch.load(str(self.path), map_location="cpu", weights_only=True, mmap=True)
                self._mmapped = True
            except RuntimeError:
                # legacy (non-zip) serialization cannot be mmapped
                try:
                    sd = torch.load(str(self.path), map_location="cpu", weights_only=True)
                except Exception as e:
                    raise ConversionError(f"{self.path}: cannot load: {e}") from None
            except Exception as e:
                raise ConversionError(f"{self.path}: cannot load: {e}") from None
            if isinstance(sd, dict) and "state_dict" in sd and isinstance(sd["state_dict"], dict):
                sd = sd["state_dict"]
            if not isinstance(sd, dict):
                raise ConversionError(f"{self.path}: not a state dict")
            sd = {k: v for k, v in sd.items() if isinstance(v, torch.Tensor)}
            self._sd = sd
            self._meta = {k: tuple(v.shape) for k, v in sd.items()}
        return self._sd

    def _shapes(self) -> dict:
        if self._meta is None:
            self._load()
            self.release()
        return self._meta

    def release(self) -> None:
        """Drops a state dict that was loaded into memory (mmapped ones cost nothing)."""
        if not self._mmapped:
            self._sd = None

    def names(self):
        return list(self._shapes())

    def has(self, name: str) -> bool:
        return name in self._shapes()

    def shape(self, name: str) -> tuple:
        return self._shapes()[name]

    def get(self, name: str) -> torch.Tensor:
        return self._load()[name]


class Checkpoint:
    """A HuggingFace model folder: its JSON configs and a lazy view of its weights."""

    def __init__(self, model_path):
        self.path = Path(model_path)
        if not self.path.exists():
            raise ConversionError(f"model folder {self.path} does not exist")
        if not self.path.is_dir():
            raise ConversionError(f"{self.path} is not a folder (expected a HuggingFace model "
                                  f"folder with config.json)")
        self.config = read_json(self.path / "config.json", required=True)
        if not isinstance(self.config, dict):
            raise ConversionError(f"{self.path / 'config.json'}: expected a JSON object")
        self.generation_config = read_json(self.path / "generation_config.json", required=False)
        self.tokenizer_config = read_json(self.path / "tokenizer_config.json", required=False)
        self.weights_format, self._files, self._where = self._open_weights()
        self._last_bin = None

    def file(self, name: str) -> Path:
        return self.path / name

    def _open_weights(self):
        p = self.path
        if (p / SAFETENSORS).is_file():
            f = _SafetensorsFile(p / SAFETENSORS)
            return "safetensors", [f], {n: f for n in f.names()}
        if (p / SAFETENSORS_INDEX).is_file():
            return ("safetensors (sharded)",) + self._open_index(p / SAFETENSORS_INDEX,
                                                                 _SafetensorsFile)
        if (p / PYTORCH_BIN).is_file():
            f = _TorchBinFile(p / PYTORCH_BIN)
            return "pytorch", [f], {n: f for n in f.names()}
        if (p / PYTORCH_BIN_INDEX).is_file():
            return ("pytorch (sharded)",) + self._open_index(p / PYTORCH_BIN_INDEX, _TorchBinFile)
        raise ConversionError(f"missing weights: {p} has none of {', '.join(WEIGHT_FILES)}")

    def _open_index(self, index_path: Path, opener):
        index = read_json(index_path, required=True)
        weight_map = index.get("weight_map") if isinstance(index, dict) else None
        if not isinstance(weight_map, dict) or not weight_map:
            raise ConversionError(f"{index_path}: no weight_map")
        files = {}
        where = {}
        for name, fname in weight_map.items():
            if fname not in files:
                shard = self.path / fname
                if not shard.is_file():
                    raise ConversionError(f"missing weights shard {fname} (listed in "
                                          f"{index_path.name} for {name})")
                files[fname] = opener(shard)
            if not files[fname].has(name):
                raise ConversionError(f"{self.path / fname}: has no tensor {name} although "
                                      f"{index_path.name} says so")
            where[name] = files[fname]
        return list(files.values()), where

    def names(self) -> list:
        return list(self._where)

    def has(self, name: str) -> bool:
        return name in self._where

    def shape(self, name: str) -> tuple:
        return self._where[name].shape(name)

    def get(self, name: str) -> torch.Tensor:
        f = self._where[name]
        if isinstance(f, _TorchBinFile) and self._last_bin is not f:
            # keep at most one non-mmapped .bin shard in memory
            if self._last_bin is not None:
                self._last_bin.release()
            self._last_bin = f
        return f.get(name)
