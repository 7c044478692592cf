"""Mixtape's two forms of its projections, each at its own best learning rate, under Adam and under SGD.

Mixtape's ``scaled_input=True`` (Mesh TensorFlow's form, made for Adafactor) multiplies ``g`` by ``d^-1/2`` before
the projections ``H_k``, ``U_k``, ``u_k`` and draws them with unit variance; ``scaled_input=False`` (torch's
``nn.Linear`` form) draws them ``d^-1/2`` times smaller. Both compute the same function at initialisation; an
optimizer then moves the scaled form's projections about ``sqrt(d)`` (Adam) or ``d`` (SGD) times more slowly
relative to the function than the rest of the model. A learning rate tuned per form can make up for part of it
only, since it moves the rest of the model too.

This recipe measures it where nothing but the output layer matters: the synthetic softmax-bottleneck task of
:mod:`recipes.synthetic_bottleneck` (free context embeddings, one head fitted to Dirichlet distributions; mean
KL(P* || P) in nats after a fixed number of full-batch steps, lower is better). For each optimizer and form the
learning rate is chosen on a tuning seed (seed 0: its own task and initialisation) from a grid (grown by a step
past an end that was best, up to 3 times); the chosen rates
then train ``--seeds`` other seeds (1..S), each seed one task and one initialisation shared by both forms, so the
forms are compared seed by seed: the mean paired difference of KL (nn.Linear minus scaled), its 95% interval, the
paired t-test and the sign test (:mod:`recipes.common.stats`), Holm-adjusted over the optimizers. Every run is
kept in ``OUT/results.json`` as it finishes (a rerun continues); ``OUT/results.md`` has the tables.

    python -m studies.mixtape_forms --out results/mixtape_forms       # 2 optimizers x 2 forms, 4 rates, 5 seeds
"""

from __future__ import annotations

import argparse
import json
import math
import os
from typing import Dict, List, Optional, Sequence

import torch

from recipes import synthetic_bottleneck as sb
from recipes.common import stats
from recipes.common import runtime

#: the two forms, by the name the tables give them: ``scaled_input`` of each
FORMS = {"scaled": True, "nn.Linear": False}
#: learning-rate grids (cosine decay from the rate): the loss is a mean over contexts, so plain SGD needs large rates
#: for the per-context embeddings to move at all
DEFAULT_LRS = {"adam": [0.003, 0.01, 0.03, 0.1], "sgd": [30.0, 100.0, 300.0, 1000.0]}


def run_key(optimizer: str, form: str, lr: float, seed: int) -> str:
    return f"{optimizer}/{form}/lr{lr:g}/seed{seed}"


def choose(runs: Dict[str, Dict], optimizer: str, form: str, lrs: Sequence[float]) -> Optional[float]:
    """The rate of the lowest final KL on the tuning seed (0) among ``lrs``; None until all of them ran, or when every
    one diverged. A run that diverged (KL not finite) is never chosen."""
    kls = {lr: runs.get(run_key(optimizer, form, lr, 0), {}).get("kl") for lr in lrs}
    if any(k is None for k in kls.values()) or not any(math.isfinite(k) for k in kls.values()):
        return None
    return runtime.choose_lr({lr: k if math.isfinite(k) else math.inf for lr, k in kls.items()})


#: how many rates a grid grows by, at most, past an end that was best (each a grid step further)
MAX_GROWTH = 3


def grown_grid(runs: Dict[str, Dict], optimizer: str, form: str, grid: Sequence[float], run_rate) -> List[float]:
    """``grid`` run on the tuning seed (``run_rate(lr)``), grown while its best rate is an end of it: one rate a
    grid step beyond that end (the ratio of the two rates there, 3 significant digits), at most :data:`MAX_GROWTH`
    times (:func:`recipes.common.runtime.grown_grid`). Returns the rates run."""
    return runtime.grown_grid(
        grid, lambda lr: runs[run_key(optimizer, form, lr, 0)]["kl"], run_rate, MAX_GROWTH, digits=3
    )


