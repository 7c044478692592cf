"""The process-wide defaults every command sets before torch loads (the ``softmax-heads`` console script,
``recipes/__init__.py``), which ``import hf_heads`` leaves to its users: how torch's CPU threads wait, and a
torchaudio that cannot load hidden from transformers.

**Threads.**
torch's CPU build runs its intra-op threads on GNU OpenMP, whose idle threads by default *spin* for a while at the
end of every parallel operation before they sleep. On a machine where another process is busy (a laptop, a shared
server, a second training run), a spinning thread takes the core the descheduled thread it waits for needs, and a
step of many operations slows 3-10x (measured here with 2 threads beside busy processes: a Mixtape training step
6.7 s instead of 1.0 s, SVD-softmax's batch-1 top-k 96 ms instead of 9 ms), while one big matmul hardly slows.
``OMP_WAIT_POLICY=PASSIVE`` makes idle threads sleep at once and removes that loss.

OpenMP reads the setting once, when torch loads, so :func:`default_wait_policy` can only set it before ``import
torch``: every ``python -m recipes...`` command does (``recipes/__init__.py``), and the ``softmax-heads`` console
script starts its command again with it set (:func:`hf_heads.cli.__main__.console`), when the variable is not set.
``import hf_heads`` leaves the environment alone: in your own scripts (and with fairseq's CLI, which imports torch
before it loads ``--user-dir``), ``export OMP_WAIT_POLICY=PASSIVE``. Set ``OMP_WAIT_POLICY=ACTIVE`` to keep OpenMP's
spinning.

**torchaudio.** fairseq pulls in torchaudio, whose PyPI wheels are pinned to one CUDA torch: beside a CPU torch it is
installed but fails to import, and transformers, which sees it installed, then fails to import its model code.
`make install` uninstalls such a torchaudio (``scripts/fix_torchaudio.py``); :func:`hide_broken_torchaudio` covers a
recipe run in an environment set up otherwise. It must run before transformers loads, hence here.

This module imports nothing outside the standard library at load time, so the recipes can run it before torch.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from typing import Optional

WAIT_POLICY = "OMP_WAIT_POLICY"
DEFAULT = "PASSIVE"


def default_wait_policy() -> bool:
    """Set ``OMP_WAIT_POLICY=PASSIVE`` if torch is not loaded yet and the variable is unset; True if it set it."""
    if "torch" in sys.modules or WAIT_POLICY in os.environ:
        return False
    os.environ[WAIT_POLICY] = DEFAULT
    return True


def describe(at_start: bool = False) -> str:
    """One line for a recipe's log: torch's thread count (``at_start``: said as the count a command starts with,
    before its ``--threads``, where it has one, sets its own), the cores, and how idle threads wait."""
    import torch

    policy = os.environ.get(WAIT_POLICY)
    how = f"{WAIT_POLICY}={policy}" if policy else f"{WAIT_POLICY} unset (OpenMP spins: slow beside busy processes)"
    threads = torch.get_num_threads()
    when = " at the start (before any --threads)" if at_start else ""
    return f"torch: {threads} thread(s){when} on {os.cpu_count()} core(s), {how}"


def hide_broken_torchaudio() -> Optional[str]:
    """If torchaudio is installed but fails to import, hide it from this process.

    Returns the import error message when it was hidden, else ``None``.
    """
    if "torchaudio" in sys.modules:
        return None
    try:
        if importlib.util.find_spec("torchaudio") is None:
            return None
    except (ImportError, ValueError):
        return None
    try:
        import torchaudio  # noqa: F401
    except Exception as e:  # OSError from its compiled extension, ImportError, RuntimeError...
        for name in [m for m in sys.modules if m == "torchaudio" or m.startswith("torchaudio.")]:
            del sys.modules[name]
        sys.modules["torchaudio"] = None  # find_spec -> None, `import torchaudio` -> ImportError
        return f"{type(e).__name__}: {e}"
    return None
