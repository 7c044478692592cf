"""Where breaking the softmax bottleneck pays: heads trained on a frozen trunk's features, projected to d dimensions.

The trunk is a trained language model (by default lm-ptb's seed-1 softmax cell: the mini AWD-LSTM trained on PTB's
train split, its checkpoint kept by ``python -m recipes.reproduce lm-ptb``). Its last layer's features of every
token of train / valid / test are computed once, as the papers score (the LSTM state carried along 20 / 10 / 1
streams), and cached. Every cell then trains a learned projection of the features to ``d`` dimensions (the same
form for every head: ``nn.Linear(width, d)``) and a head on it, on a stated prefix of the train features, to the
stopping rule on valid, and scores test at the best epoch; the singular values of its log-probability matrix on valid
contexts (computed in float64) give its numerical rank; and for the first ``--floor-seeds`` seeds the cell's weights
at the stopping rule train on for ``--floor-epochs`` more epochs, valid unseen, to measure the lowest train NLL the head
reaches past its stopping rule (what it can express, apart from generalisation).

Resumable: a rerun reads the cells already saved, and a cell that stopped halfway goes on from its training (or floor
run's) checkpoint (``OUT/partial/``, saved every 10 minutes and after every epoch; removed when the cell is saved). The
seed-1 cell at ``--rate-d`` is the chosen rate's cell of the rate search, not trained twice (a rate cell keeps its
stopping-rule weights, ``OUT/rates/*.pt``, and its floor run goes on from them once its rate is chosen: the rates not
chosen have none; a rate cell run before rate cells kept their weights is run again as the seed-1 cell).

    python -m studies.bottleneck_map --trunk CKPT --data BIN --out results/bottleneck_map           # resumable
    python -m studies.bottleneck_map ... --restore studies/bottleneck_map/records/bottleneck_map.json  # a new machine
    python -m studies.bottleneck_map --plan ...                                                      # cells, cost

One map over two cores: the same command run twice. Each process claims a cell before training it (a lock beside its
record, :func:`recipes.reproduce.engine.results.claimed`) and passes over the cells the other holds, a head's seed cells
waiting for its rate; a process with nothing left to claim waits for the other's cells and ends when every cell is
saved. A lock left by a killed process is taken over.
"""

from __future__ import annotations

import argparse
import copy
import math
import os
import time
from typing import Dict, List, Optional

import torch
from torch import nn

import hf_heads
from hf_heads.hf.upgrade import States, nll_per_block, train_head_on_states
from recipes.reproduce.engine import results as result_files
from recipes.common import runtime
from studies.common.lms import trunk_features

#: the heads of the map: softmax, the primary test's MoS-4 and Mixtape, PLIF and Sigsoftmax (library defaults
#: otherwise; Mixtape in its default form)
HEADS = {
    "softmax": ("softmax", {}),
    "mos-4": ("mos", {"num_components": 4}),
    "mixtape": ("mixtape", {}),
    "plif": ("plif", {}),
    "sigsoftmax": ("sigsoftmax", {}),
}
DIMS = [4, 8, 16, 32, 64, 128]
#: streams each split is read with: the training layout for train, the papers' valid / test batches
STREAMS = {"train": 20, "valid": 10, "test": 1}
BPTT = 70


def trunk_nll(checkpoint: str, data: Dict[str, States], data_dir: str) -> Dict[str, float]:
    """The trunk's own head on the cached valid / test features: mean NLL (nats), the trunk's perplexity."""
    import fairseq_plugin  # noqa: F401  (registers the model, and its checkpoints' loader as a safe global)
    from fairseq import checkpoint_utils

    models, _cfg, _task = checkpoint_utils.load_model_ensemble_and_task([checkpoint], arg_overrides={"data": data_dir})
    head = models[0].decoder.head.eval()
    return {split: float(nll_per_block(head, data[split]).mean()) for split in ("valid", "test")}


def trunk_curve(checkpoint: str) -> list:
    """The trunk's valid perplexity after each epoch, ``[{"epoch", "valid_ppl"}]``, from the fairseq-train log of its
    table cell (``CELL/train.log`` beside ``CELL/checkpoints/``); [] where there is none."""
    from recipes.reproduce.engine.sweep import parse_curve

    log_path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(checkpoint))), "train.log")
    if not os.path.isfile(log_path):
        return []
    with open(log_path) as f:  # fairseq logs its losses in bits
        return [{"epoch": p["epoch"], "valid_ppl": 2 ** p["nll_loss"]} for p in parse_curve(f.read())]


