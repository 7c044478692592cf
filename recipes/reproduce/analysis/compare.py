"""What a table's cells say about its heads: the paired comparisons of a table (:func:`family`: each head against
softmax, per split, over the seeds both have; the test splits' p-values Holm-adjusted together, each with the
difference it detects with 80% power at Holm's first level; the valid split, which chose every rate and checkpoint,
described only), sacrebleu's paired bootstrap (:func:`bootstrap`), each head within softmax's updates and training
seconds (:func:`equal_compute`), the lead per epoch (:func:`epoch_lead`, in bits), the sweep and the compute spent;
and their markdown tables."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from recipes.common import runtime, stats
from recipes.common.stats import ALPHA, POWER
from recipes.reproduce.engine import sweep as sweep_rules

#: the comparisons of a table beside "each head against softmax": (head, baseline)
EXTRA_PAIRS = (("mixtape-unscaled", "mixtape"),)
#: sacrebleu's paired bootstrap: resamplings of a test set per comparison and seed
BOOTSTRAP = 1000
#: the size-matched softmax row: every head with a context projection (MoS, Mixtape) is also read against it
MATCHED = "softmax-matched"


def is_test(split: str) -> bool:
    """Whether a split is a test split (scored once, chose nothing), as opposed to the valid split."""
    return "valid" not in split


@dataclass
class Comparison:
    """``head`` against ``baseline`` on ``split`` over ``seeds`` (head minus baseline)."""

    head: str
    baseline: str
    split: str
    seeds: List[int]
    result: stats.Paired
    holm: Optional[float] = None  # Holm-adjusted p within the table's test family (None: valid, or untestable)
    detectable: Optional[float] = None  # smallest difference the test detects with 80% power at 0.05 / m
    planned: Optional[int] = None  # the seeds the two heads were to share, fixed before the runs (None: not fixed)


def _score_rows(rows):
    return [r for r in rows if r["metric"] in ("bleu", "ppl")]


def _pairs(heads: Sequence[str]) -> List[Tuple[str, str]]:
    """The (head, baseline) comparisons of a table with these heads: each against softmax, :data:`EXTRA_PAIRS`, and
    the mixtures against :data:`MATCHED` where the table has it."""
    pairs = [(h, "softmax") for h in heads if h != "softmax"] + [p for p in EXTRA_PAIRS if set(p) <= set(heads)]
    if MATCHED in heads:
        pairs += [(h, MATCHED) for h in heads if h.startswith(("mos", "mixtape"))]
    return pairs


def family(rows: Sequence[Mapping[str, Any]], planned: Optional[Mapping[str, int]] = None) -> List[Comparison]:
    """Every head against softmax (and :data:`EXTRA_PAIRS`, and the mixtures against :data:`MATCHED`) per split, paired
    by seed; the test splits' comparisons Holm-adjusted together, the valid split's described only.

    ``planned`` (``{head: seeds}``, fixed before the runs) fixes the family too: its ``m`` counts every test comparison
    of the planned heads that will have two seeds or more, those not yet testable entering Holm as p = 1, so a
    comparison's adjusted p and detectable difference do not shrink while others wait for their seeds."""
    rows = _score_rows(rows)
    by = {(r["head"], r["split"]): dict(zip(r["seeds"], r["values"])) for r in rows}
    heads = list(dict.fromkeys(r["head"] for r in rows))
    splits = list(dict.fromkeys(r["split"] for r in rows))
    out = []
    for head, base in _pairs(heads):
        for split in splits:
            a, b = by.get((head, split)), by.get((base, split))
            if not a or not b:
                continue
            seeds = sorted(set(a) & set(b))
            if seeds:
                c = Comparison(head, base, split, seeds, stats.paired([a[s] for s in seeds], [b[s] for s in seeds]))
                if planned and head in planned and base in planned:
                    c.planned = min(planned[head], planned[base])
                out.append(c)
    tested = [c for c in out if is_test(c.split)]
    size = sum(c.result.p is not None for c in tested)
    if planned:
        will_test = [(h, b) for h, b in _pairs(list(planned)) if min(planned[h], planned[b]) >= 2]
        size = max(size, len(will_test) * sum(is_test(s) for s in splits))
    for c, p in zip(tested, stats.holm([c.result.p for c in tested], size)):
        c.holm = p
        c.detectable = stats.detectable(c.result.std, c.result.n, ALPHA / size, POWER) if size else None
    return out


