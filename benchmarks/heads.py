"""The project's training-cost benchmark, run from a checkout (``python -m benchmarks.heads``): what the library's
``softmax-heads bench`` (:mod:`hf_heads.cli.bench`) measures, and the instruments the project's pages and GPU check
need beside it: a whole-model step, x-transformers' MoS, a busy neighbour (``--busy``), and on a GPU each head's
variants (its products in bf16, its Triton kernels, plain autograd), rooflines and the targets (``targets.json``).
Each head's time and peak memory are ratios against plain torch softmax (``nn.Linear`` + ``F.cross_entropy``)
measured in the same process.

* output layer: N tokens of hidden states (d) -> ``head.loss(hidden, target)`` -> backward, for each V;
* whole model: a GPT-2-like LM (4 layers, d = 512, 8 heads, 2048 tokens per step) with the head swapped in
  (``hf_heads.swap_head``), forward + backward;
* peer: x-transformers' mixture of softmaxes (``TransformerWrapper(mixture_of_softmax=True)``), its own
  modules and math, when the ``x-transformers`` package is installed (skipped with a message otherwise).

Time: interleaved rounds, median seconds per step (:mod:`hf_heads.cli.timing`). Peak memory: the largest rise of the
process's resident set during one step over what it held before (sampled every 0.5 ms by a thread; the
median of a few steps), so it counts every activation, gradient and temporary the step allocates.

On a GPU (``--device cuda``): the output layer alone at N = 8192 tokens for every d, V and dtype asked for (by
default d = 1024 and 2048, V = 32000 and 50000, float32 and bfloat16: parameters and hidden states in that dtype),
each head against ``nn.Linear`` + ``F.cross_entropy`` in the same process, beside the fused losses where they import:
torch's chunked ``F.linear_cross_entropy``, Liger Kernel's fused linear cross-entropy and Apple's Cut Cross-Entropy,
and x-transformers' MoS beside MoS-3; each head also with its products in the parameters' dtype, with its Triton
kernels (``impl="triton"``) and by plain autograd (``impl="reference"``); every entry's roofline (:func:`rooflines`);
then a whole-model step of a SmolLM2-135M-shaped Llama (:func:`device_model_steps`); the targets in one place
(``TIME_TARGETS`` and below). Time: CUDA events, the median of interleaved rounds after warm-up steps (Triton
kernels compile once per shape). Memory: ``torch.cuda.max_memory_allocated`` during one step over what was allocated
before it (the inputs and the parameters are not counted; activations, temporaries and gradients are). Results are
written after every setting, so a run cut off keeps what it measured.

    python -m benchmarks.heads --out results/bench_heads
    python -m benchmarks.heads --vocab 10000 --no-model        # output layer only, one V
    python -m benchmarks.heads --device cuda --out results/bench_heads_gpu
    python -m benchmarks.heads --device cuda --shapes 2048x50000 576x49152 --dtype bfloat16   # gpu_check.sh's
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import importlib.util
import json
import os
import sys
from dataclasses import dataclass
from typing import Callable, Dict, Optional

import torch
import torch.nn.functional as F

import hf_heads
from hf_heads.cli.bench import (
    BASELINE,
    DTYPES,
    HEADS,
    LIGER,
    SAME_LOSS,
    cuda_memory,
    device_name,
    elapsed,
    output_layer,
    shape,
    step_times,
    steps as entry_steps,
    warm_up,
)
from hf_heads.cli.timing import MALLOC_ENV, busy_neighbour, busy_report, peak_memory
from hf_heads.core import functional

PEER = "x-transformers MoS K=3"


def _clear(params) -> None:
    for p in params:
        p.grad = None


def output_layer_steps(vocab: int, args) -> Dict[str, Callable[[], None]]:
    """One forward+backward per entry on the CPU (float32, with biases): the torch baseline, every head
    (:func:`hf_heads.cli.bench.output_layer`), and x-transformers' MoS when installed."""
    on_cpu = argparse.Namespace(**{**vars(args), "device": "cpu"})
    setting = output_layer(args.dim, vocab, torch.float32, on_cpu, args.heads, peers=False, bias=True)
    steps = entry_steps(setting, {})
    peer = xtransformers_mos(vocab, args.dim, k=3) if args.peer else None
    if peer is not None:

        def peer_step():
            xtransformers_mos_loss(peer, setting.hidden, setting.target).backward()
            _clear([setting.hidden, *peer.parameters()])

        steps[PEER] = peer_step
    return steps


