"""Head model classes (``SoftmaxHeads<Class>``, a subclass of a transformers LM class) and :func:`swap_head`."""

from __future__ import annotations

import functools
import inspect
import os
import re
import warnings
from typing import Dict, List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from ..core import OutputHead, build_head, start_options
from .config import head_config_class, head_spec, spec_options, without_model_sizes
from . import liger, remote_code, trl
from .lean_forward import decoder_inputs_from_labels, is_seq2seq, lean_forward
from .peft import running_head
from .resize import resize_token_embeddings

_MODEL_CLASSES: Dict[type, type] = {}
#: model classes whose ``get_output_embeddings()`` is not the layer that makes the logits: the path of that layer
#: (FSMT returns the decoder's input embedding, which is not tied to its ``output_projection``); a head model of
#: such a class reads and sets its head there (a subclass of one of these classes too)
OUTPUT_LAYERS: Dict[str, str] = {"FSMTForConditionalGeneration": "model.decoder.output_projection"}


def output_layer_path(model_class: type) -> Optional[str]:
    """The path of the output layer of ``model_class`` where :data:`OUTPUT_LAYERS` knows it, else None (the
    layer is ``get_output_embeddings()``)."""
    for cls in model_class.__mro__:
        if cls.__name__ in OUTPUT_LAYERS:
            return OUTPUT_LAYERS[cls.__name__]
    return None


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


def output_layer(model) -> Optional[nn.Module]:
    """The module that makes ``model``'s logits: the one :data:`OUTPUT_LAYERS` names, else
    ``get_output_embeddings()``."""
    path = output_layer_path(type(model))
    return model.get_submodule(path) if path else model.get_output_embeddings()


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
        self._probe_new_model()

    def _probe_new_model(self) -> None:
        """A model built with its weights (``from_config``; not ``from_pretrained``, which builds on the meta device
        a model saved after this check): refused where it transforms the logits after its output layer, which the
        head's log-probs would get (:func:`probe_output_layer`: e.g. ``head_config(Gemma2Config(...), "mos")``). A
        model that cannot run here (partitioned weights) is not checked."""
        head = self.get_output_embeddings()
        first = next(head.parameters(), None)
        if first is None or first.device.type == "meta" or first.numel() == 0:
            return
        problem = probe_output_layer(self, head, layer_checks=False)
        if problem is not None and not problem.startswith("could not be probed"):
            raise ValueError(
                f"{type(self).__name__}: {self._head_base_class.__name__} {problem}; a head there would get its "
                f"log-probs changed, so it is refused (docs/huggingface.md lists the families that take a head)"
            )

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


def _probe_values(shape, dtype, device) -> torch.Tensor:
    """What the probe's output layer returns instead of its own output: a fixed pattern of logits over
    ``[-50, 50]`` in steps of 0.5 (exact in float32 and bf16), wide enough that a soft-cap or a scale shows."""
    n = 1
    for size in shape:
        n *= size
    values = (torch.arange(n, device=device) * 37 % 201 - 100).to(torch.float32) * 0.5
    return values.view(shape).to(dtype)


def _probe_inputs(model, vocab_size: int, device) -> Dict[str, torch.Tensor]:
    """A tiny fixed input for one forward of ``model``: 5 token ids (and 3 decoder ids for a seq2seq model)."""
    sizes = [vocab_size]
    inputs = model.get_input_embeddings()
    if isinstance(getattr(inputs, "num_embeddings", None), int):
        sizes.append(inputs.num_embeddings)
    ids = torch.tensor([[3, 5, 7, 4, 6]], device=device) % min(sizes)
    kwargs = {"input_ids": ids}
    if is_seq2seq(model):
        kwargs["decoder_input_ids"] = ids[:, :3]
    if "use_cache" in inspect.signature(model.forward).parameters:
        kwargs["use_cache"] = False
    return kwargs


