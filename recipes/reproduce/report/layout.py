"""The report's markdown tables: scores (mean ± std over seeds beside the paper's), costs, each head's cells, the
full-size plan and the commands, the paired comparisons, equal compute, the lead per epoch and the sweep."""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from recipes.common import stats
from recipes.common.reading import markdown_table
from recipes.common.stats import ALPHA, format_seeds
from recipes.reproduce.analysis.compare import Comparison, is_test
from recipes.reproduce.analysis.facts import score_rows
from recipes.reproduce.engine import sweep as sweep_rules
from recipes.reproduce.engine.sweep import rate_key

METRIC_NAMES = {
    "bleu": "BLEU",
    "ppl": "perplexity",
    "time_out_layer_same_bsz": "out layer, same batch",
    "time_all_layers_same_bsz": "all layers, same batch",
    "time_out_layer_same_mem": "out layer, same memory",
    "time_all_layers_same_mem": "all layers, same memory",
}
MAX_PLAN_LINES = 12  # full-size commands shown in the report (all of them are in the json)


def table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A markdown table ("" without rows)."""
    return "\n".join(markdown_table("| " + " | ".join(header) + " |", rows)) if rows else ""


def mean_std(mean: Optional[float], std: Optional[float], digits: int = 2) -> str:
    if mean is None:
        return "-"
    return f"{mean:.{digits}f}" + (f" ± {std:.{digits}f}" if std is not None else "")


def score_table(
    rows: List[Dict[str, Any]],
    sources: Optional[Dict[str, str]] = None,
    paper: Optional[Dict[str, Dict[str, float]]] = None,
    planned: Optional[Dict[str, int]] = None,
) -> str:
    """One line per head, one column per split (mean ± std, n seeds), the paper's number: with ``sources`` (head ->
    paper, ``"*"`` for the others) and the table's ``paper`` numbers, each row's from its paper, named; with
    ``planned`` (``{head: seeds}`` fixed before the runs), a row short of its seeds says ``n of N``."""
    rows = score_rows(rows)
    if not rows:
        return "_no finished cells yet_\n"
    splits = list(dict.fromkeys(r["split"] for r in rows))
    heads = list(dict.fromkeys(r["head"] for r in rows))
    metric = METRIC_NAMES.get(rows[0]["metric"], rows[0]["metric"])
    by_head = {h: {r["split"]: r for r in rows if r["head"] == h} for h in heads}
    labels = {}
    if sources and paper is not None:
        numbers = {h: [paper.get(s, {}).get(h) for s in splits] for h in heads}
        papers = {h: ["-" if v is None else f"{v:.2f}" for v in numbers[h]] for h in heads}
        labels = {h: sources.get(h, sources.get("*")) for h in heads if any(v is not None for v in numbers[h])}
    else:
        papers = {
            h: ["-" if by.get(s, {}).get("paper") is None else f"{by[s]['paper']:.1f}" for s in splits]
            for h, by in by_head.items()
        }
    per_split = any(len(set(p)) > 1 for p in papers.values())  # else one number (e.g. newstest2014 for both)
    header = ["head", *(f"{metric} {s}" for s in splits), "seeds"]
    header.append("paper (full scale" + (f"; {' / '.join(splits)}" if per_split else "") + ")")
    out = []
    for head, by_split in by_head.items():
        cells = [mean_std(by_split[s]["mean"], by_split[s]["std"]) if s in by_split else "-" for s in splits]
        number = (" / ".join(papers[head]) if per_split else papers[head][0]) + (
            f" ({labels[head]})" if labels.get(head) else ""
        )
        seeds = format_seeds(len(next(iter(by_split.values()))["values"]), (planned or {}).get(head))
        out.append([head, *cells, seeds, number])
    return table(header, out)


def cost_table(rows: List[Dict[str, Any]]) -> str:
    rows = [r for r in rows if r["metric"].startswith("time_")]
    metrics = list(dict.fromkeys(r["metric"] for r in rows))
    by = {(r["head"], r["metric"]): r for r in rows}

    def cell(r):
        return "-" if r is None else f"{r['mean']:.2f}x / " + ("-" if r["paper"] is None else f"{r['paper']:.2f}x")

    heads = dict.fromkeys(r["head"] for r in rows)
    return table(
        ["head", *(f"{METRIC_NAMES[m]} (ours / paper)" for m in metrics)],
        [[h, *(cell(by.get((h, m))) for m in metrics)] for h in heads],
    )


def cells_table(heads: Dict[str, Dict[str, Any]]) -> str:
    """Each head's cells at its chosen rate (:func:`recipes.reproduce.report.sections.head_facts`); a column that no
    head has is left out."""

    def minutes(f, key):
        m = f[key]
        return (
            "-" if m is None else f"{m['mean']:.1f}" + (f" ({m['n']} of {f['cells']})" if m["n"] < f["cells"] else "")
        )

    columns = {
        "cells": lambda f: f["cells"] if f["scored"] == f["cells"] else f"{f['cells']} ({f['scored']} scored)",
        "models": lambda f: ", ".join(f["models"]) or "-",
        "lr": lambda f: "-" if f["lr"] is None else rate_key(f["lr"]),
        "parameters": lambda f: "-" if f["parameters"] is None else f"{f['parameters'] / 1e6:.2f}M",
        "stopped by": lambda f: ", ".join(f"{k} {n}" for k, n in f["stopped"].items()) or "-",
        "best epoch per seed": lambda f: ", ".join(str(e) for e in f["best_epochs"]) or "-",
        "wall-clock minutes a cell (mean)": lambda f: minutes(f, "wall_minutes"),
        "CPU minutes a cell (mean)": lambda f: minutes(f, "cpu_minutes"),
    }
    cols = {name: [get(f) for f in heads.values()] for name, get in columns.items()}
    cols = {name: c for name, c in cols.items() if any(v != "-" for v in c)}
    return table(["head", *cols], [[h, *(c[i] for c in cols.values())] for i, h in enumerate(heads)])


def lowercased_table(lowercased: Dict[str, Dict[str, Dict[str, Any]]]) -> str:
    """Each head's case-insensitive BLEU per test set (``sacrebleu -lc``; mean ± std over its seeds)."""
    sets = list(dict.fromkeys(t for by_set in lowercased.values() for t in by_set))
    rows = [
        [h, *(mean_std(by[t]["mean"], by[t]["std"]) if t in by else "-" for t in sets), by[sets[0]]["n"]]
        for h, by in lowercased.items()
    ]
    return table(["head", *(f"BLEU lowercased {t}" for t in sets), "seeds"], rows)


