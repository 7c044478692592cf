"""The lab: one folder per study, run from a checkout as ``python -m studies.NAME``.

A study holds its code (``study.py``), its committed records and figures, and its tests (``test_*.py``, in the
default ``make test``). Studies import the library (``hf_heads``, ``fairseq_plugin``) and the recipes' shared runtime
(``recipes.common``); nothing in the library or the recipes imports a study (``make lint`` holds that contract).
Importing this package first runs ``recipes/__init__.py``: the process defaults a recipe sets before torch loads.
"""

import recipes  # noqa: F401  (the process defaults, before anything loads torch)
