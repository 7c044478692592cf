"""The registry of heads: the one list every adapter, the docs table and the tests read, and ``build_head``."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Dict, Optional

import torch
from torch import nn

from .config import HeadConfig, did_you_mean
from .frequency import frequency_order as order_by_counts
from .start import options_for_start, start_row

#: name -> head class (an :class:`~hf_heads.core.interface.OutputHead` subclass; the registry imports none)
_REGISTRY: Dict[str, type] = {}


def register_head(name: str) -> Callable[[type], type]:
    """Class decorator: make a head buildable as ``build_head(name, ...)``.

    The registry is the one list of heads: the HF config validation, fairseq's
    ``--output-head`` choices, the docs table and the test table all read it.
    """

    def wrap(cls: type) -> type:
        if name in _REGISTRY and _REGISTRY[name] is not cls:
            raise ValueError(f"head name {name!r} is already registered by {_REGISTRY[name].__name__}")
        cls.head_name = name
        cls.config_class.head_name = name
        _REGISTRY[name] = cls
        return cls

    return wrap


def available_heads() -> list:
    """Sorted names of every registered head."""
    return sorted(_REGISTRY)


def heads_where(**flags: Any) -> list:
    """Sorted names of the registered heads whose class attributes equal ``flags``, e.g.
    ``heads_where(uses_frequency_order=True)``: lists of heads in messages and docs come from here."""
    for flag in flags:
        if any(not hasattr(cls, flag) for cls in _REGISTRY.values()):
            raise ValueError(f"heads_where: {flag!r} is not a class attribute of every head")
    return [name for name in available_heads() if all(getattr(_REGISTRY[name], k) == v for k, v in flags.items())]


def head_specific_options(name: str) -> list:
    """The dataclass fields a head adds to the shared :class:`HeadConfig` options, in order."""
    shared = {f.name for f in dataclasses.fields(HeadConfig)}
    return [f for f in dataclasses.fields(get_head_class(name).config_class) if f.name not in shared]


def get_head_class(name: str) -> type:
    """The head class registered under ``name``; ``ValueError`` listing the names otherwise."""
    if not isinstance(name, str) or name not in _REGISTRY:
        raise ValueError(
            f"unknown output head {name!r}{did_you_mean(name, _REGISTRY)}; available heads: "
            f"{', '.join(available_heads())}"
        )
    return _REGISTRY[name]


def check_head_options(name: str, hidden_size: int, vocab_size: int, **options: Any) -> HeadConfig:
    """The config ``build_head(name, hidden_size, vocab_size, **options)`` would build from, checked the way it checks
    it, without building the head (no weights): ``ValueError`` naming the head, the option, its value and what is
    allowed. For a tool that takes a head and its options from a user (a command-line flag, a table's variant) and
    wants to stop before it has a model."""
    cls = get_head_class(name)
    return cls.check_config(cls.config_class.from_options(hidden_size=hidden_size, vocab_size=vocab_size, **options))


def start_options(name: str, start: Optional[str], options: Dict[str, Any], where: str = "start") -> Dict[str, Any]:
    """The options of head ``name`` for ``start`` (``None``, ``"pretrained"``, ``"nearest"``;
    :mod:`hf_heads.core.start`): what ``build_head(..., start=start)`` builds from, for a caller that records the
    options (a saved config, a checkpoint's flags)."""
    return options_for_start(get_head_class(name), start, options, where)


def has_exact_start(name: str) -> bool:
    """Whether head ``name`` built from a projection can start exactly as ``softmax(W g + b)``."""
    return get_head_class(name).pretrained_start is not None


def start_table() -> list:
    """``[(head, exact, what it sets or how far it is)]`` for every head: the docs' table of starts."""
    return [(name, *start_row(get_head_class(name))) for name in available_heads()]


def versioned_options(name: str, options: Dict[str, Any], version: int) -> Dict[str, Any]:
    """The options a stored spec of ``version`` means for head ``name``: ``options``, plus every default the head
    changed since ``version`` at the value it had then (its class's ``legacy_defaults``), where ``options`` does not
    set it. An unknown name gets ``options`` as they are (building it names the choices)."""
    out = dict(options)
    legacy = getattr(_REGISTRY.get(name), "legacy_defaults", {})
    for v in sorted(legacy):
        if v >= version:
            for key, value in legacy[v].items():
                out.setdefault(key, value)
    return out


def build_head(
    name: str,
    hidden_size: int,
    vocab_size: int,
    weight: Optional[torch.Tensor] = None,
    bias: Optional[torch.Tensor] = None,
    frequency_order=None,
    token_counts=None,
    start: Optional[str] = None,
    **options: Any,
) -> nn.Module:
    """Build the head registered as ``name``.

    ``weight`` (V x d) and ``bias`` (V) start the output embedding from an existing projection
    (e.g. a trained ``lm_head``); ``embedding_size`` defaults to ``weight.shape[1]`` then.
    ``frequency_order`` (ids, most frequent first) or ``token_counts`` (V counts in id order) give heads that
    treat ids as ordered by frequency (``heads_where(uses_frequency_order=True)``) the order of a vocabulary that is not
    sorted (:meth:`OutputHead.set_frequency_order`); without them such heads take ids as sorted.
    ``start="pretrained"`` adds the options that make the head start exactly as ``softmax(weight g + bias)``, or
    refuses a head that has no exact start; ``start="nearest"`` builds such a head anyway, with a warning saying how
    far its start is (:mod:`hf_heads.core.start`).
    Unknown options or values out of range raise ``ValueError`` naming them.
    """
    cls = get_head_class(name)
    options = options_for_start(cls, start, options, "build_head: start")
    if weight is not None and torch.is_tensor(weight) and weight.dim() == 2:
        options.setdefault("embedding_size", int(weight.shape[1]))
    if bias is not None and "use_bias" not in options:
        options["use_bias"] = True
    config = cls.config_class.from_options(hidden_size=hidden_size, vocab_size=vocab_size, **options)
    head = cls(config)  # the constructor runs the class's check_config
    if frequency_order is not None and token_counts is not None:
        raise ValueError(f"{name}: give frequency_order or token_counts, not both")
    if token_counts is not None:
        counts = torch.as_tensor(token_counts)
        if counts.numel() != vocab_size:
            raise ValueError(
                f"{name}: token_counts has {counts.numel()} entries; expected one per token id, vocab_size={vocab_size}"
            )
        frequency_order = order_by_counts(counts)
    if frequency_order is not None:  # before the projection: d_softmax lays its bands out by it
        head.set_frequency_order(frequency_order)
    if weight is not None or bias is not None:
        if weight is None:
            raise ValueError(f"{name}: bias given without weight; pass the projection's weight too")
        head.init_from_projection(weight, bias)
    return head
