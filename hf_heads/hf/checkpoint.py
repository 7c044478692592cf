"""A saved head model loads as the model that saved it.

* Each head model owns its config (:func:`own_config`): transformers models keep the config object they were built
  from, so a head swapped onto one of several models sharing a config would otherwise change them all.
* A save that could not be read back is refused before anything is written, and the config records the options the
  head holds (:func:`check_saveable`).
* A load whose weights lack a tensor the head needs, or hold one it does not have, is refused
  (:func:`check_loaded_head`): transformers would start the missing ones afresh and drop the others, a different
  model, silently. Starting the missing parts on purpose stays: a plain checkpoint loaded with a head config
  (:func:`loads_saved_head` tells the two apart).
"""

from __future__ import annotations

import copy
from typing import Any, Callable, Dict, List, Optional

import torch

from ..core import OutputHead
from .config import MODEL_TYPE, check_output_head, spec_head_config
from .output_layer import nested_configs
from .peft import running_head

#: the keyword arguments of ``from_pretrained`` that say where its files are (passed on to read the checkpoint's
#: config.json)
_HUB_KWARGS = ("cache_dir", "force_download", "proxies", "local_files_only", "token", "revision", "subfolder")


def own_config(model) -> Callable[[], None]:
    """Give ``model`` a deep copy of its config: every module attribute that holds the config, or a config nested in
    it (``text_config``, an encoder's), is pointed at the copy. Returns a function that points them back."""
    memo: Dict[int, Any] = {}
    copy.deepcopy(model.config, memo)
    copies = {id(c): memo[id(c)] for c in nested_configs(model.config)}
    moved = []
    for module in model.modules():
        for name, value in list(vars(module).items()):
            if id(value) in copies:
                module.__dict__[name] = copies[id(value)]  # (not setattr: a head model's guards it)
                moved.append((module, name, value))

    def undo() -> None:
        for module, name, value in moved:
            module.__dict__[name] = value

    return undo


def pretrained_path(args, kwargs):
    """The checkpoint ``from_pretrained(*args, **kwargs)`` reads (None where weights come as ``state_dict=``)."""
    return args[0] if args else kwargs.get("pretrained_model_name_or_path")


def _with_prefix(prefix: str, keys) -> List[str]:
    """The names among ``keys`` that start with ``prefix``, sorted (a key may be a tuple led by its name, as
    transformers lists mismatched keys)."""
    return sorted({name for name in (k[0] if isinstance(k, tuple) else k for k in keys) if name.startswith(prefix)})


def _saved_head_keys(model, head: OutputHead, state_dict: Optional[Dict[str, Any]]) -> set:
    """The names, within the head, of the head's tensors that ``save_pretrained`` writes: those under the head's path
    in ``state_dict`` where one is given, else the live head's; a weight tied to the input embedding counts (it is
    written once, as the embedding)."""
    if state_dict is None:
        keys = set(head.state_dict())  # (a quantized layer may hold more)
    else:
        prefix = head_path(model, head) + "."
        keys = {k[len(prefix) :] for k in state_dict if k.startswith(prefix)}
    weight = getattr(head, "weight", None)
    if weight is not None and getattr(model.get_input_embeddings(), "weight", None) is weight:
        keys.add("weight")
    return keys


def head_path(model, head: OutputHead) -> str:
    """The name of ``head`` among ``model``'s modules (``"lm_head"``, FSMT's ``"model.decoder.output_projection"``)."""
    return next(name for name, m in model.named_modules() if m is head)


