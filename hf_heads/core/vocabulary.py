"""What a head keeps per token id, as part of :class:`OutputHead`: the output embedding's rows (started from a
projection, tied to an input embedding), the order of the ids by frequency, and resizing the vocabulary."""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from .config import check_int
from .functional import values_known
from .registry import heads_where


class VocabularyMixin:
    """The per-id methods of :class:`OutputHead` (which sets ``weight``, ``bias``, ``config`` and, for heads with
    ``uses_frequency_order``, the buffer ``frequency_order``)."""

    def set_frequency_order(self, order) -> None:
        """Set the order of the token ids, most frequent first (a permutation of ``0..V-1``; e.g.
        :func:`hf_heads.frequency_order` of :func:`hf_heads.count_tokens`), for heads that treat ids as ordered
        by frequency. The head then equals the one built on frequency-sorted ids up to that permutation."""
        n, v = self.head_name, self.config.vocab_size
        if not self.uses_frequency_order:
            ordered = ", ".join(heads_where(uses_frequency_order=True))
            raise ValueError(
                f"{n}: frequency_order / token_counts do not apply: this head does not depend on the "
                f"order of the token ids (heads that do: {ordered})"
            )
        order = torch.as_tensor(order).flatten().cpu()
        ok = (
            not order.is_floating_point()
            and order.numel() == v
            and torch.equal(order.long().sort().values, torch.arange(v))
        )
        if not ok:
            raise ValueError(
                f"{n}: frequency_order (length {order.numel()}, dtype {order.dtype}) must be a "
                f"permutation of the token ids 0..{v - 1}, most frequent first"
            )
        self.frequency_order.copy_(order.long())

    def ranks(self) -> Optional[torch.Tensor]:
        """Every id's position in ``frequency_order`` (its frequency rank); None when ids are sorted already
        (the order is ``arange(V)``), so heads keep their contiguous fast paths."""

        def build():
            order = self.frequency_order
            if not values_known(order) or bool((order == torch.arange(len(order), device=order.device)).all()):
                return None
            return torch.empty_like(order).index_copy_(0, order, torch.arange(len(order), device=order.device))

        return self._cached("ranks", [self.frequency_order], build)

    # -- construction -------------------------------------------------------------
    @torch.no_grad()
    def init_from_projection(self, weight: torch.Tensor, bias: Optional[torch.Tensor] = None) -> None:
        """Start the output embedding from an existing projection ``weight`` (V x d), ``bias`` (V)."""
        self._check_projection(weight, bias)
        self.weight.copy_(weight)
        if bias is not None:
            self.bias.copy_(bias)

    def _check_projection(self, weight: torch.Tensor, bias: Optional[torch.Tensor]) -> None:
        """``ValueError`` unless ``weight`` is V x d and ``bias`` (if given) is V with ``use_bias``."""
        c, n = self.config, self.head_name
        if not torch.is_tensor(weight) or tuple(weight.shape) != (c.vocab_size, c.embedding_size):
            shape = tuple(weight.shape) if torch.is_tensor(weight) else type(weight).__name__
            raise ValueError(
                f"{n}: weight has shape {shape}; expected (vocab_size, embedding_size) = "
                f"({c.vocab_size}, {c.embedding_size})"
            )
        if bias is not None:
            if self.bias is None:
                raise ValueError(f"{n}: bias given but use_bias=False")
            if not torch.is_tensor(bias) or tuple(bias.shape) != (c.vocab_size,):
                shape = tuple(bias.shape) if torch.is_tensor(bias) else type(bias).__name__
                raise ValueError(f"{n}: bias has shape {shape}; expected (vocab_size,) = ({c.vocab_size},)")

    def tie_weight(self, embedding: nn.Module) -> None:
        """Share the output embedding with an input embedding module (``embedding.weight``: V x d)."""
        w = getattr(embedding, "weight", None)
        c = self.config
        if not isinstance(w, nn.Parameter) or tuple(w.shape) != (c.vocab_size, c.embedding_size):
            shape = tuple(w.shape) if torch.is_tensor(w) else None
            raise ValueError(
                f"{self.head_name}: cannot tie to an embedding of shape {shape}; expected "
                f"({c.vocab_size}, {c.embedding_size})"
            )
        self.weight = w

    # -- resizing the vocabulary ---------------------------------------------------------
    def check_resize_vocab(self, new_size: int) -> None:
        """``ValueError`` (naming the head and what to do) unless :meth:`resize_vocab` can go to ``new_size``."""
        check_int(self.head_name, "new vocabulary size", new_size, 2)
        if not self.resizable:
            raise ValueError(
                f"{self.head_name}: resizing the vocabulary ({self.config.vocab_size} -> {new_size}) is not "
                f"supported: the head's structure is laid out over the token ids. Resize the model first, then put "
                f"the head on it (hf_heads.swap_head / build_head with vocab_size={new_size})"
            )

    @torch.no_grad()
    def resize_vocab(
        self, new_size: int, weight: Optional[torch.Tensor] = None, bias: Optional[torch.Tensor] = None
    ) -> None:
        """Change the number of token ids to ``new_size`` in place: ids ``0..min(V, new_size)-1`` keep their rows,
        removed ids (shrinking) go, new ids (growing) get rows ``weight[V:]`` / ``bias[V:]`` when given (the new
        projection, ``new_size`` rows: the HF adapter passes the one transformers resized), else rows drawn as the
        head initialises them and bias 0. Every head keeps its other per-id state consistent (Mixtape: new ids
        share the shared gate, the frequent ids stay; DS-Softmax: every expert keeps the new ids). The weight
        becomes a new ``nn.Parameter``: build optimizers after resizing, and re-tie (:meth:`tie_weight`)."""
        self.check_resize_vocab(new_size)
        c = self.config
        keep = min(c.vocab_size, new_size)
        dt, dev = self.weight.dtype, self.weight.device
        if weight is None:
            rows = torch.empty(new_size - keep, c.embedding_size, dtype=dt, device=dev)
            nn.init.normal_(rows, std=c.embedding_size**-0.5)
        else:
            if not torch.is_tensor(weight) or tuple(weight.shape) != (new_size, c.embedding_size):
                shape = tuple(weight.shape) if torch.is_tensor(weight) else type(weight).__name__
                raise ValueError(
                    f"{self.head_name}: resize_vocab weight has shape {shape}; expected (new_size, "
                    f"embedding_size) = ({new_size}, {c.embedding_size})"
                )
            rows = weight[keep:].detach().to(dt)
        bias_rows = None
        if self.bias is not None:
            if bias is not None and (not torch.is_tensor(bias) or tuple(bias.shape) != (new_size,)):
                shape = tuple(bias.shape) if torch.is_tensor(bias) else type(bias).__name__
                raise ValueError(f"{self.head_name}: resize_vocab bias has shape {shape}; expected ({new_size},)")
            bias_rows = self.bias.new_zeros(new_size - keep) if bias is None else bias[keep:].detach().to(dt)
        self._resize_rows(keep, rows.to(dev), None if bias_rows is None else bias_rows.to(dev))
        c.vocab_size = new_size
        # the cache keys on (data_ptr, version): a later resize could allocate its new tensors where freed ones
        # lived, at the same version, and hit tables of another size
        self.__dict__.pop("_inference_cache", None)

    def _resize_rows(self, keep: int, rows: torch.Tensor, bias_rows: Optional[torch.Tensor]) -> None:
        """Keep the first ``keep`` ids' per-id state and append ``rows`` / ``bias_rows`` for the new ids."""
        self.weight = nn.Parameter(torch.cat([self.weight[:keep], rows]), requires_grad=self.weight.requires_grad)
        if self.bias is not None:
            self.bias = nn.Parameter(torch.cat([self.bias[:keep], bias_rows]), requires_grad=self.bias.requires_grad)
        if self.uses_frequency_order:  # the kept ids in their order, then the new ids as the rarest
            order = self.frequency_order
            self.frequency_order = torch.cat(
                [order[order < keep], torch.arange(keep, keep + rows.shape[0], device=order.device)]
            )
