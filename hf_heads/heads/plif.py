"""PLIF (Ganea et al. 2019, "Breaking the softmax bottleneck via learnable monotonic pointwise
non-linearities"): ``softmax(f(z))`` with a learnt monotone piecewise-linear ``f``."""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from ..core import ops, shard
from ..core import lean
from ..core import HeadConfig, LinearScoresHead, check_float, check_int, option, register_head
from .mos import MoSConfig, MoSHead


@dataclass
class PLIFConfig(HeadConfig):
    """Options of :class:`PLIFHead` (paper symbols in brackets)."""

    num_knots: int = option(100000, "number of linear pieces of f [T] (paper: 1e5 to 1e6)")
    knot_range: float = option(20.0, "f has its knots evenly spaced on [-R, R] [R] (paper: 20)")

    def __post_init__(self) -> None:
        super().__post_init__()
        check_int(self.head_name, "num_knots", self.num_knots, 1, 10_000_000)
        check_float(self.head_name, "knot_range", self.knot_range, 0.0, 1e6, lo_open=True)
        if self.logit_softcap is not None and self.knot_range < self.logit_softcap:
            warnings.warn(
                f"{self.head_name}: knot_range={self.knot_range} is below logit_softcap={self.logit_softcap}: f's "
                f"pieces cover [-{self.knot_range}, {self.knot_range}] (beyond, f goes on with its end slopes), while "
                f"the capped logits f takes span (-{self.logit_softcap}, {self.logit_softcap}); give knot_range >= "
                f"{self.logit_softcap}",
                stacklevel=3,
            )


class PiecewiseLinearIncreasing(nn.Module):
    """Learnt monotone ``f``: slopes ``softplus(p)`` on T pieces of [-R, R], identity at start.

    ``p`` starts at ``log(e - 1)`` so every slope is 1 and ``f(z) = z``. The authors add small
    noise to that start; it is not needed here (each piece gets its own gradient) and without it
    a fresh PLIF head is exactly a softmax. Train ``slope_params`` with its own learning rate
    (paper: 0.02) by putting it in a separate optimiser group if you follow the paper.
    """

    def __init__(self, num_knots: int, knot_range: float):
        super().__init__()
        self.knot_range = float(knot_range)
        self.slope_params = nn.Parameter(torch.full((num_knots,), math.log(math.e - 1.0)))

    def slopes(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The T positive slopes ``softplus(p)`` in ``dtype``."""
        return F.softplus(self.slope_params.to(dtype))

    def forward(self, z: torch.Tensor, vocab_shard: "shard.VocabShard | None" = None) -> torch.Tensor:
        """``f(z)``; ``z`` a slice of the vocabulary's logits under ``vocab_shard`` (:mod:`hf_heads.core.shard`)."""
        slopes = shard.enter(self.slopes(z.dtype), vocab_shard)
        return ops.piecewise_linear_increasing(z, slopes, self.knot_range)

    def lean_forward(self, z: torch.Tensor, backprop: Callable):
        """``(f(z), back)`` for a memory-lean loss: ``back(grad)`` returns the gradient w.r.t. ``z`` (in place
        in ``grad``) after handing the slope parameters' gradient to ``backprop(outputs, grad_outputs)``."""
        with torch.enable_grad():
            slopes = self.slopes(z.dtype)
        out, saved = ops.plif_forward(z, slopes.detach(), self.knot_range)

        def back(grad: torch.Tensor) -> torch.Tensor:
            grad_z, grad_slopes = ops.plif_backward(saved, grad, slopes_grad=slopes.requires_grad)
            if grad_slopes is not None:
                backprop([slopes], [grad_slopes])
            return grad_z

        return out, back

    def row_map(self, base: ops.RowMap, grads) -> ops.RowMap:
        """``base`` (the head's fixed map) with this f after it, for the Triton kernels: its slopes (under autograd, so
        the kernels' slope gradients reach ``slope_params`` through ``grads``) and range."""
        with torch.enable_grad():
            slopes = self.slopes()
        base.kind, base.slopes, base.knot_range = "plif", slopes, self.knot_range
        base.on_slope_grads = lambda g: lean.backprop([slopes], [g.to(slopes.dtype)], None, grads)
        return base

    def extra_repr(self) -> str:
        return f"num_knots={self.slope_params.shape[0]}, knot_range={self.knot_range}"


@register_head("plif")
class PLIFHead(LinearScoresHead):
    """``log p = log_softmax(f(m(W dropout(g) + b)))`` with ``f`` a :class:`PiecewiseLinearIncreasing` and m the
    options' fixed map (``f(cap(s z))``; the identity by default).

    O(1) lookup per logit for any number of knots; backward keeps only the logits.
    """

    config_class = PLIFConfig
    paper = "Ganea et al. 2019, Breaking the softmax bottleneck via learnable monotonic pointwise non-linearities"
    pretrained_start_gap = "f starts as the identity (every slope 1), so the head starts as softmax(W g + b)"
    lean_width = 7  # logits, bins (int64), position in the bin, scores, slope per logit, log-softmax

    def __init__(self, config: PLIFConfig):
        super().__init__(config)
        self.plif = PiecewiseLinearIncreasing(config.num_knots, config.knot_range)

    def score_transform(self, logits: torch.Tensor) -> torch.Tensor:
        return self.plif(logits, self.vocab_shard)

    def lean_score_transform(self, logits, grads):
        return self.plif.lean_forward(logits, lambda outs, gouts: lean.backprop(outs, gouts, None, grads))

    def row_map(self, grads):
        return self.plif.row_map(super().row_map(grads), grads)


@dataclass
class MoSPLIFConfig(MoSConfig, PLIFConfig):
    """Options of :class:`MoSPLIFHead`: those of MoS and of PLIF."""


@register_head("mos_plif")
class MoSPLIFHead(MoSHead):
    """MoS whose every component is ``softmax(f(W h_k + b))``, one shared PLIF ``f`` (paper's
    "MoS + PLIF")."""

    config_class = MoSPLIFConfig
    paper = "Ganea et al. 2019 (MoS + PLIF)"

    def __init__(self, config: MoSPLIFConfig):
        super().__init__(config)
        self.plif = PiecewiseLinearIncreasing(config.num_knots, config.knot_range)
        self.lean_width = PLIFHead.lean_width * config.num_components

    def component_scores(self, logits: torch.Tensor) -> torch.Tensor:
        return self.plif(logits, self.vocab_shard)

    def lean_component_scores(self, logits, grads):
        return self.plif.lean_forward(logits, lambda outs, gouts: lean.backprop(outs, gouts, None, grads))

    def row_map(self, grads):
        return self.plif.row_map(super().row_map(grads), grads)
