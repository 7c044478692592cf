"""Training cost of every head: output-layer forward+backward time and peak memory, as ratios against plain
torch softmax (``nn.Linear`` + ``F.cross_entropy``) measured in the same process.

* output layer: N tokens of hidden states (d) -> ``head.loss(hidden, target)`` -> backward, for each V;
* whole model: a GPT-2-like LM (4 layers, d = 512, 8 heads, 2048 tokens per step) with the head swapped in
  (``hf_heads.swap_head``), forward + backward;
* peer: x-transformers' mixture of softmaxes (``TransformerWrapper(mixture_of_softmax=True)``), its own
  modules and math, when the ``x-transformers`` package is installed (skipped with a message otherwise).

Time: interleaved rounds, median seconds per step (recipes/timing.py). Peak memory: the largest rise of the
process's resident set during one step over what it held before (sampled every 0.5 ms by a thread; the
median of a few steps), so it counts every activation, gradient and temporary the step allocates.

    python -m recipes.bench_heads --out results/bench_heads
    python -m recipes.bench_heads --vocab 10000 --no-model      # output layer only, one V
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
from typing import Callable, Dict

import torch
import torch.nn.functional as F

import hf_heads
from recipes.timing import MALLOC_ENV, busy_neighbour, busy_report, peak_memory, time_per_call


#: (label, head name, options): the settings of the issue's target table
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
PEER = "x-transformers MoS K=3"


def _clear(params) -> None:
    for p in params:
        p.grad = None


def output_layer_steps(vocab: int, args) -> Dict[str, Callable[[], None]]:
    """One forward+backward per entry: the torch baseline, every head, and the peer when installed."""
    g = torch.Generator().manual_seed(args.seed)
    hidden = torch.randn(args.tokens, args.dim, generator=g).requires_grad_()
    target = torch.randint(0, vocab, (args.tokens,), generator=g)
    steps: Dict[str, Callable[[], None]] = {}

    linear = torch.nn.Linear(args.dim, vocab)

    def baseline():
        F.cross_entropy(linear(hidden), target).backward()
        _clear([hidden, *linear.parameters()])
    steps[BASELINE] = baseline

    for label, name, options in HEADS:
        if label not in args.heads:
            continue
        head = hf_heads.build_head(name, hidden_size=args.dim, vocab_size=vocab, **options).train()

        def step(head=head):
            head.loss(hidden, target).backward()
            _clear([hidden, *head.parameters()])
        steps[label] = step

    peer = xtransformers_mos(vocab, args.dim, k=3) if args.peer else None
    if peer is not None:
        def peer_step():
            xtransformers_mos_loss(peer, hidden, target).backward()
            _clear([hidden, *peer.parameters()])
        steps[PEER] = peer_step
    return steps


def xtransformers_mos(vocab: int, dim: int, k: int):
    """x-transformers' ``TransformerWrapper`` with its mixture of softmaxes (``None`` if not installed)."""
    if importlib.util.find_spec("x_transformers") is None:
        return None
    from x_transformers import Decoder, TransformerWrapper

    return TransformerWrapper(num_tokens=vocab, max_seq_len=8, attn_layers=Decoder(dim=dim, depth=1, heads=8),
                              mixture_of_softmax=True, mixture_of_softmax_k=k).train()


