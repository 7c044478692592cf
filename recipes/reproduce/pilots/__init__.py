"""The pilots that chose how a table runs, each committed beside it in the report: :mod:`.protocols` (``python -m
recipes.reproduce.pilots.protocols``: fairseq's blocks against the papers' streams on the mini PTB cell) and
:mod:`.lm_pilot` (``python -m recipes.reproduce.pilots.lm_pilot``: ``lm-ptb``'s optimiser and epochs on PTB's train
split). They build on the tables and the engine; no table imports them.
"""
