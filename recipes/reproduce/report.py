"""The reproduction report: ``docs/reproduction.md`` from the committed ``docs/reproduction/*.json``.

    python -m recipes.reproduce.report                       # collect results/reproduce/*, then write the report
    python -m recipes.reproduce.report --no-collect          # rebuild the report from the committed json only

``--collect`` copies each table's results (``OUT/TABLE/results.json``, its finished cells without the
hypotheses, ``costs.json``) into ``docs/reproduction/TABLE.json``; the report is then generated from those files
alone, so it can be rebuilt on any machine. For each table: our numbers (mean +- std over seeds, the seeds, the
scale) beside the paper's, the cost columns, plots (score per head with every seed, valid loss against updates,
training cost), and a paragraph of what the numbers show, saying where two heads differ by less than the seed
spread.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
from collections import Counter
from typing import Any, Dict, List, Optional

from recipes.reproduce import TABLE_MODULES, get_table
from recipes.reproduce import compare as C
from recipes.reproduce.engine import results as R
from recipes.reproduce.engine import sweep as S
from recipes.reproduce.engine.costs import GRID
from recipes.reproduce.engine.runner import canonical_paths, cpu_seconds, parse_train_wall
from recipes.common.stats import paired

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DOCS = os.path.join(ROOT, "docs")
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


def collect(results_dir: str, docs_dir: str) -> List[str]:
    """Copy every table's results under ``results_dir`` into ``docs_dir/reproduction/TABLE.json`` (commands with
    :func:`canonical_paths`; each cell's training time read again from its train.log when it is there)."""
    written = []
    for table in TABLE_MODULES:
        table_dir = os.path.join(results_dir, table)
        path = os.path.join(table_dir, "results.json")
        plan_path = os.path.join(table_dir, "plan.json")
        out = os.path.join(docs_dir, "reproduction", f"{table}.json")
        sweep_here = R.load_json(os.path.join(table_dir, "sweep.json"))  # written after every cell of a sweep
        if not os.path.isfile(path) and not os.path.isfile(plan_path) and not sweep_here:
            continue
        before = json.load(open(out)) if os.path.isfile(out) else {}
        costs_path = os.path.join(table_dir, "costs.json")
        sweep = sweep_here or before.get("sweep")
        # the committed cost columns stand only for the model they timed: not across a change of mini protocol
        kept = before.get("costs") if bool(before.get("sweep")) == bool(sweep) else None
        costs = json.load(open(costs_path)) if os.path.isfile(costs_path) else kept
        cells = list(R.cells(table_dir)) or before.get("cells", [])  # whole records: a new machine resumes from them
        for c in cells:
            c["commands"] = [canonical_paths(line, table) for line in c["commands"]]
            log = os.path.join(R.cell_dir(table_dir, c["head"], c["seed"], c.get("lr")), "train.log")
            if os.path.isfile(log):  # read again: a record written before a resumed run's every process counted
                with open(log) as f:
                    text = f.read()
                c["train_wall_s"], c["cpu_s"] = parse_train_wall(text), cpu_seconds(log, text)
        # a sweep still running has no rows yet: the committed rows of an earlier protocol do not stand beside it
        rows = R.load_rows(path) if os.path.isfile(path) else ([] if sweep_here else before.get("rows", []))
        for r in rows:
            r["command"] = canonical_paths(r["command"], table)
        plan = json.load(open(plan_path)) if os.path.isfile(plan_path) else before.get("plan")
        if plan:
            plan["commands"] = [canonical_paths(line, table) for line in plan["commands"]]
        # rows kept from the committed json keep the notes that describe how they ran (a full-size plan alone
        # rewrites only the plan)
        notes = (
            getattr(get_table(table), "report_notes", "") if os.path.isfile(path) or sweep_here else before.get("notes")
        )
        obj = {
            "table": table,
            "description": get_table(table).description,
            **({"notes": notes} if notes is not None else {}),
            "rows": rows,
            "cells": cells,
            "costs": costs,
            "plan": plan,
            **({"sweep": sweep} if sweep else {}),
        }
        if sweep and get_table(table).metric == "bleu":
            committed = commit_hypotheses(table_dir, obj, docs_dir)
            for key in ("bootstrap", "lowercased"):
                obj[key] = committed.get(key) or before.get(key)
        R.save_json(out, obj)
        written.append(out)
    return written