def cached_features(args, split: str) -> States:
    path = os.path.join(args.out, "features", f"{split}.pt")
    if not os.path.exists(path):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        states = trunk_features(args.trunk, args.data, split, STREAMS[split])
        torch.save(
            {"states": states.states, "targets": states.targets, "trunk_md5": result_files.file_md5(args.trunk)},
            path + ".tmp",
        )
        os.replace(path + ".tmp", path)
    saved = torch.load(path)
    return States(saved["states"], saved["targets"], 1)


class ProjectedHead(nn.Module):
    """``head(W_p f + b_p)``: a learned projection of the trunk's features ``f`` to ``d``, then the head."""

    def __init__(self, width: int, d: int, vocab: int, name: str, options: Dict):
        super().__init__()
        self.projection = nn.Linear(width, d)
        self.head = hf_heads.build_head(name, hidden_size=d, vocab_size=vocab, **options)

    def loss(self, features, target, reduction: str = "mean"):
        return self.head.loss(self.projection(features), target, reduction=reduction)

    def aux_loss(self):
        return self.head.aux_loss()

    def log_probs(self, features):
        return self.head(self.projection(features))


@torch.no_grad()
def spectrum(module: ProjectedHead, features: torch.Tensor) -> Dict:
    """The singular values (all, largest first) of the module's log-probability matrix ``[contexts, V]``, computed in
    float64 (a float64 copy of the module on the features), and its numerical rank as ``numpy.linalg.matrix_rank``
    counts it: singular values above ``max(shape) * eps(float64) * s_max``. (In float32 the rounding noise of a
    softmax's matrix past its rank is ~1e-4 of 6e4, and that tolerance, ~1e-3 of s_max, counts a mixture's real tail as
    zero.) ``beyond_bound``: the share of the squared singular values past the first ``d + 2``, a softmax's rank bound
    (rounding only, for a softmax), a measure with no threshold."""
    exact = copy.deepcopy(module).double().eval()
    lp = exact.log_probs(features.double())
    s = torch.linalg.svdvals(lp)
    tol = max(lp.shape) * torch.finfo(torch.float64).eps * float(s[0])
    bound = module.projection.out_features + 2
    top = [float(v) for v in s]
    return {
        "rank": int((s > tol).sum()),
        "tolerance": tol,
        "beyond_bound": float((s[bound:] ** 2).sum() / (s**2).sum()),
        "contexts": lp.shape[0],
        "top": top,
        **spectrum_measures(top, module.projection.out_features),
    }


RELATIVE_TOLERANCES = (1e-3, 1e-4)  # the ranks at these fractions of the largest singular value


def spectrum_measures(s: List[float], d: int) -> Dict:
    """Measures of a log-probability matrix's singular values ``s`` (all of them, largest first) that do not hinge on
    rounding. The first singular value is close to the matrix's mean row (every entry a log-probability well below
    zero): it holds most of the squared sum (``first_share``) and hides the rest in ``beyond_bound``. ``rank_at``: the
    singular values above each of :data:`RELATIVE_TOLERANCES` x the largest (a softmax's stop at d + 2; a mixture's
    tail counted where it is material); ``beyond_bound_after_first``: the share of the squared singular values past
    the first d + 2 among all but the first (a softmax's: rounding alone)."""
    rest = sum(v * v for v in s[1:])
    return {
        "rank_at": {f"{t:g}": sum(1 for v in s if v > t * s[0]) for t in RELATIVE_TOLERANCES},
        "beyond_bound_after_first": sum(v * v for v in s[d + 2 :]) / rest if rest > 0 else 0.0,
        "first_share": s[0] ** 2 / (s[0] ** 2 + rest),
    }


def train_nll(module: ProjectedHead, data: States) -> float:
    return float(nll_per_block(module, data).mean())


