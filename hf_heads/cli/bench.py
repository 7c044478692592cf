"""``softmax-heads bench``: each head's training cost at the output layer, against the plain output layer.

One step is ``loss(hidden, target)`` then ``backward()`` over N tokens of d-wide hidden states and V words. The plain
output layer (``nn.Linear`` without bias, then ``F.cross_entropy``) runs in the same process and is the 1.00x of
every ratio. Beside it run the fused linear cross-entropies that import here: torch's chunked
``F.linear_cross_entropy``, Liger Kernel's and Cut Cross-Entropy (its loss must equal the plain layer's).

* Time: interleaved rounds (every entry once a round, in rotating order), the median. CUDA events on a GPU.
* Memory: the peak during one step over what was held before it (the activations, temporaries and gradients).
  On a GPU, ``torch.cuda.max_memory_allocated``; on the CPU, the resident set's rise, sampled by a thread in a
  child process whose allocator returns freed memory at once.

    softmax-heads bench                                   # CPU: d = 512, V = 10k, 33k, 50k, float32
    softmax-heads bench --device cuda                     # GPU: d = 1024, 2048, V = 32k, 50k, bf16 and float32
    softmax-heads bench --shapes 576x49152 --heads "mos K=3" --out results/bench

``results.json`` and ``table.md`` in ``--out`` are rewritten after every setting. A checkout's ``benchmarks/`` has
the project's own instruments (rooflines, the whole-model step, the GPU targets).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional

import torch
import torch.nn.functional as F

import hf_heads
from hf_heads.cli.timing import MALLOC_ENV, peak_memory

#: (label, head name, options): the heads the benchmark times beside the plain output layer
HEADS = [
    ("softmax (ours)", "softmax", {}),
    ("sigsoftmax", "sigsoftmax", {}),
    ("plif T=1e5", "plif", {"num_knots": 100000}),
    ("mixtape K=4 r=0.1 d2=64", "mixtape", {"num_gates": 4, "frequent_fraction": 0.1, "gate_embedding_size": 64}),
    ("mos K=3", "mos", {"num_components": 3}),
    ("mos K=15", "mos", {"num_components": 15}),
    ("class_softmax", "class_softmax", {}),
    ("d_softmax", "d_softmax", {}),
]
BASELINE = "torch softmax"
TORCH_LCE = "torch F.linear_cross_entropy (chunked)"
LIGER = "Liger fused linear CE"
CCE = "Cut Cross-Entropy"
#: entries whose loss must equal the baseline's (the same W, the same math): a broken peer or head shows here
SAME_LOSS = ("softmax (ours)", TORCH_LCE, LIGER, CCE)
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
#: the defaults of each device kind: tokens, d, V, dtypes, timing rounds
DEFAULTS = {
    "cpu": {"tokens": 2048, "dim": [512], "vocab": [10000, 33000, 50257], "dtype": ["float32"], "rounds": 5},
    "cuda": {
        "tokens": 8192,
        "dim": [1024, 2048],
        "vocab": [32000, 50000],
        "dtype": ["bfloat16", "float32"],
        "rounds": 3,
    },
}


@dataclass
class Entry:
    """One row: its loss (a closure over the setting's inputs), the parameters its step clears, and its head (None
    for the baseline and the peers)."""

    loss: Callable[[], torch.Tensor]
    params: list
    head: Optional[torch.nn.Module] = None


@dataclass
class Setting:
    """The inputs of one (d, V, dtype) and its entries; ``missing``: the entries that cannot run here, and why."""

    hidden: torch.Tensor
    target: torch.Tensor
    linear: torch.nn.Linear
    entries: Dict[str, Entry] = field(default_factory=dict)
    missing: Dict[str, str] = field(default_factory=dict)


def fused_peers() -> Dict[str, object]:
    """``{name: loss(hidden, weight, target)}`` of the fused linear cross-entropies that import here (no bias), or
    ``{name: why it is missing}``."""
    peers: Dict[str, object] = {}
    options = getattr(torch.nn, "LinearCrossEntropyOptions", None)
    if hasattr(F, "linear_cross_entropy") and options is not None:
        peers[TORCH_LCE] = lambda h, w, t: F.linear_cross_entropy(h, w, t, options=options())
    else:
        peers[TORCH_LCE] = f"torch {torch.__version__} has no chunked F.linear_cross_entropy"
    try:
        from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss

        liger = LigerFusedLinearCrossEntropyLoss()
        peers[LIGER] = lambda h, w, t: liger(w, h, t)
    except ImportError as e:
        peers[LIGER] = f"liger-kernel does not import: {e}"
    try:
        from cut_cross_entropy import linear_cross_entropy

        peers[CCE] = lambda h, w, t: linear_cross_entropy(h, w, t)
    except ImportError as e:
        peers[CCE] = f"cut-cross-entropy does not import: {e}"
    return peers


def output_layer(
    dim: int, vocab: int, dtype: torch.dtype, args, heads: List[str], peers: bool = True, bias: bool = False
) -> Setting:
    """The baseline, each head of ``heads`` (labels of :data:`HEADS`) and, with ``peers``, the fused losses, on
    ``args.tokens`` random hidden states and targets (seeded by ``args.seed``) on ``args.device``. Our softmax gets
    the baseline's W (and b), so its loss must equal the baseline's."""
    device = torch.device(args.device)
    g = torch.Generator().manual_seed(args.seed)
    hidden = torch.randn(args.tokens, dim, generator=g).to(device, dtype).requires_grad_()
    target = torch.randint(0, vocab, (args.tokens,), generator=g).to(device)
    torch.manual_seed(args.seed)
    linear = torch.nn.Linear(dim, vocab, bias=bias).to(device, dtype)
    s = Setting(hidden, target, linear)
    s.entries[BASELINE] = Entry(lambda: F.cross_entropy(linear(hidden), target), list(linear.parameters()))
    for label, name, options in HEADS:
        if label not in heads:
            continue
        torch.manual_seed(args.seed)
        options = {**options, "use_bias": bias}
        if name == "softmax":
            options["weight"] = linear.weight.detach().clone()
        head = hf_heads.build_head(name, hidden_size=dim, vocab_size=vocab, **options).to(device, dtype).train()
        if name == "softmax" and bias:
            head.bias.data.copy_(linear.bias.detach())
        s.entries[label] = Entry(lambda head=head: head.loss(hidden, target), list(head.parameters()), head)
    for name, loss in (fused_peers() if peers else {}).items():
        if callable(loss):
            s.entries[name] = Entry(lambda loss=loss: loss(hidden, linear.weight, target), list(linear.parameters()))
        else:
            s.missing[name] = loss
    return s


def steps(setting: Setting, losses: Dict[str, torch.Tensor]) -> Dict[str, Callable[[], None]]:
    """One training step per entry: forward, backward, gradients cleared; each step's loss lands in ``losses``."""

    def make(name, entry):
        def step():
            loss = entry.loss()
            loss.backward()
            losses[name] = loss.detach()  # read after the timing: a float() here would sync every step
            for p in [setting.hidden, *entry.params]:
                p.grad = None

        return step

    return {n: make(n, e) for n, e in setting.entries.items()}