def xtransformers_mos(vocab: int, dim: int, k: int):
    """x-transformers' ``TransformerWrapper`` with its mixture of softmaxes (``None`` if not installed)."""
    if importlib.util.find_spec("x_transformers") is None:
        return None
    from x_transformers import Decoder, TransformerWrapper

    return TransformerWrapper(
        num_tokens=vocab,
        max_seq_len=8,
        attn_layers=Decoder(dim=dim, depth=1, heads=8),
        mixture_of_softmax=True,
        mixture_of_softmax_k=k,
    ).train()


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
    for fn in steps.values():
        fn()
    return step_times(steps, args.rounds, "cpu")


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
        subprocess.run(
            [sys.executable, "-m", "benchmarks.heads", *argv, "--memory-to", path],
            env={**os.environ, **MALLOC_ENV},
            check=True,
        )
        with open(path) as f:
            return json.load(f)


# ------------------------------------------------------------------ on a device (--device cuda)
#: the GPU benchmark's settings unless given (N = 8192 tokens, d = 1024 / 2048, V = 32k / 50k: the shapes its targets
#: name)
DEVICE_DEFAULTS = {"tokens": 8192, "dim": [1024, 2048], "vocab": [32000, 50000], "rounds": 3}


#: heads whose lean loss goes through :func:`hf_heads.core.ops.softmax_rows`, where ``lean_product_dtype`` acts
LOW_PRODUCT_HEADS = ("softmax", "sigsoftmax", "plif", "mixtape", "mos")
#: each label's head name
HEAD_NAMES = {label: name for label, name, _ in HEADS}


def products_label(label: str, dtype) -> str:
    """The label of ``label``'s entry with ``lean_product_dtype = dtype``."""
    return f"{label} [{str(dtype).replace('torch.', '')} products]"


def kernels_label(label: str, dtype) -> str:
    """The label of ``label``'s entry with ``impl="triton"`` (its products in ``dtype`` where that is bf16 / fp16)."""
    low = dtype in (torch.bfloat16, torch.float16)
    return f"{label} [{str(dtype).replace('torch.', '')} products, triton]" if low else f"{label} [triton]"


def reference_label(label: str) -> str:
    """The label of ``label``'s entry with ``impl="reference"`` (plain autograd: its V-wide tensors kept)."""
    return f"{label} [reference]"


def head_label(entry: str) -> str:
    """The head (or baseline / peer) an entry's label belongs to: the label without its ``[...]`` variant."""
    return entry.split(" [", 1)[0]


def kernels_missing(device) -> Optional[str]:
    """Why ``impl="triton"`` cannot run on ``device`` here (None where it can)."""
    from hf_heads.core.ops import triton_rows

    try:
        triton_rows.check_can_run("impl='triton'", torch.empty(0, device=device))
    except ValueError as e:
        return str(e)
    return None


@dataclass
class Row:
    """One row of the device benchmark: its loss, the parameters its step clears, the head (label) whose roofline it
    is held to, the rows of its V-wide products per chunk, and the bytes of its float32 gradient accumulators."""

    loss: Callable[[], torch.Tensor]
    params: list
    work: str
    mm_rows: int
    accumulators: int = 0


def device_steps(vocab: int, dim: int, dtype: torch.dtype, args):
    """``(steps, losses, missing, rows)``: one forward+backward per entry on ``args.device`` (parameters and
    hidden states in ``dtype``, no bias): the library's entries (:func:`hf_heads.cli.bench.output_layer`) and each
    head's variants (its products in ``dtype``, its Triton kernels, plain autograd), each step's loss value, the
    entries that cannot run here (name -> why), and each entry's :class:`Row`."""
    n = args.tokens
    setting = output_layer(dim, vocab, dtype, args, args.heads, peers=args.peer)
    hidden, target = setting.hidden, setting.target
    rows, missing = {}, dict(setting.missing)
    no_kernels = kernels_missing(args.device) if args.kernels else None
    low = dtype in (torch.bfloat16, torch.float16)
    for label, entry in setting.entries.items():
        head = entry.head
        if head is None:  # the baseline and the fused peers: the plain step's work
            rows[label] = Row(entry.loss, entry.params, BASELINE, n)
            continue
        chunk = min(n, head.lean_chunk_tokens()) * head.lean_softmax_rows  # the V-wide product's rows a chunk
        acc = 4 * sum(p.numel() for p in head.parameters()) if head.lean_loss else 0

        def add(name, impl="auto", products=None, head=head, label=label, chunk=chunk, acc=acc):
            if products is not None:
                head = copy.deepcopy(head)
                head.lean_product_dtype = products
            loss = lambda: head.loss(hidden, target, impl=impl)  # noqa: E731
            rows[name] = Row(loss, list(head.parameters()), label, n if impl == "reference" else chunk, acc)

        add(label)
        if args.low_products and low and HEAD_NAMES[label] in LOW_PRODUCT_HEADS:
            add(products_label(label, dtype), products=dtype)  # V-wide products in dtype (float32 results)
        if args.kernels and not head.row_kernels:
            missing[kernels_label(label, dtype)] = (
                "no Triton kernels: this head's rows are grouped on the host (out of the kernels' scope)"
            )
        elif args.kernels:
            if no_kernels:
                missing[kernels_label(label, dtype)] = no_kernels
            else:
                add(kernels_label(label, dtype), "triton", products=dtype if low else None)
        if args.reference and head.lean_loss:
            add(reference_label(label), "reference", acc=0)
    if args.peer and "mos K=3" in args.heads:
        peer = xtransformers_mos(vocab, dim, k=3)
        if peer is None:
            missing[PEER] = "x-transformers is not installed (make install brings it)"
        else:
            peer = peer.to(hidden.device, hidden.dtype)
            loss = lambda: xtransformers_mos_loss(peer, hidden, target)  # noqa: E731
            rows[PEER] = Row(loss, list(peer.parameters()), "mos K=3", n)
    losses: Dict[str, torch.Tensor] = {}
    return entry_steps(dataclasses.replace(setting, entries=rows), losses), losses, missing, rows


