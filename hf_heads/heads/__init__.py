"""The pure-torch output heads, one module per head, shared by the HF and fairseq adapters.

Importing this package registers every head (one ``register_head`` each). The interface they implement and the
registry are in :mod:`hf_heads.core` (re-exported here).
"""

from ..core import (
    HeadConfig,
    LinearScoresHead,
    OutputHead,
    SingleSoftmaxHead,
    available_heads,
    get_head_class,
    head_specific_options,
    register_head,
)
from .adaptive_sampling import AdaptiveSamplingConfig, AdaptiveSamplingHead
from .class_softmax import ClassSoftmaxConfig, ClassSoftmaxHead, frequency_binning, zipf_class_boundaries
from .d_softmax import DSoftmaxConfig, DSoftmaxHead
from .ds_softmax import DSSoftmaxConfig, DSSoftmaxHead, mitosis
from .mixtape import MixtapeConfig, MixtapeHead
from .mos import MoSConfig, MoSHead
from .plif import MoSPLIFConfig, MoSPLIFHead, PiecewiseLinearIncreasing, PLIFConfig, PLIFHead
from .sigsoftmax import SigsoftmaxConfig, SigsoftmaxHead
from .softmax import SoftmaxConfig, SoftmaxHead
from .svd_softmax import SVDSoftmaxConfig, SVDSoftmaxHead

__all__ = [
    "HeadConfig",
    "OutputHead",
    "SingleSoftmaxHead",
    "LinearScoresHead",
    "available_heads",
    "get_head_class",
    "head_specific_options",
    "register_head",
    "SoftmaxConfig",
    "SoftmaxHead",
    "MoSConfig",
    "MoSHead",
    "MixtapeConfig",
    "MixtapeHead",
    "PLIFConfig",
    "PLIFHead",
    "MoSPLIFConfig",
    "MoSPLIFHead",
    "PiecewiseLinearIncreasing",
    "SigsoftmaxConfig",
    "SigsoftmaxHead",
    "DSSoftmaxConfig",
    "DSSoftmaxHead",
    "mitosis",
    "SVDSoftmaxConfig",
    "SVDSoftmaxHead",
    "AdaptiveSamplingConfig",
    "AdaptiveSamplingHead",
    "ClassSoftmaxConfig",
    "ClassSoftmaxHead",
    "frequency_binning",
    "zipf_class_boundaries",
    "DSoftmaxConfig",
    "DSoftmaxHead",
]