def elapsed(fn: Callable[[], None], cuda: bool) -> float:
    """Seconds one ``fn()`` takes: CUDA events on a GPU (its queued work included), the wall clock elsewhere."""
    if not cuda:
        start = time.perf_counter()
        fn()
        return time.perf_counter() - start
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3


def step_times(steps: Dict[str, Callable[[], None]], rounds: int, device, repeats: int = 1) -> Dict[str, float]:
    """Median seconds per step over ``rounds`` interleaved rounds (each of ``repeats`` steps per entry; the order
    rotates every round)."""
    cuda = torch.device(device).type == "cuda"
    names = list(steps)
    samples: Dict[str, list] = {n: [] for n in names}

    def repeated(step):
        for _ in range(repeats):
            step()

    for r in range(rounds):
        for n in names[r % len(names) :] + names[: r % len(names)]:
            samples[n].append(elapsed(lambda step=steps[n]: repeated(step), cuda) / repeats)
    return {n: statistics.median(v) for n, v in samples.items()}


def cuda_memory(step: Callable[[], None], device) -> float:
    """Peak bytes allocated on a CUDA device during ``step()`` over what was allocated before it."""
    torch.cuda.synchronize(device)
    base = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    step()
    torch.cuda.synchronize(device)
    return torch.cuda.max_memory_allocated(device) - base


def warm_up(steps: Dict[str, Callable[[], None]], errors: Dict[str, str], warmup: int, device, log) -> None:
    """``warmup`` untimed steps of each entry (Triton compiles here); an entry that fails (out of memory too) is put in
    ``errors`` and dropped."""
    for n in list(steps):
        try:
            for _ in range(warmup):
                steps[n]()
        except Exception as e:  # noqa: BLE001 - a failing peer or head is a result to report
            errors[n] = f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
            del steps[n]
            log(f"{n} failed: {errors[n]}")
            if torch.device(device).type == "cuda":
                torch.cuda.empty_cache()


