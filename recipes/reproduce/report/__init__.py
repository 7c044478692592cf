"""The reproduction report, ``docs/reproduction.md``, from the committed ``records/reproduction/*.json`` (``python -m
recipes.reproduce.report``, :mod:`.page`): tables, plots and commands, with the readings written by hand beside them.

The modules, from the page down (each imports only those below it; import-linter holds the order): :mod:`.page` (the
whole page, the derived numbers the readings cite, the command), :mod:`.sections` (one per table, the pilot, the
protocol study, the compute spent), :mod:`.plots`, :mod:`.layout` (the markdown tables), :mod:`.collect` (results
into the committed json) and :mod:`.compare` (the paired comparisons of a table and what they could detect).
"""
