"""The bottleneck map's analysis from its json (``records/bottleneck_map.json``): its statistics, the CPU-hours
spent, the collection of the runs' folders into that json, and the numbers its reading cites beyond the json
(:func:`numbers`: ``records/bottleneck_map-numbers.json``). :mod:`studies.bottleneck_map.page` renders them as tables
and plots.

The primary test, fixed before the seed cells ran: for MoS-4 and Mixtape, the seed-paired difference of test NLL (head
minus softmax, same d and seed), averaged over the seeds at each d, regressed on log2 d by least squares: the slope,
its 95% interval and two-sided p (t on the number of d values - 2 degrees of freedom: d is the unit, as the seeds at
one d share the trunk, the test set and the rate), Holm over the two heads (one without 3 d values counts as p = 1).
Per (head, d), the paired differences, Holm over every planned (head, d) pair, those without two seeds yet counting as
p = 1 (one family; the upgrade table's comparisons are another).
"""

from __future__ import annotations

import glob
import json
import math
import os
import statistics
from typing import Dict, List

from hf_heads.heads.mixtape import MixtapeConfig
from studies.bottleneck_map import study as bottleneck_map
from studies.head_upgrade import table as upgrade_table
from recipes.common import runtime
from recipes.common import stats as paired_stats
from recipes.common.reading import rounded

#: the study's committed results (the page's json, its derived numbers), relative to the checkout's root
RECORDS = os.path.join("studies", "bottleneck_map", "records")
#: the page's committed json, where ``--restore`` reads the committed cells (from the checkout's root)
PAGE_JSON = os.path.join(RECORDS, "bottleneck_map.json")
PRIMARY, BASELINE, CONTROLS, NAMES = (
    ("mos-4", "mixtape"),
    "softmax",
    ("softmax", "softmax-mlp"),
    upgrade_table.ROW_NAMES,
)


def by_key(cells: List[Dict]) -> Dict:
    return {(c["head"], c["d"], c["seed"]): c for c in cells}


def rate_key(cell: Dict) -> tuple:
    return cell["head"], cell["d"], cell["lr"]


def carried_rate_cells(obj: Dict) -> List[Dict]:
    """The rate cells that ran on another trunk than ``obj``'s (``--carry-rates``: each marked with its trunk's md5)."""
    md5 = obj["meta"].get("trunk_md5")
    return [c for c in obj["rate_cells"] if c.get("trunk_md5", md5) != md5]


def finite(obj: Dict):
    """``(obj, diverged)``: ``obj`` with only the cells whose valid and test NLL are finite and whose training improved
    on its untrained start (a run that diverges keeps its epoch-0 weights, finite but untrained), and the others."""
    ok = [c for c in obj["cells"] if math.isfinite(c["test_nll"] + c["valid_nll"]) and not c["curve"][0].get("best")]
    return {**obj, "cells": ok}, [c for c in obj["cells"] if c not in ok]


def capped(obj: Dict, cells: List[Dict]) -> int:
    """How many of ``cells`` the epoch cap ended, not their stopping rule (best epoch within the last patience)."""
    a = obj["meta"]["args"]
    return sum(bottleneck_map.ended_by(c["curve"], a["max_epochs"], a["patience"]) == "max_epochs" for c in cells)


def planned_order(a: Dict, present) -> List[str]:
    """The heads of ``present`` in the order the run's arguments ``a`` name them (softmax first), any others after."""
    return [h for h in a["heads"] if h in present] + sorted(set(present) - set(a["heads"]))


def missing_cells(obj: Dict) -> List[tuple]:
    """The planned (head, d, seed) cells not finished (a diverged cell has finished)."""
    a, done = obj["meta"]["args"], set(by_key(obj["cells"]))
    planned = [(h, d, s) for s in range(1, a["seeds"] + 1) for d in a["dims"] for h in a["heads"]]
    return [k for k in planned if k not in done]