def run_cell(
    args, name: str, d: int, seed: int, lr: float, data: Dict[str, States], log=print, keep: Optional[str] = None
) -> Dict:
    """One cell: trained to the stopping rule (test at the best epoch), the spectrum at the stopping rule's weights,
    and for seeds up to ``--floor-seeds`` the floor run from those weights; or (``keep``, a rate cell) those weights
    saved to ``keep`` instead, for the floor run its rate's cell gets once chosen."""
    out = {"head": name, "d": d, "seed": seed, "lr": lr, "train_tokens": len(data["train"])}
    checkpoint = cell_checkpoint(args, name, d, seed, lr)
    module, out["curve"] = trained(
        args, name, d, seed, lr, data["train"], data["valid"], args.max_epochs, args.patience, checkpoint
    )
    out["parameters"] = sum(p.numel() for p in module.parameters())
    out["cpu_s"] = out["curve"][-1]["cpu_seconds"]  # over every start of a resumed run
    out["valid_nll"] = train_nll(module, data["valid"])
    out["test_nll"] = train_nll(module, data["test"])
    out["stopped"] = ended_by(out["curve"], args.max_epochs, args.patience)
    out["spectrum"] = spectrum(module, data["valid"].states[: args.spectrum_contexts])
    if keep:
        os.makedirs(os.path.dirname(keep), exist_ok=True)
        torch.save(module.state_dict(), keep)
    elif seed <= args.floor_seeds:
        out.update(floor_run(args, name, d, seed, lr, data, module.state_dict()))
    os.remove(checkpoint)  # the cell is whole: its caller saves it
    floor_text = f"train NLL floor {out['train_nll_floor']:.4f}, " if "train_nll_floor" in out else ""
    log(
        f"{name} d={d} seed {seed}: test NLL {out['test_nll']:.4f} (ppl {math.exp(out['test_nll']):.1f}), {floor_text}"
        f"rank {out['spectrum']['rank']}, {out['cpu_s'] + out.get('floor_cpu_s', 0):.0f} CPU s"
    )
    return out


def floor_run(args, name: str, d: int, seed: int, lr: float, data: Dict[str, States], start: Dict) -> Dict:
    """The train-NLL floor: the cell's weights at its stopping rule (``start``) trained on for ``--floor-epochs`` more
    epochs on train (a fresh Adam at the cell's rate, the cell's seed; valid unseen), past the stopping rule however
    the cell ended; its NLL on the first ``--floor-sample`` train tokens at the start and after every epoch, and the
    lowest of them. Resumable like the cell's own training (``OUT/partial/...-floor.pt``, removed once the floor is
    measured)."""
    sample = States(data["train"].states[: args.floor_sample], data["train"].targets[: args.floor_sample], 1)
    # "valid" is the train sample, and a patience of the whole budget never ends the run before it
    checkpoint = floor_checkpoint(args, name, d, seed, lr)
    _, curve = trained(
        args, name, d, seed, lr, data["train"], sample, args.floor_epochs, args.floor_epochs, checkpoint, start
    )
    floors = [c["valid_nll"] for c in curve]
    os.remove(checkpoint)  # the floor is in hand: its caller saves it with the cell
    return {
        "floor_curve": floors,
        "train_nll_floor": min((f for f in floors if math.isfinite(f)), default=math.nan),
        "floor_cpu_s": curve[-1]["cpu_seconds"],
    }


def best_epoch(curve) -> int:
    """The epoch a run's curve marks as its best (the stopping rule's checkpoint)."""
    return next(c["epoch"] for c in curve if c.get("best"))


def ended_by(curve, max_epochs: int, patience: int) -> str:
    """``"max_epochs"`` when the cap ended the run while its valid NLL had improved within the last ``patience``
    epochs, else ``"patience"`` (the rule fired, at the cap or before it)."""
    best = best_epoch(curve)
    return "max_epochs" if len(curve) - 1 >= max_epochs and max_epochs - best < patience else "patience"


def trained(
    args,
    name,
    d,
    seed,
    lr,
    train: States,
    valid: States,
    epochs: int,
    patience: int,
    checkpoint: str,
    start: Optional[Dict] = None,
):
    """``(module, curve)``: the head ``name`` on a projection to ``d``, built from ``seed`` (its weights then set to
    ``start`` if given) and trained by :func:`train_head_on_states` for at most ``epochs``, resumable from
    ``checkpoint``."""
    head, options = HEADS[name]
    torch.manual_seed(seed)
    module = ProjectedHead(train.states.shape[1], d, args.vocab, head, options)
    if start is not None:
        module.load_state_dict(start)
    curve = train_head_on_states(
        module,
        train,
        valid,
        lr=lr,
        max_epochs=epochs,
        patience=patience,
        batch_tokens=args.batch_tokens,
        seed=seed,
        progress=not args.quiet,
        log=lambda *_: None,
        checkpoint=checkpoint,
        checkpoint_seconds=600,
    )
    return module, curve


