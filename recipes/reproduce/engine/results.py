"""Results of the reproduced tables: one row per (table, dataset, split, head, metric), values per seed.

``OUT/TABLE/results.json`` is a list of rows::

    {"table", "dataset", "split", "head", "options", "metric", "values" (one per seed, in seed order), "seeds",
     "mean", "std" (sample std over seeds; null for one seed), "paper" (the paper's number or null), "scale",
     "command"}

Each finished cell (table, head, seed) is kept in ``OUT/TABLE/cells/HEAD-seedK.json`` (its scores, valid-loss
curve, timings); the rows are rebuilt from the cells, so a rerun skips what is done and a new machine given the
committed cells continues where the last one stopped.
"""

from __future__ import annotations

import json
import os
import statistics
from typing import Any, Dict, Iterable, List, Optional

from hf_heads.core.registry import versioned_options
from recipes.common import runtime
from recipes.common.runtime import claimed, file_md5, load_json, save_json  # noqa: F401 (the engine's names for them)
from recipes.reproduce.engine.runner import located_paths

ROW_KEYS = (
    "table",
    "dataset",
    "split",
    "head",
    "options",
    "metric",
    "values",
    "seeds",
    "mean",
    "std",
    "paper",
    "scale",
    "command",
)


def mean_std(values: List[float]):
    """``(mean, sample std)``; std is None for fewer than two values."""
    if not values:
        return None, None
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else None)


def make_row(**fields) -> Dict[str, Any]:
    """A results row: ``values``/``seeds`` given, ``mean``/``std`` computed; every key of :data:`ROW_KEYS`."""
    values = [float(v) for v in fields["values"]]
    mean, std = mean_std(values)
    row = {k: fields.get(k) for k in ROW_KEYS}
    row.update(values=values, mean=mean, std=std)
    missing = [k for k in ("table", "dataset", "split", "head", "metric", "scale") if row[k] is None]
    if missing:
        raise ValueError(f"results row lacks {', '.join(missing)}: {fields}")
    return row


def cell_name(head: str, seed: int, lr: Optional[float] = None) -> str:
    """``HEAD-seedK``, or ``HEAD-lrRATE-seedK`` for a cell of a learning-rate sweep."""
    return f"{head}-seed{seed}" if lr is None else f"{head}-lr{lr:g}-seed{seed}"


def cell_path(table_dir: str, head: str, seed: int, lr: Optional[float] = None) -> str:
    return os.path.join(table_dir, "cells", cell_name(head, seed, lr) + ".json")


def cell_dir(table_dir: str, head: str, seed: int, lr: Optional[float] = None) -> str:
    """Where a cell trains: its logs, checkpoints and outputs (``HEAD/seedK``, or ``HEAD/lrRATE/seedK``)."""
    return os.path.join(table_dir, head, *([] if lr is None else [f"lr{lr:g}"]), f"seed{seed}")


def load_cell(table_dir: str, head: str, seed: int, lr: Optional[float] = None) -> Optional[Dict[str, Any]]:
    """The finished cell's record, or None."""
    return load_json(cell_path(table_dir, head, seed, lr))


def load_rows(path: str) -> List[Dict[str, Any]]:
    with open(path) as f:
        rows = json.load(f)
    if not isinstance(rows, list) or not all(isinstance(r, dict) and set(ROW_KEYS) <= set(r) for r in rows):
        raise ValueError(f"{path}: not a results list (rows with keys {', '.join(ROW_KEYS)})")
    return rows


def cells(table_dir: str) -> Iterable[Dict[str, Any]]:
    """Every finished cell record of a table, sorted by head then seed."""
    directory = os.path.join(table_dir, "cells")
    if not os.path.isdir(directory):
        return []
    records = []
    for name in sorted(os.listdir(directory)):
        if name.endswith(".json"):
            with open(os.path.join(directory, name)) as f:
                records.append(json.load(f))
    return sorted(records, key=lambda r: (r["head"], r.get("lr") or 0.0, r["seed"]))


#: what must agree for a committed cell to stand for one this run would make
CELL_CONFIG = (
    "table",
    "head",
    "options",
    "seed",
    "scale",
    "updates",
    "bpe_size",
    "limit",
    "models",
    "mini",
    "lr",
    "stop",
)
#: keys a record must have when the run's settings have them (cells of the stopping rule and the sweep)
REQUIRED_CONFIG = ("lr", "stop")


