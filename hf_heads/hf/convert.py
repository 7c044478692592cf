"""``hf_heads.convert_head`` on transformers models (registered with the core when this adapter is imported)."""

from __future__ import annotations

import sys

from ..core.convert import carried_options, from_projection, register_converter
from .config import head_spec
from .modeling import HeadModelMixin, swap_head


@register_converter
def convert_transformers_model(source, name: str, options: dict):
    """A plain model gets the head through :func:`swap_head`; a model with a head already has it rebuilt as the head
    ``name`` in place (tie kept, config updated); None for anything that is not a transformers model."""
    if "transformers.modeling_utils" not in sys.modules:  # no model class loaded: not a transformers model (and
        return None  # importing PreTrainedModel here would cost every process 1 s)
    from transformers import PreTrainedModel

    if not isinstance(source, PreTrainedModel):
        return None
    if not isinstance(source, HeadModelMixin):
        return swap_head(source, name, **options)
    old = source.get_output_embeddings()
    inputs = source.get_input_embeddings()
    tied = inputs is not None and old.weight is getattr(inputs, "weight", None)
    options = carried_options(old, options)  # (recorded: a map the model no longer applies stays in the head)
    head = from_projection(old, name, options)
    source.set_output_embeddings(head)
    if tied and head.can_tie:
        head.tie_weight(inputs)
    source.config.output_head = head_spec(name, options, head.bias is not None)
    source._forget_head_ties()
    return source
