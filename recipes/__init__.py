"""The recipes: ``python -m recipes.NAME``, the processes this project starts.

Importing the package (the first thing ``python -m recipes.NAME`` does, before anything loads torch) sets the two
process-wide defaults that ``import hf_heads`` leaves to its users: idle OpenMP threads sleep instead of spinning
(``OMP_WAIT_POLICY=PASSIVE`` unless set; :mod:`recipes.threads`), and a torchaudio that is installed but cannot load
is hidden from this process so transformers' model imports work (:mod:`hf_heads.compat`).
"""

from recipes.threads import default_wait_policy as _default_wait_policy

_default_wait_policy()

from hf_heads.compat import block_broken_torchaudio as _block_broken_torchaudio  # noqa: E402

_block_broken_torchaudio()
