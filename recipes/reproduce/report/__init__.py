"""The reproduction report, ``docs/reproduction.md``, from the committed ``records/reproduction/*.json`` (``python -m
recipes.reproduce.report``, :mod:`.page`): tables, plots and commands, with the readings written by hand beside them.

The modules, from the page down (each imports only those below it; import-linter holds the order): :mod:`.page` (the
whole page, the readings' number check, the command), :mod:`.sections` (one per table, the pilot, the protocol study,
the compute spent), :mod:`.plots` and :mod:`.layout` (the markdown tables). What they render, the collection into
the committed json, the paired comparisons and the derived numbers the readings cite, is computed by
:mod:`recipes.reproduce.analysis`, which imports no report.
"""
