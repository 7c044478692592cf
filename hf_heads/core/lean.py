"""The memory-lean training loss, the whole engine: chunk sizing, the autograd function over token chunks, and the
pieces a head's :meth:`OutputHead.lean_nll_chunk` calls besides the ops of :mod:`hf_heads.core.ops` (:func:`backprop`,
autograd for the rest; :func:`autograd_chunk`, the default that runs autograd on the head's reference math).

:meth:`OutputHead.loss` takes this path in training (``head.lean_loss`` on, grad enabled): no ``[tokens, V]`` (or
``[tokens, K, V]``) activation is kept for backward; tests hold every head's chunk to its plain-autograd loss.
"""

from __future__ import annotations

from typing import Dict, Optional, Tuple

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


def chunk_tokens(head) -> int:
    """Tokens per chunk of ``head``'s lean loss: about ``LEAN_CHUNK_ELEMENTS`` values in all the V-wide tensors of a
    chunk (``head.lean_width`` per token), at least ``LEAN_MIN_CHUNK`` matrix-product rows (``head.lean_rows`` per
    token); ``LEAN_CHUNK_ELEMENTS_GPU`` and ``LEAN_MIN_CHUNK_GPU`` when the head is on a CUDA device."""
    gpu = next(head.parameters()).device.type == "cuda"
    elements, rows = (LEAN_CHUNK_ELEMENTS_GPU, LEAN_MIN_CHUNK_GPU) if gpu else (LEAN_CHUNK_ELEMENTS, LEAN_MIN_CHUNK)
    return max(-(-rows // head.lean_rows), elements // (head.config.vocab_size * head.lean_width))


def autograd_chunk(
    head,
    hidden: torch.Tensor,
    target: torch.Tensor,
    grads: Dict[nn.Parameter, torch.Tensor],
    label_smoothing: float = 0.0,
) -> Tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
    """The default chunk: autograd on the head's reference math (:meth:`OutputHead.nll_2d`, or its log-probs with
    label smoothing); see :meth:`OutputHead.lean_nll_chunk` for the contract."""
    with torch.enable_grad():
        loss, nll = head._loss_and_nll_2d(hidden, target, label_smoothing)
        loss = loss.sum()
    return loss.detach(), nll.sum().detach(), backprop([loss], [torch.ones_like(loss)], hidden, grads)


class ChunkedNLL(torch.autograd.Function):
    """Summed loss (and NLL) of ``head`` over token chunks, each chunk's gradients computed in the forward pass.

    Forward: for every chunk of ``chunk`` tokens, :meth:`OutputHead.lean_nll_chunk` returns the chunk's summed
    loss (label-smoothed or not), its NLL and the loss's gradient with respect to the chunk's hidden states,
    and adds the parameter gradients to float accumulators; nothing of the chunk is kept, so peak memory is one
    chunk's V-wide tensors instead of the whole batch's. Backward: the stored gradients times the incoming scalar
    gradient. No recomputation; the price is that gradients are computed even if the loss is never
    backpropagated, and no double backward.
    Dropout / gate noise draw fresh values per chunk, as they would per batch.
    """

    @staticmethod
    def forward(ctx, head, hidden, target, chunk, label_smoothing, *params):
        want_h = hidden.requires_grad
        grad_h = torch.zeros_like(hidden) if want_h else None
        # float accumulators (float64 for float64 math) whatever the parameters' dtype
        grads = {p: torch.zeros_like(p, dtype=hidden.dtype) for p in params}
        total, total_nll = hidden.new_zeros(()), hidden.new_zeros(())  # hidden is in the compute dtype already
        for start in range(0, hidden.shape[0], chunk):
            h = hidden[start : start + chunk].detach().requires_grad_(want_h)
            loss, nll, got = head.lean_nll_chunk(h, target[start : start + chunk], grads, label_smoothing)
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
    head, h: torch.Tensor, t: torch.Tensor, valid: torch.Tensor, label_smoothing: float, params
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Summed ``(loss, nll)`` of ``head`` on the valid tokens by :class:`ChunkedNLL`, as ``loss_and_nll``."""
    with functional.autocast_off(h):
        everything = not functional.values_known(valid) or bool(valid.all())
        return ChunkedNLL.apply(
            head,
            h if everything else h[valid],
            t if everything else t[valid],
            head.lean_chunk_tokens(),
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


def _target_log_probs_2d(head, hidden: torch.Tensor, target: torch.Tensor, temperature: float) -> torch.Tensor:
    """``log p(target)`` per row, the head's reference math; at ``temperature`` T the distribution is ``p^(1/T)``
    renormalised (``log_softmax(log p / T)``: the head's log-probs stand where a softmax's logits would)."""
    if temperature == 1.0:
        return -head.nll_2d(hidden, target)
    lp = torch.log_softmax(head.log_probs_2d(hidden) / temperature, dim=-1)
    return lp.gather(1, target[:, None]).squeeze(1)


def token_log_probs(head, hidden: torch.Tensor, target: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """``log p(target)`` of every row of ``hidden`` ``[N, d1]`` (valid targets only), differentiable, for callers that
    weight tokens themselves (TRL's losses). In training (:meth:`OutputHead.lean_loss_active`) the rows go in chunks
    of :func:`chunk_tokens`, each under ``torch.utils.checkpoint``: no chunk's V-wide tensors are kept for backward,
    which makes them again, one chunk at a time, with the random state of the forward (dropout and gate noise draw
    the same values). A head that opts out of the lean loss (``lean_loss = False``: DS-Softmax, whose training
    forward records routing statistics, which a recomputation would count twice) takes one plain pass instead."""
    from torch.utils.checkpoint import checkpoint

    if not head.lean_loss_active():
        return _target_log_probs_2d(head, hidden, target, temperature)
    chunk = head.lean_chunk_tokens()
    parts = [
        checkpoint(
            _target_log_probs_2d,
            head,
            hidden[start : start + chunk],
            target[start : start + chunk],
            temperature,
            use_reentrant=False,
        )
        for start in range(0, hidden.shape[0], chunk)
    ]
    return torch.cat(parts) if parts else hidden.new_zeros(0)


def __getattr__(name: str):
    """``loss_and_nll(head, h, t, valid, label_smoothing, params)``: the summed ``(loss, nll)`` of ``head`` on the
    valid tokens by :class:`ChunkedNLL`. Always eager: under torch.compile the graph breaks around this call, since
    the chunks run autograd inside a custom autograd.Function's forward, which dynamo cannot trace. Built on first
    use, because ``torch.compiler.disable`` imports dynamo, which sets ``TORCHINDUCTOR_CACHE_DIR`` in the process
    environment: ``import hf_heads`` leaves the environment as it was."""
    if name == "loss_and_nll":
        globals()[name] = torch.compiler.disable(_loss_and_nll)
        return globals()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
