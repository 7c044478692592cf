"""What every reproduced table does: resolve its heads, prepare data, run each (head, seed) cell once (resumable,
also from committed cells), measure the cost columns, and write the results rows.

A table subclasses :class:`Table` and gives its data (:meth:`Table.prepare`), one cell (:meth:`Table.run_cell`,
a record with ``record[metric] = {split: value}``), its full-size plan (:meth:`Table.plan`), the paper's numbers
(:meth:`Table.paper_for`), and the settings a finished cell is kept under (:meth:`Table.cell_config`).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import shutil
import textwrap
import warnings
from typing import Any, Dict, List, Optional, Sequence

from hf_heads.core.config import SPEC_VERSION
from recipes.reproduce.engine import results as result_files
from recipes.reproduce.engine import sweep as sweep_rules
from recipes.reproduce.engine.runner import ROOT, Runner, canonical_paths, cpu_seconds, parse_train_wall
from recipes.reproduce.engine.variants import Variant

DOCS = os.path.join(ROOT, "docs")
#: the committed results the reproduction page is made from (``TABLE.json``, the hypotheses, the studies' json)
RECORDS = os.path.join(ROOT, "records", "reproduction")
#: the default --out, made absolute as the command line makes it
DEFAULT_OUT = os.path.join(ROOT, "results", "reproduce")


def torch_threads() -> int:
    """The threads a fairseq run of this machine uses without ``OMP_NUM_THREADS`` (torch's default)."""
    import torch

    return torch.get_num_threads()


class Table:
    """The shared loop of a reproduced table (see the module's docstring)."""

    name: str
    description: str
    metric: str  # the key of the cell records' scores and the rows' metric: "bleu", "ppl"
    scales = ("mini", "full")
    paper_costs: Dict[str, Dict[str, float]]  # the paper's cost columns per head (see costs.PAPER_KEYS)
    cost_columns = True  # whether the mini scale measures the cost columns (fairseq models: engine/costs.py)
    cost_batch = 256  # sequences a batch for the same-batch cost columns, as the paper's table (--cost-batch)
    cost_unit = "sentences"  # what a sequence of the table is, for the report

    # -- what a table gives -----------------------------------------------------------------
    def variants(self, args) -> List[Variant]:
        raise NotImplementedError

    def seeds_for(self, variant: Variant, args) -> List[int]:
        """The seeds of ``variant``'s cells: 1..``--seeds``, else 1..the table's mini count (:meth:`mini_seed_count`) at
        the mini scale and seed 1 at full size."""
        n = args.seeds if args.seeds else (self.mini_seed_count(variant.name) if args.scale == "mini" else 1)
        return list(range(1, n + 1))

    def mini_seed_count(self, head: str) -> int:
        """How many seeds ``head`` trains at the mini scale, fixed before the runs (the table's ``mini_seeds``; 1 for a
        head it does not name)."""
        return getattr(self, "mini_seeds", {}).get(head, 1)

    def prepare(self, runner: Runner, args, table_dir: str) -> Dict[str, Any]:
        raise NotImplementedError

    def plan(self, variants, args, table_dir: str, log=print) -> Dict[str, Any]:
        raise NotImplementedError

    def cell_config(self, variant: Variant, seed: int, args, lr: Optional[float] = None) -> Dict[str, Any]:
        raise NotImplementedError

    def dataset(self, args) -> str:
        raise NotImplementedError

    def paper_for(self, variant: Variant, split: str) -> Optional[float]:
        raise NotImplementedError

    def train_command(
        self, bin_dir: str, variant: Variant, seed: int, save_dir: str, args, lr: Optional[float] = None
    ) -> List[str]:
        raise NotImplementedError

    # -- one cell: train (resumable), then score ----------------------------------------------
    def train_cell(
        self,
        runner: Runner,
        prepared,
        variant: Variant,
        seed: int,
        args,
        table_dir: str,
        label: str,
        lr: Optional[float] = None,
    ) -> Dict[str, Any]:
        """Train one cell (fairseq resumes an interrupted run) and return its record (:meth:`trained_record`)."""
        raise NotImplementedError

    def score_cell(
        self,
        runner: Runner,
        prepared,
        variant: Variant,
        seed: int,
        args,
        table_dir: str,
        label: str,
        record: Dict[str, Any],
    ) -> Dict[str, Any]:
        """Score a trained cell's checkpoint on the table's splits; return ``{split: score}`` and the commands."""
        raise NotImplementedError

    def run_cell(
        self,
        runner: Runner,
        prepared,
        variant: Variant,
        seed: int,
        args,
        table_dir: str,
        label: str,
        lr: Optional[float] = None,
    ) -> Dict[str, Any]:
        """Train (unless trained) and score one cell; returns its finished record."""
        record = self.kept(table_dir, variant, seed, args, lr, "curve")
        if record is None:
            record = self.train_cell(runner, prepared, variant, seed, args, table_dir, label, lr)
        scores, commands = self.score_cell(runner, prepared, variant, seed, args, table_dir, label, record)
        record = {**record, self.metric: scores, "commands": record["commands"] + commands}
        kept = self.kept_checkpoint(table_dir, variant, seed, lr)
        if kept:
            record["checkpoint"] = kept
        result_files.save_json(result_files.cell_path(table_dir, variant.name, seed, lr), record)
        if not args.keep_checkpoints and not kept:
            self.remove_checkpoints(table_dir, variant, seed, lr)
        return record

    #: ``(head, seed)`` of the cell whose best checkpoint another study reads (lm-ptb: the bottleneck map's trunk):
    #: kept after scoring at every rate until the sweep has chosen (the others' then go), named by path and md5
    keep_cell: Optional[tuple] = None

    def kept_checkpoint(self, table_dir: str, variant: Variant, seed: int, lr: Optional[float]) -> Optional[Dict]:
        """``{"path", "md5"}`` of the best checkpoint of the cell :attr:`keep_cell` names, or None."""
        if self.keep_cell != (variant.name, seed):
            return None
        path = os.path.join(self.checkpoint_dir(table_dir, variant, seed, lr), "checkpoint_best.pt")
        if not os.path.isfile(path):
            return None
        return {"path": canonical_paths(path, self.name), "md5": result_files.file_md5(path)}

    def remove_checkpoints(self, table_dir: str, variant: Variant, seed: int, lr: Optional[float] = None) -> None:
        """Remove what a scored cell no longer needs (its checkpoints)."""
        shutil.rmtree(self.checkpoint_dir(table_dir, variant, seed, lr), ignore_errors=True)

    def checkpoint_dir(self, table_dir: str, variant: Variant, seed: int, lr: Optional[float] = None) -> str:
        return os.path.join(result_files.cell_dir(table_dir, variant.name, seed, lr), "checkpoints")

    def trained_record(
        self,
        table_dir: str,
        variant: Variant,
        seed: int,
        args,
        log_path: str,
        commands: List[str],
        lr: Optional[float] = None,
    ) -> Dict[str, Any]:
        """Keep a trained cell: its settings, its curve (:func:`sweep.parse_curve`), its best epoch, why it stopped,
        the training time (wall-clock and CPU), its commands; ``checkpoint_last.pt`` goes (``checkpoint_best.pt``
        stays until scored)."""
        with open(log_path) as f:
            log_text = f.read()
        curve = sweep_rules.parse_curve(log_text)
        record = {
            **self.cell_config(variant, seed, args, lr),
            "registry_head": variant.head,
            "spec_version": SPEC_VERSION,
            "curve": curve,
            "best": sweep_rules.best_point(curve),
            "train_wall_s": parse_train_wall(log_text),
            "cpu_s": cpu_seconds(log_path, log_text),
            "threads": int(os.environ.get("OMP_NUM_THREADS") or torch_threads()),
            "commands": commands,
        }
        rule = self.stop_rule(args)
        if rule is not None:
            record["stopped"] = sweep_rules.stopped(curve, rule) or "max_updates"
        result_files.save_json(result_files.cell_path(table_dir, variant.name, seed, lr), record)
        last = os.path.join(self.checkpoint_dir(table_dir, variant, seed, lr), "checkpoint_last.pt")
        if os.path.exists(last) and not args.keep_checkpoints:
            os.remove(last)
        return record

    #: whether a cell's length is in epochs (the language-model tables: ``--max-epochs``) rather than optimizer
    #: updates (``--max-updates``)
    counts_epochs: bool = False

    # -- the stopping rule and the learning-rate sweep (mini) ------------------------------------
    #: the mini cells' stopping rule (None: a fixed number of updates, as at full size)
    mini_stop: Optional[sweep_rules.StopRule] = None
    #: the centre of a mini table's learning-rate grid, the factor between its rates, and how far it may grow
    mini_lr: Optional[float] = None
    lr_factor: float = 2.0
    max_rates: int = 5

    def stop_rule(self, args) -> Optional[sweep_rules.StopRule]:
        """The stopping rule of this run's cells (``--patience`` / ``--max-epochs`` override the table's), or None
        (full size, or ``--patience 0``: a fixed number of epochs)."""
        if args.scale != "mini" or self.mini_stop is None or getattr(args, "patience", None) == 0:
            return None
        return sweep_rules.StopRule(
            getattr(args, "patience", None) or self.mini_stop.patience,
            getattr(args, "max_epochs", None) or self.mini_stop.max_epochs,
        )

    def mini_config(self, args, lr: Optional[float]) -> Dict[str, Any]:
        """The settings a mini cell of this table adds to its config: its rate (default the grid's centre) and
        its stopping rule."""
        rule = self.stop_rule(args)
        return {"lr": lr or self.mini_lr, "stop": rule.as_dict() if rule else None}

    def sweeps(self, args) -> bool:
        """Whether this run sweeps each head's learning rate (the mini scale of a table with a rate grid)."""
        return args.scale == "mini" and self.mini_lr is not None

    def lr_grid(self, args) -> List[float]:
        return list(getattr(args, "lrs", None) or sweep_rules.grid(self.mini_lr, self.lr_factor))

    def borrowed_rates(self, variants: Sequence[Variant], args) -> Dict[str, float]:
        """``--lr-from TABLE``: ``{head: the rate TABLE's sweep chose}`` from ``OUT/TABLE/sweep.json``; a head TABLE
        has not chosen a rate for is an error naming the command that would."""
        source = args.lr_from
        # a rate the source borrowed itself was not chosen on its valid split; None: its sweep is still running
        chosen = {
            h: s["chosen"]
            for h, s in (result_files.load_json(os.path.join(args.out, source, "sweep.json")) or {}).items()
            if "from" not in s and s["chosen"] is not None
        }
        missing = [v.name for v in variants if v.name not in chosen]
        if missing:
            raise SystemExit(
                f"--lr-from {source}: {os.path.join(args.out, source, 'sweep.json')} has no rate chosen "
                f"for {', '.join(missing)}; run `python -m recipes.reproduce {source} --heads "
                f"{' '.join(missing)} --scale mini --out {args.out}` first"
            )
        return {v.name: chosen[v.name] for v in variants}

    def run_sweep(
        self, runner: Runner, prepared, variants: Sequence[Variant], args, table_dir: str, log=print
    ) -> Dict[str, float]:
        """Seed 1 of every head at every rate of the grid (growing it where the best is at an end, up to
        ``--max-rates``; a grid ``--lrs`` gave grows only with ``--max-rates``), the rate of the lowest best valid
        loss chosen per head; then every seed at the chosen rate, seed by seed, each scored. With ``--lr-from
        TABLE`` there is no sweep: every seed, seed 1 included, trains at the rate TABLE chose for the head.
        Returns ``{head: chosen rate}``; ``sweep.json`` keeps the heads of earlier runs that this one did not name."""
        source = getattr(args, "lr_from", None)
        # a borrowed rate is chosen before any cell trains: its seed 1 is a seed like the others, not a sweep cell
        chosen: Dict[str, float] = self.borrowed_rates(variants, args) if source else {}
        rates = {v.name: [chosen[v.name]] if source else self.lr_grid(args) for v in variants}
        max_rates = (
            1
            if source
            else (getattr(args, "max_rates", None) or (len(args.lrs) if getattr(args, "lrs", None) else self.max_rates))
        )
        sweep_path = os.path.join(table_dir, "sweep.json")

        def save_sweep():  # after every cell: a sweep cut short is committed (and reported) as far as it went
            result_files.save_json(
                sweep_path,
                {
                    **(result_files.load_json(sweep_path) or {}),
                    **{
                        v.name: {
                            "rates": sorted(rates[v.name]),
                            "chosen": chosen.get(v.name),
                            **({"from": source} if source else {}),
                        }
                        for v in variants
                    },
                },
            )

        while len(chosen) < len(variants):
            for v in variants:
                for lr in [] if v.name in chosen else rates[v.name]:
                    self.ensure_trained(runner, prepared, v, 1, args, table_dir, lr, log)
                    save_sweep()
            for v in [v for v in variants if v.name not in chosen]:
                losses = self.sweep_losses(table_dir, v, rates[v.name], args)
                more = sweep_rules.extend_grid(rates[v.name], losses, self.lr_factor, max_rates)
                if more is None:
                    chosen[v.name] = sweep_rules.choose_lr(losses)
                    log(
                        f"{self.name} {v.name}: learning rate {sweep_rules.rate_key(chosen[v.name])} (best valid "
                        "loss of "
                        + ", ".join(f"{sweep_rules.rate_key(lr)}: {loss:.3f}" for lr, loss in sorted(losses.items()))
                        + ")"
                    )
                else:
                    rates[v.name].append(more)
        save_sweep()
        for v in variants:  # checkpoints an older run kept for the choice (its sweep cells were not yet scored)
            for lr in rates[v.name]:
                if lr != chosen[v.name] and not args.keep_checkpoints:
                    self.remove_checkpoints(table_dir, v, 1, lr)
        todo = sorted(((v, s) for v in variants for s in self.seeds_for(v, args)), key=lambda c: c[1])
        for i, (v, seed) in enumerate(todo, 1):
            label = f"{self.name} cell {i}/{len(todo)} {v.name} lr {sweep_rules.rate_key(chosen[v.name])} seed {seed}"
            self.run_or_skip(runner, prepared, v, seed, args, table_dir, label, chosen[v.name], log)
            self.save_rows(table_dir, variants, self.rows(table_dir, variants, args, rates=chosen))
        return chosen

    def ensure_trained(
        self, runner: Runner, prepared, variant: Variant, seed: int, args, table_dir: str, lr: float, log=print
    ) -> Dict[str, Any]:
        """A trained cell's record: the kept one, or a new (or resumed) training run, scored as soon as it is
        trained (the rate is chosen on valid only; scoring at once keeps no checkpoint waiting for the choice, so a
        cell committed from one machine and restored on another, without its checkpoints, is already complete)."""
        record = self.kept(table_dir, variant, seed, args, lr, "curve")
        if record is not None:
            return record
        label = f"{self.name} sweep {variant.name} lr {sweep_rules.rate_key(lr)} seed {seed}"
        self.start_cell(table_dir, variant, seed, args, log, lr)
        log(
            f"{label}: training ({os.path.join(result_files.cell_dir(table_dir, variant.name, seed, lr), 'train.log')})"
        )
        record = self.run_cell(runner, prepared, variant, seed, args, table_dir, label, lr)
        best = record["best"] or {}
        log(
            f"{label}: best valid loss {best.get('loss', float('nan')):.3f} at epoch {best.get('epoch')} "
            f"(stopped: {record.get('stopped')})"
        )
        return record

    def sweep_losses(self, table_dir: str, variant: Variant, rates: Sequence[float], args) -> Dict[float, float]:
        """``{rate: best valid loss}`` of the trained seed-1 cells of ``variant``."""
        out = {}
        for lr in rates:
            record = self.kept(table_dir, variant, 1, args, lr, "curve")
            if record is not None and record.get("best"):
                out[lr] = record["best"]["loss"]
        return out

    # -- the loop ---------------------------------------------------------------------------
    def start_cell(
        self, table_dir: str, variant: Variant, seed: int, args, log=print, lr: Optional[float] = None
    ) -> None:
        """Mark the cell's directory with its settings; a directory left by an interrupted run of other settings
        (its checkpoints would resume the wrong model) is cleared first."""
        cell_dir = result_files.cell_dir(table_dir, variant.name, seed, lr)
        marker = os.path.join(cell_dir, "cell-config.json")
        config = self.cell_config(variant, seed, args, lr)
        previous = result_files.load_json(marker)
        if previous is not None and result_files.same_config(previous, config):
            return  # the same settings: an interrupted run resumes
        if previous is not None:
            log(f"{self.name} {variant.name} seed {seed}: {cell_dir} was left by a run of other settings: cleared")
            shutil.rmtree(cell_dir)
        result_files.save_json(marker, config)

    def kept(
        self, table_dir: str, variant: Variant, seed: int, args, lr: Optional[float], key: str
    ) -> Optional[Dict[str, Any]]:
        """The kept record of a cell made with this run's settings that holds ``key`` (``"curve"``: trained,
        :attr:`metric`: scored), or None."""
        record = result_files.load_cell(table_dir, variant.name, seed, lr)
        if (
            record is None
            or key not in record
            or not result_files.same_config(record, self.cell_config(variant, seed, args, lr))
        ):
            return None
        return record

    def current(self, record: Dict[str, Any], args) -> bool:
        """Whether a cell record was made with the settings this table gives its head now (any head of the table,
        not only those ``args`` names: a table run head by head on several machines keeps every head's cells)."""
        try:
            variant = self.variants(argparse.Namespace(**{**vars(args), "heads": [record["head"]]}))[0]
        except (KeyError, ValueError, SystemExit):  # a head no longer known
            return False
        return result_files.same_config(record, self.cell_config(variant, record["seed"], args, record.get("lr")))

    def finished(self, table_dir: str, variant: Variant, seed: int, args, lr: Optional[float] = None) -> bool:
        return self.kept(table_dir, variant, seed, args, lr, self.metric) is not None

    def run_or_skip(
        self,
        runner: Runner,
        prepared,
        variant: Variant,
        seed: int,
        args,
        table_dir: str,
        label: str,
        lr: Optional[float],
        log=print,
    ) -> None:
        if self.finished(table_dir, variant, seed, args, lr):
            path = result_files.cell_path(table_dir, variant.name, seed, lr)
            log(f"{label}: done ({os.path.relpath(path, table_dir)}), skipped")
            return
        self.start_cell(table_dir, variant, seed, args, log, lr)
        log(
            f"{label}: training ({os.path.join(result_files.cell_dir(table_dir, variant.name, seed, lr), 'train.log')})"
        )
        record = self.run_cell(runner, prepared, variant, seed, args, table_dir, label, lr)
        log(f"{label}: {self.metric} " + ", ".join(f"{t} {b:.2f}" for t, b in record[self.metric].items()))

    def run(self, args, log=print) -> List[Dict[str, Any]]:
        """Every cell of the table at ``args.scale`` (or the plan, with ``--dry-run``); returns the rows."""
        table_dir = os.path.join(args.out, self.name)
        variants = self.variants(args)
        if args.dry_run:
            with quiet_third_party():
                plan = self.plan(variants, args, table_dir, log)
            print(format_plan(plan))
            return plan
        runner = Runner(table_dir, log=log, progress=not args.quiet)
        prepared = self.prepare(runner, args, table_dir)
        if args.out == DEFAULT_OUT:  # continue from the committed cells of another machine
            result_files.restore_cells(
                table_dir,
                os.path.join(RECORDS, f"{self.name}.json"),
                log,
                wanted=lambda record: self.current(record, args),
            )
        rates = None
        if self.sweeps(args):
            rates = self.run_sweep(runner, prepared, variants, args, table_dir, log)
        else:  # seed 1 of every head first: a run cut short still compares every head
            todo = sorted(((v, s) for v in variants for s in self.seeds_for(v, args)), key=lambda c: c[1])
            for i, (variant, seed) in enumerate(todo, 1):
                label = f"{self.name} cell {i}/{len(todo)} {variant.name} seed {seed}"
                self.run_or_skip(runner, prepared, variant, seed, args, table_dir, label, None, log)
                self.save_rows(table_dir, variants, self.rows(table_dir, variants, args))  # so far
        costs = None
        if self.cost_columns and not args.no_costs and args.scale == "mini":
            from recipes.reproduce.engine.costs import table_costs

            costs = table_costs(runner, self, prepared, variants, args, table_dir, log)
        rows = self.rows(table_dir, variants, args, costs, rates)
        self.save_rows(table_dir, variants, rows)
        return rows

    @staticmethod
    def save_rows(table_dir: str, variants: Sequence[Variant], rows: List[Dict[str, Any]]) -> None:
        """Write ``results.json``: this run's rows after the rows of the heads an earlier run named and this one did
        not (a table run head by head, ``--heads A`` then ``--heads B``, keeps both)."""
        path = os.path.join(table_dir, "results.json")
        names = {v.name for v in variants}
        kept = [r for r in (result_files.load_rows(path) if os.path.isfile(path) else []) if r["head"] not in names]
        result_files.save_json(path, kept + rows)

    def command_for(self, split: str, record: Dict[str, Any]) -> str:
        """The command of a finished cell ``record`` that made the scores of ``split`` (default: its first, the
        training command)."""
        return record["commands"][0]

    def rows(
        self, table_dir: str, variants: Sequence[Variant], args, costs=None, rates: Optional[Dict[str, float]] = None
    ) -> List[Dict[str, Any]]:
        """Results rows from the finished cells (at each head's chosen rate, ``rates``), and the cost columns."""
        rows = []
        for variant in variants:
            lr = (rates or {}).get(variant.name)
            records = [
                result_files.load_cell(table_dir, variant.name, s, lr)
                for s in self.seeds_for(variant, args)
                if self.finished(table_dir, variant, s, args, lr)
            ]
            if not records:
                continue
            for split in records[0][self.metric]:
                rows.append(
                    result_files.make_row(
                        table=self.name,
                        dataset=self.dataset(args),
                        split=split,
                        head=variant.name,
                        options=variant.options,
                        metric=self.metric,
                        values=[r[self.metric][split] for r in records],
                        seeds=[r["seed"] for r in records],
                        paper=self.paper_for(variant, split),
                        scale=args.scale,
                        command=self.command_for(split, records[0]),
                    )
                )
            for metric, cost in (costs or {}).get(variant.name, {}).items():
                rows.append(
                    result_files.make_row(
                        table=self.name,
                        dataset=self.dataset(args),
                        split="train",
                        head=variant.name,
                        options=variant.options,
                        metric=metric,
                        values=[cost["ours"]],
                        seeds=[],
                        paper=cost["paper"],
                        scale=args.scale,
                        command=cost["command"],
                    )
                )
        return rows


@contextlib.contextmanager
def quiet_third_party():
    """No warnings and no log records below ERROR while a plan builds its models on the meta device (hydra's
    deprecation notices, fairseq's INFO lines): the plan's own output is what a --dry-run shows."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        logging.disable(logging.WARNING)
        try:
            yield
        finally:
            logging.disable(logging.NOTSET)


def format_plan(plan: Dict[str, Any]) -> str:
    """A full-size plan as ``--dry-run`` prints it on stdout, a shell script: its commands, then as comments the
    parameter count of every head beside the paper's numbers, and the plan's note."""
    lines = list(plan["commands"])
    paper = plan.get("paper", {})
    splits = sorted({s for by_split in paper.values() for s in by_split}, key=lambda s: (s != "valid", s))
    lines += [
        "",
        "# | head | parameters |" + "".join(f" paper {s} |" for s in splits),
        "# |---|---|" + "---|" * len(splits),
    ]
    for head, count in plan["parameters"].items():
        numbers = "".join(f" {paper.get(head, {}).get(s, '-')} |" for s in splits)
        lines.append(f"# | {head} | {count / 1e6:.1f}M |{numbers}")
    if plan.get("note"):
        lines += ["#"] + ["# " + line for line in textwrap.wrap(plan["note"], 110)]
    return "\n".join(lines)
