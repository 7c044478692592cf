"""Differentiated softmax (Chen, Grangier & Auli 2016, "Strategies for training large vocabulary neural
language models"): frequency bands with their own embedding sizes.

Token ids are ordered by frequency (id 0 most frequent; fairseq dictionaries are). The vocabulary is cut
into B contiguous bands, most frequent first, and the hidden state g (``hidden_size``) into B contiguous
segments g_1 .. g_B of sizes d_1 .. d_B. Band i has its own output embedding W_i (|band_i| x d_i) that
only sees its segment; all logits meet in one softmax:

    p(x | g) = softmax([W_1 g_1 + b_1, ..., W_B g_B + b_B])_x

Frequent tokens, which have the data to use them, get many dimensions; rare ones few. That is the
point: the output layer costs ``sum_i |band_i| d_i`` multiply-adds per token instead of ``V d``, for
training and inference alike, and it holds as many parameters. It is equivalent to a softmax whose
V x d embedding is block-diagonal (:meth:`DSoftmaxHead.dense_weight`), so it cannot share a dense
embedding with the input layer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import accumulate
from typing import List, Optional, Sequence, Tuple

import torch
from torch import nn

from ..core import functional
from ..core import HeadConfig, SingleSoftmaxHead, check_option, option, register_head

_DEFAULT_BANDS = 3


def _is_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def split_proportionally(total: int, weights: Sequence[float]) -> List[int]:
    """``len(weights)`` integers >= 1 summing to ``total``: one each, the rest shared in proportion to
    ``weights`` (largest remainders). Needs ``total >= len(weights)``."""
    rest = total - len(weights)
    quotas = [rest * w / sum(weights) for w in weights]
    sizes = [int(q) for q in quotas]
    by_remainder = sorted(range(len(weights)), key=lambda i: quotas[i] - sizes[i], reverse=True)
    for i in by_remainder[: rest - sum(sizes)]:
        sizes[i] += 1
    return [1 + s for s in sizes]


def band_sizes(fractions: Sequence[float], vocab_size: int) -> List[int]:
    """Tokens in each band: band i ends at id ``round(V * (f_1 + ... + f_i))``, the last band at V."""
    ends, total = [], 0.0
    for f in fractions[:-1]:
        total += f
        ends.append(round(vocab_size * total))
    ends.append(vocab_size)
    return [end - start for start, end in zip([0] + ends[:-1], ends)]


@dataclass
class DSoftmaxConfig(HeadConfig):
    """Options of :class:`DSoftmaxHead`."""

    band_fractions: Optional[list] = option(
        None,
        "fraction of the vocabulary in each frequency band, most frequent band first (token ids ordered "
        "by frequency), summing to 1; None: 3 bands, each twice as large as the one before "
        "([1/7, 2/7, 4/7] of V; fewer bands when V or hidden_size < 3)",
    )
    band_dims: Optional[list] = option(
        None,
        "size d_i of each band's segment of g (= its embedding size), summing to hidden_size; None: "
        "each band half the size of the one before ([4/7, 2/7, 1/7] of hidden_size for 3 bands)",
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        n, vocab, d = self.head_name, self.vocab_size, self.hidden_size
        fractions, dims = self.band_fractions, self.band_dims
        if fractions is not None:
            ok = (
                isinstance(fractions, (list, tuple))
                and len(fractions) >= 1
                and all(_is_number(f) and 0 < f <= 1 for f in fractions)
                and abs(math.fsum(fractions) - 1.0) <= 1e-6
                and min(band_sizes(fractions, vocab)) >= 1
            )
            check_option(
                n,
                "band_fractions",
                fractions,
                ok,
                f"a list of fractions in (0, 1] summing to 1, one per frequency band (most frequent "
                f"first), each band holding at least one of the vocab_size={vocab} tokens",
            )
        if dims is not None:
            count = None if fractions is None else len(fractions)
            ok = (
                isinstance(dims, (list, tuple))
                and len(dims) >= 1
                and (count is None or len(dims) == count)
                and all(isinstance(x, int) and not isinstance(x, bool) and x >= 1 for x in dims)
                and sum(dims) == d
            )
            per_band = "one per band" if count is None else f"one per band of band_fractions ({count})"
            check_option(n, "band_dims", dims, ok, f"a list of integers >= 1, {per_band}, summing to hidden_size={d}")
        num_bands = (
            len(fractions)
            if fractions is not None
            else len(dims)
            if dims is not None
            else min(_DEFAULT_BANDS, vocab, d)
        )
        if fractions is None:
            check_option(n, "band_dims", dims, num_bands <= vocab, f"at most vocab_size={vocab} bands")
            fractions = [s / vocab for s in split_proportionally(vocab, [2.0**i for i in range(num_bands)])]
        if dims is None:
            check_option(
                n,
                "band_fractions",
                fractions,
                num_bands <= d,
                f"at most hidden_size={d} bands (each needs a segment of g of size >= 1)",
            )
            dims = split_proportionally(d, [2.0**-i for i in range(num_bands)])
        self.band_fractions, self.band_dims = list(fractions), list(dims)


@register_head("d_softmax")
class DSoftmaxHead(SingleSoftmaxHead):
    """``p(x | g) = softmax_x(W_i(x) g_i(x) + b_x)``: band ``i(x)`` of token x sees only its segment of g.

    Parameters: ``band_weights[i]`` (``|band_i| x d_i``) and ``bias`` (V). There is no V x d ``weight``:
    :meth:`dense_weight` gives the equivalent block-diagonal one. ``forward``, ``loss`` and ``topk``
    (exact) all cost :attr:`multiplications_per_token` = ``sum_i |band_i| d_i`` multiply-adds per
    token; ``topk`` records it in ``last_stats``. With one band (``band_fractions=[1.0]``,
    ``band_dims=[hidden_size]``) it is a plain softmax.

    Started from an existing projection (``weight=``, V x d), band i keeps the block
    ``W[band_i rows, segment_i columns]``: a lossy start (the other columns of each row are dropped),
    which fine-tuning has to make up for. The output embedding cannot be tied to a (dense) input one.
    """

    config_class = DSoftmaxConfig
    paper = (
        "Chen, Grangier & Auli 2016, Strategies for training large vocabulary neural language models "
        "(differentiated softmax)"
    )
    purpose = "fast"
    pretrained_start = None
    pretrained_start_gap = (
        "each band keeps only its block of W (its tokens' rows, its segment of g's columns); the rest of every "
        "row is dropped"
    )
    resizable = False  # the bands are laid out over the ids
    uses_frequency_order = True  # band i holds the ids frequency_order[band i's rank range]
    can_tie = False

    def __init__(self, config: DSoftmaxConfig):
        super().__init__(config)
        c = config
        del self.weight  # replaced by one |band_i| x d_i block per band
        sizes = band_sizes(c.band_fractions, c.vocab_size)
        rows, cols = [0, *accumulate(sizes)], [0, *accumulate(c.band_dims)]
        #: ``[(row start, row end), (column start, column end)]`` of every band: its tokens, its segment of g
        self.bands: List[Tuple[Tuple[int, int], Tuple[int, int]]] = [
            ((rows[i], rows[i + 1]), (cols[i], cols[i + 1])) for i in range(len(sizes))
        ]
        self.band_weights = nn.ParameterList()
        for size, dim in zip(sizes, c.band_dims):
            w = nn.Parameter(torch.empty(size, dim))
            nn.init.normal_(w, std=dim**-0.5)  # unit-variance logits in every band for unit-variance g
            self.band_weights.append(w)
        #: set by every :meth:`topk` call (multiply-adds per query against the ``V d`` budget)

    @property
    def multiplications_per_token(self) -> int:
        """``sum_i |band_i| d_i``: the multiply-adds of this head's logits for one token (a softmax: ``V d``)."""
        return sum(w.numel() for w in self.band_weights)

    def dense_weight(self) -> torch.Tensor:
        """The equivalent V x hidden_size output embedding: band i's block at ``[band_i rows, segment_i
        columns]`` (rows in id order), zero elsewhere, so that the logits are ``dense_weight() @ g + bias``. For
        inspection only: the head never builds it."""
        dense = torch.block_diag(*self.band_weights)  # rows in band (frequency rank) order
        ranks = self.ranks()
        return dense if ranks is None else dense.index_select(0, ranks)

    # -- construction -------------------------------------------------------------------
    @torch.no_grad()
    def init_from_projection(self, weight: torch.Tensor, bias: Optional[torch.Tensor] = None) -> None:
        """Start from an existing projection ``weight`` (V x d) and ``bias`` (V): band i keeps the block
        ``weight[band_i rows, segment_i columns]`` (lossy: the rest of each row is dropped); the bias is
        copied whole."""
        self._check_projection(weight, bias)
        if bias is not None:
            self.bias.copy_(bias)
        for w, ((r0, r1), (c0, c1)) in zip(self.band_weights, self.bands):
            w.copy_(weight[self.frequency_order[r0:r1], c0:c1])

    def tie_weight(self, embedding: nn.Module) -> None:
        raise ValueError(
            f"{self.head_name}: the output embedding cannot be tied to the input embedding: each of the "
            f"{len(self.bands)} frequency bands keeps its own |band| x d_i block (band_dims="
            f"{self.config.band_dims}), not a dense V x d matrix. Build the head untied, started from the "
            f"embedding (weight=embedding.weight keeps each band's block); in fairseq leave out "
            f"--share-decoder-input-output-embed / --share-all-embeddings"
        )

    # -- the head interface ---------------------------------------------------------------------
    def scores_2d(self, hidden: torch.Tensor) -> torch.Tensor:
        x = self.dropout(hidden)
        ranks = self.ranks()
        bias = None if self.bias is None or ranks is None else self.bias.index_select(0, self.frequency_order)
        bias = self.bias if bias is None else bias  # the bias in band (frequency rank) order
        logits = torch.cat(
            [
                functional.linear_full_precision(x[:, c0:c1], w, None if bias is None else bias[r0:r1])
                for w, ((r0, r1), (c0, c1)) in zip(self.band_weights, self.bands)
            ],
            dim=-1,
        )
        return logits if ranks is None else logits.index_select(1, ranks)  # back to id order

    def aux_loss(self) -> torch.Tensor:
        return self.band_weights[0].new_zeros((), dtype=torch.float32)

    def topk(self, hidden: torch.Tensor, k: int) -> Tuple[torch.Tensor, torch.Tensor]:
        """Exact top-k; sets ``last_stats``: ``multiplications`` (``sum_i |band_i| d_i`` per query),
        ``budget`` (``V d``, a full softmax) and ``tokens_scored`` (V)."""
        out = super().topk(hidden, k)
        c = self.config
        self.last_stats = {
            "multiplications": float(self.multiplications_per_token),
            "budget": c.vocab_size * c.hidden_size,
            "tokens_scored": float(c.vocab_size),
        }
        return out
