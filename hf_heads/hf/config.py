"""The config classes of head models: for each model family, its config class with model type ``softmax-heads``
(``SoftmaxHeadsGPT2Config``, ...), made when first needed."""
from __future__ import annotations

from typing import Dict

MODEL_TYPE = "softmax-heads"  # the pip package name: what transformers prints when it is missing
_CONFIG_CLASSES: Dict[type, type] = {}


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
