"""The config classes of head models: for each model family, its config class with model type ``softmax-heads``
(``SoftmaxHeadsGPT2Config``, ...), made when first needed."""

from __future__ import annotations

from typing import Any, Dict

from ..core.config import SPEC_VERSION, check_spec_version
from ..core.registry import versioned_options

MODEL_TYPE = "softmax-heads"  # the pip package name: what transformers prints when it is missing
_CONFIG_CLASSES: Dict[type, type] = {}


def head_config_class(base_config_class: type) -> type:
    """The head config class for a model family: ``base_config_class`` with model_type softmax-heads."""
    if base_config_class.model_type == MODEL_TYPE:
        return base_config_class
    if base_config_class not in _CONFIG_CLASSES:
        _CONFIG_CLASSES[base_config_class] = type(
            f"SoftmaxHeads{base_config_class.__name__}",
            (base_config_class,),
            {
                "model_type": MODEL_TYPE,
                "__module__": __name__,
                "__doc__": f"{base_config_class.__name__} of a model whose output layer is a softmax-heads head.",
            },
        )
    return _CONFIG_CLASSES[base_config_class]


def without_model_sizes(caller: str, options: Dict[str, Any], hidden_size: int, vocab_size: int) -> Dict[str, Any]:
    """``options`` less ``hidden_size`` and ``vocab_size``, which the model sets: a value equal to the model's is
    accepted (every head takes them), a different one refused in one line."""
    options = dict(options)
    for key, value in (("hidden_size", hidden_size), ("vocab_size", vocab_size)):
        given = options.pop(key, value)
        if given != value:
            raise ValueError(
                f"{caller}: {key}={given!r} does not match the model's {key}, {value}: leave it out, the model sets it"
            )
    return options


def head_spec(name: str, options: Dict[str, Any], use_bias: bool) -> Dict[str, Any]:
    """A config's ``output_head``: the head, the options given, and the spec version they are read at."""
    return {"name": name, "options": dict(options), "use_bias": bool(use_bias), "version": SPEC_VERSION}


def spec_options(spec: Dict[str, Any], where: str = "output_head") -> Dict[str, Any]:
    """The options ``spec`` means: its own, plus the defaults of its version where they changed since (a spec
    without a version is read as the current one: :meth:`SoftmaxHeadsConfig.from_dict` marks saved ones)."""
    version = check_spec_version(where, spec.get("version", SPEC_VERSION))
    return versioned_options(spec["name"], spec.get("options", {}), version)
