"""The recipes: ``python -m recipes.NAME``, the processes this project starts.

Importing the package (the first thing ``python -m recipes.NAME`` does, before anything loads torch) sets the two
process-wide defaults that ``import hf_heads`` leaves to its users (:mod:`hf_heads.cli.process`): idle OpenMP
threads sleep instead of spinning (``OMP_WAIT_POLICY=PASSIVE`` unless set), and a torchaudio that is installed but
cannot load is hidden from this process so transformers' model imports work. The module is loaded from its file
beside this checkout's ``hf_heads``, not imported: importing ``hf_heads.cli.process`` would first run
``hf_heads/__init__.py``, which loads torch.
"""

import importlib.util
import os
import sys


def _process_module():
    """:mod:`hf_heads.cli.process` (standard library only), loaded from its file without its parent packages, under
    a name of its own (a later ``import hf_heads.cli.process`` loads the package's module as usual: its functions
    keep no state, so two copies do no harm)."""
    name = "recipes._process_defaults"
    if name not in sys.modules:
        path = os.path.join(
            os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "hf_heads", "cli", "process.py"
        )
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


_process_module().default_wait_policy()
_process_module().hide_broken_torchaudio()
