"""Saving and loading heads (config JSON + weights-only state dict)."""

from __future__ import annotations

import json
import os
from typing import Union

import torch

from .interface import OutputHead
from .registry import get_head_class

CONFIG_NAME = "head_config.json"
WEIGHTS_NAME = "head_state.pt"
FORMAT_VERSION = 1


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
        raise ValueError(
            f"load_head: {cfg_file} has format_version={meta.get('format_version')!r}; "
            f"this version of softmax-heads reads {FORMAT_VERSION}"
        )
    cls = get_head_class(meta["head"])
    head = cls(cls.config_class.from_options(**meta["config"]))
    state = torch.load(os.path.join(path, WEIGHTS_NAME), map_location=map_location, weights_only=True)
    head.load_state_dict(state)
    return head.to(map_location)