def restore_cells(table_dir: str, committed: str, log=print, wanted=None) -> int:
    """Copy the finished cells of a committed table file (``records/reproduction/TABLE.json``) that ``table_dir``
    lacks into ``table_dir/cells``: a new machine continues where the last one stopped. ``wanted(record)``, when
    given, says which records to bring back (the table's: those made with the settings it runs now, so that the
    cells of a protocol it replaced do not come back to be collected beside the new ones). The results rows and
    sweep entries of the heads whose every committed cell comes back are restored too (``results.json``,
    ``sweep.json``; a head these files already have keeps its own): a run that names some heads then keeps the
    others' in the table it writes. Returns how many cells it restored."""
    if not os.path.isfile(committed):
        return 0
    with open(committed) as f:
        obj = json.load(f)
    records = obj.get("cells", [])
    current = [r for r in records if wanted is None or wanted(r)]  # asked once per record: it parses the head
    heads = {r["head"] for r in current} - {r["head"] for r in records if r not in current}
    chosen = {head: entry["chosen"] for head, entry in (obj.get("sweep") or {}).items()}
    entries = restore_head_entries(table_dir, heads, obj.get("rows") or [], obj.get("sweep") or {})

    def destination(record):
        if "commands" not in record:
            return None
        return cell_path(table_dir, record["head"], record["seed"], record.get("lr"))

    def saved(record):  # its commands located in this run's folder, its committed hypotheses copied back beside it
        lr = record.get("lr")
        names = [cell_name(record["head"], record["seed"], lr)]  # a running sweep's, then a chosen cell's
        if lr is None or chosen.get(record["head"]) == lr:
            names.append(cell_name(record["head"], record["seed"]))
        restore_hypotheses(
            os.path.dirname(committed), record, names, cell_dir(table_dir, record["head"], record["seed"], lr)
        )
        return {**record, "commands": [located_paths(line, record["table"], table_dir) for line in record["commands"]]}

    restored = runtime.restore(current, destination, saved=saved)
    if restored:
        log(f"restored {restored} finished cell(s) from {committed}, with the hypotheses committed beside it")
    if entries:
        log(f"restored the results rows and sweep entries of {', '.join(entries)} from {committed}")
    return restored


def restore_head_entries(
    table_dir: str, heads: Iterable[str], rows: List[Dict[str, Any]], sweep: Dict[str, Any]
) -> List[str]:
    """Add the committed ``rows`` and ``sweep`` entries of ``heads`` to ``table_dir``'s ``results.json`` and
    ``sweep.json`` where those files have none for the head (see :func:`restore_cells`); returns the heads added."""
    rows_path, sweep_path = os.path.join(table_dir, "results.json"), os.path.join(table_dir, "sweep.json")
    local_rows = load_rows(rows_path) if os.path.isfile(rows_path) else []
    local_sweep = load_json(sweep_path) or {}
    have = {r["head"] for r in local_rows}
    new_rows = [r for r in rows if r["head"] in heads and r["head"] not in have]
    new_sweep = {h: e for h, e in sweep.items() if h in heads and h not in local_sweep}
    if new_rows:
        save_json(rows_path, local_rows + new_rows)
    if new_sweep:
        save_json(sweep_path, {**local_sweep, **new_sweep})
    return sorted({r["head"] for r in new_rows} | set(new_sweep))


def restore_hypotheses(reproduction_dir: str, record: Dict[str, Any], names: List[str], directory: str) -> int:
    """Copy a cell's committed hypotheses (``reproduction_dir/hyps/TABLE/NAME.TESTSET.hyp`` for each of ``names``,
    see ``report.commit_hypotheses``) back into its directory as ``TESTSET.hyp``, where the report's paired
    bootstrap reads them. Returns how many it copied."""
    import glob
    import shutil

    copied = 0
    for name in names:
        prefix = name + "."
        for path in glob.glob(os.path.join(reproduction_dir, "hyps", record["table"], glob.escape(prefix) + "*.hyp")):
            os.makedirs(directory, exist_ok=True)
            shutil.copyfile(path, os.path.join(directory, os.path.basename(path)[len(prefix) :]))
            copied += 1
    return copied


def same_config(record: Dict[str, Any], expected: Dict[str, Any]) -> bool:
    """Whether a cell record was made with ``expected``'s settings: the keys of :data:`CELL_CONFIG` that both
    give agree (a record from before a key was kept is judged on the others, except for :data:`REQUIRED_CONFIG`).
    Head options compare as the head reads them: a record's options under the spec version it was made with (1
    before records kept it), so a default changed since counts at its value then."""
    if any(k in expected and k not in record for k in REQUIRED_CONFIG):
        return False
    if "options" in expected and "options" in record:
        head = record.get("registry_head", record["head"])
        if versioned_options(head, record["options"], record.get("spec_version", 1)) != expected["options"]:
            return False
    return all(record[k] == v for k, v in expected.items() if k in CELL_CONFIG and k in record and k != "options")
