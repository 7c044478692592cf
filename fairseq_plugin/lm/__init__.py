"""The papers' language model in fairseq: AWD-LSTM (``head_awd_lstm_lm``), NT-ASGD (``--optimizer ntasgd
--lr-scheduler ntasgd``) and the averaged checkpoint it is scored with (``python -m fairseq_plugin.average``)."""
from . import awd_lstm, ntasgd  # noqa: F401
