"""HuggingFace checkpoint folder (or llama.cpp GGUF file) -> `.flm` file (docs/flm_format.md).

The family (families/: llama, mistral, qwen2, qwen3, phi3, gemma, glm, glm4, bert) comes from config.json; each family
module reads its hyperparameters and lays out its tensors, this file only dispatches.

    python converter/convert.py --model_path HF_DIR --out_path OUT.flm [--dtype f32|f16|bf16]
                                [--model_type FAMILY] [--calib FILE [--calib_tokens N]]
    python converter/convert.py --model_path MODEL.gguf --out_path OUT.flm [--dtype ...]
                                (see gguf_import.py)
    python converter/convert.py --adapter PEFT_DIR_OR_LORA_GGUF --model_path BASE --out_path ADAPTER.flm
                                (a LoRA adapter for that base, an HF folder or GGUF file: see lora.py)

or, with the repository root on sys.path:

    from converter.convert import convert
    convert("path/to/hf", "model.flm", dtype="f16")

The output appears only once it is complete (written to a temporary file in the same folder,
then renamed); on any error nothing is left behind.
"""

from __future__ import annotations

if __name__ == "__main__":  # a conversion of its own (as a script or with -m), before torch loads
    import os
    # torch's OpenMP threads sleep once a copy is done instead of spinning on the cores the
    # quantizer's threads need: an int4 conversion of the 1.1B shape took 11.4 s instead of 12.2 from
    # the f32 folder, 12.4 instead of 13.1 from the f16 GGUF (medians of 4 alternating runs, AMD EPYC,
    # 2 cores, 2026-12-06)
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

if not __package__:
    # Run as a script (python3 converter/convert.py): load this folder as the package `converter`,
    # so that its modules' relative imports work, and run main() from there.
    import importlib
    import importlib.util
    import sys
    from pathlib import Path

    _here = Path(__file__).resolve().parent
    _spec = importlib.util.spec_from_file_location("converter", _here / "__init__.py",
                                                   submodule_search_locations=[str(_here)])
    _package = importlib.util.module_from_spec(_spec)
    sys.modules["converter"] = _package
    _spec.loader.exec_module(_package)
    sys.exit(importlib.import_module("converter.convert").main())

import argparse
import os
import sys
from pathlib import Path

from . import calibrate, gguf_import, hf_tokenizer, quantize, sentence_transformers
from . import lora as lora_module
from . import reranker as rerank
from .checkpoint import Checkpoint
from .errors import ConversionError
from .families import FAMILIES  # ARCH -> the family's module (families/__init__.py)
from .flm_writer import FlmWriter

DTYPES = quantize.REQUESTS

__all__ = ["convert", "convert_adapter", "main", "detect_model_type", "ConversionError"]
convert_adapter = lora_module.convert_adapter


def detect_model_type(config: dict, requested: str | None = None) -> str:
    """The family of a config.json: from `architectures`, else from `model_type`.
    `requested` (--model_type) must agree with the config, and is used when the config names
    neither."""
    if requested is not None and requested not in FAMILIES:
        raise ConversionError(f"unsupported --model_type {requested!r} (supported: "
                              f"{', '.join(FAMILIES)})")
    archs = config.get("architectures") or []
    if isinstance(archs, str):
        archs = [archs]
    detected = None
    if archs:
        for arch in archs:
            for name, module in FAMILIES.items():
                if arch in module.HF_ARCHITECTURES:
                    detected = name
        if detected is None:
            supported = ", ".join(a for m in FAMILIES.values() for a in m.HF_ARCHITECTURES)
            raise ConversionError(f"unsupported architecture {', '.join(map(str, archs))} "
                                  f"(model_type {config.get('model_type')!r}); supported: "
                                  f"{supported}")
    elif config.get("model_type") is not None:
        mt = config["model_type"]
        for name, module in FAMILIES.items():
            if mt in getattr(module, "MODEL_TYPES", (module.MODEL_TYPE,)):
                detected = name
        if detected is None:
            raise ConversionError(f"unsupported model_type {mt!r} (supported: "
                                  f"{', '.join(m.MODEL_TYPE for m in FAMILIES.values())})")
    if detected is None:
        if requested is None:
            raise ConversionError("config.json has neither architectures nor model_type; "
                                  "pass --model_type")
        return requested
    if requested is not None and requested != detected:
        raise ConversionError(f"--model_type {requested} does not match the checkpoint, which is "
                              f"{detected} ({', '.join(archs) or config.get('model_type')})")
    return detected


