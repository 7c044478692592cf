"""The papers' language-model protocol against fairseq's, on the mini Penn Treebank model.

    python -m recipes.reproduce.pilots.protocols [--seeds 3] [--epochs 5] [--out results/protocols]

For each seed, the mini ``lm-ptb`` softmax cell (``recipes.reproduce.tables.language_model``'s ``MINI_MODEL``, Adam, the
table's data: train.txt trains, valid.txt validates, test.txt tests) is trained twice, the same seed. The committed
study ran before PTB's train split was here, when the first 90% of valid.txt trained and its last 10% validated. It
trains once with fairseq's ``language_modeling`` blocks of 70 tokens (what the mini tables ran then; they now train on
the streams, as the papers do) and once with the papers' streams (``--task awd_language_modeling``: the state carried,
BPTT lengths drawn, the learning rate scaled by them). Each best checkpoint is then scored three ways on valid and test:
fairseq's blocks (batch 10), the papers'
windows from a zero state (``--stateless``), and with the state carried over the split (10 streams valid, 1 test).
Every finished (protocol, seed) is kept in ``OUT/cells``: a rerun continues (an interrupted cell resumes from its
last epoch's checkpoint). Writes ``OUT/protocols.json`` (per-seed
perplexities, the commands) and prints the table; ``--commit`` copies the json to
``records/reproduction/lm-ptb-protocols.json``, which the report shows.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
from types import SimpleNamespace
from typing import Dict, List

from recipes.reproduce.engine import results as result_files
from recipes.reproduce.tables.lm_ptb import TABLE
from recipes.reproduce.engine.runner import Runner, relative_paths, shell_line
from recipes.reproduce.engine.table import RECORDS
from recipes.reproduce.engine.variants import resolve
from recipes.common import data as data_paths

PROTOCOLS = ("blocks", "streams")  # how a cell trains
SCORINGS = ("blocks", "stateless", "stateful")  # how its checkpoint is scored
PPL = re.compile(r"Perplexity: ([\d.]+)")
EPOCHS = 5  # a fixed number of epochs (no early stopping): both protocols train the same


def run_cell(runner: Runner, bin_dir: str, protocol: str, seed: int, args, out: str) -> Dict:
    """Train one (protocol, seed) cell and score its best checkpoint every way; returns its record."""
    cell_dir = os.path.join(out, "cells", f"{protocol}-seed{seed}")
    path = os.path.join(out, "cells", f"{protocol}-seed{seed}.json")
    record = result_files.load_json(path)
    if record is not None and record.get("epochs") == args.epochs:
        return record
    marker = os.path.join(cell_dir, "cell-config.json")
    if result_files.load_json(marker) != {
        "epochs": args.epochs,
        "limit": args.limit,
    }:  # else: fairseq resumes checkpoint_last
        shutil.rmtree(cell_dir, ignore_errors=True)
        result_files.save_json(marker, {"epochs": args.epochs, "limit": args.limit})
    variant = resolve(["softmax"], {})[0]
    table_args = SimpleNamespace(scale="mini", max_epochs=args.epochs, limit=args.limit, patience=0)
    save_dir = os.path.join(cell_dir, "checkpoints")
    train = TABLE.train_command(bin_dir, variant, seed, save_dir, table_args, streams=protocol == "streams")
    label = f"{protocol} seed {seed}"
    runner.run(train, os.path.join(cell_dir, "train.log"), label, comment=f"{label}: train")
    commands = [shell_line(train)]
    ppl: Dict[str, Dict[str, float]] = {}
    for scoring in SCORINGS:
        for split in ("valid", "test"):
            cmd = TABLE.eval_command(bin_dir, os.path.join(save_dir, "checkpoint_best.pt"), split, table_args, scoring)
            found = PPL.findall(
                runner.run(
                    cmd,
                    os.path.join(cell_dir, f"eval-{scoring}-{split}.log"),
                    label,
                    comment=f"{label}: {scoring} {split}",
                )
            )
            if not found:
                raise SystemExit(f"{label}: no perplexity in {cell_dir}/eval-{scoring}-{split}.log")
            ppl.setdefault(scoring, {})[split] = float(found[-1])
            commands.append(shell_line(cmd))
    record = {
        "protocol": protocol,
        "seed": seed,
        "epochs": args.epochs,
        "ppl": ppl,
        "commands": [relative_paths(c) for c in commands],
    }
    result_files.save_json(path, record)
    shutil.rmtree(save_dir, ignore_errors=True)
    return record


def summary(records: List[Dict]) -> List[str]:
    """Markdown lines: mean +- std over seeds of every (protocol, scoring, split), and the paired differences."""
    lines = ["| trained on | scored | valid | test | seeds |", "|---|---|---|---|---|"]
    by = {(r["protocol"], r["seed"]): r for r in records}
    seeds = sorted({r["seed"] for r in records})
    for protocol in PROTOCOLS:
        for scoring in SCORINGS:
            cells = []
            for split in ("valid", "test"):
                values = [by[(protocol, s)]["ppl"][scoring][split] for s in seeds if (protocol, s) in by]
                cells.append(
                    f"{statistics.mean(values):.2f}" + (f" ± {statistics.stdev(values):.2f}" if len(values) > 1 else "")
                    if values
                    else "-"
                )
            n = sum((protocol, s) in by for s in seeds)
            lines.append(f"| {protocol} | {scoring} | {cells[0]} | {cells[1]} | {n} |")
    return lines


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m recipes.reproduce.pilots.protocols", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("--seeds", type=int, default=3, help="seeds per protocol (default 3)")
    p.add_argument("--epochs", type=int, default=EPOCHS, help=f"epochs per cell (default {EPOCHS})")
    data_paths.add_data_option(p)
    p.add_argument("--out", default=os.path.join("results", "protocols"))
    p.add_argument(
        "--commit", action="store_true", help="copy the results to records/reproduction/lm-ptb-protocols.json"
    )
    p.add_argument("--limit", type=int, default=0, help=argparse.SUPPRESS)  # tests: first N lines of every split
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    args = p.parse_args(argv)
    if args.seeds < 1 or args.epochs < 1:
        raise SystemExit(f"--seeds and --epochs must be >= 1, got {args.seeds} and {args.epochs}")
    out = os.path.abspath(args.out)
    runner = Runner(out, progress=not args.quiet)
    prepared = TABLE.prepare(runner, SimpleNamespace(scale="mini", data=args.data, limit=args.limit), out)
    records = [
        run_cell(runner, prepared["bin"], protocol, seed, args, out)
        for seed in range(1, args.seeds + 1)
        for protocol in PROTOCOLS
    ]
    result = {
        "table": "lm-ptb",
        "description": __doc__.split("\n\n")[2].replace("\n", " "),
        "data": "PTB's train split",  # what the cells trained on (the committed study: 90% of valid.txt)
        "cells": records,
    }
    result_files.save_json(os.path.join(out, "protocols.json"), result)
    print("\n".join(summary(records)))
    if args.commit:
        result_files.save_json(os.path.join(RECORDS, "lm-ptb-protocols.json"), result)
    return 0


if __name__ == "__main__":
    from hf_heads.cli.runner import run

    run(main)
