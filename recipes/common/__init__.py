"""What the recipes share: :mod:`.cli` (every entry point's error handling and thread line), :mod:`.process` (the
process-wide defaults set before torch loads), :mod:`.timing` (interleaved timing, peak memory, a busy neighbour),
:mod:`.hidden_tasks` (the PTB LSTM task and the head-fitting loop), :mod:`.real_heads` (SmolLM2-135M's head, random
heads), :mod:`.reading` (a results page's hand-written reading and its number check), :mod:`.data` (where the shared
data is: one ``--data`` root, one default). Nothing here is imported at load time but the standard library, so
``recipes/__init__.py`` can run :mod:`.process` before torch.
"""
