"""The config classes of head models: for each model family, its config class with model type ``softmax-heads``
(``SoftmaxHeadsGPT2Config``, ...), made when first needed."""

from __future__ import annotations

from typing import Any, Dict

from ..core.config import SPEC_VERSION, check_spec_version
from ..core.registry import check_head_options, versioned_options

MODEL_TYPE = "softmax-heads"  # the pip package name: what transformers prints when it is missing
CLASS_PREFIX = "SoftmaxHeads"  # of a head config class's and a head model class's name: SoftmaxHeadsLlamaForCausalLM
_CONFIG_CLASSES: Dict[type, type] = {}


def head_config_class(base_config_class: type) -> type:
    """The head config class for a model family: ``base_config_class`` with model_type softmax-heads (its direct
    subclass: ``__mro__[1]`` is the family's class)."""
    if base_config_class.model_type == MODEL_TYPE:
        return base_config_class
    if base_config_class not in _CONFIG_CLASSES:
        _CONFIG_CLASSES[base_config_class] = type(
            f"{CLASS_PREFIX}{base_config_class.__name__}",
            (base_config_class,),
            {
                "model_type": MODEL_TYPE,
                "__module__": __name__,
                "__doc__": f"{base_config_class.__name__} of a model whose output layer is a softmax-heads head.",
                "save_pretrained": _checked_save(base_config_class.save_pretrained),
            },
        )
    return _CONFIG_CLASSES[base_config_class]


def family_class(name: str, module: str, kind: str, make):
    """``make(transformers' class)`` for the head class named ``name`` (``SoftmaxHeads`` + a transformers class's name),
    so that ``getattr(module, name)`` finds a class made on demand: pickle and multiprocessing's spawn (vLLM's engine,
    DataLoader workers) then pass a head config or model by its name."""
    base = name[len(CLASS_PREFIX) :] if name.startswith(CLASS_PREFIX) else ""
    import transformers

    found = getattr(transformers, base, None) if base else None
    if not (isinstance(found, type) and issubclass(found, getattr(transformers, kind))):
        raise AttributeError(f"module {module!r} has no attribute {name!r}")
    return make(found)


def __getattr__(name: str):
    """``SoftmaxHeadsLlamaConfig`` and the like: each family's head config class (:func:`family_class`)."""
    return family_class(name, __name__, "PretrainedConfig", head_config_class)


def is_head_config(config) -> bool:
    """Whether ``config`` names a head (model type softmax-heads)."""
    return getattr(config, "model_type", None) == MODEL_TYPE


def _checked_save(base_save):
    """The head config's ``save_pretrained``: the family's, refusing a config that a plain model class is saving (a
    model built as ``LlamaForCausalLM(head_config)``, whose output layer is no head: its folder would load as a head
    model its weights do not hold)."""

    def save_pretrained(self, save_directory, *args, **kwargs):
        plain = [a for a in getattr(self, "architectures", None) or [] if not a.startswith(CLASS_PREFIX)]
        if plain:
            raise ValueError(
                f"save_pretrained: {plain[0]} is a plain model class, built from a config that names a "
                f"{self.output_head['name']} head: its output layer is no head, and the folder would load as a head "
                f"model its weights do not hold; build the model with AutoModelForCausalLM.from_config(config) (or "
                f"AutoModelForSeq2SeqLM), or call hf_heads.swap_head on it"
            )
        return base_save(self, save_directory, *args, **kwargs)

    return save_pretrained


def unwrap_head_config(config) -> None:
    """Make ``config``, a head config held by a plain model, its family's config again: its class, without
    ``output_head``, ``base_model_type`` and the ``auto_map`` of the head's saved code."""
    config.__class__ = type(config).__mro__[1]
    for name in ("output_head", "base_model_type"):
        config.__dict__.pop(name, None)
    if "softmax_heads" in str(getattr(config, "auto_map", "")):
        del config.auto_map


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


def check_output_head(config, caller: str) -> None:
    """``ValueError`` (one line, naming the head option, its value and the allowed range, or the nearest head name)
    where ``config.output_head`` does not build, so a bad head fails when its config is made, not at
    ``from_config``: the registry checks the options against the model's sizes without building the head."""
    spec = getattr(config, "output_head", None)
    if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
        raise ValueError(f"{caller}: output_head must be a dict {{'name': HEAD, 'options': {{...}}}}, got {spec!r}")
    extra = sorted(set(spec) - {"name", "options", "use_bias", "version"})
    if extra or not isinstance(spec.get("options", {}), dict):
        raise ValueError(
            f"{caller}: output_head has keys {sorted(spec)}; expected 'name', 'options' (a dict) and "
            f"optionally 'use_bias' and 'version'"
        )
    text = config.get_text_config()
    spec_head_config(spec, text.hidden_size, text.vocab_size, caller)


def spec_head_config(spec: Dict[str, Any], hidden_size: int, vocab_size: int, where: str = "output_head"):
    """The head config that ``spec`` builds at these sizes, checked as ``build_head`` checks it (``ValueError`` naming
    the option, its value and the allowed range)."""
    return check_head_options(
        spec["name"],
        hidden_size=hidden_size,
        vocab_size=vocab_size,
        use_bias=bool(spec.get("use_bias", False)),
        **spec_options(spec, where),
    )