def commit_hypotheses(table_dir: str, obj: Dict[str, Any], docs_dir: str) -> Dict[str, Any]:
    """Copy the hypotheses of a translation table's chosen cells to ``docs/reproduction/hyps/TABLE/`` (one file per
    head, seed and test set: ``HEAD-seedK.TESTSET.hyp``) and score them against the run's references:
    ``{"bootstrap": sacrebleu's paired bootstrap records, "lowercased": {head: {testset: {"seeds", "values"}}}}``
    (case-insensitive BLEU, as published Multi30k systems are scored); {} when the run's files are not here. The
    seed-1 cells of a head whose sweep is still running are kept too, under their cell's name
    (``HEAD-lrRATE-seed1.TESTSET.hyp``, :func:`results.cell_name`), until the rate is chosen: the chosen one then
    becomes ``HEAD-seed1`` even when its machine is gone (:func:`results.restore_hypotheses` brings them back)."""
    import shutil

    from recipes.reproduce.data import prepare as D
    from recipes.reproduce.tables.translation import corpus_bleu

    table = get_table(obj["table"])
    testsets = list(D.MULTI30K_TESTS)
    refs_dir = os.path.join(table_dir, "data", "raw")
    if not os.path.isdir(refs_dir):
        return {}
    sweep = obj.get("sweep") or {}
    running = [c for c in obj.get("cells", []) if c["head"] in sweep and sweep[c["head"]]["chosen"] is None]
    out_dir = os.path.join(docs_dir, "reproduction", "hyps", obj["table"])
    os.makedirs(out_dir, exist_ok=True)
    for c in running:
        for testset, path in C.hyp_files(table_dir, [c], testsets).get(c["head"], {}).get(c["seed"], {}).items():
            shutil.copyfile(path, os.path.join(out_dir, f"{R.cell_name(c['head'], c['seed'], c['lr'])}.{testset}.hyp"))
    for head, entry in sweep.items():  # a chosen head's sweep files are no longer needed
        if entry["chosen"] is not None:
            for path in glob.glob(os.path.join(out_dir, glob.escape(f"{head}-lr") + "*")):
                os.remove(path)
    cells = chosen_cells(obj)
    files = C.hyp_files(table_dir, cells, testsets)
    hyps: Dict[str, Dict[int, Dict[str, List[str]]]] = {}
    for head, by_seed in files.items():
        for seed, by_set in by_seed.items():
            for testset, path in by_set.items():
                shutil.copyfile(path, os.path.join(out_dir, f"{head}-seed{seed}.{testset}.hyp"))
                hyps.setdefault(head, {}).setdefault(seed, {})[testset] = D.read_lines(path)
    refs = {t: D.read_lines(os.path.join(refs_dir, f"{t}.{table.tgt}")) for t in testsets}
    scores = {c["head"]: {} for c in cells}
    for c in cells:
        scores[c["head"]][c["seed"]] = c.get("bleu", {})
    lowercased: Dict[str, Dict[str, Dict[str, list]]] = {}
    for head, by_seed in hyps.items():
        for seed in sorted(by_seed):
            for testset, lines in by_seed[seed].items():
                entry = lowercased.setdefault(head, {}).setdefault(testset, {"seeds": [], "values": []})
                entry["seeds"].append(seed)
                entry["values"].append(corpus_bleu(lines, refs[testset], lowercase=True))
    return {"bootstrap": C.bootstrap(hyps, refs, scores), "lowercased": lowercased}


def lowercased_line(lowercased: Dict[str, Dict[str, Dict[str, list]]]) -> str:
    """The sentence under a translation table: each head's case-insensitive BLEU per test set (mean ± sample std
    over its seeds), the scoring of the published Multi30k numbers in the table's note; "" without any."""
    import statistics

    parts = []
    for head, by_set in lowercased.items():
        scores = []
        for testset, entry in by_set.items():
            values = entry["values"]
            std = statistics.stdev(values) if len(values) > 1 else None
            scores.append(f"{testset} {_fmt(statistics.fmean(values), std)}")
        parts.append(f"{head} {', '.join(scores)} ({len(next(iter(by_set.values()))['values'])} seeds)")
    if not parts:
        return ""
    return (
        "BLEU lowercased (sacrebleu -lc on the committed hypotheses; published Multi30k systems are scored "
        "case-insensitively): " + "; ".join(parts) + "."
    )


def _fmt(mean: Optional[float], std: Optional[float], digits: int = 2) -> str:
    if mean is None:
        return "-"
    return f"{mean:.{digits}f}" + (f" ± {std:.{digits}f}" if std is not None else "")


