"""The report's sections (one per table, the lm-ptb pilot, the protocol study, the compute spent), each opening with
its table and closing with its hand-written reading, and the derived numbers a reading may cite (:func:`numbers`)."""

from __future__ import annotations

import os
import statistics
from collections import Counter
from typing import Any, Dict, List, Optional

from recipes.common.reading import written_reading
from recipes.common.stats import ALPHA, POWER, format_diff, format_p, holm, paired
from recipes.reproduce import TABLE_MODULES, get_table
from recipes.reproduce.engine import results as result_files
from recipes.reproduce.engine.sweep import label_smoothed, nll, rate_key
from recipes.reproduce.report import compare, layout
from recipes.reproduce.report.collect import chosen_cells
from recipes.reproduce.report.layout import score_rows, table, wrap
from recipes.reproduce.report.plots import plots

#: the ``plan`` of a set-aside entry (:data:`.collect.SET_ASIDE`) that the train splits' Compute table counts
TRAIN_SPLIT_PLAN = "train-splits"
#: the tables retrained on the train splits (their Compute table says which have not started)
TRAIN_SPLIT_TABLES = ("lm-ptb", "lm-wt2", "lm-gpt2")
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
#: the protocol study's comparisons: (what, (trained on, scored) minus (trained on, scored))
PROTOCOL_PAIRS = (
    (
        "stateful minus stateless (the same checkpoint, trained on streams)",
        ("streams", "stateful"),
        ("streams", "stateless"),
    ),
    ("trained on streams minus on blocks (each scored as it trained)", ("streams", "stateful"), ("blocks", "blocks")),
)


def reading(out_dir: str, name: str, cells: int, label: str = "**Reading.** ") -> List[str]:
    text = written_reading(os.path.join(out_dir, f"{name}-reading.md"), cells)
    return [label + text, ""] if text else []


def _mean(values) -> Optional[Dict[str, float]]:
    return {"mean": statistics.fmean(values), "n": len(values)} if values else None


def _range(values) -> Dict[str, float]:
    return {"mean": statistics.fmean(values), "min": min(values), "max": max(values)}


def _paired(r) -> Optional[Dict[str, Any]]:
    return None if r is None else {k: getattr(r, k) for k in ("n", "mean", "std", "low", "high", "p", "p_sign")}


def label_smoothing(cell: Dict[str, Any]) -> Optional[float]:
    """The label smoothing a cell trained with (its mini arguments' ``--label-smoothing``), or None."""
    mini = cell.get("mini") or []
    return float(mini[mini.index("--label-smoothing") + 1]) if "--label-smoothing" in mini else None


def claims_for(spec, comparisons, rows) -> Dict[tuple, float]:
    """The paper's difference (``spec.paper_claims``: relative, against its softmax) at our baseline's mean, for each
    test comparison of a claimed head against softmax or the size-matched softmax."""
    claims, means = getattr(spec, "paper_claims", None) or {}, {(r["head"], r["split"]): r["mean"] for r in rows}
    return {
        (c.head, c.baseline, c.split): claims[c.head]["relative"] * means[(c.baseline, c.split)]
        for c in comparisons
        if c.head in claims and compare.is_test(c.split) and c.baseline in ("softmax", compare.MATCHED)
    }


