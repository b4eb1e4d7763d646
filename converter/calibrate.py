"""Calibrated rounding (`convert.py --calib FILE`, int8 / int4 / int4m): input channels scaled by
their activations, then every quantized matrix rounded by GPTQ on the activations' statistics.

The model is run (transformers, float32) on sample text; two things use what it sees.

Scaling (AWQ-style). A group of weights shares one scale, so its few large weights decide how
coarsely its small ones are rounded. The input channels that carry large activations matter most
for the output; scaling them up in the weight matrix (W[:, c] *= s_c) lets them be rounded more
finely, at the cost of the others. The layer computes the same function when the operation
feeding the matrix divides channel c by s_c, so the scales are folded into neighbouring weights and
the .flm format does not change:

    matrices (sharing an input)    their input is the output of       which absorbs 1/s
    q, k, v                        the attention RMSNorm              input_layernorm.weight
    o                              softmax(..) @ v                    the v rows (and bias)
    gate, up                       the MLP RMSNorm                    post_attention_layernorm.weight
    down                           silu(gate) * up                    the up rows (and bias)

With grouped-query attention several query heads read one value head, so the o channels of those
heads get one common scale per (kv head, dim). Per decoder layer and matrix group, s =
mean|x|^alpha (normalised so that max(s) * min(s) = 1), alpha picked from a grid that includes 0
(no scaling) as the one with the least squared output error || X W^T - X diag(1/s) Q(W diag(s))^T ||^2
over a sample of the calibration rows X (and of at most SEARCH_ROWS rows of W), Q being the real
quantize + dequantize of the dtype the DtypePolicy gives the (fused) .flm tensor.

Rounding (GPTQ, Frantar et al. 2022). Rounding each weight to its nearest code ignores that the
errors of one row add up in the output x . (w - q). GPTQ rounds a row's columns one at a time and
moves each one's error onto the columns not rounded yet, in the proportions that cancel it best for
the inputs seen (through the inverse of their Gram matrix X^T X), so the whole row's output error
is what is minimised. A group's scales are chosen by the quantizer's usual search when its first
column is reached. Layers are rounded in order, each on the inputs that the layers before it give
once rounded. The rounded weights go to the writer with their grid (quantize.OnGrid), so it stores
exactly those codes.

Cost: one float32 forward pass of the HF model over the text for the statistics, two more, a layer
at a time, for GPTQ, per matrix one quantize per alpha and the column-by-column rounding (2048
tokens on 2 cores: SmolLM2-135M about 2 minutes, a TinyLlama-1.1B shape 20). Memory: the float32
model (scaled and rounded in place), N_SAMPLE input rows per matrix group, one layer's Gram
matrices (the 1.1B shape: 7.3 GB for the whole conversion).

    ckpt, report = calibrate(ckpt, hp, policy, "sample.txt", n_tokens=2048)
    family.add_tensors(writer, ckpt, hp, "f32")    # the scaled, rounded tensors replace the originals

Every family works the same way: which HF matrices are fused into each .flm matrix, and which
norm or rows absorb 1/s, come from the family's layer_tensors (Phi-3's v rows are the last rows
of its fused qkv_proj, its up rows the second half of gate_up_proj).
"""
from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from . import quantize
from .errors import ConversionError

DEFAULT_TOKENS = 2048
SEQ_LEN = 512            # tokens per calibration sequence (at most the context length)
N_SAMPLE = 512           # input rows kept per matrix group for the error search
SEARCH_ROWS = 1024       # weight rows the error search rounds per alpha
ALPHAS = tuple(float(a) for a in np.linspace(0.0, 1.0, 11))
# GPTQ adds damp x mean(diag(X^T X)) to the diagonal (regularises the inverse: the corrections fit
# the sample less closely). Per bits per code, measured on stories260K (tests/test_calibration.py).
GPTQ_DAMP = {8: 0.03, 6: 0.03, 4: 0.1}  # 6 bits: taken from 8 (no model here has a q6 matrix by default)


@dataclass
class GroupResult:
    layer: int
    name: str            # .flm tensor name of the (fused) matrix
    dtype: str
    alpha: float         # 0: left unscaled
    error: float         # squared output error on the sample rows with the chosen alpha
    error_unscaled: float


