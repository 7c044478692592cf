"""The PLIF paper's synthetic experiment: which heads can fit high-rank distributions?

Ganea et al. (2019), "Synthetic experiments - mode matching (alpha = 0.01)": N contexts c_i, each
with a true next-token distribution ``P*(.|c_i) ~ Dirichlet(alpha)`` over M outcomes. Every
context gets its own free embedding g_i (size d < M), the output embeddings are shared, and each
head is trained to fit ``P*`` by minimising the cross-entropy ``-sum_x P*(x|c) log P(x|c)``
(equivalently KL(P* || P) + H(P*)). Because contexts are free parameters, whatever a head
cannot fit is due to the output layer alone: the softmax bottleneck (rank(log P) <= d + 1).

Reported per head: mode matching (% of contexts with argmax P = argmax P*), mean KL(P* || P) in
nats, parameters and training time; a plot of both and of KL during training.

    python -m recipes.synthetic_bottleneck                     # defaults: N=M=512, d=8, 1000 steps
    python -m recipes.synthetic_bottleneck --steps 200 --heads softmax plif
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Dict, List, Optional

import torch

import hf_heads

DEFAULT_HEAD_OPTIONS: Dict[str, Dict] = {
    # the papers' settings where they have one. Outcome ids are ordered by total true mass, but
    # Dirichlet draws have no Zipfian head: every outcome is equally "frequent", so Mixtape's gate
    # sharing (frequent_fraction < 1) would only remove capacity; here every id gets its own gates.
    "mos": {"num_components": 15},
    "mos_plif": {"num_components": 15, "num_knots": 100000, "knot_range": 20.0},
    "mixtape": {"num_gates": 4, "frequent_fraction": 1.0, "gate_embedding_size": 16, "gate_noise": 0.1},
    "plif": {"num_knots": 100000, "knot_range": 20.0},
}


def default_heads() -> List[str]:
    """The plain softmax and every registered head that is more expressive than it (the heads whose
    purpose is speed, like DS-Softmax, have their own recipes)."""
    return [h for h in hf_heads.available_heads() if hf_heads.get_head_class(h).purpose in ("reference", "bottleneck")]


def make_task(num_contexts: int, num_outcomes: int, alpha: float, seed: int) -> torch.Tensor:
    """True distributions ``[N, M]`` drawn from Dirichlet(alpha), outcome ids sorted by total mass."""
    g = torch.Generator().manual_seed(seed)
    # Dirichlet via normalised Gamma draws; tiny alpha underflows float32 gammas, so use float64
    gam = torch._standard_gamma(torch.full((num_contexts, num_outcomes), alpha, dtype=torch.float64), generator=g)
    # a context whose every draw underflowed to 0 gets a uniformly random single mode
    empty = gam.sum(1) == 0
    if empty.any():
        gam[empty, torch.randint(0, num_outcomes, (int(empty.sum()),), generator=g)] = 1.0
    p = gam / gam.sum(1, keepdim=True)
    order = p.sum(0).argsort(descending=True)
    return p[:, order].float()


def mode_matching(log_p: torch.Tensor, p_true: torch.Tensor) -> float:
    """% of contexts whose most probable outcome is the true one."""
    return 100.0 * (log_p.argmax(1) == p_true.argmax(1)).float().mean().item()


def kl_to_truth(log_p: torch.Tensor, p_true: torch.Tensor) -> float:
    """Mean over contexts of KL(P* || P) in nats."""
    log_true = torch.where(p_true > 0, p_true.log(), torch.zeros_like(p_true))
    return (p_true * (log_true - log_p)).sum(1).mean().item()


#: the optimizers :func:`train_head` runs (full batch, cosine decay): Adam, and plain SGD (no momentum, as NT-ASGD)
OPTIMIZERS = {"adam": torch.optim.Adam, "sgd": torch.optim.SGD}


def train_head(
    name: str,
    p_true: torch.Tensor,
    dim: int,
    steps: int,
    lr: float,
    seed: int,
    options: Optional[Dict] = None,
    eval_every: int = 50,
    progress: bool = True,
    optimizer: str = "adam",
) -> Dict:
    """Fit free context embeddings + one head to ``p_true`` with ``optimizer`` (a key of :data:`OPTIMIZERS`);
    return the metrics and a KL curve."""
    from tqdm.auto import tqdm

    if optimizer not in OPTIMIZERS:
        raise ValueError(f"optimizer={optimizer!r}; allowed: {', '.join(OPTIMIZERS)}")
    torch.manual_seed(seed)
    n, m = p_true.shape
    head = hf_heads.build_head(name, hidden_size=dim, vocab_size=m, **(options or {}))
    contexts = torch.nn.Parameter(torch.randn(n, dim))
    params = [contexts, *head.parameters()]
    opt = OPTIMIZERS[optimizer](params, lr=lr)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, steps)
    curve = []

    def evaluate(step):
        head.eval()
        with torch.no_grad():
            lp = head(contexts)
        head.train()
        curve.append((step, kl_to_truth(lp, p_true), mode_matching(lp, p_true)))
        return lp

    start = time.perf_counter()
    bar = tqdm(range(steps), desc=f"{name:>10}", disable=not progress, leave=False)
    for step in bar:
        opt.zero_grad(set_to_none=True)
        loss = -(p_true * head(contexts)).sum(1).mean() + head.aux_loss()
        loss.backward()
        opt.step()
        sched.step()
        if step % eval_every == 0 or step == steps - 1:
            evaluate(step + 1)
            bar.set_postfix(kl=f"{curve[-1][1]:.3f}", mode=f"{curve[-1][2]:.1f}%")
    elapsed = time.perf_counter() - start
    lp = evaluate(steps)
    return {
        "head": name,
        "options": head.config.to_dict(),
        "head_parameters": sum(p.numel() for p in head.parameters()),
        "mode_matching": mode_matching(lp, p_true),
        "kl": kl_to_truth(lp, p_true),
        "train_seconds": elapsed,
        "curve": curve,
    }


def format_table(results: List[Dict], setup: Dict) -> str:
    """A markdown table of the results, best mode matching first."""
    lines = [
        f"Synthetic softmax-bottleneck task: N={setup['num_contexts']} contexts, M={setup['num_outcomes']} "
        f"outcomes, d={setup['dim']}, Dirichlet alpha={setup['alpha']}, {setup['steps']} full-batch Adam "
        f"steps (lr {setup['lr']}), seed {setup['seed']}.",
        "",
        "| head | options | head params | mode matching % | KL(P*‖P) nats | train time s |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for r in sorted(results, key=lambda r: (-r["mode_matching"], r["kl"])):
        opts = ", ".join(f"{k}={v}" for k, v in sorted(setup["head_options"].get(r["head"], {}).items()))
        lines.append(
            f"| {r['head']} | {opts or '-'} | {r['head_parameters']:,} | {r['mode_matching']:.1f} | "
            f"{r['kl']:.3f} | {r['train_seconds']:.1f} |"
        )
    return "\n".join(lines)


def plot(results: List[Dict], path: str, setup: Dict) -> None:
    """Bar charts of mode matching and KL, and the KL curves during training."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    results = sorted(results, key=lambda r: -r["mode_matching"])
    names = [r["head"] for r in results]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    axes[0].barh(names, [r["mode_matching"] for r in results], color="tab:blue")
    axes[0].set_xlabel("mode matching (%)")
    axes[0].set_xlim(0, 100)
    axes[0].invert_yaxis()
    for i, r in enumerate(results):
        axes[0].text(r["mode_matching"] + 1, i, f"{r['mode_matching']:.1f}", va="center")
    axes[1].barh(names, [r["kl"] for r in results], color="tab:orange")
    axes[1].set_xlabel("KL(P* || P), nats (lower is better)")
    axes[1].invert_yaxis()
    for r in results:
        steps, kl, _ = zip(*r["curve"])
        axes[2].plot(steps, kl, label=r["head"])
    axes[2].set_xlabel("training step")
    axes[2].set_ylabel("KL(P* || P), nats")
    axes[2].set_yscale("log")
    axes[2].yaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
    axes[2].yaxis.set_minor_formatter(matplotlib.ticker.ScalarFormatter())
    axes[2].legend()
    fig.suptitle(
        f"Softmax bottleneck, synthetic: N={setup['num_contexts']}, M={setup['num_outcomes']}, "
        f"d={setup['dim']}, alpha={setup['alpha']}"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def add_task_args(p: argparse.ArgumentParser, dim: int, steps: int) -> None:
    """The task's options (N, M, d, alpha, steps), for this recipe and the ones that reuse the task."""
    p.add_argument("--num-contexts", type=int, default=512, help="N, number of contexts")
    p.add_argument("--num-outcomes", type=int, default=512, help="M, number of outcomes (vocabulary)")
    p.add_argument("--dim", type=int, default=dim, help="d, context/embedding size (d < M: the bottleneck)")
    p.add_argument("--alpha", type=float, default=0.01, help="Dirichlet concentration of the true distributions")
    p.add_argument("--steps", type=int, default=steps, help="full-batch training steps per run")


def check_task_args(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Stop with argparse's error for a task option out of its range, naming the option, the value and the range."""
    for flag, value, lo in (
        ("--num-contexts", args.num_contexts, 1),
        ("--num-outcomes", args.num_outcomes, 2),
        ("--dim", args.dim, 1),
        ("--steps", args.steps, 1),
    ):
        if value < lo:
            p.error(f"{flag}={value} is out of range; allowed: an integer >= {lo}")
    if not (args.alpha > 0):
        p.error(f"--alpha={args.alpha} is out of range; allowed: a number > 0")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    add_task_args(p, dim=8, steps=1000)
    p.add_argument("--lr", type=float, default=0.02, help="Adam learning rate (cosine decay)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--heads",
        nargs="+",
        default=None,
        help=f"heads to train (default: the softmax and every bottleneck breaker: {', '.join(default_heads())})",
    )
    p.add_argument(
        "--head-options",
        type=json.loads,
        default={},
        help='JSON {head: {option: value}} overriding the defaults, e.g. \'{"mos": {"num_components": 3}}\'',
    )
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    p.add_argument("--out", default="results/synthetic_bottleneck", help="output directory")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    args = p.parse_args(argv)
    check_task_args(p, args)
    if not (args.lr > 0):
        p.error(f"--lr={args.lr} is out of range; allowed: a number > 0")
    heads = args.heads or default_heads()
    unknown = [h for h in heads + list(args.head_options) if h not in hf_heads.available_heads()]
    if unknown:
        p.error(
            f"--heads/--head-options name unknown head(s) {unknown}; available: {', '.join(hf_heads.available_heads())}"
        )
    args.heads = heads
    return args


def main(argv=None) -> List[Dict]:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    p_true = make_task(args.num_contexts, args.num_outcomes, args.alpha, args.seed)
    head_options = {h: {**DEFAULT_HEAD_OPTIONS.get(h, {}), **args.head_options.get(h, {})} for h in args.heads}
    setup = {
        "num_contexts": args.num_contexts,
        "num_outcomes": args.num_outcomes,
        "dim": args.dim,
        "alpha": args.alpha,
        "steps": args.steps,
        "lr": args.lr,
        "seed": args.seed,
        "head_options": head_options,
        "torch_threads": torch.get_num_threads(),
    }
    print(
        f"true distributions: mean max prob {p_true.max(1).values.mean():.3f}, "
        f"mean entropy {-(p_true * p_true.clamp_min(1e-30).log()).sum(1).mean():.3f} nats, "
        f"rank(log P*) > d={args.dim} (bottleneck bound d+1={args.dim + 1})"
    )
    results = []
    for name in args.heads:
        r = train_head(
            name, p_true, args.dim, args.steps, args.lr, args.seed, head_options[name], progress=not args.no_progress
        )
        print(
            f"{name:>10}: mode matching {r['mode_matching']:5.1f}%  KL {r['kl']:.3f}  ({r['train_seconds']:.1f}s)",
            flush=True,
        )
        results.append(r)
    table = format_table(results, setup)
    print()
    print(table)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump({"setup": setup, "results": results}, f, indent=2)
    with open(os.path.join(args.out, "results.md"), "w") as f:
        f.write(table + "\n")
    plot(results, os.path.join(args.out, "synthetic_bottleneck.png"), setup)
    print(f"\nwrote {args.out}/results.md, results.json, synthetic_bottleneck.png")
    return results


if __name__ == "__main__":
    from hf_heads.cli.runner import run

    run(main)
