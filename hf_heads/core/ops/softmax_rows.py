"""The V-wide softmaxes of the memory-lean loss, forward and backward by hand, as a function of tensors."""

from __future__ import annotations

from typing import Callable, Optional, Tuple

import torch

from .. import functional
from . import triton_rows
from .triton_rows import RowMap


def softmax_rows(
    weight: torch.Tensor,
    bias: Optional[torch.Tensor],
    x: torch.Tensor,
    target: torch.Tensor,
    *,
    grad_weight: Optional[torch.Tensor] = None,
    grad_bias: Optional[torch.Tensor] = None,
    log_prior: Optional[torch.Tensor] = None,
    transform: Optional[Callable] = None,
    prefix: Optional[torch.Tensor] = None,
    prefix_ids: Optional[torch.Tensor] = None,
    label_smoothing: float = 0.0,
    product_dtype: Optional[torch.dtype] = None,
    row_map: Optional[RowMap] = None,
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, Optional[torch.Tensor], Optional[torch.Tensor]]:
    """Loss and gradients of K softmaxes per token over ``weight`` W ``[V, d]`` and ``bias`` b ``[V]`` (or None),
    forward and backward in one call: nothing V-wide outlives it.

    Component k of token i: ``log_softmax(f([prefix_i, x_ik W[S:]^T + b[S:]]))`` (S = prefix width, 0 by
    default; f = ``transform``, elementwise, identity by default), mixed with ``log_prior`` ``[n, K]``
    in log space when given (K must be 1 otherwise). ``x`` ``[n, K, d]`` carries no graph.

    ``label_smoothing`` (one softmax only: no ``log_prior``) smooths the loss as ``F.cross_entropy`` does.
    ``prefix_ids`` (S ids): the prefix holds the logits of these ids instead of the first S (every id's
    logit comes from the product then, and the prefix overwrites theirs).

    Returns ``(loss [n], nll [n], grad_x [n, K, d], grad_log_prior [n, K] or None, grad_prefix [n, S] or
    None)``, the gradients of the summed loss, and adds those of W and b to the float accumulators ``grad_weight``
    and ``grad_bias`` (skipped where None). ``transform(logits)`` returns ``(scores, back)`` with
    ``back(grad_scores) -> grad_logits`` (None for the identity). The gradient of the logits is
    ``r_ik (softmax - onehot)`` (r: the components' posterior responsibilities), made in place in the
    log-softmax; the weight gradient accumulates straight into ``grad_weight`` with ``addmm_``. With
    ``product_dtype`` (bf16 / fp16) the three V-wide products (logits, ``grad_x``, W's gradient) take their operands
    in that dtype and keep float32 results (:func:`hf_heads.core.functional.product`). With ``row_map`` the V-wide
    middle (the transform, the log-softmax, the gradient of the logits) runs in the Triton kernels of
    :mod:`.triton_rows` instead of ``transform``: the same numbers, one read and one read-write pass over the logits;
    a PLIF map's slope gradients go to ``row_map.on_slope_grads`` (under ``torch.use_deterministic_algorithms(True)``
    a PLIF map takes ``transform``: the kernels add its slope gradients atomically, in no fixed order).
    """
    n, k, d = x.shape
    vocab_size = weight.shape[0]
    prefix_width = 0 if prefix is None or prefix_ids is not None else prefix.shape[1]
    product_dtype = product_dtype if product_dtype not in (None, x.dtype) else None  # None: x.dtype
    w = weight[prefix_width:].to(product_dtype or x.dtype)
    b = None if bias is None else bias[prefix_width:].to(x.dtype)
    rows = x.reshape(n * k, d)
    logits = None if product_dtype and not prefix_width else x.new_empty(n * k, vocab_size)
    if prefix_width:
        logits[:, :prefix_width] = prefix
    if product_dtype:
        z = functional.product(rows, w.t(), product_dtype)
        if b is not None:
            z += b
        if prefix_width:
            logits[:, prefix_width:] = z
        else:
            logits = z
    elif b is None:
        torch.mm(rows, w.t(), out=logits[:, prefix_width:])
    else:
        torch.addmm(b, rows, w.t(), out=logits[:, prefix_width:])
    if prefix_ids is not None:
        logits.index_copy_(1, prefix_ids, prefix)
    if log_prior is not None and label_smoothing:
        raise ValueError("softmax_rows: label smoothing of a mixture (log_prior given) is not done by hand")
    t = target.repeat_interleave(k)[:, None] if k > 1 else target[:, None]
    if row_map is not None and not (row_map.atomic() and torch.are_deterministic_algorithms_enabled()):
        loss, nll, grad, grad_prior = _kernel_rows(logits, t[:, 0], n, k, log_prior, label_smoothing, row_map)
    else:
        loss, nll, grad, grad_prior = _torch_rows(logits, t, n, k, log_prior, label_smoothing, transform)
    del logits
    grad_x, grad_prefix = _products(
        grad, x, w, rows, prefix, prefix_ids, prefix_width, grad_weight, grad_bias, product_dtype
    )
    return loss, nll, grad_x, grad_prior, grad_prefix


