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

    def __new__(cls, *args, **kwargs):
        # AutoConfig.for_model("softmax-heads", base_model_type=..., output_head=..., **base options) calls this
        # class: build the wrapped family's head config instead (not an instance of this class, so Python does
        # not run __init__ on it again), which the Auto model classes know
        if cls is not SoftmaxHeadsConfig:
            return super().__new__(cls)
        config = head_config_class(_base_config_class(_required_base_type(kwargs)))(*args, **kwargs)
        _register_model_classes(config)
        return config

    @classmethod
    def from_dict(cls, config_dict: Dict[str, Any], **kwargs):
        result = head_config_class(_base_config_class(_required_base_type(config_dict))).from_dict(config_dict, **kwargs)
        _register_model_classes(result[0] if isinstance(result, tuple) else result)
        return result


def _required_base_type(options: Dict[str, Any]) -> str:
    base = options.get("base_model_type")
    if not base:
        raise ValueError(
            f"a {MODEL_TYPE} config needs base_model_type, the wrapped model's type, and output_head: e.g. "
            f"AutoConfig.for_model({MODEL_TYPE!r}, base_model_type='gpt2', output_head={{'name': 'mixtape', "
            f"'options': {{}}}}, n_layer=2), or hf_heads.head_config(GPT2Config(...), 'mixtape')")
    return base