def with_holm(rows: List[Dict], planned: int) -> List[Dict]:
    """``rows`` with ``holm``, each ``paired`` p Holm-adjusted over a family of ``planned`` comparisons however many
    have run (the others p = 1), and ``detectable`` (80% power at alpha / family: :func:`paired_stats.detectable`)."""
    family = max(planned, len(rows))
    for row, adjusted in zip(rows, paired_stats.holm([r["paired"].p for r in rows], planned)):
        p = row["paired"]
        row.update(holm=adjusted, detectable=paired_stats.detectable(p.std, p.n, paired_stats.ALPHA / family))
    return rows


def paired_rows(obj: Dict) -> List[Dict]:
    """Every (head, d) against softmax at the same d, seed by seed, on test NLL (``by_seed``: seed -> head - softmax;
    ``capped``: how many of the head's and of softmax's cells the cap ended); Holm over the planned (head, d) pairs."""
    cells, a, rows = by_key(obj["cells"]), obj["meta"]["args"], []
    for head in planned_order(a, {c["head"] for c in obj["cells"]} - {BASELINE}):
        for d in sorted({c["d"] for c in obj["cells"]}):
            seeds = sorted(s for (h, dd, s) in cells if h == head and dd == d and (BASELINE, d, s) in cells)
            if seeds:
                mine, base = ([cells[(h, d, s)] for s in seeds] for h in (head, BASELINE))
                p = paired_stats.paired([c["test_nll"] for c in mine], [c["test_nll"] for c in base])
                by_seed = {s: m["test_nll"] - b["test_nll"] for s, m, b in zip(seeds, mine, base)}
                row = {"head": head, "d": d, "seeds": len(seeds), "paired": p, "by_seed": by_seed}
                rows.append({**row, "capped": (capped(obj, mine), capped(obj, base))})
    return with_holm(rows, len(set(a["heads"]) - {BASELINE}) * len(a["dims"]))


def line_fit(per_d: Dict[int, List[float]]) -> Dict:
    """The least-squares line of ``per_d``'s means on log2 d: slope, 95% t interval, p, df (none under 3 d values)."""
    from scipy import stats

    dims = sorted(per_d)
    x, y = [math.log2(d) for d in dims], [sum(per_d[d]) / len(per_d[d]) for d in dims]
    if len(x) < 3 or len(set(y)) < 2:
        return {"slope": None, "p": None}
    fit = stats.linregress(x, y)
    half = stats.t.ppf(0.975, len(x) - 2) * fit.stderr
    out = {"slope": fit.slope, "low": fit.slope - half, "high": fit.slope + half, "p": fit.pvalue}
    out = {k: float(v) for k, v in out.items()}
    return {**out, "df": len(x) - 2, "intercept": float(fit.intercept), "means": dict(zip(dims, y))}


def slope_test(obj: Dict) -> List[Dict]:
    """The primary test per head of ``PRIMARY`` (:func:`line_fit` of its paired differences per d, and without the
    smallest d), Holm over the two heads, a head without a test counting as p = 1."""
    cells, out = by_key(obj["cells"]), []
    for head in PRIMARY:
        per_d: Dict[int, List[float]] = {}
        for (h, d, s), c in sorted(cells.items()):
            if h == head and (BASELINE, d, s) in cells:
                per_d.setdefault(d, []).append(c["test_nll"] - cells[(BASELINE, d, s)]["test_nll"])
        row = {"head": head, "dims": sorted(per_d), "seeds": sorted({len(v) for v in per_d.values()})}
        row.update(line_fit(per_d))
        if row["slope"] is not None:
            row["without_smallest_d"] = line_fit({d: v for d, v in per_d.items() if d != row["dims"][0]})
        out.append(row)
    for r, adjusted in zip(out, paired_stats.holm([r["p"] for r in out], len(out))):
        r["holm"] = adjusted
    return out