def _mixture(logp_t: torch.Tensor, n: int, k: int, log_prior: torch.Tensor):
    """``(nll [n], responsibilities [n, K])`` of a mixture of K softmaxes per token from the target's log-probs of
    each component ``[n K]`` and the log priors ``[n, K]``."""
    joint = logp_t.view(n, k) + log_prior
    total = torch.logsumexp(joint, dim=1)
    return -total, (joint - total[:, None]).exp()  # the components' posterior responsibilities


def _torch_rows(logits, t, n, k, log_prior, label_smoothing, transform):
    """``(loss [n], nll [n], grad of the logits (in place in their buffer), grad_prior)`` in PyTorch."""
    vocab_size = logits.shape[1]
    scores, back = (logits, None) if transform is None else transform(logits)
    del logits
    logp = torch.log_softmax(scores, dim=1)
    del scores
    logp_t = logp.gather(1, t).squeeze(1)
    if log_prior is None:
        nll, resp_rows, grad_prior = -logp_t, None, None
        loss = nll if not label_smoothing else functional.smoothed_loss(nll, logp.sum(1), label_smoothing, vocab_size)
    else:
        nll, resp = _mixture(logp_t, n, k, log_prior)
        loss, resp_rows, grad_prior = nll, resp.reshape(-1, 1), -resp
    grad = logp.exp_()  # softmax, in place
    if resp_rows is None:  # smoothed: softmax - (1 - e) onehot - e / V
        if label_smoothing:
            grad.sub_(label_smoothing / vocab_size)
        grad.scatter_add_(1, t, grad.new_full(t.shape, label_smoothing - 1.0))
    else:
        grad.mul_(resp_rows).scatter_add_(1, t, -resp_rows)
    if back is not None:
        grad = back(grad)
    return loss, nll, grad, grad_prior


def _kernel_rows(logits, t, n, k, log_prior, label_smoothing, row_map):
    """:func:`_torch_rows` by the Triton kernels (:mod:`.triton_rows`); PLIF's slope gradients to
    ``row_map.on_slope_grads``."""
    vocab_size = logits.shape[1]
    lse, target_score, score_sum = triton_rows.row_stats(logits, t, row_map)
    logp_t = target_score - lse
    if log_prior is None:
        nll, weight, grad_prior = -logp_t, torch.ones_like(lse), None
        # sum_v log p_v = sum_v s_v - V lse
        loss = functional.smoothed_loss(nll, score_sum - vocab_size * lse, label_smoothing, vocab_size)
    else:
        nll, resp = _mixture(logp_t, n, k, log_prior)
        loss, weight, grad_prior = nll, resp.reshape(-1), -resp
    slope_grads = triton_rows.row_grads(logits, t, lse, weight, row_map, label_smoothing)
    if slope_grads is not None and row_map.on_slope_grads is not None:
        row_map.on_slope_grads(slope_grads)
    return loss.to(logits.dtype), nll.to(logits.dtype), logits, grad_prior


def _products(grad, x, w, rows, prefix, prefix_ids, prefix_width, grad_weight, grad_bias, product_dtype):
    """``(grad_x [n, K, d], grad_prefix)`` from the logits' gradient ``grad``, adding W's and b's to their
    accumulators."""
    n, k, d = x.shape
    if prefix_ids is not None:  # the prefix ids' logits did not come from the product
        grad_prefix = grad.index_select(1, prefix_ids)
        grad_lin = grad.index_fill_(1, prefix_ids, 0.0)
    else:
        grad_prefix = None if prefix is None else grad[:, :prefix_width]
        grad_lin = grad if prefix is None else grad[:, prefix_width:]
    grad_x = (functional.product(grad_lin, w, product_dtype) if product_dtype else grad_lin @ w).view(n, k, d)
    if grad_weight is not None:
        if product_dtype:
            grad_weight[prefix_width:] += functional.product(grad_lin.t(), rows, product_dtype)
        else:
            grad_weight[prefix_width:].addmm_(grad_lin.t(), rows)
    if grad_bias is not None:
        grad_bias[prefix_width:] += grad_lin.sum(0)
    return grad_x, grad_prefix
