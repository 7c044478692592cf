"""Collecting the tables' results into the committed json (``records/reproduction/TABLE.json``), the hypotheses
beside them, the cells a table set aside, and which cells a table reports."""

from __future__ import annotations

import glob
import json
import os
from typing import Any, Dict, List, Optional

from recipes.common import runtime
from recipes.reproduce import TABLE_MODULES, get_table
from recipes.reproduce.analysis import compare as head_comparison
from recipes.reproduce.engine import results as result_files
from recipes.reproduce.engine.runner import canonical_paths, cpu_seconds, parse_train_wall


from recipes.reproduce.engine.table import DOCS, RECORDS  # noqa: F401 (the page's defaults)


def collect(results_dir: str, records_dir: str) -> List[str]:
    """Copy every table's results under ``results_dir`` into ``records_dir/TABLE.json`` (commands with
    :func:`canonical_paths`; each cell's training time read again from its train.log when it is there)."""
    written = []
    for table in TABLE_MODULES:
        table_dir = os.path.join(results_dir, table)
        path = os.path.join(table_dir, "results.json")
        plan_path = os.path.join(table_dir, "plan.json")
        out = os.path.join(records_dir, f"{table}.json")
        sweep_here = result_files.load_json(
            os.path.join(table_dir, "sweep.json")
        )  # written after every cell of a sweep
        if not os.path.isfile(path) and not os.path.isfile(plan_path) and not sweep_here:
            continue
        before = json.load(open(out)) if os.path.isfile(out) else {}
        costs_path = os.path.join(table_dir, "costs.json")
        sweep = sweep_here or before.get("sweep")
        # the committed cost columns stand only for the model they timed: not across a change of mini protocol
        kept = before.get("costs") if bool(before.get("sweep")) == bool(sweep) else None
        costs = json.load(open(costs_path)) if os.path.isfile(costs_path) else kept
        cells = list(result_files.cells(table_dir)) or before.get(
            "cells", []
        )  # whole records: a new machine resumes from them
        for c in cells:
            c["commands"] = [canonical_paths(line, table) for line in c["commands"]]
            log = os.path.join(result_files.cell_dir(table_dir, c["head"], c["seed"], c.get("lr")), "train.log")
            if os.path.isfile(log):  # read again: a record written before a resumed run's every process counted
                with open(log) as f:
                    text = f.read()
                c["train_wall_s"], c["cpu_s"] = parse_train_wall(text), cpu_seconds(log, text)
        # a sweep still running has no rows yet: the committed rows of an earlier protocol do not stand beside it
        rows = result_files.load_rows(path) if os.path.isfile(path) else ([] if sweep_here else before.get("rows", []))
        for r in rows:
            r["command"] = canonical_paths(r["command"], table)
        # the table's own head order (softmax first), not the order in which runs of its heads happened to finish
        order = {h: i for i, h in enumerate(getattr(get_table(table), "mini_heads", None) or [])}
        rows.sort(key=lambda r: order.get(r["head"], len(order)))
        plan = json.load(open(plan_path)) if os.path.isfile(plan_path) else before.get("plan")
        if plan:
            plan["commands"] = [canonical_paths(line, table) for line in plan["commands"]]
        # rows kept from the committed json keep the notes that describe how they ran (a full-size plan alone
        # rewrites only the plan); a table with neither rows nor cells has only the settings it will run with
        fresh = os.path.isfile(path) or sweep_here or not (rows or cells)
        notes = getattr(get_table(table), "report_notes", "") if fresh else before.get("notes")
        obj = {
            "table": table,
            "description": get_table(table).description,
            **({"notes": notes} if notes is not None else {}),
            "rows": rows,
            "cells": cells,
            "costs": costs,
            "plan": plan,
            # a swept table's seeds per head, fixed before the runs: what the report says is still to run
            **(
                {"sweep": sweep, "seeds_planned": {h: get_table(table).mini_seed_count(h) for h in sweep}}
                if sweep
                else {}
            ),
        }
        if sweep and get_table(table).metric == "bleu":
            committed = commit_hypotheses(table_dir, obj, records_dir)
            for key in ("bootstrap", "lowercased"):
                obj[key] = committed.get(key) or before.get(key)
        result_files.save_json(out, obj)
        written.append(out)
    return written


