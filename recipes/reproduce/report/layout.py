"""The report's markdown tables: scores (mean +- std over seeds beside the paper's) and the cost columns."""

from __future__ import annotations

from typing import Any, Dict, List, Optional

from recipes.common.stats import format_seeds


METRIC_NAMES = {
    "bleu": "BLEU",
    "ppl": "perplexity",
    "time_out_layer_same_bsz": "out layer, same batch",
    "time_all_layers_same_bsz": "all layers, same batch",
    "time_out_layer_same_mem": "out layer, same memory",
    "time_all_layers_same_mem": "all layers, same memory",
}


SCORES = ("bleu", "ppl")


MAX_PLAN_LINES = 12  # full-size commands shown in the report (all of them are in the json)


def mean_std(mean: Optional[float], std: Optional[float], digits: int = 2) -> str:
    if mean is None:
        return "-"
    return f"{mean:.{digits}f}" + (f" ± {std:.{digits}f}" if std is not None else "")


def score_rows(rows: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    return [r for r in rows if r["metric"] in SCORES]


def score_table(
    rows: List[Dict[str, Any]],
    sources: Optional[Dict[str, str]] = None,
    paper: Optional[Dict[str, Dict[str, float]]] = None,
    planned: Optional[Dict[str, int]] = None,
) -> str:
    """Markdown table: one line per head, one column per split (mean ± std, n seeds), the paper's number. With
    ``sources`` (head -> paper, ``"*"`` for the others) and the table's ``paper`` numbers: each row's from its paper,
    named. With ``planned`` (``{head: seeds}`` fixed before the runs), a row short of its seeds says ``n of N``."""
    rows = score_rows(rows)
    if not rows:
        return "_no finished cells yet_\n"
    splits = list(dict.fromkeys(r["split"] for r in rows))
    heads = list(dict.fromkeys(r["head"] for r in rows))
    metric = METRIC_NAMES.get(rows[0]["metric"], rows[0]["metric"])
    by_head = {h: {r["split"]: r for r in rows if r["head"] == h} for h in heads}
    if sources and paper is not None:
        numbers = {h: [paper.get(s, {}).get(h) for s in splits] for h in heads}
        papers = {h: ["-" if v is None else f"{v:.2f}" for v in numbers[h]] for h in heads}
        labels = {
            h: sources.get(h, sources.get("*")) if any(v is not None for v in numbers[h]) else None for h in heads
        }
    else:
        papers = {
            h: ["-" if by.get(s, {}).get("paper") is None else f"{by[s]['paper']:.1f}" for s in splits]
            for h, by in by_head.items()
        }
        labels = {}
    per_split = any(len(set(p)) > 1 for p in papers.values())  # else one number (e.g. newstest2014 for both)
    lines = [
        "| head | "
        + " | ".join(f"{metric} {s}" for s in splits)
        + " | seeds | paper (full scale"
        + (f"; {' / '.join(splits)}" if per_split else "")
        + ") |",
        "|---|" + "---|" * (len(splits) + 2),
    ]
    for head, by_split in by_head.items():
        any_row = next(iter(by_split.values()))
        cells = [mean_std(by_split[s]["mean"], by_split[s]["std"]) if s in by_split else "-" for s in splits]
        paper = " / ".join(papers[head]) if per_split else papers[head][0]
        paper += f" ({labels[head]})" if labels.get(head) else ""
        seeds = format_seeds(len(any_row["values"]), (planned or {}).get(head))
        lines.append(f"| {head} | " + " | ".join(cells) + f" | {seeds} | {paper} |")
    return "\n".join(lines) + "\n"


def cost_table(rows: List[Dict[str, Any]]) -> str:
    rows = [r for r in rows if r["metric"].startswith("time_")]
    if not rows:
        return ""
    metrics = list(dict.fromkeys(r["metric"] for r in rows))
    heads = list(dict.fromkeys(r["head"] for r in rows))
    lines = [
        "| head | " + " | ".join(f"{METRIC_NAMES[m]} (ours / paper)" for m in metrics) + " |",
        "|---|" + "---|" * len(metrics),
    ]
    for head in heads:
        by = {r["metric"]: r for r in rows if r["head"] == head}
        cells = []
        for m in metrics:
            r = by.get(m)
            cells.append(
                "-" if r is None else f"{r['mean']:.2f}x / " + ("-" if r["paper"] is None else f"{r['paper']:.2f}x")
            )
        lines.append(f"| {head} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def paper_plan_table(plan: Dict[str, Any]) -> List[str]:
    """The paper's numbers beside each head's full-size parameters (for a table with no rows of ours)."""
    paper = plan.get("paper") or {}
    splits = sorted({split for by_split in paper.values() for split in by_split})
    lines = [
        "| head | parameters (ours) | " + " | ".join(f"paper {s}" for s in splits) + " |",
        "|---|---|" + "---|" * len(splits),
    ]
    lines += [
        f"| {h} | {n / 1e6:.1f}M | " + " | ".join(str(paper.get(h, {}).get(s, "-")) for s in splits) + " |"
        for h, n in plan["parameters"].items()
    ]
    return lines + [""]


def plan_block(commands: List[str]) -> List[str]:
    """The full-size plan's first :data:`MAX_PLAN_LINES` commands as a code block."""
    more = ["# ... (every command in the json)"] if len(commands) > MAX_PLAN_LINES else []
    return ["```", *commands[:MAX_PLAN_LINES], *more, "```", ""]


def first_commands(rows: List[Dict[str, Any]]) -> List[str]:
    """The first seed's command of each head (one per model where a cell trains several) as a code block."""
    lines = ["Commands (first seed of each head; every seed in the json):", "", "```"]
    seen = set()
    for r in score_rows(rows):
        if r["command"] not in seen:
            seen.add(r["command"])
            lines.append(r["command"])
    return lines + ["```", ""]
