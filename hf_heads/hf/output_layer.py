"""A model's output layer: where it is (:data:`OUTPUT_LAYERS`, :func:`output_layer`), whether it makes the logits the
model returns (:func:`probe_output_layer`: one forward with the layer's output replaced by a known pattern), and, for a
model that scales or soft-caps them after the layer, the config field that holds the map, switched off so that a head
applies it instead (:func:`absorb_logit_map`)."""

from __future__ import annotations

import dataclasses
import inspect
import math
import re
import warnings
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from ..core import OutputHead
from .lean_forward import is_seq2seq

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


def output_layer(model) -> Optional[nn.Module]:
    """The module that makes ``model``'s logits: the one :data:`OUTPUT_LAYERS` names, else
    ``get_output_embeddings()``."""
    path = output_layer_path(type(model))
    return model.get_submodule(path) if path else model.get_output_embeddings()


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


@dataclasses.dataclass
class Probe:
    """What :func:`run_probe` saw: ``problem`` (None where the model's logits are its output layer's), and for a
    probe that got as far as comparing the returned logits, the layer's input ``hidden``, the pattern ``made`` and
    the returned logits ``got`` (float32, less ``final_logits_bias``), with the tolerance ``eps`` of the check."""

    problem: Optional[str]
    hidden: Optional[torch.Tensor] = None
    made: Optional[torch.Tensor] = None
    got: Optional[torch.Tensor] = None
    eps: float = 1e-5

    @property
    def transforms_logits(self) -> bool:
        """Whether the layer is the one that makes the logits, and the model changes them after it."""
        return self.problem is not None and self.got is not None


