"""The V-wide math of the heads with hand-written gradients, as functions of tensors (weights, biases, inputs,
targets; no module): the softmax rows of the memory-lean loss (:mod:`.softmax_rows`), Mixtape's sigmoid tree
(:mod:`.sigmoid_tree`), PLIF's piecewise-linear increasing map (:mod:`.plif`), sigsoftmax's score map
(:mod:`.sigsoftmax`), the fixed scale / soft-cap of a model's logits (:mod:`.logit_map`). Each forward has its
backward beside it, tested against autograd in float64 (tests/test_ops.py). The heads compose them;
:mod:`hf_heads.core.lean` holds the chunk loop; :mod:`.triton_rows` runs the softmax rows' V-wide middle in Triton
kernels (``impl="triton"``)."""

from .logit_map import chain_backs, logit_map, logit_map_forward
from .plif import (
    piecewise_linear_increasing,
    piecewise_linear_increasing_reference,
    plif_backward,
    plif_bins,
    plif_forward,
    plif_slope_grads,
    plif_values,
)
from .sigmoid_tree import sigmoid_tree_log_priors, sigmoid_tree_mix, sigmoid_tree_mix_backward
from .sigsoftmax import sigsoftmax_backward, sigsoftmax_scores
from .softmax_rows import softmax_rows
from .triton_rows import RowMap, check_can_run

__all__ = [
    "RowMap",
    "check_can_run",
    "chain_backs",
    "logit_map",
    "logit_map_forward",
    "piecewise_linear_increasing",
    "piecewise_linear_increasing_reference",
    "plif_backward",
    "plif_bins",
    "plif_forward",
    "plif_slope_grads",
    "plif_values",
    "sigmoid_tree_log_priors",
    "sigmoid_tree_mix",
    "sigmoid_tree_mix_backward",
    "sigsoftmax_backward",
    "sigsoftmax_scores",
    "softmax_rows",
]
