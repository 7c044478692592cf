"""One call to turn a trained softmax output layer into a fast-inference head (or any head built from it).

``convert_head(source, "svd_softmax", **options)`` accepts

* a softmax-like head (``softmax``, ``svd_softmax``, ``adaptive_sampling``: heads whose distribution is
  ``softmax(W g + b)``) or an ``nn.Linear``: returns a new head started from its weight and bias;
* a transformers model (:mod:`hf_heads.hf` converts it): its ``lm_head`` (or its softmax-like head, if it has
  one already) is replaced in place, ties to the input embedding kept; returns the model (``save_pretrained``
  records the head);
* a fairseq model built with ``--output-head`` (the plugin's ``head_*`` architectures; ``fairseq_plugin`` converts
  it): the decoder's head is replaced in place; returns the model. On the command line the same is
  ``--model-overrides "{'output_head': 'svd_softmax'}"`` at ``fairseq-generate`` / ``fairseq-eval-lm``
  time: the parameters of these heads are the same (``weight``, ``bias``), so a checkpoint trained
  with ``--output-head softmax`` loads into any of them.
"""

from __future__ import annotations

from typing import Any, Callable, List, Optional

from torch import nn

from .interface import OutputHead
from .registry import build_head, heads_where, start_options


def carried_options(layer: nn.Module, options: dict) -> dict:
    """``options`` for a head rebuilt from ``layer``, with what it keeps of a head: its dropout unless given, and its
    fixed map of the logits (``logit_scale`` / ``logit_softcap``: part of what the model computes, which
    ``swap_head`` switched off in the model; options that would change it are refused). An ``nn.Linear``: as given."""
    if not isinstance(layer, OutputHead):
        return dict(options)
    c = layer.config
    kept = {"dropout": c.dropout, **options}
    for name in ("logit_scale", "logit_softcap"):
        value = getattr(c, name)
        if name in options and options[name] != value:
            raise ValueError(
                f"convert_head: option {name}={options[name]!r}, but the source head applies {name}={value!r} (the "
                f"model's own map of its logits, which the head carries): leave it out"
            )
        if c.has_logit_map:
            kept[name] = value
    return kept


def from_projection(layer: nn.Module, name: str, options: dict) -> OutputHead:
    """A head ``name`` started from a softmax-like head or an ``nn.Linear`` (same dtype and device)."""
    if isinstance(layer, OutputHead) and not layer.is_linear_softmax:
        raise ValueError(
            f"convert_head: a {layer.head_name!r} head is not a softmax of W g + b; only softmax-like heads "
            f"({', '.join(heads_where(is_linear_softmax=True))}) and nn.Linear layers can be converted"
        )
    if not isinstance(layer, (OutputHead, nn.Linear)):
        raise ValueError(
            f"convert_head: cannot convert a {type(layer).__name__}; expected a softmax-like head, "
            f"an nn.Linear, a transformers model or a fairseq model with --output-head"
        )
    w = layer.weight.detach()
    b = None if layer.bias is None else layer.bias.detach()
    opts = carried_options(layer, options)
    head = build_head(
        name, hidden_size=w.shape[1], vocab_size=w.shape[0], weight=w, bias=b, use_bias=b is not None, **opts
    )
    return head.to(device=w.device, dtype=w.dtype).train(layer.training)


#: the adapters' converters, in the order they registered (:func:`register_converter`)
_CONVERTERS: List[Callable[[Any, str, dict], Optional[Any]]] = []


def register_converter(converter: Callable[[Any, str, dict], Optional[Any]]) -> Callable:
    """Let an adapter convert its own models: ``converter(source, name, options)`` returns ``source`` with its
    output layer rebuilt as the head ``name`` (or raises ``ValueError`` saying why it cannot), or None when
    ``source`` is not one of its models. The transformers adapter registers one when it is imported (by ``import
    hf_heads`` where transformers is installed), the fairseq plugin when it is."""
    if converter not in _CONVERTERS:
        _CONVERTERS.append(converter)
    return converter


def convert_head(source: Any, name: str = "svd_softmax", *, start: Optional[str] = None, **options: Any):
    """Rebuild the trained softmax output layer of ``source`` as the head ``name`` (module docstring).

    The output embedding is copied (heads keep it shared with the input embedding where the source
    did, for heads that can be tied); ``options`` are the new head's options, ``start="pretrained"`` adds those that
    make it start exactly as ``softmax(W g + b)`` of the source's projection (what ``source`` computes when it is a
    softmax-like head, an ``nn.Linear`` or a model's plain output layer), or refuses a head with no exact start
    (``"nearest"``: with a warning), :mod:`hf_heads.core.start`.
    """
    options = start_options(name, start, options, "convert_head: start")
    for converter in _CONVERTERS:
        converted = converter(source, name, options)
        if converted is not None:
            return converted
    return from_projection(source, name, options)