def compare(runs: Dict[str, Dict], optimizer: str, chosen: Dict[str, float], seeds: Sequence[int]):
    """nn.Linear minus scaled, final KL per seed, each form at its chosen rate: ``(stats.Paired, seeds where the
    nn.Linear form's KL is lower)``."""
    kl = {f: [runs[run_key(optimizer, f, chosen[f], s)]["kl"] for s in seeds] for f in FORMS}
    return stats.paired(kl["nn.Linear"], kl["scaled"]), sum(a < b for a, b in zip(kl["nn.Linear"], kl["scaled"]))


def format_tables(runs: Dict[str, Dict], setup: Dict, grids: Dict[str, Dict[str, List[float]]]) -> str:
    """Markdown: per optimizer, the tuning seed's KL at every rate of ``grids`` (``{optimizer: {form: rates}}``, as
    :func:`grown_grid` ran them; bold: chosen) and the evaluation seeds' KL and mode matching at the chosen rates,
    then the paired comparisons (Holm over the optimizers) and what they show."""
    seeds = list(range(1, setup["seeds"] + 1))
    lines = [
        f"Synthetic task: N={setup['num_contexts']} contexts, M={setup['num_outcomes']} outcomes, "
        f"d={setup['dim']}, Dirichlet alpha={setup['alpha']}, {setup['steps']} full-batch steps (cosine decay), "
        f"Mixtape with {json.dumps(setup['head_options'])}; final KL(P*||P) in nats (lower is better).",
        "",
    ]
    results = []
    for opt, by_form in grids.items():
        lrs = sorted(set().union(*by_form.values()))
        chosen = {f: choose(runs, opt, f, by_form[f]) for f in FORMS}
        lines += [
            f"**{opt}**: KL on the tuning seed (0) at every rate (bold: chosen)",
            "",
            "| form | " + " | ".join(f"lr {lr:g}" for lr in lrs) + " |",
            "|---|" + "---|" * len(lrs),
        ]
        for f in FORMS:
            cells = []
            for lr in lrs:
                r = runs.get(run_key(opt, f, lr, 0))
                text = "-" if r is None else f"{r['kl']:.4f}"
                cells.append(f"**{text}**" if lr == chosen[f] else text)
            lines.append(f"| {f} | " + " | ".join(cells) + " |")
        lines.append("")
        if any(c is None for c in chosen.values()):
            continue
        done = [s for s in seeds if all(run_key(opt, f, chosen[f], s) in runs for f in FORMS)]
        if len(done) < 2:
            continue
        lines += [
            f"Seeds {done[0]}-{done[-1]} at the chosen rates:",
            "",
            "| form | lr | KL mean ± std | mode matching % (mean) |",
            "|---|---|---|---|",
        ]
        for f in FORMS:
            kl = torch.tensor([runs[run_key(opt, f, chosen[f], s)]["kl"] for s in done], dtype=torch.float64)
            mm = sum(runs[run_key(opt, f, chosen[f], s)]["mode_matching"] for s in done) / len(done)
            lines.append(f"| {f} | {chosen[f]:g} | {kl.mean():.4f} ± {kl.std():.4f} | {mm:.1f} |")
        lines.append("")
        results.append((opt, compare(runs, opt, chosen, done)))
    if results:
        adjusted = stats.holm([r.p for _, (r, _) in results])
        lines += [
            "Paired: nn.Linear minus scaled, final KL per seed (negative: the nn.Linear form fits better):",
            "",
            "| optimizer | seeds | mean difference [95% CI] | paired t p | Holm p | sign test p | seeds nn.Linear "
            "lower |",
            "|---|---|---|---|---|---|---|",
        ]
        words = []
        for (opt, (r, lower)), p_adj in zip(results, adjusted):
            lines.append(
                f"| {opt} | {r.n} | {r.mean:+.4f} [{r.low:+.4f}, {r.high:+.4f}] | {stats.format_p(r.p)} | "
                f"{stats.format_p(p_adj)} | {stats.format_p(r.p_sign)} | {lower}/{r.n} |"
            )
            if p_adj is not None and p_adj <= 0.05:
                words.append(
                    f"Under {opt} the {'nn.Linear' if r.mean < 0 else 'scaled'} form fits better "
                    f"({r.mean:+.4f} nats, Holm p = {stats.format_p(p_adj)})"
                )
            else:
                words.append(
                    f"Under {opt} the forms do not differ significantly ({r.mean:+.4f} nats, Holm p = "
                    f"{stats.format_p(p_adj)})"
                )
        lines += ["", "**What it shows.** " + ". ".join(words) + ".", ""]
    return "\n".join(lines)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m studies.mixtape_forms",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    sb.add_task_args(p, dim=64, steps=300)  # d: the hidden size the projections read
    p.add_argument("--seeds", type=int, default=5, help="evaluation seeds (1..S) after the tuning seed 0")
    p.add_argument("--adam-lrs", type=float, nargs="+", default=DEFAULT_LRS["adam"], help="Adam's grid")
    p.add_argument("--sgd-lrs", type=float, nargs="+", default=DEFAULT_LRS["sgd"], help="SGD's grid")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    p.add_argument("--out", default="results/mixtape_forms", help="output directory")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    args = p.parse_args(argv)
    sb.check_task_args(p, args)
    if args.seeds < 2:
        p.error(f"--seeds={args.seeds} is out of range; allowed: an integer >= 2 (a paired test needs two)")
    for flag, grid in (("--adam-lrs", args.adam_lrs), ("--sgd-lrs", args.sgd_lrs)):
        if any(not lr > 0 for lr in grid):
            p.error(f"{flag}={' '.join(map(str, grid))}: every rate must be > 0")
    return args