def cell_checkpoint(args, name: str, d: int, seed: int, lr: float) -> str:
    return os.path.join(args.out, "partial", f"{name}-d{d}-s{seed}-lr{lr:g}.pt")


def floor_checkpoint(args, name: str, d: int, seed: int, lr: float) -> str:
    return cell_checkpoint(args, name, d, seed, lr)[: -len(".pt")] + "-floor.pt"


def cell_path(args, name: str, d: int, seed: int) -> str:
    """A finished cell's record, under ``OUT/cells/``."""
    return os.path.join(args.out, "cells", f"{name}-d{d}-s{seed}.json")


def rate_cell_path(args, name: str, d: int, lr: float, suffix: str = ".json") -> str:
    """A rate cell's record (``.json``) or its kept stopping-rule weights (``.pt``), under ``OUT/rates/``."""
    return os.path.join(args.out, "rates", f"{name}-d{d}-lr{lr:g}{suffix}")


def choose_rate(args, name: str, data, log=print) -> Optional[float]:
    """The head's learning rate: the grid's best valid NLL at ``--rate-d``, seed 1 (cells under ``rates/``); None while
    another process still trains one of its rate cells (:func:`recipes.reproduce.engine.results.claimed`)."""
    losses = {}
    for lr in args.rates:  # (the chosen one's floor comes later, from the weights kept)
        keep = rate_cell_path(args, name, args.rate_d, lr, ".pt")
        record = runtime.cell(
            rate_cell_path(args, name, args.rate_d, lr),
            lambda lr=lr, keep=keep: run_cell(args, name, args.rate_d, 1, lr, data, log, keep=keep),
        )
        if record is not None:
            losses[lr] = record["valid_nll"]
    if len(losses) < len(args.rates):
        return None
    best = runtime.choose_lr(losses)
    log(
        f"{name}: learning rate {best:g} (valid NLL at d={args.rate_d}: "
        + ", ".join(f"{lr:g}: {v:.4f}" for lr, v in sorted(losses.items()))
        + ")"
    )
    return best


def made_cell(args, name: str, d: int, seed: int, lr: float, data, log, where: str) -> Dict:
    """The seed cell ``(name, d, seed)`` at the head's chosen rate ``lr``: trained, or, for the seed-1 cell at
    ``--rate-d``, the chosen rate cell with its floor run added (``where``: the cell's place in the plan, for the
    log)."""
    chosen = rate_cell_path(args, name, d, lr)
    if seed != 1 or not os.path.exists(chosen):
        log(f"{where}: {name} d={d} seed {seed}")
        return run_cell(args, name, d, seed, lr, data, log)
    cell = result_files.load_json(chosen)  # the rate cell is this cell, run already: its floor only
    weights = rate_cell_path(args, name, d, lr, ".pt")
    if not os.path.exists(weights) or "beyond_bound" not in cell["spectrum"]:
        # a rate cell of the map's first code (its floor from a fresh start, its spectrum in float32, its weights not
        # kept), or one restored from another machine (--restore: no weights): this cell runs again whole, as every
        # cell now runs (the rate cell stays the search's record, and its cost counts)
        log(
            f"{where}: {name} d={d} seed {seed} (its rate cell's weights are not here: it ran before the cells kept "
            "their weights, or on another machine or trunk)"
        )
        return {**run_cell(args, name, d, seed, lr, data, log), "rate_cell_trained_again": True}
    if seed <= args.floor_seeds and "train_nll_floor" not in cell:
        cell.update(floor_run(args, name, d, seed, lr, data, torch.load(weights)))
    return cell


#: seconds a process with nothing left to claim waits before it looks again at the cells another process holds
WAIT_SECONDS = 60