# ------------------------------------------------------------------ the roofline: what a head's step cannot beat
def head_flops(label: str, tokens: int, dim: int, vocab: int) -> Optional[int]:
    """Matrix-product FLOPs of one forward + backward of the head ``label`` (the baseline's: plain softmax) over
    ``tokens`` tokens, counted by ``torch.utils.flop_counter`` on the meta device (its reference path: the products
    its math makes, the contexts' and gates' included; nothing is computed). None for a head whose rows are grouped
    on the host (class_softmax, d_softmax: their work depends on the targets' values, which the meta device has not)."""
    from torch.utils.flop_counter import FlopCounterMode

    name, options = ("softmax", {}) if label == BASELINE else next((n, o) for h, n, o in HEADS if h == label)
    if not hf_heads.get_head_class(name).row_kernels and name != "softmax":
        return None
    with torch.device("meta"):
        head = hf_heads.build_head(name, hidden_size=dim, vocab_size=vocab, **options, use_bias=False).train()
        hidden = torch.empty(tokens, dim, requires_grad=True)
        target = torch.zeros(tokens, dtype=torch.long)
    with FlopCounterMode(display=False) as counter:
        head.loss(hidden, target, impl="reference").backward()
    return counter.get_total_flops()


def vwide_values(label: str, tokens: int, vocab: int) -> int:
    """The V-wide values one step of ``label`` must read and write at least once: its logits (``tokens x V``; MoS-K:
    K of them; Mixtape: one, plus its frequent ids' K component logits and K - 1 gate pre-activations)."""
    if label in (BASELINE, PEER):
        label = "softmax (ours)" if label == BASELINE else "mos K=3"
    name, options = next((n, o) for h, n, o in HEADS if h == label)
    if name == "mos":
        return tokens * options["num_components"] * vocab
    if name == "mixtape":
        k = options["num_gates"]
        frequent = round(options["frequent_fraction"] * vocab)
        return tokens * (vocab + (2 * k - 1) * frequent)
    return tokens * vocab


def _device_seconds(fn: Callable[[], None], device, repeats: int = 5) -> float:
    """Median seconds of ``fn()`` on ``device`` (after one call)."""
    import statistics

    fn()
    cuda = torch.device(device).type == "cuda"
    return statistics.median(elapsed(fn, cuda) for _ in range(repeats))


def mm_rate(rows: int, dim: int, vocab: int, dtype: torch.dtype, device) -> float:
    """FLOP/s of ``torch.mm`` ``[rows, d] x [d, V]`` in ``dtype`` on ``device``, measured."""
    g = torch.Generator().manual_seed(0)
    a = torch.randn(rows, dim, generator=g).to(device, dtype)
    b = torch.randn(dim, vocab, generator=g).to(device, dtype)
    return 2.0 * rows * dim * vocab / _device_seconds(lambda: torch.mm(a, b), device)


def copy_bandwidth(device, dtype: torch.dtype, elements: int) -> float:
    """Bytes per second a device copy of ``elements`` values of ``dtype`` reads and writes, measured."""
    x = torch.ones(elements, dtype=dtype, device=device)
    y = torch.empty_like(x)
    return 2.0 * x.numel() * x.element_size() / _device_seconds(lambda: y.copy_(x), device)


def rooflines(entries: Dict[str, Row], vocab: int, dim: int, dtype: torch.dtype, args) -> Dict[str, Dict]:
    """Per entry: the roofline of its head (products' FLOPs over ``torch.mm``'s rate at the entry's chunk shape, plus
    a read and write of each V-wide value in ``dtype`` over a device copy's bandwidth, both measured here) in ms."""
    itemsize = torch.empty(0, dtype=dtype).element_size()
    bandwidth = copy_bandwidth(args.device, dtype, min(2**27, 64 * args.tokens * vocab))
    rates, flops, out = {}, {}, {}
    for name, entry in entries.items():
        if entry.mm_rows not in rates:
            rates[entry.mm_rows] = mm_rate(entry.mm_rows, dim, vocab, dtype, args.device)
        if entry.work not in flops:
            flops[entry.work] = head_flops(entry.work, args.tokens, dim, vocab)
        values = vwide_values(entry.work, args.tokens, vocab)
        seconds = None if flops[entry.work] is None else flops[entry.work] / rates[entry.mm_rows]
        seconds = None if seconds is None else seconds + 2 * itemsize * values / bandwidth
        out[name] = {
            "roofline_ms": None if seconds is None else 1e3 * seconds,
            "flops": flops[entry.work],
            "vwide_values": values,
            "mm_tflops": rates[entry.mm_rows] / 1e12,
            "mm_rows": entry.mm_rows,
            "copy_gbps": bandwidth / 1e9,
        }
    return out


