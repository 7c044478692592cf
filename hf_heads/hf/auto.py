"""Registration with transformers' Auto classes, and :func:`head_config`: ``import hf_heads`` registers the model
type ``softmax-heads`` with ``AutoConfig`` (:class:`SoftmaxHeadsConfig`); a loaded or new head config registers its
model classes with ``AutoModelForCausalLM`` / ``AutoModelForSeq2SeqLM``."""

from __future__ import annotations

import warnings
from typing import Any, Dict, Optional

from transformers import AutoConfig, PretrainedConfig

from ..core import SPEC_VERSION, start_options
from .config import (
    CLASS_PREFIX,
    MODEL_TYPE,
    check_output_head,
    head_config_class,
    head_spec,
    is_head_config,
    without_model_sizes,
)
from .modeling import head_model_class


def _base_config_class(base_model_type: str) -> type:
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    if base_model_type == MODEL_TYPE:  # (CONFIG_MAPPING knows it: this class, which would ask again)
        raise ValueError(f"{MODEL_TYPE}: base_model_type {MODEL_TYPE!r} names no model; give the wrapped model's type")
    try:
        return CONFIG_MAPPING[base_model_type]
    except KeyError:
        raise ValueError(
            f"{MODEL_TYPE}: base_model_type {base_model_type!r} is not a model type this version of transformers knows"
        ) from None


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
        if isinstance(getattr(config, "output_head", None), dict):  # a new config: read at today's defaults
            config.output_head.setdefault("version", SPEC_VERSION)
        check_output_head(config, "AutoConfig.for_model")
        _register_model_classes(config)
        return config

    @classmethod
    def from_dict(cls, config_dict: Dict[str, Any], **kwargs):
        spec = config_dict.get("output_head")
        if isinstance(spec, dict) and "version" not in spec:  # saved before specs had versions: version 1
            config_dict = {**config_dict, "output_head": {**spec, "version": 1}}
        if config_dict.get("base_model_type") == MODEL_TYPE:
            config_dict = {**config_dict, "base_model_type": _legacy_base_type(config_dict)}
        result = head_config_class(_base_config_class(_required_base_type(config_dict))).from_dict(
            config_dict, **kwargs
        )
        _register_model_classes(result[0] if isinstance(result, tuple) else result)
        return result


def _required_base_type(options: Dict[str, Any]) -> str:
    base = options.get("base_model_type")
    if not base:
        raise ValueError(
            f"a {MODEL_TYPE} config needs base_model_type, the wrapped model's type, and output_head: e.g. "
            f"AutoConfig.for_model({MODEL_TYPE!r}, base_model_type='gpt2', output_head={{'name': 'mixtape', "
            f"'options': {{}}}}, n_layer=2), or hf_heads.head_config(GPT2Config(...), 'mixtape')"
        )
    return base


def _base_model_class(architecture: str) -> Optional[type]:
    """The transformers class that a head model class's name wraps (``SoftmaxHeadsLlamaForCausalLM``:
    ``LlamaForCausalLM``), or None."""
    import transformers

    name = architecture[len(CLASS_PREFIX) :] if architecture.startswith(CLASS_PREFIX) else None
    found = getattr(transformers, name, None) if name else None
    return found if isinstance(found, type) and getattr(found, "config_class", None) is not None else None


def _legacy_base_type(config_dict: Dict[str, Any]) -> str:
    """The base model type of a config.json that records ``base_model_type: "softmax-heads"`` (softmax-heads 0.2.0
    and before wrote it where ``swap_head`` changed a config several models shared), read from its architectures,
    with a warning that says how to write it right; ``ValueError`` where no architecture names a transformers class.
    Whether the weights hold the head it names, ``from_pretrained`` checks (:func:`checkpoint.check_loaded_head`)."""
    names = config_dict.get("architectures") or []
    for name in names:
        base_class = _base_model_class(name)
        if base_class is not None:
            base = base_class.config_class.model_type
            warnings.warn(
                f"config.json records base_model_type {MODEL_TYPE!r} (softmax-heads 0.2.0 and before wrote it where "
                f"swap_head changed a config that several models shared); read as {base!r} from its architecture "
                f"{name}. Its head's tensors are checked as it loads, its options without tensors cannot be (a "
                f"soft-cap, gate_noise): compare its outputs with the model that saved it, then save it again with "
                f"save_pretrained to write a config.json that says {base!r}",
                stacklevel=3,
            )
            return base
    raise ValueError(
        f"{MODEL_TYPE}: config.json records base_model_type {MODEL_TYPE!r} and no architecture it names ({names}) is a "
        f"transformers model class: set base_model_type in config.json to the wrapped model's type (e.g. 'llama')"
    )


def head_config(base_config, name: str, use_bias: bool = False, start=None, **options) -> PretrainedConfig:
    """A config for a new model whose output layer is the head ``name``: ``base_config`` (any causal or seq2seq
    LM config, e.g. ``GPT2Config(n_layer=2)``) with model type ``softmax-heads``.

    ``AutoModelForCausalLM.from_config(head_config(GPT2Config(...), "mixtape", num_gates=4))`` (or
    ``AutoModelForSeq2SeqLM`` for a seq2seq config) builds the model with the head, freshly initialised;
    ``save_pretrained`` / ``from_pretrained`` restore it. The same as ``AutoConfig.for_model("softmax-heads",
    base_model_type=..., output_head={"name": name, "options": options}, **base options)``. Options are
    checked here, by building the head once on the meta device. ``start`` (``"pretrained"`` / ``"nearest"``) adds
    the options of the head's exact start (:func:`hf_heads.start_options`), for a model whose weights
    will come from a model with a plain softmax (e.g. ``convert_head`` or a state dict); the config records the
    options, not the word.
    """
    if not isinstance(base_config, PretrainedConfig):
        raise ValueError(
            f"head_config: expected a transformers config (e.g. GPT2Config(...)), got {type(base_config).__name__}"
        )
    if is_head_config(base_config):
        raise ValueError(
            f"head_config: the config already names a head ({base_config.output_head['name']}); "
            f"start from the base model's config"
        )
    text = base_config.get_text_config()
    options = without_model_sizes("head_config", options, hidden_size=text.hidden_size, vocab_size=text.vocab_size)
    options = start_options(name, start, options, where="head_config: start")
    spec = head_spec(name, options, use_bias)
    config = head_config_class(type(base_config)).from_dict(
        # (a plain class named in architectures, as a Hub config names it, is the head model's class at save)
        {**base_config.to_dict(), "base_model_type": base_config.model_type, "output_head": spec, "architectures": None}
    )
    check_output_head(config, "head_config")
    _register_model_classes(config)
    return config


def _register_model_classes(config) -> None:
    """Make the Auto model classes know the head model classes of a loaded head config: the class
    named in ``architectures`` (``SoftmaxHeads<Class>``), else the family's Auto-mapped LM classes."""
    from transformers.models.auto import modeling_auto

    base_config = type(config).__mro__[1]
    found = False
    for arch in getattr(config, "architectures", None) or []:
        base_cls = _base_model_class(arch)
        if base_cls is not None:
            head_model_class(base_cls)
            found = True
    if not found:
        for mapping in (
            modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING,
            modeling_auto.MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING,
        ):
            if base_config in mapping:
                head_model_class(mapping[base_config])


def register_auto_classes() -> None:
    """Register ``model_type="softmax-heads"`` with ``AutoConfig`` (run by ``import hf_heads``)."""
    AutoConfig.register(MODEL_TYPE, SoftmaxHeadsConfig, exist_ok=True)
