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
import json
import os
from typing import Dict, Optional

from recipes.reproduce import TABLE_MODULES, get_table
from recipes.reproduce.engine import results as result_files
from recipes.reproduce.report.collect import DOCS, collect, SET_ASIDE, set_aside
from recipes.reproduce.report.sentences import timing_noise
from recipes.reproduce.report.sections import (
    INTRO,
    table_section,
    pilot_section,
    protocols_section,
    budget_section,
    train_split_budget,
    TRAIN_SPLIT_PLAN,
)


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
    aside = result_files.load_json(os.path.join(src, SET_ASIDE))
    budget = budget_section(objs, aside)
    if budget:
        sections.append(budget)
    retrained = train_split_budget(objs, result_files.load_json(os.path.join(src, "lm-ptb-pilot.json")), aside)
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
    p.add_argument(
        "--train-splits",
        action="store_true",
        help="--set-aside's cells belong to the plan that retrains the language-model tables on the train splits "
        "(counted in its Compute table, not the earlier plan's)",
    )
    args = p.parse_args(argv)
    if args.set_aside:
        if not (args.table and args.reason):
            p.error("--set-aside needs --table and --reason")
        entry = set_aside(
            args.set_aside, args.table, args.reason, args.docs, plan=TRAIN_SPLIT_PLAN if args.train_splits else None
        )
        print(f"set aside {entry['cells']} cells of {args.table}: {entry['total']:.1f} CPU-core-hours")
    if not args.no_collect:
        for path in collect(args.results, args.docs):
            print(f"collected {path}")
    build_report(args.docs)
    print(f"wrote {os.path.join(args.docs, 'reproduction.md')}")