def grid(obj: Dict, value, diverged=()) -> Dict:
    """``{head: {d: [(cell, value(cell)), ...]}}`` over the planned heads and d values (and any others run), cells
    whose value is None left out."""
    a = obj["meta"]["args"]
    heads = planned_order(a, {c["head"] for c in list(obj["cells"]) + list(diverged)})
    out = {h: {d: [] for d in sorted(set(a["dims"]) | {c["d"] for c in obj["cells"]})} for h in heads}
    for c in obj["cells"]:
        if (v := value(c)) is not None:
            out[c["head"]][c["d"]].append((c, v))
    return out


def means(obj: Dict, value) -> Dict:
    """The mean of ``value`` per head and d (None where no cell has one)."""
    mean = lambda x: statistics.fmean(v for _, v in x) if x else None  # noqa: E731
    return {h: {d: mean(x) for d, x in row.items()} for h, row in grid(obj, value).items()}


def cap_reach(obj: Dict) -> List[Dict]:
    """Per head cell the cap ended (softmax's apart): its best valid NLL minus softmax's at the same d and seed
    (``gap``), its mean valid gain per epoch over its last patience + 1 epochs as they ran (``pace``), the epochs that
    pace needs to draw level (``epochs``, a lower bound; None where it is ahead or not gaining)."""
    a, cells, rows = obj["meta"]["args"], by_key(obj["cells"]), []
    span, order = a["patience"] + 1, {h: i for i, h in enumerate(a["heads"])}
    for (head, d, seed), cell in sorted(cells.items(), key=lambda kv: (order.get(kv[0][0], 99), kv[0][1:])):
        base, valid = cells.get((BASELINE, d, seed)), [e["valid_nll"] for e in cell["curve"] if "valid_nll" in e]
        if head == BASELINE or base is None or not capped(obj, [cell]) or len(valid) <= span:
            continue
        gap, pace = cell["valid_nll"] - base["valid_nll"], (valid[-1 - span] - valid[-1]) / span
        epochs = math.ceil(gap / pace) if gap > 0 and pace > 0 else None
        rows.append(dict(head=head, d=d, seed=seed, gap=gap, pace=pace, epochs=epochs, base=capped(obj, [base])))
    return rows


def chosen_rate(obj: Dict, head: str):
    """The head's rate: rates.json's, else, once the whole grid has run, its lowest valid NLL at --rate-d; else None."""
    a = obj["meta"]["args"]
    by_lr = {c["lr"]: c["valid_nll"] for c in obj["rate_cells"] if c["head"] == head and c["d"] == a["rate_d"]}
    if head in obj["rates"] or not set(a["rates"]) <= set(by_lr):
        return obj["rates"].get(head)
    return min(by_lr, key=lambda lr: by_lr[lr] if math.isfinite(by_lr[lr]) else math.inf)


def cells_cpu_hours(obj: Dict, elsewhere=frozenset()) -> float:
    """CPU-hours of the map's cells and rate cells, a chosen rate's cell once (it is also a seed-1 cell, once that has
    been saved; its floor run, measured then, is the seed-1 cell's; a seed-1 cell its rate cell was run again for
    counts apart from it). ``elsewhere``: the rate keys (:func:`rate_key`) whose rate cell another collection counts
    (an earlier trunk's rates carried to a later one): the seed-1 cell copying one counts its floor run alone."""
    copied = {rate_key(c) for c in obj["cells"] if c["seed"] == 1 and not c.get("rate_cell_trained_again")}
    chosen = {(h, obj["meta"]["args"]["rate_d"], lr) for h, lr in obj["rates"].items()} & copied
    carried = carried_rate_cells(obj)  # another trunk's run, never a copy of this trunk's seed-1 cell
    rate_cells = [c for c in obj["rate_cells"] if rate_key(c) not in chosen or c in carried]
    twice = [c for c in obj["cells"] if c["seed"] == 1 and rate_key(c) in chosen & set(elsewhere)]
    spent = sum(map(runtime.cpu_seconds, obj["cells"] + rate_cells))
    return (spent - sum(c["cpu_s"] for c in twice)) / 3600


