"""The pilot of the ``lm-ptb`` table on PTB's train split: which optimiser, and what each head's epoch costs.

    python -m recipes.reproduce.pilots.lm_pilot [--arms softmax-adam mos-4-ntasgd ...] \
        [--out results/reproduce/lm-ptb-pilot]
    python -m recipes.reproduce.pilots.lm_pilot --collect [--commit]

Four arms train the table's mini AWD-LSTM (``recipes.reproduce.tables.language_model``'s ``MINI_MODEL``, the papers'
protocol, ``train.txt`` / ``valid.txt`` / ``test.txt``) for a fixed number of epochs, seed 1, no early stopping:

* ``softmax-adam``, ``mos-4-adam``: Adam at the mini grid's centre (5e-3);
* ``softmax-ntasgd``, ``mos-4-ntasgd``: the papers' NT-ASGD at their rates (AWD-LSTM's 30 for softmax, MoS's 20 for
  MoS), validated and scored on the averages once averaging starts. The non-monotone trigger (``--nonmono 5``)
  cannot fire within a pilot's few epochs (it needs more than 5 validations), so averaging is forced from the end
  of epoch :func:`switch_epoch` (``--asgd-from-epoch``, as MoS's finetune stage starts it): the arm shows what
  SGD at the papers' rates with averaging forced this early reaches (not other rates, nor later averaging).

softmax trains :data:`EPOCHS` ``["softmax"]`` epochs, MoS-4 fewer (its epoch costs about 3 of softmax's): each arm is
about half an hour of one thread. ``probes`` times every head of the table (its sized rows included): a short
training run each, tokens per second from fairseq's ``wps`` after the first updates, the epoch's cost from it.
Each arm is kept in ``OUT/ARM/record.json`` (a rerun skips it); ``--collect`` writes ``OUT/pilot.json`` and, with
``--commit``, ``records/reproduction/lm-ptb-pilot.json``, which the report shows.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import shutil
import statistics
import sys
from types import SimpleNamespace
from typing import Any, Dict

from recipes.reproduce.engine import results as result_files
from recipes.reproduce.engine import sweep as sweep_rules
from recipes.reproduce.tables.language_model import LM_HEAD_OPTIONS, MINI_OPTIMIZERS, PPL
from recipes.reproduce.tables.lm_ptb import TABLE
from recipes.reproduce.engine.runner import Runner, cpu_seconds, parse_train_wall, shell_line
from recipes.reproduce.engine.table import DOCS, RECORDS
from recipes.reproduce.engine.variants import resolve
from recipes.common import data as data_paths

#: epochs of each head's arms (the same for both optimisers)
EPOCHS = {"softmax": 4, "mos-4": 2}
#: the papers' NT-ASGD rates: AWD-LSTM's (softmax) and MoS's (MoS); Adam at the mini grid's centre
RATES = {("softmax", "ntasgd"): 30.0, ("mos-4", "ntasgd"): 20.0, ("softmax", "adam"): 0.005, ("mos-4", "adam"): 0.005}
ARMS = [f"{head}-{opt}" for head in EPOCHS for opt in MINI_OPTIMIZERS]
#: updates of a cost probe, and the first ones its rate leaves out (warm-up)
PROBE_UPDATES, PROBE_SKIP = 40, 20
WPS = re.compile(r'"wps": "([\d.]+)"')
COMMITTED = os.path.join(RECORDS, "lm-ptb-pilot.json")
#: what the pilot decided, and from which of its numbers (written into its json, shown in the report)
DECISION = (
    "Adam, at the mini grid's rates (2.5e-3, 5e-3, 1e-2). At equal epochs Adam's valid perplexity is below NT-ASGD's "
    "at every epoch for both heads, NT-ASGD's forced averaging included: softmax 216.9 / 160.3 / 137.6 / 124.9 against "
    "307.4 / 203.2 / 166.9 / 153.6 (averaged from the end of epoch 2), scored valid / test 124.92 / 119.85 against "
    "148.13 / 144.71. MoS-4 213.8 / 154.9 against 678.9 / 327.0 (averaged from epoch 1), scored 154.92 / 150.04 "
    "against 306.07 / 294.38. (The NT-ASGD arms' scored checkpoints held the SGD iterate, not the average, in their "
    "tied embedding / softmax weight, a bug of `python -m fairseq_plugin.average` found after the pilot and fixed. "
    "Their per-epoch validations after the switch, 153.6 and 327.0 at the last epoch, are the true averages': the "
    "choice is the same either way.) NT-ASGD's own trigger (--nonmono 5) cannot fire within the epochs the table can "
    "afford. The model stays the earlier mini AWD-LSTM (emsize 200, nhid 400, nhidlast 300, batch 20): an epoch of PTB "
    "train took softmax 415-422 and MoS-4 1,052-1,114 CPU-seconds in these arms. The probes put the other rows at 1.10 "
    "(Sigsoftmax) to 1.38 (Mixtape) times softmax's (their absolute times ran beside other jobs; the ratios are what "
    "they give). So lm-ptb's 36 cells (24 seeds, 12 more in the 3-rate sweep) cost about 30 CPU-hours at a cap of 5 "
    "epochs. With lm-wt2 (about 4), lm-gpt2's rerun (about 1.3) and this pilot (2.3 CPU-hours with its scoring and "
    "probes, over the 2 planned for it by 0.3), that keeps the 40 planned. Softmax's valid perplexity after 4 epochs, "
    "124.9, is about twice the papers' AWD-LSTM (60.83 valid, 58.37 test) and still falling 13 an epoch: the table's "
    "cells stop at the cap, not converged."
)


def switch_epoch(epochs: int) -> int:
    """The epoch at whose end an NT-ASGD arm of ``epochs`` epochs starts averaging: two epochs of averages where
    there are more than two epochs, else one."""
    return max(1, epochs - 2)


def table_args(epochs: int, data: str) -> SimpleNamespace:
    return SimpleNamespace(
        scale="mini", max_updates=None, max_epochs=epochs, patience=0, limit=0, data=data, keep_checkpoints=False
    )


def run_arm(runner: Runner, bin_dir: str, arm: str, args) -> Dict[str, Any]:
    """Train one arm (resumable), score its best checkpoint (NT-ASGD: the averages) on valid and test."""
    head, optimizer = arm.rsplit("-", 1)
    variant = resolve([head], LM_HEAD_OPTIONS)[0]
    epochs, lr = EPOCHS[head], RATES[(head, optimizer)]
    cell = os.path.join(args.out, arm)
    done = os.path.join(cell, "record.json")
    if os.path.isfile(done):
        return result_files.load_json(done)
    save_dir = os.path.join(cell, "checkpoints")
    train = TABLE.train_command(
        bin_dir, variant, 1, save_dir, table_args(epochs, args.data), lr=lr, optimizer=optimizer
    )
    if optimizer == "ntasgd":
        train += ["--asgd-from-epoch", str(switch_epoch(epochs))]
    log_path = os.path.join(cell, "train.log")
    runner.run(train, log_path, f"pilot {arm}", comment=f"pilot {arm}: train {epochs} epochs")
    commands = [shell_line(train)]
    scored = os.path.join(save_dir, "checkpoint_best.pt")
    if optimizer == "ntasgd":
        average = TABLE.average_command(save_dir, cell)
        runner.run(average, log_path, f"pilot {arm}", comment=f"pilot {arm}: the averages")
        commands.append(shell_line(average))
        scored = os.path.join(cell, "averaged.pt")
    ppl = {}
    for split in ("valid", "test"):
        cmd = TABLE.eval_command(bin_dir, scored, split, table_args(epochs, args.data))
        out = runner.run(cmd, os.path.join(cell, f"eval-{split}.log"), f"pilot {arm}", comment=f"pilot {arm}: {split}")
        ppl[split] = float(PPL.findall(out)[-1])
        commands.append(shell_line(cmd))
    text = open(log_path).read()
    averaging = re.search(r"NT-ASGD: averaging from the end of epoch (\d+)", text)
    record = {
        "arm": arm,
        "head": head,
        "optimizer": optimizer,
        "lr": lr,
        "epochs": epochs,
        "seed": 1,
        "averaging_from_epoch": int(averaging.group(1)) if averaging else None,
        "curve": sweep_rules.parse_curve(text),
        "train_wall_s": parse_train_wall(text),
        "cpu_s": cpu_seconds(log_path, text),
        "ppl": ppl,
        "commands": commands,
    }
    result_files.save_json(done, record)
    shutil.rmtree(save_dir, ignore_errors=True)
    if os.path.exists(os.path.join(cell, "averaged.pt")):
        os.remove(os.path.join(cell, "averaged.pt"))
    return record


def run_probes(runner: Runner, bin_dir: str, args, train_tokens: int) -> Dict[str, Any]:
    """Tokens per second of every head of the table (one thread, Adam; its sizes as the table gives them) and the
    epoch's cost from it."""
    done = os.path.join(args.out, "probes", "probes.json")
    if os.path.isfile(done):
        return result_files.load_json(done)
    out: Dict[str, Any] = {}
    for variant in TABLE.variants(SimpleNamespace(scale="mini", heads=None)):
        cell = os.path.join(args.out, "probes", variant.name)
        cmd = TABLE.train_command(bin_dir, variant, 1, os.path.join(cell, "checkpoints"), table_args(1, args.data))
        cmd = (
            cmd[: cmd.index("--max-epoch")] + ["--max-update", str(PROBE_UPDATES)] + cmd[cmd.index("--max-epoch") + 2 :]
        )
        cmd += ["--disable-validation", "--no-save"]
        text = runner.run(cmd, os.path.join(cell, "train.log"), f"probe {variant.name}")
        rates = [float(w) for w in WPS.findall(text.split('"num_updates": "%d"' % PROBE_SKIP)[-1])]
        wps = statistics.median(rates) if rates else None
        out[variant.name] = {
            "tokens_per_s": wps,
            "epoch_s": round(train_tokens / wps, 1) if wps else None,
            "command": shell_line(cmd),
        }
    result_files.save_json(done, out)
    return out


