"""The lean training forward of a head model: the model runs with the head replaced by a stand-in that keeps the
hidden states, then the head's memory-lean loss scores them against the labels as the model would have used them."""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from torch import nn

from .peft import running_head


class _HiddenCapture(nn.Module):
    """Stands in for the head during a lean training forward: keeps the hidden states it is called with and
    returns a zero-strided placeholder of the logits' shape (no memory), which the caller drops."""

    def __init__(self, vocab_size: int, store: list):
        super().__init__()
        self.vocab_size, self.store = vocab_size, store

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        self.store.append(hidden)
        return hidden.new_zeros(()).expand(*hidden.shape[:-1], self.vocab_size)


@contextlib.contextmanager
def head_replaced_by(model, stand_in: nn.Module):
    head = model.get_output_embeddings()  # (a wrapper around the head, e.g. PEFT's, is replaced as a whole)
    path = next(name for name, m in model.named_modules() if m is head)
    parent_path, _, attr = path.rpartition(".")
    parent = model.get_submodule(parent_path)
    parent._modules[attr] = stand_in
    try:
        yield
    finally:
        parent._modules[attr] = head


def capture_hidden(model, base_forward, args, kwargs):
    """``(outputs, hidden)``: the model's forward with the head replaced by a stand-in that keeps the hidden states it
    is given (the outputs' ``logits`` are a zero-strided placeholder: drop them)."""
    captured = []
    head = running_head(model.get_output_embeddings())
    with head_replaced_by(model, _HiddenCapture(head.config.vocab_size, captured)):
        out = base_forward(model, *args, **kwargs)
    if len(captured) != 1:
        raise RuntimeError(
            f"{type(model).__name__}: the output layer ran {len(captured)} times in one forward; "
            f"set head.lean_loss = False for this model"
        )
    return out, captured[0]


def lean_forward(model, base_forward, args, kwargs):
    """The model's forward without labels (the head captured instead of run), then the head's lean loss on the
    captured hidden states against the labels as the model would have used them."""
    head = running_head(model.get_output_embeddings())
    kwargs = dict(kwargs)
    labels = kwargs.pop("labels")
    shift_labels = kwargs.pop("shift_labels", None)
    num_items = kwargs.pop("num_items_in_batch", None)
    if model.config.is_encoder_decoder:  # what the seq2seq models do with labels besides the loss
        if kwargs.get("decoder_input_ids") is None and kwargs.get("decoder_inputs_embeds") is None:
            kwargs["decoder_input_ids"] = model.prepare_decoder_input_ids_from_labels(labels=labels)
        kwargs["use_cache"] = False
        num_items = None  # their loss is CrossEntropyLoss()'s mean over the non-ignored labels
        target = labels
    else:  # causal LMs: position t predicts label t + 1 (transformers' ForCausalLMLoss)
        target = shift_labels if shift_labels is not None else F.pad(labels, (0, 1), value=-100)[..., 1:]
    out, hidden = capture_hidden(model, base_forward, args, kwargs)
    target = target.to(hidden.device)
    if num_items is None:
        loss = head.loss(hidden, target)
    else:
        loss = head.loss(hidden, target, reduction="sum") / torch.as_tensor(num_items).to(target.device)
    fields = {k: v for k, v in out.items() if k not in ("loss", "logits")}
    return type(out)(loss=loss, **fields)
