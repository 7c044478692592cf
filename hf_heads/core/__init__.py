"""The engine every head is built on, torch only: the registry, options, the head interface, the memory-lean loss,
shared math, saving and loading. Neither adapter (transformers, fairseq) is imported here."""

from .config import (
    SPEC_VERSION,
    HeadConfig,
    check_bool,
    check_float,
    check_int,
    check_option,
    check_spec_version,
    check_type,
    option,
)
from .convert import convert_head
from .decoding import fast_decoding
from .frequency import count_tokens, frequency_order
from .interface import LinearScoresHead, OutputHead, SingleSoftmaxHead
from .registry import (
    available_heads,
    build_head,
    check_head_options,
    get_head_class,
    has_exact_start,
    head_specific_options,
    heads_where,
    register_head,
    start_options,
    start_table,
    versioned_options,
)
from .serialization import load_head, save_head
from .start import START_CHOICES, check_start

__all__ = [
    "SPEC_VERSION",
    "HeadConfig",
    "check_bool",
    "check_float",
    "check_int",
    "check_option",
    "check_spec_version",
    "check_type",
    "option",
    "versioned_options",
    "convert_head",
    "count_tokens",
    "fast_decoding",
    "frequency_order",
    "LinearScoresHead",
    "OutputHead",
    "SingleSoftmaxHead",
    "available_heads",
    "build_head",
    "check_head_options",
    "get_head_class",
    "head_specific_options",
    "heads_where",
    "register_head",
    "load_head",
    "save_head",
    "START_CHOICES",
    "check_start",
    "has_exact_start",
    "start_options",
    "start_table",
]
