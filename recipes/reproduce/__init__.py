"""Reproductions of the papers' tables: ``python -m recipes.reproduce TABLE --scale {mini,full}``.

:mod:`~recipes.reproduce.tables`: one module per table (``mt_en_de.py`` is the En-De BLEU table, ``lm_ptb.py`` the
PTB perplexity table, ...; ``translation.py`` / ``language_model.py`` what each kind shares); the engine every table
runs on in :mod:`~recipes.reproduce.engine` (the loop of a table, fairseq's command line, the sweep, results, head
variants such as ``mos-9``, the papers' training-cost columns); :mod:`~recipes.reproduce.data` (data checks, BPE,
the full-size corpora); :mod:`~recipes.reproduce.report` (``docs/reproduction.md``).
"""

from __future__ import annotations

import importlib

#: table name -> the module that defines it (its ``TABLE``)
TABLE_MODULES = {
    "mt-en-de": "recipes.reproduce.tables.mt_en_de",
    "mt-en-fr": "recipes.reproduce.tables.mt_en_fr",
    "lm-ptb": "recipes.reproduce.tables.lm_ptb",
    "lm-wt2": "recipes.reproduce.tables.lm_wt2",
    "lm-1b": "recipes.reproduce.tables.lm_1b",
    "lm-gpt2": "recipes.reproduce.tables.lm_gpt2",
}


def get_table(name: str):
    """The table object called ``name``; a bad name stops with the choices."""
    if name not in TABLE_MODULES:
        raise SystemExit(
            f"unknown table {name!r}; choose one of: {', '.join(TABLE_MODULES)} (python -m recipes.reproduce --list)"
        )
    return importlib.import_module(TABLE_MODULES[name]).TABLE
