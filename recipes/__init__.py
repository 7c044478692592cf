"""The recipes: ``python -m recipes.NAME``, the processes this project starts.

Importing the package (the first thing ``python -m recipes.NAME`` does, before anything loads torch) sets the two
process-wide defaults that ``import hf_heads`` leaves to its users (:mod:`recipes.common.process`): idle OpenMP
threads sleep instead of spinning (``OMP_WAIT_POLICY=PASSIVE`` unless set), and a torchaudio that is installed but
cannot load is hidden from this process so transformers' model imports work.
"""

from recipes.common.process import default_wait_policy, hide_broken_torchaudio

default_wait_policy()
hide_broken_torchaudio()
