"""fairseq adapter for softmax-heads: ``fairseq-train --user-dir fairseq_plugin ...``.

Registers ``head_ARCH`` for every architecture of fairseq's ``transformer`` and
``transformer_lm`` models (``--output-head NAME --head-options JSON``), the papers' AWD-LSTM language model
(``head_awd_lstm_lm``) with its NT-ASGD schedule (``--optimizer ntasgd
--lr-scheduler ntasgd``), both in :mod:`fairseq_plugin.lm`, the criterion
``head_cross_entropy``, gives stock fairseq checkpoints a head (:mod:`fairseq_plugin.stock`), makes fairseq
checkpoints load under torch >= 2.6's
``weights_only=True`` default, and keeps ``--patience``'s count in checkpoints (:mod:`fairseq_plugin.patience`).
The heads themselves are :mod:`hf_heads.heads`, shared with the
HuggingFace adapter.
"""

from . import checkpoint  # noqa: F401  (before anything loads a checkpoint)
from . import conversion, criterions, lm, models, patience, stock  # noqa: F401

stock.track_restores()