def settings(args) -> List[tuple]:
    """``[(label, d, V, dtype name)]`` in the order they run: ``--shapes`` where given, else every d with every V."""
    shapes = args.shapes or [(d, v) for d in args.dim for v in args.vocab]
    return [(f"d={d} V={v} {dt}", d, v, dt) for dt in args.dtype for d, v in shapes]


def measure(dim: int, vocab: int, dtype: str, args, log=print) -> Dict:
    """One setting's rows (time and memory, their ratios to the baseline, the loss) and the entries that did not run."""
    setting = output_layer(dim, vocab, DTYPES[dtype], args, args.heads, peers=args.peers)
    losses: Dict[str, torch.Tensor] = {}
    run, errors = steps(setting, losses), dict(setting.missing)
    warm_up(run, errors, 1, args.device, log)
    if BASELINE not in run:
        raise RuntimeError(f"d={dim} V={vocab} {dtype}: the plain output layer failed: {errors[BASELINE]}")
    secs = step_times(run, args.rounds, args.device)
    if torch.device(args.device).type == "cuda":
        mem = {n: cuda_memory(fn, args.device) for n, fn in run.items()}
    else:
        mem = cpu_memory(args, dim, vocab, dtype)
    rows = {
        n: {
            "ms": 1e3 * secs[n],
            "time_ratio": secs[n] / secs[BASELINE],
            "peak_mib": mem[n] / 2**20,
            "memory_ratio": mem[n] / mem[BASELINE] if mem[BASELINE] else None,
            "loss": float(losses[n]),
        }
        for n in run
    }
    for n in rows:
        if n in SAME_LOSS:
            rows[n]["loss_minus_baseline"] = rows[n]["loss"] - rows[BASELINE]["loss"]
    return {"dim": dim, "vocab": vocab, "dtype": dtype, "tokens": args.tokens, "rows": rows, "errors": errors}


def cpu_memory(args, dim: int, vocab: int, dtype: str) -> Dict[str, float]:
    """Each entry's peak resident-set rise during one step, in a child process started with :data:`MALLOC_ENV`
    (in this process freed memory is kept for reuse, and a later step's peak would not show)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "memory.json")
        argv = [*args.argv, "--shapes", f"{dim}x{vocab}", "--dtype", dtype, "--memory-to", path]
        subprocess.run(
            [sys.executable, "-m", "hf_heads.cli.bench", *argv], env={**os.environ, **MALLOC_ENV}, check=True
        )
        with open(path) as f:
            return json.load(f)


def memory_child(args) -> None:
    """In the child of :func:`cpu_memory`: each entry's peak memory (the median of 3 steps, after one), to a file."""
    (_, dim, vocab, dtype), losses = settings(args)[0], {}
    run = steps(output_layer(dim, vocab, DTYPES[dtype], args, args.heads, peers=args.peers), losses)
    mem = {}
    for n, fn in run.items():
        try:
            fn()
            mem[n] = peak_memory(fn, repeats=3)
        except Exception:  # noqa: BLE001 - the parent reports the failure from its own run
            continue
    with open(args.memory_to, "w") as f:
        json.dump(mem, f)


def format_table(out: Dict) -> str:
    """Markdown: one table per setting, each entry's time and memory against the plain output layer."""
    lines = [f"Output layer forward + backward on {out['device']} (torch {out['torch']}); ratios to `{BASELINE}`.", ""]
    for label, s in out["settings"].items():
        lines += [
            f"**{label}, N = {s['tokens']}**",
            "",
            "| entry | time | memory | loss - baseline's |",
            "|---|---|---|---|",
        ]
        for n, r in s["rows"].items():
            mem = "-" if r["memory_ratio"] is None else f"{r['memory_ratio']:.2f}x ({r['peak_mib']:.0f} MiB)"
            diff = f"{r['loss_minus_baseline']:+.1e}" if "loss_minus_baseline" in r else ""
            lines.append(f"| {n} | {r['time_ratio']:.2f}x ({r['ms']:.2f} ms) | {mem} | {diff} |")
        lines += [f"| {n} | not run: {why} | | |" for n, why in s["errors"].items()] + [""]
    return "\n".join(lines)


