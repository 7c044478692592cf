"""The head-upgrade table of the bottleneck map page: SmolLM2-135M's head upgraded on WikiText-2, every row and control,
three seeds, by ``python -m studies.head_upgrade`` cell after cell (resumable: a cell with its ``results.json`` is
read, not rerun).

    python -m studies.head_upgrade.table --out results/upgrade_table              # the rate pilot, then the table
    python -m studies.head_upgrade.table --out results/upgrade_table --dry-run    # the plan: every command, nothing run
    python -m studies.head_upgrade.table --out results/upgrade_table \
        --restore studies/bottleneck_map/records/bottleneck_map.json   # a new machine: the committed cells

The rows: MoS-3, Mixtape (the library's default form) and PLIF, each started at the pretrained ``lm_head``; the
controls (a) the pretrained softmax fine-tuned the same way (domain adaptation alone) and (b) that softmax behind a
residual MLP with as many parameters as MoS-3 adds (more parameters, not more rank). Fixed before the runs:

* **the rate pilot**: each row at every ``--rates`` value, seed 0 (not a table seed), one epoch over the first
  ``--pilot-tokens`` train tokens, validated on the first ``--pilot-valid-tokens`` valid tokens; a row whose best rate
  is at an end of the grid tries up to ``--extra-rates`` more, a grid step past that end each; a row's rate is the
  one with the lowest valid NLL after that epoch (``OUT/rates.json``);
* **the table**: each row at its rate, seeds ``--seeds``, on the first ``--train-tokens`` train tokens, at most
  ``--max-epochs`` epochs (patience 1), the best epoch by valid NLL on the first ``--valid-tokens`` valid tokens,
  then scored on the whole test file (per token and per word, and CPU time per 1k tokens at training and at
  inference).

The model's states are cached once per text (``OUT/states-cache/pilot`` and ``OUT/states-cache/table``) and shared
by every cell of the stage. ``python -m
studies.bottleneck_map.report --upgrade OUT`` puts the table on the page. Options this command does not know go to every
``studies.head_upgrade`` call (e.g. ``--block-size``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
from typing import Dict, List, Optional

from recipes.common import runtime
from recipes.common import data as data_paths

#: row -> the options of studies.head_upgrade that make it (MoS gets K = 3 from upgrade_head's default for pretrained
#: models; Mixtape and PLIF their library defaults)
ROWS: Dict[str, List[str]] = {
    "softmax": ["--head", "softmax"],
    "softmax-mlp": ["--head", "softmax", "--residual-mlp", "mos-3"],
    "mos-3": ["--head", "mos"],
    "mixtape": ["--head", "mixtape"],
    "plif": ["--head", "plif"],
}
#: what each row is, for the page
ROW_NAMES = {
    "softmax": "(a) softmax, fine-tuned",
    "softmax-mlp": "(b) softmax + residual MLP (MoS-3's added parameters)",
    "mos-3": "MoS-3",
    "mixtape": "Mixtape",
    "plif": "PLIF",
}
PILOT_SEED = 0
#: the options a run records in ``OUT/meta.json`` (with the options it passed on to upgrade_head): what the page
#: reads for the seeds and rows planned and for the command that reruns the table
META_OPTIONS = (
    "model",
    "rows",
    "rates",
    "extra_rates",
    "seeds",
    "pilot_tokens",
    "pilot_valid_tokens",
    "train_tokens",
    "valid_tokens",
    "max_epochs",
)


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    p.add_argument("--out", default=os.path.join("results", "upgrade_table"), help="the cells, rates and state cache")
    p.add_argument("--model", default="smollm2", help="what studies.head_upgrade's --model takes")
    p.add_argument(
        "--data",
        default=data_paths.corpus("wikitext-2"),
        help="a folder with train.txt, valid.txt and test.txt",
    )
    p.add_argument("--rows", nargs="+", default=list(ROWS), choices=list(ROWS), help="the rows to run")
    p.add_argument("--rates", nargs="+", type=float, default=[1e-4, 3e-4, 1e-3], help="the pilot's learning rates")
    p.add_argument(
        "--extra-rates",
        type=int,
        default=1,
        help="a row whose best pilot rate is at an end of the grid gets up to this many more, a grid step past it",
    )
    p.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3], help="the table's seeds (not 0: the pilot's)")
    p.add_argument("--pilot-tokens", type=int, default=100_000, help="train tokens of the rate pilot")
    p.add_argument("--pilot-valid-tokens", type=int, default=25_000, help="valid tokens of the rate pilot")
    p.add_argument("--train-tokens", type=int, default=200_000, help="train tokens of the table")
    p.add_argument("--valid-tokens", type=int, default=50_000, help="valid tokens of the table (the stopping rule)")
    p.add_argument("--max-epochs", type=int, default=2, help="the table's epoch cap (patience 1)")
    p.add_argument(
        "--restore",
        metavar="PAGE_JSON",
        help="first copy the cells committed in PAGE_JSON (studies/bottleneck_map/records/bottleneck_map.json) that "
        "this run would make (the same model, tokens and passed options; a table cell also at the rate chosen now) "
        "into --out: a new machine goes on from them instead of training them again",
    )
    p.add_argument("--dry-run", action="store_true", help="print every command, run nothing")
    args, passed = p.parse_known_args(argv)
    for flag in ("pilot_tokens", "pilot_valid_tokens", "train_tokens", "valid_tokens", "max_epochs"):
        if getattr(args, flag) < 1:
            p.error(f"--{flag.replace('_', '-')}={getattr(args, flag)} is out of range; allowed: an integer >= 1")
    if args.extra_rates < 0:
        p.error(f"--extra-rates={args.extra_rates} is out of range; allowed: an integer >= 0")
    if PILOT_SEED in args.seeds:
        p.error(f"--seeds {args.seeds}: seed {PILOT_SEED} is the rate pilot's; the table's seeds must differ from it")
    if any(not r > 0 for r in args.rates):
        p.error(f"--rates {args.rates}: allowed: numbers > 0")
    for name in ("train", "valid", "test"):
        if not args.dry_run and not os.path.isfile(os.path.join(args.data, f"{name}.txt")):
            p.error(f"--data {args.data!r} has no {name}.txt (the WikiText-2 splits: ../shared/data/wikitext-2)")
    args.passed = passed
    return args


def pilot_argv(args, row: str, lr: float) -> List[str]:
    """The upgrade_head command line of one pilot cell."""
    return _common(args, row, "pilot") + [
        "--max-train-tokens",
        str(args.pilot_tokens),
        "--max-valid-tokens",
        str(args.pilot_valid_tokens),
        "--max-epochs",
        "1",
        "--lr",
        f"{lr:g}",
        "--seed",
        str(PILOT_SEED),
        "--output-dir",
        cell_dir(args, "pilot", row, lr),
    ]


def table_argv(args, row: str, lr, seed: int) -> List[str]:
    """The upgrade_head command line of one table cell (``lr`` a number, or a placeholder string for the plan)."""
    return _common(args, row, "table") + [
        "--test-file",
        os.path.join(args.data, "test.txt"),
        "--max-train-tokens",
        str(args.train_tokens),
        "--max-valid-tokens",
        str(args.valid_tokens),
        "--max-epochs",
        str(args.max_epochs),
        "--patience",
        "1",
        "--lr",
        lr if isinstance(lr, str) else f"{lr:g}",
        "--seed",
        str(seed),
        "--output-dir",
        cell_dir(args, "cells", row, seed),
    ]


def cell_dir(args, stage: str, row: str, key) -> str:
    """A cell's output folder: a pilot cell's under ``OUT/rates/ROW-lrRATE`` (``key`` its rate), a table cell's under
    ``OUT/cells/ROW-seedSEED`` (``key`` its seed)."""
    if stage == "pilot":
        return os.path.join(args.out, "rates", f"{row}-lr{key:g}")
    return os.path.join(args.out, "cells", f"{row}-seed{key}")


def row_of(folder: str) -> str:
    """The row of the cell whose output folder :func:`cell_dir` named ``folder`` (a pilot cell's or a table cell's)."""
    stage = os.path.basename(os.path.dirname(os.path.normpath(folder)))
    return os.path.basename(os.path.normpath(folder)).rsplit("-lr" if stage == "rates" else "-seed", 1)[0]


def _common(args, row: str, stage: str) -> List[str]:
    return [
        "--model",
        args.model,
        *ROWS[row],
        "--train-file",
        os.path.join(args.data, "train.txt"),
        "--valid-file",
        os.path.join(args.data, "valid.txt"),
        "--cache-dir",
        os.path.join(args.out, "states-cache", stage),  # the pilot's text is shorter: states of its own
        "--no-save",
        "--no-progress",
        *args.passed,
    ]


def run_cell(argv: List[str], dry_run: bool, log) -> Optional[Dict]:
    """One cell: its results.json when it is there, else run it (``None`` on a dry run)."""
    out = argv[argv.index("--output-dir") + 1]
    path = os.path.join(out, "results.json")
    if os.path.exists(path):
        with open(path) as f:
            return json.load(f)
    log("python -m studies.head_upgrade " + " ".join(shlex.quote(a) for a in argv))
    if dry_run:
        return None
    from studies.head_upgrade import command as upgrade_head

    return upgrade_head.main(argv, log=log)


def pilot_losses(cells: Dict[float, Dict]) -> Dict[float, float]:
    """``{rate: valid NLL after the pilot's epoch}``, a diverged (non-finite) one as infinity, never the best; a row
    whose every rate diverged is refused."""
    scores = {lr: cell["curve"][1]["valid_nll"] for lr, cell in cells.items()}
    if not any(math.isfinite(v) for v in scores.values()):
        raise SystemExit(f"every pilot rate diverged: {scores}")
    return {lr: v if math.isfinite(v) else math.inf for lr, v in scores.items()}


def best_rate(cells: Dict[float, Dict]) -> float:
    """The rate whose pilot cell has the lowest valid NLL after its epoch (a diverged, non-finite one never)."""
    return runtime.choose_lr(pilot_losses(cells))


def choose_rates(pilot: Dict[str, Dict[float, Dict]]) -> Dict[str, Dict]:
    """Per row, the pilot rate with the lowest valid NLL after its epoch: ``{row: {"lr", "valid_nll": {lr: nll}}}``."""
    chosen = {}
    for row, cells in pilot.items():
        scores = {lr: cell["curve"][1]["valid_nll"] for lr, cell in cells.items()}
        chosen[row] = {"lr": best_rate(cells), "valid_nll": {f"{lr:g}": v for lr, v in sorted(scores.items())}}
    return chosen


def command_line(meta: Dict, out: str = "results/upgrade_table") -> str:
    """The command that reruns a recorded run (``OUT/meta.json``) from the repository's root into ``out``, every
    recorded option written out, the options passed on to upgrade_head after them."""
    a = meta["args"]
    words = [f"python -m studies.head_upgrade.table --out {out} --data ../shared/data/wikitext-2"]
    for key in META_OPTIONS:
        values = a[key] if isinstance(a[key], list) else [a[key]]
        words.append(
            f"--{key.replace('_', '-')} " + " ".join(f"{v:g}" if isinstance(v, float) else str(v) for v in values)
        )
    return " ".join(words + [shlex.quote(w) for w in meta.get("passed", [])])


#: the options a committed cell of each stage must share with this run to stand for the cell it would make
STAGE_OPTIONS = {
    "pilot": ("model", "pilot_tokens", "pilot_valid_tokens"),
    "cells": ("model", "train_tokens", "valid_tokens", "max_epochs"),
}


#: the page json's parts an upgrade_table run may be restored from: the table, and its cap check (seed 1 again at a
#: higher --max-epochs)
PAGE_PARTS = ("upgrade", "upgrade_cap")


def restore(args, stage: str, rates: Optional[Dict[str, Dict]] = None, log=print) -> int:
    """Copy the ``stage`` cells (``"pilot"`` or ``"cells"``) committed in ``args.restore`` (the page's json, the first
    of its :data:`PAGE_PARTS` whose options match) into ``args.out`` where this run has none, when the committed run's
    options of that stage and its passed options equal this run's (a table cell also needs its rate to be ``rates``'
    choice for its row); returns how many it copied."""
    if not args.restore:
        return 0
    with open(args.restore) as f:
        page = json.load(f)

    def same(part):
        meta = (page.get(part) or {}).get("meta") or {}
        return meta.get("passed") == args.passed and all(
            meta.get("args", {}).get(k) == getattr(args, k) for k in STAGE_OPTIONS[stage]
        )

    part = next((part for part in PAGE_PARTS if (page.get(part) or {}).get(stage) and same(part)), None)
    if part is None:
        log(f"--restore {args.restore}: no {stage} cells there ran with this run's options; nothing restored")
        return 0

    def destination(cell):
        row = cell["row"]
        if row not in args.rows or (
            stage == "cells" and (cell["lr"] != rates[row]["lr"] or cell["seed"] not in args.seeds)
        ):
            return None
        return os.path.join(cell_dir(args, stage, row, cell["lr" if stage == "pilot" else "seed"]), "results.json")

    return runtime.restore(
        page[part].get(stage, []),
        destination,
        log,
        f"{stage} cell(s) from {args.restore}",
        saved=lambda cell: {k: v for k, v in cell.items() if k != "row"},
    )


def main(argv=None, log=print) -> Dict:
    args = parse_args(argv)
    if not args.dry_run:  # what the page reads: the rows and seeds planned, the options of the rerun command
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "meta.json"), "w") as f:
            json.dump({"args": {k: getattr(args, k) for k in META_OPTIONS}, "passed": args.passed}, f, indent=1)
        restore(args, "pilot", log=log)
    pilot: Dict[str, Dict[float, Dict]] = {row: {} for row in args.rows}
    for row in args.rows:
        for lr in args.rates:
            cell = run_cell(pilot_argv(args, row, lr), args.dry_run, log)
            if cell is not None:
                pilot[row][lr] = cell
    if args.dry_run:
        for row in args.rows:
            for seed in args.seeds:
                run_cell(table_argv(args, row, "RATE", seed), True, log)
        log(
            f"the table's rate per row: the pilot's best ({', '.join(f'{r:g}' for r in args.rates)}) on valid, a row "
            f"whose best is at an end of the grid tried up to {args.extra_rates} grid step(s) past it first"
        )
        return {}
    for row in args.rows:  # a best rate at an end of the grid: a grid step past it, up to --extra-rates times
        cells = pilot[row]  # (a row whose every rate diverged is not grown; choose_rates refuses it)

        def run(lr, row=row, cells=cells):
            if lr not in cells:
                cells[lr] = run_cell(pilot_argv(args, row, lr), False, log)

        runtime.grown_grid(
            list(cells), lambda lr, cells=cells: cells[lr]["curve"][1]["valid_nll"], run, args.extra_rates
        )
    rates = choose_rates(pilot)
    with open(os.path.join(args.out, "rates.json"), "w") as f:
        json.dump(rates, f, indent=1)
    log("rates chosen on valid: " + ", ".join(f"{row} {r['lr']:g}" for row, r in rates.items()))
    restore(args, "cells", rates, log)
    cells = {}
    for seed in args.seeds:  # seed by seed: a stopped run leaves whole seeds of every row
        for row in args.rows:
            cells[f"{row}-seed{seed}"] = run_cell(table_argv(args, row, rates[row]["lr"], seed), False, log)
    log(
        f"{len(cells)} cells in {os.path.join(args.out, 'cells')}; the page: python -m studies.bottleneck_map.report "
        f"--upgrade {args.out}"
    )
    return {"rates": rates, "cells": cells}


if __name__ == "__main__":
    from hf_heads.cli.runner import run

    run(main)
