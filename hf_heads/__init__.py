"""softmax-heads: output layers that break the softmax bottleneck or make softmax cheap.

Core API (torch only)::

    import hf_heads
    hf_heads.available_heads()
    head = hf_heads.build_head("mixtape", hidden_size=512, vocab_size=10000, num_gates=4)
    log_probs = head(hidden)                       # [..., V], float32, normalised
    loss = head.loss(hidden, target) + head.aux_loss()
    hf_heads.save_head(head, "my_head"); head = hf_heads.load_head("my_head")

HuggingFace (when transformers is installed)::

    model = hf_heads.swap_head(AutoModelForCausalLM.from_config(cfg), "mixtape", num_gates=4)
"""

import importlib.util as _importlib_util

from .core import (
    HeadConfig,
    OutputHead,
    available_heads,
    build_head,
    check_head_options,
    convert_head,
    count_tokens,
    fast_decoding,
    frequency_order,
    get_head_class,
    has_exact_start,
    load_head,
    register_head,
    save_head,
    start_options,
    start_table,
)
from . import heads as _heads  # noqa: F401  (registers every head)

__version__ = "0.2.0"

__all__ = [
    "HeadConfig",
    "OutputHead",
    "available_heads",
    "build_head",
    "check_head_options",
    "convert_head",
    "count_tokens",
    "fast_decoding",
    "frequency_order",
    "get_head_class",
    "has_exact_start",
    "load_head",
    "register_head",
    "save_head",
    "start_options",
    "start_table",
    "swap_head",
    "output_head",
    "head_config",
    "VocabParallel",
    "__version__",
]


def __getattr__(name: str):
    """``hf_heads.VocabParallel``: the tensor-parallel style of a head (:mod:`hf_heads.core.shard`), imported on use."""
    if name == "VocabParallel":
        from .core import shard

        return shard.VocabParallel
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


if _importlib_util.find_spec("transformers") is not None:
    # the HF adapter: AutoConfig learns model_type "softmax-heads" (cheap: no model code is imported)
    from .hf import head_config, output_head, register_auto_classes as _register_auto_classes, swap_head

    _register_auto_classes()
else:

    def swap_head(*args, **options):
        """Needs transformers: ``pip install softmax-heads[hf]``."""
        raise ImportError(
            "hf_heads.swap_head, head_config and output_head need HuggingFace transformers: "
            "pip install 'softmax-heads[hf]'"
        )

    output_head = head_config = swap_head
