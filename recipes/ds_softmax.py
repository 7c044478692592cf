"""DS-Softmax (Liao et al. 2019): recover a hidden class hierarchy, then answer top-1 queries fast.

Tasks (``--tasks``, default: all that can run here):

* ``synthetic-10x10`` / ``synthetic-100x100``: the poster's two-level hierarchy. S super classes
  are sampled (centres ~ N(0, I_d)), C sub classes around each (centre = super + N(0, s_sub^2 I)),
  points around each sub class (+ N(0, s_pt^2 I)); the label is the sub class (V = S x C), the
  super class is hidden. The hidden state fed to the head is the point itself.
* ``ptb`` / ``wikitext-2``: a word-level LSTM language model (V = 10,000 / 33,278) trained on the corpus's
  ``valid.txt`` (a small text, so the LM trains in minutes; the train splits are not read) and scored on
  ``test.txt``; its last hidden states feed the heads. WikiText-2 is the poster's headline row (64 experts);
  ``--experts 16 32 64`` runs each E on the same trained LM (the curve).

For each task: (1) a full softmax is trained; (2) a DS-Softmax head with ``--experts`` experts,
every expert started from the trained softmax, is trained on the same hidden states with its group
lasso, balancing loss and self-scheduled pruning; (3) both are scored on held-out data: top-1
accuracy (the paper's metric), the classes each expert keeps, how pure the experts are with
respect to the hidden super classes (synthetic), the FLOPs reduction, and the wall-clock time of
``head.topk(hidden, 1)`` at batch 1 and 64 against the full softmax's, measured in the same run
(interleaved rounds, medians; :mod:`hf_heads.cli.timing`).

    python -m recipes.ds_softmax                                   # every task but wikitext-2, ~13 min on 2 cores
    python -m recipes.ds_softmax --tasks synthetic-10x10 --steps 300
    python -m recipes.ds_softmax --tasks wikitext-2 --experts 16 32 64   # the poster's Wiki-2 row and its curve
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Dict, List, Tuple

import torch

import hf_heads
from recipes.common.hidden_tasks import Task, make_lm_task, train_head
from hf_heads.cli.timing import time_per_call
from recipes.common import data as data_paths

PAPER = {  # the poster's table: full-softmax top-1, DS-64 top-1, FLOPs reduction, ms full -> DS
    "PTB": {"full": 0.252, "ds": 0.258, "flops": 15.99, "ms": (0.73, 0.05)},
    "Wiki-2": {"full": 0.257, "ds": 0.259, "flops": 23.86, "ms": (3.07, 0.15)},
}


# ----------------------------------------------------------------------------- tasks
def make_hierarchy(
    num_super: int, num_sub: int, dim: int, per_class: int, seed: int, sub_std: float = 0.5, point_std: float = 0.25
) -> Task:
    """The poster's synthetic two-level hierarchy (super labels hidden); class v's super is v // num_sub."""
    g = torch.Generator().manual_seed(seed)
    supers = torch.randn(num_super, dim, generator=g)
    subs = (supers[:, None, :] + sub_std * torch.randn(num_super, num_sub, dim, generator=g)).reshape(-1, dim)
    vocab = num_super * num_sub

    def sample(n_per_class):
        y = torch.arange(vocab).repeat_interleave(n_per_class)
        x = subs[y] + point_std * torch.randn(len(y), dim, generator=g)
        perm = torch.randperm(len(y), generator=g)
        return x[perm], y[perm]

    train_h, train_y = sample(per_class)
    test_h, test_y = sample(max(2, per_class // 4))
    return Task(
        f"synthetic-{num_super}x{num_sub}",
        train_h,
        train_y,
        test_h,
        test_y,
        vocab,
        super_of=torch.arange(vocab) // num_sub,
        info={"dim": dim, "sub_std": sub_std, "point_std": point_std, "train_points": len(train_y)},
    )


# ----------------------------------------------------------------------------- training
@torch.no_grad()
def top1_accuracy(head, h: torch.Tensor, y: torch.Tensor, batch: int = 4096) -> float:
    hits = sum(
        int((head.topk(h[i : i + batch], 1)[1][:, 0] == y[i : i + batch]).sum()) for i in range(0, len(y), batch)
    )
    return hits / len(y)


def expert_purity(head, super_of: torch.Tensor) -> Dict:
    """How well the experts recover the hidden super classes: per expert, the share of its surviving
    classes that belong to its majority super class; and the super x expert count matrix."""
    num_super = int(super_of.max()) + 1
    counts = torch.stack([torch.bincount(super_of[m], minlength=num_super) for m in head.mask.cpu()])  # [E, S]
    alive = counts.sum(1) > 0
    purity = counts.max(1).values[alive].float() / counts.sum(1)[alive].float()
    majority = counts.argmax(1)[alive]
    return {
        "counts": counts,
        "mean_purity": float(purity.mean()),
        "min_purity": float(purity.min()),
        "supers_covered": int(majority.unique().numel()),
        "num_super": num_super,
        "experts_alive": int(alive.sum()),
    }


def time_top1(heads: Dict[str, torch.nn.Module], h: torch.Tensor, rounds: int, queries: int) -> Dict:
    """Median time per query of ``head.topk(hidden, 1)`` at batch 1 and 64, interleaved."""
    out = {}
    for batch in (1, 64):
        qs = [h[i * batch : (i + 1) * batch] for i in range(max(1, queries // batch))]
        qs = [q for q in qs if len(q) == batch] or [h[:batch]]
        t = time_per_call({n: (lambda q, m=m: m.topk(q, 1)) for n, m in heads.items()}, qs, rounds=rounds)
        out[batch] = {n: v / batch for n, v in t.items()}  # seconds per query
    return out


# ----------------------------------------------------------------------------- one task
def hierarchy_shape(name: str) -> Tuple[int, int]:
    """``(super classes, sub classes per super class)`` of a synthetic task's name (``synthetic-SxC``)."""
    s, c = (int(v) for v in name.split("-")[1].split("x"))
    return s, c


def default_experts(name: str) -> int:
    """E when --experts is not given: the number of super classes of a synthetic task (``synthetic-SxC``: S), 16 on
    a language model. Known from the task's name, so ``--resume`` finds a finished default row before any work."""
    return hierarchy_shape(name)[0] if name.startswith("synthetic-") else 16


def run_task(task: Task, args, experts: int) -> Dict:
    d = task.train_h.shape[1]
    V = task.vocab_size
    print(f"\n== {task.name}: V={V}, d={d}, {len(task.train_y)} train / {len(task.test_y)} test")
    if task.softmax is None:
        full = hf_heads.build_head("softmax", hidden_size=d, vocab_size=V)
        secs = train_head(
            full,
            task.train_h,
            task.train_y,
            args.softmax_steps,
            args.batch,
            args.lr,
            args.seed,
            f"{task.name} softmax",
            not args.no_progress,
        )
        print(f"softmax trained in {secs:.0f}s")
    else:
        full = task.softmax
    # the group lasso acts per class row while each row's share of the cross-entropy gradient shrinks
    # like 1/V: coefficients that prune cleanly scale like 1/V (measured: 0.1 at V=100 ... 0.001 at V=10,000)
    options = {"num_experts": experts, "group_lasso": args.lasso_per_class / V, **args.ds_options}
    options.setdefault("prune_start", args.steps // 5)
    options.setdefault("prune_interval", max(1, args.steps // 50))
    ds = hf_heads.build_head(
        "ds_softmax", hidden_size=d, vocab_size=V, weight=full.weight.detach(), bias=full.bias.detach(), **options
    )
    if args.gate_init == "kmeans":
        ds.init_gate_from_hidden(task.train_h, seed=args.seed)
    secs = train_head(
        ds,
        task.train_h,
        task.train_y,
        args.steps,
        args.batch,
        args.ds_lr,
        args.seed,
        f"{task.name} ds_softmax",
        not args.no_progress,
    )
    report = ds.sparsity_report(task.test_h)
    acc_full = top1_accuracy(full, task.test_h, task.test_y)
    acc_ds = top1_accuracy(ds, task.test_h, task.test_y)
    with torch.no_grad():
        covered = float(ds.mask[ds._route(task.test_h)[0], task.test_y].float().mean())
    times = time_top1({"softmax": full, "ds_softmax": ds}, task.test_h, args.timing_rounds, args.timing_queries)
    cpe = torch.tensor(report["classes_per_expert"]).float()
    result = {
        "task": task.name,
        "vocab_size": V,
        "dim": d,
        "experts": experts,
        "ds_options": ds.config.to_dict(),
        "ds_train_seconds": secs,
        "top1_softmax": acc_full,
        "top1_ds": acc_ds,
        "target_in_chosen_expert": covered,
        "classes_per_expert_mean": float(cpe[cpe > 0].mean()) if (cpe > 0).any() else 0.0,
        "classes_per_expert_max": int(cpe.max()),
        "experts_alive": int((cpe > 0).sum()),
        "expected_classes_computed": report["expected_classes_computed"],
        "flops_reduction": report["flops_reduction"],
        "ms_per_query": {b: {n: 1e3 * v for n, v in t.items()} for b, t in times.items()},
        "speedup": {b: t["softmax"] / t["ds_softmax"] for b, t in times.items()},
        "info": task.info,
    }
    if task.super_of is not None:
        pur = expert_purity(ds, task.super_of)
        result.update({k: v for k, v in pur.items() if k != "counts"})
        if args.plot:
            plot_experts(pur["counts"], task.name, os.path.join(args.out, f"{task.name}-experts.png"))
    print(format_row(result))
    return result


# ----------------------------------------------------------------------------- output
HEADER = (
    "| task | V | d | E | top-1 softmax | top-1 DS | classes/expert (mean, max) | target in expert | "
    "FLOPs reduction | ms/query b=1 softmax -> DS | speed-up b=1 | speed-up b=64 | purity |"
)


def format_row(r: Dict) -> str:
    ms = r["ms_per_query"][1]
    purity = f"{r['mean_purity']:.2f} ({r['supers_covered']}/{r['num_super']} supers)" if "mean_purity" in r else "-"
    return (
        f"| {r['task']} | {r['vocab_size']} | {r['dim']} | {r['experts']} ({r['experts_alive']} alive) | "
        f"{100 * r['top1_softmax']:.2f}% | {100 * r['top1_ds']:.2f}% | "
        f"{r['classes_per_expert_mean']:.0f}, {r['classes_per_expert_max']} | "
        f"{100 * r['target_in_chosen_expert']:.1f}% | {r['flops_reduction']:.1f}x | "
        f"{ms['softmax']:.3f} -> {ms['ds_softmax']:.3f} | {r['speedup'][1]:.1f}x | {r['speedup'][64]:.1f}x | "
        f"{purity} |"
    )


def format_table(results: List[Dict]) -> str:
    rows = [HEADER, "|" + "---|" * (HEADER.count("|") - 1)]
    rows += [format_row(r) for r in results]
    rows.append("")
    rows.append(
        "Paper (poster table, GPU): "
        + "; ".join(
            f"{name} top-1 {p['full']} -> {p['ds']} (DS-64), {p['flops']}x FLOPs, {p['ms'][0]} -> {p['ms'][1]} ms"
            for name, p in PAPER.items()
        )
        + " (20x wall-clock)."
    )
    return "\n".join(rows)


def plot_experts(counts: torch.Tensor, name: str, path: str) -> None:
    """Heat map: surviving classes of each super class (columns) in each expert (rows, sorted by
    majority super class). A recovered hierarchy is a permuted diagonal."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    alive = counts.sum(1) > 0
    c = counts[alive]
    order = torch.argsort(c.argmax(1) * (c.shape[1] + 1) - c.max(1).values)
    fig, ax = plt.subplots(figsize=(6, 5))
    im = ax.imshow(c[order].numpy(), aspect="auto", cmap="viridis", interpolation="nearest")
    ax.set_xlabel("hidden super class")
    ax.set_ylabel("expert (sorted by majority super class)")
    ax.set_title(f"DS-Softmax {name}: surviving classes per expert")
    fig.colorbar(im, ax=ax, label="classes kept")
    fig.tight_layout()
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def from_json(row: Dict) -> Dict:
    """A row read back from json: the batch sizes of ``ms_per_query`` / ``speedup`` as ints again (json keeps them
    as strings)."""
    return {**row, **{k: {int(b): v for b, v in row[k].items()} for k in ("speedup", "ms_per_query")}}


def load_rows(path: str) -> List[Dict]:
    """The rows of a ``results.json`` this recipe wrote."""
    with open(path) as f:
        return [from_json(r) for r in json.load(f)]


# ----------------------------------------------------------------------------- CLI
TASKS = ("synthetic-10x10", "synthetic-100x100", "ptb", "wikitext-2")
#: the language-model tasks: their text directory option and default hidden size (WikiText-2's 33,278 words x 64
#: experts x d float32 weights, with Adam's two moments and the gradient: 17 GB at d = 512, 8.7 GB at 256)
LM_TASKS = {"ptb": ("data_dir", 512), "wikitext-2": ("wt2_dir", 256)}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    p.add_argument(
        "--tasks",
        nargs="+",
        default=None,
        choices=TASKS,
        help="tasks to run (default: all; ptb only when --data-dir has PTB)",
    )
    p.add_argument(
        "--data-dir",
        default=data_paths.corpus("ptb"),
        help="directory with PTB valid.txt and test.txt",
    )
    p.add_argument(
        "--wt2-dir",
        default=data_paths.corpus("wikitext-2"),
        help="directory with WikiText-2's valid.txt and test.txt",
    )
    p.add_argument(
        "--dim", type=int, default=None, help="hidden size d (default: 32 synthetic, 512 ptb, 256 wikitext-2)"
    )
    p.add_argument("--per-class", type=int, default=20, help="synthetic: training points per class")
    p.add_argument("--lm-epochs", type=int, default=4, help="ptb: LSTM training epochs")
    p.add_argument(
        "--experts",
        type=int,
        nargs="+",
        default=None,
        help="E, one or several (each trained on the same task; default: the number of super classes "
        "on synthetic tasks, 16 on the language models, where the paper uses 64: E x V x d "
        "parameters train slowly on a CPU)",
    )
    p.add_argument(
        "--ds-options",
        type=json.loads,
        default={},
        help="extra ds_softmax options as JSON, e.g. '{\"group_lasso\": 0.005}'",
    )
    p.add_argument(
        "--gate-init",
        choices=("kmeans", "random"),
        default="kmeans",
        help="start the gate at spherical k-means clusters of the training hidden states "
        "(DSSoftmaxHead.init_gate_from_hidden), or at random as in the paper",
    )
    p.add_argument(
        "--lasso-per-class", type=float, default=10.0, help="group_lasso = this / V unless --ds-options sets it"
    )
    p.add_argument("--steps", type=int, default=500, help="DS-Softmax training steps")
    p.add_argument("--softmax-steps", type=int, default=600, help="synthetic: full softmax training steps")
    p.add_argument("--batch", type=int, default=1024, help="training batch (hidden states)")
    p.add_argument("--lr", type=float, default=1e-2, help="Adam learning rate of the full softmax")
    p.add_argument("--ds-lr", type=float, default=5e-3, help="Adam learning rate of DS-Softmax")
    p.add_argument("--timing-rounds", type=int, default=7, help="interleaved timing rounds (median)")
    p.add_argument("--timing-queries", type=int, default=640, help="queries per timing round")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    p.add_argument("--out", default="results/ds_softmax", help="output directory")
    p.add_argument("--no-plot", dest="plot", action="store_false", help="no expert heat maps")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.add_argument(
        "--resume",
        action="store_true",
        help="keep the rows already in OUT/results.json (same task and E) and run only the others (a "
        "language model task loads the LM its first run kept in OUT, lm-*.pt, instead of training "
        "it again; kept whether or not --resume is given)",
    )
    return p.parse_args(argv)


def main(argv=None) -> List[Dict]:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.experts and min(args.experts) < 1:
        raise SystemExit(f"--experts must be >= 1 (got {' '.join(map(str, args.experts))})")
    has = {
        name: all(os.path.isfile(os.path.join(getattr(args, option), f)) for f in ("valid.txt", "test.txt"))
        for name, (option, _) in LM_TASKS.items()
    }
    # by default every task but wikitext-2 (an hour and ~9 GB at 64 experts: ask for it)
    tasks = args.tasks or [t for t in TASKS if t not in LM_TASKS or (t == "ptb" and has[t])]
    for name in tasks:
        if name in LM_TASKS and not has[name]:
            option = LM_TASKS[name][0]
            raise SystemExit(
                f"{name}: {getattr(args, option)} has no valid.txt/test.txt; pass "
                f"--{option.replace('_', '-')} pointing to its text files, or leave out the {name} task"
            )
    if args.tasks is None and not has["ptb"]:
        print(f"(ptb skipped: no PTB text in {args.data_dir})")
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "results.json")
    done = load_rows(path) if args.resume and os.path.isfile(path) else []  # an earlier run's rows, kept
    results = []
    for name in tasks:
        todo = [
            e
            for e in (args.experts or [default_experts(name)])
            if not any(r["task"] == name and r["experts"] == e for r in done)
        ]
        results += [r for r in done if r["task"] == name]
        if not todo:
            print(f"{name}: every expert count done ({path}), skipped")
            continue
        if name in LM_TASKS:  # the trained LM is kept in --out: a resumed run does not train it again
            option, dim = LM_TASKS[name]
            task = make_lm_task(
                getattr(args, option),
                name,
                args.dim or dim,
                args.lm_epochs,
                args.seed,
                not args.no_progress,
                cache_dir=args.out,
            )
        else:
            s, c = hierarchy_shape(name)
            task = make_hierarchy(s, c, args.dim or 32, args.per_class, args.seed)
        for experts in todo:
            results.append(run_task(task, args, experts))
            with open(path, "w") as f:  # after every expert count: a run cut short keeps what it finished
                json.dump(results, f, indent=2)
    table = format_table(results)
    print("\n" + table)
    with open(os.path.join(args.out, "results.md"), "w") as f:
        f.write(table + "\n")
    print(f"\nwrote {args.out}/results.md, results.json" + (" and expert heat maps" if args.plot else ""))
    return results


if __name__ == "__main__":
    from hf_heads.cli.runner import run

    run(main)