def shape(text: str):
    """``DxV`` -> ``(d, V)``, both at least 1 (argparse names the option on a bad value)."""
    try:
        dim, vocab = (int(x) for x in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected DxV, e.g. 2048x50000") from None
    if dim < 1 or vocab < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: d and V must be at least 1")
    return dim, vocab


def parse_args(argv=None) -> argparse.Namespace:
    """The options, each device kind's defaults filled in (:data:`DEFAULTS`), checked."""
    p = argparse.ArgumentParser(prog="softmax-heads bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cpu", help="a torch device: cpu (default), cuda, cuda:1")
    p.add_argument("--tokens", type=int, help="N, tokens per step (default: 2048 on the CPU, 8192 on a GPU)")
    p.add_argument("--dim", type=int, nargs="+", help="d (default: 512 on the CPU, 1024 2048 on a GPU)")
    p.add_argument(
        "--vocab", type=int, nargs="+", help="V (default: 10000 33000 50257 on the CPU, 32000 50000 on a GPU)"
    )
    p.add_argument(
        "--shapes", type=shape, nargs="+", metavar="DxV", help="these (d, V) pairs instead of --dim x --vocab"
    )
    p.add_argument(
        "--dtype", nargs="+", choices=sorted(DTYPES), help="default: float32 on the CPU, bfloat16 float32 on a GPU"
    )
    labels = [h[0] for h in HEADS]
    p.add_argument("--heads", nargs="+", default=labels, choices=labels, metavar="LABEL", help=f"of: {labels}")
    p.add_argument(
        "--no-peers", dest="peers", action="store_false", help="skip torch's, Liger's and CCE's fused losses"
    )
    p.add_argument("--rounds", type=int, help="interleaved timing rounds, the median reported (default 5; GPU 3)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=None, help="torch's CPU threads")
    p.add_argument("--out", default="results/bench_heads", help="the folder of results.json and table.md")
    p.add_argument("--memory-to", help=argparse.SUPPRESS)  # internal: the CPU memory child's output file
    args = p.parse_args(argv)
    kind = torch.device(args.device).type
    for key, default in DEFAULTS["cuda" if kind == "cuda" else "cpu"].items():
        if getattr(args, key) is None:
            setattr(args, key, default)
    for key in ("tokens", "dim", "vocab", "rounds"):
        for value in getattr(args, key) if isinstance(getattr(args, key), list) else [getattr(args, key)]:
            if value < 1:
                p.error(f"--{key} {value}: must be at least 1")
    if kind == "cuda" and not torch.cuda.is_available():
        p.error(f"--device {args.device}: CUDA is not available (torch {torch.__version__}, CUDA {torch.version.cuda})")
    return args


def device_name(device) -> str:
    if torch.device(device).type == "cuda":
        return torch.cuda.get_device_name(torch.device(device))
    import platform

    return f"{platform.processor() or platform.machine()} CPU, {torch.get_num_threads()} threads"


def main(argv=None, log=print) -> Dict:
    """Every setting's rows, written to ``--out`` (``results.json``, ``table.md``) after each; returns the results."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.memory_to:
        return memory_child(args)
    args.argv = _without_option(
        argv, ("--shapes", "--dtype", "--dim", "--vocab")
    )  # the memory child's, less its setting
    out = {"device": device_name(args.device), "torch": torch.__version__, "settings": {}}
    os.makedirs(args.out, exist_ok=True)
    for label, dim, vocab, dtype in settings(args):
        out["settings"][label] = measure(dim, vocab, dtype, args, log)
        rows = out["settings"][label]["rows"]
        log(f"{label}: " + ", ".join(f"{n} {r['time_ratio']:.2f}x" for n, r in rows.items()))
        out["args"] = {k: v for k, v in vars(args).items() if k != "argv"}
        with open(os.path.join(args.out, "results.json"), "w") as f:
            json.dump(out, f, indent=1)
        with open(os.path.join(args.out, "table.md"), "w") as f:
            f.write(format_table(out) + "\n")
    log(format_table(out))
    return out


def _without_option(argv: List[str], options) -> List[str]:
    """``argv`` without the given options and their values (a value: every word up to the next option)."""
    kept, skipping = [], False
    for a in argv:
        if a.startswith("--"):
            skipping = a in options
        if not skipping:
            kept.append(a)
    return kept


if __name__ == "__main__":
    from hf_heads.cli.runner import run

    run(main)
