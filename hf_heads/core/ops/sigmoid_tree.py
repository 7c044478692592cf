"""Mixtape's sigmoid tree: K = 2^L leaf priors from K - 1 sigmoid gates."""

from __future__ import annotations

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