def _score_rows(rows: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    return [r for r in rows if r["metric"] in SCORES]


def score_table(
    rows: List[Dict[str, Any]],
    sources: Optional[Dict[str, str]] = None,
    paper: Optional[Dict[str, Dict[str, float]]] = None,
) -> str:
    """Markdown table: one line per head, one column per split (mean ± std, n seeds), the paper's number. With
    ``sources`` (head -> paper, ``"*"`` for the others) and the table's ``paper`` numbers: each row's from its paper,
    named."""
    rows = _score_rows(rows)
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
        cells = [_fmt(by_split[s]["mean"], by_split[s]["std"]) if s in by_split else "-" for s in splits]
        paper = " / ".join(papers[head]) if per_split else papers[head][0]
        paper += f" ({labels[head]})" if labels.get(head) else ""
        lines.append(f"| {head} | " + " | ".join(cells) + f" | {len(any_row['values'])} | {paper} |")
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


def misrecorded(cells: List[Dict[str, Any]], table: str) -> str:
    """The sentence on cells whose recorded commands name another cell's directory (recorded by an earlier version;
    replaying them would resume or overwrite that cell), or ""."""
    wrong = sorted(
        {
            (c["head"], c["seed"])
            for c in cells
            if c.get("commands") and f"/{R.cell_dir('', c['head'], c['seed'], c.get('lr'))}/" not in c["commands"][0]
        }
    )
    if not wrong:
        return ""
    cells_text = ", ".join(f"{h} seed {s}" for h, s in wrong)
    return (
        f" The recorded commands of {cells_text} name another cell's directory (an earlier version recorded "
        f"them): rerun such a cell with `python -m recipes.reproduce {table} --heads HEAD` instead of replaying "
        f"its command."
    )


def worst_seeds(rows: List[Dict[str, Any]]) -> str:
    """Which seed scores worst for each head with several seeds, on each validation split (or the first split):
    whether a bad seed is bad for every head, from the numbers."""
    rows = _score_rows(rows)
    splits = list(dict.fromkeys(r["split"] for r in rows))
    out = []
    for split in [s for s in splits if "valid" in s] or splits[:1]:
        higher = rows[0]["metric"] != "ppl"
        worst = {
            r["head"]: r["seeds"][r["values"].index((min if higher else max)(r["values"]))]
            for r in rows
            if r["split"] == split and len(r["values"]) > 1 and r.get("seeds")
        }
        if len(worst) < 2:
            continue
        seeds = set(worst.values())
        out.append(
            f"Worst seed on {split}: seed {seeds.pop()} for every head."
            if len(seeds) == 1
            else f"Worst seed on {split}: " + ", ".join(f"{h} {s}" for h, s in worst.items()) + "."
        )
    return " ".join(out)


def claims_for(table, comparisons: List["C.Comparison"], rows: List[Dict[str, Any]]) -> Dict[tuple, float]:
    """The paper's difference for each test comparison of a head with a claim (``table.paper_claims``: its relative
    difference from softmax in its paper) against softmax or the size-matched softmax: the same relative difference at
    our baseline's mean, so it reads on our scale."""
    claims = getattr(table, "paper_claims", None) or {}
    means = {(r["head"], r["split"]): r["mean"] for r in _score_rows(rows)}
    out = {}
    for c in comparisons:
        claim = claims.get(c.head)
        base = means.get((c.baseline, c.split))
        if claim and base is not None and C.is_test(c.split) and c.baseline in ("softmax", C.MATCHED):
            out[(c.head, c.baseline, c.split)] = claim["relative"] * base
    return out


def untestable_claims(comparisons: List["C.Comparison"], claims: Dict[tuple, float], table) -> str:
    """The sentence on the papers' claims smaller than what the table detects (80% power), or ""."""
    small = [
        c
        for c in comparisons
        if (c.head, c.baseline, c.split) in claims
        and c.detectable is not None
        and abs(claims[(c.head, c.baseline, c.split)]) < c.detectable
    ]
    if not small:
        return ""
    sources = getattr(table, "paper_claims", {})
    return (
        "The table cannot test these papers' claims (the claimed difference, at our baseline's perplexity, is "
        "below what its seeds detect with 80% power at Holm's first level): "
        + "; ".join(
            f"{c.head} - {c.baseline} on {c.split}: claimed {claims[(c.head, c.baseline, c.split)]:+.2f} "
            f"({sources[c.head]['source']}), detectable ±{c.detectable:.2f}"
            for c in small
        )
        + "."
    )


def cap_sentence(cells: List[Dict[str, Any]]) -> str:
    """Where the epoch cap, not patience, ended most of the rows' cells: how many, and the valid loss's slope over
    their last two epochs (bits per epoch, the median; negative: still falling), or ""."""
    capped = [c for c in cells if c.get("stopped") in ("max_epochs", "max_updates") and len(c.get("curve") or []) >= 3]
    if not cells or 2 * len(capped) <= len(cells):
        return ""
    slopes = sorted((S.nll(c["curve"][-1]) - S.nll(c["curve"][-3])) / 2 for c in capped)
    cap = max(c["curve"][-1]["epoch"] for c in capped)
    median = slopes[len(slopes) // 2]
    return (
        f"{len(capped)} of the {len(cells)} cells of the rows stopped at the cap ({cap} epochs), not by patience: "
        f"the numbers are at the cap, not converged; their valid NLL still moved {median:+.3f} bits an epoch over "
        f"the last two epochs (median; from {slopes[0]:+.3f} to {slopes[-1]:+.3f})."
    )


def parameters_line(cells: List[Dict[str, Any]]) -> str:
    """Each row's parameter count (from its cells' checkpoints), or ""."""
    counts = {c["head"]: c["parameters"] for c in cells if c.get("parameters")}
    if not counts:
        return ""
    return "Parameters per row: " + ", ".join(f"{h} {n / 1e6:.2f}M" for h, n in counts.items()) + "."


def pilot_section(docs_dir: str) -> str:
    """The lm-ptb pilot (``docs/reproduction/lm-ptb-pilot.json``, :mod:`recipes.reproduce.studies.lm_pilot`): each arm's
    valid / test perplexity, its valid perplexity per epoch, its CPU time; the probes' epoch costs; or ""."""
    pilot = R.load_json(os.path.join(docs_dir, "reproduction", "lm-ptb-pilot.json"))
    if not pilot or not pilot.get("arms"):
        return ""
    lines = [
        "### lm-ptb pilot: the optimiser and the cost of an epoch",
        "",
        "Seed 1 of softmax and MoS-4 on PTB's train split, the table's mini model, a fixed number of epochs, no "
        "early stopping (`python -m recipes.reproduce.studies.lm_pilot`). NT-ASGD is validated and scored on its "
        "averages once averaging starts; its non-monotone trigger needs more than 5 validations, so within a "
        "pilot it is forced (`--asgd-from-epoch`, as MoS's finetune stage starts it): the best case for "
        "NT-ASGD at this budget.",
        "",
        "| arm | lr | epochs | averaging from epoch | valid ppl per epoch | valid ppl | test ppl | CPU h |",
        "|---|---|---|---|---|---|---|---|",
    ]
    total = 0.0
    for arm, r in pilot["arms"].items():
        curve = ", ".join(f"{2 ** p['loss']:.1f}" for p in r["curve"])
        hours = (r.get("cpu_s") or 0.0) / 3600
        total += hours
        lines.append(
            f"| {arm} | {r['lr']:g} | {r['epochs']} | {r.get('averaging_from_epoch') or '-'} | {curve} | "
            f"{r['ppl']['valid']:.2f} | {r['ppl']['test']:.2f} | {hours:.2f} |"
        )
    probes = pilot.get("probes") or {}
    spent = pilot.get("cpu_s") or {}
    hours = {k: v / 3600 for k, v in spent.items()}
    lines += [
        "",
        f"CPU time of the pilot: {total:.2f} core-hours of training"
        + (
            f", {hours['scoring']:.2f} of scoring, {hours['probes']:.2f} of the probes: "
            f"{sum(hours.values()):.2f} in all"
            if spent
            else ""
        )
        + ".",
    ]
    if probes:
        lines += [
            "",
            "Cost of an epoch of PTB train per head (one thread, tokens per second over a short run after "
            "its first updates, the table's sizes; the probes ran beside other jobs, so their ratios to softmax, "
            "not their minutes, are what they measure): "
            + ", ".join(f"{h} {p['epoch_s'] / 60:.1f} min" for h, p in probes.items() if p.get("epoch_s"))
            + ".",
        ]
    decision = pilot.get("decision")
    if decision:
        lines += ["", f"**Decision.** {decision}"]
    return "\n".join(lines) + "\n"


def chosen_cells(obj: Dict[str, Any]) -> List[Dict[str, Any]]:
    """The cells a table's rows come from: at each head's chosen learning rate (``obj["sweep"]``), or every cell of
    a table without a sweep."""
    chosen = {h: s["chosen"] for h, s in (obj.get("sweep") or {}).items()}
    return [c for c in obj.get("cells", []) if c["head"] not in chosen or c.get("lr") == chosen[c["head"]]]


def plots(obj: Dict[str, Any], out_dir: str) -> List[str]:
    """Score per head (every seed a dot), valid loss against updates, cost ratios; returns the file names."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    table = obj["table"]
    written = []

    def save(fig, name):
        fig.tight_layout()
        fig.savefig(os.path.join(out_dir, name), dpi=110)
        plt.close(fig)
        written.append(name)

    rows = _score_rows(obj["rows"])
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
            ax.set_xticks(range(len(heads)), heads, rotation=30, ha="right")
            ax.set_title(split, fontsize=9)
            ax.set_ylabel(METRIC_NAMES.get(rows[0]["metric"], rows[0]["metric"]))
            lo = min(v for r in rows if r["split"] == split for v in r["values"])
            ax.set_ylim(max(0.0, lo - 3), None)
        fig.suptitle(f"{table}: per head (bars: mean, dots: seeds)", fontsize=10)
        save(fig, f"{table}-scores.png")
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
                            [S.nll(p) for p in points],
                            color=f"C{i}",
                            alpha=0.8,
                            label=head if j == 0 else None,
                        )
                        best = min(points, key=lambda p: p["loss"])  # the scored checkpoint
                        ax.plot([best[x_key]], [S.nll(best)], "o", color=f"C{i}", ms=3)
            ax.set_xlabel(x_label)
            ax.set_ylabel("valid NLL (bits per token)")
            ax.legend(fontsize=8)
        fig.suptitle(
            f"{obj['table']}: validation NLL, every seed at the head's chosen rate (dots: the checkpoint "
            + ("the label-smoothed loss picks)" if S.label_smoothed(curves) else "scored)"),
            fontsize=10,
        )
        save(fig, f"{obj['table']}-valid-loss.png")
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
    return written


INTRO = """# The papers' tables at mini scale

Generated by `python -m recipes.reproduce.report` from `docs/reproduction/*.json` (do not edit by hand).
The mini tables are scaled-down proxies of the papers' experiments (small models, small corpora, a few epochs on a
CPU), not reproductions of their numbers. Every number below comes from a run of
`python -m recipes.reproduce TABLE --scale mini` on this project's
2-core CPU machine (the commands of every cell are in the json files and in `results/reproduce/TABLE/commands.sh`
of the machine that ran them); the paper's numbers are the full-size ones (GPU clusters, WMT'14 / the papers'
corpora), so they are a reference for the *ordering* of heads and the *cost ratios*, not for the absolute value
of a mini number. `--scale full --dry-run` prints the full-size commands and parameter counts.
Mean ± sample std over seeds. Heads are compared seed by seed (seed K of two heads shares the data order and the
initialisation of the shared layers): the mean paired difference with its 95% t interval, the paired t-test and
the exact sign test, the p-values of a table's test comparisons Holm-adjusted together (the valid split chose the
rates and checkpoints, so its differences are described, not tested); a difference is called one only where its
Holm-adjusted p is below 0.05, otherwise the report says there is no significant difference and does not rank the
heads. Beside each test comparison, the smallest true difference its seeds detect with 80% power. For BLEU,
sacrebleu's paired bootstrap (1,000 resamplings) also tests every seed on its own, on the committed hypotheses
(`docs/reproduction/hyps/`).
"""


#: two tables whose mini models have the same sizes: how far their cost ratios differ shows the timing noise
TWIN_COST_TABLES = ("mt-en-de", "mt-en-fr")


def timing_noise(objs: Dict[str, Dict[str, Any]]) -> str:
    """A sentence on how far one timing run can be trusted: the largest gap between the cost ratios of
    :data:`TWIN_COST_TABLES` (same model sizes, so a gap is noise), or "" until both are measured."""
    a, b = ((objs.get(t) or {}).get("costs") or {} for t in TWIN_COST_TABLES)
    if not a or not b:
        return ""
    gaps = [
        (abs(a["ratios"][h][k] / b["ratios"][h][k] - 1), h, k)
        for h in a["ratios"]
        if h in b["ratios"]
        for k in a["ratios"][h]
        if h != "softmax" and k in b["ratios"][h]
    ]
    gap, head, key = max(gaps)
    return (
        f"{' and '.join(TWIN_COST_TABLES)} time mini models of the same sizes and their ratios differ by up "
        f"to {gap:.0%} ({head}, {key}: {a['ratios'][head][key]:.2f}x and {b['ratios'][head][key]:.2f}x): read "
        f"smaller differences as noise."
    )


def _added_heads(costs: Dict[str, Any]) -> str:
    """The sentence on heads timed after the table's cost run (:func:`recipes.reproduce.engine.costs.merge_costs`)."""
    added = list(costs.get("added") or {})
    if not added:
        return ""
    return (
        f" {', '.join(added)}: added to the table later, timed beside softmax again in a run of "
        f"{'its' if len(added) == 1 else 'their'} own (ratios to that run's softmax; the budget is that run's)."
    )


