"""The V-wide math of the heads with hand-written gradients, as functions of tensors: the softmax rows of the
memory-lean loss (:mod:`.softmax_rows`), Mixtape's sigmoid tree (:mod:`.sigmoid_tree`), PLIF's piecewise-linear
increasing map (:mod:`.plif`). The heads compose them; :mod:`hf_heads.core.lean` holds the chunk loop."""

from .plif import (
    piecewise_linear_increasing,
    piecewise_linear_increasing_reference,
    plif_bins,
    plif_slope_grads,
    plif_values,
)
from .sigmoid_tree import sigmoid_tree_log_priors
from .softmax_rows import softmax_rows

__all__ = [
    "piecewise_linear_increasing",
    "piecewise_linear_increasing_reference",
    "plif_bins",
    "plif_slope_grads",
    "plif_values",
    "sigmoid_tree_log_priors",
    "softmax_rows",
]