def xtransformers_mos_loss(wrapper, hidden: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """The output path of ``TransformerWrapper.forward`` with ``mixture_of_softmax`` (its own modules, its
    math: softmax of each component, mixed in probability space, log), then the NLL."""
    combine = wrapper.combine_mixture(hidden).softmax(dim=-1)
    logits = wrapper.to_logits(wrapper.to_mixture(hidden))
    mos = torch.einsum("...kd,...k->...d", logits.softmax(dim=-1), combine)
    return F.nll_loss(torch.log(mos), target)


def model_steps(args) -> Dict[str, Callable[[], None]]:
    """Forward+backward of a GPT-2-like LM (4 layers) with each head swapped in."""
    from transformers import GPT2Config, GPT2LMHeadModel

    vocab = args.model_vocab
    seq = 512
    ids = torch.randint(0, vocab, (args.tokens // seq, seq), generator=torch.Generator().manual_seed(args.seed))
    config = GPT2Config(vocab_size=vocab, n_positions=seq, n_embd=args.dim, n_layer=4, n_head=8)
    steps: Dict[str, Callable[[], None]] = {}
    for label, name, options in [(BASELINE, None, {})] + [h for h in HEADS if h[0] in args.heads]:
        torch.manual_seed(args.seed)
        model = GPT2LMHeadModel(config).train()
        if name is not None:
            model = hf_heads.swap_head(model, name, **options).train()

        def step(model=model):
            model(ids, labels=ids).loss.backward()
            _clear(model.parameters())
        steps[label] = step
    return steps


def measure_time(steps: Dict[str, Callable[[], None]], args) -> Dict[str, float]:
    """Seconds per step, interleaved rounds, medians (after one warm-up step each)."""
    def with_grad(fn):  # time_per_call times under no_grad
        with torch.enable_grad():
            fn()
    return time_per_call({n: (lambda _, fn=fn: with_grad(fn)) for n, fn in steps.items()}, [None],
                         rounds=args.rounds, warmup=1)


def measure_memory(steps: Dict[str, Callable[[], None]], args) -> Dict[str, float]:
    """Peak resident-set rise of each step in bytes (after one warm-up step each)."""
    for fn in steps.values():
        fn()
    return {n: peak_memory(fn, repeats=args.memory_repeats) for n, fn in steps.items()}


def run_memory_child(argv) -> Dict[str, Dict[str, float]]:
    """Memory in a child process whose glibc maps every allocation above 64 KiB on its own and returns it
    when freed (otherwise freed memory is kept for reuse and a later step's peak does not show in the
    resident set); timing stays in this process, with the normal allocator."""
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "memory.json")
        subprocess.run([sys.executable, "-m", "recipes.bench_heads", *argv, "--memory-to", path],
                       env={**os.environ, **MALLOC_ENV}, check=True)
        with open(path) as f:
            return json.load(f)


def format_table(results: Dict[str, Dict[str, Dict[str, float]]]) -> str:
    settings = list(results)
    head = "| head | " + " | ".join(f"{s} time | {s} memory" for s in settings) + " |"
    lines = [head, "|---|" + "---|---|" * len(settings)]
    labels = list(dict.fromkeys(n for s in settings for n in results[s]))
    for n in labels:
        cells = []
        for s in settings:
            r = results[s].get(n)
            cells += ["-", "-"] if r is None else [f"{r['time_ratio']:.2f}x ({r['ms']:.0f} ms)",
                                                   f"{r['memory_ratio']:.2f}x ({r['peak_mib']:.0f} MiB)"]
        lines.append(f"| {n} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def format_busy(busy: Dict[str, Dict[str, Dict[str, float]]]) -> str:
    """The --busy table: per setting and head, the time ratio to softmax quiet and beside a busy neighbour, the
    head's own slowdown and that slowdown over softmax's (the aim: at most 1.5)."""
    from hf_heads.threads import describe

    lines = [f"Beside a busy neighbour process (`--busy`; {describe()}):", "",
             "| setting | head | ratio quiet | ratio busy | slowdown busy/quiet | slowdown / softmax's |",
             "|---|---|---|---|---|---|"]
    for s, rows in busy.items():
        for n, r in rows.items():
            lines.append(f"| {s} | {n} | {r['quiet_ratio']:.2f}x | {r['busy_ratio']:.2f}x | {r['slowdown']:.2f}x | "
                         f"{r['relative_slowdown']:.2f} |")
    return "\n".join(lines)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--vocab", type=int, nargs="+", default=[10000, 33000, 50257])
    p.add_argument("--tokens", type=int, default=2048, help="N, tokens per step")
    p.add_argument("--dim", type=int, default=512, help="d")
    p.add_argument("--heads", nargs="+", default=[h[0] for h in HEADS], choices=[h[0] for h in HEADS],
                   metavar="LABEL", help="heads to measure (labels as in the table)")
    p.add_argument("--no-model", dest="model", action="store_false", help="skip the whole-model step")
    p.add_argument("--model-vocab", type=int, default=10000, help="V of the whole-model step")
    p.add_argument("--no-peer", dest="peer", action="store_false", help="skip x-transformers' MoS")
    p.add_argument("--rounds", type=int, default=5, help="interleaved timing rounds (median)")
    p.add_argument("--memory-repeats", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--busy", action="store_true",
                   help="time every step quiet and again beside a busy neighbour process (matmuls on one core): "
                        "each head's ratio to softmax both ways and its slowdown against softmax's own")
    p.add_argument("--out", default="results/bench_heads")
    p.add_argument("--memory-to", default=None, help=argparse.SUPPRESS)  # internal: the memory child's output
    return p.parse_args(argv)




def settings(args):
    """``{setting: steps factory}``: the output layer at each V, then the whole model."""
    out = {f"V={v}": (lambda v=v: output_layer_steps(v, args)) for v in args.vocab}
    if args.model:
        out[f"model V={args.model_vocab}"] = lambda: model_steps(args)
    return out


def main(argv=None, log=print) -> Dict[str, Dict[str, Dict[str, float]]]:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.memory_to:  # the child: memory only
        mem = {s: measure_memory(make(), args) for s, make in settings(args).items()}
        with open(args.memory_to, "w") as f:
            json.dump(mem, f)
        return {}
    if args.peer and importlib.util.find_spec("x_transformers") is None:
        print(f"{PEER} skipped: pip install x-transformers", file=sys.stderr)
    mem = run_memory_child(argv)
    results: Dict[str, Dict[str, Dict[str, float]]] = {}
    busy: Dict[str, Dict[str, Dict[str, float]]] = {}
    for s, make in settings(args).items():
        steps = make()
        secs = measure_time(steps, args)
        if args.busy:  # the same steps again beside a busy neighbour, against the quiet times just taken
            with busy_neighbour():
                busy[s] = busy_report(secs, measure_time(steps, args), BASELINE)
        base_t, base_m = secs[BASELINE], mem[s][BASELINE]
        results[s] = {n: {"ms": 1e3 * secs[n], "peak_mib": mem[s][n] / 2**20, "time_ratio": secs[n] / base_t,
                          "memory_ratio": mem[s][n] / base_m} for n in secs}
        log(f"{s}: " + ", ".join(f"{n} {r['time_ratio']:.2f}x / {r['memory_ratio']:.2f}x" for n, r in results[s].items()))
    table = format_table(results) + ("\n\n" + format_busy(busy) if busy else "")
    log(table)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "table.md"), "w") as f:
        f.write(table + "\n")
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump({"results": results, "busy": busy, "args": vars(args)}, f, indent=1)
    return results


if __name__ == "__main__":
    from recipes.cli import run

    run(main)
