"""The fixed map a model may apply to its logits before the softmax, kept in a head's options (``logit_scale`` s,
``logit_softcap`` c): ``m(z) = c tanh(s z / c)``, or ``s z`` without a cap (Gemma 2's final soft-cap, Cohere's and
Granite's scales), forward and backward."""

from __future__ import annotations

from typing import Callable, Optional, Tuple

import torch


def logit_map(z: torch.Tensor, scale: float = 1.0, softcap: Optional[float] = None) -> torch.Tensor:
    """``softcap * tanh(scale * z / softcap)`` (``scale * z`` for ``softcap=None``), under autograd; ``z`` itself
    for the identity (scale 1, no cap)."""
    if scale != 1.0:
        z = z * scale
    if softcap is not None:
        z = torch.tanh(z / softcap) * softcap
    return z


def logit_map_forward(
    z: torch.Tensor, scale: float = 1.0, softcap: Optional[float] = None
) -> Tuple[torch.Tensor, Optional[Callable[[torch.Tensor], torch.Tensor]]]:
    """``(m(z), back)`` for the memory-lean loss, made in place in ``z``: ``back(grad)`` returns the gradient with
    respect to ``z`` (in place in ``grad``), ``m'(z) = scale (1 - tanh^2)`` with a cap, ``scale`` without; ``back`` is
    None for the identity. With a cap, ``tanh`` stays in ``z``'s storage until ``back`` runs (one V-wide tensor)."""
    if softcap is None:
        if scale == 1.0:
            return z, None
        return z.mul_(scale), lambda grad: grad.mul_(scale)
    t = z.mul_(scale / softcap).tanh_()

    def back(grad: torch.Tensor) -> torch.Tensor:
        return grad.mul_(t.square_().neg_().add_(1.0).mul_(scale))

    return t * softcap, back


def chain_backs(inner: Optional[Callable], outer: Optional[Callable]) -> Optional[Callable]:
    """The backward of ``g(m(z))`` from ``inner`` (g's: grad of g's output -> grad of m's output) and ``outer`` (m's),
    either None for an identity."""
    if inner is None or outer is None:
        return outer if inner is None else inner
    return lambda grad: outer(inner(grad))
