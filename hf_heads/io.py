"""Building heads by name, and saving / loading them (config JSON + weights-only state dict)."""
from __future__ import annotations

import json
import os
from typing import Any, Optional, Union

import torch

from .frequency import frequency_order as order_by_counts
from .heads import OutputHead, get_head_class

CONFIG_NAME = "head_config.json"
WEIGHTS_NAME = "head_state.pt"
FORMAT_VERSION = 1


def build_head(name: str, hidden_size: int, vocab_size: int, weight: Optional[torch.Tensor] = None,
               bias: Optional[torch.Tensor] = None, frequency_order=None, token_counts=None,
               **options: Any) -> OutputHead:
    """Build the head registered as ``name``.

    ``weight`` (V x d) and ``bias`` (V) start the output embedding from an existing projection
    (e.g. a trained ``lm_head``); ``embedding_size`` defaults to ``weight.shape[1]`` then.
    ``frequency_order`` (ids, most frequent first) or ``token_counts`` (V counts in id order) give heads that
    treat ids as ordered by frequency (mixtape, class_softmax, d_softmax) the order of a vocabulary that is not
    sorted (:meth:`OutputHead.set_frequency_order`); without them such heads take ids as sorted.
    Unknown options or values out of range raise ``ValueError`` naming them.
    """
    cls = get_head_class(name)
    if weight is not None and torch.is_tensor(weight) and weight.dim() == 2:
        options.setdefault("embedding_size", int(weight.shape[1]))
    if bias is not None and "use_bias" not in options:
        options["use_bias"] = True
    config = cls.config_class.from_options(hidden_size=hidden_size, vocab_size=vocab_size, **options)
    head = cls(config)
    if frequency_order is not None and token_counts is not None:
        raise ValueError(f"{name}: give frequency_order or token_counts, not both")
    if token_counts is not None:
        counts = torch.as_tensor(token_counts)
        if counts.numel() != vocab_size:
            raise ValueError(f"{name}: token_counts has {counts.numel()} entries; expected one per token id, "
                             f"vocab_size={vocab_size}")
        frequency_order = order_by_counts(counts)
    if frequency_order is not None:  # before the projection: d_softmax lays its bands out by it
        head.set_frequency_order(frequency_order)
    if weight is not None or bias is not None:
        if weight is None:
            raise ValueError(f"{name}: bias given without weight; pass the projection's weight too")
        head.init_from_projection(weight, bias)
    return head


def save_head(head: OutputHead, path: Union[str, os.PathLike]) -> None:
    """Save ``head`` to the directory ``path``: ``head_config.json`` + ``head_state.pt``."""
    if not isinstance(head, OutputHead):
        raise ValueError(f"save_head: expected an OutputHead, got {type(head).__name__}")
    os.makedirs(path, exist_ok=True)
    meta = {"format_version": FORMAT_VERSION, "head": head.head_name, "config": head.config.to_dict()}
    with open(os.path.join(path, CONFIG_NAME), "w") as f:
        json.dump(meta, f, indent=2, sort_keys=True)
    state = {k: v.detach().cpu().contiguous() for k, v in head.state_dict().items()}
    torch.save(state, os.path.join(path, WEIGHTS_NAME))


def load_head(path: Union[str, os.PathLike], map_location: Union[str, torch.device] = "cpu") -> OutputHead:
    """Load a head saved by :func:`save_head` (weights loaded with ``weights_only=True``)."""
    cfg_file = os.path.join(path, CONFIG_NAME)
    if not os.path.isfile(cfg_file):
        raise ValueError(f"load_head: {cfg_file} not found; {path!s} is not a directory written by save_head")
    with open(cfg_file) as f:
        meta = json.load(f)
    if meta.get("format_version") != FORMAT_VERSION:
        raise ValueError(f"load_head: {cfg_file} has format_version={meta.get('format_version')!r}; "
                         f"this version of softmax-heads reads {FORMAT_VERSION}")
    cls = get_head_class(meta["head"])
    head = cls(cls.config_class.from_options(**meta["config"]))
    state = torch.load(os.path.join(path, WEIGHTS_NAME), map_location=map_location, weights_only=True)
    head.load_state_dict(state)
    return head.to(map_location)