def _check_out_path(out_path: Path) -> None:
    if out_path.is_dir():
        raise ConversionError(f"output path {out_path} is a folder")
    parent = out_path.resolve().parent
    if not parent.is_dir():
        raise ConversionError(f"output folder {parent} does not exist")


def convert(model_path, out_path, dtype: str = "f32", model_type: str | None = None,
            progress: bool = True, group_size: int = 32, dtype_config=(), calib=None,
            calib_tokens: int = calibrate.DEFAULT_TOKENS, reranker: bool | None = None,
            rerank_tokens=("yes", "no"), lora=None, lora_scale: float = 1.0) -> str:
    """Converts the HF folder `model_path` to `out_path`; returns out_path.
    dtype: f32, f16, bf16, int8, int4 (int4m: with minimums) or a .flm quantized type name;
    group_size: int4 group (32, 64, 128); dtype_config: ["PATTERN=DTYPE", ...] per-tensor overrides
    (see quantize.DtypePolicy); calib: a text file to calibrate int8 / int4 rounding on,
    calib_tokens of it (see calibrate.py); reranker: a causal LM that answers "yes" or "no" to a
    query and document (Qwen3-Reranker: its prompt is stored; None: detected by name), with
    rerank_tokens its answer tokens (reranker.py); lora: a PEFT adapter folder merged into the weights
    (W + lora_scale * s B A, before any quantization: one file instead of an adapter at run time,
    lora.py). Raises ConversionError for anything wrong with the input."""
    policy = quantize.DtypePolicy(dtype, group_size, dtype_config)
    model_path = Path(model_path)
    out_path = Path(out_path)
    _check_out_path(out_path)
    if lora is not None and (calib is not None or model_path.suffix.lower() == ".gguf" or gguf_import.is_gguf(model_path)):
        raise ConversionError("--lora merges into an HF folder's weights, without --calib")
    if calib is not None:  # before any work: an HF folder, a quantized dtype, the text file
        calibrate.check_request(calib, policy, model_path)
    if model_path.suffix.lower() == ".gguf" or gguf_import.is_gguf(model_path):
        return _convert_gguf(model_path, out_path, dtype, policy, model_type, progress)
    if policy.default == "auto":
        raise ConversionError("--dtype auto keeps a GGUF file's own quantization; it needs a .gguf input")
    ckpt = Checkpoint(model_path)
    if lora is not None:
        ckpt = lora_module.MergedCheckpoint(ckpt, lora, lora_scale)
    family = FAMILIES[detect_model_type(ckpt.config, model_type)]

    hp = family.read_hparams(ckpt.config)
    max_seq = sentence_transformers.read_max_seq_length(model_path)
    # an embedding model's own limit, where positions are a table to cut (RoPE's are not: LongRoPE
    # ties its switch to the original context)
    if max_seq is not None and max_seq < hp.context_length and hasattr(hp, "max_positions"):
        hp.context_length = max_seq
    policy.n_layers = hp.num_layers  # a _m preset's layer choice (calibration asks before add_tensors)
    tok = hf_tokenizer.read_tokenizer(ckpt, hp.vocab_size, family.ADD_BOS_DEFAULT,
                                      getattr(family, "spm_code_tokens", None))
    if calib is not None:  # the scaled, rounded tensors replace the checkpoint's
        ckpt, _ = calibrate.calibrate(ckpt, hp, policy, calib, calib_tokens, progress=progress)

    writer = FlmWriter(out_path, dtype_policy=policy)
    tied = family.add_tensors(writer, ckpt, hp, "f32")  # float data; the policy picks each dtype
    writer.add_string("general.architecture", family.ARCH)
    writer.add_string("general.name", model_path.resolve().name)
    writer.add_string("general.source", "hf")
    family.add_metadata(writer, hp, tied)
    pooling = sentence_transformers.read_pooling(model_path)
    if pooling is not None:
        writer.add_string(f"{family.ARCH}.pooling", pooling)
    if reranker is None:
        reranker = rerank.is_qwen3_reranker(model_path, ckpt.config)
    if reranker:
        if family.ARCH == "bert":
            raise ConversionError("--reranker is for a causal LM; a BERT cross-encoder (BertForSequenceClassification) "
                                  "reranks by its classifier")
        rerank.add_rerank_metadata(writer, family.ARCH, tuple(rerank_tokens))
    hf_tokenizer.add_tokenizer_metadata(writer, tok)
    writer.write(progress=progress, desc=f"{out_path.name} ({dtype})")
    return str(out_path)


