"""The bottleneck map's page: docs/bottleneck_map.md (and its json, its derived numbers and its plots) from the cells
of ``python -m recipes.bottleneck_map``.

    python -m recipes.bottleneck_report --results results/bottleneck_map    # collect the cells, write the page
    python -m recipes.bottleneck_report --no-collect                        # the page from the committed json

With ``--joint DIR`` (default ``results/bottleneck_joint``, read when it exists) the page also holds the joint-training
check of ``python -m recipes.bottleneck_joint``; with ``--upgrade DIR`` the head-upgrade table of ``python -m
recipes.upgrade_table``, and with ``--upgrade-cap DIR`` its cap check (the same command with a higher
``--max-epochs`` on seed 1). A collection keeps what the committed json holds and this machine has no folder for
(:func:`carry_over`), and sets the map cells of an earlier trunk aside. The page: its main table, the reading written
by hand beside it (``docs/bottleneck_map-reading.md``, first line ``<!-- cells: N -->``, with a note when the page's
finished cells are no longer N), the other tables, plots and commands (:mod:`recipes.bottleneck_page`); beside it,
the numbers the reading cites beyond the json (``docs/bottleneck_map-numbers.json``).
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import os
from typing import Dict

from recipes import bottleneck_map, upgrade_table
from recipes import bottleneck_page as bp
from recipes.bottleneck_page import cells_cpu_hours, rate_key, slope_test  # noqa: F401 (the page's statistics here too)
from recipes.common import stats as paired_stats
from recipes.common.reading import written_reading

READING = "bottleneck_map-reading.md"  # the page's hand-written reading, beside the page (when there is one)
NUMBERS = "bottleneck_map-numbers.json"  # the numbers the reading cites beyond the json, beside the page
#: the formats the page's tables write numbers in (the reading's number check reads its numbers in these)
FORMATS = ("{:.4f}".format, "{:.3f}".format, "{:,.2f}".format, "{:.1f}".format, "{:,.0f}".format, paired_stats.format_p)
#: the numbers the reading may write that are no json value as the page formats it (at most ten), each with its reason;
#: none: every number it cites is in the page json or its derived numbers
READING_EXCEPTIONS: tuple = ()


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


def page_cells(obj: Dict) -> int:
    """The page's finished cells: the map's, the joint check's, the upgrade table's and its cap check's (what a
    reading's ``<!-- cells: N -->`` counts)."""
    upgrade = sum(len((obj.get(part) or {}).get("cells") or []) for part in upgrade_table.PAGE_PARTS)
    return len(obj["cells"]) + len(obj.get("joint") or []) + upgrade


def page(obj: Dict, png: str, draw: bool = False) -> str:
    """The page's markdown from the collected json ``obj`` and the reading beside ``png`` (:data:`READING`): its main
    table (test perplexity per head and d; before any map cell, the rate search) first, the reading, the other tables
    and the commands; with ``draw``, also its plots (at ``png``), from the rows and fits the page prints."""
    full, (obj, diverged) = obj, bp.finite(obj)  # full: every cell, the diverged ones too (what the cost counts)
    rows, slopes, missing = bp.paired_rows(obj), bp.slope_test(obj), {h for h, _, _ in bp.missing_cells(full)}
    if draw and obj["cells"]:
        bp.plot(obj, rows, slopes, png, {r["head"] for r in slopes if {r["head"], "softmax"} & missing})
    lines = ["# Does breaking the softmax bottleneck pay, and where? A map over the head's input width", ""]
    source = "from [bottleneck_map.json](bottleneck_map.json) by `python -m recipes.bottleneck_report`"
    if obj["cells"]:
        caption = (
            "Test perplexity, mean ± sd over seeds (seeds); cap k: k ended by the epoch cap; diverged k: k left out"
        )
        lines += [f"{caption}; {source}.", ""]
        mark = lambda mine: f" cap {n}" if (n := bp.capped(obj, mine)) else ""  # noqa: E731
        lines += bp.table(obj, lambda c: math.exp(c["test_nll"]), mark=mark, diverged=diverged)
    else:  # the rate cells so far: no map yet
        rates = bp.rate_table(obj)[2:]
        lines += [f"{rates[0]} The rate search so far, {source}."] + rates[1:]
    if reading := written_reading(os.path.join(os.path.dirname(png), READING), page_cells(full)):
        lines += ["## Reading", "", reading, ""]
    lines += bp.map_tables(obj, rows, slopes, png) if obj["cells"] else []
    lines += bp.joint_table(obj) + bp.set_aside_table(obj) + bp.upgrade_section(obj.get("upgrade") or {})
    return "\n".join(lines + bp.cap_section(obj) + bp.commands_section(obj) + bp.cpu_tables(obj, full))


def main(argv=None, log=print) -> str:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--results", default="results/bottleneck_map", help="where python -m recipes.bottleneck_map ran")
    p.add_argument("--docs", default="docs", help="the folder of bottleneck_map.md / .json / .png")
    p.add_argument("--joint", default=os.path.join("results", "bottleneck_joint"), help="where bottleneck_joint ran")
    p.add_argument("--upgrade", default=os.path.join("results", "upgrade_table"), help="where upgrade_table ran")
    cap = "where the upgrade table's cap check ran (recipes.upgrade_table with a higher --max-epochs, seed 1)"
    p.add_argument("--upgrade-cap", default=os.path.join("results", "upgrade_cap"), help=cap)
    p.add_argument("--no-collect", action="store_true", help="only rebuild the page from the committed json")
    args = p.parse_args(argv)
    path = os.path.join(args.docs, "bottleneck_map.json")
    if not args.no_collect:
        given = zip(PARTS, (args.joint, args.upgrade, args.upgrade_cap))
        folders = {part: folder for part, folder in given if os.path.isdir(folder)}
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
    for name, content in (("bottleneck_map.md", text), (NUMBERS, json.dumps(bp.numbers(obj), indent=1))):
        with open(os.path.join(args.docs, name), "w") as f:
            f.write(content + "\n")
    log(f"wrote {os.path.join(args.docs, 'bottleneck_map.md')} and {NUMBERS}")
    return text


if __name__ == "__main__":
    from hf_heads.cli.runner import run

    run(main)
