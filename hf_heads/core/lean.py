"""The memory-lean training loss: token chunks whose gradients are computed in the forward pass."""
from __future__ import annotations

import torch

#: values in all the V-wide tensors of one chunk of the memory-lean loss (32 MiB in float32: small enough
#: for the elementwise passes to run from cache, which is faster on CPU than whole-batch passes), and the
#: fewest tokens per chunk (below that, the weight gradient's matrix product, whose inner size is the
#: chunk, loses speed: 1.2x the plain softmax's time at V = 50257 with 83-token chunks, 1.0x with 256-512)
LEAN_CHUNK_ELEMENTS = 2 ** 23
LEAN_MIN_CHUNK = 256


class _ChunkedNLL(torch.autograd.Function):
    """Summed loss (and NLL) of ``head`` over token chunks, each chunk's gradients computed in the forward pass.

    Forward: for every chunk of ``chunk`` tokens, :meth:`OutputHead.lean_nll_chunk` returns the chunk's summed
    loss (label-smoothed or not), its NLL and the loss's gradient with respect to the chunk's hidden states,
    and adds the parameter gradients to float accumulators; nothing of the chunk is kept, so peak memory is one chunk's V-wide tensors instead of the
    whole batch's. Backward: the stored gradients times the incoming scalar gradient. No recomputation; the
    price is that gradients are computed even if the loss is never backpropagated, and no double backward.
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
            h = hidden[start:start + chunk].detach().requires_grad_(want_h)
            loss, nll, got = head.lean_nll_chunk(h, target[start:start + chunk], grads, label_smoothing)
            total += loss
            total_nll += nll
            if want_h:
                grad_h[start:start + chunk] = got
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