def _minutes_by_head(cells: List[Dict[str, Any]], key: str) -> Dict[str, List[float]]:
    """``{head: [minutes]}``: each cell's ``key`` (seconds) in minutes, for the cells that recorded one."""
    out: Dict[str, List[float]] = {}
    for c in cells:
        if c.get(key):
            out.setdefault(c["head"], []).append(c[key] / 60)
    return out


def curves_to_plot(cells: List[Dict[str, Any]]) -> tuple:
    """``(points of each cell, the seconds axis' label)`` for the valid-loss plot: the seconds are the clock of the
    equal-compute table (:func:`compare.on_one_clock`): CPU seconds where every cell recorded its CPU time, else the
    logged wall-clock seconds; a cell with no logged curve gives its ``valid_curve`` by updates."""
    curves, clock = C.on_one_clock(cells)
    points = [p or [{"updates": u, "loss": loss} for u, loss in c["valid_curve"]] for c, p in zip(cells, curves)]
    label = (
        "training CPU seconds (logged seconds scaled by the cell's CPU time)"
        if clock == "cpu"
        else "training seconds (one core each, wall-clock)"
    )
    return points, label


def table_section(obj: Dict[str, Any], out_dir: str, notes: str = "", noise: str = "") -> str:
    rows = obj["rows"]
    full_only = not rows and obj["table"] in TABLE_MODULES and "mini" not in get_table(obj["table"]).scales
    if rows:
        scale = rows[0]["scale"]
    else:
        scale = (
            "full only (the plan below; nothing run here)"
            if full_only
            else "mini, learning-rate sweep running (no head has its rate and seeds yet)"
            if obj.get("sweep")
            else "mini, no cell finished yet"
        )
    cells = obj.get("cells") or []
    scored = chosen_cells(obj)  # the cells of the rows: the sweep's other rates stop elsewhere
    done = "".join(
        f" {t}"
        for t in (
            f"Cells finished: {len(cells)} ({', '.join(sorted({c['head'] for c in cells}))})." if cells else "",
            parameters_line(scored),
            cap_sentence(scored),
        )
        if t
    )
    done += misrecorded(cells, obj["table"])
    table = get_table(obj["table"]) if obj["table"] in TABLE_MODULES else None
    sources = getattr(table, "paper_source", None)
    lines = [
        f"## {obj['table']}: {obj['description']}",
        "",
        f"Scale: **{scale}**. {notes}{done}".rstrip(),
        "",
        *(
            []
            if full_only or (obj.get("sweep") and not rows)  # a running sweep: its table below
            else [score_table(rows, sources, getattr(table, "paper", None))]
        ),
    ]
    lowercased = lowercased_line(obj.get("lowercased") or {})
    if lowercased:
        lines += [lowercased, ""]
    walls = _minutes_by_head(scored, "train_wall_s")
    if walls and rows:
        seeds = Counter(c["head"] for c in scored)
        times = ", ".join(
            f"{h} {sum(v) / len(v):.1f}"
            + (f" ({len(v)} of its {seeds[h]} seeds logged a time)" if len(v) < seeds[h] else "")
            for h, v in walls.items()
        )
        lines += [
            "Training time of a cell (fairseq's train_wall or the recipe's, minutes, mean over the seeds that "
            f"logged one; one thread each, two to five cells at a time on the 2 cores): {times}.",
            "",
        ]
        cpu = _minutes_by_head(scored, "cpu_s")
        if cpu:  # what the cells cost, whatever else ran beside them
            lines += [
                "CPU time of a cell's training (user + system, minutes, mean over the seeds that recorded it; "
                "unlike the wall-clock above, not inflated by the jobs beside it): "
                + ", ".join(f"{h} {sum(v) / len(v):.1f} ({len(v)} of {seeds[h]} seeds)" for h, v in cpu.items())
                + ".",
                "",
            ]
    costs = cost_table(rows)
    if costs:
        lines += [
            "Training time as a ratio to softmax (the paper's cost columns; ours on the mini model, CPU):",
            "",
            costs,
        ]
        c = obj.get("costs") or {}
        if c:
            batches = ", ".join(
                f"{h} {b['all'] or 'none'}/{b['out'] or 'none'}" for h, b in c["same_mem_batch"].items()
            )
            unit = c.get("unit", "sentences")
            lines += [
                f"Same batch: {c['batch']} {unit}. Same memory: softmax's peak at {c['batch']} {unit} "
                f"x {c['budget_factor']} (all layers {c['budget_bytes']['all'] / 2**20:.0f} MiB, output "
                f"layer {c['budget_bytes']['out'] / 2**20:.0f} MiB); largest batch that fits, all layers / "
                f"output layer: {batches} (none: not even {min(GRID)} fit); time per sequence at that batch. "
                f"{c['threads']} thread"
                f"{'s' if c['threads'] != 1 else ''}, one timing run per head on a 2-core machine shared "
                f"with the training runs.{_added_heads(c)} {noise}".rstrip(),
                "",
            ]
    sweep = obj.get("sweep") or {}
    smoothed = S.label_smoothed(cells)
    if sweep:
        spent = C.cpu_hours(cells, sweep)
        lines += [
            "Learning rate per head: best valid loss of seed 1 at every rate ("
            + (
                "the label-smoothed loss the cells train and stop on, then the NLL of that checkpoint; "
                if smoothed
                else ""
            )
            + "epoch of the best, why it stopped; bold: the chosen rate, chosen on valid only):",
            "",
            C.sweep_table(cells, sweep),
        ]
        if smoothed and any(not s.get("from") for s in sweep.values()):  # a borrowed rate was checked where swept
            moved = C.rates_by_nll(cells, sweep)
            lines += [
                (
                    "The NLL of the same checkpoints would choose another rate for "
                    + ", ".join(f"{h} ({S.rate_key(lr)})" for h, lr in moved.items())
                    if moved
                    else "The NLL of the same checkpoints chooses the same rate for every head whose sweep is done"
                )
                + ".",
                "",
            ]
        borrowed = sorted({s["from"] for s in sweep.values() if s.get("from")})
        if borrowed:
            lines += [
                f"Not swept here: the heads marked with {' / '.join(borrowed)}'s choice train at the rate that "
                f"table's sweep chose on its own valid split (`--lr-from`), a cut to fit the compute budget; "
                f"their rate may not be this table's best.",
                "",
            ]
        lines += [
            f"Compute: {spent['total']:.1f} CPU-core-hours of training for this table ({spent['sweep']:.1f} in "
            f"the rates not chosen, {spent['chosen']:.1f} in the chosen rates' seeds; scoring excluded).",
            "",
        ]
    scores = _score_rows(rows)
    comparisons = C.family(rows)
    if comparisons:
        metric = scores[0]["metric"]
        claims = claims_for(table, comparisons, rows) if table is not None else {}
        lines += [
            "Paired comparisons (head minus baseline, same seeds; Holm-adjusted over this table's test "
            "comparisons; the valid split chose every rate and checkpoint, so its rows are described, not "
            "tested; detectable: the smallest true difference each test comparison finds with 80% power at "
            "0.05 / m, from its seeds' paired spread"
            + ("; paper's difference: the paper's relative difference at our baseline's mean" if claims else "")
            + "):",
            "",
            C.family_table(
                comparisons, metric, obj.get("bootstrap") if metric == "bleu" else None, claims if claims else None
            ),
        ]
        untestable = untestable_claims(comparisons, claims, table)
        if untestable:
            lines += [untestable, ""]
    ratios = {h: r["time_all_layers_same_bsz"] for h, r in ((obj.get("costs") or {}).get("ratios") or {}).items()}
    compute = C.equal_compute(scored, ratios)
    if compute:
        seconds = (
            "CPU seconds (each cell's logged seconds scaled by its recorded CPU time over them, which takes "
            "out the waiting for a core shared with other jobs; a cell's validations included)"
            if compute[0]["clock"] == "cpu"
            else "seconds (wall-clock on one core each, beside other jobs on a shared 2-core machine, so they "
            "carry noise)"
        )
        lines += [
            "Equal compute: each head's lowest valid NLL (bits per token"
            + (
                "; not the label-smoothed loss the cells train and stop on, which also rewards the probability "
                "a head leaves on every word of the vocabulary, more of it in a mixture's tail than in one "
                "softmax's"
                if smoothed
                else ""
            )
            + ") within the updates, and within the training "
            f"{seconds}, that softmax's cell of the same seed took to its stop, against softmax's lowest "
            "(negative: the head gets lower for the same number of steps / the same bill"
            + (
                "; the cost column divides softmax's updates by the head's time per update measured in one "
                "benchmark process (the cost table above), the same bill without that noise"
                if ratios
                else ""
            )
            + "):",
            "",
            C.equal_compute_table(compute),
        ]
    text = " ".join(
        t for t in (C.reading(comparisons, scores[0]["metric"]) if comparisons else "", worst_seeds(rows)) if t
    )
    if text:
        lines += ["**What it shows.** " + text, ""]
    reading = written_reading(out_dir, obj["table"], len(cells))
    if reading:
        lines += ["**Reading.** " + reading, ""]
    for name in plots(obj, out_dir):
        lines += [f"![{name}](reproduction/{name})", ""]
    plan = obj.get("plan")
    if plan:
        counts = ", ".join(f"{h} {n / 1e6:.1f}M" for h, n in plan["parameters"].items())
        lines += [
            f"**Full size** (`python -m recipes.reproduce {obj['table']} --scale full --dry-run`; GPUs, not run "
            f"here): parameters per head: {counts}. {plan.get('note', '')}".rstrip(),
            "",
        ]
        paper = plan.get("paper") or {}
        if paper and not rows:  # nothing of ours to put the paper's numbers beside: show them with the plan
            splits = sorted({split for by_split in paper.values() for split in by_split})
            lines += [
                "| head | parameters (ours) | " + " | ".join(f"paper {s}" for s in splits) + " |",
                "|---|---|" + "---|" * len(splits),
            ]
            lines += [
                f"| {h} | {n / 1e6:.1f}M | " + " | ".join(str(paper.get(h, {}).get(s, "-")) for s in splits) + " |"
                for h, n in plan["parameters"].items()
            ]
            lines.append("")
        lines += [
            "```",
            *plan["commands"][:MAX_PLAN_LINES],
            *(["# ... (every command in the json)"] if len(plan["commands"]) > MAX_PLAN_LINES else []),
            "```",
            "",
        ]
    if rows:
        lines += ["Commands (first seed of each head; every seed in the json):", "", "```"]
        seen = set()
        for r in _score_rows(rows):
            if r["command"] not in seen:  # one per head, one per model where a cell trains several
                seen.add(r["command"])
                lines.append(r["command"])
        lines += ["```", ""]
    return "\n".join(lines)


