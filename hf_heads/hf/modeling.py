"""Head model classes (``SoftmaxHeads<Class>``, a subclass of a transformers LM class) and :func:`swap_head`."""

from __future__ import annotations

import functools
import os
import re
import warnings
from typing import Dict, Optional, Tuple

import torch
from torch import nn

from ..core import OutputHead, build_head
from .config import head_config_class, head_spec, spec_options, without_model_sizes
from . import liger, remote_code, trl
from .lean_forward import lean_forward
from .peft import running_head
from .resize import resize_token_embeddings

_MODEL_CLASSES: Dict[type, type] = {}


class HeadModelMixin:
    """Mixed into a transformers LM class: builds the head from ``config.output_head`` and adds
    the head's ``aux_loss()`` to the model's loss."""

    def __init__(self, config, *args, **kwargs):
        super().__init__(config, *args, **kwargs)
        spec = getattr(config, "output_head", None)
        if not spec:
            raise ValueError(f"{type(self).__name__} needs config.output_head = {{'name': ..., 'options': {{...}}}}")
        old = self.get_output_embeddings()
        head = build_head(
            spec["name"],
            hidden_size=old.weight.shape[1],
            vocab_size=old.weight.shape[0],
            use_bias=bool(spec.get("use_bias", False)),
            **spec_options(spec),
        )
        self.set_output_embeddings(head)
        self._forget_head_ties()
        if head.optional_state_keys:  # older weights lack them; _init_weights sets them from the config
            self._keys_to_ignore_on_load_missing = set(self._keys_to_ignore_on_load_missing or ()) | {
                rf"(^|\.){re.escape(k)}$" for k in head.optional_state_keys
            }
        if getattr(config, "tie_word_embeddings", False):
            self.tie_weights()

    def __setattr__(self, name, value):
        # TRL's trainers and Liger replace model.forward by a fused LM head that never runs the head: keep ours, which
        # answers the same calls with the head (hf_heads/hf/trl.py, hf_heads/hf/liger.py)
        if name == "forward" and (trl.keeps_own_forward(self, value) or liger.keeps_own_forward(self, value)):
            return
        super().__setattr__(name, value)

    def save_pretrained(self, save_directory, *args, **kwargs):
        """transformers' ``save_pretrained`` (``push_to_hub`` and ``Trainer.save_model`` call it), plus the code
        that loads the model where softmax-heads is not installed: ``from_pretrained(folder,
        trust_remote_code=True)`` (:mod:`hf_heads.hf.remote_code`)."""
        result = super().save_pretrained(save_directory, *args, **kwargs)
        if kwargs.get("is_main_process", True):
            self._write_remote_code(save_directory)
        return result

    def _upload_modified_files(self, working_dir, *args, **kwargs):
        # save_pretrained(push_to_hub=True) uploads before it returns: the code goes up with the weights
        self._write_remote_code(working_dir)
        return super()._upload_modified_files(working_dir, *args, **kwargs)

    def _write_remote_code(self, folder) -> None:
        auto = _auto_class(self._head_base_class).__name__
        remote_code.write_code(os.fspath(folder), type(self), auto)
        self.config.auto_map = remote_code.auto_map(type(self), auto)

    def set_output_embeddings(self, new_embeddings):
        """transformers' setter, refusing to replace the head by a module that runs no head (transformers' universal
        assisted decoding with ``do_sample=True`` prunes an assistant's ``lm_head`` into a plain ``nn.Linear``)."""
        head = running_head(self.get_output_embeddings())
        if head is not None and running_head(new_embeddings) is None:
            raise ValueError(
                f"{type(self).__name__}: set_output_embeddings({type(new_embeddings).__name__}) would replace the "
                f"{head.head_name} head by a plain projection (transformers' assisted generation with an assistant of "
                f"another tokenizer and do_sample=True prunes the assistant's lm_head); use do_sample=False, or an "
                f"assistant with the target's tokenizer"
            )
        super().set_output_embeddings(new_embeddings)

    def _init_weights(self, module):
        """transformers' initialisation of what ``from_pretrained`` did not load, plus the head's optional state
        (:attr:`OutputHead.optional_state_keys`): transformers loads without the head's load hook, so the head sets
        them from its config (whose spec version gives an older model its default of then)."""
        if isinstance(module, OutputHead):
            module.init_optional_state()
        super()._init_weights(module)

    def _get_name(self) -> str:
        # the name transformers' Trainer looks up to know a causal LM (it shifts the labels for label smoothing); it
        # is also what repr(model) starts with: the head shows as the model's lm_head
        return self._head_base_class.__name__

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
        """transformers' resize, with the head resized through :meth:`OutputHead.resize_vocab`
        (:func:`hf_heads.hf.resize.resize_token_embeddings`)."""
        base = super()._resize_token_embeddings
        return resize_token_embeddings(self, base, new_num_tokens, pad_to_multiple_of, mean_resizing)

    def _lean_loss_applies(self, kwargs) -> bool:
        """Train with the head's memory-lean loss: labels given as a keyword, grad enabled, training mode, the
        head's ``lean_loss`` on, a ModelOutput returned and every position scored (no ``logits_to_keep``)."""
        head = running_head(self.get_output_embeddings())
        return (
            kwargs.get("labels") is not None
            and head is not None
            and head.lean_loss_active()
            and kwargs.get("return_dict", getattr(self.config, "return_dict", True)) is not False
            and not kwargs.get("logits_to_keep")
        )

    def _add_aux_loss(self, out, labels_given: bool):
        if not self.training:  # a regulariser: evaluation losses stay the plain NLL
            return out
        head = running_head(self.get_output_embeddings())
        aux = head.aux_loss()
        loss = out.get("loss") if isinstance(out, dict) else None
        if loss is not None:
            out["loss"] = loss + aux.to(loss.dtype)
        elif isinstance(out, tuple) and labels_given and torch.is_tensor(out[0]) and out[0].dim() == 0:
            out = (out[0] + aux.to(out[0].dtype),) + out[1:]
        elif head.has_aux_loss and torch.is_grad_enabled() and not self.__dict__.get("_warned_aux_loss"):
            self.__dict__["_warned_aux_loss"] = True
            warnings.warn(
                f"{head.head_name}: a training forward without labels returns no loss to add the head's "
                f"aux_loss() to (transformers' Trainer calls the model so with label_smoothing_factor or "
                f"compute_loss_func); add hf_heads.output_head(model).aux_loss() to your loss, or pass "
                f"labels",
                stacklevel=3,
            )
        return out


