"""``python -m recipes.reproduce``: list the tables, run one at a scale, or print its full-size plan.

    python -m recipes.reproduce --list
    python -m recipes.reproduce mt-en-de --scale mini                      # Multi30k, a 2-core CPU
    python -m recipes.reproduce mt-en-de --scale full --dry-run            # the paper's commands + parameters
    python -m recipes.reproduce mt-en-de --scale mini --heads softmax mixtape --seeds 1 --max-updates 200
    python -m recipes.reproduce lm-gpt2 --scale mini --models gpt2                # HF GPT-2 from a config only

A finished cell (table, head, seed) is skipped on the next call; an interrupted fairseq-train resumes from its
last checkpoint. Results: OUT/TABLE/results.json, commands: OUT/TABLE/commands.sh.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import List, Optional

from recipes.reproduce import TABLE_MODULES, get_table
from recipes.reproduce.tables.translation import MINI_BPE
from recipes.common import data as data_paths


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    """The command's options, checked (each error names the option, the value and what is allowed)."""
    p = argparse.ArgumentParser(
        prog="python -m recipes.reproduce",
        description=__doc__.split("\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__,
    )
    p.add_argument("table", nargs="?", help="table to reproduce (--list shows them)")
    p.add_argument("--list", action="store_true", help="print one table per line with its description")
    p.add_argument("--scale", choices=["mini", "full"], default="mini")
    p.add_argument(
        "--heads",
        nargs="+",
        default=None,
        help="heads to run (registry names or variants such as mos-9, mixtape-noshare); default: the table's",
    )
    p.add_argument(
        "--seeds",
        type=int,
        default=None,
        help="seeds per head (default: the table's, e.g. 3 for the compared heads and 1 for the others)",
    )
    p.add_argument(
        "--max-updates",
        type=int,
        default=None,
        help="optimizer updates per cell, for the tables that count updates (translation; lm-gpt2's steps; default: "
        "the table's); at mini scale a cap beside the stopping rule. The language-model tables count epochs: "
        "--max-epochs",
    )
    add_rate_and_stopping_options(p)
    data_paths.add_data_option(p)
    p.add_argument("--out", default=os.path.join("results", "reproduce"), help="output directory")
    p.add_argument("--dry-run", action="store_true", help="print the commands and parameter counts, run nothing")
    p.add_argument(
        "--models", nargs="+", default=None, help="lm-gpt2 only: the models of each cell (gpt2, smollm2; default both)"
    )
    p.add_argument(
        "--bpe-size",
        type=int,
        default=MINI_BPE,
        help=f"joint BPE vocabulary of the mini translation tables (default {MINI_BPE})",
    )
    p.add_argument("--limit", type=int, default=0, help=argparse.SUPPRESS)  # tests: first N lines of every split
    p.add_argument("--no-costs", action="store_true", help="skip the training-cost columns")
    p.add_argument(
        "--cost-batch",
        type=int,
        default=None,
        help="sequences a batch for the same-batch cost "
        "columns (default: the table's, as its paper: 256 "
        "sentences for translation, 48 blocks of 70 tokens "
        "for PTB / WikiText-2)",
    )
    p.add_argument("--keep-checkpoints", action="store_true", help="keep each cell's checkpoints")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    args = p.parse_args(argv)
    check_args(p, args)
    return args


def check_args(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse values out of range and options that contradict each other (``p.error``: the option, the value)."""
    if not args.list and not args.table:
        p.error("name a table (or --list)")
    for name in ("seeds", "max_updates", "cost_batch", "max_epochs", "max_rates"):
        value = getattr(args, name)
        if value is not None and value < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1 (got {value})")
    if args.patience is not None and args.patience < 0:
        p.error(f"--patience must be >= 0 (got {args.patience}; 0 switches early stopping off)")
    if args.lrs and (min(args.lrs) <= 0 or len(set(args.lrs)) != len(args.lrs)):
        p.error(f"--lrs must be distinct positive rates (got {' '.join(map(str, args.lrs))})")
    if args.lr_from and args.lrs:
        p.error("--lr-from and --lrs both set the rates: give one")
    if args.lr_from and args.max_rates:
        p.error("--max-rates grows a sweep; --lr-from trains at one borrowed rate without one")
    if args.lrs and args.max_rates and args.max_rates < len(args.lrs):
        p.error(f"--max-rates {args.max_rates} is below the {len(args.lrs)} rates --lrs gives")
    if args.lr_from and args.lr_from == args.table:
        p.error(f"--lr-from names the table itself ({args.table}): name the table whose sweep chose the rates")
    if args.lr_from and args.lr_from not in TABLE_MODULES:
        p.error(f"--lr-from: no table {args.lr_from!r} (tables: {', '.join(TABLE_MODULES)})")
    if args.bpe_size < 100:
        p.error(f"--bpe-size must be >= 100 (got {args.bpe_size})")


def add_rate_and_stopping_options(p: argparse.ArgumentParser) -> None:
    """The mini cells' learning-rate sweep (or borrowed rates) and stopping rule."""
    p.add_argument(
        "--lrs",
        type=float,
        nargs="+",
        default=None,
        help="mini: the learning rates every head is swept over (default: the table's grid, grown by a "
        "factor 2 beyond an end that is best, up to 5 rates)",
    )
    p.add_argument(
        "--max-rates",
        type=int,
        default=None,
        help="mini: how many rates a head's sweep may grow to when its best is at an end of the grid "
        "(default: 5 for the table's grid; the rates --lrs gives, that is no growth, for --lrs)",
    )
    p.add_argument(
        "--lr-from",
        default=None,
        metavar="TABLE",
        help="mini: no sweep; each head trains at the rate TABLE's sweep chose for it (OUT/TABLE/"
        "sweep.json, chosen on TABLE's valid split), e.g. mt-en-fr at mt-en-de's rates",
    )
    p.add_argument(
        "--patience",
        type=int,
        default=None,
        help="mini: epochs without a better valid loss before a cell stops (default: the table's; 0: no "
        "early stopping)",
    )
    p.add_argument(
        "--max-epochs",
        type=int,
        default=None,
        help="mini: the stopping rule's cap on epochs; the language-model tables (lm-ptb, lm-wt2, lm-1b) at full "
        "size: the epochs a cell trains (default: the table's)",
    )


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def main(argv: Optional[List[str]] = None, log=_stderr):
    """Run the command line; returns the table's results rows (None for --list). ``log`` gets progress lines."""
    args = parse_args(argv)
    if args.list:
        for name in TABLE_MODULES:
            print(f"{name}\t{get_table(name).description}")
        return None
    table = get_table(args.table)
    if args.scale not in table.scales:
        raise SystemExit(f"{args.table} has no --scale {args.scale} (it has: {', '.join(table.scales)})")
    if args.dry_run and args.scale != "full":
        raise SystemExit("--dry-run prints the full-size plan: use it with --scale full")
    if args.models and args.table != "lm-gpt2":
        raise SystemExit(f"--models is an option of lm-gpt2 only (not {args.table})")
    if args.max_updates and table.counts_epochs:
        # 0.1's --max-updates counted epochs on the language-model tables: for a release it still does, with a warning
        if args.max_epochs:
            raise SystemExit(f"{args.table} counts epochs: give --max-epochs alone (not --max-updates too)")
        _stderr(
            f"warning: {args.table} counts epochs, not updates: --max-updates {args.max_updates} is read as "
            f"--max-epochs {args.max_updates} (say --max-epochs; --max-updates on this table goes in the next release)"
        )
        args.max_epochs, args.max_updates = args.max_updates, None
    args.data = os.path.abspath(args.data)
    args.out = os.path.abspath(args.out)
    return table.run(args, log=log)


if __name__ == "__main__":
    from hf_heads.cli.runner import run

    run(main)