#: the first line of a table's reading (``docs/reproduction/TABLE-reading.md``): how many cells it was written for
READING_CELLS = re.compile(r"<!--\s*cells:\s*(\d+)\s*-->")


def written_reading(src: str, table: str, cells: int) -> str:
    """The paragraph a person wrote on what ``table``'s numbers mean (``src/TABLE-reading.md``; "" without one): the
    report's "What it shows" follows the tests, this one says what they mean for the papers' claims. Its first line
    ``<!-- cells: N -->`` says how many cells had finished when it was written; with more or fewer now, the report
    says so, since the numbers it discusses may have moved."""
    path = os.path.join(src, f"{table}-reading.md")
    if not os.path.isfile(path):
        return ""
    with open(path) as f:
        text = f.read().strip()
    m = READING_CELLS.match(text)
    body = " ".join(text[m.end() :].split()) if m else " ".join(text.split())
    if m and int(m.group(1)) != cells:
        body += (
            f" *(Written when {m.group(1)} cells had finished; {cells} have now: the numbers above may have "
            f"moved since.)*"
        )
    return body


def protocols_section(obj: Dict[str, Any]) -> str:
    """The papers' training protocol against fairseq's blocks (``python -m recipes.reproduce.studies.protocols``): the
    perplexities of every (trained on, scored) pair, and the paired per-seed differences that matter."""
    from recipes.reproduce.studies import protocols

    cells = obj["cells"]
    by = {(c["protocol"], c["seed"]): c["ppl"] for c in cells}
    seeds = sorted({s for (_, s) in by})
    lines = [
        f"### {obj['table']}: the papers' protocol (streams, carried state) against fairseq's blocks",
        "",
        obj["description"],
        "",
        *protocols.summary(cells),
        "",
    ]
    pairs = []
    for label, a, b in (
        (
            "the same checkpoint (trained on streams), stateful minus stateless",
            ("streams", "stateful"),
            ("streams", "stateless"),
        ),
        (
            "trained on streams minus trained on blocks, each scored as it trained",
            ("streams", "stateful"),
            ("blocks", "blocks"),
        ),
    ):
        for split in ("valid", "test"):
            both = [s for s in seeds if (a[0], s) in by and (b[0], s) in by]
            if both:
                first = [by[(a[0], s)][a[1]][split] for s in both]
                second = [by[(b[0], s)][b[1]][split] for s in both]
                per_seed = ", ".join(f"{x - y:+.2f}" for x, y in zip(first, second))
                pairs.append(f"{label}, {split}: {paired(first, second).describe()} (per seed {per_seed})")
    if pairs:
        lines += [
            "Paired differences of perplexity (negative: the first is better; mean, 95% interval, paired "
            "t-test): " + "; ".join(pairs) + ".",
            "",
        ]
    return "\n".join(lines)


