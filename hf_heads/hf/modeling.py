"""Head model classes (``SoftmaxHeads<Class>``, a subclass of a transformers LM class) and :func:`swap_head`."""

from __future__ import annotations

import copy
import functools
import inspect
import os
import re
import warnings
from typing import Dict, Optional, Tuple

import torch
from torch import nn

from ..core import OutputHead, build_head, start_options
from .config import (
    CLASS_PREFIX,
    family_class,
    head_config_class,
    head_spec,
    is_head_config,
    spec_options,
    unwrap_head_config,
    without_model_sizes,
)
from . import checkpoint, liger, remote_code, tensor_parallel, trl
from .lean_forward import decoder_inputs_from_labels, is_seq2seq, lean_forward
from .output_layer import absorb_or_refuse, output_layer, output_layer_path, run_probe
from .peft import running_head
from .resize import resize_token_embeddings

_MODEL_CLASSES: Dict[type, type] = {}


def set_layer_sizes(head: OutputHead) -> OutputHead:
    """``head`` with ``in_features`` / ``out_features``, which model code reads from its ``lm_head`` as from an
    ``nn.Linear`` (Apertus: ``vocab_size=self.lm_head.out_features``)."""
    head.in_features, head.out_features = head.config.hidden_size, head.config.vocab_size
    return head


@functools.lru_cache(maxsize=None)
def causal_loss_shifts(model_class: type) -> bool:
    """Whether the causal LM ``model_class``'s forward computes its loss with transformers' ``loss_function``
    (``ForCausalLMLoss``: position t predicts label t + 1), the loss the lean forward reproduces."""
    try:
        return "self.loss_function(" in inspect.getsource(model_class.forward)
    except (OSError, TypeError):
        return False


