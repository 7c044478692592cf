"""``hf_heads.convert_head`` on fairseq models: the decoder's head rebuilt as another head, in place (registered
with the core when the plugin is imported)."""

import json

from hf_heads.core.convert import from_projection, register_converter
from hf_heads.heads import OutputHead


@register_converter
def convert_fairseq_model(source, name: str, options: dict):
    """A model built with ``--output-head`` (``head_ARCH``, ``head_awd_lstm_lm``): its ``decoder.head`` becomes the
    head ``name`` started from it, tied to the input embedding where it was, and the model's config records the new
    head (so a checkpoint saved from it rebuilds it). A stock fairseq model (``decoder.output_projection``) is
    refused, naming the architecture to train instead; anything else is not a fairseq model (None)."""
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
        return source
    if hasattr(decoder, "output_projection"):
        raise ValueError(
            "convert_head: this fairseq model has a stock output projection; train it with the "
            "plugin's head_<ARCH> architecture (--user-dir fairseq_plugin --output-head softmax)"
        )
    return None
