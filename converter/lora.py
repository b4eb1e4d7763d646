"""A PEFT LoRA adapter folder or a llama.cpp LoRA GGUF -> an `.flm` adapter file (docs/lora.md),
checked against its base model (an HF folder or a GGUF model file).

    python converter/convert.py --adapter PEFT_DIR_OR_LORA_GGUF --model_path BASE --out_path ADAPTER.flm

A PEFT folder holds adapter_config.json (r, lora_alpha, use_rslora, rank_pattern, alpha_pattern,
target_modules) and adapter_model.safetensors (or .bin): per adapted module, lora_A [r, in] and
lora_B [out, r], with y = W x + s B (A x), s = alpha / r (rslora: alpha / sqrt(r)). The base folder
gives the family and its config, so that every module lands in the right rows of the `.flm` tensor
it was fused into (q|k|v in attn_qkv, gate|up in ffn_gate_up) and every shape is checked.

A llama.cpp LoRA GGUF (convert_lora_to_gguf.py; general.type "adapter", adapter.type "lora")
holds `blk.L.NAME.weight.lora_a` [r, in] and `.lora_b` [out, r] under the model's GGUF names, in
F32, F16, BF16 or Q8_0, with s = adapter.lora.alpha / r (alpha 0: s = 1, as llama.cpp reads it);
for llama files, lora_b's attn_q / attn_k rows are in llama.cpp's RoPE order, and are put back.

The file (header kind 1, flm_writer.KIND_ADAPTER) holds, for each adapted part of a base matrix
`blk.L.NAME.weight`, the tensors `blk.L.NAME.weight.lora_a.ROW0` [r, in] and
`blk.L.NAME.weight.lora_b.ROW0` [rows, r], f32, with s folded into lora_b: the part's rows are
[ROW0, ROW0 + rows) of the base matrix. Metadata: general.architecture (the base's), adapter.type
"lora", adapter.name.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import torch

from .checkpoint import Checkpoint, _SafetensorsFile, _TorchBinFile
from .errors import ConversionError
from .flm_writer import KIND_ADAPTER, FlmWriter

_PREFIX = "base_model.model."


def _pattern_value(patterns: dict, module: str, default):
    """PEFT's per-module override: the first pattern that matches the module's name at a dot."""
    for pattern, value in (patterns or {}).items():
        if re.match(rf"(.*\.)?({pattern})$", module):
            return value
    return default


def read_adapter(adapter_dir: Path):
    """(config, {module name without `base_model.model.`: (lora_A, lora_B) float32 tensors})."""
    cfg_path = adapter_dir / "adapter_config.json"
    if not cfg_path.is_file():
        raise ConversionError(f"{adapter_dir}: no adapter_config.json (is this a PEFT adapter folder?)")
    try:
        cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ConversionError(f"{cfg_path}: {e}") from None
    if not isinstance(cfg, dict):
        raise ConversionError(f"{cfg_path}: expected a JSON object")
    if str(cfg.get("peft_type", "LORA")).upper() != "LORA":
        raise ConversionError(f"{cfg_path}: peft_type {cfg.get('peft_type')!r}; only LORA adapters convert")
    for key, ok, why in (("use_dora", lambda v: not v, "DoRA's magnitude vectors"),
                         ("fan_in_fan_out", lambda v: not v, "fan_in_fan_out (Conv1D) weights"),
                         ("bias", lambda v: v in (None, "none"), "trained biases"),
                         ("modules_to_save", lambda v: not v, "fully trained modules (modules_to_save)")):
        if not ok(cfg.get(key)):
            raise ConversionError(f"{cfg_path}: {key} = {cfg.get(key)!r}: {why} are not supported")
    files = [adapter_dir / n for n in ("adapter_model.safetensors", "adapter_model.bin")]
    path = next((f for f in files if f.is_file()), None)
    if path is None:
        raise ConversionError(f"{adapter_dir}: no adapter_model.safetensors or adapter_model.bin")
    weights = _SafetensorsFile(path) if path.suffix == ".safetensors" else _TorchBinFile(path)
    modules: dict = {}
    if cfg.get("alora_invocation_tokens"):
        raise ConversionError(f"{cfg_path}: an activated LoRA (alora_invocation_tokens) is not supported")
    names = set()
    for name in weights.names():
        m = re.fullmatch(r"(.+)\.lora_([AB])(?:\.([^.]+))?\.weight", name)
        if not m:
            raise ConversionError(f"{path}: tensor {name} is not a LoRA A or B matrix "
                                  f"(embedding or bias adapters are not supported)")
        module = m.group(1)[len(_PREFIX):] if m.group(1).startswith(_PREFIX) else m.group(1)
        if m.group(3) is not None:
            names.add(m.group(3))
            if len(names) > 1:
                raise ConversionError(f"{path}: holds more than one adapter ({', '.join(sorted(names))}): "
                                      f"save each on its own")
        t = weights.get(name)
        if not t.is_floating_point() or t.dim() != 2:
            raise ConversionError(f"{path}: {name} is not a floating-point matrix")
        modules.setdefault(module, {})[m.group(2)] = t.to(torch.float32)
    for module, ab in modules.items():
        if set(ab) != {"A", "B"}:
            raise ConversionError(f"{path}: {module} has lora_{''.join(ab)} but not both A and B")
        a, b = ab["A"], ab["B"]
        if a.shape[0] != b.shape[1]:
            raise ConversionError(f"{path}: {module}: lora_A {list(a.shape)} and lora_B {list(b.shape)} "
                                  f"disagree on the rank")
    if not modules:
        raise ConversionError(f"{path}: no LoRA matrices")
    return cfg, {k: (v["A"], v["B"]) for k, v in modules.items()}


def scale_of(cfg: dict, module: str, rank: int) -> float:
    """s = alpha / r, or alpha / sqrt(r) with use_rslora; alpha from alpha_pattern or lora_alpha."""
    alpha = float(_pattern_value(cfg.get("alpha_pattern"), module, cfg.get("lora_alpha", 8)))
    return alpha / math.sqrt(rank) if cfg.get("use_rslora") else alpha / rank


class MergedCheckpoint:
    """A base Checkpoint whose adapted matrices read as W + scale * s B A, in f32 (convert.py
    --lora: one file, no adapter at run time; the writer then rounds to the output dtype once);
    everything else is the base's. Each product is made when its matrix is read."""

    def __init__(self, base, adapter_dir, scale: float = 1.0):
        if not math.isfinite(scale):
            raise ConversionError(f"--lora_scale {scale} is not finite")
        cfg, modules = read_adapter(Path(adapter_dir))
        self._base, self._parts = base, {}
        for module, (a, b) in modules.items():
            name = module + ".weight"
            full = next((n for n in (name, "model." + name) if base.has(n)), None)
            if full is None or not re.search(r"(^|\.)layers\.\d+\.", module):
                raise ConversionError(f"{adapter_dir}: {module} is not a layer's matrix in the base model "
                                      f"(adapters of the embeddings or the output head are not supported)")
            if tuple(base.shape(full)) != (b.shape[0], a.shape[1]):
                raise ConversionError(f"{adapter_dir}: {module}: lora_A {list(a.shape)} and lora_B {list(b.shape)} "
                                      f"do not fit the base's {list(base.shape(full))} matrix")
            self._parts[full] = (a, b, float(scale) * scale_of(cfg, module, a.shape[0]))

    def get(self, name: str) -> torch.Tensor:
        t = self._base.get(name)
        part = self._parts.get(name)
        if part is None:
            return t
        a, b, s = part
        return t.to(torch.float32) + s * (b @ a)

    def __getattr__(self, attr):  # config, names, has, shape, path, ...: the base's
        return getattr(self._base, attr)


