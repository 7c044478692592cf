"""What a table's cells say beyond its rows: the facts a section shows and the derived numbers its reading may cite
(``NAME-numbers.json``)."""

from __future__ import annotations

import os
import statistics
from collections import Counter
from typing import Any, Dict, List, Optional, Sequence

from recipes.common import runtime
from recipes.common.reading import rounded
from recipes.common.stats import ALPHA, POWER, holm, paired
from recipes.reproduce import TABLE_MODULES, get_table
from recipes.reproduce.analysis import compare
from recipes.reproduce.analysis.collect import SET_ASIDE, chosen_cells
from recipes.reproduce.engine import results as result_files
from recipes.reproduce.engine.sweep import label_smoothed, nll, rate_key


SCORES = ("bleu", "ppl")


def mean_sd(values: Sequence[float]) -> Dict[str, Optional[float]]:
    """The mean and sample std (None for one value) of a head's seeds."""
    return {"mean": statistics.fmean(values), "std": statistics.stdev(values) if len(values) > 1 else None}


def score_rows(rows: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    return [r for r in rows if r["metric"] in SCORES]


#: the ``plan`` of a set-aside entry (:data:`.collect.SET_ASIDE`) that the train splits' Compute table counts
TRAIN_SPLIT_PLAN = "train-splits"


#: the tables retrained on the train splits (their Compute table says which have not started)
TRAIN_SPLIT_TABLES = ("lm-ptb", "lm-wt2", "lm-gpt2")


#: the protocol study's comparisons: (what, (trained on, scored) minus (trained on, scored))
PROTOCOL_PAIRS = (
    (
        "stateful minus stateless (the same checkpoint, trained on streams)",
        ("streams", "stateful"),
        ("streams", "stateless"),
    ),
    ("trained on streams minus on blocks (each scored as it trained)", ("streams", "stateful"), ("blocks", "blocks")),
)


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
            "scored": sum(any(c.get(m) for m in SCORES) for c in mine),
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
            h: {t: {**mean_sd(e["values"]), "n": len(e["values"])} for t, e in by.items()}
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
        hours += max(0, planned - len(mine)) * sum(map(runtime.cpu_seconds, mine)) / 3600.0 / len(mine) if mine else 0.0
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
        parts += (
            [{"name": t, "cells": len(mine), "hours": sum(map(runtime.cpu_seconds, mine)) / 3600.0}] if mine else []
        )
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


#: two tables whose mini models have the same sizes: how far their cost ratios differ shows the timing noise
TWIN_COST_TABLES = ("mt-en-de", "mt-en-fr")


def timing_gap(objs: Dict[str, Dict[str, Any]]) -> Dict[str, Any]:
    """The largest gap between the cost ratios of :data:`TWIN_COST_TABLES` (same model sizes: a gap is noise), or {}
    until both are measured."""
    a, b = ((objs.get(t) or {}).get("costs") or {} for t in TWIN_COST_TABLES)
    if not a or not b:
        return {}
    gaps = [
        (abs(a["ratios"][h][k] / b["ratios"][h][k] - 1), h, k)
        for h in a["ratios"]
        if h in b["ratios"] and h != "softmax"
        for k in a["ratios"][h]
        if k in b["ratios"][h]
    ]
    gap, head, key = max(gaps)
    return {"gap": gap, "head": head, "key": key, "ratios": [a["ratios"][head][key], b["ratios"][head][key]]}


def load(records_dir: str) -> Dict[str, Any]:
    """The committed json under ``records_dir``: every table's, the lm-ptb pilot's, the cells set aside, the
    protocol studies'."""
    src = records_dir
    objs = {t: result_files.load_json(os.path.join(src, f"{t}.json")) for t in TABLE_MODULES}
    objs = {t: o for t, o in objs.items() if o is not None}
    extra = {n: result_files.load_json(os.path.join(src, n)) for n in ("lm-ptb-pilot.json", SET_ASIDE)}
    return {
        "objs": objs,
        **extra,
        "protocols": {t: result_files.load_json(os.path.join(src, f"{t}-protocols.json")) for t in objs},
    }


def all_numbers(records_dir: str) -> Dict[str, Dict[str, Any]]:
    """``{name: derived numbers}`` of every reading (``NAME-numbers.json`` in ``records_dir``, for
    ``docs/reproduction/NAME-reading.md``), from the committed json alone."""
    data = load(records_dir)
    objs, pilot = data["objs"], data["lm-ptb-pilot.json"]
    out = {"intro": {"alpha": ALPHA, "confidence": 1 - ALPHA, "power": POWER, "bootstrap_samples": compare.BOOTSTRAP}}
    out["compute"] = compute_numbers(objs, pilot, data[SET_ASIDE])
    gap = timing_gap(objs)
    for t, obj in objs.items():
        out[t] = {
            **numbers(obj, table_facts(obj)),
            **({"timing_gap": gap} if gap and t in TWIN_COST_TABLES else {}),
        }
        if data["protocols"][t]:
            out[f"{t}-protocols"] = {"comparisons": protocols_numbers(data["protocols"][t])}
    if pilot and pilot.get("arms"):
        out["lm-ptb-pilot"] = pilot_numbers(pilot)
    return {n: rounded(v) for n, v in out.items()}
