"""How a mini cell trains and how a table chooses each head's learning rate.

* **The stopping rule** (:class:`StopRule`): a cell validates after every epoch and stops when its valid loss has not
  improved for ``patience`` epochs (fairseq's ``--patience``; the plugin keeps the count across a resumed run), or
  at ``max_epochs``; the best checkpoint (lowest valid loss) is the one scored.
* **The learning-rate sweep** (:func:`choose_lr`, :func:`extend_grid`): every head trains at each rate of the
  table's grid with seed 1; where the lowest best-valid-loss lies at an end of the grid, the grid grows by one more
  factor beyond it (up to ``max_rates`` rates). The rate with the lowest best valid loss is the head's: its seed-1
  cell is the head's first seed, and the other seeds train at that rate. Nothing but the valid split chooses.
* **Curves** (:func:`parse_curve`): per epoch, the updates, the training seconds so far (fairseq's per-epoch
  ``train_wall``, validation excluded), and the valid loss and NLL (base 2), from a fairseq-train json log.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

from recipes.common.runtime import choose_lr, extend_grid  # noqa: F401 (the sweep's rules, by their names here)


@dataclass(frozen=True)
class StopRule:
    """Early stopping: ``patience`` epochs without a lower valid loss, at most ``max_epochs`` epochs."""

    patience: int
    max_epochs: int

    def __post_init__(self):
        for name in ("patience", "max_epochs"):
            if getattr(self, name) < 1:
                raise ValueError(f"StopRule: {name} must be >= 1, got {getattr(self, name)}")

    def fairseq_args(self) -> List[str]:
        return ["--max-epoch", str(self.max_epochs), "--patience", str(self.patience)]

    def as_dict(self) -> Dict[str, int]:
        return {"patience": self.patience, "max_epochs": self.max_epochs}

    def describe(self) -> str:
        return (
            f"validated after every epoch. It stops when the valid loss has not improved for {self.patience} epochs "
            f"(at most {self.max_epochs} epochs); the best checkpoint is scored"
        )


def parse_curve(log_text: str) -> List[Dict[str, float]]:
    """``[{"epoch", "updates", "seconds", "loss", "nll_loss"}, ...]`` per validated epoch of a fairseq-train log
    (``--log-format json``; a resumed run's log holds every run: the last line of an epoch counts). ``seconds``:
    training seconds up to that epoch (the sum of fairseq's per-epoch ``train_wall``; None when an epoch lacks it)."""
    valid: Dict[int, Dict[str, float]] = {}
    wall: Dict[int, float] = {}
    for line in log_text.splitlines():
        if "{" not in line:
            continue
        if "| valid |" in line:
            stats = json.loads(line[line.index("{") :])
            if "valid_loss" in stats and "valid_num_updates" in stats:
                valid[int(stats["epoch"])] = {
                    "updates": int(stats["valid_num_updates"]),
                    "loss": float(stats["valid_loss"]),
                    "nll_loss": float(stats.get("valid_nll_loss", stats["valid_loss"])),
                }
        elif "| train |" in line:
            stats = json.loads(line[line.index("{") :])
            if "train_train_wall" in stats:
                wall[int(stats["epoch"])] = float(stats["train_train_wall"])
    curve, seconds = [], 0.0
    for epoch in sorted(valid):
        seconds = None if seconds is None or epoch not in wall else seconds + wall[epoch]
        curve.append({"epoch": epoch, **valid[epoch], "seconds": seconds})
    return curve


def nll(point: Mapping[str, float]) -> float:
    """A curve point's valid NLL (a point of a cell without a logged curve has its loss only: the same there)."""
    return point.get("nll_loss", point["loss"])


def label_smoothed(cells: Sequence[Mapping[str, Any]]) -> bool:
    """Whether the cells' valid loss is label-smoothed: it differs from their valid NLL (the translation tables)."""
    return any(p["loss"] != nll(p) for c in cells for p in c.get("curve") or [])


def best_point(curve: Sequence[Mapping[str, float]]) -> Optional[Dict[str, float]]:
    """The epoch of the lowest valid loss (the first, on a tie: fairseq keeps the first best), or None."""
    if not curve:
        return None
    return dict(min(curve, key=lambda p: (p["loss"], p["epoch"])))


def stopped(curve: Sequence[Mapping[str, float]], rule: StopRule) -> Optional[str]:
    """Why a cell with this ``curve`` has stopped under ``rule`` (``"patience"``, ``"max_epochs"``), or None while
    it would go on."""
    if not curve:
        return None
    last, best = curve[-1]["epoch"], best_point(curve)["epoch"]
    if last - best >= rule.patience:
        return "patience"
    if last >= rule.max_epochs:
        return "max_epochs"
    return None


def rate_key(lr: float) -> str:
    """A learning rate as written in cell names and tables (``0.005``, ``1e-05``)."""
    return f"{lr:g}"


def grid(center: float, factor: float, size: int = 3) -> List[float]:
    """``size`` rates around ``center``, ``factor`` apart (``[center / factor, center, center * factor]``)."""
    half = (size - 1) / 2
    return [float(f"{center * factor ** (i - half):.6g}") for i in range(size)]


def within(
    curve: Sequence[Mapping[str, float]],
    key: str,
    budget: float,
    metric: Callable[[Mapping[str, float]], float] = lambda p: p["loss"],
) -> Optional[float]:
    """The lowest valid ``metric`` of a point (by default the loss the cell trains on; :func:`nll`, without label
    smoothing) a cell had reached within ``budget`` of ``key`` (``"seconds"`` of training or ``"updates"``), or None
    when its first validation came later (or it logged no times)."""
    seen = [metric(p) for p in curve if p.get(key) is not None and p[key] <= budget + 1e-9]
    return min(seen) if seen else None
