"""The papers' training-cost columns, measured on a table's mini model: time of the output layer and of all layers,

* at the same batch (``--cost-batch`` sentences for every head, 256 as the paper's MT tables): seconds per batch;
* at the same memory budget: the largest batch (from a grid of sentence counts) whose training step fits the
  budget, and the time per sentence at that batch. The budget is what the softmax model's step takes at the
  same batch (times 1.05, for measurement noise), separately for the output layer and for all layers.

Reported as ratios to softmax (the papers' absolute numbers are GPU seconds; ratios are what carries over).
Models are the table's own fairseq models, built from its ``fairseq-train`` command (untrained: a step's cost
does not depend on the weights), on the first sentences of its training data. An "output layer" step is the
head's training loss (the memory-lean loss, as ``head_cross_entropy`` runs it) and its backward from the
decoder features; an "all layers" step is the criterion's loss and the backward through the whole model.
Time: interleaved rounds, medians (:mod:`hf_heads.cli.timing`); peak memory: the resident set's rise during one
step, in a child process whose allocator returns freed memory at once.

    python -m recipes.reproduce.engine.costs --spec OUT/TABLE/costs-spec.json --out OUT/TABLE/costs.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from typing import Any, Callable, Dict, Sequence

import torch

from hf_heads.cli.timing import MALLOC_ENV, peak_memory, time_per_call

GRID = [8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 224, 256, 320, 384]
#: the cost columns: results metric -> (step kind, setting), and the paper's column key
COLUMNS = {
    "time_out_layer_same_bsz": ("out", "bsz"),
    "time_all_layers_same_bsz": ("all", "bsz"),
    "time_out_layer_same_mem": ("out", "mem"),
    "time_all_layers_same_mem": ("all", "mem"),
}
PAPER_KEYS = {
    "time_out_layer_same_bsz": "out_bsz",
    "time_all_layers_same_bsz": "all_bsz",
    "time_out_layer_same_mem": "out_mem",
    "time_all_layers_same_mem": "all_mem",
}


class FairseqSteps:
    """A fairseq model built from a ``fairseq-train`` argument list, with its two training steps on a batch."""

    def __init__(self, train_args: Sequence[str]):
        from fairseq_plugin.criterions import find_head

        cfg, self.task = setup_task(train_args)
        torch.manual_seed(cfg.common.seed)
        self.task.load_dataset(cfg.dataset.train_subset, combine=False, epoch=1)
        self.dataset = self.task.dataset(cfg.dataset.train_subset)
        self.model = self.task.build_model(cfg.model).train()
        self.criterion = self.task.build_criterion(cfg.criterion).train()
        self.head = find_head(self.model)
        self.pad = self.task.target_dictionary.pad()

    def batch(self, sentences: int) -> Dict[str, Any]:
        """The first ``sentences`` training pairs, collated as fairseq does; under ``--task awd_language_modeling``
        (whose items are windows of streams, not sentences) the first training window of ``sentences`` streams."""
        windows = getattr(self.task, "windows", None)
        if windows is not None:
            first = windows(self.dataset, sentences, 1, 0, 1)[0]
            return self.dataset.collater([self.dataset[w] for w in first])
        n = min(sentences, len(self.dataset))
        return self.dataset.collater([self.dataset[i] for i in range(n)])

    def steps(self, sentences: int) -> Dict[str, Callable[[], None]]:
        """``{"all": step, "out": step}`` at a batch of ``sentences``; each does forward + backward."""
        sample = self.batch(sentences)
        with torch.no_grad():
            features = self.model(**sample["net_input"])[0].detach()
        target = sample["target"]
        params = list(self.model.parameters())

        def clear():
            for p in params:
                p.grad = None

        def all_layers():
            with torch.enable_grad():
                loss, _, _ = self.criterion(self.model, sample)
                loss.backward()
            clear()

        def out_layer():
            with torch.enable_grad():
                h = features.clone().requires_grad_()
                loss = self.head.loss(h, target, ignore_index=self.pad, reduction="sum")
                (loss + self.head.aux_loss()).backward()
            clear()

        return {"all": all_layers, "out": out_layer}


def setup_task(train_args: Sequence[str]):
    """``(cfg, task)`` of a ``fairseq-train`` argument list (its ``--user-dir`` imported), as fairseq-train sets up."""
    from fairseq import options, tasks, utils
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    args = options.parse_args_and_arch(options.get_training_parser(), input_args=list(train_args))
    utils.import_user_module(args)
    cfg = convert_namespace_to_omegaconf(args)
    return cfg, tasks.setup_task(cfg.task)


def count_parameters(train_args: Sequence[str]) -> int:
    """Parameters of the model a ``fairseq-train`` argument list builds, built on the meta device."""
    cfg, task = setup_task(train_args)
    with torch.device("meta"):
        model = task.build_model(cfg.model)
    return sum(p.numel() for p in model.parameters())


def build(spec: Dict[str, Any]) -> Dict[str, FairseqSteps]:
    return {head: FairseqSteps(train_args) for head, train_args in spec["heads"].items()}


def measure_memory(spec: Dict[str, Any]) -> Dict[str, Any]:
    """Peaks (bytes) of every head's steps at the same batch, the budgets (softmax's), and each head's largest
    batch under the budget: ``{"budget": {kind: bytes}, "peaks": {head: {kind: {batch: bytes}}},
    "batch": {head: {kind: sentences}}}``. Run in a process started with :data:`MALLOC_ENV`."""
    models = build(spec)
    bsz, repeats = spec["batch"], spec.get("memory_repeats", 3)
    peaks: Dict[str, Dict[str, Dict[int, float]]] = {h: {"all": {}, "out": {}} for h in models}

    def peak(head: str, kind: str, batch: int) -> float:
        if batch not in peaks[head][kind]:
            fn = models[head].steps(batch)[kind]
            fn()  # warm-up: lazily built tables, allocator
            peaks[head][kind][batch] = peak_memory(fn, repeats=repeats)
        return peaks[head][kind][batch]

    budget = {kind: spec["budget_factor"] * peak("softmax", kind, bsz) for kind in ("all", "out")}
    fits: Dict[str, Dict[str, int]] = {}
    for head in models:
        fits[head] = {}
        for kind in ("all", "out"):
            grid = sorted({b for b in GRID if b <= spec["max_batch"]} | {bsz})
            best = None  # memory grows with the batch: the first size from the top that fits
            for b in sorted(grid, reverse=True):
                if peak(head, kind, b) <= budget[kind]:
                    best = b
                    break
            fits[head][kind] = best  # None: not even the smallest batch fits (the paper's table would say "-")
    return {"budget": budget, "peaks": peaks, "batch": fits}


def _ignoring_argument(step: Callable[[], Any]) -> Callable[[Any], Any]:
    """``step`` as a one-argument call, the form :func:`time_per_call` times."""
    return lambda _: step()


def measure(spec: Dict[str, Any], memory: Dict[str, Any], log=print) -> Dict[str, Any]:
    """Times at the same batch and at each head's same-memory batch; ratios to softmax."""
    models = build(spec)
    bsz, rounds = spec["batch"], spec.get("rounds", 5)
    seconds: Dict[str, Dict[str, float]] = {h: {} for h in models}
    for kind in ("out", "all"):
        log(f"costs: timing {kind} at {bsz} sentences")
        fns = {h: _ignoring_argument(m.steps(bsz)[kind]) for h, m in models.items()}
        for h, t in time_per_call(fns, [None], rounds=rounds, warmup=1).items():
            seconds[h][f"{kind}_bsz"] = t
        log(f"costs: timing {kind} at the same memory")
        fit = {h: memory["batch"][h][kind] for h in models if memory["batch"][h][kind]}
        fns = {h: _ignoring_argument(models[h].steps(b)[kind]) for h, b in fit.items()}
        for h, t in time_per_call(fns, [None], rounds=rounds, warmup=1).items():
            seconds[h][f"{kind}_mem"] = t / fit[h]  # per sentence

    def ratio(h, key):
        if key not in seconds[h] or key not in seconds["softmax"]:
            return None
        return seconds[h][key] / seconds["softmax"][key]

    ratios = {h: {metric: ratio(h, f"{kind}_{setting}") for metric, (kind, setting) in COLUMNS.items()} for h in models}
    return {
        "batch": bsz,
        "unit": spec.get("unit", "sentences"),
        "budget_bytes": memory["budget"],
        "budget_factor": spec["budget_factor"],
        "same_mem_batch": memory["batch"],
        "peaks_bytes": memory["peaks"],
        "seconds": seconds,
        "ratios": ratios,
        "threads": torch.get_num_threads(),
    }


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="python -m recipes.reproduce.engine.costs", description=__doc__.split("\n")[0])
    p.add_argument("--spec", required=True, help="JSON: heads {name: fairseq-train args}, batch, budget_factor, ...")
    p.add_argument("--out", required=True)
    p.add_argument("--memory-only", action="store_true", help=argparse.SUPPRESS)  # the child
    args = p.parse_args(argv)
    with open(args.spec) as f:
        spec = json.load(f)
    if "softmax" not in spec["heads"]:
        raise SystemExit("costs: the spec needs a softmax head (the ratios' reference)")
    log = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    if args.memory_only:
        with open(args.out, "w") as f:
            json.dump(measure_memory(spec), f)
        return
    memory_path = args.out + ".memory.json"
    log("costs: peak memory (child process)")
    subprocess.run(
        [sys.executable, "-m", "recipes.reproduce.engine.costs", "--spec", args.spec, "--out", memory_path]
        + ["--memory-only"],
        env={**os.environ, **MALLOC_ENV},
        check=True,
    )
    with open(memory_path) as f:
        memory = json.load(f)
    os.remove(memory_path)
    result = measure(spec, memory, log)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)