@dataclass
class CalibrationReport:
    n_tokens: int
    n_sequences: int
    groups: list = field(default_factory=list)

    def summary(self) -> str:
        searched = [g for g in self.groups if g.error_unscaled > 0]
        scaled = [g for g in searched if g.alpha > 0]
        if not searched:
            return f"calibration: {self.n_tokens} tokens; no quantized matrix to scale"
        gain = np.mean([1 - g.error / g.error_unscaled for g in searched])
        return (f"calibration: {self.n_tokens} tokens in {self.n_sequences} sequences; "
                f"{len(scaled)} of {len(searched)} quantized matrices scaled (output error on the "
                f"sample {100 * gain:.1f}% lower on average); all rounded by GPTQ")


class ScaledCheckpoint:
    """A Checkpoint whose get() returns the scaled (and rounded) tensors where there are some, and
    whose grid() gives the scales the rounded ones lie on."""

    def __init__(self, ckpt, overrides: dict, grids: dict | None = None):
        self._ckpt = ckpt
        self.overrides = overrides
        self.grids = grids or {}

    def __getattr__(self, name):
        return getattr(self._ckpt, name)

    def get(self, name: str) -> torch.Tensor:
        t = self.overrides.get(name)
        return t if t is not None else self._ckpt.get(name)

    def grid(self, name: str):
        return self.grids.get(name)


def check_request(calib_path, policy, model_path) -> None:
    """The errors found before any work: not an HF folder, no quantized dtype, no text file."""
    model_path = Path(model_path)
    is_gguf = model_path.suffix.lower() == ".gguf"
    if not is_gguf and model_path.is_file():
        with open(model_path, "rb") as f:
            is_gguf = f.read(4) == b"GGUF"
    if is_gguf:
        raise ConversionError("calibration needs an HF checkpoint (it runs the model with "
                              "transformers); --calib cannot be used with a GGUF file")
    if policy.default not in quantize.QUANT:
        raise ConversionError(f"--calib rounds quantized weights; it needs a quantized --dtype (int8, int4, "
                              f"int4m, a K format or preset such as q4_k_m), not {policy.default}")
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
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError as e:
        raise ConversionError(f"calibration needs transformers: {e}") from None
    try:
        tok = AutoTokenizer.from_pretrained(str(path))
    except Exception as e:  # transformers raises many kinds
        raise ConversionError(f"calibration: cannot load the tokenizer of {path} with "
                              f"transformers: {e}") from None
    kw = {"dtype" if int(transformers.__version__.split(".")[0]) >= 5 else "torch_dtype": torch.float32}
    try:
        model = AutoModelForCausalLM.from_pretrained(str(path), **kw).eval()
    except Exception as e:
        raise ConversionError(f"calibration: cannot load {path} with transformers: {e}") from None
    return model, tok


@dataclass
class _Group:
    """A quantized .flm matrix of one decoder layer and where its scaling goes (HF names without
    the model. prefix)."""
    layer: int
    kind: str            # qkv, o, gate_up, down
    name: str            # .flm tensor name
    dtype: str
    mats: list           # the HF matrices fused into it, in row order (names without .weight)
    norm: str | None     # qkv, gate_up: the RMSNorm weight that divides by s
    rows: list           # o, down: [(HF matrix, first row, end row)] producing its input
    norm_shift: float = 0.0  # the norm scales by shift + weight (Gemma: 1 + w)


_KINDS = (("qkv", "attn_qkv"), ("o", "attn_output"), ("gate_up", "ffn_gate_up"), ("down", "ffn_down"))


def _row_range(spec, start: int, end: int) -> list:
    """Rows [start, end) of a fused .flm matrix as [(HF matrix, first, end)] of its parts."""
    out, r0 = [], 0
    for name, shape in spec.parts:
        r1 = r0 + shape[0]
        if r1 > start and r0 < end:
            out.append((name[: -len(".weight")], max(start, r0) - r0, min(end, r1) - r0))
        r0 = r1
    return out


