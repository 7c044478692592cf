"""HuggingFace transformers adapter: put a softmax-heads head on any causal or seq2seq LM.

``swap_head(model, name, **options)`` replaces the model's output embeddings (``lm_head``) by a
head started from them, keeping the tie to the input embedding. The head returns normalised
log-probs where the model expects logits, so everything downstream works unchanged:

* the model's own loss (cross-entropy on ``logits``) is the head's NLL, since
  ``log_softmax(log p) = log p``; the head's ``aux_loss()`` is added to it;
* in training (grad enabled, ``labels`` given, the head's ``lean_loss`` on), the loss is instead the head's
  memory-lean :meth:`OutputHead.loss` on the hidden states the head would have seen, with the model's own
  label handling (causal LMs shift, ``shift_labels`` / ``num_items_in_batch`` as transformers' loss reads
  them; seq2seq models build ``decoder_input_ids`` from ``labels`` and average over the labels, as BART,
  T5 and Marian do). No ``[tokens, V]`` tensor is made, so
  such outputs have no ``logits`` (``None``); set ``head.lean_loss = False`` to get them back;
* ``generate`` (greedy, beam search, sampling, top-k/top-p, temperature, which then acts on the
  head's distribution) sees log-probs;
* ``save_pretrained`` / ``from_pretrained`` (safetensors) round-trip through the Auto classes.

Saved configs have ``model_type = "softmax-heads"``, the wrapped model's type in
``base_model_type`` and the head in ``output_head``. ``import hf_heads`` registers
``"softmax-heads"`` with ``AutoConfig``; the per-family config and model classes (e.g.
``SoftmaxHeadsGPT2LMHeadModel``, a subclass of ``GPT2LMHeadModel``) are created when first needed
and registered with ``AutoModelForCausalLM`` / ``AutoModelForSeq2SeqLM``. Without softmax-heads
installed, transformers refuses such a checkpoint naming the model type ``softmax-heads``: the
package to install.
"""
from __future__ import annotations

import contextlib
import functools
from typing import Any, Dict, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn
from transformers import AutoConfig, PretrainedConfig

from .heads import OutputHead
from .io import build_head

MODEL_TYPE = "softmax-heads"  # the pip package name: what transformers prints when it is missing
_CONFIG_CLASSES: Dict[type, type] = {}
_MODEL_CLASSES: Dict[type, type] = {}


def _base_config_class(base_model_type: str) -> type:
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    try:
        return CONFIG_MAPPING[base_model_type]
    except KeyError:
        raise ValueError(f"{MODEL_TYPE}: base_model_type {base_model_type!r} is not a model type this version of "
                         f"transformers knows") from None


class SoftmaxHeadsConfig(PretrainedConfig):
    """The config registered as ``model_type="softmax-heads"``.

    ``from_dict`` returns an instance of the wrapped family's head config (a subclass of e.g.
    ``GPT2Config`` with this model type), chosen by the ``base_model_type`` entry.
    """

    model_type = MODEL_TYPE

    @classmethod
    def from_dict(cls, config_dict: Dict[str, Any], **kwargs):
        base = config_dict.get("base_model_type")
        if not base:
            raise ValueError(f"a {MODEL_TYPE} config needs 'base_model_type' (the wrapped model's type, e.g. 'gpt2')")
        result = head_config_class(_base_config_class(base)).from_dict(config_dict, **kwargs)
        _register_model_classes(result[0] if isinstance(result, tuple) else result)
        return result


def _register_model_classes(config) -> None:
    """Make the Auto model classes know the head model classes of a loaded head config: the class
    named in ``architectures`` (``SoftmaxHeads<Class>``), else the family's Auto-mapped LM classes."""
    import transformers
    from transformers.models.auto import modeling_auto

    base_config = type(config).__mro__[1]
    found = False
    for arch in getattr(config, "architectures", None) or []:
        base_cls = getattr(transformers, arch[len("SoftmaxHeads"):], None) if arch.startswith("SoftmaxHeads") else None
        if isinstance(base_cls, type):
            head_model_class(base_cls)
            found = True
    if not found:
        for mapping in (modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING, modeling_auto.MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING):
            if base_config in mapping:
                head_model_class(mapping[base_config])


def head_config_class(base_config_class: type) -> type:
    """The head config class for a model family: ``base_config_class`` with model_type softmax-heads."""
    if base_config_class.model_type == MODEL_TYPE:
        return base_config_class
    if base_config_class not in _CONFIG_CLASSES:
        _CONFIG_CLASSES[base_config_class] = type(
            f"SoftmaxHeads{base_config_class.__name__}", (base_config_class,),
            {"model_type": MODEL_TYPE, "__module__": __name__,
             "__doc__": f"{base_config_class.__name__} of a model whose output layer is a softmax-heads head."})
    return _CONFIG_CLASSES[base_config_class]


