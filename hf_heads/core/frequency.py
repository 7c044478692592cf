"""Token frequencies for heads that need ids ordered by frequency (Mixtape's gate sharing, class_softmax,
d_softmax) on vocabularies that are not sorted by frequency (BPE: GPT-2's, SmolLM2's, most HF tokenizers)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Iterable

import torch


def _flat_ids(item: Any) -> torch.Tensor:
    """The ids of one item as a flat LongTensor; lists of sequences may be ragged (a batch of rows of
    different lengths, as ``Dataset.iter(batch_size=...)`` yields before padding)."""
    if (
        isinstance(item, (list, tuple))
        and item
        and not isinstance(item[0], (int, bool))
        and not (torch.is_tensor(item[0]) and item[0].dim() == 0)
    ):
        parts = [_flat_ids(x) for x in item]
        return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.long)
    return torch.as_tensor(item, dtype=torch.long).flatten()


def count_tokens(data: Iterable[Any], vocab_size: int, ignore_index: int = -100) -> torch.Tensor:
    """Counts of every token id ``0..vocab_size-1`` (LongTensor ``[vocab_size]``) in ``data``.

    ``data`` is an iterable of sequences of ids: lists (nested ones may be ragged), numpy arrays, tensors of
    any shape (e.g. a ``[n, block]`` batch), or mappings as HF datasets, tokenizers (``BatchEncoding``) and
    data loaders yield them (``"input_ids"`` is counted; ``"labels"`` where there is none). Ids equal to
    ``ignore_index`` are skipped; any other id outside ``[0, vocab_size)`` raises ``ValueError``.
    """
    counts = torch.zeros(vocab_size, dtype=torch.long)
    for item in data:
        if isinstance(item, Mapping):
            key = "input_ids" if "input_ids" in item else "labels"
            if key not in item:
                raise ValueError(f"count_tokens: a dict item needs 'input_ids' or 'labels'; got keys {sorted(item)}")
            item = item[key]
        ids = _flat_ids(item)
        ids = ids[ids != ignore_index]
        bad = (ids < 0) | (ids >= vocab_size)
        if bool(bad.any()):
            raise ValueError(
                f"count_tokens: id {int(ids[bad][0])} is out of range; allowed: [0, {vocab_size}) or "
                f"ignore_index={ignore_index}"
            )
        counts += torch.bincount(ids, minlength=vocab_size).cpu()  # ids may come on the GPU
    return counts


def frequency_order(counts) -> torch.Tensor:
    """Token ids from most to least frequent (ties: the smaller id first), from ``counts`` in id order."""
    counts = torch.as_tensor(counts).flatten().cpu()
    if counts.is_floating_point() and not bool(torch.isfinite(counts).all()):
        raise ValueError("frequency_order: counts must be finite")
    return torch.sort(-counts.double(), stable=True).indices