def logged_cpu_s(pattern: str) -> float:
    """CPU seconds of every process whose log matches ``pattern`` (the engine's ``runner.cpu_seconds``)."""
    total = 0.0
    for log in sorted(glob.glob(pattern)):
        with open(log) as f:
            total += cpu_seconds(log, f.read()) or 0.0
    return total


def collect(args) -> Dict[str, Any]:
    """``OUT/pilot.json`` (and, with ``--commit``, the committed copy): every finished arm, the probes, the data's
    token counts, the CPU time of the arms' training, of their scoring and of the probes, and :data:`DECISION`."""
    arms = {arm: result_files.load_json(os.path.join(args.out, arm, "record.json")) for arm in ARMS}
    result = {
        "arms": {a: r for a, r in arms.items() if r},
        "epochs": EPOCHS,
        "rates": {f"{h}-{o}": lr for (h, o), lr in RATES.items()},
        "probes": result_files.load_json(os.path.join(args.out, "probes", "probes.json")),
        "data": result_files.load_json(os.path.join(args.out, "data", "tokens.json")),
        "cpu_s": {
            "training": sum(r.get("cpu_s") or 0.0 for r in arms.values() if r),
            "scoring": logged_cpu_s(os.path.join(args.out, "*", "eval-*.log")),
            "probes": logged_cpu_s(os.path.join(args.out, "probes", "*", "train.log")),
        },
        "decision": DECISION,
    }
    result_files.save_json(os.path.join(args.out, "pilot.json"), result)
    if args.commit:
        result_files.save_json(COMMITTED, result)
    return result


