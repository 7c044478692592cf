"""The report's sections (one per table, the lm-ptb pilot, the protocol study, the compute spent), each opening with
its table and closing with its hand-written reading; what they show is computed by :mod:`recipes.reproduce.analysis`."""

from __future__ import annotations

import os
from collections import Counter
from typing import Any, Dict, List, Optional

from recipes.common.reading import wrap, written_reading
from recipes.common.stats import format_diff, format_p
from recipes.reproduce import TABLE_MODULES, get_table
from recipes.reproduce.analysis.facts import pilot_numbers, protocols_numbers, table_facts
from recipes.reproduce.engine import results as result_files
from recipes.reproduce.report import layout
from recipes.reproduce.report.layout import table
from recipes.reproduce.report.plots import plots

#: the one-line caption of each table of a section
CAPTIONS = {
    "lowercased": "BLEU lowercased (`sacrebleu -lc` on the committed hypotheses):",
    "cells": "Each head's cells at its chosen rate:",
    "misrecorded": "Cells whose recorded commands name another cell's directory:",
    "costs": "Training time as a ratio to softmax (the paper's cost columns; ours on the mini model, CPU):",
    "added": "Heads timed later, beside softmax in a run of their own (ratios to that run's softmax):",
    "sweep": "Learning rate per head (seed 1's best valid loss{}; bold: chosen on valid):",
    "comparisons": "Paired comparisons (head minus baseline, same seeds; Holm over the test rows):",
    "equal_compute": "Equal compute (valid NLL, bits; negative: the head is lower within softmax's budget):",
    "epoch_lead": "Valid NLL minus softmax's, same seed, per epoch (bits; mean, lowest to highest seed):",
}


def reading(out_dir: str, name: str, cells: int, label: str = "**Reading.** ") -> List[str]:
    text = written_reading(os.path.join(out_dir, f"{name}-reading.md"), cells)
    return [label + text, ""] if text else []


def status(obj: Dict[str, Any], full_only: bool) -> str:
    """A table's scale and state in the overview: the rows' scale, what still runs, or why there are no rows."""
    sweep = obj.get("sweep") or {}
    waiting = [h for h, s in sweep.items() if s.get("chosen") is None]
    spec = get_table(obj["table"]) if obj["table"] in TABLE_MODULES else None
    old = obj.get("cells") and not sweep and getattr(spec, "mini_lr", None)
    if not obj["rows"]:
        return (
            "full only (the plan; not run here)"
            if full_only
            else f"mini, {'learning-rate sweep running' if sweep else 'no cell finished yet'}"
        )
    scale, chosen = obj["rows"][0]["scale"], ", ".join(h for h in sweep if h not in waiting)
    if waiting:
        return f"{scale}, running: rates chosen for {chosen}; sweeping {', '.join(waiting)}"
    planned, have = obj.get("seeds_planned") or {}, Counter()
    for r in obj["rows"]:  # each head's most seeds over its rows (the cost columns' rows have none)
        have[r["head"]] = max(have[r["head"]], len(r["seeds"]))
    left = sum(max(0, n - have[h]) for h, n in planned.items())
    state = f"{scale}, running: {left} of the {sum(planned.values())} planned seed cells to train" if left else scale
    return state + (", previous protocol (fixed updates, one rate)" if old else "")


