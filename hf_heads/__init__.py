"""softmax-heads: output layers that break the softmax bottleneck or make softmax cheap.

Core API (torch only)::

    import hf_heads
    hf_heads.available_heads()
    head = hf_heads.build_head("mixtape", hidden_size=512, vocab_size=10000, num_gates=4)
    log_probs = head(hidden)                       # [..., V], float32, normalised
    loss = head.loss(hidden, target) + head.aux_loss()
    hf_heads.save_head(head, "my_head"); head = hf_heads.load_head("my_head")
"""
from .compat import block_broken_torchaudio as _block_broken_torchaudio

_block_broken_torchaudio()  # a torchaudio that cannot load would break transformers (see compat.py)

from .heads import HeadConfig, OutputHead, available_heads, get_head_class, register_head
from .io import build_head, load_head, save_head

__version__ = "0.1.0"

__all__ = ["HeadConfig", "OutputHead", "available_heads", "build_head", "get_head_class", "load_head",
           "register_head", "save_head", "__version__"]
