"""Decoding through a head's fast path. Inside :func:`fast_decoding`, a head's forward without gradients returns the
log-probs of its :meth:`~hf_heads.core.interface.OutputHead.topk` at the ``k`` ids it picks and ``-inf`` at every
other id, ``[..., V]`` as before, so a decoding loop that reads the forward's output (transformers' ``generate``, greedy
or top-k sampling with ``top_k <= k``; a loop of one's own) runs the head's fast search (SVD-softmax's preview,
adaptive sampling's bandit, class_softmax's class search, DS-Softmax's expert) instead of the full distribution.

Where the head's top-k is exact, greedy output and top-k sampling (same seed) are the full softmax's; where it
approximates, they are the fast head's. What needs the whole distribution (perplexity, top-p or min-p sampling, beam
search's scores, a repetition penalty that can move an id into the top k, ``min_new_tokens`` with ``k = 1``) runs
outside the context. A head without a fast path gives its full distribution's top k (no cheaper)."""

from __future__ import annotations

import contextlib
from typing import Iterator

from torch import nn

from .config import check_int
from .interface import OutputHead


@contextlib.contextmanager
def fast_decoding(module: nn.Module, k: int = 1) -> Iterator[nn.Module]:
    """Within the block, every head in ``module`` (a head, an HF model, any ``nn.Module`` holding heads) answers a
    forward without gradients with its top-``k`` log-probs and ``-inf`` elsewhere; each head's setting is put back
    after. ``k = 1`` serves greedy decoding; top-k sampling needs ``k >= top_k``. Yields ``module``."""
    heads = [m for m in module.modules() if isinstance(m, OutputHead)]
    if not heads:
        raise ValueError(f"fast_decoding: {type(module).__name__} holds no softmax-heads head")
    check_int("fast_decoding", "k", k, 1, min(h.config.vocab_size for h in heads))
    before = [h.decode_topk for h in heads]
    for head in heads:
        head.decode_topk = k
    try:
        yield module
    finally:
        for head, k_before in zip(heads, before):
            head.decode_topk = k_before