#: the training compute the mini comparison (stopping rule, a learning rate per head, paired seeds) was planned at
MINI_BUDGET_HOURS = 40.0


#: the training compute of cells set aside when a table's mini settings changed, in ``docs/reproduction/``:
#: ``{name: {"table", "reason", "cells", "total", "wall"}}`` (:func:`set_aside`); the Compute section counts it
SET_ASIDE = "compute-set-aside.json"


def set_aside(cells_dir: str, table: str, reason: str, docs_dir: str = DOCS) -> Dict[str, Any]:
    """Count the training CPU-core-hours of every cell under ``cells_dir`` (a table's results moved aside when its
    mini settings changed: the new settings train them again) as :func:`recipes.reproduce.compare.cpu_hours` counts
    a cell (measured CPU time, else training seconds times threads: one where no record says), and keep the count in
    ``docs_dir/reproduction/`` (:data:`SET_ASIDE`) under the directory's name, so the Compute section keeps counting
    what they cost; returns the entry."""
    threads = {
        os.path.join(R.cell_dir(cells_dir, c["head"], c["seed"], c.get("lr")), "train.log"): c.get("threads")
        for c in R.cells(cells_dir)
    }
    entry = {"table": table, "reason": reason, "cells": 0, "total": 0.0, "wall": 0.0}
    for log in sorted(glob.glob(os.path.join(cells_dir, "**", "train.log"), recursive=True)):
        with open(log) as f:
            text = f.read()
        cell = {"cpu_s": cpu_seconds(log, text), "train_wall_s": parse_train_wall(text), "threads": threads.get(log)}
        hours = C.cell_cpu_hours(cell)
        entry["cells"] += 1
        entry["total"] += hours
        entry["wall"] += hours if cell["cpu_s"] is None else 0.0
    if not entry["cells"]:
        raise SystemExit(f"--set-aside {cells_dir}: no cell's train.log under it")
    path = os.path.join(docs_dir, "reproduction", SET_ASIDE)
    kept = R.load_json(path) or {}
    kept[os.path.basename(os.path.normpath(cells_dir))] = entry
    R.save_json(path, kept)
    return entry