def _transform_hint(got: torch.Tensor, made: torch.Tensor) -> str:
    """What the model seems to do to the output layer's logits ``made`` before returning ``got``."""
    scale = (got * made).sum() / (made * made).sum()
    if (got - scale * made).abs().max() <= 1e-4 * (1 + made.abs().max()):
        return f"a scalar scale: returned logits = {scale.item():.6g} x the output layer's"
    rows_made, rows_got = made.reshape(-1, made.shape[-1]), got.reshape(-1, got.shape[-1])
    row_scale = (rows_got * rows_made).sum(-1, keepdim=True) / (rows_made * rows_made).sum(-1, keepdim=True)
    if (rows_got - row_scale * rows_made).abs().max() <= 1e-4 * (1 + made.abs().max()):
        return "a per-token scale"
    if got.abs().max() < made.abs().max() and ((got * made) >= 0).all():
        return f"a soft-cap? |returned logits| <= {got.abs().max().item():.4g}"
    return "an unknown transform"


@torch.no_grad()
def probe_output_layer(model, layer: nn.Module, layer_checks: bool = True) -> Optional[str]:
    """One forward of ``model`` (eval mode, no grad, a fixed 5-token input; each module's mode restored after)
    with ``layer``'s output replaced by a fixed pattern of logits: None where the returned logits are that pattern
    (plus ``final_logits_bias``, which :func:`swap_head` folds into the head's bias), else what differs, in words.
    Catches an input embedding in the output layer's place (called on token ids, or not at all), a layer run more
    than once, and any transform after the layer (a soft-cap, a scale), whatever config field holds it; with
    ``layer_checks`` also a layer that is not ``hidden @ weight.T + bias`` (off where ``layer`` is the head)."""
    calls: List[Optional[torch.Tensor]] = []
    made: List[torch.Tensor] = []
    linear: List[float] = []
    weight = getattr(layer, "weight", None)  # (d_softmax has none: a head's sizes are its config's)
    if isinstance(layer, OutputHead):
        hidden_size, vocab_size = layer.config.hidden_size, layer.config.vocab_size
    else:
        hidden_size, vocab_size = weight.shape[-1], weight.shape[-2]
    extra = sorted(name for name, _ in layer.named_parameters() if name not in ("weight", "bias"))
    if layer_checks and extra and not isinstance(layer, nn.Embedding):
        return (
            f"has an output layer ({type(layer).__name__}) with parameters besides weight and bias "
            f"({', '.join(extra)}): a transform of its logits that the head would drop"
        )

    def replace(module, args, kwargs, output):
        hidden = args[0] if args else next(iter(kwargs.values()), None)
        calls.append(hidden)
        if torch.is_tensor(hidden) and hidden.is_floating_point() and torch.is_tensor(output):
            if layer_checks and hidden.shape[-1] == hidden_size:  # what the head computes in its place: W g + b
                bias = getattr(module, "bias", None)
                diff = (output.float() - F.linear(hidden, weight, bias).float()).abs().max()
                linear.append((diff / (1 + output.detach().float().abs().max())).item())  # relative to the logits
            made.append(_probe_values(output.shape, output.dtype, output.device))
            return made[-1]
        return None

    modes = [(m, m.training) for m in model.modules()]
    handle = layer.register_forward_hook(replace, with_kwargs=True)
    try:
        model.eval()
        out = model(**_probe_inputs(model, vocab_size, next(layer.parameters()).device))
    except Exception as e:  # noqa: BLE001 (any failure: the model cannot be checked, so it is refused)
        first = (str(e).strip().splitlines() or [""])[0][:300]
        return f"could not be probed (one forward on 5 token ids failed: {type(e).__name__}: {first})"
    finally:
        handle.remove()
        for m, mode in modes:
            m.training = mode
    if not calls:
        return f"never ran its output layer ({type(layer).__name__}) in a forward"
    if not made or not calls[0].is_floating_point():
        return (
            f"calls its get_output_embeddings() ({type(layer).__name__}) on token ids: an input embedding, not the "
            f"layer that makes the logits (swap_head knows the output layer of {', '.join(sorted(OUTPUT_LAYERS))})"
        )
    if len(calls) != 1:
        return f"runs its output layer {len(calls)} times in one forward"
    if calls[0].shape[-1] != hidden_size or made[0].shape[-1] != vocab_size:
        return f"feeds its output layer {tuple(calls[0].shape)} for a V x d of {vocab_size} x {hidden_size}"
    if linear and linear[0] > max(1e-5, 4 * torch.finfo(made[0].dtype).eps):
        return (
            f"has an output layer ({type(layer).__name__}) that does not compute hidden @ weight.T + bias (relative "
            f"max |diff| {linear[0]:.3g}): a transform inside it that the head would drop"
        )
    logits = out.get("logits") if isinstance(out, dict) else (out[0] if isinstance(out, tuple) else None)
    if not torch.is_tensor(logits) or logits.shape != made[0].shape:
        shape = tuple(logits.shape) if torch.is_tensor(logits) else type(logits).__name__
        return f"returns logits of shape {shape}, not the output layer's {tuple(made[0].shape)}"
    got, expected = logits.float(), made[0].float()
    flb = getattr(model, "final_logits_bias", None)
    if torch.is_tensor(flb):
        got = got - flb.detach().float().reshape(-1)[: got.shape[-1]]
    eps = max(1e-5, 4 * torch.finfo(made[0].dtype).eps)
    diff = (got - expected).abs()
    if (diff <= eps * (1 + expected.abs())).all():
        return None
    return (
        f"transforms the logits after its output layer (returned logits != the output layer's: max |diff| "
        f"{diff.max().item():.3g}; {_transform_hint(got, expected)})"
    )


