"""``hf_heads.convert_head`` on fairseq models (registered with the core when the plugin is imported): the head of a
model built with ``--output-head`` rebuilt as another head, or a stock model's output projection rebuilt as a head, in
place. The same for a checkpoint file: ``python -m fairseq_plugin.convert`` (:mod:`fairseq_plugin.convert`)."""

import json
from typing import Any, Dict

from hf_heads.core.convert import from_projection, register_converter
from hf_heads.heads import OutputHead

from .models import HeadTransformerDecoder, HeadTransformerLanguageModel, HeadTransformerModel
from .options import build_decoder_head


@register_converter
def convert_fairseq_model(source, name: str, options: dict):
    """A model built with ``--output-head`` (``head_ARCH``, ``head_awd_lstm_lm``): its ``decoder.head`` becomes the
    head ``name`` started from it, tied to the input embedding where it was, and the model's config records the new
    head (so a checkpoint saved from it rebuilds it). A stock fairseq model (``decoder.output_projection``) gets the
    head started from its projection (:func:`convert_stock_model`); anything else is not a fairseq model (None)."""
    decoder = getattr(source, "decoder", None)
    head = getattr(decoder, "head", None)
    if isinstance(head, OutputHead):
        embed = getattr(decoder, "embed_tokens", None)
        tied = embed is not None and head.weight is getattr(embed, "weight", None)
        decoder.head = from_projection(head, name, options)
        if tied and decoder.head.can_tie:
            decoder.head.tie_weight(embed)
        spec = getattr(source, "args", None) or getattr(getattr(source, "cfg", None), "model", None)
        if spec is not None and hasattr(spec, "output_head"):
            spec.output_head, spec.head_options = name, json.dumps(options)
            if hasattr(spec, "head_start"):  # the options hold what a start set: a stale word would be resolved again
                spec.head_start = ""
        return source
    if hasattr(decoder, "output_projection") and hasattr(decoder, "share_input_output_embed"):
        return convert_stock_model(source, name, options)
    return None


def convert_stock_model(model, name: str, options: Dict[str, Any]):
    """A loaded stock ``transformer`` / ``transformer_lm`` model (the hub's ``models[0]``) given the head ``name``,
    in place: its decoder becomes a :class:`~fairseq_plugin.models.HeadTransformerDecoder` whose head starts from
    the output projection (tied where it was). ``options`` are the head's, ``start`` applied already
    (:func:`hf_heads.convert_head` does). The model's config (fairseq's ``TransformerConfig``) has no place for a
    head: a checkpoint file with the head is what :func:`fairseq_plugin.stock.convert_checkpoint` writes."""
    from fairseq.models.transformer import TransformerDecoder, TransformerDecoderBase, TransformerModel
    from fairseq.models.transformer_lm import TransformerLanguageModel

    decoder = model.decoder
    # the classes themselves, not subclasses (BART, the NAT models, ...): their own methods would be lost
    if type(model) not in (TransformerModel, TransformerLanguageModel) or type(decoder) not in (
        TransformerDecoder,
        TransformerDecoderBase,
    ):
        raise ValueError(
            f"convert_head: a stock {type(model).__name__} (decoder {type(decoder).__name__}) cannot get a head; the "
            f"plugin mirrors fairseq's transformer and transformer_lm models"
        )
    if getattr(decoder, "adaptive_softmax", None) is not None or decoder.output_projection is None:
        raise ValueError(
            "convert_head: this fairseq model has an adaptive softmax: its output layer is not a plain projection, "
            "so no head can start from it"
        )
    projection = decoder.output_projection
    try:
        head = build_decoder_head(name, options, decoder.output_embed_dim, projection.weight.shape[0])
        head.init_from_projection(projection.weight.detach().to(next(head.parameters()).dtype), None)
        head = head.to(device=projection.weight.device, dtype=projection.weight.dtype).train(decoder.training)
        if decoder.share_input_output_embed:
            head.tie_weight(decoder.embed_tokens)
    except ValueError as e:  # HeadFlagError too: named by the flag, said here by the call
        raise ValueError(f"convert_head: {e}") from None
    decoder.__class__ = HeadTransformerDecoder
    decoder._head_spec = (name, dict(options))
    decoder.output_projection = None
    decoder.head = head
    model.__class__ = HeadTransformerModel if isinstance(model, TransformerModel) else HeadTransformerLanguageModel
    return model
