"""Activation-aware int4 rounding (`convert.py --calib FILE`): input channels scaled by their
activations, then weights clipped where the activations say it pays.

An int4 group shares one scale, so a group's few large weights decide how coarsely its small ones
are rounded. The input channels that carry large activations matter most for the output; scaling
them up in the weight matrix (W[:, c] *= s_c) lets them be rounded more finely, at the cost of
the others. The layer computes the same function when the operation feeding the matrix divides
channel c by s_c, so the scales are folded into neighbouring weights and the .flm format does not
change:

    matrices (sharing an input)    their input is the output of       which absorbs 1/s
    q, k, v                        the attention RMSNorm              input_layernorm.weight
    o                              softmax(..) @ v                    v_proj rows (and bias)
    gate, up                       the MLP RMSNorm                    post_attention_layernorm.weight
    down                           silu(gate) * up                    up_proj rows (and bias)

With grouped-query attention several query heads read one value head, so the o channels of
those heads get one common scale per (kv head, dim).

The scales come from running the HF model (transformers, float32) on sample text: per decoder
layer and group, s = mean|x|^alpha (normalised so that max(s) * min(s) = 1), alpha picked from a
grid that includes 0 (no scaling) as the one with the least squared output error
|| X W^T - X diag(1/s) Q(W diag(s))^T ||^2 over a sample of the calibration rows X, Q being the
real quantize + dequantize of the dtype the DtypePolicy gives the (fused) .flm tensor. Only q4
types are searched; q8, f16 and f32 matrices are left as they are.

Then clipping: per row and group of G weights, the (scaled) weights are clipped to a fraction of
their range (1 = not clipped, down to 0.7) where that gives the group's part of the output the
least squared error over the same rows, x_g^T C x_g with C the group's input covariance. The
quantizer's own scale search minimises the error of the weights; this one weights it by the
activations. The clipped float weights go to the writer, whose quantizer is per group and
deterministic, so it rounds them exactly as they were judged here. Clipping changes the function
(a little, by design); the scaling alone does not.

Cost: one float32 forward pass of the HF model over the text (it is loaded whole), and per q4
matrix one quantize per alpha and clip ratio (SmolLM2-135M: about 5 minutes on 2 cores). Memory:
the model, plus N_SAMPLE input rows per matrix group.

    ckpt, report = calibrate(ckpt, hp, policy, "sample.txt", n_tokens=2048)
    llama.add_tensors(writer, ckpt, hp, "f32")     # the scaled tensors replace the originals
"""
from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

import quantize
from errors import ConversionError

DEFAULT_TOKENS = 2048
SEQ_LEN = 512            # tokens per calibration sequence (at most the context length)
N_SAMPLE = 512           # input rows kept per matrix group for the error search
ALPHAS = tuple(float(a) for a in np.linspace(0.0, 1.0, 11))
CLIP_RATIOS = tuple(1.0 - 0.025 * i for i in range(13))   # 1.0 .. 0.7


@dataclass
class GroupResult:
    layer: int
    name: str            # .flm tensor name of the (fused) matrix
    dtype: str
    alpha: float         # 0: left unscaled
    error: float         # squared output error on the sample rows with the chosen alpha
    error_unscaled: float
    clipped: float = 0.0  # fraction of the groups of weights that were clipped


@dataclass
class CalibrationReport:
    n_tokens: int
    n_sequences: int
    groups: list = field(default_factory=list)

    def summary(self) -> str:
        searched = [g for g in self.groups if g.error_unscaled > 0]
        scaled = [g for g in searched if g.alpha > 0]
        if not searched:
            return f"calibration: {self.n_tokens} tokens; no int4 matrix to scale"
        gain = np.mean([1 - g.error / g.error_unscaled for g in searched])
        clipped = np.mean([g.clipped for g in searched])
        return (f"calibration: {self.n_tokens} tokens in {self.n_sequences} sequences; "
                f"{len(scaled)} of {len(searched)} int4 matrices scaled (output error on the "
                f"sample {100 * gain:.1f}% lower on average), {100 * clipped:.1f}% of the weight "
                f"groups clipped")


