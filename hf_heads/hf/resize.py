"""``resize_token_embeddings`` on a head model: the head resizes with the input embedding (its per-id state
follows), or refuses before anything changes."""

from __future__ import annotations

import torch
from torch import nn

from ..core import OutputHead
from .lean_forward import head_replaced_by
from .peft import running_head


def resize_token_embeddings(model, base_resize, new_num_tokens, pad_to_multiple_of=None, mean_resizing=True):
    """``model``'s ``_resize_token_embeddings``: transformers' resize (``base_resize``: the input embedding, then the
    output projection, new rows from the old rows' mean and covariance with ``mean_resizing``), with the head resized
    through :meth:`OutputHead.resize_vocab`: transformers resizes a plain ``nn.Linear`` standing in for the head,
    whose rows the head then takes."""
    head = model.get_output_embeddings()
    if not isinstance(head, OutputHead):
        if running_head(head) is not None:
            raise ValueError(
                "resize_token_embeddings: the head is wrapped by PEFT (modules_to_save); resize "
                "the model before get_peft_model"
            )
        return base_resize(new_num_tokens, pad_to_multiple_of, mean_resizing)
    size = head.config.vocab_size if new_num_tokens is None else new_num_tokens
    if pad_to_multiple_of is not None:
        size = -(-size // pad_to_multiple_of) * pad_to_multiple_of
    head.check_resize_vocab(size)  # a head that cannot resize refuses before anything changes
    before = head.config.to_dict()
    tied = head.weight is getattr(model.get_input_embeddings(), "weight", None)
    stand_in = nn.Linear(head.config.embedding_size, head.config.vocab_size, bias=head.bias is not None, device="meta")
    stand_in.weight, stand_in.bias = head.weight, head.bias
    if head.weight.dim() == 3:  # DS-Softmax's experts: transformers draws the new rows from their mean
        stand_in.weight = nn.Parameter(head.weight.detach().mean(0))
        stand_in.bias = None if head.bias is None else nn.Parameter(head.bias.detach().mean(0))
    with head_replaced_by(model, stand_in):
        embeddings = base_resize(new_num_tokens, pad_to_multiple_of, mean_resizing)
        resized = model.get_output_embeddings()
    if tied:  # transformers re-ties after this; the head's own state follows the input embedding's rows
        head.resize_vocab(size, weight=embeddings.weight, bias=resized.bias)
        head.tie_weight(embeddings)
    else:
        head.resize_vocab(size, weight=resized.weight, bias=resized.bias)
    if hasattr(head, "out_features"):  # (the nn.Linear sizes a head model gives its head: modeling.set_layer_sizes)
        head.out_features = head.config.vocab_size
    # options the resize changed (Mixtape's frequent_fraction) go into the config from_pretrained builds from
    model.config.output_head["options"].update(
        {k: v for k, v in head.config.to_dict().items() if v != before[k] and k != "vocab_size"}
    )
    final_bias = getattr(model, "final_logits_bias", None)
    if torch.is_tensor(final_bias):  # BART, Marian: folded into the head's bias at the swap
        final_bias.zero_()
    return embeddings
