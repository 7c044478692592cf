"""DS-Softmax (Liao et al. 2019): recover a hidden class hierarchy, then answer top-1 queries fast.

Tasks (``--tasks``, default: all that can run here):

* ``synthetic-10x10`` / ``synthetic-100x100``: the poster's two-level hierarchy. S super classes
  are sampled (centres ~ N(0, I_d)), C sub classes around each (centre = super + N(0, s_sub^2 I)),
  points around each sub class (+ N(0, s_pt^2 I)); the label is the sub class (V = S x C), the
  super class is hidden. The hidden state fed to the head is the point itself.
* ``ptb`` / ``wikitext-2``: a word-level LSTM language model trained on the corpus's train split
  (:func:`studies.common.lms.split_task`: PTB's mini AWD-LSTM kept in ``artifacts/lm-ptb``, V = 10,002; WikiText-2's
  2-layer LSTM of hidden size 200, the poster's, V = 33,278, trained in ``--lm-dir`` the first time) and scored on
  ``test.txt``; its last hidden states feed the heads: the heads train on the states of the first ``--train-tokens``
  train tokens, with a valid-based stop (top-1 on valid). WikiText-2 is the poster's headline row (64 experts);
  ``--experts 16 32 64`` runs each E on the same trained LM (the curve).

For each task: (1) a full softmax is trained (synthetic), or the LM's own is taken and a copy of it is given
DS-Softmax's extra training, the same optimizer, steps and valid-based stop on the same states (the control: a top-1
difference is then the head's, not the extra training's); (2) a DS-Softmax head with ``--experts`` experts,
every expert started from the trained softmax, is trained on the same hidden states with its group
lasso, balancing loss and self-scheduled pruning; (3) both are scored on held-out data: top-1
accuracy (the paper's metric; beside the control with McNemar's paired test), perplexity, the classes each
expert keeps, how pure the experts are with respect to the hidden super classes (synthetic), the FLOPs reduction,
and the wall-clock time of ``head.topk(hidden, 1)`` at batch 1 and 64 against the full softmax's, measured in the
same run (interleaved rounds, medians; :mod:`hf_heads.cli.timing`).

    python -m studies.fast_softmax.ds_softmax           # the synthetic tasks and ptb (each row: its seconds)
    python -m studies.fast_softmax.ds_softmax --tasks synthetic-10x10 --steps 300
    python -m studies.fast_softmax.ds_softmax --tasks wikitext-2 --experts 16 32 64   # the poster's Wiki-2 row, curve
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import hashlib
import json
import math
import os
import resource
from typing import Dict, List, Optional, Tuple

import torch

import hf_heads
from recipes.common import runtime
from studies.common import lms
from studies.common.hidden_tasks import Task, ValidStop, train_head
from recipes.common.stats import mcnemar
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
def top1_hits(head, h: torch.Tensor, y: torch.Tensor, batch: int = 4096) -> torch.Tensor:
    """Per state of ``h``: is the head's top-1 (``head.topk(h, 1)``) the label ``y``."""
    return torch.cat([head.topk(h[i : i + batch], 1)[1][:, 0] == y[i : i + batch] for i in range(0, len(y), batch)])


def top1_accuracy(head, h: torch.Tensor, y: torch.Tensor, batch: int = 4096) -> float:
    return float(top1_hits(head, h, y, batch).double().mean())


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