def paper_plan_table(plan: Dict[str, Any]) -> List[str]:
    """The paper's numbers beside each head's full-size parameters (for a table with no rows of ours)."""
    paper = plan.get("paper") or {}
    splits = sorted({split for by_split in paper.values() for split in by_split})
    rows = [
        [h, f"{n / 1e6:.1f}M", *(paper.get(h, {}).get(s, "-") for s in splits)] for h, n in plan["parameters"].items()
    ]
    return table(["head", "parameters (ours)", *(f"paper {s}" for s in splits)], rows).splitlines() + [""]


def plan_block(commands: List[str]) -> List[str]:
    """The full-size plan's first :data:`MAX_PLAN_LINES` commands as a code block."""
    more = ["# ... (every command in the json)"] if len(commands) > MAX_PLAN_LINES else []
    return ["```", *commands[:MAX_PLAN_LINES], *more, "```", ""]


def first_commands(rows: List[Dict[str, Any]]) -> List[str]:
    """The first seed's command of each head (one per model where a cell trains several) as a code block."""
    commands = dict.fromkeys(r["command"] for r in score_rows(rows))
    return ["Commands (first seed of each head; every seed in the json):", "", "```", *commands, "```", ""]


def metric_unit(metric: str) -> str:
    """How the report names a table's score in its headers: BLEU or perplexity."""
    return "BLEU" if metric == "bleu" else "perplexity"