class ScaledCheckpoint:
    """A Checkpoint whose get() returns the scaled tensors where there are some."""

    def __init__(self, ckpt, overrides: dict):
        self._ckpt = ckpt
        self.overrides = overrides

    def __getattr__(self, name):
        return getattr(self._ckpt, name)

    def get(self, name: str) -> torch.Tensor:
        t = self.overrides.get(name)
        return t if t is not None else self._ckpt.get(name)


def check_request(calib_path, policy, model_path) -> None:
    """The errors found before any work: not an HF folder, no int4 dtype, no text file."""
    model_path = Path(model_path)
    is_gguf = model_path.suffix.lower() == ".gguf"
    if not is_gguf and model_path.is_file():
        with open(model_path, "rb") as f:
            is_gguf = f.read(4) == b"GGUF"
    if is_gguf:
        raise ConversionError("calibration needs an HF checkpoint (it runs the model with "
                              "transformers); --calib cannot be used with a GGUF file")
    if not policy.default.startswith("q4"):
        raise ConversionError(f"--calib chooses scales for int4 rounding; it needs --dtype int4 or "
                              f"int4m, not {policy.default}")
    if not Path(calib_path).is_file():
        raise ConversionError(f"calibration text {calib_path} does not exist")


def read_text(path) -> list:
    """The calibration text's documents (split at blank lines)."""
    path = Path(path)
    if not path.is_file():
        raise ConversionError(f"calibration text {path} does not exist")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ConversionError(f"calibration text {path} is not UTF-8: {e}") from None
    docs = [d for d in text.split("\n\n") if d.strip()]
    if not docs:
        raise ConversionError(f"calibration text {path} is empty")
    return docs


def _load_hf(path: Path):
    try:
        import transformers
        from transformers import AutoTokenizer, LlamaForCausalLM
    except ImportError as e:
        raise ConversionError(f"calibration needs transformers: {e}") from None
    try:
        tok = AutoTokenizer.from_pretrained(str(path))
    except Exception as e:  # transformers raises many kinds
        raise ConversionError(f"calibration: cannot load the tokenizer of {path} with "
                              f"transformers: {e}") from None
    kw = {"dtype" if int(transformers.__version__.split(".")[0]) >= 5 else "torch_dtype": torch.float32}
    try:
        model = LlamaForCausalLM.from_pretrained(str(path), **kw).eval()
    except Exception as e:
        raise ConversionError(f"calibration: cannot load {path} with transformers: {e}") from None
    return model, tok


def _sequences(tok, docs, n_tokens: int, seq_len: int) -> list:
    """Token id lists of at most seq_len, n_tokens in all; long documents are cut into windows,
    each starting with the document's BOS when the tokenizer adds one."""
    seqs, total = [], 0
    bos = tok.bos_token_id
    for doc in docs:
        ids = list(tok(doc, add_special_tokens=True, verbose=False)["input_ids"])
        head = [ids[0]] if bos is not None and ids and ids[0] == bos else []
        body = ids[len(head):]
        step = seq_len - len(head)
        for start in range(0, max(len(body), 1), step):
            seq = (head + body[start:start + step])[: n_tokens - total]
            if len(seq) >= 2:
                seqs.append(seq)
                total += len(seq)
            if total >= n_tokens:
                return seqs
    return seqs


class _Inputs:
    """Per-channel sum of |x| over every row, and the rows at the sampled positions."""

    def __init__(self, keep: np.ndarray):
        self.keep = keep          # sorted global row indices to keep
        self.pos = 0
        self.abs_sum = None
        self.count = 0
        self.rows = []

    def __call__(self, module, args):
        x = args[0].detach().to(torch.float32).reshape(-1, args[0].shape[-1])
        s = x.abs().sum(dim=0, dtype=torch.float64)
        self.abs_sum = s if self.abs_sum is None else self.abs_sum + s
        n = x.shape[0]
        lo, hi = np.searchsorted(self.keep, [self.pos, self.pos + n])
        if hi > lo:
            self.rows.append(x[torch.as_tensor(self.keep[lo:hi] - self.pos)].numpy().copy())
        self.pos += n
        self.count += n

    def stats(self):
        return (self.abs_sum / self.count).numpy(), np.concatenate(self.rows, axis=0)


