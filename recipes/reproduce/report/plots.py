"""The report's plots: score per head with every seed, valid loss against updates, training cost."""

from __future__ import annotations

import os
from typing import Any, Dict, List

from recipes.common.stats import format_seeds
from recipes.reproduce.analysis import compare as head_comparison
from recipes.reproduce.analysis.collect import chosen_cells
from recipes.reproduce.analysis.facts import score_rows
from recipes.reproduce.engine import sweep as sweep_rules
from recipes.reproduce.report.layout import METRIC_NAMES


def curves_to_plot(cells: List[Dict[str, Any]]) -> tuple:
    """``(points of each cell, the seconds axis' label)`` for the valid-loss plot: the seconds are the clock of the
    equal-compute table (:func:`compare.on_one_clock`): CPU seconds where every cell recorded its CPU time, else the
    logged wall-clock seconds; a cell with no logged curve gives its ``valid_curve`` by updates."""
    curves, clock = head_comparison.on_one_clock(cells)
    points = [p or [{"updates": u, "loss": loss} for u, loss in c["valid_curve"]] for c, p in zip(cells, curves)]
    label = (
        "training CPU seconds (logged seconds scaled by the cell's CPU time)"
        if clock == "cpu"
        else "training seconds (one core each, wall-clock)"
    )
    return points, label


def plots(obj: Dict[str, Any], out_dir: str) -> List[str]:
    """Score per head (every seed a dot), valid loss against updates, cost ratios; returns the file names."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []

    def save(fig, name):
        fig.tight_layout()
        fig.savefig(os.path.join(out_dir, name), dpi=110)
        plt.close(fig)
        written.append(name)

    for plot in (scores_plot, curves_plot, cost_plot):
        plot(obj, plt, save)
    return written


def scores_plot(obj: Dict[str, Any], plt, save) -> None:
    """``TABLE-scores.png``: each split's score per head, the mean a bar, every seed a dot."""
    table = obj["table"]
    rows = score_rows(obj["rows"])
    if rows:
        splits = list(dict.fromkeys(r["split"] for r in rows))
        heads = list(dict.fromkeys(r["head"] for r in rows))
        fig, axes = plt.subplots(1, len(splits), figsize=(4.5 * len(splits), 3.2), squeeze=False)
        for ax, split in zip(axes[0], splits):
            for i, head in enumerate(heads):
                r = next((r for r in rows if r["head"] == head and r["split"] == split), None)
                if r is None:
                    continue
                ax.bar(i, r["mean"], color="C0" if head == "softmax" else "C1", alpha=0.5)
                ax.plot([i] * len(r["values"]), r["values"], "k.", ms=6)
            planned = obj.get("seeds_planned") or {}
            counts = {r["head"]: len(r["values"]) for r in rows if r["split"] == split}
            ax.set_xticks(
                range(len(heads)),
                [
                    h
                    if counts.get(h, 0) >= planned.get(h, 0)
                    else f"{h} ({format_seeds(counts.get(h, 0), planned[h])})"
                    for h in heads
                ],
                rotation=30,
                ha="right",
            )
            ax.set_title(split, fontsize=9)
            ax.set_ylabel(METRIC_NAMES.get(rows[0]["metric"], rows[0]["metric"]))
            lo = min(v for r in rows if r["split"] == split for v in r["values"])
            ax.set_ylim(max(0.0, lo - 3), None)
        fig.suptitle(
            f"{table}: per head (bars: mean, dots: seeds; (n of N): seeds so far of those planned;\n"
            "the axis starts just below the lowest seed, not at 0)",
            fontsize=9,
        )
        save(fig, f"{table}-scores.png")


def curves_plot(obj: Dict[str, Any], plt, save) -> None:
    """``TABLE-valid-loss.png``: valid NLL against updates (and training seconds), every seed at its chosen rate."""
    curves = [c for c in chosen_cells(obj) if c.get("curve") or c.get("valid_curve")]
    if curves:
        timed = any(p.get("seconds") is not None for c in curves for p in c.get("curve", []))
        plotted, seconds_label = curves_to_plot(curves)
        fig, axes = plt.subplots(1, 2 if timed else 1, figsize=(11 if timed else 5.5, 3.5), squeeze=False)
        heads = list(dict.fromkeys(c["head"] for c in curves))
        for ax, x_key, x_label in [
            (axes[0][0], "updates", "updates"),
            *([(axes[0][1], "seconds", seconds_label)] if timed else []),
        ]:
            for i, head in enumerate(heads):
                for j, points in enumerate(p for c, p in zip(curves, plotted) if c["head"] == head):
                    points = [p for p in points if p.get(x_key) is not None]
                    if points:
                        ax.plot(
                            [p[x_key] for p in points],
                            [sweep_rules.nll(p) for p in points],
                            color=f"C{i}",
                            alpha=0.8,
                            label=head if j == 0 else None,
                        )
                        best = min(points, key=lambda p: p["loss"])  # the scored checkpoint
                        ax.plot([best[x_key]], [sweep_rules.nll(best)], "o", color=f"C{i}", ms=3)
            ax.set_xlabel(x_label)
            ax.set_ylabel("valid NLL (bits per token)")
            ax.legend(fontsize=8)
        fig.suptitle(
            f"{obj['table']}: validation NLL, every seed at the head's chosen rate (dots: the checkpoint "
            + ("the label-smoothed loss picks)" if sweep_rules.label_smoothed(curves) else "scored)"),
            fontsize=10,
        )
        save(fig, f"{obj['table']}-valid-loss.png")


def cost_plot(obj: Dict[str, Any], plt, save) -> None:
    """``TABLE-cost.png``: each head's training time over softmax's, per cost measure."""
    table = obj["table"]
    cost_rows = [r for r in obj["rows"] if r["metric"].startswith("time_")]
    if cost_rows:
        metrics = list(dict.fromkeys(r["metric"] for r in cost_rows))
        heads = list(dict.fromkeys(r["head"] for r in cost_rows))
        fig, ax = plt.subplots(figsize=(6.5, 3.5))
        width = 0.8 / len(heads)
        for i, head in enumerate(heads):
            vals = [next((r["mean"] for r in cost_rows if r["head"] == head and r["metric"] == m), 0) for m in metrics]
            ax.bar([k + i * width for k in range(len(metrics))], vals, width, label=head)
        ax.axhline(1.0, color="k", lw=0.8)
        ax.set_xticks(
            [k + 0.4 - width / 2 for k in range(len(metrics))],
            [METRIC_NAMES[m] for m in metrics],
            rotation=15,
            fontsize=8,
        )
        ax.set_ylabel("training time / softmax's")
        ax.set_title(f"{table}: training cost (mini model, CPU)", fontsize=10)
        ax.legend(fontsize=8)
        save(fig, f"{table}-cost.png")