def _spec_problem(model) -> Optional[str]:
    """Why ``model``'s config would not load as a model with its head, or None: its ``base_model_type`` is not its
    family's model type (known to this transformers), ``output_head`` does not build, or names another head than the
    model's."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    config = model.config
    family = type(config).__mro__[1]
    base = getattr(config, "base_model_type", None)
    if base != family.model_type:
        return f"config.base_model_type is {base!r}, not the model type of its {family.__name__}"
    if base not in CONFIG_MAPPING:
        return f"its base model type {base!r} is not one this version of transformers knows (code of its own, or newer)"
    try:
        check_output_head(config, "config.output_head")
    except ValueError as e:
        return str(e)
    layer = model.get_output_embeddings()
    head = running_head(layer)
    if head is None:
        return f"its output layer is a {type(layer).__name__}, not a head"
    if head is not layer:
        return (
            f"its head is wrapped by PEFT ({type(layer).__name__}), whose keys the folder would hold; save the PEFT "
            f"model (its adapter), or call merge_and_unload() on it and save the model that returns"
        )
    if head.head_name != config.output_head["name"]:
        return f"config.output_head names a {config.output_head['name']} head, but the model's head is {head.head_name}"
    return None


def _held_spec(head: OutputHead, spec: Dict[str, Any], built: OutputHead, resolved: set) -> Dict[str, Any]:
    """``spec`` with the options ``head`` holds where the head ``built`` from it holds others, except the sizes (the
    model's) and the options ``resolved``, which ``spec`` left at None for the head to set itself (Mixtape's form)."""
    have = head.config.to_dict()
    differ = {
        k: have[k]
        for k, v in built.config.to_dict().items()
        if k not in resolved | {"hidden_size", "vocab_size"} and have.get(k) != v
    }
    held = {**spec, "options": {**spec.get("options", {}), **{k: v for k, v in differ.items() if k != "use_bias"}}}
    if "use_bias" in differ:
        held["use_bias"] = differ["use_bias"]
    return held if differ else spec


def check_saveable(model, state_dict: Optional[Dict[str, Any]] = None) -> None:
    """Before ``model.save_pretrained`` writes anything: ``ValueError`` in one line where the folder would not load
    as ``model`` (:func:`_spec_problem`, or the head that ``output_head`` builds has a tensor the model's head lacks,
    or the options the head holds build no head); else the options of the model's head that ``output_head`` would
    build otherwise (a ``variance_scale`` set by ``calibrate``, an option set on ``head.config``) written into
    ``output_head``, as a resize writes its own. A ``state_dict`` given to ``save_pretrained`` (FSDP's, DeepSpeed's:
    the tensors written) is where the head's tensors must be; else the live head."""
    problem = _spec_problem(model)
    if problem is None:
        head, spec = running_head(model.get_output_embeddings()), model.config.output_head
        wanted = spec_head_config(spec, head.config.hidden_size, head.config.vocab_size)
        unset = [k for k, v in wanted.to_dict().items() if v is None]
        with torch.device("meta"):
            built = type(head)(wanted)
        lacking = sorted(set(built.state_dict()) - _saved_head_keys(model, head, state_dict))
        resolved = {k for k in unset if getattr(built.config, k) is not None}  # (set by the head itself)
        held = _held_spec(head, spec, built, resolved)
        try:
            spec_head_config(held, head.config.hidden_size, head.config.vocab_size)
        except ValueError as e:
            problem = f"the options its head holds build no head ({e})"
        if lacking:
            problem = f"the model's head lacks {', '.join(lacking)}, which its config.output_head's head has"
    if problem is not None:
        raise ValueError(
            f"{type(model).__name__}.save_pretrained: {problem}; the folder would not load as this model, so nothing "
            f"was written (hf_heads.convert_head changes a model's head and its config together)"
        )
    model.config.output_head = held


def loads_saved_head(args, kwargs) -> bool:
    """Whether ``from_pretrained(*args, **kwargs)`` builds the head that its checkpoint's config.json names, whose
    every tensor the weights must then hold: the config read from the checkpoint, or a ``config=`` naming the same
    head as the checkpoint's. A plain checkpoint loaded with a head config (``config=head_config(...)``, or an
    ``output_head=`` keyword) starts the head's other parts on purpose."""
    from transformers import PretrainedConfig

    config, path = kwargs.get("config"), pretrained_path(args, kwargs)
    if "output_head" in kwargs:
        return False
    if not isinstance(config, PretrainedConfig):
        return True
    if path is None:  # (weights given as state_dict=: no config.json to compare)
        return False
    try:
        saved, _ = PretrainedConfig.get_config_dict(path, **{k: kwargs[k] for k in _HUB_KWARGS if k in kwargs})
    except (OSError, ValueError, TypeError):
        return False
    if saved.get("model_type") != MODEL_TYPE or not isinstance(saved.get("output_head"), dict):
        return False
    spec, given = saved["output_head"], getattr(config, "output_head", None) or {}
    key = ("name", "options", "use_bias")
    return [spec.get(k) for k in key] == [given.get(k) for k in key]


def check_loaded_head(model, info: Dict[str, Any], path) -> None:
    """``ValueError`` in one line where the checkpoint at ``path`` lacks a tensor of ``model``'s head or holds one the
    head does not have (``info``: transformers' loading info; the head's optional state, which older weights lack,
    is left out of its missing keys by the model class)."""
    head = running_head(model.get_output_embeddings())
    if head is None:
        return
    prefix = head_path(model, head) + "."
    optional = {prefix + k for k in head.optional_state_keys}  # (transformers 4 may list them: older weights lack them)
    missing = [k for k in _with_prefix(prefix, info.get("missing_keys", ())) if k not in optional]
    unexpected = _with_prefix(prefix, info.get("unexpected_keys", ()))
    mismatched = _with_prefix(prefix, info.get("mismatched_keys", ()))
    if not missing and not unexpected and not mismatched:
        return
    found = " and ".join(
        part
        for part in (
            missing and f"lack {', '.join(missing)}, which its {head.head_name} head needs",
            unexpected and f"hold {', '.join(unexpected)}, which its {head.head_name} head does not have",
            mismatched and f"hold {', '.join(mismatched)} in another shape than its {head.head_name} head's",
        )
        if part
    )
    raise ValueError(
        f"{type(model).__name__}.from_pretrained({str(path)!r}): its weights {found} (config.json's "
        f"output_head): it would load as another model, so it is refused; save it again from the model that trained "
        f"it, or, to start a head on purpose from a plain model's weights, pass config=hf_heads.head_config(...)"
    )
