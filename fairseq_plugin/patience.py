"""fairseq's early stopping (``--patience N``) that survives a resumed run.

fairseq-train stops when the validation metric has not improved for ``--patience`` validations in a row. It keeps
the count in attributes of ``fairseq_cli.train.should_stop_early`` (``best``, ``num_runs``), which no checkpoint
holds: a run resumed from ``checkpoint_last.pt`` counts again from its first validation, which it takes as the best
even when it is worse than an earlier one, so an interrupted run stops later than the same run uninterrupted (and
where it stops depends on when it was interrupted). The plugin saves the count in every checkpoint
(``extra_state["patience"]``) and restores it when fairseq-train resumes (not when ``--reset-meters`` or
``--reset-optimizer`` start a new run from a checkpoint), so the stopping point is a function of the run alone.
"""

from __future__ import annotations

import sys
from typing import Any, Dict, Optional

#: the key of the early-stopping state in a checkpoint's ``extra_state``
STATE_KEY = "patience"


def _stopper():
    """fairseq-train's ``should_stop_early`` function (its module, or ``__main__`` for ``python -m fairseq_cli.train``),
    or None outside fairseq-train."""
    for name in ("fairseq_cli.train", "__main__"):
        module = sys.modules.get(name)
        fn = getattr(module, "should_stop_early", None)
        if callable(fn):
            return fn
    return None


def state() -> Optional[Dict[str, Any]]:
    """The early-stopping state of this fairseq-train process (``{"best", "num_runs"}``), or None before the first
    validation."""
    fn = _stopper()
    if fn is None or getattr(fn, "best", None) is None:
        return None
    return {"best": float(fn.best), "num_runs": int(getattr(fn, "num_runs", 0))}


def restore(saved: Optional[Dict[str, Any]]) -> bool:
    """Set fairseq-train's early-stopping state to ``saved`` (from :func:`state`); returns whether it did."""
    fn = _stopper()
    if fn is None or not saved:
        return False
    fn.best, fn.num_runs = saved["best"], saved["num_runs"]
    return True


def keep_patience_in_checkpoints() -> None:
    """Make fairseq's ``Trainer.save_checkpoint`` store the early-stopping state and ``Trainer.load_checkpoint``
    restore it on a resume. Idempotent."""
    try:
        from fairseq.trainer import Trainer
    except ImportError:  # pragma: no cover - the plugin needs fairseq anyway
        return
    save, load = Trainer.save_checkpoint, Trainer.load_checkpoint
    if getattr(save, "_softmax_heads_patience", False):
        return

    def save_checkpoint(self, filename, extra_state):
        current = state()
        return save(self, filename, {**extra_state, STATE_KEY: current} if current else extra_state)

    def load_checkpoint(
        self, filename, reset_optimizer=False, reset_lr_scheduler=False, optimizer_overrides=None, reset_meters=False
    ):
        extra_state = load(self, filename, reset_optimizer, reset_lr_scheduler, optimizer_overrides, reset_meters)
        if extra_state and not reset_optimizer and not reset_meters:
            restore(extra_state.get(STATE_KEY))
        return extra_state

    save_checkpoint._softmax_heads_patience = True
    save_checkpoint.__doc__, load_checkpoint.__doc__ = save.__doc__, load.__doc__
    Trainer.save_checkpoint, Trainer.load_checkpoint = save_checkpoint, load_checkpoint


keep_patience_in_checkpoints()
