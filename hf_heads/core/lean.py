"""The memory-lean training loss's engine, which knows no head: chunk sizing (:func:`chunk_tokens`), the autograd
function over token chunks (:class:`ChunkedNLL`, driven by a head's chunk function), autograd from a chunk's small
outputs into its inputs and parameters (:func:`backprop`) and the checkpointed chunk map of per-token log-probs
(:func:`checkpointed_chunks`). The V-wide math a head's chunk runs by hand is in :mod:`hf_heads.core.ops`.

:meth:`OutputHead.loss` takes this path in training (``impl="auto"``: ``head.lean_loss`` on, training mode, grad
enabled) or when asked (``impl="lean"``): no ``[tokens, V]`` (or ``[tokens, K, V]``) activation is kept for backward;
tests hold every head's chunk to its plain-autograd loss.
"""

from __future__ import annotations

from typing import Callable, Dict, Optional, Tuple

import torch
from torch import nn

from . import functional

#: values in all the V-wide tensors of one chunk of the memory-lean loss (32 MiB in float32: small enough
#: for the elementwise passes to run from cache, which is faster on CPU than whole-batch passes), and the
#: fewest tokens per chunk (below that, the weight gradient's matrix product, whose inner size is the
#: chunk, loses speed: 1.2x the plain softmax's time at V = 50257 with 83-token chunks, 1.0x with 256-512)
LEAN_CHUNK_ELEMENTS = 2**23
LEAN_MIN_CHUNK = 256
#: the same on a GPU, where nothing runs from cache and every chunk costs kernel launches: 2^26 values (256 MiB in
#: float32) and at least 1024 rows (on an H100 the CPU sizes, 86-token chunks for MoS-3 and 64 for Mixtape at V = 50k,
#: left them at 4x and 9x our softmax's float32 time: docs/training_cost.md#on-a-gpu)
LEAN_CHUNK_ELEMENTS_GPU = 2**26
LEAN_MIN_CHUNK_GPU = 1024