def commit_hypotheses(table_dir: str, obj: Dict[str, Any], records_dir: str) -> Dict[str, Any]:
    """Copy the hypotheses of a translation table's chosen cells to ``records_dir/hyps/TABLE/`` (one file per
    head, seed and test set: ``HEAD-seedK.TESTSET.hyp``) and score them against the run's references:
    ``{"bootstrap": sacrebleu's paired bootstrap records, "lowercased": {head: {testset: {"seeds", "values"}}}}``
    (case-insensitive BLEU, as published Multi30k systems are scored); {} when the run's files are not here. The
    seed-1 cells of a head whose sweep is still running are kept too, under their cell's name
    (``HEAD-lrRATE-seed1.TESTSET.hyp``, :func:`results.cell_name`), until the rate is chosen: the chosen one then
    becomes ``HEAD-seed1`` even when its machine is gone (:func:`results.restore_hypotheses` brings them back)."""
    import shutil

    from recipes.reproduce.data import prepare as data_prep
    from recipes.reproduce.tables.translation import corpus_bleu

    table = get_table(obj["table"])
    testsets = list(data_prep.MULTI30K_TESTS)
    refs_dir = os.path.join(table_dir, "data", "raw")
    if not os.path.isdir(refs_dir):
        return {}
    sweep = obj.get("sweep") or {}
    running = [c for c in obj.get("cells", []) if c["head"] in sweep and sweep[c["head"]]["chosen"] is None]
    out_dir = os.path.join(records_dir, "hyps", obj["table"])
    os.makedirs(out_dir, exist_ok=True)
    for c in running:
        for testset, path in (
            head_comparison.hyp_files(table_dir, [c], testsets).get(c["head"], {}).get(c["seed"], {}).items()
        ):
            shutil.copyfile(
                path, os.path.join(out_dir, f"{result_files.cell_name(c['head'], c['seed'], c['lr'])}.{testset}.hyp")
            )
    for head, entry in sweep.items():  # a chosen head's sweep files are no longer needed
        if entry["chosen"] is not None:
            for path in glob.glob(os.path.join(out_dir, glob.escape(f"{head}-lr") + "*")):
                os.remove(path)
    cells = chosen_cells(obj)
    files = head_comparison.hyp_files(table_dir, cells, testsets)
    hyps: Dict[str, Dict[int, Dict[str, List[str]]]] = {}
    for head, by_seed in files.items():
        for seed, by_set in by_seed.items():
            for testset, path in by_set.items():
                shutil.copyfile(path, os.path.join(out_dir, f"{head}-seed{seed}.{testset}.hyp"))
                hyps.setdefault(head, {}).setdefault(seed, {})[testset] = data_prep.read_lines(path)
    refs = {t: data_prep.read_lines(os.path.join(refs_dir, f"{t}.{table.tgt}")) for t in testsets}
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
    return {"bootstrap": head_comparison.bootstrap(hyps, refs, scores), "lowercased": lowercased}


def chosen_cells(obj: Dict[str, Any]) -> List[Dict[str, Any]]:
    """The cells a table's rows come from: at each head's chosen learning rate (``obj["sweep"]``), or every cell of
    a table without a sweep."""
    chosen = {h: s["chosen"] for h, s in (obj.get("sweep") or {}).items()}
    return [c for c in obj.get("cells", []) if c["head"] not in chosen or c.get("lr") == chosen[c["head"]]]


#: the training compute of cells set aside when a table's mini settings changed, in ``records/reproduction/``:
#: ``{name: {"table", "reason", "cells", "total", "wall"}}`` (:func:`set_aside`); the Compute section counts it
SET_ASIDE = "compute-set-aside.json"


def set_aside(
    cells_dir: str, table: str, reason: str, records_dir: str = RECORDS, plan: Optional[str] = None
) -> Dict[str, Any]:
    """Count the training CPU-core-hours of every cell under ``cells_dir`` (a table's results moved aside when its
    mini settings changed: the new settings train them again) as :func:`recipes.common.runtime.cpu_seconds` counts
    a cell (measured CPU time, else training seconds times threads: one where no record says), and keep the count in
    ``records_dir`` (:data:`SET_ASIDE`) under the directory's name, so the Compute section keeps counting
    what they cost (``plan``: the plan whose Compute table counts them, e.g. the train splits'; None: the earlier
    tables'); returns the entry."""
    threads = {
        os.path.join(result_files.cell_dir(cells_dir, c["head"], c["seed"], c.get("lr")), "train.log"): c.get("threads")
        for c in result_files.cells(cells_dir)
    }
    entry = {
        "table": table,
        **({"plan": plan} if plan else {}),
        "reason": reason,
        "cells": 0,
        "total": 0.0,
        "wall": 0.0,
    }
    for log in sorted(glob.glob(os.path.join(cells_dir, "**", "train.log"), recursive=True)):
        with open(log) as f:
            text = f.read()
        cell = {"cpu_s": cpu_seconds(log, text), "train_wall_s": parse_train_wall(text), "threads": threads.get(log)}
        hours = runtime.cpu_seconds(cell) / 3600.0
        entry["cells"] += 1
        entry["total"] += hours
        entry["wall"] += hours if cell["cpu_s"] is None else 0.0
    if not entry["cells"]:
        raise SystemExit(f"--set-aside {cells_dir}: no cell's train.log under it")
    path = os.path.join(records_dir, SET_ASIDE)
    kept = result_files.load_json(path) or {}
    kept[os.path.basename(os.path.normpath(cells_dir))] = entry
    result_files.save_json(path, kept)
    return entry