@torch.no_grad()
def run_probe(model, layer: nn.Module, layer_checks: bool = True) -> Probe:
    """:func:`probe_output_layer`, with what it saw (:class:`Probe`)."""
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
        return Probe(
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
        return Probe(f"could not be probed (one forward on 5 token ids failed: {type(e).__name__}: {first})")
    finally:
        handle.remove()
        for m, mode in modes:
            m.training = mode
    if not calls:
        return Probe(f"never ran its output layer ({type(layer).__name__}) in a forward")
    if not made or not calls[0].is_floating_point():
        return Probe(
            f"calls its get_output_embeddings() ({type(layer).__name__}) on token ids: an input embedding, not the "
            f"layer that makes the logits (swap_head knows the output layer of {', '.join(sorted(OUTPUT_LAYERS))})"
        )
    if len(calls) != 1:
        return Probe(f"runs its output layer {len(calls)} times in one forward")
    if calls[0].shape[-1] != hidden_size or made[0].shape[-1] != vocab_size:
        return Probe(f"feeds its output layer {tuple(calls[0].shape)} for a V x d of {vocab_size} x {hidden_size}")
    if linear and linear[0] > max(1e-5, 4 * torch.finfo(made[0].dtype).eps):
        return Probe(
            f"has an output layer ({type(layer).__name__}) that does not compute hidden @ weight.T + bias (relative "
            f"max |diff| {linear[0]:.3g}): a transform inside it that the head would drop"
        )
    logits = out.get("logits") if isinstance(out, dict) else (out[0] if isinstance(out, tuple) else None)
    if not torch.is_tensor(logits) or logits.shape != made[0].shape:
        shape = tuple(logits.shape) if torch.is_tensor(logits) else type(logits).__name__
        return Probe(f"returns logits of shape {shape}, not the output layer's {tuple(made[0].shape)}")
    got, expected = logits.float(), made[0].float()
    flb = getattr(model, "final_logits_bias", None)
    if torch.is_tensor(flb):
        got = got - flb.detach().float().reshape(-1)[: got.shape[-1]]
    eps = max(1e-5, 4 * torch.finfo(made[0].dtype).eps)
    diff = (got - expected).abs()
    problem = None
    if not (diff <= eps * (1 + expected.abs())).all():
        problem = (
            f"transforms the logits after its output layer (returned logits != the output layer's: max |diff| "
            f"{diff.max().item():.3g}; {_transform_hint(got, expected)})"
        )
    return Probe(problem, calls[0].detach().float().clone(), expected, got, eps)


def probe_output_layer(model, layer: nn.Module, layer_checks: bool = True) -> Optional[str]:
    """One forward of ``model`` (eval mode, no grad, a fixed 5-token input; each module's mode restored after)
    with ``layer``'s output replaced by a fixed pattern of logits: None where the returned logits are that pattern
    (plus ``final_logits_bias``, which :func:`swap_head` folds into the head's bias), else what differs, in words.
    Catches an input embedding in the output layer's place (called on token ids, or not at all), a layer run more
    than once, and any transform after the layer (a soft-cap, a scale), whatever config field holds it; with
    ``layer_checks`` also a layer that is not ``hidden @ weight.T + bias`` (off where ``layer`` is the head)."""
    return run_probe(model, layer, layer_checks).problem


# -- a fixed map of the logits after the output layer, moved into the head ----------------------------------------
#: the returned logits' entries the hypotheses of :func:`absorb_logit_map` are checked on (the re-probe checks all)
_HYPOTHESIS_ENTRIES = 4096
_LIKELY_NAME = re.compile("logit|cap|scal|multiplier", re.IGNORECASE)


@dataclasses.dataclass
class AbsorbedMap:
    """What :func:`absorb_logit_map` moved: the head ``options`` (``logit_scale``, ``logit_softcap``), the fields it
    switched off as ``(name, old value)``, and ``undo()``, which puts them back."""

    options: Dict[str, float]
    fields: List[Tuple[str, Any]]
    undo: Callable[[], None]

    def sentence(self) -> str:
        """``"applies final_logit_softcapping=30.0 to its logits after its output layer, which moves into the
        head"``: what the model does, in words (after its class name)."""
        fields = " and ".join(f"{name}={value!r}" for name, value in self.fields)
        return f"applies {fields} to its logits after its output layer, which moves into the head"


def nested_configs(config) -> List[Any]:
    """``config`` and every config nested in it (a multimodal model's ``text_config``, an encoder's and decoder's)."""
    found, todo = [], [config]
    while todo:
        c = todo.pop()
        if any(c is f for f in found):
            continue
        found.append(c)
        todo.extend(v for v in vars(c).values() if hasattr(v, "to_dict") and hasattr(v, "model_type"))
    return found


def _number_fields(model) -> Dict[str, Tuple[float, List[Any]]]:
    """``{name: (value, holders)}`` for every positive number (not 1) that the model's configs hold under ``name``,
    with the modules that hold the same value under the same name (a copy made at ``__init__``, as Cohere's
    ``logit_scale``); where configs hold different values under one name, the first found (``model.config``, then
    nested configs) is the value, and holders of another value are not among its holders."""

    def number(v) -> bool:
        return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0 and v != 1

    fields: Dict[str, Tuple[float, List[Any]]] = {}
    for config in nested_configs(model.config):
        for name, value in vars(config).items():
            if number(value) and fields.get(name, (value,))[0] == value:
                fields.setdefault(name, (value, []))[1].append(config)
    for module in model.modules():
        for name, value in vars(module).items():
            if name in fields and number(value) and value == fields[name][0]:
                fields[name][1].append(module)
    return fields


def _map_hypotheses(probe: Probe, fields) -> List[Tuple[Dict[str, float], List[Tuple[str, Any]]]]:
    """``[(head options, [(field, neutral value)])]``: the ways a field (or a soft-cap field and a scale field)
    explains the returned logits as ``c tanh(s z / c)`` or ``s z`` of the layer's ``z``: a field's value as the
    scale ``s`` (a multiplier) or ``1 / s`` (a divisor), switched off at 1, or as the cap ``c``, switched off at
    None. One-field explanations first."""
    z = probe.made.reshape(-1)[:_HYPOTHESIS_ENTRIES].double()
    got = probe.got.reshape(-1)[:_HYPOTHESIS_ENTRIES].double()
    tol = probe.eps * (1 + z.abs())

    def fits(scale: float, cap: Optional[float]) -> bool:
        pred = z * scale if cap is None else torch.tanh(z * (scale / cap)) * cap
        return bool(((got - pred).abs() <= tol).all())

    singles, pairs = [], []
    # names that speak of logits, caps or scales first (the order of the tries only: each is checked by a probe)
    fields = dict(sorted(fields.items(), key=lambda item: not _LIKELY_NAME.search(item[0])))
    for name, (value, _) in fields.items():
        for scale in (value, 1.0 / value):
            if fits(scale, None):
                singles.append(({"logit_scale": float(scale)}, [(name, 1.0)]))
        if fits(1.0, value):
            singles.append(({"logit_softcap": float(value)}, [(name, None)]))
    if singles:
        return singles
    for cap_name, (cap, _) in fields.items():
        if float(got.abs().max()) >= cap:
            continue
        for name, (value, _) in fields.items():
            for scale in (value, 1.0 / value) if name != cap_name else ():
                if fits(scale, cap):
                    options = {"logit_scale": float(scale), "logit_softcap": float(cap)}
                    pairs.append((options, [(cap_name, None), (name, 1.0)]))
    return pairs


def absorb_logit_map(model, layer: nn.Module, probe: Probe) -> Optional[AbsorbedMap]:
    """For a model that :func:`run_probe` found changing its logits after ``layer``: where the change is a fixed
    scale and / or soft-cap ``c tanh(s z / c)`` that a field of the model's config holds (Gemma 2's
    ``final_logit_softcapping``, Cohere's ``logit_scale``, Granite's ``logits_scaling``, ...), switch the model's copy
    off, in its config (which ``save_pretrained`` writes) and in the modules that copied it, and return the head
    options that apply it instead (:class:`AbsorbedMap`). Each explanation is checked by probing again: the returned
    logits must now be the layer's, and the layer's input unchanged (a field that changed anything else is put back).
    None where no field explains the change (the model is as it was)."""
    fields = _number_fields(model)
    for options, switches in _map_hypotheses(probe, fields):
        old = []

        def undo(old=old) -> None:
            for holder, name, value in reversed(old):
                setattr(holder, name, value)

        try:
            for name, neutral in switches:
                for holder in fields[name][1]:
                    value = getattr(holder, name)
                    setattr(holder, name, None if neutral is None else type(value)(neutral))
                    old.append((holder, name, value))
        except (TypeError, ValueError):  # a field that takes no such value (a config that validates what it is set to)
            undo()
            continue
        after = run_probe(model, layer, layer_checks=False)
        same_input = after.hidden is not None and torch.equal(after.hidden, probe.hidden)
        if after.problem is None and same_input:
            return AbsorbedMap(options, [(name, fields[name][0]) for name, _ in switches], undo)
        undo()
    return None


def absorb_or_refuse(model, layer: nn.Module, probe: Probe, options: dict, where: str) -> Optional[AbsorbedMap]:
    """None where ``probe`` found the model's logits to be its output layer's; where the model scales or soft-caps
    them after it by a field of its config, that field switched off (:func:`absorb_logit_map`) and what the head
    must apply instead; anything else refused in one line starting with ``where``, as is a map the user's
    ``options`` set too."""
    if probe.problem is None:
        return None
    absorbed = absorb_logit_map(model, layer, probe) if probe.transforms_logits else None
    if absorbed is None:
        raise ValueError(
            f"{where} {probe.problem}; a head there would get its log-probs changed, so it is refused "
            f"(docs/huggingface.md lists the families that take a head)"
        )
    given = sorted(set(options) & {"logit_scale", "logit_softcap"})
    if given:
        absorbed.undo()
        raise ValueError(
            f"{where} {absorbed.sentence()}, and option {given[0]}={options[given[0]]!r} was given too: leave it out "
            f"(the head applies the model's own)"
        )
    return absorbed


def logit_map_options(model) -> Dict[str, float]:
    """The head options (``logit_scale`` / ``logit_softcap``) with which a softmax of ``model``'s output layer is what
    the plain ``model`` computes: ``{}`` where it returns the layer's logits, ``ValueError`` (what the probe saw) where
    it transforms them otherwise; ``{}`` with a warning where it cannot run a forward here. The model is left as it
    was (the fields :func:`absorb_logit_map` switches off to check are put back)."""
    layer = output_layer(model)
    probe = run_probe(model, layer)
    if probe.problem is None:
        return {}
    if probe.problem.startswith("could not be probed"):
        message = f"{type(model).__name__} {probe.problem}: its logits are taken as its output layer's"
        warnings.warn(message, stacklevel=2)
        return {}
    absorbed = absorb_or_refuse(model, layer, probe, {}, type(model).__name__)
    absorbed.undo()
    return absorbed.options