def set_aside_hours(obj: Dict) -> float:
    """CPU-hours of the earlier trunks' cells (``obj["set_aside"]``), each counted as its own run counted them, less
    the rate cells carried from them to this trunk (counted here)."""
    carried, hours = {rate_key(c): c.get("trunk_md5") for c in carried_rate_cells(obj)}, 0.0
    for e in obj.get("set_aside", []):
        mine = {k for k, md5 in carried.items() if md5 == e.get("trunk_md5")}
        hours += cells_cpu_hours({**e, "meta": {"args": {"rate_d": e["rate_d"]}}}, mine)
    return hours


def cap_cells(obj: Dict) -> List[Dict]:
    return (obj.get("upgrade_cap") or {}).get("cells") or []


def cost(obj: Dict) -> List[Dict]:
    """CPU-hours spent per part (``obj`` with every cell, the diverged too): the map's cells and rate cells, the earlier
    trunks' set aside, the joint check, the upgrade table's pilot, cells and cap check (a cell run before its whole
    process's CPU time was recorded: its training steps')."""
    aside, joint, up = obj.get("set_aside", []), obj.get("joint") or [], obj.get("upgrade") or {}
    rows = [("the map's cells and rate cells (a chosen rate's cell once)", obj["cells"], obj["rate_cells"])]
    rows += [("earlier trunks' cells, set aside", *([c for e in aside for c in e[k]] for k in ("cells", "rate_cells")))]
    hours = [cells_cpu_hours(obj), set_aside_hours(obj), sum(map(runtime.cpu_seconds, joint)) / 3600]
    rows.append(("the joint check", joint, None))
    for part, cells in (("rate pilot", up.get("pilot")), ("cells", up.get("cells")), ("cap check", cap_cells(obj))):
        hours.append(sum(map(runtime.cpu_seconds, cells or [])) / 3600)
        rows.append((f"the upgrade table's {part}", cells or [], None))
    return [
        {"part": p, "cells": len(c), "rate_cells": r if r is None else len(r), "hours": h}
        for (p, c, r), h in zip(rows, hours)
    ]


def upgrade_pairs(run) -> List[tuple]:
    """The (row, control) comparisons among the rows ``run``: every row against control (a), the heads also against
    control (b), in the table's row order."""
    pairs = [(r, c) for r in upgrade_table.ROWS for c in CONTROLS if r in run and c in run and r != c]
    return [(r, c) for r, c in pairs if not (r in CONTROLS and c == "softmax-mlp")]


def upgrade_rows(up: Dict) -> List[Dict]:
    """The upgrade table's paired test comparisons, seed by seed on test NLL (every row against control (a), the heads
    also against (b)); Holm over every comparison of the rows the run planned (of its pilot, rates or cells)."""
    cells = {(c["row"], c["seed"]): c for c in up.get("cells", [])}
    planned = upgrade_pairs({c["row"] for c in up.get("pilot", []) + up.get("cells", [])} | set(up.get("rates") or {}))
    rows = []
    for row, control in planned:
        if seeds := sorted(s for (r, s) in cells if r == row and (control, s) in cells):
            nll = [[math.log(cells[(r, s)]["after"]["test"]["ppl"]) for s in seeds] for r in (row, control)]
            rows.append({"row": row, "control": control, "seeds": len(seeds), "paired": paired_stats.paired(*nll)})
    return with_holm(rows, len(planned))


