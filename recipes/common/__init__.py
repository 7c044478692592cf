"""What the recipes and the studies share: :mod:`.runtime` (cells, resume, rate grids, CPU-hours), :mod:`.stats`
(paired tests, Holm, the difference a test detects), :mod:`.reading` (a results page's hand-written reading and its
number check), :mod:`.data` (where the shared data is: one ``--data`` root, one default). Nothing here is imported at
load time but the standard library, so ``recipes/__init__.py`` can run its process defaults before torch.
"""
