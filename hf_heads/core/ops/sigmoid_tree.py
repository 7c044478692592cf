"""Mixtape's sigmoid tree: K = 2^L leaf priors from K - 1 sigmoid gates (the reference, in log space), and the
mixture of K values under those priors with its gradients by hand (the memory-lean loss)."""

from __future__ import annotations

from typing import Tuple

import torch
import torch.nn.functional as F


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


def sigmoid_tree_mix(values: torch.Tensor, gate_logits: torch.Tensor) -> Tuple[torch.Tensor, tuple]:
    """``(z, saved)``: ``z = sum_k pi_k values_k`` ``[n, S]`` for every column, the K = 2^L priors ``pi`` from the
    sigmoid tree of ``gate_logits`` ``[n, K - 1, S]`` (heap order, as :func:`sigmoid_tree_log_priors`) and
    ``values`` ``[n, K, S]``. Mixtape's gated logits of its frequent ids without its ``[n, S, K]`` prior tensor:
    nested lerps, ``node = right + sigmoid(l) (left - right)``, bottom-up. ``gate_logits`` is overwritten by its
    sigmoids (kept in ``saved`` with the levels' values for :func:`sigmoid_tree_mix_backward`)."""
    k = values.shape[1]
    if gate_logits.shape[1] != k - 1 or k & (k - 1):
        raise ValueError(f"sigmoid tree: {k} values need {k - 1} gates and a power of two, got {gate_logits.shape[1]}")
    sig = gate_logits.sigmoid_()
    # bottom-up: level of depth t has gates 2^t - 1 ... 2^(t+1) - 2 over the values of the level below
    levels, level, width = [], [values[:, j] for j in range(k)], k // 2
    while width:
        levels.append((width - 1, level))
        level = [torch.lerp(level[2 * i + 1], level[2 * i], sig[:, width - 1 + i]) for i in range(width)]
        width //= 2
    return level[0], (sig, levels)


def sigmoid_tree_mix_backward(saved: tuple, grad_z: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(grad_values [n, K, S], grad_gate_logits [n, K - 1, S])`` of ``sum(grad_z * z)`` for the ``z`` of
    :func:`sigmoid_tree_mix` that returned ``saved``: top-down, ``d left = dz p``, ``d right = dz (1 - p)``,
    ``d l = dz (left - right) p (1 - p)``. Reads the saved values in place (call it once)."""
    sig, levels = saved
    grad_gates = torch.empty_like(sig)
    grad_level = [grad_z]
    for first, below in reversed(levels):
        nxt = []
        for i, dm in enumerate(grad_level):
            p = sig[:, first + i]
            left, right = below[2 * i], below[2 * i + 1]
            d_left = dm * p
            grad_gates[:, first + i] = (left - right).mul_(d_left).mul_(1 - p)  # dm (a - b) p (1 - p)
            nxt += [d_left, dm - d_left]
        grad_level = nxt
    return torch.stack(grad_level, dim=1), grad_gates