def cap_pairs(obj: Dict) -> List[Dict]:
    """The cap check's row-minus-control test NLL differences per seed, at the table's cap and at the check's."""
    ppl = lambda cells: {(c["row"], c["seed"]): c["after"]["test"]["ppl"] for c in cells}  # noqa: E731
    table, checked = ppl((obj.get("upgrade") or {}).get("cells") or []), ppl(cap_cells(obj))
    gap = lambda v, r, c, s: math.log(v[(r, s)] / v[(c, s)]) if (r, s) in v and (c, s) in v else None  # noqa: E731
    keys = [(r, c, s) for r, c in upgrade_pairs({r for r, _ in checked}) for r2, s in sorted(checked) if r2 == r]
    keys = [(r, c, s) for r, c, s in keys if (c, s) in checked]
    return [
        dict(row=r, control=c, seed=s, table=gap(table, r, c, s), cap_check=gap(checked, r, c, s)) for r, c, s in keys
    ]


def joint_rows(obj: Dict) -> List[Dict]:
    """The joint-training cells beside the frozen-trunk cells of the same head, d and seed: test perplexity both ways,
    head minus softmax in test NLL both ways, the joint cell's perplexity over the frozen one's, its CPU minutes."""
    frozen, joint, rows = by_key(obj["cells"]), by_key(obj.get("joint") or []), []
    for (head, d, seed), c in sorted(joint.items(), key=lambda kv: (kv[0][1], kv[0][2], kv[0][0] != BASELINE)):
        f, base, fbase = frozen.get((head, d, seed)), joint.get((BASELINE, d, seed)), frozen.get((BASELINE, d, seed))
        row = {"head": head, "d": d, "seed": seed, "test_ppl": c["ppl"]["test"]}
        row.update(frozen_ppl=f and math.exp(f["test_nll"]), cpu_minutes=c.get("cpu_seconds"))
        row["over_frozen"] = f and c["ppl"]["test"] / row["frozen_ppl"]
        row["diff"] = math.log(c["ppl"]["test"] / base["ppl"]["test"]) if base and head != BASELINE else None
        row["frozen_diff"] = f["test_nll"] - fbase["test_nll"] if f and fbase and head != BASELINE else None
        rows.append({**row, "cpu_minutes": row["cpu_minutes"] and row["cpu_minutes"] / 60})
    return rows


def set_aside_rows(obj: Dict) -> List[Dict]:
    """The earlier trunks' cells beside this trunk's of the same head, d and seed: test perplexity there and here,
    head minus softmax in test NLL on each trunk, and how far it moved between them."""
    here, rows = by_key(obj["cells"]), []

    def diff(cells, key):
        cell, base = cells.get(key), cells.get((BASELINE, *key[1:]))
        return cell["test_nll"] - base["test_nll"] if cell and base and key[0] != BASELINE else None

    for e in obj.get("set_aside", []):
        there = by_key(e["cells"])
        for key in sorted(there, key=lambda k: (k[1], k[2], k[0] != BASELINE, k[0])):
            a, b, mine = diff(there, key), diff(here, key), here.get(key)
            row = {"trunk": e["trunk_md5"], "head": key[0], "d": key[1], "seed": key[2]}
            row.update(there=math.exp(there[key]["test_nll"]), here=mine and math.exp(mine["test_nll"]))
            row.update(diff_there=a, diff_here=b, moved=abs(b - a) if None not in (a, b) else None)
            rows.append(row)
    return rows


def pair_numbers(r: Dict, *names: str) -> Dict:
    """A paired row's numbers: its ``names``, seeds, mean, interval, p, Holm p and detectable difference."""
    p = r["paired"]
    return {**{k: r[k] for k in names + ("seeds", "holm", "detectable")}, **{k: getattr(p, k) for k in PAIRED}}


PAIRED = ("mean", "low", "high", "p")


