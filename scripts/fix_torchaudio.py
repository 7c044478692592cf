"""Keeping fairseq and transformers importable in one environment.

fairseq (and ``fairseq-fixed``) depend on ``torchaudio``. PyPI's torchaudio wheels are CUDA builds
pinned to one torch release: next to a CPU torch 2.13 the package is *installed* but raises
``OSError`` on import. transformers sees it installed and imports it from ``audio_utils`` when any
model module loads, so ``generate`` (and even ``from transformers import GPT2LMHeadModel``) fails.

Two remedies:

* ``make install`` runs this script with ``--fix`` (an install step: it is not part of the library), which uninstalls
  a torchaudio that cannot be imported; fairseq only needs it for its speech tasks.
* every recipe (``hf_heads/cli/process.py``, ``hide_broken_torchaudio``; ``import hf_heads`` hides nothing)
  marks such a torchaudio as absent in its own process, so transformers skips it and fairseq raises its
  own "install torchaudio" message only if a speech task is used.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from typing import Optional


def torchaudio_import_error(python: str = sys.executable) -> Optional[str]:
    """Try ``import torchaudio`` in a fresh interpreter; the error's last line, or ``None`` if it
    imports or is not installed."""
    code = (
        "import importlib.util, sys\n"
        "if importlib.util.find_spec('torchaudio') is None: sys.exit(0)\n"
        "import torchaudio\n"
    )
    proc = subprocess.run([python, "-c", code], capture_output=True, text=True)
    if proc.returncode == 0:
        return None
    lines = [line for line in proc.stderr.strip().splitlines() if line.strip()]
    return lines[-1] if lines else f"exit code {proc.returncode}"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="Check (and with --fix, repair) the torchaudio that fairseq pulls in.")
    p.add_argument("--fix", action="store_true", help="uninstall torchaudio if it is installed but cannot be imported")
    args = p.parse_args(argv)
    err = torchaudio_import_error()
    if err is None:
        print("torchaudio: importable or not installed; nothing to do")
        return 0
    print(f"torchaudio is installed but cannot be imported with this torch ({err}).")
    if not args.fix:
        print("It breaks transformers' model imports and generate(); uninstall it: `pip uninstall torchaudio`.")
        return 1
    print("Uninstalling it: fairseq needs it only for speech tasks, and transformers works without it.")
    subprocess.run([sys.executable, "-m", "pip", "uninstall", "-y", "torchaudio"], check=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