class HeadModelMixin:
    """Mixed into a transformers LM class: builds the head from ``config.output_head`` and adds
    the head's ``aux_loss()`` to the model's loss."""

    def __init__(self, config, *args, **kwargs):
        super().__init__(config, *args, **kwargs)
        spec = getattr(config, "output_head", None)
        if not spec:
            raise ValueError(f"{type(self).__name__} needs config.output_head = {{'name': ..., 'options': {{...}}}}")
        old = self.get_output_embeddings()
        head = build_head(spec["name"], hidden_size=old.weight.shape[1], vocab_size=old.weight.shape[0],
                          use_bias=bool(spec.get("use_bias", False)), **spec.get("options", {}))
        self.set_output_embeddings(head)
        self._forget_head_ties()
        if getattr(config, "tie_word_embeddings", False):
            self.tie_weights()

    def _head_tie_prefix(self) -> Optional[str]:
        """``"lm_head."`` (the head's parameter prefix) when the head cannot be tied, else None."""
        head = self.get_output_embeddings()
        if not isinstance(head, OutputHead) or head.can_tie:
            return None
        return next(name for name, m in self.named_modules() if m is head) + "."

    def get_expanded_tied_weights_keys(self, all_submodels: bool = False) -> dict:
        """transformers' tie map, without the output embedding when the head keeps several copies of it
        (DS-Softmax): the other ties (e.g. BART's encoder/decoder embeddings) stay."""
        keys = super().get_expanded_tied_weights_keys(all_submodels=all_submodels)
        prefix = self._head_tie_prefix()
        return keys if prefix is None else {k: v for k, v in keys.items() if not k.startswith(prefix)}

    def _forget_head_ties(self) -> None:
        """Drop the head from the tie map transformers computed before the head was swapped in."""
        prefix = self._head_tie_prefix()
        if prefix is not None and isinstance(getattr(self, "all_tied_weights_keys", None), dict):
            for k in [k for k in self.all_tied_weights_keys if k.startswith(prefix)]:
                del self.all_tied_weights_keys[k]

    def _lean_loss_applies(self, kwargs) -> bool:
        """Train with the head's memory-lean loss: labels given as a keyword, grad enabled, training mode, the
        head's ``lean_loss`` on, a ModelOutput returned and every position scored (no ``logits_to_keep``)."""
        head = self.get_output_embeddings()
        return (kwargs.get("labels") is not None and isinstance(head, OutputHead) and head.lean_loss_active()
                and kwargs.get("return_dict", getattr(self.config, "return_dict", True)) is not False
                and not kwargs.get("logits_to_keep"))

    def _add_aux_loss(self, out, labels_given: bool):
        if not self.training:  # a regulariser: evaluation losses stay the plain NLL
            return out
        aux = self.get_output_embeddings().aux_loss()
        loss = out.get("loss") if isinstance(out, dict) else None
        if loss is not None:
            out["loss"] = loss + aux.to(loss.dtype)
        elif isinstance(out, tuple) and labels_given and torch.is_tensor(out[0]) and out[0].dim() == 0:
            out = (out[0] + aux.to(out[0].dtype),) + out[1:]
        return out


def _forward_with_aux_loss(base_forward):
    """``base_forward`` plus the head's aux loss, with the base signature (Trainer reads it to
    choose the dataset columns it passes)."""

    @functools.wraps(base_forward)
    def forward(self, *args, **kwargs):
        if self._lean_loss_applies(kwargs):
            return self._add_aux_loss(_lean_forward(self, base_forward, args, kwargs), True)
        return self._add_aux_loss(base_forward(self, *args, **kwargs), kwargs.get("labels") is not None)

    return forward


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
def _head_replaced_by(model, stand_in: nn.Module):
    head = model.get_output_embeddings()
    path = next(name for name, m in model.named_modules() if m is head)
    parent_path, _, attr = path.rpartition(".")
    parent = model.get_submodule(parent_path)
    parent._modules[attr] = stand_in
    try:
        yield
    finally:
        parent._modules[attr] = head


def _lean_forward(model, base_forward, args, kwargs):
    """The model's forward without labels (the head captured instead of run), then the head's lean loss on the
    captured hidden states against the labels as the model would have used them."""
    head = model.get_output_embeddings()
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
    captured = []
    with _head_replaced_by(model, _HiddenCapture(head.config.vocab_size, captured)):
        out = base_forward(model, *args, **kwargs)
    if len(captured) != 1:
        raise RuntimeError(f"{type(model).__name__}: the output layer ran {len(captured)} times in one forward; "
                           f"set head.lean_loss = False for this model")
    target = target.to(captured[0].device)
    if num_items is None:
        loss = head.loss(captured[0], target)
    else:
        loss = head.loss(captured[0], target, reduction="sum") / torch.as_tensor(num_items).to(target.device)
    fields = {k: v for k, v in out.items() if k not in ("loss", "logits")}
    return type(out)(loss=loss, **fields)


