"""Class-based (two-level hierarchical) softmax with frequency classes (Goodman 2001; Mikolov et al. 2011).

Every token x belongs to one class c(x); the head factorises

    log p(x | g) = log p(c(x) | g) + log p(x | c(x), g)
                 = log_softmax_c(U g + a)[c(x)] + log_softmax_{y in c(x)}(W g + b)[x]

with U (C x d, ``class_proj``) and a the class projection, W (V x d, ``weight``) and b (V) the usual output
embedding. Token ids are assumed ordered by frequency (id 0 most frequent; fairseq dictionaries are), so
every class is a contiguous id range. Mikolov et al.'s *frequency binning* makes classes of equal unigram
mass; without counts the head assumes Zipf's law p(r) ~ 1/(r + 1) (pass ``class_boundaries`` computed
by :func:`frequency_binning` from real counts otherwise). Frequent tokens end up alone in their class,
rare ones share large classes.

What it saves: the NLL of a token needs the C class logits and the logits of the target's class only,
``C d + |c(x)| d`` multiply-adds instead of ``V d`` (about ``2 sqrt(V) d`` with C = sqrt(V)); ``topk``
with ``search_classes < num_classes`` scores only the tokens of the most probable classes (approximate).
``forward`` still returns the full normalised distribution (every token's logit is needed there).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from ..core import functional
from ..core import HeadConfig, OutputHead, check_int, check_option, option, register_head


def frequency_binning(counts, num_classes: int) -> List[int]:
    """Mikolov et al. 2011's frequency binning: split the ids ``0..V-1`` into ``num_classes`` contiguous
    classes of (nearly) equal total ``counts``; returns every class's exclusive end id (the last is V).

    Class c ends at the token whose cumulative share of the counts lands nearest ``(c + 1) / C``, so a
    class's mass is ``1/C`` up to half a boundary token's share on each side. Every class keeps at least
    one token: tokens heavier than ``1/C`` (the head of a Zipf distribution) get a class each, and the
    classes after them split the rest. ``counts`` is any non-negative sequence in id order (unigram
    counts; the head itself uses Zipf's ``1 / (rank + 1)``).
    """
    # on the CPU: configs are also built under a meta default device (transformers' from_pretrained)
    counts = torch.as_tensor(counts, dtype=torch.float64, device="cpu").flatten()
    vocab = counts.numel()
    check_int("frequency_binning", "num_classes", num_classes, 1, vocab)
    if not (bool((counts >= 0).all()) and float(counts.sum()) > 0):
        raise ValueError("frequency_binning: counts must be non-negative with a positive sum")
    cum = counts.cumsum(0) / counts.sum()
    j = torch.arange(num_classes, device="cpu")
    target = (j + 1).to(torch.float64) / num_classes
    first = torch.searchsorted(cum, target).clamp(max=vocab - 1)  # first token reaching the target share
    before = torch.where(first > 0, cum[(first - 1).clamp(min=0)], torch.zeros_like(target))
    ends = torch.where(target - before < cum[first] - target, first, first + 1)  # the nearer boundary
    ends = torch.maximum(torch.cummax(ends - j, 0).values + j, j + 1)  # >= 1 token per class
    ends = torch.minimum(ends, vocab - (num_classes - 1 - j))  # ... and one left for each later class
    ends[-1] = vocab
    return ends.tolist()


def zipf_class_boundaries(vocab_size: int, num_classes: int) -> List[int]:
    """:func:`frequency_binning` under Zipf's law: token of rank r (its id) has count ``1 / (r + 1)``."""
    return frequency_binning(1.0 / torch.arange(1, vocab_size + 1, dtype=torch.float64, device="cpu"), num_classes)


@dataclass
class ClassSoftmaxConfig(HeadConfig):
    """Options of :class:`ClassSoftmaxHead`."""

    num_classes: Optional[int] = option(
        None,
        "number C of word classes; None: round(sqrt(vocab_size)), which minimises the C + V/C cost "
        "of a token (Goodman 2001)",
    )
    class_boundaries: Optional[list] = option(
        None,
        "exclusive end id of every class (token ids ordered by frequency, so each class is a contiguous "
        "id range), strictly increasing, the last = vocab_size; None: frequency binning (Mikolov et al. "
        "2011), classes of equal unigram mass under Zipf's law p(r) ~ 1/(r+1)",
    )
    search_classes: Optional[int] = option(
        None,
        "topk() scores only the tokens of this many most probable classes (more where they hold fewer "
        "than k tokens): approximate below num_classes; None: every class (exact)",
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        n, vocab = self.head_name, self.vocab_size
        bounds = self.class_boundaries
        if bounds is None:
            if self.num_classes is None:
                self.num_classes = min(vocab, max(1, round(math.sqrt(vocab))))
            check_int(n, "num_classes", self.num_classes, 1, vocab)
            self.class_boundaries = zipf_class_boundaries(vocab, self.num_classes)
        else:
            ok = (
                isinstance(bounds, (list, tuple))
                and len(bounds) > 0
                and all(isinstance(e, int) and not isinstance(e, bool) for e in bounds)
                and bounds[0] >= 1
                and all(a < b for a, b in zip(bounds, bounds[1:]))
                and bounds[-1] == vocab
            )
            check_option(
                n,
                "class_boundaries",
                bounds,
                ok,
                f"a strictly increasing list of class end ids in [1, {vocab}] ending at vocab_size={vocab}",
            )
            self.class_boundaries = list(bounds)
            if self.num_classes is None:
                self.num_classes = len(bounds)
            check_int(n, "num_classes", self.num_classes, 1, vocab)
            check_option(
                n,
                "num_classes",
                self.num_classes,
                self.num_classes == len(bounds),
                f"len(class_boundaries) = {len(bounds)}, or None",
            )
        if self.search_classes is None:
            self.search_classes = self.num_classes
        check_int(n, "search_classes", self.search_classes, 1, self.num_classes)


@register_head("class_softmax")
class ClassSoftmaxHead(OutputHead):
    """``log p(x | g) = log_softmax(U g + a)[c(x)] + log_softmax_{y in c(x)}(W g + b)[x]``, classes by frequency.

    Parameters: ``weight`` (V x d) and ``bias`` (V), the token embeddings (started from an existing
    projection and tied to an input embedding like a plain softmax's), and ``class_proj`` (d -> C, with a
    bias when ``use_bias``). The class of every token is fixed by the config's ``class_boundaries``
    (:meth:`class_tables`). With one class it is a plain softmax of ``W g + b``.

    * ``forward``: every token's normalised log-prob (one ``V x d`` product, a per-class log-sum-exp).
    * ``loss``: only the class logits and the target classes' token logits (one product per target
      class in the batch; a class of one token needs no token logit at all, its ``p(x | c) = 1``).
    * ``topk``: the top-k among the tokens of the ``search_classes`` most probable classes (exact by
      default); ``last_stats`` then holds the multiply-adds done per query against the ``V d`` budget.
    """

    config_class = ClassSoftmaxConfig
    paper = (
        "Goodman 2001, Classes for fast maximum entropy training; Mikolov et al. 2011, Extensions of "
        "recurrent neural network language model (frequency binning)"
    )
    purpose = "fast"
    pretrained_start = None
    pretrained_start_gap = (
        "W and b are copied, so p(x | c(x), g) is the model's within each class, but the class level "
        "softmax(U g + a) starts from its own initialisation, not from the classes' mass under the model"
    )
    resizable = False  # the classes are laid out over the ids
    uses_frequency_order = True  # class c holds the ids frequency_order[class c's rank range]

    def __init__(self, config: ClassSoftmaxConfig):
        super().__init__(config)
        c = config
        self.class_proj = nn.Linear(c.hidden_size, c.num_classes, bias=c.use_bias)
        nn.init.normal_(self.class_proj.weight, std=c.hidden_size**-0.5)
        if self.class_proj.bias is not None:
            nn.init.zeros_(self.class_proj.bias)
        #: ``(first rank, end rank)`` of every class: its ids are ``frequency_order[first:end]`` (``first..end-1``
        #: when ids are sorted by frequency)
        self.spans: List[Tuple[int, int]] = list(zip([0] + c.class_boundaries[:-1], c.class_boundaries))
        #: set by every :meth:`topk` call: per-query multiply-adds, the ``V d`` budget, tokens and classes scored

    # -- the two levels ------------------------------------------------------------------
    def class_tables(self, device: Optional[torch.device] = None) -> Tuple[torch.Tensor, torch.Tensor]:
        """``(token_class [V], class_size [C])`` (long) on ``device`` (default: the weight's): the class of
        every token id and the number of tokens in every class, from ``class_boundaries``."""
        device = torch.device(self.weight.device if device is None else device)

        def build():  # built on first use, not buffers: transformers builds models on the meta device to load them
            spans = torch.tensor(self.spans, dtype=torch.long, device="cpu")
            sizes = spans[:, 1] - spans[:, 0]
            token_class = torch.repeat_interleave(torch.arange(len(sizes), device="cpu"), sizes)  # by rank
            ranks = self.ranks()
            if ranks is not None:
                token_class = token_class[ranks.cpu()]
            return token_class.to(device), sizes.to(device)

        return self._cached(f"class_tables:{device}", [self.frequency_order], build)

    def class_log_probs(self, x: torch.Tensor) -> torch.Tensor:
        """``log p(c | g)`` ``[N, C]`` for (dropped-out) hidden states ``x`` ``[N, d]``."""
        return torch.log_softmax(
            functional.linear_full_precision(x, self.class_proj.weight, self.class_proj.bias), dim=-1
        )

    def _per_class(self):
        """``(weights, biases)``: the rows of every class, as views. ``split`` has one backward for all
        classes (slicing ``weight[start:end]`` per class would allocate a full V x d gradient for each)."""
        sizes = [end - start for start, end in self.spans]
        order = None if self.ranks() is None else self.frequency_order
        w, b = (
            (self.weight, self.bias)
            if order is None
            else (self.weight.index_select(0, order), None if self.bias is None else self.bias.index_select(0, order))
        )
        ws = w.split(sizes)
        return ws, [None] * len(ws) if b is None else b.split(sizes)

    def _full_log_probs(self, x: torch.Tensor, class_lp: torch.Tensor) -> torch.Tensor:
        """Every token's ``log p(c(x)) + log p(x | c(x))`` ``[N, V]``: one product, a segment log-sum-exp."""
        z = self._output_logits(x)
        cls = self.class_tables(z.device)[0]
        with torch.no_grad():  # each class's max logit: a shift for stability, the log-sum-exp does not depend on it
            shift = z.new_full(class_lp.shape, float("-inf")).scatter_reduce(1, cls.expand_as(z), z, "amax")
        # (index_select is about twice as fast as advanced indexing along dim 1 here, and N x V passes dominate)
        sums = z.new_zeros(class_lp.shape).index_add(1, cls, (z - shift.index_select(1, cls)).exp_())
        return z - (torch.log(sums) + shift - class_lp).index_select(1, cls)

    # -- the head interface ---------------------------------------------------------------------
    def log_probs_2d(self, hidden: torch.Tensor) -> torch.Tensor:
        x = self.dropout(hidden)
        return self._full_log_probs(x, self.class_log_probs(x))

    def nll_2d(self, hidden: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """``-log p(c(x)) - log p(x | c(x))`` from the class logits and the target classes' tokens only."""
        x = self.dropout(hidden)
        target_class = self.class_tables(target.device)[0][target]
        nll = -self.class_log_probs(x).gather(1, target_class[:, None]).squeeze(1)
        order, groups = functional.group_rows(target_class)
        ranks = self.ranks()
        target_rank = target if ranks is None else ranks[target]
        ws, bs = self._per_class()
        rows, within = [], []
        for c, lo, hi in groups:
            start, end = self.spans[c]
            if end - start == 1:  # alone in its class: p(x | c) = 1
                continue
            r = order[lo:hi]
            rows.append(r)
            within.append(
                F.cross_entropy(
                    functional.linear_full_precision(x[r], ws[c], bs[c]), target_rank[r] - start, reduction="none"
                )
            )
        if rows:
            nll = nll.index_add(0, torch.cat(rows), torch.cat(within))
        return nll

    def topk(self, hidden: torch.Tensor, k: int) -> Tuple[torch.Tensor, torch.Tensor]:
        """The ``k`` most probable tokens among those of the ``search_classes`` most probable classes.

        With ``search_classes == num_classes`` (the default) this is the exact top-k of ``forward``.
        Below it, a query scores the tokens of its ``search_classes`` best classes only, taking further
        classes (best first) where those hold fewer than ``k`` tokens, so ``k`` real tokens come back.
        Sets ``last_stats``: ``multiplications`` (multiply-adds per query, averaged over the queries:
        ``C d`` for the class logits + ``d`` per token logit computed), ``budget`` (``V d``, a full
        softmax), ``tokens_scored`` and ``classes_searched`` (averages per query).
        """
        c = self.config
        check_int(self.head_name, "k", k, 1, c.vocab_size)
        h = self._flat_hidden(hidden)
        with functional.autocast_off(h):
            x = self.dropout(h)
            class_lp = self.class_log_probs(x)
            if c.search_classes >= c.num_classes:
                lp, idx = self._full_log_probs(x, class_lp).topk(k, dim=-1)
                tokens, classes = float(c.vocab_size), float(c.num_classes)
            else:
                lp, idx, tokens, classes = self._searched_topk(x, class_lp, k)
        d = c.hidden_size
        self.last_stats = {
            "multiplications": (c.num_classes + tokens) * d,
            "budget": c.vocab_size * d,
            "tokens_scored": tokens,
            "classes_searched": classes,
        }
        shape = (*hidden.shape[:-1], k)
        return lp.view(shape), idx.view(shape)

    def _searched_topk(self, x: torch.Tensor, class_lp: torch.Tensor, k: int):
        """``(log-probs, ids, tokens scored, classes searched)``: top-k over the best classes of each row.

        The top-k of a union is the top-k of the per-class top-ks: each (row, searched class) pair writes
        its class's best ``min(k, |c|)`` into a ``[N, classes, k]`` candidate table, one product per class."""
        n = x.shape[0]
        order = class_lp.argsort(dim=1, descending=True)
        sizes = self.class_tables(order.device)[1][order]
        needed = (sizes.cumsum(1) < k).sum(1) + 1  # best classes holding at least k tokens
        searched = needed.clamp(min=self.config.search_classes)
        width = int(searched.max())
        chosen = torch.arange(width, device=x.device) < searched[:, None]  # [N, width] slots in use
        rows, slots = chosen.nonzero(as_tuple=True)
        pair_class = order[rows, slots]
        cand_lp = x.new_full((n, width, k), float("-inf"))
        cand_idx = torch.zeros(n, width, k, dtype=torch.long, device=x.device)
        by_class, groups = functional.group_rows(pair_class)
        ws, bs = self._per_class()
        for c, lo, hi in groups:
            sel = by_class[lo:hi]
            r, s = rows[sel], slots[sel]
            start, end = self.spans[c]
            lp = class_lp[r, c][:, None]
            if end - start > 1:  # a one-token class needs no token logit: p(x | c) = 1
                lp = torch.log_softmax(functional.linear_full_precision(x[r], ws[c], bs[c]), dim=-1) + lp
            top, pos = lp.topk(min(k, end - start), dim=-1)
            cand_lp[r, s, : top.shape[1]] = top
            cand_idx[r, s, : top.shape[1]] = pos + start
        lp, flat = cand_lp.view(n, -1).topk(k, dim=-1)
        idx = cand_idx.view(n, -1).gather(1, flat)  # frequency ranks
        if self.ranks() is not None:
            idx = self.frequency_order[idx]
        searched_sizes = sizes[:, :width] * chosen
        tokens = float((searched_sizes * (searched_sizes > 1)).sum()) / n
        return lp, idx, tokens, float(searched.sum()) / n