def map_numbers(obj: Dict) -> Dict:
    """The map's derived numbers: the paired rows with their spread over seeds (and its median), the primary test
    (with its steps from d to d), the cap table's rows, softmax's own cells' test perplexity and spread per d, the
    floors against softmax's, the ranks' means, the first singular value's share, Mixtape's S."""
    a, cells, rows, out = obj["meta"]["args"], obj["cells"], paired_rows(obj), {}
    spread = [max(r["by_seed"].values()) - min(r["by_seed"].values()) for r in rows]
    out["pairs"] = [{**pair_numbers(r, "head", "d", "by_seed"), "spread": s} for r, s in zip(rows, spread)]
    out.update(pair_spread_median=statistics.median(spread) if spread else None, cap_reach=cap_reach(obj))
    out["slopes"] = [{k: v for k, v in s.items() if k not in ("dims", "seeds", "intercept")} for s in slope_test(obj)]
    for s in out["slopes"]:
        m = [s["means"][d] for d in sorted(s.get("means") or {})]
        s["steps"] = [y - x for x, y in zip(m, m[1:])]
    out["softmax"] = {}
    for d in sorted({c["d"] for c in cells if c["head"] == BASELINE}):
        nll = [c["test_nll"] for c in sorted(cells, key=lambda c: c["seed"]) if c["head"] == BASELINE and c["d"] == d]
        out["softmax"][d] = {"test_ppl": [math.exp(v) for v in nll], "spread": max(nll) - min(nll)}
    floors = means(obj, lambda c: c.get("train_nll_floor"))
    base = floors.get(BASELINE, {})
    out["floor_over_softmax"] = {
        h: {d: v - base[d] for d, v in r.items() if v and base.get(d)} for h, r in floors.items()
    }
    rank_at = lambda t: lambda c: c["spectrum"].get("rank_at", {}).get(f"{t:g}")  # noqa: E731
    out["rank"] = {f"{t:g}": means(obj, rank_at(t)) for t in bottleneck_map.RELATIVE_TOLERANCES}
    shares = [c["spectrum"]["first_share"] for c in cells if "first_share" in c["spectrum"]]
    out["first_share"] = [min(shares), max(shares)] if shares else None
    if "mixtape" in a["heads"]:  # Mixtape's rank bound S + d + 2: its S most frequent words have gates of their own
        config = MixtapeConfig(hidden_size=1, vocab_size=obj["meta"]["vocab"], **bottleneck_map.HEADS["mixtape"][1])
        out["mixtape_frequent_words"] = config.num_frequent
    return out


def upgrade_numbers(up: Dict) -> Dict:
    """The upgrade table's: per row its mean test perplexity and inference cost over seeds, its parameters added over
    control (b)'s (and that ratio less 1), the valid NLL its last epoch gained (least and most over seeds); its
    pairs."""
    cells, rows = up.get("cells", []), {}
    base = {c["seed"]: c["head_parameters"] for c in cells if c["row"] == "softmax"}
    added = {c["row"]: c["head_parameters"] - base[c["seed"]] for c in cells if c["seed"] in base}
    for row in [r for r in upgrade_table.ROWS if any(c["row"] == r for c in cells)]:
        mine = [c for c in cells if c["row"] == row]
        gains = [c["curve"][-2]["valid_nll"] - c["curve"][-1]["valid_nll"] for c in mine if len(c["curve"]) > 2]
        rows[row] = {"test_ppl": statistics.fmean(c["after"]["test"]["ppl"] for c in mine)}
        rows[row]["inference_ratio"] = statistics.fmean(c["inference_costs"]["ratio"] for c in mine)
        rows[row]["last_epoch_gain"] = [min(gains), max(gains)] if gains else None
        if added.get("softmax-mlp") and row in added:
            ratio = added[row] / added["softmax-mlp"]
            rows[row].update(added_over_b=ratio, apart_from_b=ratio - 1)
    return {"rows": rows, "pairs": [pair_numbers(r, "row", "control") for r in upgrade_rows(up)]}