def _groups(family, hp, policy) -> list:
    """The quantized matrices of every layer (the ones the policy gives a quantized dtype)."""
    q, kv, I = hp.num_heads * hp.head_dim, hp.num_kv_heads * hp.head_dim, hp.intermediate_size
    groups = []
    for i in range(hp.num_layers):
        specs = {s.name: s for s in family.layer_tensors(hp, i)}
        b = f"blk.{i}."
        for kind, flm in _KINDS:
            spec = specs[b + flm + ".weight"]
            shape = (sum(s[0] for _, s in spec.parts), spec.parts[0][1][1])
            dtype = policy(spec.name, shape)
            if dtype not in quantize.QUANT:
                continue
            norm, rows, shift = None, [], 0.0
            if kind in ("qkv", "gate_up"):
                ns = specs[b + ("attn_norm.weight" if kind == "qkv" else "ffn_norm.weight")]
                norm, shift = ns.parts[0][0], ns.shift
            elif kind == "o":  # the v rows of attn_qkv
                rows = _row_range(specs[b + "attn_qkv.weight"], q + kv, q + 2 * kv)
            else:  # the up rows of ffn_gate_up
                rows = _row_range(specs[b + "ffn_gate_up.weight"], I, 2 * I)
            groups.append(_Group(i, kind, spec.name, dtype,
                                 [n[: -len(".weight")] for n, _ in spec.parts], norm, rows, shift))
    return groups


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
    """(alpha, scales, error, error unscaled) minimising the output error over the rows x, judged
    on at most SEARCH_ROWS rows of w (every k-th: each row is rounded on its own, so a sample of
    them estimates the whole)."""
    w = w[:: -(-w.shape[0] // SEARCH_ROWS)]
    ref = x @ w.T
    best = None
    err0 = None
    for alpha in sorted(set(alphas) | {0.0}):
        s = np.ones_like(stat, dtype=np.float32) if alpha == 0 else _scales(stat, alpha, tie)
        wq = quantize.round_trip(w * s, dtype)
        err = float(np.square(ref - (x / s) @ wq.T, dtype=np.float64).sum())
        if alpha == 0:
            err0 = err
        if best is None or err < best[2]:
            best = (alpha, s, err)
    return best + (err0,)


def gptq(w: np.ndarray, xtx: np.ndarray, dtype: str, damp: float | None = None, block: int = 128):
    """GPTQ rounding of w [N, K] for inputs with Gram matrix xtx = X^T X [K, K]: columns are
    rounded left to right, and each one's rounding error is spread over the columns not rounded
    yet, weighted by the inverse of xtx, so that X W^T changes as little as it can (Frantar et
    al., 2022; the columns of a block are updated one by one, the rest once per block). A group's
    scales come from the quantizer's own search when its first column is reached, on the weights
    as updated by then. Returns (weights on the grid [N, K] float32, quantize.Grid)."""
    _, group, bits, has_min = quantize.QUANT[dtype]
    damp = GPTQ_DAMP[bits] if damp is None else damp
    n, k = w.shape
    k_format = dtype in quantize.K_FORMATS
    if k_format:  # a super-block's grid is searched at its first column, on its current weights
        block = quantize.SUPER
        importance = np.diagonal(xtx).astype(np.float32) / max(float(np.diagonal(xtx).mean()), 1e-30)
        k_parts = []
    W = torch.from_numpy(np.array(w, dtype=np.float64))
    H = torch.from_numpy(np.array(xtx, dtype=np.float64))
    dead = torch.diagonal(H) == 0  # inputs always 0 in the sample: rounded plainly, nothing moved
    H[dead, dead] = 1
    H += damp * torch.diagonal(H).mean() * torch.eye(k, dtype=H.dtype)
    Hinv = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(H)), upper=True)
    Q = torch.zeros_like(W)
    scale = np.zeros((n, k // group), dtype=np.float16)
    mins = np.zeros_like(scale) if has_min else None
    for b0 in range(0, k, block):
        b1 = min(b0 + block, k)
        Wb, Eb, Hb = W[:, b0:b1].clone(), torch.zeros(n, b1 - b0, dtype=W.dtype), Hinv[b0:b1, b0:b1]
        for j in range(b1 - b0):
            c = b0 + j
            if k_format and c % quantize.SUPER == 0:  # weighted by the inputs' mean square too
                width = min(quantize.SUPER, k - c)
                cur = Wb[:, j:j + width].to(torch.float32).numpy().reshape(n, width // group, group)
                sgrid = quantize.choose_grid(cur, dtype, importance[c:c + width].reshape(width // group, group))
                k_parts.append(sgrid.k)
            if k_format and c % group == 0:
                at = slice((c % quantize.SUPER) // group, (c % quantize.SUPER) // group + 1)
                grid = quantize.Grid(sgrid.scale[:, at], None if sgrid.mins is None else sgrid.mins[:, at])
            elif c % group == 0:  # this group's grid, from its (partly updated) weights
                cur = torch.cat([Wb[:, j:], W[:, b1:]], dim=1)[:, :group].to(torch.float32).numpy()
                grid = quantize.choose_grid(cur[:, None, :], dtype)  # [n, 1]: one group per row
                scale[:, c // group] = grid.scale[:, 0]
                if has_min:
                    mins[:, c // group] = grid.mins[:, 0]
            col = Wb[:, j]
            code = quantize.round_to_grid(col.to(torch.float32).numpy()[:, None, None], grid, dtype)
            q = torch.from_numpy(quantize.from_codes(code, grid, dtype)[:, 0, 0]).to(W.dtype)
            Q[:, c] = q
            err = (col - q) / Hb[j, j]
            Wb[:, j:] -= torch.outer(err, Hb[j, j:])
            Eb[:, j] = err
        W[:, b1:] -= Eb @ Hinv[b0:b1, b1:]
    if k_format:
        return Q.to(torch.float32).numpy(), quantize.Grid.of_k(quantize.KScales.concat(k_parts, axis=1))
    return Q.to(torch.float32).numpy(), quantize.Grid(scale, mins)


def calibrate(ckpt, hp, policy, text_path, n_tokens: int = DEFAULT_TOKENS, alphas=ALPHAS,
              n_sample: int = N_SAMPLE, seq_len: int = SEQ_LEN, progress: bool = False):
    """Returns (a ScaledCheckpoint over ckpt, CalibrationReport). policy: the quantize.DtypePolicy
    the writer will use (it decides which matrices are quantized, and to what); alphas: the
    scaling exponents tried (0 is always added)."""
    from .families import FAMILIES, common  # here: the families import nothing from this module

    if n_tokens < 2:
        raise ConversionError(f"--calib_tokens must be at least 2, got {n_tokens}")
    docs = read_text(text_path)
    names = common.TensorMap(ckpt, hp.arch)
    if names.prefix == "language_model.model.":  # transformers names its parameters otherwise
        raise ConversionError(f"--calib: {ckpt.path} is a multimodal checkpoint; calibration needs a "
                              f"text-only one")
    nh, nkv, hd = hp.num_heads, hp.num_kv_heads, hp.head_dim
    groups = _groups(FAMILIES[hp.arch], hp, policy)
    if not groups:
        raise ConversionError("--calib: no matrix of this model gets a quantized dtype, nothing "
                              "to calibrate")

    model, tok = _load_hf(ckpt.path)
    seqs = _sequences(tok, docs, n_tokens, min(seq_len, hp.context_length))
    total = sum(len(s) for s in seqs)
    if total == 0:
        raise ConversionError(f"calibration text {text_path} gives no tokens")
    if progress:
        print(f"calibration: running {total} tokens ({len(seqs)} sequences)", file=sys.stderr)
    keep = np.sort(np.random.default_rng(0).choice(total, min(total, n_sample), replace=False))
    probes, hooks = {}, []
    for g in groups:
        probes[g.layer, g.kind] = _Inputs(keep)
        hooks.append(_input_module(model, g).register_forward_pre_hook(probes[g.layer, g.kind]))
    try:
        with torch.no_grad():
            for seq in seqs:
                model(input_ids=torch.tensor([seq]), use_cache=False)
    finally:
        for h in hooks:
            h.remove()

    report = CalibrationReport(total, len(seqs))
    # HF name (without prefix) -> the model's own float32 parameter, scaled in place: no search
    # below reads a parameter that an earlier group's scaling changed (a layer's groups scale their
    # own columns, and only later groups' inputs), and the statistics were taken already.
    work = {}

    def param(name):
        if name not in work:
            work[name] = model.get_parameter("model." + name).detach()
        return work[name]

    bar = None
    if progress:
        from tqdm import tqdm
        bar = tqdm(total=len(groups), desc="calibration: scaling", unit="matrix", file=sys.stderr)
    try:
        for g in groups:
            w = torch.cat([model.get_parameter("model." + n + ".weight").detach().to(torch.float32)
                           for n in g.mats], dim=0).numpy()
            stat, x = probes[g.layer, g.kind].stats()
            tie = (nkv, nh // nkv, hd) if g.kind == "o" else None
            alpha, s, err, err0 = _search(stat, x, w, g.dtype, alphas, tie)
            report.groups.append(GroupResult(g.layer, g.name, g.dtype, alpha, err, err0))
            if bar is not None:
                bar.update(1)
            if alpha == 0:
                continue
            st = torch.from_numpy(s)
            for n in g.mats:  # columns *= s
                param(n + ".weight").mul_(st)
            if g.norm is not None:  # the RMSNorm before them divides (Gemma's whole 1 + w)
                param(g.norm).add_(g.norm_shift).div_(st).sub_(g.norm_shift)
            else:  # the rows (and bias) of the matrix producing their input divide
                rows = st.reshape(nkv, nh // nkv, hd)[:, 0, :].reshape(-1) if g.kind == "o" else st
                k = 0
                for src, r0, r1 in g.rows:
                    part = rows[k:k + r1 - r0]
                    param(src + ".weight")[r0:r1].div_(part[:, None])
                    if names.has(src + ".bias"):
                        param(src + ".bias")[r0:r1].div_(part)
                    k += r1 - r0
    finally:
        if bar is not None:
            bar.close()
    grids = {}
    _gptq_layers(model, seqs, groups, work, grids, progress)
    if progress:
        print(report.summary(), file=sys.stderr)
    overrides = {names.full(n): t for n, t in work.items()}
    return ScaledCheckpoint(ckpt, overrides, {names.full(n): g for n, g in grids.items()}), report


class _Stop(Exception):
    pass


def _input_module(model, group: _Group):
    """The (first) HF module that reads the input of the group's matrices."""
    return model.get_submodule("model." + group.mats[0])


def _gptq_layers(model, seqs, groups, work, grids, progress):
    """GPTQ-rounds the matrices of groups, layer after layer: each layer's inputs come from the
    layers before it as rounded (so it corrects their error too). The model's weights (already
    scaled) are replaced by the rounded ones, which work then holds too, and their grids go to
    grids (HF name -> quantize.Grid)."""
    layers = model.model.layers
    with torch.no_grad():
        inputs = []  # per sequence, the (args, kwargs) the first layer is called with

        def grab(module, args, kwargs):
            inputs.append((args, kwargs))
            raise _Stop

        hook = layers[0].register_forward_pre_hook(grab, with_kwargs=True)
        try:
            for seq in seqs:
                try:
                    model(input_ids=torch.tensor([seq]), use_cache=False)
                except _Stop:
                    pass
        finally:
            hook.remove()
        by_layer = {}
        for g in groups:
            by_layer.setdefault(g.layer, []).append(g)
        bar = None
        if progress:
            from tqdm import tqdm
            bar = tqdm(total=len(groups), desc="GPTQ rounding", unit="matrix", file=sys.stderr)
        try:
            last = max(by_layer)
            for i in range(last + 1):
                layer = layers[i]
                xtx, hooks = {}, []
                for g in by_layer.get(i, ()):
                    def gram(module, args, kind=g.kind):
                        x = args[0].reshape(-1, args[0].shape[-1]).to(torch.float64)
                        xtx[kind] = xtx.get(kind, 0) + x.T @ x

                    hooks.append(_input_module(model, g).register_forward_pre_hook(gram))
                try:
                    for args, kwargs in inputs:
                        layer(*args, **kwargs)
                finally:
                    for h in hooks:
                        h.remove()
                for g in by_layer.get(i, ()):
                    params = [model.get_parameter("model." + n + ".weight") for n in g.mats]
                    q, grid = gptq(torch.cat(list(params), dim=0).numpy(), xtx[g.kind].numpy(), g.dtype)
                    r0 = 0
                    for n, p in zip(g.mats, params):
                        r1 = r0 + p.shape[0]
                        p.copy_(torch.from_numpy(q[r0:r1]))
                        work[n + ".weight"] = p.detach()
                        grids[n + ".weight"] = grid.rows(r0, r1)
                        r0 = r1
                    if bar is not None:
                        bar.update(1)
                if i < last:  # the last rounded layer's outputs feed nothing rounded
                    inputs = [_next_inputs(layer, args, kwargs) for args, kwargs in inputs]
        finally:
            if bar is not None:
                bar.close()


def _next_inputs(layer, args, kwargs):
    """The call of the next layer: this one's output in place of its hidden states."""
    out = layer(*args, **kwargs)
    h = out[0] if isinstance(out, tuple) else out
    if args:
        return (h,) + tuple(args[1:]), kwargs
    return args, {**kwargs, "hidden_states": h}