def budget_section(objs: Dict[str, Dict[str, Any]], aside: Optional[Dict[str, Dict[str, Any]]] = None) -> str:
    """Markdown: the training compute of the tables run with the stopping rule and a rate per head, per table (cells
    of the sweep's other rates, cells at the chosen rates, CPU-core-hours) and in all, against
    :data:`MINI_BUDGET_HOURS`, cells set aside (``aside``: :func:`set_aside`) counted in their own rows; "" when no
    table has a sweep."""
    # the train-split tables' cells are another plan's (train_split_budget)
    swept = {
        t: {**o, "cells": [c for c in o.get("cells", []) if not train_split(c)]}
        for t, o in objs.items()
        if o.get("sweep")
    }
    swept = {t: o for t, o in swept.items() if o["cells"]}
    if not swept:
        return ""
    lines = [
        "## Compute",
        "",
        "Training CPU-core-hours of the tables run with the stopping rule and a learning rate "
        "per head: the CPU time (user + system) of each cell's training processes, as the recipes record it beside "
        "the training log; a cell trained before they recorded it counts its training seconds times its threads, "
        "an upper bound, since its core was shared (scoring and timing excluded):",
        "",
        "| table | cells at other rates (sweep) | cells at the chosen rates | CPU-core-hours: sweep / chosen / "
        "total | of which wall-clock bounds |",
        "|---|---|---|---|---|",
    ]
    total = wall = 0.0
    for table, obj in swept.items():
        spent, chosen = C.cpu_hours(obj["cells"], obj["sweep"]), chosen_cells(obj)
        total, wall = total + spent["total"], wall + spent["wall"]
        lines.append(
            f"| {table} | {len(obj['cells']) - len(chosen)} | {len(chosen)} | {spent['sweep']:.1f} / "
            f"{spent['chosen']:.1f} / {spent['total']:.1f} | {spent['wall']:.1f} |"
        )
    kept = total
    for entry in (aside or {}).values():
        total, wall = total + entry["total"], wall + entry["wall"]
        lines.append(
            f"| {entry['table']}, set aside: {entry['reason']} | {entry['cells']} | - | - / - / "
            f"{entry['total']:.1f} | {entry['wall']:.1f} |"
        )
    over = total - MINI_BUDGET_HOURS
    lines += [
        "",
        f"In all {total:.1f} of the {MINI_BUDGET_HOURS:.0f} CPU-core-hours planned"
        + (f": over the plan by {over:.1f}" if over > 0 else f" ({100 * total / MINI_BUDGET_HOURS:.0f}%)")
        + (
            f"; the tables' own cells took {kept:.1f} ({100 * kept / MINI_BUDGET_HOURS:.0f}% of the plan), the "
            f"cells set aside {total - kept:.1f}."
            if aside
            else "."
        )
        + (
            f" {wall:.1f} of them are wall-clock bounds of cells that ran one thread each, two to four at a time "
            f"on the 2 cores: their CPU time was less."
            if wall
            else ""
        ),
        "",
    ]
    return "\n".join(lines)