def _scales(stat: np.ndarray, alpha: float, tie=None) -> np.ndarray:
    """mean|x|^alpha, averaged over the heads that share a KV head when tie = (nkv, n_rep, hd),
    normalised so that max * min = 1."""
    stat = np.maximum(stat, max(float(stat.max()), 1e-30) * 1e-5)
    s = stat.astype(np.float64) ** alpha
    if tie is not None:
        nkv, n_rep, hd = tie
        s = np.broadcast_to(s.reshape(nkv, n_rep, hd).mean(axis=1, keepdims=True),
                            (nkv, n_rep, hd)).reshape(-1)
    return (s / np.sqrt(s.max() * s.min())).astype(np.float32)


def _search(stat, x, w, dtype, alphas, tie=None):
    """(alpha, scales, error, error unscaled) minimising the output error over the rows x."""
    ref = x @ w.T
    best = None
    err0 = None
    for alpha in sorted(set(alphas) | {0.0}):
        s = np.ones_like(stat, dtype=np.float32) if alpha == 0 else _scales(stat, alpha, tie)
        wq = quantize.dequantize(quantize.quantize(w * s, dtype), dtype, w.shape)
        err = float(np.square(ref - (x / s) @ wq.T, dtype=np.float64).sum())
        if alpha == 0:
            err0 = err
        if best is None or err < best[2]:
            best = (alpha, s, err)
    return best + (err0,)