def table_section(obj: Dict[str, Any], out_dir: str, f: Optional[Dict[str, Any]] = None) -> str:
    """One table's section: its scores first (or, with none, its sweep or the paper's numbers beside the full-size
    plan), each head's cells, the setup, the costs, the sweep, the paired comparisons, equal compute, the lead per
    epoch, the reading, the plots, the full-size plan and the commands."""
    f = f or table_facts(obj)
    rows, spec, plan, sweep, name = obj["rows"], f["spec"], obj.get("plan") or {}, obj.get("sweep") or {}, obj["table"]
    paper_first = f["full_only"] and plan.get("paper")
    lines = [f"## {name}: {obj['description']}", "", *(layout.paper_plan_table(plan) if paper_first else [])]
    if not (f["full_only"] or (sweep and not rows)):  # a running sweep: its table first
        lines.append(
            layout.score_table(
                rows, getattr(spec, "paper_source", None), getattr(spec, "paper", None), obj.get("seeds_planned")
            )
        )
    rerun = [[h, s, f"`python -m recipes.reproduce {name} --heads {h}`"] for h, s in f["misrecorded"]]
    added = [[h, f"`{a['command']}`"] for h, a in ((obj.get("costs") or {}).get("added") or {}).items()]
    notes = obj.get("notes", getattr(spec, "report_notes", ""))
    boot = obj.get("bootstrap") if f["metric"] == "bleu" else None
    tables = [
        ("lowercased", layout.lowercased_table(f["lowercased"])),
        ("cells", layout.cells_table(f["heads"])),
        ("misrecorded", table(["head", "seed", "rerun with"], rerun)),
        ("setup", wrap("**Setup.** " + notes) + "\n" if notes else ""),
        ("costs", layout.cost_table(rows)),
        ("added", table(["head", "command"], added)),
        ("sweep", layout.sweep_table(f["cells"], sweep)),
        ("comparisons", layout.family_table(f["comparisons"], f["metric"], boot, f["claims"] or None)),
        ("equal_compute", layout.equal_compute_table(f["equal_compute"])),
        ("epoch_lead", layout.epoch_lead_table(f["epoch_lead"])),
    ]
    smoothed = ", label-smoothed, then that checkpoint's NLL" if f["smoothed"] else ""
    for key, body in tables:
        lines += ([CAPTIONS[key].format(smoothed), ""] if key in CAPTIONS else []) + [body] if body else []
    lines += reading(out_dir, name, len(f["cells"]))
    lines += [line for png in plots(obj, out_dir) for line in (f"![{png}](reproduction/{png})", "")]
    if plan:
        lines += [
            f"**Full size** (`python -m recipes.reproduce {name} --scale full --dry-run`; GPUs, not run here):",
            "",
        ]
        params = [[h, f"{n / 1e6:.1f}M"] for h, n in plan["parameters"].items()]
        lines += [] if paper_first else [table(["head", "parameters (full size)"], params)]
        lines += ([wrap(plan["note"]), ""] if plan.get("note") else []) + layout.plan_block(plan["commands"])
    return "\n".join(lines + (layout.first_commands(rows) if rows else []))


def pilot_section(records_dir: str, readings_dir: str) -> str:
    """The lm-ptb pilot (``lm-ptb-pilot.json``, :mod:`recipes.reproduce.pilots.lm_pilot`): each arm's valid / test
    perplexity, per epoch and its CPU time; the pilot's CPU time; the probes' epoch costs; the decision; or ""."""
    pilot = result_files.load_json(os.path.join(records_dir, "lm-ptb-pilot.json"))
    if not pilot or not pilot.get("arms"):
        return ""
    n = pilot_numbers(pilot)

    def arm(a, r):
        curve = ", ".join(f"{p:.1f}" for p in n["arms"][a]["valid_ppl_per_epoch"])
        ppl = [f"{r['ppl'][split]:.2f}" for split in ("valid", "test")]
        return [
            a,
            f"{r['lr']:g}",
            r["epochs"],
            r.get("averaging_from_epoch") or "-",
            curve,
            *ppl,
            f"{n['arms'][a]['cpu_hours']:.2f}",
        ]

    header = ["arm", "lr", "epochs", "averaging from epoch", "valid ppl per epoch", "valid ppl", "test ppl", "CPU h"]
    lines = [
        "### lm-ptb pilot: the optimiser and the cost of an epoch",
        "",
        table(header, [arm(a, r) for a, r in pilot["arms"].items()]),
    ]
    lines.append(
        table([f"CPU-core-hours, {k}" for k in n["cpu_hours"]], [[f"{h:.2f}" for h in n["cpu_hours"].values()]])
    )
    probes = [[h, f"{m:.1f}"] for h, m in n["epoch_minutes"].items()]
    lines.append(table(["head", "minutes an epoch of PTB train (probe, one thread)"], probes))
    lines += [wrap("**Decision.** " + pilot["decision"]), ""] if pilot.get("decision") else []
    return "\n".join(lines + reading(readings_dir, "lm-ptb-pilot", len(pilot["arms"])))