def _gguf_adapter(path: Path):
    """(architecture, {GGUF matrix name `blk.L.NAME.weight`: (lora_a, lora_b, s)}) of a llama.cpp LoRA GGUF."""
    from .gguf_import import read_gguf
    g = read_gguf(path)
    if g.get_str("general.type", "") != "adapter" or g.get_str("adapter.type", "") != "lora":
        raise ConversionError(f"{path}: not a LoRA adapter GGUF (general.type {g.get_str('general.type', '')!r}, "
                              f"adapter.type {g.get_str('adapter.type', '')!r}); a model file is a --model_path")
    if g.has("adapter.alora.invocation_tokens"):
        raise ConversionError(f"{path}: an activated LoRA (adapter.alora.invocation_tokens) is not supported")
    alpha = g.get_float("adapter.lora.alpha", 0.0)
    if not math.isfinite(alpha):
        raise ConversionError(f"{path}: adapter.lora.alpha {alpha} is not finite")
    pairs = {}
    for name in g.tensors:
        m = re.fullmatch(r"(.+\.weight)\.lora_([ab])", name)
        if not m:
            raise ConversionError(f"{path}: tensor {name} is not a LoRA A or B matrix")
        pairs.setdefault(m.group(1), {})[m.group(2)] = name
    modules = {}
    for target, ab in pairs.items():
        if set(ab) != {"a", "b"}:
            raise ConversionError(f"{path}: {target} has lora_{''.join(ab)} but not both a and b")
        for n in ab.values():
            g.check_type(n)
            if len(g.shape(n)) != 2:
                raise ConversionError(f"{path}: {n} is not a matrix")
        a, b = (torch.from_numpy(g.dequantize(ab[x])) for x in "ab")
        if a.shape[0] != b.shape[1]:
            raise ConversionError(f"{path}: {target}: lora_a {list(a.shape)} and lora_b {list(b.shape)} "
                                  f"disagree on the rank")
        modules[target] = (a, b, alpha / a.shape[0] if alpha else 1.0)
    if not modules:
        raise ConversionError(f"{path}: no LoRA matrices")
    return g.arch, modules


