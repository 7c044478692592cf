"""What every reproduced table does: resolve its heads, prepare data, run each (head, seed) cell once (resumable,
also from committed cells), measure the cost columns, and write the results rows.

A table subclasses :class:`Table` and gives its data (:meth:`Table.prepare`), one cell (:meth:`Table.run_cell`,
a record with ``record[metric] = {split: value}``), its full-size plan (:meth:`Table.plan`), the paper's numbers
(:meth:`Table.paper_for`), and the settings a finished cell is kept under (:meth:`Table.cell_config`).
"""
from __future__ import annotations

import os
import shutil
from typing import Any, Dict, List, Optional, Sequence

from recipes.reproduce import results as R
from recipes.reproduce.runner import ROOT, Runner, parse_train_wall, parse_valid_curve
from recipes.reproduce.variants import Variant

DOCS = os.path.join(ROOT, "docs")
#: the default --out, made absolute as the command line makes it
DEFAULT_OUT = os.path.join(ROOT, "results", "reproduce")


class Table:
    """The shared loop of a reproduced table (see the module's docstring)."""

    name: str
    description: str
    metric: str  # the key of the cell records' scores and the rows' metric: "bleu", "ppl"
    scales = ("mini", "full")
    paper_costs: Dict[str, Dict[str, float]]  # the paper's cost columns per head (see costs.PAPER_KEYS)
    cost_columns = True  # whether the mini scale measures the cost columns (fairseq models: recipes.reproduce.costs)
    cost_batch = 256  # sequences a batch for the same-batch cost columns, as the paper's table (--cost-batch)
    cost_unit = "sentences"  # what a sequence of the table is, for the report

    # -- what a table gives -----------------------------------------------------------------
    def variants(self, args) -> List[Variant]:
        raise NotImplementedError

    def seeds_for(self, variant: Variant, args) -> List[int]:
        raise NotImplementedError

    def prepare(self, runner: Runner, args, table_dir: str) -> Dict[str, Any]:
        raise NotImplementedError

    def plan(self, variants, args, table_dir: str, log=print) -> Dict[str, Any]:
        raise NotImplementedError

    def run_cell(self, runner: Runner, prepared, variant: Variant, seed: int, args, table_dir: str,
                 label: str) -> Dict[str, Any]:
        raise NotImplementedError

    def cell_config(self, variant: Variant, seed: int, args) -> Dict[str, Any]:
        raise NotImplementedError

    def dataset(self, args) -> str:
        raise NotImplementedError

    def paper_for(self, variant: Variant, split: str) -> Optional[float]:
        raise NotImplementedError

    def train_command(self, bin_dir: str, variant: Variant, seed: int, save_dir: str, args) -> List[str]:
        raise NotImplementedError

    def finish_cell(self, table_dir: str, variant: Variant, seed: int, args, scores: Dict[str, float],
                    log_path: str, commands: List[str], remove: Sequence[str] = ()) -> Dict[str, Any]:
        """Keep a finished cell: its settings, ``scores`` (``record[self.metric]``), the valid-loss curve and the
        training time from its log, its commands; then remove its checkpoints (``remove``, those that exist) unless
        ``--keep-checkpoints``."""
        with open(log_path) as f:
            log_text = f.read()
        record = {**self.cell_config(variant, seed, args), "registry_head": variant.head, self.metric: scores,
                  "valid_curve": parse_valid_curve(log_text), "train_wall_s": parse_train_wall(log_text),
                  "commands": commands}
        R.save_json(R.cell_path(table_dir, variant.name, seed), record)
        if not args.keep_checkpoints:
            for path in remove:
                if os.path.isdir(path):
                    shutil.rmtree(path, ignore_errors=True)
                elif os.path.exists(path):
                    os.remove(path)
        return record

    # -- the loop ---------------------------------------------------------------------------
    def start_cell(self, table_dir: str, variant: Variant, seed: int, args, log=print) -> None:
        """Mark the cell's directory with its settings; a directory left by an interrupted run of other settings
        (its checkpoints would resume the wrong model) is cleared first."""
        cell_dir = R.cell_dir(table_dir, variant.name, seed)
        marker = os.path.join(cell_dir, "cell-config.json")
        config = self.cell_config(variant, seed, args)
        previous = R.load_json(marker)
        if previous is not None and R.same_config(previous, config):
            return  # the same settings: an interrupted run resumes
        if previous is not None:
            log(f"{self.name} {variant.name} seed {seed}: {cell_dir} was left by a run of other settings: cleared")
            shutil.rmtree(cell_dir)
        R.save_json(marker, config)

    def finished(self, table_dir: str, variant: Variant, seed: int, args) -> bool:
        record = R.load_cell(table_dir, variant.name, seed)
        return record is not None and R.same_config(record, self.cell_config(variant, seed, args))

    def run(self, args, log=print) -> List[Dict[str, Any]]:
        """Every cell of the table at ``args.scale`` (or the plan, with ``--dry-run``); returns the rows."""
        table_dir = os.path.join(args.out, self.name)
        variants = self.variants(args)
        if args.dry_run:
            return self.plan(variants, args, table_dir, log)
        runner = Runner(table_dir, log=log, progress=not args.quiet)
        prepared = self.prepare(runner, args, table_dir)
        if args.out == DEFAULT_OUT:  # continue from the committed cells of another machine
            R.restore_cells(table_dir, os.path.join(DOCS, "reproduction", f"{self.name}.json"), log)
        # seed 1 of every head first: a run cut short still compares every head
        todo = sorted(((v, s) for v in variants for s in self.seeds_for(v, args)), key=lambda c: c[1])
        for i, (variant, seed) in enumerate(todo, 1):
            label = f"{self.name} cell {i}/{len(todo)} {variant.name} seed {seed}"
            if self.finished(table_dir, variant, seed, args):
                log(f"{label}: done (cells/{variant.name}-seed{seed}.json), skipped")
                continue
            self.start_cell(table_dir, variant, seed, args, log)
            log(f"{label}: training ({os.path.join(R.cell_dir(table_dir, variant.name, seed), 'train.log')})")
            record = self.run_cell(runner, prepared, variant, seed, args, table_dir, label)
            log(f"{label}: {self.metric} " + ", ".join(f"{t} {b:.2f}" for t, b in record[self.metric].items()))
            R.save_json(os.path.join(table_dir, "results.json"), self.rows(table_dir, variants, args))  # so far
        costs = None
        if self.cost_columns and not args.no_costs and args.scale == "mini":
            from recipes.reproduce import costs as C

            costs = C.table_costs(runner, self, prepared, variants, args, table_dir, log)
        rows = self.rows(table_dir, variants, args, costs)
        R.save_json(os.path.join(table_dir, "results.json"), rows)
        return rows

    def command_for(self, split: str, record: Dict[str, Any]) -> str:
        """The command of a finished cell ``record`` that made the scores of ``split`` (default: its first, the
        training command)."""
        return record["commands"][0]

    def rows(self, table_dir: str, variants: Sequence[Variant], args, costs=None) -> List[Dict[str, Any]]:
        """Results rows from the finished cells (and the cost columns, when measured)."""
        rows = []
        for variant in variants:
            records = [R.load_cell(table_dir, variant.name, s) for s in self.seeds_for(variant, args)
                       if self.finished(table_dir, variant, s, args)]
            if not records:
                continue
            for split in records[0][self.metric]:
                rows.append(R.make_row(
                    table=self.name, dataset=self.dataset(args), split=split, head=variant.name,
                    options=variant.options, metric=self.metric, values=[r[self.metric][split] for r in records],
                    seeds=[r["seed"] for r in records], paper=self.paper_for(variant, split), scale=args.scale,
                    command=self.command_for(split, records[0])))
            for metric, cost in (costs or {}).get(variant.name, {}).items():
                rows.append(R.make_row(table=self.name, dataset=self.dataset(args), split="train", head=variant.name,
                                       options=variant.options, metric=metric, values=[cost["ours"]], seeds=[],
                                       paper=cost["paper"], scale=args.scale, command=cost["command"]))
        return rows