def device_memory(step: Callable[[], None], device) -> Optional[float]:
    """Peak bytes allocated on a CUDA device during ``step()`` over what was allocated before it (None elsewhere)."""
    return cuda_memory(step, device) if torch.device(device).type == "cuda" else None


def device_settings(args):
    """``[(label, V, d, dtype name)]`` of the device benchmark, in the order they run (small first): ``--shapes``
    where given, else every ``--dim`` with every ``--vocab``."""
    shapes = args.shapes or [(d, v) for d in args.dim for v in args.vocab]
    return [(f"d={d} V={v} {dt}", v, d, dt) for dt in args.dtype for d, v in shapes]


def device_main(args, log=print) -> Dict[str, Dict]:
    """The benchmark on ``args.device``: every setting's rows and errors, then the whole-model step, written to
    ``args.out`` as it goes."""
    if torch.device(args.device).type == "cuda" and not torch.cuda.is_available():
        raise SystemExit(
            f"--device {args.device}: CUDA is not available (torch {torch.__version__}, "
            f"built with CUDA {torch.version.cuda})"
        )
    os.makedirs(args.out, exist_ok=True)
    out = {
        "device": device_name(args.device),
        "torch": torch.__version__,
        "args": vars(args),
        "tf32_matmul": torch.backends.cuda.matmul.allow_tf32,
        "settings": {},
    }
    for label, vocab, dim, dtype in device_settings(args):
        steps, losses, missing, entries = device_steps(vocab, dim, DTYPES[dtype], args)
        errors = dict(missing)
        warm_up(steps, errors, args.warmup, args.device, log)
        if BASELINE not in steps:
            raise RuntimeError(f"{label}: the baseline failed: {errors[BASELINE]}")
        secs = step_times(steps, args.rounds, args.device, args.repeats)
        mem = {n: device_memory(fn, args.device) for n, fn in steps.items()}
        roof = rooflines({n: entries[n] for n in steps}, vocab, dim, DTYPES[dtype], args)
        base_t, base_m = secs[BASELINE], mem[BASELINE]
        rows = {}
        for n in steps:
            acc = entries[n].accumulators / 2**20
            rows[n] = {
                "ms": 1e3 * secs[n],
                "time_ratio": secs[n] / base_t,
                "peak_mib": None if mem[n] is None else mem[n] / 2**20,
                "memory_ratio": None if mem[n] is None else mem[n] / base_m,
                # the float32 gradient accumulators of the lean loss (W's, mostly), inside peak_mib
                "accumulators_mib": acc,
                "peak_less_accumulators_mib": None if mem[n] is None else mem[n] / 2**20 - acc,
                "loss": float(losses[n]),
                **roof[n],
                "over_roofline": None if roof[n]["roofline_ms"] is None else secs[n] / (roof[n]["roofline_ms"] / 1e3),
            }
        for n in rows:
            if n in SAME_LOSS or head_label(n) == "softmax (ours)":
                rows[n]["loss_minus_baseline"] = rows[n]["loss"] - rows[BASELINE]["loss"]
        out["settings"][label] = {
            "vocab": vocab,
            "dim": dim,
            "dtype": dtype,
            "tokens": args.tokens,
            "rows": rows,
            "errors": errors,
        }
        log(
            f"{label}: "
            + ", ".join(
                f"{n} {r['time_ratio']:.2f}x" + ("" if r["memory_ratio"] is None else f" / {r['memory_ratio']:.2f}x")
                for n, r in rows.items()
            )
        )
        out["targets"] = targets(out)
        # whether the low-precision products accumulated in float32 (torch.mm's out_dtype) or were rounded first
        out["mm_out_dtype"] = dict(functional._MM_OUT_DTYPE)
        write_device_results(out, args.out)
    if args.model:
        out["model"] = device_model_main(args, log)
        out["targets"] = targets(out)
        write_device_results(out, args.out)
    return out