def numbers(obj: Dict) -> Dict:
    """The page's derived numbers (``records/bottleneck_map-numbers.json``): what its reading cites that the json
    does not hold as such, from the functions its tables use."""
    (finished, diverged), meta, up = finite(obj), obj["meta"], obj.get("upgrade") or {}
    out = {"alpha": paired_stats.ALPHA, "power": paired_stats.POWER, "cpu_hours": cost(obj)}
    names = [f"{c['head']} d={c['d']} seed {c['seed']}" for c in diverged]
    out["cells"] = {"finished": len(finished["cells"]), "diverged": names, "missing": len(missing_cells(obj))}
    curve, nll = [p["valid_ppl"] for p in meta.get("trunk_curve") or []], meta.get("trunk_nll") or {}
    out["trunk"] = {f"{k}_ppl": math.exp(v) for k, v in nll.items()}
    if len(curve) > 1:
        out["trunk"]["last_epoch_change"] = curve[-1] / curve[-2] - 1
    for e in obj.get("set_aside", []) if nll else []:  # each earlier trunk's valid NLL over this one's
        out.setdefault("earlier_trunks", {})[e["trunk_md5"]] = e["trunk_nll"]["valid"] - nll["valid"]
    for key, present, part in (("map", finished["cells"], map_numbers), ("joint", obj.get("joint"), joint_rows)):
        out.update({key: part(finished)} if present else {})
    out.update({"set_aside": set_aside_rows(finished)} if obj.get("set_aside") else {})
    out.update({"upgrade": upgrade_numbers(up)} if up.get("cells") else {})
    return rounded({**out, "cap_check": cap_pairs(obj)} if cap_cells(obj) else out)


def collect(results: str, joint: str = "", upgrade: str = "", cap: str = "") -> Dict:
    """The committed form of a map run: its meta, rates, rate cells and cells (spectra cut to their d + 10 largest
    singular values: a softmax's end at d + 2, and the tail past it; the measures of the whole spectrum,
    :func:`bottleneck_map.spectrum_measures`, taken first, so cells run before they existed have them), the
    joint-training cells in ``joint``, the head-upgrade table in ``upgrade`` and its cap check in ``cap`` (its table
    cells and options; its rate pilot is the table's) when there are any."""

    def load(path):
        with open(path) as f:
            return json.load(f)

    files = {k: sorted(glob.glob(os.path.join(results, k, "*.json"))) for k in ("cells", "rates")}
    if not files["cells"] and not files["rates"]:
        raise SystemExit(f"{results}: no cells (run python -m studies.bottleneck_map first)")
    meta = load(os.path.join(results, "meta.json"))

    def small(cell):
        cell, top = dict(cell), cell["spectrum"]["top"]
        whole = len(top) == min(cell["spectrum"].get("contexts", 0), meta["vocab"])  # not a restored, cut one
        measures = bottleneck_map.spectrum_measures(top, cell["d"]) if whole else {}
        cell["spectrum"] = {**cell["spectrum"], **measures, "top": top[: cell["d"] + 10]}
        return cell

    cells, rate_cells = ([small(load(p)) for p in files[k]] for k in ("cells", "rates"))
    rates = os.path.join(results, "rates.json")  # written once every head has chosen
    return {
        "meta": meta,
        "rates": load(rates) if os.path.exists(rates) else {},
        "rate_cells": rate_cells,
        "cells": cells,
        "joint": [load(p) for p in sorted(glob.glob(os.path.join(joint, "cells", "*.json")))] if joint else [],
        "upgrade": collect_upgrade(upgrade) if upgrade else {},
        "upgrade_cap": {k: v for k, v in collect_upgrade(cap).items() if k in ("cells", "meta")} if cap else {},
    }


#: the page's parts beside the map, each collected from a folder of its own (or carried over from the committed json)
PARTS = ("joint",) + upgrade_table.PAGE_PARTS