def main(argv=None) -> None:
    p = argparse.ArgumentParser(
        prog="python -m recipes.reproduce.pilots.lm_pilot",
        description=__doc__.split("\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__,
    )
    p.add_argument("--arms", nargs="+", default=ARMS + ["probes"], choices=ARMS + ["probes"])
    data_paths.add_data_option(p)
    p.add_argument("--out", default=os.path.join(os.path.dirname(DOCS), "results", "reproduce", "lm-ptb-pilot"))
    p.add_argument("--collect", action="store_true", help="write OUT/pilot.json from the finished arms")
    p.add_argument("--commit", action="store_true", help="with --collect: also records/reproduction/lm-ptb-pilot.json")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    args = p.parse_args(argv)
    args.out, args.data = os.path.abspath(args.out), os.path.abspath(args.data)
    if args.collect:
        print(json.dumps({a: r["ppl"] for a, r in collect(args)["arms"].items()}, indent=1))
        return
    runner = Runner(args.out, progress=not args.quiet)
    prepared = TABLE.prepare(runner, table_args(1, args.data), args.out)
    tokens = result_files.load_json(os.path.join(args.out, "data", "tokens.json"))
    for arm in args.arms:
        if arm == "probes":
            print(json.dumps(run_probes(runner, prepared["bin"], args, tokens["train"])), file=sys.stderr)
        else:
            record = run_arm(runner, prepared["bin"], arm, args)
            print(f"pilot {arm}: valid {record['ppl']['valid']:.2f} test {record['ppl']['test']:.2f}", file=sys.stderr)


if __name__ == "__main__":
    from hf_heads.cli.runner import run

    run(main)
