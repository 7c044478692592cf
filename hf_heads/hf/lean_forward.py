"""The lean training forward of a head model: the model runs with the head replaced by a stand-in that keeps the
hidden states, then the head's memory-lean loss scores them against the labels as the model would have used them."""

from __future__ import annotations

import contextlib
import inspect
import re
import sys
from typing import Callable, Optional

import torch
import torch.nn.functional as F
from torch import nn

from .peft import running_head


class _HiddenCapture(nn.Module):
    """Stands in for the head during a lean training forward: keeps the hidden states it is called with and
    returns a zero-strided placeholder of the logits' shape (no memory), which the caller drops."""

    def __init__(self, vocab_size: int, store: list, head: nn.Module = None):
        super().__init__()
        self.vocab_size, self.store = vocab_size, store
        self.__dict__["_head"] = head  # (not a submodule: its parameters stay the head's)

    def __getattr__(self, name):
        # what a model's forward reads from its lm_head besides calling it (Mamba: lm_head.weight.dtype)
        try:
            return super().__getattr__(name)
        except AttributeError:
            head = self.__dict__.get("_head")
            if head is None:
                raise
            return getattr(head, name)

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
    with head_replaced_by(model, _HiddenCapture(head.config.vocab_size, captured, model.get_output_embeddings())):
        out = base_forward(model, *args, **kwargs)
    if len(captured) != 1:
        raise RuntimeError(
            f"{type(model).__name__}: the output layer ran {len(captured)} times in one forward; "
            f"set head.lean_loss = False for this model"
        )
    return out, captured[0]


def is_seq2seq(model) -> bool:
    """Whether ``model``'s forward takes decoder inputs (an encoder-decoder LM), whatever its config says (Whisper's
    and BART's causal classes have configs with ``is_encoder_decoder=True``)."""
    base = getattr(type(model), "_head_base_class", type(model))
    return "decoder_input_ids" in inspect.signature(base.forward).parameters


#: the call a seq2seq forward makes its decoder inputs from the labels with
_SHIFTS_LABELS = re.compile(
    r"(shift_tokens_right|_shift_right|prepare_decoder_input_ids_from_labels)\(\s*(labels|input_ids=labels|labels=labels)\b"
)


def decoder_inputs_from_labels(model) -> Optional[Callable]:
    """How a seq2seq model makes ``decoder_input_ids`` from ``labels`` when it is not given them, where its forward
    does (BART, T5, ...; FSMT's shifts its ``input_ids`` instead): its ``prepare_decoder_input_ids_from_labels``, else
    its module's ``shift_tokens_right(input_ids, pad_token_id, decoder_start_token_id)`` (Blenderbot, M2M-100, ...
    call it and have no method); None otherwise (the lean loss then needs the decoder inputs given, or does not
    apply: the model's own forward and loss run)."""
    base = getattr(type(model), "_head_base_class", type(model))
    try:
        if not _SHIFTS_LABELS.search(inspect.getsource(base.forward)):
            return None
    except (OSError, TypeError):
        return None
    method = getattr(model, "prepare_decoder_input_ids_from_labels", None)
    if callable(method):
        return lambda labels: method(labels=labels)
    shift = getattr(sys.modules.get(base.__module__), "shift_tokens_right", None)
    if callable(shift) and list(inspect.signature(shift).parameters)[:3] == [
        "input_ids",
        "pad_token_id",
        "decoder_start_token_id",
    ]:
        config = model.config
        return lambda labels: shift(labels, config.pad_token_id, config.decoder_start_token_id)
    return None


def lean_forward(model, base_forward, args, kwargs):
    """The model's forward without labels (the head captured instead of run), then the head's lean loss on the
    captured hidden states against the labels as the model would have used them."""
    head = running_head(model.get_output_embeddings())
    kwargs = dict(kwargs)
    labels = kwargs.pop("labels")
    shift_labels = kwargs.pop("shift_labels", None)
    num_items = kwargs.pop("num_items_in_batch", None)
    if is_seq2seq(model):  # what the seq2seq models do with labels besides the loss
        if kwargs.get("decoder_input_ids") is None and kwargs.get("decoder_inputs_embeds") is None:
            kwargs["decoder_input_ids"] = decoder_inputs_from_labels(model)(labels)
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