def protocols_section(obj: Dict[str, Any], out_dir: str = "") -> str:
    """The papers' training protocol against fairseq's blocks (``python -m recipes.reproduce.pilots.protocols``): the
    perplexity of every (trained on, scored) pair, and the paired per-seed differences."""
    from recipes.reproduce.pilots import protocols

    def row(d):
        ci = f"{format_diff(d['mean'])} [{format_diff(d['low'])}, {format_diff(d['high'])}]"
        p = (format_p(d["p"]), format_p(d["holm"])) if "holm" in d else ("-", "(valid: described)")
        return [d["comparison"], d["split"], d["n"], ci, *p, ", ".join(f"{x:+.2f}" for x in d["per_seed"])]

    title = f"### {obj['table']}: the papers' protocol (streams, carried state) against fairseq's blocks"
    lines = [
        title + (f", trained on {obj['data']}" if obj.get("data") else ""),
        "",
        *protocols.summary(obj["cells"]),
        "",
    ]
    header = [
        "comparison",
        "split",
        "seeds",
        "mean difference (perplexity) [95% CI]",
        "paired t p",
        "Holm p (test)",
        "per seed",
    ]
    lines += [table(header, [row(d) for d in protocols_numbers(obj)]), wrap("**Setup.** " + obj["description"]), ""]
    return "\n".join(lines + (reading(out_dir, f"{obj['table']}-protocols", len(obj["cells"])) if out_dir else []))


def compute_section(n: Dict[str, Any], out_dir: str, cells: int) -> str:
    """Markdown: the compute tables of :func:`compute_numbers` and the compute reading; "" before any of it ran."""
    e, s, lines = n["earlier"], n["train_splits"], ["## Compute", ""]
    if e:
        header = ["table", "cells at other rates (sweep)", "cells at the chosen rates"]
        header += ["CPU-core-hours: sweep / chosen / total", "of which wall-clock bounds"]
        rows = [[t, v["cells"] - v["chosen_cells"], v["chosen_cells"], *_hours(v)] for t, v in n["tables"].items()]
        rows += [[f"{a['table']}, set aside: {a['reason']}", a["cells"], "-", *_hours(a)] for a in e["aside"]]
        rows += [
            ["the tables' own cells", "-", "-", *_hours({"total": e["kept"]})],
            ["all, with the cells set aside", "-", "-", *_hours(e)],
        ]
        lines.append(table(header, rows))
    if s:
        rows = [[p["name"], p["cells"], f"{p['hours']:.1f}"] for p in s["parts"]]
        estimated = "seed cells still to train (estimated: its head's mean cell so far)"
        rows += [[f"{t}, {estimated}", v["cells"], f"~{v['hours']:.1f}"] for t, v in s["left"].items()]
        rows += [[f"{t}: not started", 0, "0.0"] for t in n["not_started"]] + [["all", "-", f"{s['total']:.1f}"]]
        rows += [["all, with the seed cells still to train", "-", f"~{s['projected']:.1f}"]] if s["left"] else []
        lines += ["### The perplexity tables on the train splits", "", table(["part", "cells", "CPU-core-hours"], rows)]
    return "\n".join(lines + reading(out_dir, "compute", cells)) if e or s else ""


def _hours(v: Dict[str, Any]) -> List[str]:
    """``sweep / chosen / total`` and the wall-clock bound of a row of the first compute table (``-`` where none)."""
    split = " / ".join("-" if v.get(k) is None else f"{v[k]:.1f}" for k in ("sweep", "chosen", "total"))
    return [split, "-" if v.get("wall") is None else f"{v['wall']:.1f}"]