def _clip_search(w, x, dtype, ratios):
    """Per (row, group), the clipping of the weights to ratio * their range that gives the least
    output error sum((x_g . (w_g - Q(w_g)))^2) over the rows x (1.0, no clipping, is always a
    candidate). Returns (the clipped weights, the fraction of groups clipped)."""
    _, group, _, has_min = quantize.QUANT[dtype]
    n, k = w.shape
    xg = x.reshape(x.shape[0], k // group, group).astype(np.float64)
    cov = np.einsum("sgi,sgj->gij", xg, xg)
    g = w.reshape(n, k // group, group)
    if has_min:
        lo, hi = g.min(axis=2, keepdims=True), g.max(axis=2, keepdims=True)
        mid, half = (lo + hi) / 2, (hi - lo) / 2
    else:
        mid, half = 0.0, np.abs(g).max(axis=2, keepdims=True)
    best = best_err = None
    for r in sorted(set(ratios) | {1.0}, reverse=True):
        gc = np.clip(g, mid - r * half, mid + r * half).astype(np.float32)
        ratio = np.full(g.shape[:2], r)
        e = (g - quantize.dequantize(quantize.quantize(gc.reshape(n, k), dtype), dtype, (n, k))
             .reshape(g.shape)).astype(np.float64)
        err = np.einsum("rgi,gij,rgj->rg", e, cov, e)
        if best is None:
            best, best_err, best_ratio = gc, err, ratio
        else:
            better = err < best_err
            best = np.where(better[..., None], gc, best)
            best_err = np.where(better, err, best_err)
            best_ratio = np.where(better, ratio, best_ratio)
    return best.reshape(n, k), float((best_ratio < 1).mean())


def calibrate(ckpt, hp, policy, text_path, n_tokens: int = DEFAULT_TOKENS, alphas=ALPHAS,
              n_sample: int = N_SAMPLE, seq_len: int = SEQ_LEN, progress: bool = False,
              clip_ratios=CLIP_RATIOS):
    """Returns (a ScaledCheckpoint over ckpt, CalibrationReport). policy: the quantize.DtypePolicy
    the writer will use (it decides which matrices are q4 and how they are rounded); alphas: the
    scaling exponents tried (0 is always added); clip_ratios: () for no clipping."""
    import llama  # here, not at the top: llama imports nothing from this module, keep it so

    if n_tokens < 2:
        raise ConversionError(f"--calib_tokens must be at least 2, got {n_tokens}")
    docs = read_text(text_path)
    names = llama._TensorMap(ckpt)
    H, I = hp.hidden_size, hp.intermediate_size
    nh, nkv, hd = hp.num_heads, hp.num_kv_heads, hp.head_dim
    groups = []  # (layer, kind, .flm name, dtype)
    for i in range(hp.num_layers):
        for kind, name, shape in (("qkv", "attn_qkv", ((nh + 2 * nkv) * hd, H)),
                                  ("o", "attn_output", (H, nh * hd)),
                                  ("gate_up", "ffn_gate_up", (2 * I, H)),
                                  ("down", "ffn_down", (H, I))):
            dtype = policy(f"blk.{i}.{name}.weight", shape)
            if dtype.startswith("q4"):
                groups.append((i, kind, f"blk.{i}.{name}.weight", dtype))
    if not groups:
        raise ConversionError("--calib: no matrix of this model gets an int4 dtype, nothing to "
                              "calibrate")

    model, tok = _load_hf(ckpt.path)
    seqs = _sequences(tok, docs, n_tokens, min(seq_len, hp.context_length))
    total = sum(len(s) for s in seqs)
    if total == 0:
        raise ConversionError(f"calibration text {text_path} gives no tokens")
    if progress:
        print(f"calibration: running {total} tokens ({len(seqs)} sequences)", file=sys.stderr)
    keep = np.sort(np.random.default_rng(0).choice(total, min(total, n_sample), replace=False))
    layers = model.model.layers
    probes, hooks = {}, []
    for i, kind, _, _ in groups:
        attn, mlp = layers[i].self_attn, layers[i].mlp
        module = {"qkv": attn.q_proj, "o": attn.o_proj, "gate_up": mlp.gate_proj,
                  "down": mlp.down_proj}[kind]
        probes[i, kind] = _Inputs(keep)
        hooks.append(module.register_forward_pre_hook(probes[i, kind]))
    try:
        with torch.no_grad():
            for seq in seqs:
                model(input_ids=torch.tensor([seq]), use_cache=False)
    finally:
        for h in hooks:
            h.remove()

    report = CalibrationReport(total, len(seqs))
    work = {}  # HF name (without prefix) -> float32 tensor being scaled

    def param(name):
        if name not in work:
            work[name] = model.get_parameter("model." + name).detach().to(torch.float32).clone()
        return work[name]

    searched = []
    bar = None
    if progress:
        from tqdm import tqdm
        bar = tqdm(total=len(groups) * (2 if clip_ratios else 1), desc="calibration search",
                   unit="matrix", file=sys.stderr)
    try:
        for i, kind, flm_name, dtype in groups:
            p = f"layers.{i}."
            a, m = p + "self_attn.", p + "mlp."
            mats = {"qkv": [a + "q_proj", a + "k_proj", a + "v_proj"], "o": [a + "o_proj"],
                    "gate_up": [m + "gate_proj", m + "up_proj"], "down": [m + "down_proj"]}[kind]
            w = torch.cat([model.get_parameter("model." + n + ".weight").detach().to(torch.float32)
                           for n in mats], dim=0).numpy()
            stat, x = probes[i, kind].stats()
            tie = (nkv, nh // nkv, hd) if kind == "o" else None
            alpha, s, err, err0 = _search(stat, x, w, dtype, alphas, tie)
            report.groups.append(GroupResult(i, flm_name, dtype, alpha, err, err0))
            searched.append((mats, x / s, dtype, report.groups[-1]))
            if bar is not None:
                bar.update(1)
            if alpha == 0:
                continue
            st = torch.from_numpy(s)
            for n in mats:  # columns *= s
                param(n + ".weight").mul_(st)
            if kind in ("qkv", "gate_up"):  # the RMSNorm before them divides
                norm = p + ("input_layernorm" if kind == "qkv" else "post_attention_layernorm")
                param(norm + ".weight").div_(st)
            else:  # the rows (and bias) of the matrix producing their input divide
                src = a + "v_proj" if kind == "o" else m + "up_proj"
                rows = st.reshape(nkv, nh // nkv, hd)[:, 0, :].reshape(-1) if kind == "o" else st
                param(src + ".weight").div_(rows[:, None])
                if names.has(src + ".bias"):
                    param(src + ".bias").div_(rows)
        # clipping, on the final weights (v and up rows have their 1/s by now) and inputs
        for mats, x, dtype, result in searched if clip_ratios else ():
            ws = [param(n + ".weight") for n in mats]
            wc, result.clipped = _clip_search(torch.cat(ws, dim=0).numpy(), x, dtype, clip_ratios)
            for n, part in zip(mats, torch.split(torch.from_numpy(wc), [t.shape[0] for t in ws])):
                work[n + ".weight"] = part.clone()
            if bar is not None:
                bar.update(1)
    finally:
        if bar is not None:
            bar.close()
    if progress:
        print(report.summary(), file=sys.stderr)
    overrides = {names.full(n): t for n, t in work.items()}
    return ScaledCheckpoint(ckpt, overrides), report