def _convert_gguf(model_path: Path, out_path: Path, dtype: str, policy, model_type,
                  progress) -> str:
    """A llama.cpp GGUF file instead of an HF folder: see gguf_import.py."""
    return gguf_import.convert_gguf(model_path, out_path, dtype=dtype, progress=progress,
                                    dtype_policy=policy, model_type=model_type)


def main(argv=None, prog: str = "convert.py") -> int:
    ap = argparse.ArgumentParser(
        prog=prog,
        description="Convert a HuggingFace checkpoint folder to a fastllm .flm file.")
    ap.add_argument("--model_path", required=True,
                    help="HuggingFace model folder, or a llama.cpp .gguf file (with --adapter: the base model, "
                         "either)")
    ap.add_argument("--adapter", default=None, metavar="PEFT_DIR_OR_LORA_GGUF",
                    help="convert this LoRA adapter (a PEFT folder, or a llama.cpp LoRA .gguf) for the --model_path "
                         "base into an adapter .flm (docs/lora.md); --dtype f32, f16 or int8, the options below do not apply")
    ap.add_argument("--out_path", required=True, help="output .flm file")
    ap.add_argument("--dtype", default="f32", choices=DTYPES,
                    help="dtype of the weight matrices (norms and biases stay f32); int8 / int4 quantize "
                         "(with int4, the embedding and output head get int8); q4_k_s, q4_k_m, ... are "
                         "mixed-precision presets (docs/quantization.md)")
    ap.add_argument("--group_size", type=int, default=32, choices=(32, 64, 128),
                    help="int4 weights per scale (32: 4.5 bits per weight, 128: 4.125)")
    ap.add_argument("--dtype_config", action="append", default=[], metavar="PATTERN=DTYPE",
                    help="dtype for tensors whose .flm name matches the glob, e.g. 'blk.0.*=f16' "
                         "(repeatable; the last match wins)")
    ap.add_argument("--calib", default=None, metavar="FILE",
                    help="int8 / int4: run the model on this text and round with its activations "
                         "in mind (input channels scaled, GPTQ rounding; needs transformers; see "
                         "calibrate.py)")
    ap.add_argument("--calib_tokens", type=int, default=calibrate.DEFAULT_TOKENS, metavar="N",
                    help="tokens of the --calib text to run (default %(default)s)")
    ap.add_argument("--model_type", default=None, choices=sorted(FAMILIES),
                    help="model family; detected from config.json when omitted")
    ap.add_argument("--reranker", action="store_true", default=None,
                    help="a causal LM that reranks by answering yes or no (Qwen3-Reranker, detected by its name): "
                         "store its prompt for fastllm_rerank")
    ap.add_argument("--rerank_tokens", default="yes,no", metavar="YES,NO",
                    help="with --reranker: its answer tokens (default yes,no)")
    ap.add_argument("--lora", default=None, metavar="PEFT_DIR",
                    help="merge this PEFT LoRA adapter into the weights (one file; --adapter instead keeps it "
                         "separate, to set per session)")
    ap.add_argument("--lora_scale", type=float, default=1.0, help="with --lora: its scale (default 1.0)")
    ap.add_argument("--quiet", action="store_true", help="no progress bar")
    args = ap.parse_args(argv)
    try:
        if args.adapter is not None:
            if args.lora is not None or args.dtype not in ("f32", "f16", "int8") or args.calib is not None:
                raise ConversionError("--adapter writes an adapter file: its --dtype is f32, f16 or int8; --lora and "
                                      "--calib do not apply")
            out = convert_adapter(args.adapter, args.model_path, args.out_path, progress=not args.quiet,
                                  dtype=args.dtype)
        else:
            out = convert(args.model_path, args.out_path, dtype=args.dtype,
                          model_type=args.model_type, progress=not args.quiet, group_size=args.group_size,
                          dtype_config=args.dtype_config, calib=args.calib,
                          calib_tokens=args.calib_tokens, reranker=args.reranker,
                          rerank_tokens=tuple(args.rerank_tokens.split(",", 1)) if "," in args.rerank_tokens
                          else (args.rerank_tokens, ""), lora=args.lora, lora_scale=args.lora_scale)
    except ConversionError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except OSError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
    size = os.path.getsize(out)
    print(f"wrote {out} ({size / 1e6:.1f} MB)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