def chunk_tokens(vocab_size: int, width: int, rows: int, device: torch.device) -> int:
    """Tokens per chunk of a lean loss over ``vocab_size`` ids: about ``LEAN_CHUNK_ELEMENTS`` values in all the V-wide
    tensors of a chunk (``width`` per token), at least ``LEAN_MIN_CHUNK`` matrix-product rows (``rows`` per token);
    ``LEAN_CHUNK_ELEMENTS_GPU`` and ``LEAN_MIN_CHUNK_GPU`` on a CUDA ``device``."""
    gpu = torch.device(device).type == "cuda"
    elements, min_rows = (LEAN_CHUNK_ELEMENTS_GPU, LEAN_MIN_CHUNK_GPU) if gpu else (LEAN_CHUNK_ELEMENTS, LEAN_MIN_CHUNK)
    return max(-(-min_rows // rows), elements // (vocab_size * width))


class ChunkedNLL(torch.autograd.Function):
    """Summed loss (and NLL) over token chunks, each chunk's gradients computed in the forward pass.

    Forward: for every chunk of ``chunk`` tokens, ``chunk_fn(hidden, target, grads, label_smoothing)`` (a head's
    :meth:`OutputHead.lean_nll_chunk`) returns the chunk's summed
    loss (label-smoothed or not), its NLL and the loss's gradient with respect to the chunk's hidden states,
    and adds the parameter gradients to float accumulators; nothing of the chunk is kept, so peak memory is one
    chunk's V-wide tensors instead of the whole batch's. Backward: the stored gradients times the incoming scalar
    gradient. No recomputation; the price is that gradients are computed even if the loss is never
    backpropagated, and no double backward.
    Dropout / gate noise draw fresh values per chunk, as they would per batch.
    """

    @staticmethod
    def forward(ctx, chunk_fn, hidden, target, chunk, label_smoothing, *params):
        want_h = hidden.requires_grad
        grad_h = torch.zeros_like(hidden) if want_h else None
        # float accumulators (float64 for float64 math) whatever the parameters' dtype
        grads = {p: torch.zeros_like(p, dtype=hidden.dtype) for p in params}
        total, total_nll = hidden.new_zeros(()), hidden.new_zeros(())  # hidden is in the compute dtype already
        for start in range(0, hidden.shape[0], chunk):
            h = hidden[start : start + chunk].detach().requires_grad_(want_h)
            loss, nll, got = chunk_fn(h, target[start : start + chunk], grads, label_smoothing)
            total += loss
            total_nll += nll
            if want_h:
                grad_h[start : start + chunk] = got
        ctx.want_h = want_h
        ctx.dtypes = [p.dtype for p in params]
        ctx.save_for_backward(*([grad_h] if want_h else []), *grads.values())
        ctx.mark_non_differentiable(total_nll)
        return total, total_nll

    @staticmethod
    def backward(ctx, grad_out, _grad_nll):
        saved = list(ctx.saved_tensors)
        grad_h = saved.pop(0) * grad_out if ctx.want_h else None
        return (None, grad_h, None, None, None, *[(g * grad_out).to(dt) for g, dt in zip(saved, ctx.dtypes)])


def _loss_and_nll(
    chunk_fn: Callable,
    h: torch.Tensor,
    t: torch.Tensor,
    valid: torch.Tensor,
    chunk: int,
    label_smoothing: float,
    params,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Summed ``(loss, nll)`` of the valid tokens by :class:`ChunkedNLL`, as ``loss_and_nll``."""
    with functional.autocast_off(h):
        everything = not functional.values_known(valid) or bool(valid.all())
        return ChunkedNLL.apply(
            chunk_fn,
            h if everything else h[valid],
            t if everything else t[valid],
            chunk,
            label_smoothing,
            *params,
        )


def backprop(
    outputs, grad_outputs, hidden: Optional[torch.Tensor], grads: Dict[nn.Parameter, torch.Tensor]
) -> Optional[torch.Tensor]:
    """Autograd from ``outputs`` (weighted by ``grad_outputs``) into ``hidden`` and the parameters of
    ``grads`` (added there); returns the gradient of ``hidden`` (None if it is None or does not require
    grad)."""
    pairs = [(o, g) for o, g in zip(outputs, grad_outputs) if o is not None and o.requires_grad]
    params = list(grads)
    want_h = hidden is not None and hidden.requires_grad
    inputs = ([hidden] if want_h else []) + params
    got = [None] * len(inputs)
    if pairs and inputs:
        got = list(torch.autograd.grad([o for o, _ in pairs], inputs, [g for _, g in pairs], allow_unused=True))
    grad_h = None
    if want_h:
        grad_h = got.pop(0)
        if grad_h is None:
            grad_h = torch.zeros_like(hidden)
    for p, g in zip(params, got):
        if g is not None:
            grads[p] += g
    return grad_h


def checkpointed_chunks(fn: Callable, hidden: torch.Tensor, target: torch.Tensor, chunk: int, *args) -> torch.Tensor:
    """``fn(hidden_rows, target_rows, *args)`` (one value per row) over chunks of ``chunk`` rows, each under
    ``torch.utils.checkpoint``: no chunk's V-wide tensors are kept for backward, which makes them again, one chunk at a
    time, with the random state of the forward (dropout and gate noise draw the same values). The lean path of
    :meth:`OutputHead.token_log_probs`."""
    from torch.utils.checkpoint import checkpoint

    parts = [
        checkpoint(fn, hidden[start : start + chunk], target[start : start + chunk], *args, use_reentrant=False)
        for start in range(0, hidden.shape[0], chunk)
    ]
    return torch.cat(parts) if parts else hidden.new_zeros(0)


def __getattr__(name: str):
    """``loss_and_nll(chunk_fn, h, t, valid, chunk, label_smoothing, params)``: the summed ``(loss, nll)`` of the
    valid tokens by :class:`ChunkedNLL`. Always eager: under torch.compile the graph breaks around this call, since
    the chunks run autograd inside a custom autograd.Function's forward, which dynamo cannot trace. Built on first
    use, because ``torch.compiler.disable`` imports dynamo, which sets ``TORCHINDUCTOR_CACHE_DIR`` in the process
    environment: ``import hf_heads`` leaves the environment as it was."""
    if name == "loss_and_nll":
        globals()[name] = torch.compiler.disable(_loss_and_nll)
        return globals()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