def _forward_with_aux_loss(base_forward):
    """``base_forward`` plus the head's aux loss, with the base signature (Trainer reads it to
    choose the dataset columns it passes); ``fused_lm_head=True`` (TRL) goes to
    :func:`hf_heads.hf.trl.fused_forward`."""

    @functools.wraps(base_forward)
    def forward(self, *args, **kwargs):
        labels = kwargs.get("labels")
        if torch.is_tensor(labels) and (
            labels.is_floating_point() or labels.is_complex() or labels.dtype == torch.bool
        ):
            # in training the head's loss checks them; in evaluation the model's own cross-entropy would fail
            # with a message about its kernels, so check here for both
            head = running_head(self.get_output_embeddings())
            raise ValueError(
                f"{head.head_name if head else type(self).__name__}: labels have dtype {labels.dtype}; "
                f"expected token ids (torch.long), -100 where ignored"
            )
        kwargs.pop("skip_logits", None)  # Liger's flag, which Trainer(use_liger_kernel=True) passes in evaluation
        if kwargs.pop("fused_lm_head", False):  # TRL's protocol (hf_heads/hf/trl.py), answered by the head
            return trl.fused_forward(self, base_forward, args, kwargs)
        if self._lean_loss_applies(kwargs):
            return self._add_aux_loss(lean_forward(self, base_forward, args, kwargs), True)
        return self._add_aux_loss(base_forward(self, *args, **kwargs), kwargs.get("labels") is not None)

    return forward