def bootstrap(
    heads_hyps: Mapping[str, Mapping[int, Mapping[str, Sequence[str]]]],
    references: Mapping[str, Sequence[str]],
    scores: Mapping[str, Mapping[int, Mapping[str, float]]],
    samples: int = BOOTSTRAP,
) -> List[Dict[str, Any]]:
    """sacrebleu's paired bootstrap of every head against softmax (and :data:`EXTRA_PAIRS`), per seed and test
    set: ``[{"head", "baseline", "seed", "split", "delta" (BLEU difference), "p"}]``. ``heads_hyps[head][seed]
    [testset]``: the hypotheses; ``scores``: the cells' BLEU, same keys."""
    pairs = [(h, "softmax") for h in heads_hyps if h != "softmax"] + [
        p for p in EXTRA_PAIRS if set(p) <= set(heads_hyps)
    ]
    out = []
    for head, base in pairs:
        if base not in heads_hyps:
            continue
        for seed in sorted(set(heads_hyps[head]) & set(heads_hyps[base])):
            for split, refs in references.items():
                a, b = heads_hyps[head][seed].get(split), heads_hyps[base][seed].get(split)
                if a is None or b is None:
                    continue
                out.append(
                    {
                        "head": head,
                        "baseline": base,
                        "seed": seed,
                        "split": split,
                        "delta": round(scores[head][seed][split] - scores[base][seed][split], 2),
                        "p": stats.paired_bootstrap_p(b, a, refs, samples),
                    }
                )
    return out


def paired_with_softmax(cells: Sequence[Mapping[str, Any]], keys) -> List[Tuple[str, List[int]]]:
    """``[(head, seeds)]`` for every head of ``cells`` but softmax, in their order: the seeds (sorted) at which both
    the head and softmax are among ``keys`` (``(head, seed)`` pairs); a head with none is left out."""
    out = []
    for head in dict.fromkeys(c["head"] for c in cells if c["head"] != "softmax"):
        seeds = sorted(s for (h, s) in keys if h == head and ("softmax", s) in keys)
        if seeds:
            out.append((head, seeds))
    return out


def equal_compute(
    cells: Sequence[Mapping[str, Any]], cost_ratio: Optional[Mapping[str, float]] = None
) -> List[Dict[str, Any]]:
    """Per head (the seeds it shares with softmax; cells at the chosen rates): the head's lowest valid NLL within
    the updates, and within the training seconds, that softmax's cell of the same seed took to its stop, minus
    softmax's lowest (paired per seed; seeds where the head had not validated yet are counted apart), and the
    head's own seconds to its best (the scored checkpoint). The NLL, not the training loss: a label-smoothed loss
    also rewards the probability a head leaves on every word, and a mixture's tail (a sum of softmaxes) holds more
    of it than one softmax's; without label smoothing (the LM tables) the two are one. With ``cost_ratio``
    (``{head: seconds of one update / softmax's}``, measured in one quiet benchmark process), also ``"cost"``:
    within softmax's updates divided by the head's ratio, the same bill without the noise of seconds logged on a
    shared machine. The seconds are CPU seconds
    (:func:`cpu_curve`; ``"clock": "cpu"``) when every cell recorded its CPU time, else the logged wall-clock
    (``"wall"``)."""
    logged = [c for c in cells if c.get("curve")]
    curves, clock = on_one_clock(logged)
    by = {
        (c["head"], c["seed"]): {**c, "curve": p, "best": sweep_rules.best_point(p)} if clock == "cpu" else c
        for c, p in zip(logged, curves)
    }
    out = []
    for head, seeds in paired_with_softmax(cells, by):
        row: Dict[str, Any] = {"head": head, "seeds": len(seeds), "clock": clock}
        ratio = (cost_ratio or {}).get(head)
        lowest = {s: min(sweep_rules.nll(p) for p in by[("softmax", s)]["curve"]) for s in seeds}  # softmax's, per seed
        for key in ("updates", "seconds") + (("cost",) if ratio else ()):
            budgets, diffs = [], []
            measure = "updates" if key == "cost" else key  # the curve's axis the budget is counted on
            for s in seeds:
                base = by[("softmax", s)]
                budget = base["curve"][-1].get(measure)
                if budget is None:
                    continue
                budgets.append(budget)
                if key == "cost":
                    budget /= ratio  # the updates the head affords for softmax's bill
                reached = sweep_rules.within(
                    by[(head, s)]["curve"], measure, budget, sweep_rules.nll
                )  # read as `lowest` is
                diffs.append(None if reached is None else reached - lowest[s])
            known = [d for d in diffs if d is not None]
            row[key] = {
                "softmax": sum(budgets) / len(budgets) if budgets else None,
                "diff": stats.paired(known, [0.0] * len(known)) if known else None,
                "missing": len(diffs) - len(known),
                **({"ratio": ratio} if key == "cost" else {}),
            }
        own = [by[(head, s)]["best"].get("seconds") for s in seeds]
        own = [o for o in own if o is not None]
        row["head_seconds_to_best"] = sum(own) / len(own) if own else None
        out.append(row)
    return out


