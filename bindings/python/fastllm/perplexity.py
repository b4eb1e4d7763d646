"""Perplexity of a model on a text: exp(mean negative log-likelihood of each next token).

The text is split into documents at `separator` (TinyStories files separate stories with a blank
line); each document is scored on its own, starting with BOS, in windows of the context length.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass
class PerplexityResult:
    perplexity: float
    mean_nll: float  # nats per token
    n_tokens: int    # scored (predicted) tokens
    n_documents: int


def _log_softmax(logits: np.ndarray) -> np.ndarray:
    m = logits.max(axis=-1, keepdims=True)
    return logits - m - np.log(np.exp(logits - m).sum(axis=-1, keepdims=True))


def perplexity(model, text: str, separator: str = "\n\n", max_documents: int | None = None,
               n_ctx: int | None = None, **session_options) -> PerplexityResult:
    """session_options go to model.session (kv_type="q8", ...)."""
    docs = [d for d in text.split(separator) if d.strip()] if separator else [text]
    if max_documents is not None:
        docs = docs[:max_documents]
    n_ctx = min(n_ctx or model.context_length, model.context_length)
    total, count = 0.0, 0
    with model.session(n_ctx=n_ctx, **session_options) as s:
        for doc in docs:
            ids = model.tokenize(doc, add_bos=True)
            for start in range(0, len(ids) - 1, n_ctx - 1):  # windows overlap by the one token they share
                window = ids[start:start + n_ctx]
                if len(window) < 2:
                    break
                s.reset()
                logp = _log_softmax(s.eval(window, logits="all")[:-1].astype(np.float64))
                targets = np.asarray(window[1:])
                total -= float(logp[np.arange(len(targets)), targets].sum())
                count += len(targets)
    if count == 0:
        raise ValueError("the text has no tokens to score")
    return PerplexityResult(math.exp(total / count), total / count, count, len(docs))
