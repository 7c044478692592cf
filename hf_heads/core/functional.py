"""Shared math of the heads, as plain functions (torch only).

Everything that more than one head needs lives here once: the float32 projection, the target
checks, the log-space mixture, the sigmoid tree and the piecewise-linear increasing function.
"""

from __future__ import annotations

import contextlib
from typing import List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F


def autocast_off(t: torch.Tensor):
    """Context in which autocast is off on ``t``'s device, so head math stays in the dtype it is given (float32 as
    :func:`compute_dtype` chooses it, float64 for float64 inputs).

    bf16/fp16 models feed low-precision hidden states; logits of a large vocabulary overflow
    fp16 and lose ranks in bf16, so every head does its output math in float32 (or float64).
    """
    if not values_known(t):  # autocast has no meta device
        return contextlib.nullcontext()
    return torch.autocast(device_type=t.device.type, enabled=False)


_MM_OUT_DTYPE: dict = {}  # device type -> whether torch.mm takes out_dtype there


def product(a: torch.Tensor, b: torch.Tensor, dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """``a @ b`` (2-D) in float32. With ``dtype`` (bf16 / fp16), both operands are cast to it: on CUDA the product
    accumulates in float32 (``torch.mm(..., out_dtype=torch.float32)``, the tensor cores' mode); where torch has no
    such kernel (the CPU) the product is rounded to ``dtype`` first, then widened."""
    if dtype is None:
        return a.float() @ b.float()
    a, b = a.to(dtype), b.to(dtype)
    kind = a.device.type
    if _MM_OUT_DTYPE.get(kind, True):
        try:
            out = torch.mm(a, b, out_dtype=torch.float32)
            _MM_OUT_DTYPE[kind] = True
            return out
        except (TypeError, RuntimeError, NotImplementedError):
            _MM_OUT_DTYPE[kind] = False
    return torch.mm(a, b).float()


def values_known(t: torch.Tensor) -> bool:
    """False on the ``meta`` device (shapes without values): checks and shortcuts that read values are skipped there,
    so every head can be run on meta to find tensors made on the wrong device (tests/test_device.py)."""
    return t.device.type != "meta"


def compute_dtype(t: torch.Tensor) -> torch.dtype:
    """The dtype head math runs in for input ``t``: float64 stays float64, all else is float32."""
    return torch.float64 if t.dtype == torch.float64 else torch.float32


def linear_full_precision(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``x @ weight^T + bias`` in float32 (float64 for float64 ``x``), whatever the parameters' dtype."""
    dt = compute_dtype(x)
    with autocast_off(x):
        return F.linear(x.to(dt), weight.to(dt), None if bias is None else bias.to(dt))


def compiling() -> bool:
    """Whether torch.compile is tracing the caller (False on torch < 2.3, which has no public flag)."""
    return getattr(torch.compiler, "is_compiling", lambda: False)()


def smoothed_loss(
    nll: torch.Tensor, log_prob_sum: torch.Tensor, label_smoothing: float, vocab_size: int
) -> torch.Tensor:
    """Per-token label-smoothed loss ``(1 - e) nll - (e / V) sum_v log p_v`` (``F.cross_entropy``'s smoothing) from
    the NLL and the sum of the V log-probs."""
    return (1.0 - label_smoothing) * nll - (label_smoothing / vocab_size) * log_prob_sum


def check_target(
    head: str, target: torch.Tensor, expected_shape: Sequence[int], vocab_size: int, ignore_index: int
) -> torch.Tensor:
    """Validate a target tensor and return it flattened.

    ``target`` must be an integer tensor of shape ``expected_shape`` (the hidden states' leading
    dims) with values in ``[0, vocab_size)`` or equal to ``ignore_index``.
    """
    if not torch.is_tensor(target):
        raise ValueError(f"{head}: target must be a tensor of token ids, got {type(target).__name__}")
    if target.dtype.is_floating_point or target.dtype == torch.bool or target.is_complex():
        raise ValueError(f"{head}: target has dtype {target.dtype}; expected an integer tensor (torch.long)")
    if tuple(target.shape) != tuple(expected_shape):
        raise ValueError(
            f"{head}: target has shape {tuple(target.shape)}; expected {tuple(expected_shape)} "
            f"(the leading dims of hidden)"
        )
    t = target.reshape(-1).long()
    bad = ((t < 0) | (t >= vocab_size)) & (t != ignore_index)
    if not values_known(t):
        return t
    if compiling():
        # reading the flag in Python would break torch.compile's graph (and sync); the assert stays in the graph
        # and raises RuntimeError (it cannot name the value): the eager run gives the full message
        torch._assert_async(
            ~bad.any(),
            f"{head}: target contains ids outside [0, {vocab_size}) other than "
            f"ignore_index={ignore_index} (run eagerly to see the value)",
        )
        return t
    if bool(bad.any()):
        value = int(t[bad][0])
        raise ValueError(
            f"{head}: target contains {value}; allowed: token ids in [0, {vocab_size}) or ignore_index={ignore_index}"
        )
    return t


def group_rows(index: torch.Tensor) -> Tuple[torch.Tensor, List[Tuple[int, int, int]]]:
    """``(order, [(value, start, stop), ...])``: the positions of the integer tensor ``index`` sorted by
    value (stable), and for every value present the slice ``order[start:stop]`` of its positions.

    Heads that route each row to one of several blocks (DS-Softmax's experts, the class-based softmax's
    classes) run one matrix product per block present: ``x[order[start:stop]] @ W_value^T``.
    """
    order = torch.argsort(index, stable=True)
    counts = torch.bincount(index, minlength=1).tolist()
    groups, start = [], 0
    for value, n in enumerate(counts):
        if n:
            groups.append((value, start, start + n))
            start += n
    return order, groups


def sigmoid_tree_log_priors(gate_logits: torch.Tensor) -> torch.Tensor:
    """Log-priors of K = 2^L leaves from K - 1 sigmoid gates (Mixtape eq. 3, in log space).

    ``gate_logits[..., i]`` is the gate of node ``i`` of a complete binary tree in heap order
    (root 0, children of ``i`` at ``2i+1, 2i+2``). Going left multiplies by ``sigmoid(l)``, right
    by ``1 - sigmoid(l) = sigmoid(-l)``; for K = 4 this is exactly the paper's
    ``pi_1 = g1 g2, pi_2 = g1 (1-g2), pi_3 = (1-g1) g3, pi_4 = (1-g1)(1-g3)``.
    Returns ``[..., K]`` log-priors that sum (in prob space) to one.
    """
    num_nodes = gate_logits.shape[-1]
    log_p = gate_logits.new_zeros(*gate_logits.shape[:-1], 1)
    start, width = 0, 1
    while start < num_nodes:
        nodes = gate_logits[..., start : start + width]
        if nodes.shape[-1] != width:
            raise ValueError(f"sigmoid tree needs 2^L - 1 gates, got {num_nodes}")
        left = log_p + F.logsigmoid(nodes)
        right = log_p + F.logsigmoid(-nodes)
        log_p = torch.stack([left, right], dim=-1).flatten(-2)
        start, width = start + width, width * 2
    return log_p


def plif_bins(z: torch.Tensor, num_knots: int, knot_range: float) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(bin, frac)`` of every element of ``z`` for PLIF's T = ``num_knots`` pieces of step D = 2R/T on
    [-R, R]: ``bin = clamp(floor((z + R) / D), 0, T - 1)`` (long) and ``frac = (z + R) / D - bin``, the
    position inside the piece in steps (below 0 or above 1 only outside [-R, R])."""
    scale = num_knots / (2.0 * knot_range)
    u = z.mul(scale).add_(knot_range * scale)
    floor = u.clamp(0, num_knots - 1).floor_()
    return floor.long(), u.sub_(floor)


def plif_values(
    bins: torch.Tensor, frac: torch.Tensor, slopes: torch.Tensor, knot_range: float
) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(f(z), f'(z))`` from :func:`plif_bins`: ``f = D (sum_{j<bin} s_j + s_bin frac) - R``, ``f' = s_bin``."""
    step = 2.0 * knot_range / slopes.shape[0]
    before = (torch.cumsum(slopes, 0) - slopes).mul_(step).sub_(knot_range)  # exclusive prefix sum, scaled
    flat = bins.reshape(-1)
    slope_at = slopes.index_select(0, flat).view(bins.shape)
    return before.index_select(0, flat).view(bins.shape).addcmul_(slope_at, frac, value=step), slope_at


def plif_slope_grads(
    grad_out: torch.Tensor, bins: torch.Tensor, frac: torch.Tensor, num_knots: int, knot_range: float
) -> torch.Tensor:
    """Gradient of ``sum(grad_out * f(z))`` w.r.t. the T slopes: D for every element in a higher bin, D frac
    in its own bin; one ``scatter_add_`` per statistic, then a suffix sum."""
    step = 2.0 * knot_range / num_knots
    flat = bins.reshape(-1)
    g = grad_out.reshape(-1)
    per_bin = g.new_zeros(num_knots).scatter_add_(0, flat, g)
    at_bin = g.new_zeros(num_knots).scatter_add_(0, flat, (grad_out * frac).reshape(-1))
    above = per_bin.flip(0).cumsum(0).flip(0) - per_bin
    return (above + at_bin).mul_(step)


class _PiecewiseLinearIncreasing(torch.autograd.Function):
    """``f(z)`` with knots evenly spaced on [-R, R]; saves only ``z`` for backward.

    The naive autograd form keeps the bin index, the gathered slope and the offset (three tensors the size
    of ``z``); here backward recomputes the bins from ``z``.
    """

    @staticmethod
    def forward(ctx, z, slopes, knot_range):
        out, _ = plif_values(*plif_bins(z, slopes.shape[0], knot_range), slopes, knot_range)
        ctx.save_for_backward(z, slopes)
        ctx.knot_range = knot_range
        return out

    @staticmethod
    def backward(ctx, grad_out):
        z, slopes = ctx.saved_tensors
        bins, frac = plif_bins(z, slopes.shape[0], ctx.knot_range)
        grad_z = grad_out * slopes.take(bins) if ctx.needs_input_grad[0] else None
        grad_slopes = None
        if ctx.needs_input_grad[1]:
            grad_slopes = plif_slope_grads(grad_out.to(slopes.dtype), bins, frac, slopes.shape[0], ctx.knot_range)
        return grad_z, grad_slopes, None


def piecewise_linear_increasing(z: torch.Tensor, slopes: torch.Tensor, knot_range: float) -> torch.Tensor:
    """PLIF (Ganea et al. 2019): monotone piecewise-linear ``f`` applied elementwise to ``z``.

    With T = ``len(slopes)`` knots at step D = 2R/T on [-R, R] and bin ``i = clamp(floor((z+R)/D),
    0, T-1)``: ``f(z) = D * sum_{j<i} s_j + s_i (z - (-R + D i)) - R``, so f(-R) = -R, f is the
    identity when every slope is 1, and it extends its first/last piece linearly outside
    [-R, R]. O(1) work per element whatever T is. ``slopes`` must be positive.
    """
    return _PiecewiseLinearIncreasing.apply(z, slopes, float(knot_range))


def piecewise_linear_increasing_reference(z: torch.Tensor, slopes: torch.Tensor, knot_range: float) -> torch.Tensor:
    """Obviously-correct O(T)-per-element PLIF: sum over knots of ``s_j * clip(z - x_j, 0, D)``.

    Used by the tests as ground truth; extrapolates below -R and above R with the end slopes.
    """
    num_knots = slopes.shape[0]
    step = 2.0 * knot_range / num_knots
    knots = -knot_range + step * torch.arange(num_knots, dtype=z.dtype, device=z.device)
    inside = (z[..., None] - knots).clamp(0, step)
    out = (inside * slopes).sum(-1) - knot_range
    below = (z + knot_range).clamp(max=0) * slopes[0]
    above = (z - knot_range).clamp(min=0) * slopes[-1]
    return out + below + above