def epoch_lead(cells: Sequence[Mapping[str, Any]]) -> List[Dict[str, Any]]:
    """Per head (cells at the chosen rates; the seeds it shares with softmax, in seed order): its valid NLL (bits, as
    fairseq logs it) minus softmax's of the same seed at each epoch both logged a validation, ``{"head", "seeds":
    [seed, ...], "epochs": {epoch: [difference per seed]}}``; an epoch enters only where every one of the head's
    paired seeds validated. In NLL, not perplexity: the log of the perplexities' ratio, so a lead of the same relative
    size reads the same early, at high perplexity, and late."""
    valid = {
        (c["head"], c["seed"]): {p["epoch"]: sweep_rules.nll(p) for p in c["curve"] if "epoch" in p}
        for c in cells
        if c.get("curve")
    }
    out = []
    for head, seeds in paired_with_softmax(cells, valid):
        pairs = [(valid[(head, s)], valid[("softmax", s)]) for s in seeds]
        epochs = sorted(set.intersection(*(set(a) & set(b) for a, b in pairs)))
        out.append({"head": head, "seeds": seeds, "epochs": {e: [a[e] - b[e] for a, b in pairs] for e in epochs}})
    return out


def cpu_curve(cell: Mapping[str, Any]) -> Optional[List[Dict[str, Any]]]:
    """A cell's valid-loss curve with its logged training seconds turned into CPU seconds: scaled by the cell's
    CPU time over its last logged second (one factor per cell: the share of a core it had, beside the jobs that ran
    with it, and its validations), or None when its CPU time was not recorded."""
    curve = cell["curve"]
    last = curve[-1].get("seconds") if curve else None
    if cell.get("cpu_s") is None or not last:
        return None
    factor = cell["cpu_s"] / last
    return [{**p, "seconds": p["seconds"] * factor} if p.get("seconds") is not None else dict(p) for p in curve]


def on_one_clock(cells: Sequence[Mapping[str, Any]]) -> Tuple[List[Optional[List[Dict[str, Any]]]], str]:
    """``(each cell's logged curve, clock)``: the curves in CPU seconds (:func:`cpu_curve`, clock ``"cpu"``) when
    every cell with a logged curve recorded its CPU time, else as logged, wall-clock (``"wall"``); None for a cell
    without a logged curve. The clock of the equal-compute table and of the report's valid-loss plot."""
    cpu = [cpu_curve(c) if c.get("curve") else None for c in cells]
    logged = [p for c, p in zip(cells, cpu) if c.get("curve")]
    clock = "cpu" if logged and all(p is not None for p in logged) else "wall"
    return [p if clock == "cpu" else c.get("curve") for c, p in zip(cells, cpu)], clock


def rates_by_nll(cells: Sequence[Mapping[str, Any]], sweep: Mapping[str, Mapping[str, Any]]) -> Dict[str, float]:
    """``{head: rate}`` of the heads whose chosen rate (lowest best valid loss, seed 1) is not the one the NLL of
    the same checkpoints would choose: the choice checked against the metric heads are compared on, for a table
    whose loss is label-smoothed. Heads still sweeping, or trained at another table's rate, are left out."""
    out = {}
    for head, s in sweep.items():
        if s["chosen"] is None or s.get("from"):
            continue
        best = {
            c["lr"]: sweep_rules.nll(c["best"])
            for c in cells
            if c["head"] == head and c["seed"] == 1 and c.get("best") and c.get("lr") in s["rates"]
        }
        if not best:
            continue
        by_nll = sweep_rules.choose_lr(best)
        if by_nll != s["chosen"]:
            out[head] = by_nll
    return out


def cpu_hours(cells: Sequence[Mapping[str, Any]], sweep: Mapping[str, Mapping[str, Any]]) -> Dict[str, float]:
    """Training CPU-core-hours of a table's cells (:func:`recipes.common.runtime.cpu_seconds`): ``{"sweep": rates
    not chosen, "chosen": the chosen rates' cells (seed 1 included), "total", "wall": the part counted from training
    seconds, not measured CPU time}``; scoring excluded."""
    chosen = {h: s["chosen"] for h, s in sweep.items()}
    out = {"sweep": 0.0, "chosen": 0.0, "wall": 0.0}
    for c in cells:
        hours = runtime.cpu_seconds(c) / 3600.0
        out["chosen" if chosen.get(c["head"]) == c.get("lr") else "sweep"] += hours
        if c.get("cpu_s") is None:
            out["wall"] += hours
    out["total"] = out["sweep"] + out["chosen"]
    return out


def hyp_files(
    table_dir: str, cells: Sequence[Mapping[str, Any]], testsets: Sequence[str]
) -> Dict[str, Dict[int, Dict[str, str]]]:
    """``{head: {seed: {testset: path}}}`` of the hypotheses of finished cells under ``table_dir``."""
    from recipes.reproduce.engine import results as result_files

    out: Dict[str, Dict[int, Dict[str, str]]] = {}
    for c in cells:
        cell_dir = result_files.cell_dir(table_dir, c["head"], c["seed"], c.get("lr"))
        for t in testsets:
            path = os.path.join(cell_dir, f"{t}.hyp")
            if os.path.isfile(path):
                out.setdefault(c["head"], {}).setdefault(c["seed"], {})[t] = path
    return out