def carry_over(obj: Dict, committed: Dict, collected) -> Dict:
    """``obj`` (a new collection) with what the ``committed`` json holds and this machine's folders do not: each of
    :data:`PARTS` not in ``collected`` (its folder not given: another machine ran it) or collected without a finished
    cell, and, where ``obj`` comes from
    another trunk, the committed map cells set aside (``obj["set_aside"]``: their trunk, rate cells and cells, which
    the page counts in the cost but shows nowhere else)."""
    obj = dict(obj)
    for part in PARTS:  # a folder with no finished cell yet (a run just begun) does not replace committed cells
        if committed.get(part) and (part not in collected or not has_cells(obj.get(part))):
            obj[part] = committed[part]
    set_aside = list(committed.get("set_aside", []))
    old = committed.get("meta") or {}
    if (committed.get("rate_cells") or committed.get("cells")) and not bottleneck_map.same_trunk(old, obj["meta"]):
        carried = {rate_key(c) for c in obj.get("rate_cells", []) if c.get("trunk_md5") == old.get("trunk_md5")}
        set_aside.append(
            {
                "trunk": old.get("trunk"),
                "trunk_md5": old.get("trunk_md5"),
                "trunk_nll": old.get("trunk_nll"),
                "rate_d": old.get("args", {}).get("rate_d"),
                "rates": committed.get("rates", {}),
                # (the rate cells --carry-rates brought over are this collection's, counted there)
                "rate_cells": [c for c in committed.get("rate_cells", []) if rate_key(c) not in carried],
                "cells": committed.get("cells", []),
            }
        )
    if set_aside:
        obj["set_aside"] = set_aside
    return obj


def has_cells(part) -> bool:
    """Whether a collected part (the joint check's list of cells, the upgrade table's or its cap check's dict) holds a
    finished cell."""
    if isinstance(part, list):
        return bool(part)
    return bool(part and (part.get("cells") or part.get("pilot")))


def collect_upgrade(folder: str) -> Dict:
    """``python -m studies.head_upgrade.table``'s pilot and table cells (each named by its row, read back from its
    folder by :func:`studies.head_upgrade.table.row_of`), the rates it chose and the options it ran with (``meta``,
    where recorded)."""

    def cells(stage):
        out = []
        for path in sorted(glob.glob(os.path.join(folder, stage, "*", "results.json"))):
            with open(path) as f:
                cell = json.load(f)
            cell["row"] = upgrade_table.row_of(os.path.dirname(path))
            out.append(cell)
        return out

    def load(name):
        path = os.path.join(folder, name)
        if not os.path.exists(path):
            return {}
        with open(path) as f:
            return json.load(f)

    out = {"rates": load("rates.json"), "pilot": cells("rates"), "cells": cells("cells")}
    meta = load("meta.json")  # the run's options (a run before it recorded them has none)
    return {**out, "meta": meta} if meta else out


def page_cells(obj: Dict) -> int:
    """The page's finished cells: the map's, the joint check's, the upgrade table's and its cap check's (what a
    reading's ``<!-- cells: N -->`` counts)."""
    upgrade = sum(len((obj.get(part) or {}).get("cells") or []) for part in upgrade_table.PAGE_PARTS)
    return len(obj["cells"]) + len(obj.get("joint") or []) + upgrade


def train_ms_per_1k(cell: Dict) -> float:
    """CPU milliseconds per 1k training tokens of a cell's training steps alone (None for a curve without them)."""
    epochs = cell["curve"][1:]
    if not epochs or any("train_cpu_seconds" not in e for e in epochs):
        return None
    return 1e6 * sum(e["train_cpu_seconds"] for e in epochs) / (cell["train_tokens"] * len(epochs))


def log_share(cell: Dict):
    """log10 of the share of the squared singular values past d + 2 among all but the first (None for a cut one)."""
    share = cell["spectrum"].get("beyond_bound_after_first")
    return None if share is None else math.log10(max(share, 1e-300))


def rank_at(tol: float):
    return lambda c: c["spectrum"].get("rank_at", {}).get(f"{tol:g}")