def head_facts(cells: List[Dict[str, Any]], order: List[str]) -> Dict[str, Dict[str, Any]]:
    """Per head, its cells at its chosen rate: how many, scored, the rate, parameters, models, why they stopped, the
    best epochs, the best NLL's spread over seeds, a label-smoothed loss's smoothing term ``(loss - (1 - eps) NLL) /
    eps`` per seed, the last epoch's NLL change, the wall-clock and CPU minutes of a cell (and CPU against softmax)."""
    out = {}
    for head in dict.fromkeys(order + [c["head"] for c in cells]):
        mine = sorted((c for c in cells if c["head"] == head), key=lambda c: c["seed"])
        best, eps = [c["best"] for c in mine if c.get("best")], label_smoothing(mine[0]) if mine else None
        out[head] = mine and {
            "cells": len(mine),
            "scored": sum(any(c.get(m) for m in layout.SCORES) for c in mine),
            "lr": mine[0].get("lr"),
            "parameters": mine[0].get("parameters"),
            "models": sorted({m for c in mine for m in c.get("models") or []}),
            "stopped": dict(Counter(c["stopped"] for c in mine if c.get("stopped"))),
            "best_epochs": [b["epoch"] for b in best],
            "best_loss_mean": statistics.fmean(b["loss"] for b in best) if best else None,
            "best_nll_spread": max(map(nll, best)) - min(map(nll, best)) if best else None,
            "smoothing_bits": [(b["loss"] - (1 - eps) * nll(b)) / eps for b in best] if eps else None,
            "last_epoch_nll_change": [
                nll(c["curve"][-1]) - nll(c["curve"][-2]) for c in mine if (c.get("curve") or [])[1:]
            ],
            "wall_minutes": _mean([c["train_wall_s"] / 60 for c in mine if c.get("train_wall_s")]),
            "cpu_minutes": _mean([c["cpu_s"] / 60 for c in mine if c.get("cpu_s")]),
        }
    out = {h: f for h, f in out.items() if f}
    base = (out.get("softmax") or {}).get("cpu_minutes")
    for f in out.values():
        f["cpu_ratio"] = f["cpu_minutes"]["mean"] / base["mean"] if base and f["cpu_minutes"] else None
    return out


def cap_facts(cells: List[Dict[str, Any]]) -> Optional[Dict[str, Any]]:
    """The cells the epoch cap stopped: how many, the cap, the valid NLL's slope over their last two epochs (bits an
    epoch per cell, sorted; negative: still falling), its median, and the median as perplexity per epoch (%)."""
    capped = [c for c in cells if c.get("stopped") in ("max_epochs", "max_updates") and len(c.get("curve") or []) >= 3]
    if not capped:
        return None
    slopes = sorted((nll(c["curve"][-1]) - nll(c["curve"][-3])) / 2 for c in capped)
    median, cap = statistics.median(slopes), max(c["curve"][-1]["epoch"] for c in capped)
    facts = {"cells": len(cells), "capped": len(capped), "epochs": cap, "slopes": slopes, "median": median}
    return {**facts, "ppl_pct_at_median": 100 * (2**median - 1)}


def sweep_facts(cells: List[Dict[str, Any]], sweep: Dict[str, Any]) -> Dict[str, Any]:
    """Seed 1 of every head at every rate tried: its best valid NLL minus the chosen rate's, and its valid NLL per
    epoch minus the chosen rate's and minus softmax's at the same rate (bits)."""
    seed1 = [c for c in cells if c["seed"] == 1]
    curves = {(c["head"], c.get("lr")): {p["epoch"]: nll(p) for p in c.get("curve") or []} for c in seed1}
    best = {(c["head"], c.get("lr")): nll(c["best"]) for c in seed1 if c.get("best")}
    out: Dict[str, Any] = {}
    for head, s in sweep.items():
        chosen, top = curves.get((head, s["chosen"]), {}), best.get((head, s["chosen"]))
        for lr in s["rates"]:
            mine, base = curves.get((head, lr), {}), curves.get(("softmax", lr), {})
            out.setdefault(head, {})[rate_key(lr)] = {
                "best_nll_over_chosen": best[(head, lr)] - top if (head, lr) in best and top is not None else None,
                "epochs_over_chosen": {e: v - chosen[e] for e, v in mine.items() if e in chosen},
                "epochs_over_softmax": {e: v - base[e] for e, v in mine.items() if e in base},
            }
    return out


def over_softmax_best(cells: List[Dict[str, Any]]) -> Dict[str, Any]:
    """Per head and epoch: its valid NLL minus softmax's lowest of the same seed (mean, lowest, highest over seeds)."""
    best = {c["seed"]: min(map(nll, c["curve"])) for c in cells if c["head"] == "softmax" and c.get("curve")}
    out: Dict[str, Dict[int, list]] = {}
    for c in (c for c in cells if c["head"] != "softmax" and c["seed"] in best):
        for p in c.get("curve") or []:
            out.setdefault(c["head"], {}).setdefault(p["epoch"], []).append(nll(p) - best[c["seed"]])
    return {h: {e: _range(g) for e, g in by.items()} for h, by in out.items()}


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


