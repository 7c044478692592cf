"""Loading fairseq checkpoints with torch >= 2.6, where ``torch.load`` defaults to ``weights_only=True``.

fairseq 0.12 calls ``torch.load(f, map_location=...)`` without ``weights_only``; its checkpoints
hold more than tensors (an ``argparse.Namespace`` in older ones, the config with omegaconf and
fairseq enum objects), so the weights-only unpickler refuses them. Rather than switching the
safety off (``weights_only=False``, or torch's environment variable that forces it), this module adds the
few classes fairseq checkpoints contain to torch's allow-list of safe globals. Anything else in a
checkpoint is still refused by torch.
"""
from __future__ import annotations

import argparse
import collections
import typing

import torch


def _allow_list():
    classes = [argparse.Namespace, collections.OrderedDict, collections.defaultdict, typing.Any,
               dict, list, int, float, bool, str]  # builtins appear as types inside omegaconf metadata
    try:
        from omegaconf import DictConfig, ListConfig
        from omegaconf.base import ContainerMetadata, Metadata
        from omegaconf.nodes import AnyNode, BooleanNode, EnumNode, FloatNode, IntegerNode, StringNode
        classes += [DictConfig, ListConfig, ContainerMetadata, Metadata, AnyNode, BooleanNode, EnumNode,
                    FloatNode, IntegerNode, StringNode]
    except ImportError:  # pragma: no cover - omegaconf comes with fairseq
        pass
    try:
        from fairseq.dataclass import constants
        classes += [v for v in vars(constants).values()
                    if isinstance(v, type) and issubclass(v, constants.StrEnum) and v is not constants.StrEnum]
        classes.append(constants.StrEnum)
    except ImportError:  # pragma: no cover
        pass
    return classes


def allow_fairseq_checkpoints() -> list:
    """Add the classes of fairseq checkpoints to ``torch.serialization``'s safe globals."""
    if not hasattr(torch.serialization, "add_safe_globals"):  # torch < 2.4: weights_only is not the default
        return []
    classes = _allow_list()
    torch.serialization.add_safe_globals(classes)
    return classes


allow_fairseq_checkpoints()
