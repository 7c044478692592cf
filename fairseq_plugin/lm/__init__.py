"""The papers' language model in fairseq: AWD-LSTM (``head_awd_lstm_lm``), NT-ASGD (``--optimizer ntasgd
--lr-scheduler ntasgd``), the averaged checkpoint it is scored with (``python -m fairseq_plugin.average``) and the
papers' training and scoring protocol (``--task awd_language_modeling``: streams, carried state, variable BPTT)."""

from . import awd_lstm, ntasgd, streams  # noqa: F401
