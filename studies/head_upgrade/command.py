"""``python -m studies.head_upgrade``: ``softmax-heads upgrade`` (:mod:`hf_heads.cli.upgrade`) with the upgrade study's
"more parameters" control, ``--residual-mlp UNITS | mos-K`` (:mod:`studies.head_upgrade.control`); the command the docs,
the upgrade table and its cells write. Every other option is the library command's."""

from __future__ import annotations

import argparse
from typing import Dict

from hf_heads.cli import upgrade as _command
from studies.head_upgrade.control import ResidualMLPControl


def parse_args(argv=None) -> argparse.Namespace:
    """The library command's options and ``--residual-mlp``."""
    return _command.parse_args(argv, ResidualMLPControl())


def main(argv=None, log=print) -> Dict:
    """``softmax-heads upgrade`` with ``--residual-mlp``; returns what ``results.json`` holds."""
    return _command.main(argv, log, ResidualMLPControl())