class HeadModelMixin:
    """Mixed into a transformers LM class: builds the head from ``config.output_head`` and adds
    the head's ``aux_loss()`` to the model's loss."""

    def __init__(self, config, *args, **kwargs):
        # a config of its own: the head may change it (a soft-cap it moves into the head, convert_head, auto_map),
        # and other models built from the caller's object must not change with it (hf_heads/hf/checkpoint.py)
        super().__init__(copy.deepcopy(config), *args, **kwargs)
        self.config.architectures = [type(self).__name__]  # (a plain class there would make its save refused)
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
        self._probe_new_model()

    @classmethod
    def from_pretrained(cls, *args, **kwargs):
        """transformers' ``from_pretrained``, refused in one line where the checkpoint's config.json names the head
        and its weights lack a tensor of it or hold one it does not have (:func:`checkpoint.check_loaded_head`),
        then the check of a new model (:meth:`_probe_new_model`) on the loaded one: a plain checkpoint loaded with a
        head config (``config=head_config(...)``) may scale or soft-cap its logits after its output layer, which the
        head then takes over (the model builds on the meta device, where nothing can be checked)."""
        strict = checkpoint.loads_saved_head(args, kwargs)
        model, info = super().from_pretrained(*args, **{**kwargs, "output_loading_info": True})
        if strict:
            checkpoint.check_loaded_head(model, info, checkpoint.pretrained_path(args, kwargs))
        model._probe_new_model()
        return (model, info) if kwargs.get("output_loading_info") else model

    def _probe_new_model(self) -> None:
        """A model with its weights (``from_config``, and ``from_pretrained`` after loading): where it scales or
        soft-caps the logits after its output layer by a field of its config (``head_config(Gemma2Config(...),
        "mos")``), the model's copy is switched off and the head applies it (:func:`absorb_logit_map`; the config's
        ``output_head`` records it); any other transform after the layer, which the head's log-probs would get
        (:func:`probe_output_layer`), is refused. A model that cannot run here (partitioned weights) is not
        checked."""
        head = self.get_output_embeddings()
        first = next(head.parameters(), None)
        if first is None or first.device.type == "meta" or first.numel() == 0:
            return
        probe = run_probe(self, head, layer_checks=False)
        if probe.problem is not None and probe.problem.startswith("could not be probed"):
            return
        spec = self.config.output_head
        where = f"{type(self).__name__}: {self._head_base_class.__name__}"
        absorbed = absorb_or_refuse(self, head, probe, spec.get("options", {}), where)
        if absorbed is None:
            return
        try:
            head.config = head.check_config(type(head.config)(**{**head.config.to_dict(), **absorbed.options}))
        except ValueError as e:
            absorbed.undo()
            raise ValueError(f"{where} {absorbed.sentence()}: {e}") from None
        self.config.output_head = {**spec, "options": {**spec.get("options", {}), **absorbed.options}}

    def __setattr__(self, name, value):
        # TRL's trainers and Liger replace model.forward by a fused LM head that never runs the head: keep ours, which
        # answers the same calls with the head (hf_heads/hf/trl.py, hf_heads/hf/liger.py)
        if name == "forward" and (trl.keeps_own_forward(self, value) or liger.keeps_own_forward(self, value)):
            return
        super().__setattr__(name, value)

    def add_model_tags(self, tags):
        # TRL's trainers tag the model while they are built: where one never runs the head, refuse it then
        trl.refuse_weight_readers(self)
        return super().add_model_tags(tags)

    def save_pretrained(self, save_directory, *args, **kwargs):
        """transformers' ``save_pretrained`` (``push_to_hub`` and ``Trainer.save_model`` call it), plus the code
        that loads the model where softmax-heads is not installed: ``from_pretrained(folder,
        trust_remote_code=True)`` (:mod:`hf_heads.hf.remote_code`). A model whose folder would not load as it is
        refused before anything is written (:func:`checkpoint.check_saveable`)."""
        if not getattr(self, "_hf_peft_config_loaded", False):  # (transformers' PEFT integration saves the adapter)
            checkpoint.check_saveable(self, kwargs.get("state_dict"))
        result = super().save_pretrained(save_directory, *args, **kwargs)
        if kwargs.get("is_main_process", True) and _first_rank():  # (under tensor parallelism every rank calls it)
            self._write_remote_code(save_directory)
        return result

    def _resolve_parallel_plans(self, distributed_config):
        """transformers' tensor-parallel plans, refused in one line where they give the head another style than its
        own (:func:`hf_heads.hf.tensor_parallel.check_plan`)."""
        tp_plan, *rest = super()._resolve_parallel_plans(distributed_config)
        head = self.get_output_embeddings()
        tensor_parallel.check_plan(self, tp_plan, checkpoint.head_path(self, head))
        return (tp_plan, *rest)

    def _upload_modified_files(self, working_dir, *args, **kwargs):
        # save_pretrained(push_to_hub=True) uploads before it returns: the code goes up with the weights
        self._write_remote_code(working_dir)
        return super()._upload_modified_files(working_dir, *args, **kwargs)

    def _write_remote_code(self, folder) -> None:
        auto = _auto_class(self._head_base_class).__name__
        remote_code.write_code(os.fspath(folder), type(self), auto)
        self.config.auto_map = remote_code.auto_map(type(self), auto)

    def get_output_embeddings(self):
        """The head: transformers' getter, or the output layer :data:`OUTPUT_LAYERS` names for the model's class
        (FSMT's ``model.decoder.output_projection``)."""
        path = output_layer_path(type(self))
        return self.get_submodule(path) if path else super().get_output_embeddings()

    def set_output_embeddings(self, new_embeddings):
        """transformers' setter (or the output layer :data:`OUTPUT_LAYERS` names), refusing to replace the head by
        a module that runs no head (transformers' universal assisted decoding with ``do_sample=True`` prunes an
        assistant's ``lm_head`` into a plain ``nn.Linear``)."""
        head = running_head(self.get_output_embeddings())
        if head is not None and running_head(new_embeddings) is None:
            raise ValueError(
                f"{type(self).__name__}: set_output_embeddings({type(new_embeddings).__name__}) would replace the "
                f"{head.head_name} head by a plain projection (transformers' assisted generation with an assistant of "
                f"another tokenizer and do_sample=True prunes the assistant's lm_head); use do_sample=False, or an "
                f"assistant with the target's tokenizer"
            )
        if isinstance(new_embeddings, OutputHead):
            set_layer_sizes(new_embeddings)
        path = output_layer_path(type(self))
        if path:
            parent, _, attr = path.rpartition(".")
            setattr(self.get_submodule(parent), attr, new_embeddings)
        else:
            super().set_output_embeddings(new_embeddings)

    def _init_weights(self, module):
        """transformers' initialisation of what ``from_pretrained`` did not load, except in the head: what a
        checkpoint lacks of the head (all but ``weight`` and ``bias`` of a plain model's, loaded with a head config)
        starts as the head's constructor starts it, so a head config's exact start (``start="pretrained"``: identity
        contexts) holds on a loaded model too, where transformers' init would draw them at random; the head's optional
        state (:attr:`OutputHead.optional_state_keys`), which transformers loads without the head's load hook, as its
        config says (whose spec version gives an older model its default of then)."""
        head = running_head(self.get_output_embeddings()) if _loads_flag_tensors() else None
        if head is not None and module is not head and any(module is m for m in head.modules()):
            return  # a part of the head: started with the head, below
        if isinstance(module, OutputHead):
            if head is not None:
                _start_missing(module)
            else:  # (transformers 4: no record of what loaded; the head's parts get transformers' init)
                module.init_optional_state()
        super()._init_weights(module)

    @classmethod
    def is_custom_code(cls) -> bool:
        """What transformers answers for the base class: a head model class is made outside transformers, but its
        weights start as the base class's (and the head's, which checks what was loaded); as custom code, loading
        would skip the ``_init_weights`` of modules whose own weights all loaded, leaving buffers the base class
        computes there unset (Falcon-H1's ``mup_vector``: NaN logits). (transformers also reads it to drop missing
        keys of tied modules, which head models do not tie, and to pick weight conversions, which it looks up by a
        model's class and type: none for ``softmax-heads`` models, their submodels answering for themselves.)"""
        return cls._head_base_class.is_custom_code()

    def _get_name(self) -> str:
        # the name transformers' Trainer looks up to know a causal LM (it shifts the labels for label smoothing); it
        # is also what repr(model) starts with: the head shows as the model's lm_head
        return self._head_base_class.__name__

    def _head_tie_prefix(self) -> Optional[str]:
        """``"lm_head."`` (the head's parameter prefix) when the head cannot be tied, else None."""
        head = self.get_output_embeddings()
        if not isinstance(head, OutputHead) or head.can_tie:
            return None
        return checkpoint.head_path(self, head) + "."

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
        head's ``lean_loss`` on, a ModelOutput returned, every position scored (no ``logits_to_keep``) and, for a
        seq2seq model, decoder inputs given or made from the labels as the model makes them; for a causal LM, a
        forward that computes its loss with transformers' ``loss_function`` (which shifts the labels; BART's,
        TrOCR's, XLNet's causal classes do not shift: their own loss on the head's log-probs runs instead)."""
        head = running_head(self.get_output_embeddings())
        return (
            kwargs.get("labels") is not None
            and head is not None
            and head.lean_loss_active()
            and kwargs.get("return_dict", getattr(self.config, "return_dict", True)) is not False
            and not kwargs.get("logits_to_keep")
            and (
                decoder_inputs_from_labels(self) is not None
                or kwargs.get("decoder_input_ids") is not None
                or kwargs.get("decoder_inputs_embeds") is not None
                if is_seq2seq(self)
                else causal_loss_shifts(self._head_base_class)
            )
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


def _first_rank() -> bool:
    """Whether this process is rank 0 of torch.distributed, or not distributed."""
    import torch.distributed as dist

    return not (dist.is_available() and dist.is_initialized()) or dist.get_rank() == 0


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
        plan = tensor_parallel.tp_plan(base_model_class, output_layer_path(base_model_class) or "lm_head")
        cls = type(
            f"{CLASS_PREFIX}{base_model_class.__name__}",
            (HeadModelMixin, base_model_class),
            {
                **({} if plan is None else {"_tp_plan": plan}),
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


def __getattr__(name: str):
    """``SoftmaxHeadsLlamaForCausalLM`` and the like: each family's head model class, made on demand so that a class
    pickles by its name (:func:`hf_heads.hf.config.family_class`)."""
    return family_class(name, __name__, "PreTrainedModel", head_model_class)


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


def swap_head(
    model, name: str, *, start: Optional[str] = None, frequency_order=None, token_counts=None, **options
) -> nn.Module:
    """Replace the output layer of a transformers LM by the head ``name``, in place; returns ``model``.

    The head's output embedding starts from the model's (and its bias from ``lm_head.bias`` +
    ``final_logits_bias`` where the model has them); if the model ties its output embedding to its
    input embedding, the head stays tied (a head that keeps several copies of it, DS-Softmax, starts
    from it untied, and ``from_pretrained`` leaves it untied). The model's class becomes ``SoftmaxHeads<Class>`` (a
    subclass), its config records the head, and ``save_pretrained`` / ``from_pretrained`` restore it. The config
    is the model's own: a deep copy replaces the object the model was built from (in every module that holds it),
    so the caller's config keeps its class and values and other models built from it are untouched; a head config
    given to a plain model class (``LlamaForCausalLM(head_config(...))``) becomes its family's config again.
    Works for any model with ``get_output_embeddings()`` returning a ``V x d`` projection: causal LMs
    (GPT-2, Llama family, ...) and seq2seq LMs (BART, Marian, T5, FSMT, ...; FSMT's output layer is its decoder's
    ``output_projection``, :data:`OUTPUT_LAYERS`).

    ``start="pretrained"`` adds the head options that make it start exactly as the model it replaces (MoS and
    Mixtape: identity contexts), and refuses a head with no exact start; ``"nearest"`` builds such a head anyway,
    with a warning (:func:`hf_heads.start_options`). The config records the options, not the word.

    Before anything changes, one forward of the model on a tiny input checks that its output layer makes the
    logits it returns (:func:`probe_output_layer`). A model that scales or soft-caps them after the layer by a field
    of its config (Gemma 2's ``final_logit_softcapping``, Cohere's ``logit_scale``, Granite's ``logits_scaling``, ...)
    has that field switched off, in the live model and in its own config, and the head applies the map instead, on every
    path (its options ``logit_scale`` / ``logit_softcap``; MoS on each component's logits, Mixtape on its gated
    logits, PLIF as ``f(cap(s z))``): :func:`absorb_logit_map`, which probes again to check. A model that
    transforms its logits in any other way, whose head would get that transform applied to its log-probs, or whose
    ``get_output_embeddings()`` is an input embedding, is refused (``ValueError`` naming the class), as is a head
    that cannot apply a map (the fast heads). A model on the meta device cannot run a forward and is not probed.

    Heads that need token ids ordered by frequency (Mixtape's gate sharing, class_softmax, d_softmax) take the
    order of the model's vocabulary from ``token_counts`` (V counts in id order, e.g.
    ``hf_heads.count_tokens(train_ids, V)``) or ``frequency_order`` (ids, most frequent first); without either
    they assume ids are sorted already (fairseq dictionaries are; BPE vocabularies such as GPT-2's are not).
    The order is a buffer of the head, saved with its weights.
    """
    old = _plain_output_projection(model)
    weight = old.weight
    options = without_model_sizes("swap_head", options, hidden_size=weight.shape[1], vocab_size=weight.shape[0])
    options = start_options(name, start, options, where="swap_head: start")
    model_class = head_model_class(type(model))  # (refuses a class Liger patched, before running it)
    # a config of its own first: the caller's config object, and other models built from it, stay as they are
    restore = checkpoint.own_config(model)
    if is_head_config(model.config):  # a plain class built from a head config: its family's config again
        unwrap_head_config(model.config)
    try:
        head, options, use_bias = _start_head(model, old, name, options, frequency_order, token_counts)
    except BaseException:  # (an out-of-memory too: the model keeps its own map and config, as it was)
        restore()
        raise
    inputs = model.get_input_embeddings()
    tied = inputs is not None and getattr(inputs, "weight", None) is weight
    base_type = model.config.model_type
    model.__class__ = model_class
    model.config.__class__ = head_config_class(type(model.config))
    model.config.base_model_type = base_type
    model.config.output_head = head_spec(name, options, use_bias)
    model.config.architectures = [model_class.__name__]  # (what save_pretrained writes; config.save_pretrained reads)
    model.set_output_embeddings(head)
    if tied and head.can_tie:
        head.tie_weight(inputs)
    model._forget_head_ties()  # a head that cannot be tied (DS-Softmax) starts from a copy instead
    if torch.is_tensor(getattr(model, "final_logits_bias", None)):
        model.final_logits_bias.zero_()  # folded into the head's bias: log-probs stay normalised
    return model


def _start_head(model, old: nn.Module, name: str, options: dict, frequency_order, token_counts):
    """``(head, options, use_bias)``: the head ``name`` started from ``model``'s output layer ``old`` (and its bias),
    with the options it records; where the model scales or soft-caps its logits after the layer, the map switched off
    in the model and moved into the head (:func:`absorb_or_refuse`), put back if the head does not build."""
    weight = old.weight
    where = f"swap_head: {type(model).__name__}"
    # a model on the meta device (built to count its parameters) computes nothing: no forward to probe
    probe = None if weight.device.type == "meta" else run_probe(model, old)
    absorbed = None if probe is None else absorb_or_refuse(model, old, probe, options, where)
    if absorbed is not None:
        options = {**options, **absorbed.options}
    bias, use_bias = _output_bias(model, old)
    try:
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
        ).to(device=weight.device, dtype=weight.dtype)
    except BaseException as e:
        if absorbed is None:
            raise
        absorbed.undo()
        if isinstance(e, ValueError):
            raise ValueError(f"{where} {absorbed.sentence()}: {e}") from None
        raise
    return head, options, use_bias


def _plain_output_projection(model) -> nn.Module:
    """The ``V x d`` output layer of a transformers model that has no head yet, or ``ValueError`` saying why not."""
    from transformers import PreTrainedModel

    if not isinstance(model, PreTrainedModel):
        raise ValueError(f"swap_head: expected a transformers PreTrainedModel, got {type(model).__name__}")
    if isinstance(model, HeadModelMixin):
        raise ValueError(
            f"swap_head: {type(model).__name__} already has an output head "
            f"({model.config.output_head['name']}); swap heads on the original model"
        )
    old = output_layer(model)
    weight = getattr(old, "weight", None)
    if not isinstance(old, nn.Module) or not torch.is_tensor(weight) or weight.dim() != 2:
        raise ValueError(
            f"swap_head: {type(model).__name__} has no output projection (get_output_embeddings() "
            f"returned {type(old).__name__}); supported: causal and seq2seq LMs with an lm_head"
        )
    return old


@functools.lru_cache(maxsize=None)
def _loads_flag_tensors() -> bool:
    """Whether transformers marks each tensor ``from_pretrained`` loaded (``_is_hf_initialized``, transformers 5):
    only then can the head tell what a checkpoint lacked."""
    import transformers

    return int(transformers.__version__.split(".")[0]) >= 5


@torch.no_grad()
def _start_missing(head: OutputHead) -> None:
    """The parameters and buffers of ``head`` that ``from_pretrained`` did not load (no ``_is_hf_initialized`` flag)
    set as a new head of its config starts them (built on the CPU, only where something is missing)."""
    missing = [
        (name, t)
        for name, t in [*head.named_parameters(), *head.named_buffers()]
        if not getattr(t, "_is_hf_initialized", False)
    ]
    if not missing:
        return
    with torch.device("cpu"):
        fresh = type(head)(type(head.config)(**head.config.to_dict())).state_dict()
    for name, t in missing:
        if name in fresh and t.device.type != "meta":
            t.copy_(fresh[name].to(dtype=t.dtype, device=t.device))


def output_head(model) -> OutputHead:
    """The head of a model made by :func:`swap_head` (or loaded with one); through PEFT's wrapper of a trained
    head (``modules_to_save``), the copy the active adapter trains."""
    head = running_head(model.get_output_embeddings())
    if head is None:
        raise ValueError(f"{type(model).__name__} has no softmax-heads head; call hf_heads.swap_head(model, name)")
    return head
