"""Do the lean loss's V-wide products in bf16 change bf16 training? Loss curves, float32 against bf16 products.

A small GPT-2 (from its config, through the transformers adapter) trains on PTB's train split (word level, its own
10k vocabulary) for ``--steps`` steps with each head, in two precisions:

* ``bf16``: bf16 parameters (AdamW updates them in bf16), the head's math in float32 as always;
* ``autocast``: float32 master parameters under ``torch.autocast("cpu", torch.bfloat16)``, what HF Trainer's
  ``bf16=True`` gives;

and, for each, the lean loss's three V-wide products in float32 (``lean_product_dtype=None``, the default) and as the
parameters / autocast say (``"follow"``: bf16 operands, float32 results). The two runs of a pair start from the same
weights and see the same batches, so the difference of their curves is the products' alone. The default follows the
parameters if every pair's curves (the mean training loss of each ``--log-every`` steps) stay within ``--threshold``
nats at every logged point; the json says which way it went.

    python -m studies.bf16_products --steps 300 --out studies/bf16_products/records --figures studies/bf16_products
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Dict, List

import torch
from tqdm.auto import tqdm

import hf_heads
from studies.common.hidden_tasks import read_words
from recipes.common import data as data_paths

HEADS = {
    "softmax": {},
    "mos": {"num_components": 3},
    "mixtape": {"num_gates": 4},
    "plif": {"num_knots": 10000},
}
PRECISIONS = ("bf16", "autocast")
PRODUCTS = {"float32": None, "follow": "follow"}


def corpus(data_dir: str, vocab_size: int) -> torch.Tensor:
    """PTB's train split as word ids (the ``vocab_size`` most frequent words, the rest ``<unk>``; ``<eos>`` ends each
    line)."""
    words = read_words(os.path.join(data_dir, "train.txt"))
    counts: Dict[str, int] = {}
    for w in words:
        counts[w] = counts.get(w, 0) + 1
    vocab = {w: i for i, w in enumerate(sorted(counts, key=lambda w: (-counts[w], w))[: vocab_size - 1])}
    unk = len(vocab)
    return torch.tensor([vocab.get(w, unk) for w in words])


def train(ids: torch.Tensor, head: str, precision: str, products: str, args) -> Dict:
    """One run: the mean training loss of every ``log_every`` steps, and the seconds it took."""
    from transformers import AutoModelForCausalLM, GPT2Config

    torch.manual_seed(args.seed)
    config = GPT2Config(
        vocab_size=args.vocab, n_positions=args.block, n_embd=args.dim, n_layer=2, n_head=4, bos_token_id=0
    )
    model = AutoModelForCausalLM.from_config(hf_heads.head_config(config, head, **HEADS[head]))
    if precision == "bf16":
        model = model.to(torch.bfloat16)
    hf_heads.output_head(model).lean_product_dtype = PRODUCTS[products]
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    g = torch.Generator().manual_seed(args.seed)
    curve, window, start = [], [], time.time()
    for _ in tqdm(range(args.steps), desc=f"{head} {precision} {products}", disable=args.no_progress, leave=False):
        offsets = torch.randint(0, len(ids) - args.block - 1, (args.batch,), generator=g)
        batch = torch.stack([ids[o : o + args.block] for o in offsets.tolist()])
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "autocast"):
            loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        window.append(float(loss))
        if len(window) == args.log_every:
            curve.append(sum(window) / len(window))
            window = []
    return {"curve": curve, "seconds": time.time() - start}


def plot(results: Dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    heads = sorted({r["head"] for r in results.values()})
    fig, axes = plt.subplots(
        len(PRECISIONS), len(heads), figsize=(4 * len(heads), 3.2 * len(PRECISIONS)), squeeze=False
    )
    for i, precision in enumerate(PRECISIONS):
        for j, head in enumerate(heads):
            ax = axes[i][j]
            for products in PRODUCTS:
                r = results.get(f"{head}/{precision}/{products}")
                if r:
                    steps = [(k + 1) * r["log_every"] for k in range(len(r["curve"]))]
                    ax.plot(steps, r["curve"], label=f"{products} products")
            ax.set_title(f"{head}, {precision}")
            ax.set_xlabel("step")
            ax.set_ylabel("training loss (nats)")
            ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def summarise(results: Dict, threshold: float) -> Dict:
    """Per (head, precision): the largest |difference| of the two curves, and whether the default changes."""
    pairs = {}
    for key, r in results.items():
        head, precision, products = key.split("/")
        other = results.get(f"{head}/{precision}/follow" if products == "float32" else "")
        if other and products == "float32":
            diffs = [abs(a - b) for a, b in zip(r["curve"], other["curve"])]
            pairs[f"{head}/{precision}"] = {
                "max_abs_diff": max(diffs),
                "final_diff_follow_minus_float32": other["curve"][-1] - r["curve"][-1],
                "seconds_float32": r["seconds"],
                "seconds_follow": other["seconds"],
            }
    within = bool(pairs) and all(p["max_abs_diff"] <= threshold for p in pairs.values())
    return {"threshold": threshold, "pairs": pairs, "all_within": within, "default": "follow" if within else None}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="python -m studies.bf16_products", description=__doc__.split("\n")[0])
    p.add_argument("--data-dir", default=data_paths.corpus("ptb"), help="PTB's folder (train.txt, valid.txt)")
    p.add_argument("--out", default="results/bf16_products", help="where runs.json and summary.json go")
    p.add_argument("--figures", help="where curves.png goes (default: --out)")
    p.add_argument("--heads", nargs="+", default=list(HEADS), choices=list(HEADS))
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--block", type=int, default=64)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--vocab", type=int, default=10000)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threshold", type=float, default=0.02, help="nats: the curves' largest allowed difference")
    p.add_argument("--no-progress", action="store_true")
    args = p.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "runs.json")
    results: Dict = json.load(open(path)) if os.path.exists(path) else {}  # resumable: finished runs are kept
    ids = corpus(args.data_dir, args.vocab)
    todo: List = [(h, pr, pd) for h in args.heads for pr in PRECISIONS for pd in PRODUCTS]
    for n, (head, precision, products) in enumerate(todo, 1):
        key = f"{head}/{precision}/{products}"
        if key in results and results[key].get("steps") == args.steps:
            continue
        print(f"[{n}/{len(todo)}] {key}", flush=True)
        results[key] = {
            **train(ids, head, precision, products, args),
            "head": head,
            "steps": args.steps,
            "log_every": args.log_every,
        }
        with open(path + ".tmp", "w") as f:
            json.dump(results, f, indent=1)
        os.replace(path + ".tmp", path)
    summary = {
        "command": "python -m studies.bf16_products " + " ".join(sys.argv[1:] if argv is None else argv),
        "settings": vars(args),
        "torch": torch.__version__,
        **summarise(results, args.threshold),
    }
    with open(os.path.join(args.out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    os.makedirs(args.figures or args.out, exist_ok=True)
    plot(results, os.path.join(args.figures or args.out, "curves.png"))
    print(json.dumps({k: summary[k] for k in ("all_within", "default")}))
