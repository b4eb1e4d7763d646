"""Prompt-processing and generation speed of fastllm next to PyTorch transformers, same
checkpoint, same machine, same run. Prints medians and the fastllm/PyTorch ratio.

    python3 bench/bench_speed.py --model_path ../shared/models/stories260K/hf
    python3 bench/bench_speed.py --random tinyllama --dtype f16      # random weights, TinyLlama-1.1B shape
    python3 bench/bench_speed.py --random 110m

Random-weight models are built with transformers and cached under --work_dir; speed does not
depend on the weight values. PyTorch runs in float32 (or bf16 with --torch_dtype bf16).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "bindings" / "python"), str(REPO)]

# name -> (transformers config class, model class, config): the LLaMA shapes, Qwen2.5-0.5B's (tied
# head, GQA 7:1, vocab 152k), Gemma-3-1B's (head_dim 256, 1 KV head, vocab 262k, 22 of 26 layers
# with a window of 512) and Gemma-2-2B's (head_dim 256, every other layer a window of 4096, scores
# and logits soft-capped)
SHAPES = {
    "tinyllama": ("LlamaConfig", "LlamaForCausalLM", dict(
        hidden_size=2048, intermediate_size=5632, num_hidden_layers=22, num_attention_heads=32, num_key_value_heads=4,
        vocab_size=32000, max_position_embeddings=2048)),
    "110m": ("LlamaConfig", "LlamaForCausalLM", dict(
        hidden_size=768, intermediate_size=2048, num_hidden_layers=12, num_attention_heads=12, num_key_value_heads=12,
        vocab_size=32000, max_position_embeddings=1024)),
    "qwen2.5-0.5b": ("Qwen2Config", "Qwen2ForCausalLM", dict(
        hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
        vocab_size=151936, max_position_embeddings=32768, tie_word_embeddings=True, rope_theta=1000000.0)),
    "gemma3-1b": ("Gemma3TextConfig", "Gemma3ForCausalLM", dict(
        hidden_size=1152, intermediate_size=6912, num_hidden_layers=26, num_attention_heads=4, num_key_value_heads=1,
        head_dim=256, vocab_size=262144, max_position_embeddings=32768, sliding_window=512, query_pre_attn_scalar=256,
        tie_word_embeddings=True)),
    "gemma2-2b": ("Gemma2Config", "Gemma2ForCausalLM", dict(
        hidden_size=2304, intermediate_size=9216, num_hidden_layers=26, num_attention_heads=8, num_key_value_heads=4,
        head_dim=256, vocab_size=256000, max_position_embeddings=8192, sliding_window=4096, query_pre_attn_scalar=256,
        attn_logit_softcapping=50.0, final_logit_softcapping=30.0, tie_word_embeddings=True)),
}


def random_checkpoint(shape: str, work_dir: Path) -> Path:
    import torch
    import transformers
    out = work_dir / f"random-{shape}"
    if (out / "config.json").exists():
        return out
    torch.manual_seed(0)
    config_class, model_class, config = SHAPES[shape]
    model = getattr(transformers, model_class)(getattr(transformers, config_class)(**config, bos_token_id=1, eos_token_id=2))
    model.save_pretrained(out)
    tok = REPO.parent / "shared" / "models" / "stories260K" / "hf" / "tokenizer.model"
    (out / "tokenizer.model").write_bytes(tok.read_bytes())  # 512 pieces, padded to the vocab
    return out


def bench_torch(hf_dir: Path, prompt: list[int], n_gen: int, threads: int, repeat: int, dtype: str):
    import torch
    from transformers import AutoModelForCausalLM
    torch.set_num_threads(threads)
    model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32 if dtype == "f32" else torch.bfloat16).eval()
    ids = torch.tensor([prompt])
    pp, tg = [], []
    with torch.inference_mode():
        for _ in range(repeat + 1):
            t0 = time.perf_counter()
            out = model(ids, use_cache=True)
            t1 = time.perf_counter()
            past, nxt = out.past_key_values, out.logits[:, -1:].argmax(-1)
            for _ in range(n_gen):
                out = model(nxt, past_key_values=past, use_cache=True)
                past, nxt = out.past_key_values, out.logits[:, -1:].argmax(-1)
            t2 = time.perf_counter()
            pp.append(len(prompt) / (t1 - t0))
            tg.append(n_gen / (t2 - t1))
    return statistics.median(pp[1:]), statistics.median(tg[1:])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--model_path", type=Path, help="HuggingFace checkpoint folder")
    src.add_argument("--random", choices=sorted(SHAPES), help="random-weight model of this shape")
    ap.add_argument("--dtype", default="f32", help="fastllm weight dtype (as converter/convert.py --dtype)")
    ap.add_argument("--group_size", type=int, default=32, help="int4 group size")
    ap.add_argument("--torch_dtype", default="f32", choices=["f32", "bf16"])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt_len", type=int, default=128)
    ap.add_argument("--gen", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--work_dir", type=Path, default=Path(tempfile.gettempdir()) / "fastllm-bench")
    ap.add_argument("--skip_torch", action="store_true")
    args = ap.parse_args()

    from converter.convert import convert
    from fastllm.bench import bench, synthetic_prompt
    args.work_dir.mkdir(parents=True, exist_ok=True)
    hf_dir = args.model_path or random_checkpoint(args.random, args.work_dir)
    tag = hashlib.sha1(str(hf_dir.resolve()).encode()).hexdigest()[:8]  # two folders named "hf" must not share
    flm = args.work_dir / f"{hf_dir.name}-{tag}-{args.dtype}-g{args.group_size}.flm"
    if not flm.exists():
        convert(str(hf_dir), str(flm), dtype=args.dtype, group_size=args.group_size, progress=False)
    config = json.loads((hf_dir / "config.json").read_text())
    vocab, ctx = config["vocab_size"], config.get("max_position_embeddings", 2048)
    n_prompt = min(args.prompt_len, ctx - args.gen - 1)
    prompt = synthetic_prompt(vocab, n_prompt, 1)  # the same prompt fastllm.bench gives the library

    print(f"model {hf_dir.name}, fastllm {args.dtype} ({flm.stat().st_size / 2**20:.1f} MiB), "
          f"{args.threads} threads, prompt {n_prompt}, generate {args.gen}, median of {args.repeat}")
    r = bench(flm, n_prompt, args.gen, args.threads, args.repeat)
    ours = r.prompt_tok_s, r.generate_tok_s
    print(f"fastllm   prompt {ours[0]:9.1f} tok/s   generate {ours[1]:8.1f} tok/s")
    if not args.skip_torch:
        ref = bench_torch(hf_dir, prompt, args.gen, args.threads, args.repeat, args.torch_dtype)
        print(f"pytorch   prompt {ref[0]:9.1f} tok/s   generate {ref[1]:8.1f} tok/s   ({args.torch_dtype})")
        print(f"ratio     prompt {ours[0] / ref[0]:9.2f}x        generate {ours[1] / ref[1]:8.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