def family_table(
    comparisons: Sequence[Comparison],
    metric: str,
    boot: Optional[Sequence[Mapping[str, Any]]] = None,
    claims: Optional[Mapping[Tuple[str, str, str], float]] = None,
) -> str:
    """Markdown: one line per comparison (mean difference, 95% interval, paired t p, Holm p over the test
    comparisons, sign test; the difference detectable with 80% power; ``claims``: the paper's difference for
    ``(head, baseline, split)`` where it claims one; for BLEU the seeds where sacrebleu's paired bootstrap finds
    p < 0.05 for and against the head). Valid rows are descriptive: their difference and interval, no p-value."""
    if not comparisons:
        return ""
    unit = metric_unit(metric)
    claimed = claims is not None
    header = (
        f"| comparison | split | seeds | mean difference ({unit}) [95% CI] | paired t p | Holm p (test) | "
        f"sign test p (not adjusted) | detectable (80% power) |"
        + (" paper's difference |" if claimed else "")
        + (" bootstrap p < 0.05 (seeds: head better / worse) |" if boot is not None else "")
    )
    lines = [
        header,
        "|---|---|---|---|---|---|---|---|" + ("---|" if claimed else "") + ("---|" if boot is not None else ""),
    ]
    for c in comparisons:
        r = c.result
        ci = "-" if r.low is None else f"[{stats.format_diff(r.low)}, {stats.format_diff(r.high)}]"
        test = is_test(c.split)
        p, holm, sign = (
            (stats.format_p(r.p), stats.format_p(c.holm), stats.format_p(r.p_sign))
            if test
            else ("-", "(valid: described)", "-")
        )
        row = (
            f"| {c.head} - {c.baseline} | {c.split} | {seeds_of(c)} | {stats.format_diff(r.mean)} {ci} | "
            f"{p} | {holm} | {sign} | "
            + (f"±{stats.format_diff(c.detectable, sign=False)} |" if c.detectable is not None else "- |")
        )
        if claimed:
            claim = claims.get((c.head, c.baseline, c.split))
            row += f" {claim:+.2f} |" if claim is not None else " - |"
        if boot is not None:
            mine = [b for b in boot if b["head"] == c.head and b["baseline"] == c.baseline and b["split"] == c.split]
            better = sum(b["p"] < ALPHA and b["delta"] > 0 for b in mine)
            worse = sum(b["p"] < ALPHA and b["delta"] < 0 for b in mine)
            row += f" {better} / {worse} of {len(mine)} |" if mine else " - |"
        lines.append(row)
    return "\n".join(lines) + "\n"


def seeds_of(c: Comparison) -> str:
    """A comparison's seeds as the report prints them: ``"2"``, or ``"2 of 5"`` while planned seeds are to come."""
    return stats.format_seeds(c.result.n, c.planned)


def epoch_lead_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """:func:`epoch_lead` as markdown: a row per head, a column per epoch, each ``mean (lowest to highest seed)``."""
    epochs = sorted({e for r in rows for e in r["epochs"]})
    if not epochs:
        return ""

    def cell(diffs):
        if diffs is None:
            return "-"
        mean = sum(diffs) / len(diffs)
        return f"{mean:+.3f}" + (f" ({min(diffs):+.3f} to {max(diffs):+.3f})" if len(diffs) > 1 else "")

    lines = [
        "| head | seeds | " + " | ".join(f"epoch {e}" for e in epochs) + " |",
        "|---|---|" + "---|" * len(epochs),
    ]
    for r in rows:
        lines.append(
            f"| {r['head']} | {len(r['seeds'])} | " + " | ".join(cell(r["epochs"].get(e)) for e in epochs) + " |"
        )
    return "\n".join(lines) + "\n"