def _auto_class(base_model_class: type) -> type:
    """The Auto class that maps the config class to ``base_model_class`` (BART's config maps to
    ``BartForConditionalGeneration`` under ``AutoModelForSeq2SeqLM`` and to ``BartForCausalLM`` under
    ``AutoModelForCausalLM``); for a class in neither mapping, the one its config's ``is_encoder_decoder`` says."""
    from transformers import AutoModelForCausalLM, AutoModelForSeq2SeqLM
    from transformers.models.auto import modeling_auto

    config_class = base_model_class.config_class
    for auto, mapping in (
        (AutoModelForSeq2SeqLM, modeling_auto.MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING),
        (AutoModelForCausalLM, modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING),
    ):
        if config_class in mapping and mapping[config_class] is base_model_class:
            return auto
    return AutoModelForSeq2SeqLM if getattr(config_class(), "is_encoder_decoder", False) else AutoModelForCausalLM


def head_model_class(base_model_class: type) -> type:
    """The head model class for a model class, registered with the matching Auto class."""
    if issubclass(base_model_class, HeadModelMixin):
        return base_model_class
    if base_model_class not in _MODEL_CLASSES:
        liger.check_base_forward(base_model_class)
        config_class = head_config_class(base_model_class.config_class)
        cls = type(
            f"SoftmaxHeads{base_model_class.__name__}",
            (HeadModelMixin, base_model_class),
            {
                "config_class": config_class,
                "__module__": __name__,
                "_head_base_class": base_model_class,
                "forward": _forward_with_aux_loss(base_model_class.forward),
                "__doc__": f"{base_model_class.__name__} whose output layer is a softmax-heads head.",
            },
        )
        _auto_class(base_model_class).register(config_class, cls, exist_ok=True)
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
        raise ValueError(
            f"swap_head: {type(model).__name__} already has an output head "
            f"({model.config.output_head['name']}); swap heads on the original model"
        )
    old = model.get_output_embeddings()
    weight = getattr(old, "weight", None)
    if not isinstance(old, nn.Module) or not torch.is_tensor(weight) or weight.dim() != 2:
        raise ValueError(
            f"swap_head: {type(model).__name__} has no output projection (get_output_embeddings() "
            f"returned {type(old).__name__}); supported: causal and seq2seq LMs with an lm_head"
        )
    inputs = model.get_input_embeddings()
    tied = inputs is not None and getattr(inputs, "weight", None) is weight
    bias, use_bias = _output_bias(model, old)
    options = without_model_sizes("swap_head", options, hidden_size=weight.shape[1], vocab_size=weight.shape[0])
    head = build_head(
        name,
        hidden_size=weight.shape[1],
        vocab_size=weight.shape[0],
        weight=weight.detach(),
        bias=bias.to(weight.dtype) if use_bias else None,
        use_bias=use_bias,
        frequency_order=frequency_order,
        token_counts=token_counts,
        **options,
    )
    head = head.to(device=weight.device, dtype=weight.dtype)
    base_type = model.config.model_type
    model.__class__ = head_model_class(type(model))
    model.config.__class__ = head_config_class(type(model.config))
    model.config.base_model_type = base_type
    model.config.output_head = head_spec(name, options, use_bias)
    model.set_output_embeddings(head)
    if tied and head.can_tie:
        head.tie_weight(inputs)
    model._forget_head_ties()  # a head that cannot be tied (DS-Softmax) starts from a copy instead
    if torch.is_tensor(getattr(model, "final_logits_bias", None)):
        model.final_logits_bias.zero_()  # folded into the head's bias: log-probs stay normalised
    return model


def output_head(model) -> OutputHead:
    """The head of a model made by :func:`swap_head` (or loaded with one); through PEFT's wrapper of a trained
    head (``modules_to_save``), the copy the active adapter trains."""
    head = running_head(model.get_output_embeddings())
    if head is None:
        raise ValueError(f"{type(model).__name__} has no softmax-heads head; call hf_heads.swap_head(model, name)")
    return head
