"""Sigsoftmax's score map (Kanai et al. 2018), ``s(z) = z + logsigmoid(z)``, forward and backward."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def sigsoftmax_scores(z: torch.Tensor) -> torch.Tensor:
    """``z + logsigmoid(z)``: ``softmax`` of these is ``exp(z) sigmoid(z) / sum``, without its overflow."""
    return z + F.logsigmoid(z)


def sigsoftmax_backward(z: torch.Tensor, grad_scores: torch.Tensor) -> torch.Tensor:
    """The gradient w.r.t. ``z`` of ``sum(grad_scores * s(z))``: ``grad_scores (1 + sigmoid(-z))``, made in place in
    ``grad_scores`` (``z`` is overwritten too)."""
    return grad_scores.mul_(z.neg_().sigmoid_().add_(1.0))
