"""The bottleneck map's page: its README.md (and its json, its derived numbers and its plots) from the cells of
``python -m studies.bottleneck_map``.

    python -m studies.bottleneck_map.report --results results/bottleneck_map    # collect the cells, write the page
    python -m studies.bottleneck_map.report --no-collect                        # the page from the committed json

With ``--joint DIR`` (default ``results/bottleneck_joint``, read when it exists) the page also holds the joint-training
check of ``python -m studies.bottleneck_map.joint``; with ``--upgrade DIR`` the head-upgrade table of ``python -m
studies.head_upgrade.table``, and with ``--upgrade-cap DIR`` its cap check (the same command with a higher
``--max-epochs`` on seed 1). A collection keeps what the committed json holds and this machine has no folder for
(:func:`studies.bottleneck_map.analysis.carry_over`), and sets the map cells of an earlier trunk aside. The page: its
main table, the reading written by hand beside it (``reading.md``, first line ``<!-- cells: N -->``,
with a note when the page's finished cells are no longer N), the other tables, plots and commands
(:mod:`studies.bottleneck_map.page`); beside it, the numbers the reading cites beyond the json
(``studies/bottleneck_map/records/bottleneck_map-numbers.json``, beside the page's json).
"""

from __future__ import annotations

import argparse
import json
import math
import os
from typing import Dict

from studies.bottleneck_map import analysis as ba
from studies.bottleneck_map import page as bp
from recipes.common import stats as paired_stats
from recipes.common.reading import written_reading

READING = "reading.md"  # the page's hand-written reading, beside the page (when there is one)
PAGE = "README.md"  # the page, in the study's folder (GitHub shows it there)
HOME = os.path.dirname(ba.RECORDS)  # the study's folder, relative to the checkout's root
NUMBERS = "bottleneck_map-numbers.json"  # the numbers the reading cites beyond the json, beside the json
#: the formats the page's tables write numbers in (the reading's number check reads its numbers in these)
FORMATS = ("{:.4f}".format, "{:.3f}".format, "{:,.2f}".format, "{:.1f}".format, "{:,.0f}".format, paired_stats.format_p)
#: the numbers the reading may write that are no json value as the page formats it (at most ten), each with its reason;
#: none: every number it cites is in the page json or its derived numbers
READING_EXCEPTIONS: tuple = ()


def page(obj: Dict, png: str, draw: bool = False, source: str = os.path.relpath(ba.PAGE_JSON, HOME)) -> str:
    """The page's markdown from the collected json ``obj`` (linked as ``source``, relative to the page) and the reading
    beside ``png`` (:data:`READING`): its main table (test perplexity per head and d; before any map cell, the rate
    search) first, the reading, the other tables and the commands; with ``draw``, also its plots (at ``png``), from the
    rows and fits the page prints."""
    full, (obj, diverged) = obj, ba.finite(obj)  # full: every cell, the diverged ones too (what the cost counts)
    rows, slopes, missing = ba.paired_rows(obj), ba.slope_test(obj), {h for h, _, _ in ba.missing_cells(full)}
    if draw and obj["cells"]:
        bp.plot(obj, rows, slopes, png, {r["head"] for r in slopes if {r["head"], "softmax"} & missing})
    lines = ["# Does breaking the softmax bottleneck pay, and where? A map over the head's input width", ""]
    source = f"from [bottleneck_map.json]({source}) by `python -m studies.bottleneck_map.report`"
    if obj["cells"]:
        caption = (
            "Test perplexity, mean ± sd over seeds (seeds); cap k: k ended by the epoch cap; diverged k: k left out"
        )
        lines += [f"{caption}; {source}.", ""]
        mark = lambda mine: f" cap {n}" if (n := ba.capped(obj, mine)) else ""  # noqa: E731
        lines += bp.table(obj, lambda c: math.exp(c["test_nll"]), mark=mark, diverged=diverged)
    else:  # the rate cells so far: no map yet
        rates = bp.rate_table(obj)[2:]
        lines += [f"{rates[0]} The rate search so far, {source}."] + rates[1:]
    if reading := written_reading(os.path.join(os.path.dirname(png), READING), ba.page_cells(full)):
        lines += ["## Reading", "", reading, ""]
    lines += bp.map_tables(obj, rows, slopes, png) if obj["cells"] else []
    lines += bp.joint_table(obj) + bp.set_aside_table(obj) + bp.upgrade_section(obj.get("upgrade") or {})
    return "\n".join(lines + bp.cap_section(obj) + bp.commands_section(obj) + bp.cpu_tables(obj, full))


def main(argv=None, log=print) -> str:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--results", default="results/bottleneck_map", help="where python -m studies.bottleneck_map ran")
    p.add_argument("--docs", default=HOME, help="the folder of the page (README.md), its plots and its reading")
    p.add_argument(
        "--records",
        default=os.path.dirname(ba.PAGE_JSON),
        help="the folder of the page's committed json and its derived numbers (what --restore reads)",
    )
    p.add_argument("--joint", default=os.path.join("results", "bottleneck_joint"), help="where bottleneck_joint ran")
    p.add_argument("--upgrade", default=os.path.join("results", "upgrade_table"), help="where upgrade_table ran")
    cap = "where the upgrade table's cap check ran (studies.head_upgrade.table with a higher --max-epochs, seed 1)"
    p.add_argument("--upgrade-cap", default=os.path.join("results", "upgrade_cap"), help=cap)
    p.add_argument("--no-collect", action="store_true", help="only rebuild the page from the committed json")
    args = p.parse_args(argv)
    path = os.path.join(args.records, "bottleneck_map.json")
    os.makedirs(args.records, exist_ok=True)
    if not args.no_collect:
        given = zip(ba.PARTS, (args.joint, args.upgrade, args.upgrade_cap))
        folders = {part: folder for part, folder in given if os.path.isdir(folder)}
        obj = ba.collect(
            args.results, *(folders.get(part, "") for part in ba.PARTS)
        )  # a failed one leaves the file whole
        if os.path.exists(path):
            with open(path) as f:
                obj = ba.carry_over(obj, json.load(f), set(folders))
        with open(path, "w") as f:
            json.dump(obj, f, indent=1)
        log(f"collected {path}")
    with open(path) as f:
        obj = json.load(f)
    png = os.path.join(args.docs, "bottleneck_map.png")
    text = page(obj, png, draw=True, source=os.path.relpath(path, args.docs))
    written = ((args.docs, PAGE, text), (args.records, NUMBERS, json.dumps(ba.numbers(obj), indent=1)))
    for folder, name, content in written:
        with open(os.path.join(folder, name), "w") as f:
            f.write(content + "\n")
    log(f"wrote {os.path.join(args.docs, PAGE)} and {os.path.join(args.records, NUMBERS)}")
    return text


if __name__ == "__main__":
    from hf_heads.cli.runner import run

    run(main)
