"""One call to turn a trained softmax output layer into a fast-inference head (or any head built from it).

``convert_head(source, "svd_softmax", **options)`` accepts

* a softmax-like head (``softmax``, ``svd_softmax``, ``adaptive_sampling``: heads whose distribution is
  ``softmax(W g + b)``) or an ``nn.Linear``: returns a new head started from its weight and bias;
* a transformers model: its ``lm_head`` (or its softmax-like head, if it has one already) is replaced
  in place, ties to the input embedding kept; returns the model (``save_pretrained`` records the head);
* a fairseq model built with ``--output-head`` (the plugin's ``head_*`` architectures): the decoder's
  head is replaced in place; returns the model. On the command line the same is
  ``--model-overrides "{'output_head': 'svd_softmax'}"`` at ``fairseq-generate`` / ``fairseq-eval-lm``
  time: the parameters of these heads are the same (``weight``, ``bias``), so a checkpoint trained
  with ``--output-head softmax`` loads into any of them.
"""
from __future__ import annotations

import json
from typing import Any

from torch import nn

from .interface import OutputHead
from .registry import build_head, heads_where


def _from_projection(layer: nn.Module, name: str, options: dict) -> OutputHead:
    """A head ``name`` started from a softmax-like head or an ``nn.Linear`` (same dtype and device)."""
    if isinstance(layer, OutputHead) and not layer.is_linear_softmax:
        raise ValueError(
            f"convert_head: a {layer.head_name!r} head is not a softmax of W g + b; only softmax-like heads "
            f"({', '.join(heads_where(is_linear_softmax=True))}) and nn.Linear layers can be converted")
    if not isinstance(layer, (OutputHead, nn.Linear)):
        raise ValueError(f"convert_head: cannot convert a {type(layer).__name__}; expected a softmax-like head, "
                         f"an nn.Linear, a transformers model or a fairseq model with --output-head")
    w = layer.weight.detach()
    b = None if layer.bias is None else layer.bias.detach()
    opts = {"dropout": layer.config.dropout, **options} if isinstance(layer, OutputHead) else dict(options)
    head = build_head(name, hidden_size=w.shape[1], vocab_size=w.shape[0], weight=w, bias=b,
                      use_bias=b is not None, **opts)
    return head.to(device=w.device, dtype=w.dtype).train(layer.training)


def convert_head(source: Any, name: str = "svd_softmax", **options: Any):
    """Rebuild the trained softmax output layer of ``source`` as the head ``name`` (module docstring).

    The output embedding is copied (heads keep it shared with the input embedding where the source
    did, for heads that can be tied); ``options`` are the new head's options.
    """
    decoder_head = getattr(getattr(source, "decoder", None), "head", None)
    if isinstance(decoder_head, OutputHead):  # fairseq, the plugin's decoder
        embed = getattr(source.decoder, "embed_tokens", None)
        tied = embed is not None and decoder_head.weight is getattr(embed, "weight", None)
        source.decoder.head = _from_projection(decoder_head, name, options)
        if tied and source.decoder.head.can_tie:
            source.decoder.head.tie_weight(embed)
        spec = getattr(source, "args", None) or getattr(getattr(source, "cfg", None), "model", None)
        if spec is not None and hasattr(spec, "output_head"):
            spec.output_head, spec.head_options = name, json.dumps(options)
        return source
    if hasattr(getattr(source, "decoder", None), "output_projection"):
        raise ValueError("convert_head: this fairseq model has a stock output projection; train it with the "
                         "plugin's head_<ARCH> architecture (--user-dir fairseq_plugin --output-head softmax)")
    try:
        from transformers import PreTrainedModel
    except ImportError:  # pragma: no cover - transformers is optional
        PreTrainedModel = ()
    if isinstance(source, PreTrainedModel):
        from ..hf import HeadModelMixin, swap_head

        if not isinstance(source, HeadModelMixin):
            return swap_head(source, name, **options)
        old = source.get_output_embeddings()
        inputs = source.get_input_embeddings()
        tied = inputs is not None and old.weight is getattr(inputs, "weight", None)
        head = _from_projection(old, name, options)
        source.set_output_embeddings(head)
        if tied and head.can_tie:
            head.tie_weight(inputs)
        source.config.output_head = {"name": name, "options": dict(options), "use_bias": head.bias is not None}
        source._forget_head_ties()
        return source
    return _from_projection(source, name, options)