def valid_stop(task: Task, head, args, baseline: bool = False) -> Optional[ValidStop]:
    """The valid-based stop of a head trained on a train-split LM's states (None on a task without valid states):
    top-1 on valid every ``steps / 20`` steps over the second half of training, the best score's weights kept,
    ``--stop-patience`` scores without a new best end it. The same rule for DS-Softmax and its softmax control; the
    control (``baseline``) also scores the LM's softmax as it came (step 0), so extra training that only hurts it is
    not kept. DS-Softmax prunes from ``steps / 5`` on, every ``steps / 50`` steps to the end: the stop also picks its
    sparsity (its FLOPs) among the scored steps."""
    if task.valid_h is None:
        return None
    return ValidStop(
        lambda: top1_accuracy(head, task.valid_h, task.valid_y),
        every=max(1, args.steps // 20),
        start=args.steps // 2,
        patience=args.stop_patience,
        baseline=baseline,
    )


def trained(task: Task, head, args, lr: float, steps: int, desc: str, baseline: bool = False) -> Dict:
    """Train ``head`` on the task's train states (:func:`train_head`, with :func:`valid_stop` where the task has valid
    states); what the run did: its seconds, and the stop's steps and curve."""
    stop = valid_stop(task, head, args, baseline)
    secs = train_head(
        head, task.train_h, task.train_y, steps, args.batch, lr, args.seed, desc, not args.no_progress, stop
    )
    out = {"train_seconds": secs, "steps": steps}
    if stop is not None:
        out.update(best_step=stop.best_step, stopped_at=stop.stopped_at, valid_top1=stop.curve)
    return out


def control_scores(task: Task, lm_softmax, control, ds, hits_ds: torch.Tensor) -> Dict:
    """DS-Softmax beside the softmax given the same extra training (``control``) and the LM's own softmax, on test:
    top-1 and McNemar's paired test, perplexity (DS-Softmax's only over the tokens whose target its chosen expert
    keeps, the others have probability 0 there: the control's on the same tokens beside it)."""
    h, y = task.test_h, task.test_y
    hits_control = top1_hits(control, h, y)
    with torch.no_grad():
        covered = ds.mask[ds._route(h)[0], y]
    return {
        "top1_control": float(hits_control.double().mean()),
        "mcnemar_ds_vs_control": dataclasses.asdict(mcnemar(hits_ds.tolist(), hits_control.tolist())),
        "mcnemar_control_vs_lm": dataclasses.asdict(
            mcnemar(hits_control.tolist(), top1_hits(lm_softmax, h, y).tolist())
        ),
        "ppl_lm": math.exp(lms.mean_nll(lm_softmax, h, y)),
        "ppl_control": math.exp(lms.mean_nll(control, h, y)),
        "ppl_ds_covered": math.exp(lms.mean_nll(ds, h[covered], y[covered])),
        "ppl_control_covered": math.exp(lms.mean_nll(control, h[covered], y[covered])),
    }


def softmaxes(task: Task, args) -> Tuple[torch.nn.Module, Optional[torch.nn.Module], Dict]:
    """The task's full softmax (trained here on a synthetic task, the LM's own on a language model) and, on a task
    with valid states, the control: a copy of it given DS-Softmax's extra training (optimizer, lr, steps, stop; no
    dropout, as DS-Softmax has none); the runs' records. One per task: every E is compared with the same control."""
    d, V, runs = task.train_h.shape[1], task.vocab_size, {}
    if task.softmax is None:
        full = hf_heads.build_head("softmax", hidden_size=d, vocab_size=V)
        runs["softmax"] = trained(task, full, args, args.lr, args.softmax_steps, f"{task.name} softmax")
        print(f"softmax trained in {runs['softmax']['train_seconds']:.0f}s")
    else:
        full = task.softmax
    control = None
    if task.valid_h is not None:
        control, runs["control"] = kept_control(task, full, args)
    return full, control, runs


#: what a control's training depends on beside the task's LM (:func:`kept_control`)
CONTROL_OPTIONS = ("train_tokens", "stop_patience", "steps", "batch", "ds_lr", "seed")


def kept_control(task: Task, full, args) -> Tuple[torch.nn.Module, Dict]:
    """The control of :func:`softmaxes` and its run's record, kept in ``OUT/heads/TASK-control`` (with
    ``control.json``: the run, its options, the digests of the softmax it started from and of its states); with
    ``--resume`` one kept there with the same options, softmax and states is read instead of trained again (on SmolLM2
    it is an hour)."""
    folder = os.path.join(args.out, "heads", f"{task.name}-control")
    states = (task.train_h, task.train_y, task.valid_h, task.valid_y)
    key = {
        "options": {k: getattr(args, k) for k in CONTROL_OPTIONS},
        "softmax": tensor_digest(*full.state_dict().values()),
        "states": tensor_digest(*states),  # the states it trains and stops on (--states, --trunk-data, --wt2-dir)
    }
    kept = runtime.load_json(os.path.join(folder, "control.json")) if args.resume else None
    if kept is not None and kept["key"] == key:
        print(f"{task.name}: the control kept in {folder} (trained in {kept['run']['train_seconds']:.0f} s), read")
        return hf_heads.load_head(folder).eval(), kept["run"]
    control = copy.deepcopy(full)
    if isinstance(getattr(control, "dropout", None), torch.nn.Dropout):
        control.dropout.p = control.config.dropout = 0.0  # PTB's trunk head had dropout on its input; DS has none
    run = trained(task, control, args, args.ds_lr, args.steps, f"{task.name} control", baseline=True)
    hf_heads.save_head(control, folder)
    runtime.save_json(os.path.join(folder, "control.json"), {"key": key, "run": run})
    return control, run


def tensor_digest(*tensors: torch.Tensor) -> str:
    """The sha1 of the tensors' bytes (which weights a kept head started from, which states it trained on)."""
    digest = hashlib.sha1()
    for t in tensors:
        digest.update(t.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


#: a FLOPs reduction under this after training: DS-Softmax pruned almost nothing (:func:`little_pruned_warning`)
LITTLE_PRUNED = 1.5


def little_pruned_warning(flops_reduction: float, cutoff: float, row_rms: float) -> str:
    """What to do when DS-Softmax pruned almost nothing: ``prune_cutoff`` is an absolute norm and Adam moves each
    weight by about its learning rate a step, so both want scaling with the softmax's class rows (``row_rms``, their
    median RMS norm: 0.279 on the PTB trunk, where the defaults prune)."""
    return (
        f"warning: DS-Softmax pruned almost nothing (FLOPs reduction {flops_reduction:.2f}x): prune_cutoff "
        f"{cutoff:g} is an absolute norm, and this softmax's class rows have a median RMS norm of {row_rms:.3f}; "
        "scale --ds-lr and --ds-options' prune_cutoff by the ratio of that norm to the one they were set for "
        "(the defaults prune the PTB trunk's rows, median 0.279)"
    )


def run_task(task: Task, args, experts: int, trained_softmaxes: Tuple) -> Dict:
    """DS-Softmax with ``experts`` experts on ``task`` beside :func:`softmaxes`' heads (``trained_softmaxes``):
    the row of results."""
    d = task.train_h.shape[1]
    V = task.vocab_size
    print(f"\n== {task.name}: V={V}, d={d}, E={experts}, {len(task.train_y)} train / {len(task.test_y)} test")
    full, control, softmax_runs = trained_softmaxes
    runs = dict(softmax_runs)
    # the group lasso acts per class row while each row's share of the cross-entropy gradient shrinks
    # like 1/V: coefficients that prune cleanly scale like 1/V (measured: 0.1 at V=100 ... 0.001 at V=10,000)
    options = {"num_experts": experts, "group_lasso": args.lasso_per_class / V, **args.ds_options}
    options.setdefault("prune_start", args.steps // 5)
    options.setdefault("prune_interval", max(1, args.steps // 50))
    bias = None if full.bias is None else full.bias.detach()
    row_rms = float(full.weight.detach().pow(2).mean(1).sqrt().median())  # the scale prune_cutoff is absolute in
    print(f"{task.name}: the softmax's class rows' median RMS norm {row_rms:.3f} (prune_cutoff's and --ds-lr's unit)")
    ds = hf_heads.build_head(
        "ds_softmax",
        hidden_size=d,
        vocab_size=V,
        weight=full.weight.detach(),
        bias=bias,
        use_bias=bias is not None,
        **options,
    )
    if args.gate_init == "kmeans":
        ds.init_gate_from_hidden(task.train_h, seed=args.seed)
    runs["ds_softmax"] = trained(task, ds, args, args.ds_lr, args.steps, f"{task.name} ds_softmax")
    report = ds.sparsity_report(task.test_h)
    if report["flops_reduction"] < LITTLE_PRUNED:
        print(little_pruned_warning(report["flops_reduction"], ds.config.prune_cutoff, row_rms))
    hits_ds = top1_hits(ds, task.test_h, task.test_y)
    with torch.no_grad():
        covered = float(ds.mask[ds._route(task.test_h)[0], task.test_y].float().mean())
    timed = {"softmax": full, "ds_softmax": ds}
    load = os.getloadavg()[0]  # the machine's 1-minute load when the timing began (other jobs slow it)
    times = time_top1(timed, task.test_h, args.timing_rounds, args.timing_queries)
    cpe = torch.tensor(report["classes_per_expert"]).float()
    result = {
        "task": task.name,
        "vocab_size": V,
        "dim": d,
        "experts": experts,
        "ds_options": ds.config.to_dict(),
        "ds_train_seconds": runs["ds_softmax"]["train_seconds"],
        "runs": runs,
        "top1_softmax": top1_accuracy(full, task.test_h, task.test_y),
        "top1_ds": float(hits_ds.double().mean()),
        "target_in_chosen_expert": covered,
        "classes_per_expert_mean": float(cpe[cpe > 0].mean()) if (cpe > 0).any() else 0.0,
        "classes_per_expert_max": int(cpe.max()),
        "experts_alive": int((cpe > 0).sum()),
        "expected_classes_computed": report["expected_classes_computed"],
        "flops_reduction": report["flops_reduction"],
        "softmax_row_rms_median": row_rms,
        "ms_per_query": {b: {n: 1e3 * v for n, v in t.items()} for b, t in times.items()},
        "speedup": {b: t["softmax"] / t["ds_softmax"] for b, t in times.items()},
        "timing_load": [load, os.getloadavg()[0]],
        "threads": torch.get_num_threads(),
        "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,  # the process's, so far
        "settings": settings(args),
        "info": task.info,
    }
    if control is not None:
        result.update(control_scores(task, full, control, ds, hits_ds))
        result["valid_top1_lm"] = runs["control"]["valid_top1"][0]["score"]  # step 0: the LM's softmax as it came
        # kept for the decoding study (python -m studies.fast_softmax.decoding --head-dirs ...)
        hf_heads.save_head(ds, os.path.join(args.out, "heads", f"{task.name}-ds_softmax-{experts}"))
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
TASKS = ("synthetic-10x10", "synthetic-100x100", "ptb", "wikitext-2", "smollm2")
#: the language-model tasks (:func:`studies.common.lms.split_task`: LMs trained on the train splits, d = 200;
#: WikiText-2's 33,278 words x 64 experts x 200 float32 weights, with Adam's two moments and the gradient, 6.8 GB
#: alone; the best epoch's copy, the states and a batch's expert logits come on top: 64 experts at d = 256 peaked at
#: 14.3 GB here; each row records its ``peak_rss_gb``)
LM_TASKS = ("ptb", "wikitext-2", "smollm2")
#: where the upgrade table (python -m studies.head_upgrade.table) keeps SmolLM2's states of WikiText-2
SMOLLM2_STATES = os.path.join("results", "upgrade_table", "states-cache", "table")


def add_task_options(p: argparse.ArgumentParser) -> None:
    """The tasks' options: which tasks, where each one's data and trained LM are, and the synthetic task's size."""
    p.add_argument(
        "--tasks",
        nargs="+",
        default=None,
        choices=TASKS,
        help="tasks to run (default: all but wikitext-2; ptb where --trunk is there)",
    )
    p.add_argument("--trunk", default=lms.TRUNK, help="ptb: the trained LM (a fairseq checkpoint)")
    p.add_argument("--trunk-data", default=lms.TRUNK_DATA, help="ptb: the trunk's binarised data")
    p.add_argument(
        "--wt2-dir",
        default=data_paths.corpus("wikitext-2"),
        help="directory with WikiText-2's train.txt, valid.txt and test.txt",
    )
    p.add_argument(
        "--lm-dir", default=lms.LM_DIR, help="wikitext-2: where its LSTM is kept (trained there when it is not)"
    )
    p.add_argument(
        "--states",
        default=SMOLLM2_STATES,
        help="smollm2: the folder of its cached states of WikiText-2, train/ valid/ test/ (the upgrade table's)",
    )
    p.add_argument(
        "--train-tokens", type=int, default=500_000, help="language models: train-split states the heads train on"
    )
    p.add_argument("--stop-patience", type=int, default=3, help="language models: valid scores without a new best")
    p.add_argument("--dim", type=int, default=32, help="synthetic: hidden size d")
    p.add_argument("--per-class", type=int, default=20, help="synthetic: training points per class")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    add_task_options(p)
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
    p.add_argument(
        "--ds-lr",
        type=float,
        default=5e-3,
        help="Adam learning rate of DS-Softmax (and of the control); with --ds-options' prune_cutoff, an absolute "
        "norm, in the units of the softmax's class rows: scale both with the rows' median RMS norm, printed first",
    )
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
        help="keep the rows already in OUT/results.json (same task and E) and run only the others (WikiText-2's "
        "LSTM is read from --lm-dir once trained, whether or not --resume is given)",
    )
    return p.parse_args(argv)


#: the options a row depends on besides its task and E: a row of ``--resume`` is kept only when they are the same
ROW_OPTIONS = (
    "train_tokens",
    "stop_patience",
    "dim",
    "per_class",
    "ds_options",
    "gate_init",
    "lasso_per_class",
    "steps",
    "softmax_steps",
    "batch",
    "lr",
    "ds_lr",
    "seed",
)


def settings(args) -> Dict:
    """The row's settings (:data:`ROW_OPTIONS`)."""
    return {k: getattr(args, k) for k in ROW_OPTIONS}


def task_states(name: str, args) -> Task:
    """The task ``name``'s hidden states: SmolLM2's own ``lm_head`` over the states the upgrade table cached, a
    language model trained on its train split (WikiText-2's kept in ``--lm-dir``), or a synthetic hierarchy."""
    if name == "smollm2":
        from hf_heads.hf.upgrade import pretrained_head
        from studies.common.real_heads import load_smollm2

        return lms.states_task(name, args.states, pretrained_head(load_smollm2()[0]), args.train_tokens)
    if name in LM_TASKS:
        return lms.split_task(
            name,
            args.wt2_dir,
            args.lm_dir,
            trunk=args.trunk,
            trunk_data=args.trunk_data,
            train_tokens=args.train_tokens,
            progress=not args.no_progress,
        )
    s, c = hierarchy_shape(name)
    return make_hierarchy(s, c, args.dim, args.per_class, args.seed)


def main(argv=None) -> List[Dict]:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.experts and min(args.experts) < 1:
        raise SystemExit(f"--experts must be >= 1 (got {' '.join(map(str, args.experts))})")
    wt2_files = ("train.txt", "valid.txt", "test.txt")
    has = {
        "smollm2": os.path.isdir(os.path.join(args.states, "test")),
        "ptb": os.path.isfile(args.trunk),
        "wikitext-2": all(os.path.isfile(os.path.join(args.wt2_dir, f)) for f in wt2_files),
    }
    # by default every task but wikitext-2 (its LSTM trains for hours the first time, DS-64 peaks past 14 GB: ask)
    tasks = args.tasks or [t for t in TASKS if t not in LM_TASKS or (t == "ptb" and has[t])]
    for name in tasks:
        if name in LM_TASKS and not has[name]:
            where = {
                "ptb": f"--trunk {args.trunk}",
                "wikitext-2": f"--wt2-dir {args.wt2_dir} (no {', '.join(wt2_files)})",
                "smollm2": f"--states {args.states} (python -m studies.head_upgrade.table caches them there)",
            }[name]
            raise SystemExit(f"{name}: nothing at {where}; point it to the right place, or leave out the {name} task")
    if args.tasks is None and not has["ptb"]:
        print(f"(ptb skipped: no trunk at {args.trunk})")
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "results.json")
    done = load_rows(path) if args.resume and os.path.isfile(path) else []  # an earlier run's rows, kept
    stale = [r for r in done if r.get("settings") != settings(args) and r["task"] in tasks]
    if stale:
        print(f"--resume: {len(stale)} row(s) of {path} ran with other settings than these: run again")
    results = [r for r in done if r not in stale]  # every task's: a row is replaced only by its rerun
    for name in tasks:
        todo = [
            e
            for e in (args.experts or [default_experts(name)])
            if not any(r["task"] == name and r["experts"] == e for r in results)
        ]
        if not todo:
            print(f"{name}: every expert count done ({path}), skipped")
            continue
        with runtime.clock({}) as took:  # the task's states and its softmaxes (the control trained or read)
            task = task_states(name, args)
            heads = softmaxes(task, args)
        print(f"{name}: states and softmaxes {took['seconds']:.0f} s ({took['cpu_seconds']:.0f} CPU s)")
        for experts in todo:
            with runtime.clock({"task_clock": took}) as row_took:  # each row of a run keeps its task's clock too
                row = run_task(task, args, experts, heads)
            results.append({**row, **row_took})
            print(f"{name} E={experts}: {row_took['seconds']:.0f} s ({row_took['cpu_seconds']:.0f} CPU s)")
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