def table_facts(obj: Dict[str, Any]) -> Dict[str, Any]:
    """What a table's section shows, computed from its json alone."""
    rows, cells = score_rows(obj["rows"]), obj.get("cells") or []
    spec = get_table(obj["table"]) if obj["table"] in TABLE_MODULES else None
    scored = chosen_cells(obj)  # the cells of the rows: the sweep's other rates stop elsewhere
    comparisons = compare.family(rows, obj.get("seeds_planned"))
    ratios = ((obj.get("costs") or {}).get("ratios")) or {}
    ratios = {h: r["time_all_layers_same_bsz"] for h, r in ratios.items() if "time_all_layers_same_bsz" in r}
    lowercased = obj.get("lowercased") or {}
    splits = list(dict.fromkeys(r["split"] for r in rows))
    worst = {}
    for split in [s for s in splits if "valid" in s] or splits[:1]:  # the worst seed of each head with several
        pick = max if rows[0]["metric"] == "ppl" else min
        mine = [r for r in rows if r["split"] == split and len(r["values"]) > 1]
        worst[split] = {r["head"]: r["seeds"][r["values"].index(pick(r["values"]))] for r in mine}
    here = lambda c: f"/{result_files.cell_dir('', c['head'], c['seed'], c.get('lr'))}/" in c["commands"][0]  # noqa: E731
    return {
        "spec": spec,
        "full_only": not rows and spec is not None and "mini" not in spec.scales,
        "cells": cells,
        "scored": scored,
        "metric": rows[0]["metric"] if comparisons else None,
        "comparisons": comparisons,
        "claims": claims_for(spec, comparisons, rows),
        "heads": head_facts(scored, [r["head"] for r in rows]),
        "smoothed": label_smoothed(cells),
        "equal_compute": compare.equal_compute(scored, ratios),
        "epoch_lead": compare.epoch_lead(scored) if rows and rows[0]["metric"] == "ppl" else [],
        "lowercased": {
            h: {t: {**layout.mean_sd(e["values"]), "n": len(e["values"])} for t, e in by.items()}
            for h, by in lowercased.items()
        },
        "worst_seed": {s: w for s, w in worst.items() if len(w) > 1},
        "misrecorded": sorted({(c["head"], c["seed"]) for c in cells if c.get("commands") and not here(c)}),
    }