#: the training compute planned for the perplexity tables on the train splits (the pilot, lm-ptb, lm-wt2, lm-gpt2's
#: rerun with the seeded batch order)
TRAIN_SPLIT_BUDGET_HOURS = 40.0


def train_split(cell: Dict[str, Any]) -> bool:
    """Whether a cell trained on a corpus's train split (the language-model tables since PTB's and WikiText-2's
    train splits are here), as opposed to the earlier mini protocol's valid-split text."""
    return cell.get("data") == "train.txt"


def train_split_budget(objs: Dict[str, Dict[str, Any]], pilot: Optional[Dict[str, Any]]) -> str:
    """Markdown: the training CPU-core-hours of the train-split plan, the pilot and each table's cells, against
    :data:`TRAIN_SPLIT_BUDGET_HOURS`; "" before any of it ran."""
    parts = []
    if pilot and pilot.get("arms"):
        arms = pilot["arms"].values()
        parts.append(("lm-ptb pilot", len(arms), sum((a.get("cpu_s") or 0.0) for a in arms) / 3600))
    for table, obj in objs.items():
        cells = [c for c in obj.get("cells", []) if train_split(c)]
        if cells:  # lm-gpt2's cells record no CPU time: their training seconds (one thread each) stand in
            parts.append((table, len(cells), sum(C.cell_cpu_hours(c) for c in cells)))
    if not parts:
        return ""
    total = sum(hours for _, _, hours in parts)
    lines = [
        "### The perplexity tables on the train splits",
        "",
        f"Training CPU-core-hours of the plan that retrains the language-model tables on PTB's and WikiText-2's "
        f"train splits ({TRAIN_SPLIT_BUDGET_HOURS:.0f} planned; scoring excluded):",
        "",
        "| part | cells | CPU-core-hours |",
        "|---|---|---|",
    ]
    lines += [f"| {name} | {n} | {hours:.1f} |" for name, n, hours in parts]
    share = 100 * total / TRAIN_SPLIT_BUDGET_HOURS
    lines += ["", f"In all {total:.1f} of {TRAIN_SPLIT_BUDGET_HOURS:.0f} ({share:.0f}%).", ""]
    return "\n".join(lines)


def build_report(docs_dir: str = DOCS, notes: Optional[Dict[str, str]] = None) -> str:
    """Write ``docs_dir/reproduction.md`` (and its plots) from ``docs_dir/reproduction/*.json``; return it."""
    src = os.path.join(docs_dir, "reproduction")
    os.makedirs(src, exist_ok=True)
    sections = [INTRO]
    objs = {}
    for table in TABLE_MODULES:
        path = os.path.join(src, f"{table}.json")
        if os.path.isfile(path):
            with open(path) as f:
                objs[table] = json.load(f)
    noise = timing_noise(objs)
    budget = budget_section(objs, R.load_json(os.path.join(src, SET_ASIDE)))
    if budget:
        sections.append(budget)
    retrained = train_split_budget(objs, R.load_json(os.path.join(src, "lm-ptb-pilot.json")))
    if retrained:
        sections.append(retrained if budget else "## Compute\n\n" + retrained)
    for table, obj in objs.items():
        note = obj.get("notes", getattr(get_table(table), "report_notes", ""))
        if obj.get("cells") and not obj.get("sweep") and getattr(get_table(table), "mini_lr", None):
            note = (
                f"**Previous protocol**: these cells ran a fixed number of updates at one learning rate; the "
                f"stopping-rule cells with a learning rate per head (docs/reproducing.md) replace them as they "
                f"finish. {note}"
            )
        sections.append(table_section(obj, src, (notes or {}).get(table, note), noise))
        if table == "lm-ptb" and pilot_section(docs_dir):
            sections.append(pilot_section(docs_dir))
        protocols_path = os.path.join(src, f"{table}-protocols.json")
        if os.path.isfile(protocols_path):
            with open(protocols_path) as f:
                sections.append(protocols_section(json.load(f)))
    text = "\n".join(sections)
    with open(os.path.join(docs_dir, "reproduction.md"), "w") as f:
        f.write(text)
    return text


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="python -m recipes.reproduce.report", description=__doc__.split("\n")[0])
    p.add_argument("--results", default=os.path.join("results", "reproduce"), help="where the tables ran")
    p.add_argument("--docs", default=DOCS)
    p.add_argument("--no-collect", action="store_true", help="only rebuild the report from the committed json")
    p.add_argument(
        "--set-aside",
        metavar="DIR",
        help="count the training compute of the cells under DIR, a table's "
        "results moved aside when its mini settings changed (with --table and --reason), in the Compute "
        "section",
    )
    p.add_argument("--table", choices=sorted(TABLE_MODULES), help="the table whose cells --set-aside counts")
    p.add_argument("--reason", help="why --set-aside's cells were set aside (printed in their row)")
    args = p.parse_args(argv)
    if args.set_aside:
        if not (args.table and args.reason):
            p.error("--set-aside needs --table and --reason")
        entry = set_aside(args.set_aside, args.table, args.reason, args.docs)
        print(f"set aside {entry['cells']} cells of {args.table}: {entry['total']:.1f} CPU-core-hours")
    if not args.no_collect:
        for path in collect(args.results, args.docs):
            print(f"collected {path}")
    build_report(args.docs)
    print(f"wrote {os.path.join(args.docs, 'reproduction.md')}")


if __name__ == "__main__":
    from recipes.common.cli import run

    run(main)
