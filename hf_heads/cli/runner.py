"""How every command starts and ends: ``softmax-heads COMMAND`` (or ``python -m hf_heads.cli COMMAND``) says how many
threads torch uses and how they wait (:func:`hf_heads.cli.process.describe`, on stderr); with a bad head, option or
value it prints the library's ``ValueError`` as one line (``softmax-heads COMMAND: error: ...``) and exits 2, as
argparse does for its own checks, instead of a traceback; ``SOFTMAX_HEADS_TRACEBACK=1`` shows the traceback."""

from __future__ import annotations

import os
import sys
from typing import Callable, Optional, Sequence

TRACEBACK_ENV = "SOFTMAX_HEADS_TRACEBACK"


def program() -> str:
    """The running command's module name (``hf_heads.cli``), else the script's name."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    if spec is not None and spec.name:
        return spec.name[: -len(".__main__")] if spec.name.endswith(".__main__") else spec.name
    return os.path.basename(sys.argv[0]) if sys.argv else "recipes"


def run(main: Callable, argv: Optional[Sequence[str]] = None, program_name: Optional[str] = None) -> None:
    """Run ``main(argv)`` and exit: with its return value where it is an exit code (an int), else 0; with 2 and one
    line on stderr for a ``ValueError``. Says torch's thread use first (stderr). ``program_name`` names the command
    in those lines (default :func:`program`)."""
    from hf_heads.cli.process import describe, hide_broken_torchaudio

    hide_broken_torchaudio()  # before the command loads transformers (python -m hf_heads.cli.X, torchrun -m ...)
    name = program_name or program()
    if "-h" not in sys.argv[1:] and "--help" not in sys.argv[1:]:
        print(f"{name}: {describe(at_start=True)}", file=sys.stderr, flush=True)
    try:
        code = main(argv)
    except ValueError as e:
        if os.environ.get(TRACEBACK_ENV):
            raise
        print(f"{name}: error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    raise SystemExit(code if isinstance(code, int) else 0)