def table_costs(runner, table, prepared, variants, args, table_dir: str, log=print) -> Dict[str, Dict[str, Any]]:
    """Measure (once; ``costs.json`` is kept) the cost columns of ``variants`` for a table; return
    ``{head: {metric: {"ours": ratio, "paper": ratio or None, "command": line}}}``."""
    from recipes.reproduce.engine.results import load_json, save_json

    out = os.path.join(table_dir, "costs.json")
    names = [v.name for v in variants]
    if "softmax" not in names:
        log("costs: skipped (no softmax among the heads: the ratios need it)")
        return {}
    spec_path = os.path.join(table_dir, "costs-spec.json")
    heads = {
        v.name: table.train_command(prepared["bin"], v, 1, os.path.join(table_dir, "costs-tmp"), args)[1:]
        for v in variants
    }
    batch = args.cost_batch or table.cost_batch
    spec = {
        "heads": heads,
        "batch": batch,
        "budget_factor": 1.05,
        "max_batch": batch * 3 // 2,
        "rounds": 5,
        "unit": table.cost_unit,
    }
    cmd = [sys.executable, "-m", "recipes.reproduce.engine.costs", "--spec", spec_path, "--out", out]
    lines = dict.fromkeys(names, runner.record(cmd, comment="training-cost columns"))
    measured = load_json(out)
    if measured is None or measured["batch"] != batch:
        save_json(spec_path, spec)
        log(f"{table.name}: training-cost columns ({', '.join(names)})")
        runner.run(cmd, os.path.join(table_dir, "costs.log"), f"{table.name} costs", comment="training-cost columns")
        measured = load_json(out)
    missing = [n for n in names if n not in measured["ratios"]]
    if missing:  # heads added to a measured table: timed beside softmax again, in a process of their own
        add_spec, add_out = (
            os.path.join(table_dir, f"costs-added-{'-'.join(missing)}{ext}") for ext in ("-spec.json", ".json")
        )
        add_cmd = [sys.executable, "-m", "recipes.reproduce.engine.costs", "--spec", add_spec, "--out", add_out]
        save_json(add_spec, {**spec, "heads": {n: heads[n] for n in ["softmax", *missing]}})
        log(f"{table.name}: training-cost columns of the added heads ({', '.join(missing)}), beside softmax")
        runner.run(add_cmd, os.path.join(table_dir, "costs.log"), f"{table.name} costs", comment="added heads")
        measured = merge_costs(measured, load_json(add_out), missing, runner.record(add_cmd))
        save_json(out, measured)
    lines.update({h: a["command"] for h, a in measured.get("added", {}).items() if h in lines})
    paper = getattr(table, "paper_costs", {})
    result = {}
    for name in names:
        result[name] = {}
        for metric, key in PAPER_KEYS.items():
            ref = paper.get(name, {}).get(key)
            base = paper.get("softmax", {}).get(key)
            if measured["ratios"][name][metric] is None:
                log(f"costs: {name} fits no batch of the memory budget ({metric}): no value")
                continue
            result[name][metric] = {
                "ours": measured["ratios"][name][metric],
                "paper": (ref / base) if ref is not None and base else None,
                "command": lines[name],
            }
    return result


def merge_costs(measured: Dict[str, Any], added: Dict[str, Any], heads: Sequence[str], command: str) -> Dict[str, Any]:
    """``measured`` (costs.json) with the per-head entries of ``heads`` from ``added`` (a later run of those heads
    beside softmax, made by ``command``: their ratios are to that run's softmax), listed under ``"added"``."""
    merged = json.loads(json.dumps(measured))
    for key in ("same_mem_batch", "peaks_bytes", "seconds", "ratios"):
        merged[key].update({h: added[key][h] for h in heads})
    merged["added"] = {
        **merged.get("added", {}),
        **{
            h: {
                "softmax_seconds": added["seconds"]["softmax"],
                "budget_bytes": added["budget_bytes"],
                "command": command,
            }
            for h in heads
        },
    }
    return merged


if __name__ == "__main__":
    from hf_heads.cli.runner import run

    run(main)
