"""Per-rank memory of each head split over P tensor-parallel ranks (``hf_heads.VocabParallel``), on the CPU with gloo.

For P = 1, 2, 4 (``--ranks``) and each bottleneck head at V = 128k, d = 1024 (``--vocab``, ``--dim``): the bytes of
rank 0's share of the head's parameters, and the largest tensor any op makes on rank 0 during a training loss and its
backward over ``--tokens`` tokens (a ``TorchDispatchMode`` records every op's output, a DTensor by its local part).
That is of any shape in the table (MiB); the json also has the largest of a shape no parameter has (transposed or
sliced copies of W count there). Both on the memory-lean path and on the reference path (plain autograd). Rank 0
holds the widest slice (``ceil(V / P)`` rows). Step times on 2 cores would mean nothing and are not taken::

    python -m benchmarks.tensor_parallel --out results/tensor-parallel     # memory.json + memory.md
    python -m benchmarks.tensor_parallel --out results/tensor-parallel --table   # memory.md again from the json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

#: (label, head, options) at the papers' usual sizes
HEADS = [
    ("softmax", "softmax", {}),
    ("sigsoftmax", "sigsoftmax", {}),
    ("plif T=1e5", "plif", {"num_knots": 100000}),
    ("mos K=3", "mos", {"num_components": 3}),
    ("mos_plif K=3", "mos_plif", {"num_components": 3}),
    ("mixtape K=4", "mixtape", {"num_gates": 4, "frequent_fraction": 0.1, "gate_noise": 0.0}),
]


def largest_tensors(run, parameter_shapes) -> tuple:
    """``(largest tensor, largest activation)``: the bytes of the largest tensor any op makes during ``run()``, and of
    the largest whose shape is no parameter's (gradients and their accumulators have their parameter's)."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    class Largest(TorchDispatchMode):
        most = [0, 0]

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in out if isinstance(out, (tuple, list)) else [out]:
                if isinstance(t, torch.Tensor):
                    t = getattr(t, "_local_tensor", t)  # a DTensor: this rank's part (its shape is the whole's)
                    size = t.numel() * t.element_size()
                    self.most[0] = max(self.most[0], size)
                    if tuple(t.shape) not in parameter_shapes:
                        self.most[1] = max(self.most[1], size)
            return out

    with Largest() as mode:
        run()
    return tuple(mode.most)


def rank_main(args) -> None:
    """One rank: every head split over the world's ranks; rank 0 writes its numbers to ``args.rank_out``."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import parallelize_module

    import hf_heads

    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    rows = {}
    for label, name, options in HEADS:
        torch.manual_seed(0)
        head = hf_heads.build_head(name, hidden_size=args.dim, vocab_size=args.vocab, **options)
        if dist.get_world_size() > 1:
            parallelize_module(head, mesh, hf_heads.VocabParallel())
        local = [p.to_local() if hasattr(p, "to_local") else p for p in head.parameters()]
        hidden = torch.randn(args.tokens, args.dim)
        target = torch.randint(0, args.vocab, (args.tokens,))
        row = {"parameter_bytes": sum(p.numel() * p.element_size() for p in local)}
        shapes = {tuple(p.shape) for p in local}
        for impl in ("lean", "reference"):
            tensor, activation = largest_tensors(
                lambda m=head, h=hidden, t=target, i=impl: m.loss(h.requires_grad_(), t, impl=i).backward(), shapes
            )
            row[f"largest_tensor_bytes_{impl}"], row[f"largest_activation_bytes_{impl}"] = tensor, activation
        rows[label] = row
    if dist.get_rank() == 0:
        with open(args.rank_out, "w") as f:
            json.dump(rows, f)
    dist.destroy_process_group()


def table(out: dict) -> str:
    """Per head and P: rank 0's parameters, and its largest tensor on the lean and reference paths (MiB)."""
    ranks = out["args"]["ranks"]
    mib = lambda b: f"{b / 2**20:,.0f}"  # noqa: E731
    head = "| head | " + " | ".join(f"P={p}: parameters | P={p}: largest tensor, lean / reference" for p in ranks)
    lines = [head + " |", "|---|" + "---|---|" * len(ranks)]
    for label, _, _ in HEADS:
        cells = []
        for p in ranks:
            r = out["ranks"][str(p)][label]
            lean, ref = r["largest_tensor_bytes_lean"], r["largest_tensor_bytes_reference"]
            cells += [mib(r["parameter_bytes"]), f"{mib(lean)} / {mib(ref)}"]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="results/tensor-parallel")
    p.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--vocab", type=int, default=131072)
    p.add_argument("--dim", type=int, default=1024)
    p.add_argument("--tokens", type=int, default=512)
    p.add_argument("--rank-out", help=argparse.SUPPRESS)  # (set for the ranks this command starts)
    p.add_argument("--table", action="store_true", help="only write memory.md again from --out's memory.json")
    args = p.parse_args(argv)
    if args.rank_out:
        return rank_main(args)
    if args.table:
        with open(os.path.join(args.out, "memory.json")) as f:
            return write_table(json.load(f), args.out)
    os.makedirs(args.out, exist_ok=True)
    out = {"args": {k: v for k, v in vars(args).items() if k != "rank_out"}, "ranks": {}}
    for world in args.ranks:
        rank_out = os.path.join(args.out, f"ranks-{world}.json")
        command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(world), "-m"]
        command += ["benchmarks.tensor_parallel", *(argv or sys.argv[1:]), "--rank-out", rank_out]
        subprocess.run(command, check=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
        with open(rank_out) as f:
            out["ranks"][str(world)] = json.load(f)
        print(f"P={world}: {out['ranks'][str(world)]}", flush=True)
    with open(os.path.join(args.out, "memory.json"), "w") as f:
        json.dump(out, f, indent=1)
    return write_table(out, args.out)


def write_table(out: dict, folder: str) -> dict:
    with open(os.path.join(folder, "memory.md"), "w") as f:
        f.write(table(out) + "\n")
    print(table(out))
    return out


if __name__ == "__main__":
    main()