#: the options that count something (integers >= 1)
COUNTS = (
    "seeds",
    "rate_d",
    "train_tokens",
    "max_epochs",
    "patience",
    "floor_epochs",
    "floor_seeds",
    "floor_sample",
    "batch_tokens",
    "spectrum_contexts",
)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    p.add_argument("--trunk", required=True, help="the trunk's fairseq checkpoint (lm-ptb's kept softmax seed-1 cell)")
    p.add_argument("--data", required=True, help="the binarised data folder the trunk trained on")
    p.add_argument("--out", default="results/bottleneck_map")
    p.add_argument("--heads", nargs="+", default=list(HEADS), choices=list(HEADS))
    p.add_argument("--dims", type=int, nargs="+", default=DIMS, help="d values (at most the features' width)")
    p.add_argument("--seeds", type=int, default=3, help="seeds 1..N of every (head, d)")
    p.add_argument("--rates", type=float, nargs="+", default=[1e-3, 3e-3, 1e-2, 3e-2], help="Adam rates tried per head")
    p.add_argument("--rate-d", type=int, default=32, help="the d at which each head's rate is chosen (seed 1)")
    p.add_argument("--train-tokens", type=int, default=200_000, help="train on this prefix of the train features")
    p.add_argument("--max-epochs", type=int, default=20)
    p.add_argument("--patience", type=int, default=2)
    p.add_argument("--floor-epochs", type=int, default=10, help="the fixed budget of the train-NLL floor run")
    p.add_argument(
        "--floor-seeds",
        type=int,
        default=1,
        help="seeds 1..N also get the train-NLL floor run (it costs about as much as the cell's own training)",
    )
    p.add_argument("--floor-sample", type=int, default=50_000, help="train tokens the floor's NLL is measured on")
    p.add_argument("--batch-tokens", type=int, default=2048)
    p.add_argument("--spectrum-contexts", type=int, default=2000, help="valid contexts of the log-prob matrix")
    p.add_argument(
        "--restore",
        metavar="PAGE_JSON",
        help="first copy the cells committed in PAGE_JSON (studies/bottleneck_map/records/bottleneck_map.json) into "
        "--out when they came from this trunk (the same checkpoint by md5, or its valid and test NLL equal to 1e-9 "
        "nats: a trunk trained again, bit for bit) and the same options: a new machine goes on from them",
    )
    p.add_argument(
        "--carry-rates",
        action="store_true",
        help="with --restore, where its cells came from another trunk (one trained again, not bit for bit): restore "
        "its rate search alone (each rate cell marked with that trunk's md5), so each head keeps the rate chosen "
        "there on valid NLL; every cell then trains on this trunk, the seed-1 cell at --rate-d included",
    )
    p.add_argument("--plan", action="store_true", help="print the cells and stop")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    args = p.parse_args(argv)
    for key in COUNTS:
        if getattr(args, key) < 1:
            p.error(f"--{key.replace('_', '-')}={getattr(args, key)} is out of range; allowed: an integer >= 1")
    for d in args.dims:
        if d < 1:
            p.error(f"--dims {d} is out of range; allowed: integers >= 1")
    return args


#: the options a committed cell must share with this run to stand for the cell it would make
CELL_OPTIONS = (
    "rates",
    "rate_d",
    "train_tokens",
    "max_epochs",
    "patience",
    "floor_epochs",
    "floor_sample",
    "batch_tokens",
    "spectrum_contexts",
)


def same_trunk(a: Dict, b: Dict) -> bool:
    """Whether two map runs' ``meta`` name the same trunk: the same checkpoint file (its md5: a kept trunk copied to
    another machine, whose features there may round differently), or its valid and test NLL on the cached features
    equal to 1e-9 nats (a trunk trained again bit for bit, on another machine, passes; one that is not, fails)."""
    if a.get("trunk_md5") and a.get("trunk_md5") == b.get("trunk_md5"):
        return True
    return all(
        abs(a.get("trunk_nll", {}).get(s, math.inf) - b.get("trunk_nll", {}).get(s, -math.inf)) <= 1e-9
        for s in ("valid", "test")
    )


def restore(args, meta: Dict, log=print) -> int:
    """Copy the rate cells and cells committed in ``args.restore`` (the page's json) into ``args.out`` where it has
    none, when they came from the same trunk (:func:`same_trunk`) and the same :data:`CELL_OPTIONS`; returns how many
    it copied. From another trunk, with ``--carry-rates``, its rate cells alone, each marked with its trunk's md5 (so
    the page tells them apart). A committed rate cell comes back without its weights: the seed-1 cell at its chosen
    rate is then trained again whole (see :func:`made_cell`)."""
    if not args.restore:
        return 0
    committed = result_files.load_json(args.restore) or {}
    before = committed.get("meta") or {}
    differ = [k for k in CELL_OPTIONS if before.get("args", {}).get(k) != getattr(args, k)]
    if differ:
        log(f"--restore {args.restore}: its cells ran with other {', '.join(differ)}; nothing restored")
        return 0
    same = same_trunk(before, meta)
    if not same and not args.carry_rates:
        log(
            f"--restore {args.restore}: its cells came from another trunk (valid / test NLL "
            f"{before.get('trunk_nll')} there, {meta['trunk_nll']} here); nothing restored (--carry-rates restores "
            "its rate search alone)"
        )
        return 0
    copied = runtime.restore(
        committed.get("rate_cells", []),
        lambda c: rate_cell_path(args, c["head"], c["d"], c["lr"]) if c["head"] in args.heads else None,
        saved=lambda c: c if same else {"trunk_md5": before.get("trunk_md5"), **c},
    )
    if not same:
        log(f"restored {copied} rate cell(s) from {args.restore} (another trunk: its rates carry over, no cell)")
        return copied
    copied += runtime.restore(
        committed.get("cells", []),
        lambda c: (
            cell_path(args, c["head"], c["d"], c["seed"]) if c["head"] in args.heads and c["d"] in args.dims else None
        ),
    )
    log(f"restored {copied} cell(s) from {args.restore} (the same trunk)")
    return copied


