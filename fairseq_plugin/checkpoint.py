"""Loading fairseq checkpoints with torch >= 2.6, where ``torch.load`` defaults to ``weights_only=True``.

fairseq 0.12 calls ``torch.load(f, map_location=...)`` without ``weights_only``; its checkpoints
hold more than tensors (an ``argparse.Namespace`` in older ones, the config with omegaconf and
fairseq enum objects), so the weights-only unpickler refuses them. Rather than switching the
safety off (``weights_only=False``, or torch's environment variable that forces it), this module adds the
few classes fairseq checkpoints contain to torch's allow-list of safe globals. Anything else in a
checkpoint is still refused by torch.

A checkpoint of a model with a head starts with a marker (:data:`MARKER_KEY`, the first key of fairseq's
checkpoint dict), an object of a class of this module, so that loading it without the plugin fails on that
object first and torch's own error names what to do (its class is called
``SoftmaxHeadsCheckpoint_load_with_user_dir_or_import_fairseq_plugin``): pass ``--user-dir fairseq_plugin`` /
``from_pretrained(..., user_dir=...)``, or ``import fairseq_plugin`` first. Where torch's safety is off
(``weights_only=False``), unpickling the marker imports the plugin, which registers its models before fairseq
builds one: such a checkpoint then loads with no ``user_dir`` at all, as long as ``fairseq_plugin`` is importable.
"""

from __future__ import annotations

import argparse
import collections
import typing

import torch


#: first key of the checkpoint dict of a model with a head (the trainer's state_dict), holding the marker
MARKER_KEY = "softmax_heads"


class SoftmaxHeadsCheckpoint:
    """The marker saved first in checkpoints of head models (see the module's docstring); it holds nothing."""

    def __repr__(self) -> str:
        return "<softmax-heads checkpoint: load with user_dir=fairseq_plugin or after `import fairseq_plugin`>"


# pickle writes the class's qualified name, and torch's weights-only error prints it: make it say what to do
MARKER_NAME = "SoftmaxHeadsCheckpoint_load_with_user_dir_or_import_fairseq_plugin"
SoftmaxHeadsCheckpoint.__name__ = SoftmaxHeadsCheckpoint.__qualname__ = MARKER_NAME
globals()[MARKER_NAME] = SoftmaxHeadsCheckpoint


def _has_head(model) -> bool:
    from hf_heads.heads import OutputHead

    return any(isinstance(m, OutputHead) for m in model.modules())


def mark_head_checkpoints() -> None:
    """Make fairseq's ``Trainer.state_dict`` (what ``checkpoint_*.pt`` holds) start with the marker when the model
    has a head. Idempotent."""
    try:
        from fairseq.trainer import Trainer
    except ImportError:  # pragma: no cover - the plugin needs fairseq anyway
        return
    original = Trainer.state_dict
    if getattr(original, "_softmax_heads_marker", False):
        return

    def state_dict(self):
        state = original(self)
        if not _has_head(self._model):
            return state
        return {MARKER_KEY: SoftmaxHeadsCheckpoint(), **state}

    state_dict._softmax_heads_marker = True
    state_dict.__doc__ = original.__doc__
    Trainer.state_dict = state_dict


def _allow_list():
    classes = [
        SoftmaxHeadsCheckpoint,
        argparse.Namespace,
        collections.OrderedDict,
        collections.defaultdict,
        typing.Any,
        dict,
        list,
        int,
        float,
        bool,
        str,
    ]  # builtins appear as types inside omegaconf metadata
    try:
        from omegaconf import DictConfig, ListConfig
        from omegaconf.base import ContainerMetadata, Metadata
        from omegaconf.nodes import AnyNode, BooleanNode, EnumNode, FloatNode, IntegerNode, StringNode

        classes += [
            DictConfig,
            ListConfig,
            ContainerMetadata,
            Metadata,
            AnyNode,
            BooleanNode,
            EnumNode,
            FloatNode,
            IntegerNode,
            StringNode,
        ]
    except ImportError:  # pragma: no cover - omegaconf comes with fairseq
        pass
    try:
        from fairseq.dataclass import constants

        classes += [
            v
            for v in vars(constants).values()
            if isinstance(v, type) and issubclass(v, constants.StrEnum) and v is not constants.StrEnum
        ]
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
mark_head_checkpoints()