def main(argv=None) -> Dict[str, Dict]:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    options = {**sb.DEFAULT_HEAD_OPTIONS["mixtape"]}
    setup = {
        "num_contexts": args.num_contexts,
        "num_outcomes": args.num_outcomes,
        "dim": args.dim,
        "alpha": args.alpha,
        "steps": args.steps,
        "seeds": args.seeds,
        "head_options": options,
        "lrs": {"adam": args.adam_lrs, "sgd": args.sgd_lrs},
    }
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "results.json")
    saved = json.load(open(path)) if os.path.isfile(path) else {}
    runs: Dict[str, Dict] = saved.get("runs", {}) if saved.get("setup") == setup else {}  # other settings: anew
    tasks: Dict[int, torch.Tensor] = {}

    def run(opt: str, form: str, lr: float, seed: int) -> None:
        key = run_key(opt, form, lr, seed)
        if key in runs:
            return
        if seed not in tasks:
            tasks[seed] = sb.make_task(args.num_contexts, args.num_outcomes, args.alpha, seed)
        r = sb.train_head(
            "mixtape",
            tasks[seed],
            args.dim,
            args.steps,
            lr,
            seed,
            {**options, "scaled_input": FORMS[form]},
            progress=not args.no_progress,
            optimizer=opt,
        )
        runs[key] = {"kl": r["kl"], "mode_matching": r["mode_matching"], "seconds": r["train_seconds"]}
        print(f"{key}: KL {r['kl']:.4f}, mode matching {r['mode_matching']:.1f}%", flush=True)
        with open(path, "w") as f:  # after every run: a rerun continues
            json.dump({"setup": setup, "runs": runs}, f, indent=1)

    grids: Dict[str, Dict[str, List[float]]] = {}
    for opt, lrs in setup["lrs"].items():
        for form in FORMS:
            rates = grown_grid(runs, opt, form, lrs, lambda lr, opt=opt, form=form: run(opt, form, lr, 0))
            grids.setdefault(opt, {})[form] = rates
            chosen = choose(runs, opt, form, rates)
            if chosen is None:
                raise SystemExit(
                    f"{opt} / {form}: every rate of the grid diverged on the tuning seed; give lower "
                    f"rates (--{opt}-lrs)"
                )
            for seed in range(1, args.seeds + 1):
                run(opt, form, chosen, seed)
    with open(path, "w") as f:
        json.dump({"setup": setup, "runs": runs, "grids": grids}, f, indent=1)
    text = format_tables(runs, setup, grids)
    print("\n" + text)
    with open(os.path.join(args.out, "results.md"), "w") as f:
        f.write(text + "\n")
    return runs
