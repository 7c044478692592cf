"""Sigsoftmax (Kanai et al. 2018): ``p ∝ exp(z) * sigmoid(z)`` with ``z = W g + b``."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from ..core import HeadConfig, LinearScoresHead, ops, register_head


@dataclass
class SigsoftmaxConfig(HeadConfig):
    """Options of :class:`SigsoftmaxHead` (only the shared ones)."""


@register_head("sigsoftmax")
class SigsoftmaxHead(LinearScoresHead):
    """``log p = log_softmax(z + logsigmoid(z))``, ``z = W dropout(g) + b``.

    The paper's ``exp(z) sigmoid(z) / sum`` overflows for large z; adding ``logsigmoid(z)`` to the
    logits before one stable log-softmax gives the same distribution. The output non-linearity
    ``z + logsigmoid(z)`` is monotone, so sigsoftmax is a fixed (not learnt) PLIF-like deformation.
    """

    config_class = SigsoftmaxConfig
    paper = "Kanai et al. 2018, Sigsoftmax: reanalysis of the softmax bottleneck"
    pretrained_start = None
    pretrained_start_gap = (
        "p ∝ exp(z) sigmoid(z) with z = W g + b copied: the model's softmax(z) reweighted by sigmoid(z_x), which "
        "moves mass toward the tokens with the largest logits; no option undoes it"
    )
    lean_width = 3  # logits, scores, log-softmax

    def score_transform(self, logits: torch.Tensor) -> torch.Tensor:
        return ops.sigsoftmax_scores(logits)

    def row_map(self, grads):
        return dataclasses.replace(super().row_map(grads), kind="sigsoftmax")

    def lean_score_transform(self, logits, grads):
        return ops.sigsoftmax_scores(logits), lambda grad: ops.sigsoftmax_backward(logits, grad)
