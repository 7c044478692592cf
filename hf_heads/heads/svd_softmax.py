"""SVD-softmax (Shim et al. 2017): a cheap preview of the logits, exact logits for the best candidates.

After training, ``W = U S V^T`` (one SVD, no gradient). With the rotated query ``z = V^T g`` and
``B = U S`` (so ``W g = B z``):

1. *preview*: ``l~ = B[:, J] z[J] + b`` over a set ``J`` of ``W_p`` rotated dimensions
   (``W_p x V`` multiplications instead of ``d x V``);
2. *refine*: the ``N`` tokens with the best preview logits get their exact logit ``W_x g + b_x``
   (``N x d``);
3. one softmax over the mixed vector (exact logits for the ``N`` candidates, preview logits for the
   rest); ``topk`` reads the same vector, so it agrees with ``head(hidden)``.

``J`` is the paper's choice, the leading ``W_p`` singular directions (``preview_dims="leading"``), or,
per query, the ``W_p`` dimensions with the largest ``s_j |z_j|`` (``preview_dims="adaptive"``, our
option, the default). Why: trained LM heads have a flat spectrum after the first singular value, so
which rotated dimensions matter depends on the query. On SmolLM2-135M's head the leading preview
agrees with the exact top-1 far less often than the adaptive one at the same width (README table).

Training runs the exact softmax (the head is a plain softmax with ``weight`` and ``bias``, tie-able);
the approximation is used in evaluation mode. The SVD is cached and recomputed whenever ``weight`` or
``bias`` change (an optimizer step, ``load_state_dict``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F

from ..core import HeadConfig, SingleSoftmaxHead, check_bool, check_int, check_option, option, register_head

PREVIEW_DIMS = ("adaptive", "leading")


@dataclass
class SVDSoftmaxConfig(HeadConfig):
    """Options of :class:`SVDSoftmaxHead`."""

    preview_rank: Optional[int] = option(
        None, "W_p, rotated dimensions in the preview (paper: W); default ceil(2 d / 9), 128 at d = 576"
    )
    num_refine: Optional[int] = option(
        None, "N, candidates whose exact logit is computed; default min(V, max(256, V // 64)), 768 at V = 49152"
    )
    preview_dims: str = option(
        "adaptive",
        "which W_p dimensions: 'leading' (the paper: the top singular directions) or "
        "'adaptive' (per query, the largest s_j |(V^T g)_j|)",
    )
    preview_half: bool = option(
        True,
        "keep the preview table in float16 (each rotated dimension scaled to [-1, 1]): half the "
        "memory the preview reads; the candidates are still refined in float32",
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        n = self.head_name
        if self.preview_rank is None:
            self.preview_rank = math.ceil(2 * self.embedding_size / 9)
        check_int(n, "preview_rank", self.preview_rank, 1, self.embedding_size)
        if self.num_refine is None:
            self.num_refine = min(self.vocab_size, max(256, self.vocab_size // 64))
        check_int(n, "num_refine", self.num_refine, 1, self.vocab_size)
        check_option(
            n,
            "preview_dims",
            self.preview_dims,
            self.preview_dims in PREVIEW_DIMS,
            " or ".join(repr(p) for p in PREVIEW_DIMS),
        )
        check_bool(n, "preview_half", self.preview_half)


@register_head("svd_softmax")
class SVDSoftmaxHead(SingleSoftmaxHead):
    """Softmax in training; SVD preview + exact refinement of the ``num_refine`` best in evaluation.

    After each evaluation-mode call ``head.last_stats`` holds the cost per query: ``multiplications``
    (``d^2`` to rotate g, ``W_p V`` for the preview, ``N d`` to refine) and ``budget`` (``V d``, what
    the exact softmax uses).
    """

    config_class = SVDSoftmaxConfig
    paper = "Shim et al. 2017, SVD-Softmax: fast softmax approximation on large vocabulary NNs"
    pretrained_start = None
    pretrained_start_gap = (
        "exact in training mode (a plain softmax of W g + b); in evaluation mode, where generation and scoring run, "
        "the preview approximates the logits outside the num_refine best (and so the normaliser of every log-prob), "
        "by design: start='nearest' is the conversion"
    )
    purpose = "fast"
    is_linear_softmax = True

    def __init__(self, config: SVDSoftmaxConfig):
        super().__init__(config)

    def _resize_rows(self, keep, rows, bias_rows):
        """As the base; ``num_refine`` (N <= V) shrinks with the vocabulary, so the config stays valid."""
        super()._resize_rows(keep, rows, bias_rows)
        self.config.num_refine = min(self.config.num_refine, keep + rows.shape[0])

    def svd_tables(self, dtype: torch.dtype = torch.float32):
        """``(Bt, scale, Vt, s, W, b)`` in ``dtype``, computed once (SVD in float64) and cached until
        ``weight`` or ``bias`` change. ``Bt * scale[:, None] = (U S)^T`` (d x V, one contiguous row per
        rotated dimension, so a preview reads only its W_p rows; float16 rows scaled to [-1, 1] with
        ``preview_half``), ``V^T`` (d x d), the singular values ``s``, and the contiguous weight and
        bias for the refinement."""

        def build():
            w = self.weight.detach()
            u, s, vt = torch.linalg.svd(w.double(), full_matrices=False)
            bt = (u * s).T
            scale = bt.abs().amax(dim=1).clamp_min(1e-30) if self._half_preview(dtype) else torch.ones_like(s)
            bt = (bt / scale[:, None]).to(torch.float16 if self._half_preview(dtype) else dtype).contiguous()
            b = None if self.bias is None else self.bias.detach().to(dtype)
            return bt, scale.to(dtype), vt.to(dtype), s.to(dtype), w.to(dtype).contiguous(), b

        return self._cached(f"svd-{dtype}-{self.config.preview_half}", (self.weight, self.bias), build)

    def _half_preview(self, dtype: torch.dtype) -> bool:
        return self.config.preview_half and dtype == torch.float32

    def scores_2d(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.training:
            return self._output_logits(self.dropout(hidden))
        return self.approximate_logits(hidden)

    def approximate_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The mixed logits ``[N, V]`` (exact for the refined candidates, preview elsewhere)."""
        c = self.config
        bt, scale, vt, s, w, b = self.svd_tables(hidden.dtype)
        n, d, rank = hidden.shape[0], c.embedding_size, c.preview_rank
        if rank == d or c.num_refine == c.vocab_size:  # the preview would be exact, or nothing is left to it
            self.last_stats = {
                "multiplications": c.vocab_size * d,
                "budget": c.vocab_size * d,
                "preview_rank": rank,
                "num_refine": c.num_refine,
                "preview_dims": c.preview_dims,
            }
            return hidden @ w.T + (0 if b is None else b)
        z = hidden @ vt.T
        leading = c.preview_dims == "leading"
        if leading and n > 1:  # the same W_p rows for every query: one matmul
            preview = (z[:, :rank] * scale[:rank]) @ bt[:rank].to(z.dtype)
        else:  # per query, its W_p rows of Bt summed with weights z_J * scale_J, without copying them
            dims = (
                torch.arange(rank, device=z.device).expand(n, rank)
                if leading
                else (z.abs() * s).topk(rank, dim=1).indices
            )
            weights = (z.gather(1, dims) * scale[dims]).to(bt.dtype)
            preview = F.embedding_bag(dims, bt, per_sample_weights=weights, mode="sum").to(z.dtype)
        if b is not None:
            preview = preview + b
        cand = preview.topk(c.num_refine, dim=1).indices
        if n == 1:
            exact = (w.index_select(0, cand[0]) @ hidden[0])[None]
        else:  # one matmul over the candidates of the whole batch
            uniq, inverse = torch.unique(cand, return_inverse=True)
            exact = (hidden @ w.index_select(0, uniq).T).gather(1, inverse)
        if b is not None:
            exact = exact + b[cand]
        self.last_stats = {
            "multiplications": d * d + rank * c.vocab_size + c.num_refine * d,
            "budget": c.vocab_size * d,
            "preview_rank": rank,
            "num_refine": c.num_refine,
            "preview_dims": c.preview_dims,
        }
        return preview.scatter(1, cand, exact)

    def extra_repr(self) -> str:
        c = self.config
        return (
            f"{super().extra_repr()}, preview_rank={c.preview_rank}, num_refine={c.num_refine}, "
            f"preview_dims={c.preview_dims!r}"
        )