def head_config(base_config, name: str, use_bias: bool = False, **options) -> PretrainedConfig:
    """A config for a new model whose output layer is the head ``name``: ``base_config`` (any causal or seq2seq
    LM config, e.g. ``GPT2Config(n_layer=2)``) with model type ``softmax-heads``.

    ``AutoModelForCausalLM.from_config(head_config(GPT2Config(...), "mixtape", num_gates=4))`` (or
    ``AutoModelForSeq2SeqLM`` for a seq2seq config) builds the model with the head, freshly initialised;
    ``save_pretrained`` / ``from_pretrained`` restore it. The same as ``AutoConfig.for_model("softmax-heads",
    base_model_type=..., output_head={"name": name, "options": options}, **base options)``. Options are
    checked here, by building the head once on the meta device.
    """
    if not isinstance(base_config, PretrainedConfig):
        raise ValueError(f"head_config: expected a transformers config (e.g. GPT2Config(...)), got "
                         f"{type(base_config).__name__}")
    if base_config.model_type == MODEL_TYPE:
        raise ValueError(f"head_config: the config already names a head ({base_config.output_head['name']}); "
                         f"start from the base model's config")
    spec = {"name": name, "options": dict(options), "use_bias": bool(use_bias)}
    vocab, hidden = base_config.vocab_size, base_config.get_text_config().hidden_size
    with torch.device("meta"):
        build_head(name, hidden_size=hidden, vocab_size=vocab, use_bias=spec["use_bias"], **options)
    config = head_config_class(type(base_config)).from_dict(
        {**base_config.to_dict(), "base_model_type": base_config.model_type, "output_head": spec})
    _register_model_classes(config)
    return config


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

    def _resize_token_embeddings(self, new_num_tokens, pad_to_multiple_of=None, mean_resizing=True):
        """transformers' resize (input embedding, then the output projection, new rows from the old rows' mean
        and covariance with ``mean_resizing``), with the head resized through :meth:`OutputHead.resize_vocab`:
        transformers resizes a plain ``nn.Linear`` standing in for the head, whose rows the head then takes."""
        head = self.get_output_embeddings()
        if not isinstance(head, OutputHead):
            if running_head(head) is not None:
                raise ValueError("resize_token_embeddings: the head is wrapped by PEFT (modules_to_save); resize "
                                 "the model before get_peft_model")
            return super()._resize_token_embeddings(new_num_tokens, pad_to_multiple_of, mean_resizing)
        size = head.config.vocab_size if new_num_tokens is None else new_num_tokens
        if pad_to_multiple_of is not None:
            size = -(-size // pad_to_multiple_of) * pad_to_multiple_of
        head.check_resize_vocab(size)  # a head that cannot resize refuses before anything changes
        before = head.config.to_dict()
        tied = head.weight is getattr(self.get_input_embeddings(), "weight", None)
        stand_in = nn.Linear(head.config.embedding_size, head.config.vocab_size, bias=head.bias is not None,
                             device="meta")
        stand_in.weight, stand_in.bias = head.weight, head.bias
        if head.weight.dim() == 3:  # DS-Softmax's experts: transformers draws the new rows from their mean
            stand_in.weight = nn.Parameter(head.weight.detach().mean(0))
            stand_in.bias = None if head.bias is None else nn.Parameter(head.bias.detach().mean(0))
        with _head_replaced_by(self, stand_in):
            embeddings = super()._resize_token_embeddings(new_num_tokens, pad_to_multiple_of, mean_resizing)
            resized = self.get_output_embeddings()
        if tied:  # transformers re-ties after this; the head's own state follows the input embedding's rows
            head.resize_vocab(size, weight=embeddings.weight, bias=resized.bias)
            head.tie_weight(embeddings)
        else:
            head.resize_vocab(size, weight=resized.weight, bias=resized.bias)
        # options the resize changed (Mixtape's frequent_fraction) go into the config from_pretrained builds from
        self.config.output_head["options"].update(
            {k: v for k, v in head.config.to_dict().items() if v != before[k] and k != "vocab_size"})
        final_bias = getattr(self, "final_logits_bias", None)
        if torch.is_tensor(final_bias):  # BART, Marian: folded into the head's bias at the swap
            final_bias.zero_()
        return embeddings

    def _lean_loss_applies(self, kwargs) -> bool:
        """Train with the head's memory-lean loss: labels given as a keyword, grad enabled, training mode, the
        head's ``lean_loss`` on, a ModelOutput returned and every position scored (no ``logits_to_keep``)."""
        head = running_head(self.get_output_embeddings())
        return (kwargs.get("labels") is not None and head is not None and head.lean_loss_active()
                and kwargs.get("return_dict", getattr(self.config, "return_dict", True)) is not False
                and not kwargs.get("logits_to_keep"))

    def _add_aux_loss(self, out, labels_given: bool):
        if not self.training:  # a regulariser: evaluation losses stay the plain NLL
            return out
        aux = running_head(self.get_output_embeddings()).aux_loss()
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
        labels = kwargs.get("labels")
        if torch.is_tensor(labels) and (labels.is_floating_point() or labels.is_complex() or labels.dtype == torch.bool):
            # in training the head's loss checks them; in evaluation the model's own cross-entropy would fail
            # with a message about its kernels, so check here for both
            head = running_head(self.get_output_embeddings())
            raise ValueError(f"{head.head_name if head else type(self).__name__}: labels have dtype {labels.dtype}; "
                             f"expected token ids (torch.long), -100 where ignored")
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


def running_head(module: Optional[nn.Module]) -> Optional[OutputHead]:
    """The head that the output layer ``module`` runs: ``module`` itself, or, when PEFT wrapped it
    (``modules_to_save=["lm_head"]``: a ``ModulesToSaveWrapper`` holding the original and a trainable copy
    per adapter), the copy of the active adapter (the original with adapters disabled); None if no head."""
    if isinstance(module, OutputHead):
        return module
    original = getattr(module, "original_module", None)
    if not isinstance(original, OutputHead):
        return None
    active = list(getattr(module, "active_adapters", None) or [])
    copies = getattr(module, "modules_to_save", None) or {}
    if getattr(module, "disable_adapters", False) or not active or active[0] not in copies:
        return original
    copy = running_head(copies[active[0]])
    if copy is None:  # PEFT's ensure_weight_tying=True puts a plain nn.Linear sharing the tied weight there
        raise ValueError(
            f"PEFT replaced the {original.head_name} head by a plain {type(copies[active[0]]).__name__} for adapter "
            f"{active[0]!r} (modules_to_save with ensure_weight_tying=True), so the model would no longer run the head; "
            f"use ensure_weight_tying=False (PEFT's default) to train a copy of the head")
    return copy


@contextlib.contextmanager
def _head_replaced_by(model, stand_in: nn.Module):
    head = model.get_output_embeddings()  # (a wrapper around the head, e.g. PEFT's, is replaced as a whole)
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


def swap_head(model, name: str, *, frequency_order=None, token_counts=None, **options) -> nn.Module:
    """Replace the output layer of a transformers LM by the head ``name``, in place; returns ``model``.

    The head's output embedding starts from the model's (and its bias from ``lm_head.bias`` +
    ``final_logits_bias`` where the model has them); if the model ties its output embedding to its
    input embedding, the head stays tied (a head that keeps several copies of it, DS-Softmax, starts
    from it untied, and ``from_pretrained`` leaves it untied). The model's class becomes ``SoftmaxHeads<Class>`` (a
    subclass), its config records the head, and ``save_pretrained`` / ``from_pretrained`` restore it.
    Works for any model with ``get_output_embeddings()`` returning a ``V x d`` projection: causal LMs
    (GPT-2, Llama family, ...) and seq2seq LMs (BART, Marian, T5, ...).

    Heads that need token ids ordered by frequency (Mixtape's gate sharing, class_softmax, d_softmax) take the
    order of the model's vocabulary from ``token_counts`` (V counts in id order, e.g.
    ``hf_heads.count_tokens(train_ids, V)``) or ``frequency_order`` (ids, most frequent first); without either
    they assume ids are sorted already (fairseq dictionaries are; BPE vocabularies such as GPT-2's are not).
    The order is a buffer of the head, saved with its weights.
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
                      bias=bias.to(weight.dtype) if use_bias else None, use_bias=use_bias,
                      frequency_order=frequency_order, token_counts=token_counts, **options)
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
    """The head of a model made by :func:`swap_head` (or loaded with one); through PEFT's wrapper of a trained
    head (``modules_to_save``), the copy the active adapter trains."""
    head = running_head(model.get_output_embeddings())
    if head is None:
        raise ValueError(f"{type(model).__name__} has no softmax-heads head; call hf_heads.swap_head(model, name)")
    return head
