"""The reproduction's data wing: what the tables read, checked and prepared.

:mod:`~recipes.reproduce.data.prepare` (``python -m recipes.reproduce.data.prepare multi30k|lm``: the offline
corpora checked, BPE learned, binarised, and the file helpers every preparation shares),
:mod:`~recipes.reproduce.data.lm_corpora` (``python -m recipes.reproduce.data.lm_corpora``: the full-size
language-model corpora, prepared where there is internet), :mod:`~recipes.reproduce.data.wmt` (``python -m
recipes.reproduce.data.wmt``: the WMT pairs, the same). It imports no table or report (import-linter holds it).
"""