def _base_of(base):
    """(family, hparams) of a base model: an HF folder or a GGUF model file."""
    from . import gguf_import
    from .convert import detect_model_type  # convert.py imports this module
    from .families import FAMILIES
    base = Path(base)
    if base.is_file() and gguf_import.is_gguf(base):
        g = gguf_import.read_gguf(base)
        family = gguf_import.gguf_family(g)
        return family, (None if family.ARCH == "bert" else gguf_import.read_hparams(g, family))
    cp = Checkpoint(base)
    family = FAMILIES[detect_model_type(cp.config)]
    return family, (None if family.ARCH == "bert" else family.read_hparams(cp.config))


def convert_adapter(adapter, base_dir, out_path, progress: bool = False, dtype: str = "f32") -> str:
    """Writes the adapter (a PEFT folder or a llama.cpp LoRA GGUF) for the base model at base_dir
    (an HF folder or a GGUF model) to out_path, its matrices in dtype: f32; f16 (half the bytes a
    pass reads, B's rounding ~5e-4 of the adapter's change); or int8 (f32 in the file, made q8 rows
    of 32-value blocks at load: 0.56x f16's bytes a pass, adapter.dtype "q8")."""
    if dtype not in ("f32", "f16", "int8"):
        raise ConversionError(f"an adapter's matrices are f32, f16 or int8, not {dtype}")
    from .convert import _check_out_path
    from .gguf_import import GGUF_NAMES, PERMUTED_ARCHITECTURES, is_gguf, unpermute_rope_rows
    adapter, out_path = Path(adapter), Path(out_path)
    _check_out_path(out_path)
    if base_dir is None:
        raise ConversionError("--adapter needs --model_path: the base model (its HF folder or GGUF file: its "
                              "config places each module in the fused tensors and checks every shape)")
    from_gguf = adapter.is_file() and is_gguf(adapter)
    if from_gguf:
        arch, modules = _gguf_adapter(adapter)
    else:
        cfg, peft_modules = read_adapter(adapter)
        modules = {k: (a, b, scale_of(cfg, k, a.shape[0])) for k, (a, b) in peft_modules.items()}
    family, hp = _base_of(base_dir)
    if not hasattr(family, "layer_tensors") or family.ARCH == "bert":
        raise ConversionError(f"LoRA adapters for {family.ARCH} models are not supported")
    if from_gguf and arch != family.GGUF_ARCH:
        raise ConversionError(f"{adapter} is an adapter for a {arch} model; the base is {family.ARCH} "
                              f"(its GGUF files say {family.GGUF_ARCH})")

    def source(part: str, layer: int):
        """The adapter's key for an HF part name (`layers.L.self_attn.q_proj.weight`), or None."""
        if from_gguf:
            rest = part.split(".", 2)[2]
            key = f"blk.{layer}.{GGUF_NAMES[rest]}" if rest in GGUF_NAMES else None
            return key if key in modules else None
        module = part[:-len(".weight")]
        return next((k for k in (module, "model." + module) if k in modules), None)

    writer = FlmWriter(out_path, kind=KIND_ADAPTER)
    writer.add_string("general.architecture", family.ARCH)
    writer.add_string("adapter.type", "lora")
    writer.add_string("adapter.name", adapter.resolve().stem if from_gguf else adapter.resolve().name)
    if dtype == "int8":
        writer.add_string("adapter.dtype", "q8")
    file_dtype = "f16" if dtype == "f16" else "f32"
    used = set()
    for i in range(hp.num_layers):
        for spec in family.layer_tensors(hp, i):
            if not spec.matrix:
                continue
            row0 = 0
            for part, shape in spec.parts:
                key = source(part, i)
                if key is not None:
                    a, b, s = modules[key]
                    if a.shape[1] != shape[1] or b.shape[0] != shape[0]:
                        raise ConversionError(f"{adapter}: {key}: lora_A {list(a.shape)} and lora_B "
                                              f"{list(b.shape)} do not fit the base's {list(shape)} matrix")
                    np_dtype = "float16" if file_dtype == "f16" else "float32"
                    b_np = (b * s).numpy()
                    if from_gguf and family.GGUF_ARCH in PERMUTED_ARCHITECTURES:
                        heads = {"attn_q": hp.num_heads, "attn_k": hp.num_kv_heads}.get(key.split(".")[-2], 0)
                        if heads:  # b's rows are the base's output rows, which llama.cpp reorders
                            b_np = unpermute_rope_rows(b_np, heads)
                    a_np, b_np = a.numpy().astype(np_dtype), b_np.astype(np_dtype)
                    writer.add_tensor(f"{spec.name}.lora_a.{row0}", file_dtype, tuple(a_np.shape), lambda x=a_np: x)
                    writer.add_tensor(f"{spec.name}.lora_b.{row0}", file_dtype, tuple(b_np.shape), lambda x=b_np: x)
                    used.add(key)
                row0 += shape[0]
    left = sorted(set(modules) - used)
    if left:
        shown = ", ".join(left[:4]) + (f" and {len(left) - 4} more" if len(left) > 4 else "")
        raise ConversionError(f"{adapter}: modules this {family.ARCH} model has no matrix for: {shown} "
                              f"(adapters of the embeddings or the output head are not supported)")
    writer.write(progress=progress, desc=f"{out_path.name} (LoRA)")
    return str(out_path)