def equal_compute_table(rows: Sequence[Mapping[str, Any]]) -> str:
    if not rows:
        return ""

    def cell(part):
        d = part["diff"]
        text = (
            "-" if d is None else (f"{d.mean:+.3f}" + (f" [{d.low:+.3f}, {d.high:+.3f}]" if d.low is not None else ""))
        )
        return text + (f" ({part['missing']} seed(s) not validated yet)" if part["missing"] else "")

    costed = any("cost" in r for r in rows)
    seconds = "CPU seconds" if rows[0].get("clock") == "cpu" else "seconds"
    lines = [
        "| head | seeds | within softmax's updates (mean) | head's lowest NLL - softmax's (bits) [95% CI] | "
        f"within softmax's training {seconds} (mean) | head's lowest NLL - softmax's (bits) [95% CI] | "
        + (
            "within softmax's updates / the head's cost per update | head's lowest NLL - softmax's [95% CI] | "
            if costed
            else ""
        )
        + f"head's {seconds} to its own best |",
        "|---|---|---|---|---|---|" + ("---|---|" if costed else "") + "---|",
    ]
    for r in rows:
        u, s = r["updates"], r["seconds"]
        own = "-" if r["head_seconds_to_best"] is None else f"{r['head_seconds_to_best']:.0f}"
        c = r.get("cost")
        cost = (
            (
                f"{(c['softmax'] or 0) / c['ratio']:.0f} ({c['ratio']:.2f}x a softmax update) | {cell(c)} | "
                if c
                else "- | - | "
            )
            if costed
            else ""
        )
        lines.append(
            f"| {r['head']} | {r['seeds']} | {u['softmax'] or 0:.0f} | {cell(u)} | "
            f"{s['softmax'] or 0:.0f} | {cell(s)} | {cost}{own} |"
        )
    return "\n".join(lines) + "\n"


def _loss_and_nll(point: Mapping[str, float]) -> str:
    """``3.521`` or, where the loss is label-smoothed (it differs from the NLL), ``3.521, NLL 2.339``."""
    nll = sweep_rules.nll(point)
    return f"{point['loss']:.3f}" + (f", NLL {nll:.3f}" if nll != point["loss"] else "")


def sweep_table(cells: Sequence[Mapping[str, Any]], sweep: Mapping[str, Mapping[str, Any]]) -> str:
    """Markdown: per head, the best valid loss (and its epoch; and that checkpoint's NLL where the loss is
    label-smoothed) of seed 1 at every rate tried, the chosen rate, and
    whether it is an end of the grid (a rate beyond it was not tried: the grid's cap) or another table's choice
    (``--lr-from``: no sweep here); a head whose sweep is still running (chosen None) says so."""
    if not sweep:
        return ""
    rates = sorted({lr for s in sweep.values() for lr in s["rates"]})
    by = {(c["head"], c.get("lr")): c for c in cells if c["seed"] == 1 and c.get("best")}
    lines = [
        "| head | " + " | ".join(f"lr {sweep_rules.rate_key(lr)}" for lr in rates) + " | chosen |",
        "|---|" + "---|" * (len(rates) + 1),
    ]
    for head, s in sweep.items():
        cols = []
        for lr in rates:
            c = by.get((head, lr))
            text = "-" if c is None else f"{_loss_and_nll(c['best'])} (ep {c['best']['epoch']}, {c.get('stopped', '')})"
            cols.append(f"**{text}**" if lr == s["chosen"] and c is not None else text)
        if s["chosen"] is None:
            lines.append(f"| {head} | " + " | ".join(cols) + " | not yet (sweep running) |")
            continue
        edge = (
            f" ({s['from']}'s choice, not swept here)"
            if s.get("from")
            else " (an end of the grid)"
            if s["chosen"] in (min(s["rates"]), max(s["rates"]))
            else ""
        )
        lines.append(f"| {head} | " + " | ".join(cols) + f" | {sweep_rules.rate_key(s['chosen'])}{edge} |")
    return "\n".join(lines) + "\n"
