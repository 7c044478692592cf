"""Does the bottleneck map carry to training the whole model? Softmax and MoS trained jointly with the trunk at a
small and a large head input size d, beside the frozen-trunk map (``python -m studies.bottleneck_map``).

The map freezes a trained AWD-LSTM and learns ``head(W_p f)`` on its 200-d features. Here nothing is frozen: the
lm-ptb table's AWD-LSTM cell (its model, optimizer, data order and the papers' stateful protocol) is trained with its
last LSTM layer of ``d`` units (``--nhidlast d``) and an untied head reading it (``--untie-weights``: the head's own
V x d output embedding, so softmax's logits have rank at most d + 1, and MoS's K contexts are d-dimensional, as in the
map). A shorter schedule than the table's (``--epochs``, stated in every record), so the numbers are at that cap, not
converged::

    python -m studies.bottleneck_map.joint --bin results/reproduce/lm-ptb/data/bin --out results/bottleneck_joint

Each (head, d, seed) cell writes ``OUT/cells/HEAD-dD-sS.json`` (valid / test perplexity of the best checkpoint,
scored as the table scores; epochs; CPU seconds; the command); a finished cell is skipped on the next call, an
interrupted one resumes from its last checkpoint. ``python -m studies.bottleneck_map.report`` reads them beside the map.
On a new machine, ``--restore studies/bottleneck_map/records/bottleneck_map.json`` writes the page's committed cells
back first (those run with the same rate and epoch cap), so only the missing cells train.
"""

from __future__ import annotations

import argparse
import os
from typing import Any, Dict, List
from recipes.common import data as data_paths
from recipes.common import runtime

#: the check: softmax and MoS-4, trained jointly with the trunk, at the map's smallest and largest d
HEADS = ["softmax", "mos-4"]
DIMS = [4, 128]


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m studies.bottleneck_map.joint", description=__doc__.split("\n")[0])
    p.add_argument("--bin", required=True, help="lm-ptb's binarised data (RESULTS/lm-ptb/data/bin)")
    p.add_argument("--out", default=os.path.join("results", "bottleneck_joint"))
    p.add_argument("--heads", nargs="+", default=HEADS, help="lm-ptb table heads (default: softmax mos-4)")
    p.add_argument("--dims", type=int, nargs="+", default=DIMS, help="the last layer's units = the head's input d")
    p.add_argument("--seeds", type=int, default=1, help="seeds 1..N of every (head, d)")
    p.add_argument("--epochs", type=int, default=3, help="the epoch cap (the table's stopping rule within it)")
    p.add_argument("--lr", type=float, default=2.5e-3, help="Adam's rate for every cell (the trunk's chosen rate)")
    data_paths.add_data_option(p)
    p.add_argument(
        "--restore",
        default=None,
        help="the page's json (studies/bottleneck_map/records/bottleneck_map.json): its joint cells run with the same "
        "--lr and --epochs are written into --out where it has none, so a new machine trains only the missing cells",
    )
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    args = p.parse_args(argv)
    for flag, values, low in (("--dims", args.dims, 1), ("--seeds", [args.seeds], 1), ("--epochs", [args.epochs], 1)):
        bad = [v for v in values if v < low]
        if bad:
            p.error(f"{flag} {bad[0]} is out of range; allowed: integers >= {low}")
    if not os.path.isfile(os.path.join(args.bin, "dict.txt")):
        p.error(
            f"--bin {args.bin}: no dict.txt there; expected lm-ptb's binarised data "
            f"(python -m recipes.reproduce lm-ptb)"
        )
    return args


def joint_command(table, variant, d: int, seed: int, save_dir: str, args, table_args) -> List[str]:
    """The table's training command of ``variant`` with a ``d``-unit last layer, an untied head and the epoch cap."""
    from recipes.reproduce.tables.language_model import with_options

    cmd = table.train_command(args.bin, variant, seed, save_dir, table_args, args.lr)
    return with_options(cmd, ["--nhidlast", str(d), "--max-epoch", str(args.epochs)]) + ["--untie-weights"]


def cell_name(head: str, d: int, seed: int) -> str:
    """A cell's name: its folder under ``OUT/cells/`` and, with ``.json``, its record beside it."""
    return f"{head}-d{d}-s{seed}"


def record_path(args, head: str, d: int, seed: int) -> str:
    """A finished cell's record, ``OUT/cells/NAME.json``."""
    return os.path.join(args.out, "cells", cell_name(head, d, seed) + ".json")


def restore(args, log=print) -> int:
    """Write the joint cells committed in ``args.restore`` (the page's json, its ``joint`` list) into ``OUT/cells``
    where that cell is missing, for the heads and d values asked, when they ran with the same rate and epoch cap;
    returns how many it wrote. Training does not depend on any earlier run (the whole model trains from its seed),
    so a committed cell stands for the cell this machine would train."""
    if not args.restore:
        return 0

    def destination(cell):
        wanted = cell["head"] in args.heads and cell["d"] in args.dims and cell["seed"] <= args.seeds
        same = cell.get("lr") == args.lr and cell.get("epoch_cap") == args.epochs
        return record_path(args, cell["head"], cell["d"], cell["seed"]) if wanted and same else None

    copied = runtime.restore((runtime.load_json(args.restore) or {}).get("joint", []), destination)
    log(f"restored {copied} joint cell(s) from {args.restore}")
    return copied


def run_cell(table, variant, d: int, seed: int, args, table_args, runner, log) -> Dict[str, Any]:
    from recipes.reproduce.engine.runner import cpu_seconds, shell_line, training_done

    name = cell_name(variant.name, d, seed)
    cell = os.path.join(args.out, "cells", name)
    save_dir, log_path = os.path.join(cell, "checkpoints"), os.path.join(cell, "train.log")
    train = joint_command(table, variant, d, seed, save_dir, args, table_args)
    if not training_done(log_path):
        runner.run(train, log_path, name, comment=f"{name}: train")
    best = os.path.join(save_dir, "checkpoint_best.pt")
    ppl, _ = table.score_checkpoint(runner, args.bin, best, cell, name, table_args)
    record = {
        "head": variant.name,
        "options": variant.options,
        "d": d,
        "seed": seed,
        "lr": args.lr,
        "epoch_cap": args.epochs,
        "ppl": ppl,
        "cpu_seconds": cpu_seconds(log_path, open(log_path).read()),
        "command": shell_line(train),
    }
    log(f"{name}: valid {ppl['valid']:.2f}, test {ppl['test']:.2f} perplexity")
    return record


def main(argv=None, log=print) -> List[Dict[str, Any]]:
    args = parse_args(argv)
    from recipes.reproduce import get_table
    from recipes.reproduce.__main__ import parse_args as table_parse_args
    from recipes.reproduce.engine.runner import Runner

    table = get_table("lm-ptb")
    table_args = table_parse_args(["lm-ptb", "--scale", "mini", "--data", args.data, "--heads", *args.heads])
    variants = table.variants(table_args)
    runner = Runner(args.out, log=log, progress=not args.quiet)
    restore(args, log)
    records = []
    for seed in range(1, args.seeds + 1):
        for d in args.dims:
            for variant in variants:
                record = runtime.cell(
                    record_path(args, variant.name, d, seed),
                    lambda v=variant, d=d, seed=seed: run_cell(table, v, d, seed, args, table_args, runner, log),
                )
                if record is not None:  # (None: another process trains it)
                    records.append(record)
    return records


if __name__ == "__main__":
    from hf_heads.cli.runner import run

    run(main)