def numbers(obj: Dict[str, Any], f: Dict[str, Any]) -> Dict[str, Any]:
    """The derived numbers a table's reading may cite (``TABLE-numbers.json``): what the page computes from the json,
    and the papers' numbers and claims of the table's definition."""
    spec, sweep, rows = f["spec"], obj.get("sweep") or {}, score_rows(obj["rows"])
    bleu, values = (
        getattr(spec, "paper_bleu", None),
        {(r["head"], r["split"]): dict(zip(r["seeds"], r["values"])) for r in rows},
    )

    def comparison(c):
        diffs = [values[(c.head, c.split)][s] - values[(c.baseline, c.split)][s] for s in c.seeds]
        rest = sorted(diffs, key=abs)[:-1]  # without the seed of the largest difference
        out = {"head": c.head, "baseline": c.baseline, "split": c.split, **_paired(c.result), "holm": c.holm}
        out.update(detectable=c.detectable, claim=f["claims"].get((c.head, c.baseline, c.split)), per_seed=diffs)
        return {**out, **({"mean_without_largest": statistics.fmean(rest)} if len(rest) >= 2 else {})}

    def spent(r):
        return {**r, **{k: {**r[k], "diff": _paired(r[k]["diff"])} for k in ("updates", "seconds", "cost") if k in r}}

    out = {
        "paper": getattr(spec, "paper", None) or bleu,
        "paper_costs": getattr(spec, "paper_costs", None),
        "paper_over_softmax": {h: v - bleu["softmax"] for h, v in bleu.items()} if bleu else None,
        "claims": {h: c["relative"] for h, c in (getattr(spec, "paper_claims", None) or {}).items()},
        "tests": {"alpha": ALPHA, "power": POWER} if f["comparisons"] else None,
        "label_smoothing": label_smoothing(f["scored"][0]) if f["scored"] else None,
        "costs_mib": {k: v / 2**20 for k, v in obj["costs"]["budget_bytes"].items()} if obj.get("costs") else None,
        "heads": f["heads"],
        "cap": cap_facts(f["scored"]),
        "comparisons": [comparison(c) for c in f["comparisons"]],
        "equal_compute": [spent(r) for r in f["equal_compute"]],
        "epoch_lead": {r["head"]: {e: _range(d) for e, d in r["epochs"].items()} for r in f["epoch_lead"]},
        "epoch_over_softmax_best": over_softmax_best(f["scored"]),
        "sweep": sweep_facts(f["cells"], sweep) if sweep else None,
        "nll_rates": compare.rates_by_nll(f["cells"], sweep) if sweep and f["smoothed"] else None,
        "cpu_hours": compare.cpu_hours(f["cells"], sweep) if sweep else None,
        "lowercased": f["lowercased"],
        "worst_seed": f["worst_seed"],
    }
    return {k: v for k, v in out.items() if v not in (None, {}, [])}


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
        ("sweep", compare.sweep_table(f["cells"], sweep)),
        ("comparisons", compare.family_table(f["comparisons"], f["metric"], boot, f["claims"] or None)),
        ("equal_compute", compare.equal_compute_table(f["equal_compute"])),
        ("epoch_lead", compare.epoch_lead_table(f["epoch_lead"])),
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


def pilot_numbers(pilot: Dict[str, Any]) -> Dict[str, Any]:
    """The pilot's arms' valid perplexity per epoch and CPU-core-hours, its CPU-core-hours by part, each probe's
    minutes an epoch."""
    arms = {
        a: {"valid_ppl_per_epoch": [2 ** p["loss"] for p in r["curve"]], "cpu_hours": (r.get("cpu_s") or 0.0) / 3600}
        for a, r in pilot["arms"].items()
    }
    hours, spent = (
        {"training": sum(a["cpu_hours"] for a in arms.values())},
        {k: v / 3600 for k, v in (pilot.get("cpu_s") or {}).items()},
    )
    if spent:
        hours.update(scoring=spent["scoring"], probes=spent["probes"], all=sum(spent.values()))
    minutes = {h: p["epoch_s"] / 60 for h, p in (pilot.get("probes") or {}).items() if p.get("epoch_s")}
    return {"arms": arms, "cpu_hours": hours, "epoch_minutes": minutes}


def pilot_section(docs_dir: str) -> str:
    """The lm-ptb pilot (``lm-ptb-pilot.json``, :mod:`recipes.reproduce.studies.lm_pilot`): each arm's valid / test
    perplexity, per epoch and its CPU time; the pilot's CPU time; the probes' epoch costs; the decision; or ""."""
    pilot = result_files.load_json(os.path.join(docs_dir, "reproduction", "lm-ptb-pilot.json"))
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
    return "\n".join(lines + reading(os.path.join(docs_dir, "reproduction"), "lm-ptb-pilot", len(pilot["arms"])))


def protocols_numbers(obj: Dict[str, Any]) -> List[Dict[str, Any]]:
    """The protocol study's paired per-seed differences of perplexity, the test ones a Holm family (valid chose each
    run's checkpoint: described only)."""
    by, out = {(c["protocol"], c["seed"]): c["ppl"] for c in obj["cells"]}, []
    for label, (ta, sa), (tb, sb) in PROTOCOL_PAIRS:
        for split in ("valid", "test"):
            seeds = sorted(s for (t, s) in by if t == ta and (tb, s) in by)
            a, b = [by[(ta, s)][sa][split] for s in seeds], [by[(tb, s)][sb][split] for s in seeds]
            diffs = {"per_seed": [x - y for x, y in zip(a, b)]}
            out += [{"comparison": label, "split": split, **_paired(paired(a, b)), **diffs}] if seeds else []
    tests = [d for d in out if d["split"] == "test"]
    for d, p in zip(tests, holm([d["p"] for d in tests])):
        d["holm"] = p
    return out


