"""fairseq adapter for softmax-heads: ``fairseq-train --user-dir fairseq_plugin ...``.

Registers ``head_ARCH`` for every architecture of fairseq's ``transformer`` and
``transformer_lm`` models (``--output-head NAME --head-options JSON``), the papers' AWD-LSTM language model
(``head_awd_lstm_lm``, :mod:`fairseq_plugin.awd_lstm`) with its NT-ASGD schedule (``--optimizer ntasgd
--lr-scheduler ntasgd``, :mod:`fairseq_plugin.ntasgd`), the criterion
``head_cross_entropy``, and makes fairseq checkpoints load under torch >= 2.6's
``weights_only=True`` default. The heads themselves are :mod:`hf_heads.heads`, shared with the
HuggingFace adapter.
"""
from . import checkpoint  # noqa: F401  (before anything loads a checkpoint)
from . import awd_lstm, criterions, models, ntasgd  # noqa: F401