# ------------------------------------------------------------------ the whole-model step on a device
#: HuggingFaceTB/SmolLM2-135M's config.json (a Llama): the whole-model step's model at --model-layers 30, d = 576
SMOLLM2_135M = {
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "vocab_size": 49152,
    "tie_word_embeddings": True,
    "rope_theta": 100000.0,
    "rms_norm_eps": 1e-5,
    "max_position_embeddings": 8192,
}
PLAIN_MODEL = "plain model"
LIGER_MODEL = "Liger fused linear CE model"
#: heads of the whole-model step (with the kernels and products in the model's dtype beside each)
MODEL_HEADS = ("softmax (ours)", "sigsoftmax", "plif T=1e5", "mixtape K=4 r=0.1 d2=64", "mos K=3")


def smollm2_config(args):
    """A Llama config of SmolLM2-135M's shape, with ``--model-layers``, ``--model-dim`` and ``--model-vocab`` (a
    smaller d keeps SmolLM2's 64-wide attention heads, 3 query heads per key-value head and 8/3 d MLP)."""
    from transformers import LlamaConfig

    values = dict(SMOLLM2_135M, num_hidden_layers=args.model_layers, vocab_size=args.model_vocab)
    if args.model_dim != SMOLLM2_135M["hidden_size"]:
        heads = max(1, args.model_dim // 64)
        values.update(
            hidden_size=args.model_dim,
            intermediate_size=8 * args.model_dim // 3,
            num_attention_heads=heads,
            num_key_value_heads=max(1, heads // 3) if heads % 3 == 0 else heads,
        )
    return LlamaConfig(**values)


def device_model_steps(args):
    """``(steps, missing)``: one training step (forward + backward, ``--model-tokens`` tokens) of the SmolLM2-shaped
    Llama in ``--model-dtype`` on ``args.device``: the plain model, Liger's fused linear cross-entropy on it (its
    other kernels off: only the output layer differs), and each head swapped in, by default and with the kernels
    and its products in the model's dtype."""
    from transformers import LlamaForCausalLM

    device, dtype = torch.device(args.device), DTYPES[args.model_dtype]
    config = smollm2_config(args)
    seq = min(2048, args.model_tokens)
    g = torch.Generator().manual_seed(args.seed)
    ids = torch.randint(0, config.vocab_size, (max(1, args.model_tokens // seq), seq), generator=g).to(device)
    missing: Dict[str, str] = {}
    no_kernels = kernels_missing(device) if args.kernels else None

    def model(head=None, **options):
        torch.manual_seed(args.seed)
        m = LlamaForCausalLM(config).to(device, dtype).train()
        return m if head is None else hf_heads.swap_head(m, head, **options).train()

    models = {PLAIN_MODEL: model()}
    try:
        from liger_kernel.transformers import apply_liger_kernel_to_llama

        liger = model()
        apply_liger_kernel_to_llama(
            rope=False, rms_norm=False, swiglu=False, cross_entropy=False, fused_linear_cross_entropy=True, model=liger
        )
        models[LIGER_MODEL] = liger
    except ImportError as e:
        missing[LIGER_MODEL] = f"liger-kernel does not import: {e}"
    for label, name, options in HEADS:
        if label not in args.heads or label not in MODEL_HEADS:
            continue
        models[label] = model(name, **options)
        if args.kernels:
            if no_kernels:
                missing[kernels_label(label, dtype)] = no_kernels
                continue
            fast = model(name, **options)
            head = hf_heads.output_head(fast)
            head.lean_kernel = "triton"
            head.lean_product_dtype = dtype if dtype != torch.float32 else None
            models[kernels_label(label, dtype)] = fast

    def make(m):
        def step():
            m(ids, labels=ids).loss.backward()
            _clear(m.parameters())

        return step

    return {n: make(m) for n, m in models.items()}, missing


def device_model_main(args, log=print) -> Dict:
    """The whole-model step's rows (time, tokens per second, peak memory; ratios to the plain model's) and errors."""
    steps, errors = device_model_steps(args)
    label = f"model {args.model_layers} layers d={args.model_dim} V={args.model_vocab} {args.model_dtype}"
    warm_up(steps, errors, args.warmup, args.device, log)
    if PLAIN_MODEL not in steps:
        raise RuntimeError(f"{label}: the plain model failed: {errors[PLAIN_MODEL]}")
    secs = step_times(steps, args.rounds, args.device, args.repeats)
    mem = {n: device_memory(fn, args.device) for n, fn in steps.items()}
    tokens = max(1, args.model_tokens // min(2048, args.model_tokens)) * min(2048, args.model_tokens)
    rows = {
        n: {
            "ms": 1e3 * secs[n],
            "tokens_per_s": tokens / secs[n],
            "time_ratio": secs[n] / secs[PLAIN_MODEL],
            "peak_mib": None if mem[n] is None else mem[n] / 2**20,
            "memory_ratio": None if mem[n] is None else mem[n] / mem[PLAIN_MODEL],
        }
        for n in steps
    }
    log(f"{label}: " + ", ".join(f"{n} {r['time_ratio']:.2f}x" for n, r in rows.items()))
    return {"label": label, "tokens": tokens, "config": smollm2_config(args).to_dict(), "rows": rows, "errors": errors}


# ------------------------------------------------------------------ the targets, from one data file
def _targets_file() -> Dict:
    """targets.json beside this module: the goals the device benchmark checks, and their source."""
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "targets.json")) as f:
        return json.load(f)


TARGETS = _targets_file()
#: (entry, against, at most this ratio of time; both in the same variant: default, bf16 products, kernels)
TIME_TARGETS = [(t["entry"], t["against"], t["at_most"]) for t in TARGETS["time"]]
#: every head's time / roofline at most this many times the plain step's time / roofline at the same shape
ROOFLINE_TARGET = TARGETS["time_over_roofline_vs_plain"]
#: every head's loss memory at most this fraction of the baseline's (our softmax's, less its float32 accumulators,
#: at most Liger's)
MEMORY_TARGET = TARGETS["memory_vs_plain"]
#: the whole-model step: (head, at most this ratio of the plain model's step time)
MODEL_TARGETS = [(t["entry"], t["at_most"]) for t in TARGETS["model"]]


def targets(out: Dict) -> list:
    """The targets checked on the bf16 settings (each shape) and the whole-model step: one row each, with the
    measured ratio, the goal and by how much it misses (a ratio > 1 misses)."""
    rows = []

    def add(setting, what, measured, goal):
        rows.append(
            {
                "setting": setting,
                "target": what,
                "measured": measured,
                "goal": goal,
                "met": measured <= goal,
                "over_by": measured / goal,
            }
        )

    bf16 = torch.bfloat16
    variants = [lambda n: n, lambda n: products_label(n, bf16), lambda n: kernels_label(n, bf16)]
    for label, setting in out["settings"].items():
        if setting["dtype"] != "bfloat16":
            continue
        r = setting["rows"]
        for rename in variants:
            for entry, against, goal in TIME_TARGETS:
                entry, against = rename(entry), (against if against == LIGER else rename(against))
                if entry in r and against in r:
                    add(label, f"time {entry} / {against}", r[entry]["ms"] / r[against]["ms"], goal)
            for entry in [rename(h[0]) for h in HEADS]:
                if entry in r and r[entry]["over_roofline"] is not None:
                    over = r[entry]["over_roofline"] / r[BASELINE]["over_roofline"]
                    add(label, f"time/roofline {entry} / {BASELINE}'s", over, ROOFLINE_TARGET)
                if entry in r and r[entry]["memory_ratio"] is not None:
                    add(label, f"memory {entry} / {BASELINE}", r[entry]["memory_ratio"], MEMORY_TARGET)
            ours = rename("softmax (ours)")
            if ours in r and LIGER in r and r[LIGER]["peak_mib"]:
                less = r[ours]["peak_less_accumulators_mib"]
                add(label, f"memory {ours} less its float32 accumulators / {LIGER}", less / r[LIGER]["peak_mib"], 1.0)
    model = out.get("model")
    if model and model["label"].endswith("bfloat16"):
        r = model["rows"]
        for rename in (lambda n: n, lambda n: kernels_label(n, bf16)):
            for entry, goal in MODEL_TARGETS:
                if rename(entry) in r:
                    add(model["label"], f"time {rename(entry)} / {PLAIN_MODEL}", r[rename(entry)]["time_ratio"], goal)
    return rows


def format_device_table(out: Dict) -> str:
    """Markdown: one table per setting (time and memory against the baseline, the roofline, errors), the whole-model
    step, then the targets."""
    a = out["args"]
    defaults = {**DEVICE_DEFAULTS, "dtype": ["bfloat16", "float32"], "shapes": None}
    options = [f"--device {a['device']}"] + [
        f"--{key} " + " ".join(_shown(v) for v in (a[key] if isinstance(a[key], list) else [a[key]]))
        for key, default in defaults.items()
        if a.get(key) != default
    ]
    lines = [
        f"Output layer forward + backward on {out['device']} (torch {out['torch']}), "
        f"N = {a['tokens']} tokens; ratios against `{BASELINE}` (nn.Linear + F.cross_entropy) in "
        f"the same process. `python -m benchmarks.heads {' '.join(options)}`. Roofline: the head's product FLOPs "
        "over `torch.mm`'s rate at its chunk shape, plus a read and write of each of its V-wide values over a device "
        "copy's bandwidth (both measured in this run); memory less the lean loss's float32 gradient accumulators "
        "(W's) in brackets.",
        "",
    ]
    for label, s in out["settings"].items():
        lines += [
            f"**{label}**",
            "",
            "| entry | time | time / roofline | memory | loss - baseline's |",
            "|---|---|---|---|---|",
        ]
        for n, r in s["rows"].items():
            mem = "-"
            if r["memory_ratio"] is not None:
                mem = f"{r['memory_ratio']:.2f}x ({r['peak_mib']:.0f} MiB"
                mem += f"; {r['peak_less_accumulators_mib']:.0f} less acc.)" if r["accumulators_mib"] else ")"
            diff = f"{r['loss_minus_baseline']:+.1e}" if "loss_minus_baseline" in r else ""
            roof = "-" if r["over_roofline"] is None else f"{r['over_roofline']:.2f} ({r['roofline_ms']:.2f} ms)"
            lines.append(f"| {n} | {r['time_ratio']:.2f}x ({r['ms']:.2f} ms) | {roof} | {mem} | {diff} |")
        for n, why in s["errors"].items():
            lines.append(f"| {n} | not run: {why} | | | |")
        lines.append("")
    model = out.get("model")
    if model:
        lines += [
            f"**Whole-model training step: {model['label']}** (SmolLM2-135M's Llama shape, {model['tokens']} tokens)",
            "",
            "| entry | time | tokens / s | memory |",
            "|---|---|---|---|",
        ]
        for n, r in model["rows"].items():
            mem = "-" if r["memory_ratio"] is None else f"{r['memory_ratio']:.2f}x ({r['peak_mib']:.0f} MiB)"
            lines.append(f"| {n} | {r['time_ratio']:.2f}x ({r['ms']:.1f} ms) | {r['tokens_per_s']:.0f} | {mem} |")
        for n, why in model["errors"].items():
            lines.append(f"| {n} | not run: {why} | | |")
        lines.append("")
    if out.get("targets"):
        lines += [
            f"Targets (bf16; benchmarks/targets.json, from {TARGETS['source']}): a ratio over its goal misses "
            "by `measured / goal`.",
            "",
            "| setting | target | measured | goal | |",
            "|---|---|---|---|---|",
        ]
        for t in out["targets"]:
            verdict = "met" if t["met"] else f"missed by {t['over_by']:.2f}x"
            lines.append(f"| {t['setting']} | {t['target']} | {t['measured']:.2f} | {t['goal']:g} | {verdict} |")
    return "\n".join(lines)


def _shown(value) -> str:
    """An option's value as typed (a shape as DxV)."""
    return f"{value[0]}x{value[1]}" if isinstance(value, (list, tuple)) else str(value)


def write_device_results(out: Dict, folder: str) -> None:
    with open(os.path.join(folder, "results.json"), "w") as f:
        json.dump(out, f, indent=1)
    with open(os.path.join(folder, "table.md"), "w") as f:
        f.write(format_device_table(out) + "\n")


def format_table(results: Dict[str, Dict[str, Dict[str, float]]]) -> str:
    settings = list(results)
    head = "| head | " + " | ".join(f"{s} time | {s} memory" for s in settings) + " |"
    lines = [head, "|---|" + "---|---|" * len(settings)]
    labels = list(dict.fromkeys(n for s in settings for n in results[s]))
    for n in labels:
        cells = []
        for s in settings:
            r = results[s].get(n)
            cells += (
                ["-", "-"]
                if r is None
                else [
                    f"{r['time_ratio']:.2f}x ({r['ms']:.0f} ms)",
                    f"{r['memory_ratio']:.2f}x ({r['peak_mib']:.0f} MiB)",
                ]
            )
        lines.append(f"| {n} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def format_busy(busy: Dict[str, Dict[str, Dict[str, float]]]) -> str:
    """The --busy table: per setting and head, the time ratio to softmax quiet and beside a busy neighbour, the
    head's own slowdown and that slowdown over softmax's (the aim: at most 1.5)."""
    from hf_heads.cli.process import describe

    lines = [
        f"Beside a busy neighbour process (`--busy`; {describe()}):",
        "",
        "| setting | head | ratio quiet | ratio busy | slowdown busy/quiet | slowdown / softmax's |",
        "|---|---|---|---|---|---|",
    ]
    for s, rows in busy.items():
        for n, r in rows.items():
            lines.append(
                f"| {s} | {n} | {r['quiet_ratio']:.2f}x | {r['busy_ratio']:.2f}x | {r['slowdown']:.2f}x | "
                f"{r['relative_slowdown']:.2f} |"
            )
    return "\n".join(lines)


def parse_args(argv=None) -> argparse.Namespace:
    """The command's options, the defaults of the CPU or the GPU benchmark filled in, checked."""
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    p.add_argument(
        "--vocab", type=int, nargs="+", default=None, help="V (default 10000 33000 50257; with --device, 32000 50000)"
    )
    p.add_argument("--tokens", type=int, default=None, help="N, tokens per step (default 2048; with --device, 8192)")
    p.add_argument(
        "--dim",
        type=int,
        nargs="+",
        default=None,
        help="d (default 512; with --device, 1024 2048; without it only the first counts)",
    )
    p.add_argument(
        "--heads",
        nargs="+",
        default=[h[0] for h in HEADS],
        choices=[h[0] for h in HEADS],
        metavar="LABEL",
        help="heads to measure (labels as in the table)",
    )
    p.add_argument("--no-model", dest="model", action="store_false", help="skip the whole-model step")
    p.add_argument(
        "--model-vocab", type=int, default=None, help="V of the whole-model step (default 10000; with --device, 49152)"
    )
    p.add_argument(
        "--model-layers", type=int, default=30, help="with --device: layers of the SmolLM2-shaped whole-model step"
    )
    p.add_argument("--model-dim", type=int, default=576, help="with --device: d of the whole-model step")
    p.add_argument("--model-tokens", type=int, default=8192, help="with --device: tokens per whole-model step")
    p.add_argument(
        "--model-dtype", default="bfloat16", choices=sorted(DTYPES), help="with --device: the whole model's dtype"
    )
    p.add_argument("--no-peer", dest="peer", action="store_false", help="skip x-transformers' MoS")
    p.add_argument(
        "--rounds", type=int, default=None, help="interleaved timing rounds (median; default 5, with --device 3)"
    )
    p.add_argument("--memory-repeats", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument(
        "--busy",
        action="store_true",
        help="time every step quiet and again beside a busy neighbour process (matmuls on one core): "
        "each head's ratio to softmax both ways and its slowdown against softmax's own",
    )
    add_device_options(p)
    p.add_argument("--out", default="results/bench_heads")
    p.add_argument("--memory-to", default=None, help=argparse.SUPPRESS)  # internal: the memory child's output
    args = p.parse_args(argv)
    defaults = (
        DEVICE_DEFAULTS if args.device else {"tokens": 2048, "dim": [512], "vocab": [10000, 33000, 50257], "rounds": 5}
    )
    for key in ("tokens", "dim", "vocab", "rounds"):
        if getattr(args, key) is None:
            setattr(args, key, defaults[key])
    if args.model_vocab is None:
        args.model_vocab = SMOLLM2_135M["vocab_size"] if args.device else 10000
    for key in ("tokens", "dim", "vocab", "rounds", "repeats", "model_vocab", "model_layers", "model_dim"):
        for value in getattr(args, key) if isinstance(getattr(args, key), list) else [getattr(args, key)]:
            if value < 1:
                p.error(f"--{key.replace('_', '-')} {value}: must be at least 1")
    if not args.device:
        args.dim = args.dim[0]
    return args


def add_device_options(p: argparse.ArgumentParser) -> None:
    """The options of the GPU benchmark (``--device``): dtypes, shapes, which entries, warm-up and repeats."""
    p.add_argument(
        "--device",
        default=None,
        help="run the output-layer benchmark on this torch device (cuda, cuda:1, cpu): CUDA-event times, "
        "torch.cuda peak memory, the fused peers; without it, the CPU benchmark above",
    )
    p.add_argument(
        "--dtype",
        nargs="+",
        default=["bfloat16", "float32"],
        choices=sorted(DTYPES),
        help="with --device: the dtypes of the parameters and hidden states",
    )
    p.add_argument(
        "--no-low-products",
        dest="low_products",
        action="store_false",
        help="with --device and a bf16 / fp16 dtype: skip the entries whose V-wide products run in that "
        "dtype (head.lean_product_dtype)",
    )
    p.add_argument(
        "--shapes",
        nargs="+",
        type=shape,
        default=None,
        metavar="DxV",
        help="with --device: these (d, V) pairs instead of every --dim with every --vocab (e.g. 2048x50000 576x49152)",
    )
    p.add_argument(
        "--no-kernels",
        dest="kernels",
        action="store_false",
        help="with --device: skip the impl='triton' entries (the Triton kernels of the heads that have them)",
    )
    p.add_argument(
        "--no-reference",
        dest="reference",
        action="store_false",
        help="with --device: skip the impl='reference' entries (plain autograd; reported as failed where they do "
        "not fit in memory)",
    )
    p.add_argument(
        "--warmup",
        type=int,
        default=1,
        help="with --device: untimed steps of each entry first (Triton compiles in the first)",
    )
    p.add_argument("--repeats", type=int, default=1, help="with --device: steps per timed round")


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
    if args.device:
        out = device_main(args, log)
        log(format_device_table(out))
        return out
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
        results[s] = {
            n: {
                "ms": 1e3 * secs[n],
                "peak_mib": mem[s][n] / 2**20,
                "time_ratio": secs[n] / base_t,
                "memory_ratio": mem[s][n] / base_m,
            }
            for n in secs
        }
        log(
            f"{s}: "
            + ", ".join(f"{n} {r['time_ratio']:.2f}x / {r['memory_ratio']:.2f}x" for n, r in results[s].items())
        )
    table = format_table(results) + ("\n\n" + format_busy(busy) if busy else "")
    log(table)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "table.md"), "w") as f:
        f.write(table + "\n")
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump({"results": results, "busy": busy, "args": vars(args)}, f, indent=1)
    return results


if __name__ == "__main__":
    from hf_heads.cli.runner import run

    run(main)