def swap_head(
    model, name: str, *, start: Optional[str] = None, frequency_order=None, token_counts=None, **options
) -> nn.Module:
    """Replace the output layer of a transformers LM by the head ``name``, in place; returns ``model``.

    The head's output embedding starts from the model's (and its bias from ``lm_head.bias`` +
    ``final_logits_bias`` where the model has them); if the model ties its output embedding to its
    input embedding, the head stays tied (a head that keeps several copies of it, DS-Softmax, starts
    from it untied, and ``from_pretrained`` leaves it untied). The model's class becomes ``SoftmaxHeads<Class>`` (a
    subclass), its config records the head, and ``save_pretrained`` / ``from_pretrained`` restore it.
    Works for any model with ``get_output_embeddings()`` returning a ``V x d`` projection: causal LMs
    (GPT-2, Llama family, ...) and seq2seq LMs (BART, Marian, T5, FSMT, ...; FSMT's output layer is its decoder's
    ``output_projection``, :data:`OUTPUT_LAYERS`).

    ``start="pretrained"`` adds the head options that make it start exactly as the model it replaces (MoS and
    Mixtape: identity contexts), and refuses a head with no exact start; ``"nearest"`` builds such a head anyway,
    with a warning (:func:`hf_heads.start_options`). The config records the options, not the word.

    Before anything changes, one forward of the model on a tiny input checks that its output layer makes the
    logits it returns (:func:`probe_output_layer`): a model that transforms them after the layer (a soft-cap, a
    scale: Gemma 2, Cohere, ...), whose head would get that transform applied to its log-probs, or whose
    ``get_output_embeddings()`` is an input embedding, is refused (``ValueError`` naming the class). A model on the
    meta device cannot run a forward and is not probed.

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
    old = output_layer(model)
    weight = getattr(old, "weight", None)
    if not isinstance(old, nn.Module) or not torch.is_tensor(weight) or weight.dim() != 2:
        raise ValueError(
            f"swap_head: {type(model).__name__} has no output projection (get_output_embeddings() "
            f"returned {type(old).__name__}); supported: causal and seq2seq LMs with an lm_head"
        )
    options = without_model_sizes("swap_head", options, hidden_size=weight.shape[1], vocab_size=weight.shape[0])
    options = start_options(name, start, options, where="swap_head: start")
    model_class = head_model_class(type(model))  # (refuses a class Liger patched, before running it)
    # a model on the meta device (built to count its parameters) computes nothing: no forward to probe
    problem = None if weight.device.type == "meta" else probe_output_layer(model, old)
    if problem is not None:
        raise ValueError(
            f"swap_head: {type(model).__name__} {problem}; a head there would get its log-probs changed, so it is "
            f"refused (docs/huggingface.md lists the families swap_head supports)"
        )
    inputs = model.get_input_embeddings()
    tied = inputs is not None and getattr(inputs, "weight", None) is weight
    bias, use_bias = _output_bias(model, old)
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
    model.__class__ = model_class
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