def head_model_class(base_model_class: type) -> type:
    """The head model class for a model class, registered with the matching Auto class."""
    if issubclass(base_model_class, HeadModelMixin):
        return base_model_class
    if base_model_class not in _MODEL_CLASSES:
        from transformers import AutoModelForCausalLM, AutoModelForSeq2SeqLM

        config_class = head_config_class(base_model_class.config_class)
        cls = type(f"SoftmaxHeads{base_model_class.__name__}", (HeadModelMixin, base_model_class),
                   {"config_class": config_class, "__module__": __name__,
                    "forward": _forward_with_aux_loss(base_model_class.forward),
                    "__doc__": f"{base_model_class.__name__} whose output layer is a softmax-heads head."})
        auto = AutoModelForSeq2SeqLM if getattr(base_model_class.config_class(), "is_encoder_decoder", False) \
            else AutoModelForCausalLM
        auto.register(config_class, cls, exist_ok=True)
        _MODEL_CLASSES[base_model_class] = cls
    return _MODEL_CLASSES[base_model_class]


def _output_bias(model, old: nn.Module) -> Tuple[torch.Tensor, bool]:
    """The bias the model adds to its logits: lm_head's own plus ``final_logits_bias`` (BART, Marian)."""
    vocab = old.weight.shape[0]
    bias = torch.zeros(vocab, dtype=torch.float32, device=old.weight.device)
    used = False
    if getattr(old, "bias", None) is not None:
        bias += old.bias.detach().float()
        used = True
    flb = getattr(model, "final_logits_bias", None)
    if torch.is_tensor(flb):
        bias += flb.detach().float().reshape(-1)[:vocab]
        used = True
    return bias, used


def swap_head(model, name: str, **options) -> nn.Module:
    """Replace the output layer of a transformers LM by the head ``name``, in place; returns ``model``.

    The head's output embedding starts from the model's (and its bias from ``lm_head.bias`` +
    ``final_logits_bias`` where the model has them); if the model ties its output embedding to its
    input embedding, the head stays tied (a head that keeps several copies of it, DS-Softmax, starts
    from it untied, and ``from_pretrained`` leaves it untied). The model's class becomes ``SoftmaxHeads<Class>`` (a
    subclass), its config records the head, and ``save_pretrained`` / ``from_pretrained`` restore it.
    Works for any model with ``get_output_embeddings()`` returning a ``V x d`` projection: causal LMs
    (GPT-2, Llama family, ...) and seq2seq LMs (BART, Marian, T5, ...).
    """
    from transformers import PreTrainedModel

    if not isinstance(model, PreTrainedModel):
        raise ValueError(f"swap_head: expected a transformers PreTrainedModel, got {type(model).__name__}")
    if isinstance(model, HeadModelMixin):
        raise ValueError(f"swap_head: {type(model).__name__} already has an output head "
                         f"({model.config.output_head['name']}); swap heads on the original model")
    old = model.get_output_embeddings()
    weight = getattr(old, "weight", None)
    if not isinstance(old, nn.Module) or not torch.is_tensor(weight) or weight.dim() != 2:
        raise ValueError(f"swap_head: {type(model).__name__} has no output projection (get_output_embeddings() "
                         f"returned {type(old).__name__}); supported: causal and seq2seq LMs with an lm_head")
    inputs = model.get_input_embeddings()
    tied = inputs is not None and getattr(inputs, "weight", None) is weight
    bias, use_bias = _output_bias(model, old)
    head = build_head(name, hidden_size=weight.shape[1], vocab_size=weight.shape[0], weight=weight.detach(),
                      bias=bias.to(weight.dtype) if use_bias else None, use_bias=use_bias, **options)
    head = head.to(device=weight.device, dtype=weight.dtype)
    base_type = model.config.model_type
    model.__class__ = head_model_class(type(model))
    model.config.__class__ = head_config_class(type(model.config))
    model.config.base_model_type = base_type
    model.config.output_head = {"name": name, "options": dict(options), "use_bias": use_bias}
    model.set_output_embeddings(head)
    if tied and head.can_tie:
        head.tie_weight(inputs)
    model._forget_head_ties()  # a head that cannot be tied (DS-Softmax) starts from a copy instead
    if torch.is_tensor(getattr(model, "final_logits_bias", None)):
        model.final_logits_bias.zero_()  # folded into the head's bias: log-probs stay normalised
    return model


def register_auto_classes() -> None:
    """Register ``model_type="softmax-heads"`` with ``AutoConfig`` (run by ``import hf_heads``)."""
    AutoConfig.register(MODEL_TYPE, SoftmaxHeadsConfig, exist_ok=True)


def output_head(model) -> OutputHead:
    """The head of a model made by :func:`swap_head` (or loaded with one)."""
    head = model.get_output_embeddings()
    if not isinstance(head, OutputHead):
        raise ValueError(f"{type(model).__name__} has no softmax-heads head; call hf_heads.swap_head(model, name)")
    return head