def protocols_section(obj: Dict[str, Any], out_dir: str = "") -> str:
    """The papers' training protocol against fairseq's blocks (``python -m recipes.reproduce.studies.protocols``): the
    perplexity of every (trained on, scored) pair, and the paired per-seed differences."""
    from recipes.reproduce.studies import protocols

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


def train_split(cell: Dict[str, Any]) -> bool:
    """Whether a cell trained on a corpus's train split (as opposed to the earlier mini protocol's valid text)."""
    return cell.get("data") == "train.txt"


def cells_to_train(obj: Dict[str, Any]) -> tuple:
    """``(cells, CPU-core-hours)``: the planned seed cells not finished, their cost estimated from each head's finished
    cells at its chosen rate (a head with none yet counts its cells, not their hours)."""
    chosen, cells, hours = chosen_cells(obj), 0, 0.0
    for head, planned in obj["seeds_planned"].items():
        mine = [c for c in chosen if c["head"] == head]
        cells += max(0, planned - len(mine))
        hours += max(0, planned - len(mine)) * sum(map(compare.cell_cpu_hours, mine)) / len(mine) if mine else 0.0
    return cells, hours


def compute_numbers(objs: Dict[str, Dict[str, Any]], pilot, aside) -> Dict[str, Any]:
    """Training CPU-core-hours: of the tables run with the stopping rule and a rate per head (per table; the cells
    set aside; in all), and of the plan that retrains the language-model tables on the train splits (per part)."""
    aside = list((aside or {}).values())
    swept = {
        t: {**o, "cells": [c for c in o.get("cells", []) if not train_split(c)]}
        for t, o in objs.items()
        if o.get("sweep")
    }
    tables = {
        t: {**compare.cpu_hours(o["cells"], o["sweep"]), "cells": len(o["cells"]), "chosen_cells": len(chosen_cells(o))}
        for t, o in swept.items()
        if o["cells"]
    }
    earlier = [e for e in aside if e.get("plan") != TRAIN_SPLIT_PLAN]
    kept, wall = sum(t["total"] for t in tables.values()), sum(t["wall"] for t in tables.values())
    total, wall = kept + sum(e["total"] for e in earlier), wall + sum(e["wall"] for e in earlier)
    arms = list((pilot or {}).get("arms", {}).values())
    parts = (
        [{"name": "lm-ptb pilot", "cells": len(arms), "hours": sum(a.get("cpu_s") or 0.0 for a in arms) / 3600}]
        if arms
        else []
    )
    for t, o in objs.items():  # a cell without its CPU time counts its training seconds times its threads
        mine = [c for c in o.get("cells", []) if train_split(c)]
        parts += [{"name": t, "cells": len(mine), "hours": sum(map(compare.cell_cpu_hours, mine))}] if mine else []
    parts += [
        {"name": f"{e['table']}, set aside: {e['reason']}", "cells": e["cells"], "hours": e["total"]}
        for e in aside
        if e not in earlier
    ]
    left = {t: dict(zip(("cells", "hours"), cells_to_train(o))) for t, o in objs.items() if o.get("seeds_planned")}
    left, spent = {t: v for t, v in left.items() if v["cells"]}, sum(p["hours"] for p in parts)
    return {
        "tables": tables,
        "earlier": {"aside": earlier, "kept": kept, "aside_total": total - kept, "total": total, "wall": wall}
        if tables
        else None,
        "train_splits": {
            "parts": parts,
            "left": left,
            "total": spent,
            "projected": spent + sum(v["hours"] for v in left.values()),
        }
        if parts
        else None,
        "not_started": [
            t for t in TRAIN_SPLIT_TABLES if t in objs and not any(map(train_split, objs[t].get("cells", [])))
        ],
    }


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
