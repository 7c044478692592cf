"""The fast-softmax study page, ``docs/fast_softmax_study.md``, generated from the runs of its two commands.

    python -m recipes.svd_study --out results/svd_study
    python -m recipes.ds_softmax --tasks wikitext-2 --experts 16 32 64 --out results/ds_wt2
    python -m recipes.fast_report --svd results/svd_study --ds results/ds_wt2    # copies, then writes the page
    python -m recipes.fast_report --no-collect                                   # the page from the committed json

Collecting copies each run's ``results.json`` (and the SVD study's two plots) into ``docs/fast_study/``, with
``--note`` text (e.g. the machine's load while it was timed) kept beside the numbers; the page is then written from
those files only, so it always shows what is committed. The source documents' numbers (:data:`POSTER`, the
slides' claims) are set beside ours.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
from typing import Dict, List, Optional

from recipes.ds_softmax import PAPER as POSTER
from recipes.ds_softmax import from_json
from recipes.ds_softmax import format_row as ds_row
from recipes.ds_softmax import HEADER as DS_HEADER

DOCS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs")
#: the poster's SVD-10 column (top-1 accuracy full -> SVD, FLOPs reduction, ms full -> SVD, on a GPU)
POSTER_SVD = {
    "PTB": {"full": 0.252, "svd": 0.251, "flops": 5.00, "ms": (0.73, 0.18)},
    "Wiki-2": {"full": 0.257, "svd": 0.255, "flops": 5.38, "ms": (3.07, 0.60)},
}
PLOTS = ("svd-spectra.png", "svd-ppl-vs-window.png")


def collect(svd: Optional[str], ds: Optional[str], out_dir: str, note: Optional[str]) -> None:
    """Copy the runs' ``results.json`` (and plots) into ``out_dir`` as ``svd_study.json`` / ``ds_wt2.json``, each
    as ``{"notes": [...], "results": [...]}``."""
    os.makedirs(out_dir, exist_ok=True)
    for run, name in ((svd, "svd_study"), (ds, "ds_wt2")):
        if run is None:
            continue
        path = os.path.join(run, "results.json")
        if not os.path.isfile(path):
            raise SystemExit(f"--{name.split('_')[0]} {run}: no results.json there (run its command first)")
        with open(path) as f:
            results = json.load(f)
        with open(os.path.join(out_dir, f"{name}.json"), "w") as f:
            json.dump({"notes": [note] if note else [], "results": results}, f, indent=1)
        if name == "svd_study":
            for plot in PLOTS:
                shutil.copyfile(os.path.join(run, plot), os.path.join(out_dir, plot))


def _load(out_dir: str, name: str) -> Optional[Dict]:
    path = os.path.join(out_dir, f"{name}.json")
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        return json.load(f)


def _notes(obj: Dict) -> List[str]:
    return [f"_{n}_" for n in obj.get("notes", [])] + ([""] if obj.get("notes") else [])


def ds_section(obj: Dict) -> List[str]:
    """DS-Softmax on WikiText-2: every expert count beside the poster's row, wall-clock against FLOPs."""
    rows = [from_json(r) for r in obj["results"]]
    lines = [
        "## DS-Softmax on WikiText-2 (the poster's headline row)",
        "",
        "`python -m recipes.ds_softmax --tasks wikitext-2 --experts 16 32 64`: the LSTM LM of the mini "
        "language-model tables trained on WikiText-2's shipped text, its softmax turned into DS-Softmax with "
        "E experts (every expert starts from it), trained on the LM's hidden states, scored on `test.txt`.",
        "",
        *_notes(obj),
        DS_HEADER,
        "|" + "---|" * (DS_HEADER.count("|") - 1),
    ]
    lines += [ds_row(r) for r in rows]
    p = POSTER["Wiki-2"]
    lines += [
        "",
        f"Poster (Wiki-2, DS-64, a GPU): top-1 {p['full']} -> {p['ds']}, {p['flops']}x fewer FLOPs, "
        f"{p['ms'][0]} -> {p['ms'][1]} ms ({p['ms'][0] / p['ms'][1]:.0f}x wall-clock).",
        "",
        "| E | FLOPs reduction | speed-up b=1 | wall-clock / FLOPs at b=1 | speed-up b=64 | top-1 DS - softmax |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        s1, s64 = r["speedup"][1], r["speedup"][64]
        lines.append(
            f"| {r['experts']} | {r['flops_reduction']:.1f}x | {s1:.1f}x | {s1 / r['flops_reduction']:.2f} | "
            f"{s64:.1f}x | {100 * (r['top1_ds'] - r['top1_softmax']):+.2f} points |"
        )
    big = max(rows, key=lambda r: r["experts"])
    lines += [
        "",
        f"The poster's wall-clock / FLOPs: {p['ms'][0] / p['ms'][1] / p['flops']:.2f} (GPU).",
        "",
        f"Reading: with {big['experts']} experts DS-Softmax computes {big['flops_reduction']:.1f}x fewer "
        f"multiplications than the full softmax (the poster: {p['flops']}x with 64) at a top-1 accuracy "
        f"{100 * (big['top1_ds'] - big['top1_softmax']):+.2f} points from the softmax's "
        f"({100 * big['top1_softmax']:.2f}%; the poster: {100 * (p['ds'] - p['full']):+.1f}), and answers a "
        f"batch-1 query {big['speedup'][1]:.1f}x faster on this CPU "
        f"({big['speedup'][1] / big['flops_reduction']:.0%} of the FLOPs reduction; the poster "
        f"{p['ms'][0] / p['ms'][1] / p['flops']:.0%} on a GPU).",
        "",
    ]
    return lines


def _svd_rows(result: Dict, method: str) -> List[Dict]:
    return [r for r in result["rows"] if r["method"] == method]


def svd_section(obj: Dict) -> List[str]:
    """Perplexity of SVD-softmax's distribution against W (both previews, the largest N), the spectra, and
    SVD-softmax beside the hierarchical softmax, per setting."""
    lines = [
        "## SVD-softmax as the slides measure it",
        "",
        "`python -m recipes.svd_study`: for each output layer, the perplexity of SVD-softmax's whole "
        "distribution (exact logits for the N best previews, preview logits elsewhere) on held-out text, its "
        "top-1 agreement and top-10 overlap with the exact softmax, multiplications per token against V d, and "
        "the time per token at batch 1 (interleaved with the exact softmax in the same process, medians).",
        "",
        *_notes(obj),
        "![singular values](fast_study/svd-spectra.png)",
        "",
        "![perplexity against the preview window](fast_study/svd-ppl-vs-window.png)",
        "",
    ]
    for result in obj["results"]:
        exact = result["rows"][0]
        svd = _svd_rows(result, "svd_softmax")
        n_max = max(r["N"] for r in svd)
        lines += [
            f"### {result['setting']} (V = {result['V']}, d = {result['d']}, {result['tokens']} tokens)",
            "",
            f"Exact softmax: perplexity {exact['ppl']:.2f}"
            + (f", {exact['ms_per_token']:.3f} ms per token." if "ms_per_token" in exact else "."),
            "",
            "| W | N | leading: perplexity | top-1 | adaptive: perplexity | top-1 | fewer mults (adaptive) |",
            "|---|---|---|---|---|---|---|",
        ]
        for n in sorted({r["N"] for r in svd}):
            for w in sorted({r["W"] for r in svd}):
                pair = {r["preview"]: r for r in svd if r["N"] == n and r["W"] == w}
                if len(pair) < 2:
                    continue
                lead, ada = pair["leading"], pair["adaptive"]
                lines.append(
                    f"| {w} | {n} | {lead['ppl']:.2f} | {lead['top1']:.3f} | {ada['ppl']:.2f} | "
                    f"{ada['top1']:.3f} | {ada['cost_gain']:.1f}x |"
                )
        timed = [r for r in svd if "ms_per_token" in r and r["N"] == n_max]
        hier = _svd_rows(result, "class_softmax")
        lines += [
            "",
            "SVD-softmax against the hierarchical softmax (the slides' comparison), batch 1:",
            "",
            "| method | perplexity | top-1 agreement | top-10 overlap | fewer mults | ms per token | speed-up |",
            "|---|---|---|---|---|---|---|",
        ]
        for r in [exact, *timed, *hier]:
            name = (
                f"svd_softmax {r['preview']} W={r['W']} N={r['N']}"
                if r["method"] == "svd_softmax"
                else f"class_softmax ({r['classes']} classes)"
                if r["method"] == "class_softmax"
                else r["method"]
            )
            ms = f"{r['ms_per_token']:.3f}" if "ms_per_token" in r else "-"
            sp = f"{r['speedup']:.2f}x" if "speedup" in r else "-"
            lines.append(
                f"| {name} | {r['ppl']:.2f} | {r['top1']:.3f} | {r['top10']:.3f} | {r['cost_gain']:.1f}x | "
                f"{ms} | {sp} |"
            )
        lines += ["", svd_reading(result), ""]
    lines += [
        "The sources: the slides (Vlasova et al.) plot the loss against W, the spectra and the time per token "
        "without printing numbers; the DS-Softmax poster's SVD-10 column gives "
        + "; ".join(
            f"{k} top-1 {p['full']} -> {p['svd']} at {p['flops']:.2f}x fewer FLOPs, {p['ms'][0]} -> "
            f"{p['ms'][1]} ms (GPU)"
            for k, p in POSTER_SVD.items()
        )
        + ".",
        "",
    ]
    return lines


def _smallest_window(svd: List[Dict], preview: str, n: int, exact: float, within: float) -> Optional[Dict]:
    """The row of the smallest W whose perplexity is within ``within`` (relative) of the exact softmax's."""
    rows = sorted((r for r in svd if r["preview"] == preview and r["N"] == n), key=lambda r: r["W"])
    return next((r for r in rows if r["ppl"] <= exact * (1 + within)), None)


def svd_reading(result: Dict) -> str:
    """What one setting's rows say, in words generated from them: the smallest preview window that keeps the
    perplexity within 1% of the exact softmax for each preview choice (largest N), and the hierarchical softmax's
    perplexity and speed against SVD-softmax's."""
    exact = result["rows"][0]
    svd = _svd_rows(result, "svd_softmax")
    n = max(r["N"] for r in svd)
    parts = []
    for preview in ("adaptive", "leading"):
        r = _smallest_window(svd, preview, n, exact["ppl"], 0.01)
        largest = max(x["W"] for x in svd)
        parts.append(
            f"{preview}: W = {r['W']} ({r['ppl']:.2f}, {r['cost_gain']:.1f}x fewer multiplications"
            + (f", {r['speedup']:.2f}x the exact softmax's speed at batch 1" if "speedup" in r else "")
            + ")"
            if r
            else f"{preview}: no W up to {largest}"
        )
    text = (
        f"Reading ({result['setting']}): the smallest preview window that keeps the perplexity within 1% of the "
        f"exact {exact['ppl']:.2f} at N = {n}: " + "; ".join(parts) + "."
    )
    hier = _svd_rows(result, "class_softmax")
    if hier:
        h = hier[0]
        text += (
            f" The hierarchical softmax trained on the same states: perplexity {h['ppl']:.2f} "
            f"({100 * (h['ppl'] / exact['ppl'] - 1):+.1f}% against the exact softmax's: a different model, not an "
            f"approximation of it), top-1 agreement {h['top1']:.3f}"
            + (f", {h['speedup']:.2f}x the exact softmax's speed for the whole distribution" if "speedup" in h else "")
            + "."
        )
    return text


def write_page(out_dir: str, page: str) -> str:
    """Write ``page`` from the json in ``out_dir``; returns its text."""
    svd, ds = _load(out_dir, "svd_study"), _load(out_dir, "ds_wt2")
    if svd is None and ds is None:
        raise SystemExit(f"{out_dir}: neither svd_study.json nor ds_wt2.json (collect with --svd / --ds first)")
    lines = [
        "# Fast softmax, measured as its sources measure it",
        "",
        "Generated by `python -m recipes.fast_report` from `docs/fast_study/*.json`; how the heads work and "
        "the speed benchmark: [fast_inference.md](fast_inference.md), DS-Softmax's synthetic and PTB rows: "
        "[ds_softmax.md](ds_softmax.md).",
        "",
    ]
    if ds is not None:
        lines += ds_section(ds)
    if svd is not None:
        lines += svd_section(svd)
    text = "\n".join(lines).rstrip() + "\n"
    with open(page, "w") as f:
        f.write(text)
    return text


def main(argv=None) -> str:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--svd", help="an output directory of `python -m recipes.svd_study`")
    p.add_argument("--ds", help="an output directory of `python -m recipes.ds_softmax --tasks wikitext-2`")
    p.add_argument("--note", help="a sentence kept with the collected numbers (e.g. how the machine was loaded)")
    p.add_argument("--no-collect", action="store_true", help="only write the page from the committed json")
    p.add_argument("--docs", default=DOCS, help="the docs directory (the json go to DOCS/fast_study)")
    args = p.parse_args(argv)
    out_dir = os.path.join(args.docs, "fast_study")
    if not args.no_collect:
        if not (args.svd or args.ds):
            p.error("--svd and/or --ds (or --no-collect)")
        collect(args.svd, args.ds, out_dir, args.note)
    page = os.path.join(args.docs, "fast_softmax_study.md")
    text = write_page(out_dir, page)
    print(f"wrote {page}")
    return text


if __name__ == "__main__":
    from hf_heads.cli.runner import run

    run(main)
