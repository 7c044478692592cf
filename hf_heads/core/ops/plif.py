"""PLIF's piecewise-linear increasing map (Ganea et al. 2019): bins, values, slope gradients; the forward /
backward pair the memory-lean loss calls (:func:`plif_forward`, :func:`plif_backward`), the autograd function the
reference math calls (:func:`piecewise_linear_increasing`) and the O(T) reference."""

from __future__ import annotations

from typing import Optional, Tuple

import torch


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


def plif_forward(z: torch.Tensor, slopes: torch.Tensor, knot_range: float) -> Tuple[torch.Tensor, tuple]:
    """``(f(z), saved)`` for :func:`plif_backward`: the bins, positions and slope of every element of ``z``."""
    bins, frac = plif_bins(z, slopes.shape[0], knot_range)
    out, slope_at = plif_values(bins, frac, slopes, knot_range)
    return out, (bins, frac, slope_at, slopes.shape[0], knot_range)


def plif_backward(
    saved: tuple, grad_out: torch.Tensor, slopes_grad: bool = True
) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """``(grad_z, grad_slopes)`` of ``sum(grad_out * f(z))`` for the ``f(z)`` of :func:`plif_forward` that returned
    ``saved``; ``grad_z`` is made in place in ``grad_out``; ``grad_slopes`` None unless ``slopes_grad``."""
    bins, frac, slope_at, num_knots, knot_range = saved
    grad_slopes = plif_slope_grads(grad_out, bins, frac, num_knots, knot_range) if slopes_grad else None
    return grad_out.mul_(slope_at), grad_slopes


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