def main(argv=None, log=print) -> Dict:
    args = parse_args(argv)
    cells = [(h, d, s) for s in range(1, args.seeds + 1) for d in args.dims for h in args.heads]
    if args.plan:
        floor_cells = [c for c in cells if c[2] <= args.floor_seeds]
        floors = "seed 1" if args.floor_seeds == 1 else f"seeds 1-{min(args.floor_seeds, args.seeds)}"
        log(
            f"{len(cells)} cells ({len(args.heads)} heads x {len(args.dims)} d x {args.seeds} seeds) and "
            f"{len(args.heads) * len(args.rates)} rate cells at d={args.rate_d} (the chosen rate's cell is the seed-1 "
            f"cell at d={args.rate_d}: {len(cells) + len(args.heads) * (len(args.rates) - 1)} trainings in all); the "
            f"floor runs: the {len(floor_cells)} cells of {floors} (a rate cell's only where its rate is chosen)"
        )
        return {"cells": cells}
    data = {split: cached_features(args, split) for split in STREAMS}
    width = data["train"].states.shape[1]
    too_wide = [d for d in args.dims if d > width]
    if too_wide:
        raise SystemExit(
            f"--dims {too_wide}: above the trunk's feature width {width} (a softmax's rank cannot exceed it + 1)"
        )
    data["train"] = States(data["train"].states[: args.train_tokens], data["train"].targets[: args.train_tokens], 1)
    from fairseq.data import Dictionary

    args.vocab = len(Dictionary.load(os.path.join(args.data, "dict.txt")))
    meta = {
        "trunk": args.trunk,
        "trunk_md5": result_files.file_md5(args.trunk),
        "tokens": {s: len(d) for s, d in data.items()},
        "width": width,
        "vocab": args.vocab,
        "trunk_nll": trunk_nll(args.trunk, data, args.data),
        "trunk_curve": trunk_curve(args.trunk),
        "args": {k: v for k, v in vars(args).items() if k != "vocab"},
        "threads": torch.get_num_threads(),
    }
    result_files.save_json(os.path.join(args.out, "meta.json"), meta)
    restore(args, meta, log)
    told, waited = set(), None  # the heads whose rate the log has given; the cells waited for at the last look
    while True:
        rates = {}
        for h in args.heads:
            lr = choose_rate(args, h, data, log if h not in told else lambda *_: None)
            if lr is not None:
                rates[h] = lr
        told |= set(rates)
        if len(rates) == len(args.heads):
            result_files.save_json(os.path.join(args.out, "rates.json"), rates)
        waiting, made = 0, 0  # cells another process holds (or whose head's rate cells it trains); cells made here
        for i, (h, d, s) in enumerate(cells, 1):
            path = cell_path(args, h, d, s)
            if os.path.exists(path):
                continue
            if h not in rates:
                waiting += 1
                continue
            where = f"cell {i}/{len(cells)}"
            if runtime.cell(
                path, lambda h=h, d=d, s=s, lr=rates[h], where=where: made_cell(args, h, d, s, lr, data, log, where)
            ):
                made += 1
            else:
                waiting += 1
        if not waiting:
            break
        if not made:  # every cell left is another process's: look again later
            if waiting != waited:
                log(f"waiting for {waiting} cell(s) another process holds (looking every {WAIT_SECONDS} s)")
            waited = waiting
            time.sleep(WAIT_SECONDS)
    results = [result_files.load_json(cell_path(args, h, d, s)) for h, d, s in cells]
    return {"meta": meta, "rates": rates, "cells": results}
