"""Sigsoftmax (Kanai et al. 2018): ``p ∝ exp(z) * sigmoid(z)`` with ``z = W g + b``."""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .base import HeadConfig, SingleSoftmaxHead, register_head


@dataclass
class SigsoftmaxConfig(HeadConfig):
    """Options of :class:`SigsoftmaxHead` (only the shared ones)."""


@register_head("sigsoftmax")
class SigsoftmaxHead(SingleSoftmaxHead):
    """``log p = log_softmax(z + logsigmoid(z))``, ``z = W dropout(g) + b``.

    The paper's ``exp(z) sigmoid(z) / sum`` overflows for large z; adding ``logsigmoid(z)`` to the
    logits before one stable log-softmax gives the same distribution. The output non-linearity
    ``z + logsigmoid(z)`` is monotone, so sigsoftmax is a fixed (not learnt) PLIF-like deformation.
    """

    config_class = SigsoftmaxConfig
    paper = "Kanai et al. 2018, Sigsoftmax: reanalysis of the softmax bottleneck"

    def scores_2d(self, hidden: torch.Tensor) -> torch.Tensor:
        z = self._output_logits(self.dropout(hidden))
        return z + F.logsigmoid(z)
