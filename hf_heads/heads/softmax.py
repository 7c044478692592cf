"""Plain softmax: ``log_softmax(W g + b)``, the reference every other head is compared with."""

from __future__ import annotations

from dataclasses import dataclass

from ..core import HeadConfig, LinearScoresHead, register_head


@dataclass
class SoftmaxConfig(HeadConfig):
    """Options of :class:`SoftmaxHead` (only the shared ones)."""


@register_head("softmax")
class SoftmaxHead(LinearScoresHead):
    """``p(x | g) = softmax(W dropout(g) + b)_x``; needs ``embedding_size == hidden_size``."""

    config_class = SoftmaxConfig
    paper = "the standard output layer"
    purpose = "reference"
    is_linear_softmax = True
