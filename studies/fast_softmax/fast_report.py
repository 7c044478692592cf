"""The fast-softmax study page, its ``README.md``, generated from the runs of its commands.

    python -m studies.fast_softmax.svd_study --out results/svd_study
    python -m studies.fast_softmax.ds_softmax --tasks ptb wikitext-2 smollm2 --out results/ds
    python -m studies.fast_softmax.decoding --model smollm2 --out results/dec-smollm2
    python -m studies.fast_softmax.fast_report --svd results/svd_study --ds results/ds --decoding results/dec-smollm2
    python -m studies.fast_softmax.fast_report --no-collect     # the page from the committed json (above: collects)

Collecting (:mod:`studies.fast_softmax.fast_analysis`) copies the runs' ``results.json`` (and the ``--note``) into
``studies/fast_softmax/records/``, the SVD plots into ``figures/``; the page is written from those only: tables,
plots, commands, the hand-written reading (:data:`READING`), and ``numbers.json``, the numbers they cite.
"""

from __future__ import annotations

import argparse
import json
import os
import textwrap
from typing import Dict, List, Tuple

from recipes.common.data import CHECKOUT
from recipes.common.reading import written_reading
from .ds_softmax import HEADER as DS_HEADER
from .ds_softmax import format_row as ds_row
from .fast_analysis import ADAPTIVE_PAPER, UNRECORDED, collect, decoding_rows, derived, ds_rows, load, svd_rows

HOME = os.path.dirname(os.path.abspath(__file__))  # the study's folder: the page, its reading, its figures
RECORDS = os.path.join(HOME, "records")  # the committed json, derived numbers
PAGE, READING, FIGURES = "README.md", "reading.md", "figures"  # the reading's first line: <!-- cells: N -->
DOCS = os.path.relpath(os.path.join(CHECKOUT, "docs"), HOME)  # the user guides, from the page
#: the formatters of the page's tables (a percentage is a fraction's hundredfold, "points" one of top-1)
FORMATS = tuple(f"{{:.{n}f}}".format for n in range(5))
EXCEPTIONS = ()  # the reading's numbers that are no json value as the page prints it, each with why (at most ten)
#: the tables' (header, row) pairs, the rows ``str.format`` templates of a row's fields
DS_CMP = (
    "| task | E | FLOPs reduction | nearest the poster's | speed-up b=1 | wall-clock / FLOPs at b=1 | speed-up b=64 | "
    "top-1 DS - LM's softmax |",
    "| {task} | {experts} | {flops_reduction:.1f}x | {nearest} | {s1:.1f}x | {wall_per_flops:.2f} | {s64:.1f}x | "
    "{points:+.2f} points |",
)
#: DS-Softmax beside the softmax given the same extra training (p: McNemar's, Holm-adjusted over the page's tests)
DS_CONTROL = (
    "| task | E | top-1: LM's softmax | control | DS | DS - control | p | control - LM | p | perplexity: LM | "
    "control | DS (covered tokens) | control (covered tokens) |",
    "| {task} | {experts} | {top1_softmax:.4f} | {top1_control:.4f} | {top1_ds:.4f} | {points_control:+.2f} points | "
    "{p1} | {points_lm:+.2f} points | {p2} | {ppl_lm:.2f} | {ppl_control:.2f} | {ppl_ds_covered:.2f} | "
    "{ppl_control_covered:.2f} |",
)
SOURCE = (
    "| source (a GPU) | top-1 full -> fast | FLOPs reduction | ms full -> fast | wall-clock speed-up | "
    "wall-clock / FLOPs |",
    "| poster {name} | {full:.3f} -> {fast:.3f} | {flops:.2f}x | {ms[0]:.2f} -> {ms[1]:.2f} | {wall_clock:.1f}x | "
    "{wall_per_flops:.2f} |",
)
SVD_W = (
    "| W | N | leading: perplexity | top-1 | adaptive: perplexity | top-1 | fewer mults (adaptive) |",
    "| {W} | {N} | {lead[ppl]:.2f} | {lead[top1]:.3f} | {ppl:.2f} | {top1:.3f} | {cost_gain:.1f}x |",
)
SVD_CMP = (
    "| method | perplexity | top-1 agreement | top-10 overlap | fewer mults | ms per token: distribution | speed-up | "
    "ms per token: known target | speed-up |",
    "| {name} | {ppl:.2f} | {top1:.3f} | {top10:.3f} | {cost_gain:.1f}x | {ms_per_token} | {speedup} | "
    "{ms_per_target} | {target_speedup} |",
)
#: decoding at batch 1 (``studies.fast_softmax.decoding``): agreement with the full softmax, then speed per thread count
DECODE_AGREE = (
    "| model | head | top-1 agreement, teacher-forced | identical greedy prefix: median (new tokens) | prompts "
    "identical throughout | top-k TV distance, teacher-forced (k) |",
    "| {model} | {name} | {teacher_forced_top1_agreement:.4f} | {prefix_median:.1f} ({new_tokens}) | "
    "{prefix_whole:.2f} | {top_k_tv:.4f} ({top_k}) |",
)
DECODE_SPEED = (
    "| model | head | threads | greedy tokens/s: full | fast | speed-up | top-k: full | fast | speed-up | head's "
    "share of a step | Amdahl bound | full step, head (ms) | load before, after |",
    "| {model} | {name} | {threads} | {greedy_full:.1f} | {greedy_fast:.1f} | {greedy_speedup:.2f}x | "
    "{top_k_full:.1f} | {top_k_fast:.1f} | {top_k_speedup:.2f}x | {head_share:.2f} | {bound:.2f}x | "
    "{step_ms:.2f}, {head_ms:.2f} | {load_before:.2f}, {load_after:.2f} |",
)
#: adaptive sampling at its paper's criterion (studies.fast_softmax.svd_study's adaptive part), the paper's figure below
ADAPTIVE = (
    "| output layer | V | d | delta | bound as written: success (95% interval) | top-1 agreement | fewer mults | "
    "calibrated: variance scale | success (95% interval) | top-1 agreement | fewer mults |",
    "| {setting} | {V} | {d} | {delta} | {bound[success]:.3f} ({bound_ci[0]:.3f}, {bound_ci[1]:.3f}) | "
    "{bound[top1]:.3f} | {bound[gain]:.1f}x | {calibrated[variance_scale]:.3f} | {calibrated[success]:.3f} "
    "({calibrated_ci[0]:.3f}, {calibrated_ci[1]:.3f}) | {calibrated[top1]:.3f} | {calibrated[gain]:.1f}x |",
)
PAPER_ROW = "| {setting} | {V} | {d} | {delta} | - | - | - | - | - | - | up to {gain:.0f}x |"
ADAPTIVE_CAPTION = "k = 1, epsilon = 0.3; success: the top word right and its probability within a factor 1 +- epsilon."
CPU = ("| command | part | CPU-hours | from |", "| {command} | {part} | {hours:.2f} | {source} |")
CPU_CAPTION = "Recorded: in the kept runs' json (a DS row without CPU seconds: its training's); estimated: from notes."
TIMING = dict(ms_per_token="{:.3f}", speedup="{:.2f}x", ms_per_target="{:.3f}", target_speedup="{:.2f}x")


def table(template: Tuple[str, str], rows: List[Dict]) -> List[str]:
    return [template[0], "|" + "---|" * (template[0].count("|") - 1), *(template[1].format(**r) for r in rows), ""]


def fill(*texts: str) -> List[str]:
    """Fixed prose and the collected notes wrapped at 120 columns, a paragraph each."""
    return [line for t in texts for line in (*textwrap.wrap(t, 120, break_on_hyphens=False), "")]


def commands(title: str, command: str, notes: Dict[str, List[str]]) -> List[str]:
    """A section naming the command of its runs and the notes collected with them, per task or model."""
    text = f"`python -m studies.fast_softmax.{command}` (its module docstring says what it does); the runs:"
    return [f"## {title}: the command", "", *fill(text, *(f"_{k}: {n}_" for k, ns in notes.items() for n in ns))]


def ds_tables(ds: Dict, nums: Dict) -> List[str]:
    """DS-Softmax's rows, its wall-clock against its FLOPs, its top-1 beside the control, and the poster's rows."""
    rows, cmp, control = ds_rows(ds, nums)
    head = [DS_HEADER, "|" + "---|" * (DS_HEADER.count("|") - 1), *map(ds_row, rows), "", *table(DS_CMP, cmp)]
    caption = "Beside the softmax given the same extra training (the control); p: McNemar's, Holm-adjusted:"
    lines = ["DS-Softmax on the study's LMs on this CPU, and the poster's rows (a GPU):", "", *head]
    lines += [caption, "", *table(DS_CONTROL, control)] if control else []
    return lines + table(SOURCE, [s for s in nums["sources"] if s["name"].startswith("DS")])


def svd_section(svd: Dict, nums: Dict) -> List[str]:
    """Per setting, SVD-softmax's perplexity against W (both previews) and, timed at the largest N, beside the
    hierarchical softmax; the plots and the poster's SVD-10 column."""
    lines = ["## SVD-softmax as the slides measure it", ""] + fill(
        "`python -m studies.fast_softmax.svd_study` (its module docstring says what it measures): per output layer, "
        "SVD-softmax against the exact softmax, then beside the hierarchical softmax.",
        *(f"_{n}_" for n in svd["notes"]),
        f"![singular values]({FIGURES}/svd-spectra.png) ![perplexity against W]({FIGURES}/svd-ppl-vs-window.png)",
    )
    for result, d in zip(svd["results"], nums["svd"]):
        windows, named = svd_rows(result, d)
        cmp = [{**r, "name": x, **{k: f.format(r[k]) if k in r else "-" for k, f in TIMING.items()}} for x, r in named]
        lines += [f"### {result['setting']} (V = {result['V']}, d = {result['d']}, {result['tokens']} tokens)", ""]
        lines += table(SVD_W, windows)
        lines += ["SVD-softmax against the hierarchical softmax (the slides' comparison), batch 1:", ""]
        lines += table(SVD_CMP, cmp)
    lines += ["The slides (Vlasova et al.) print no numbers; the DS-Softmax poster's SVD-10 column:", ""]
    lines += table(SOURCE, [s for s in nums["sources"] if s["name"].startswith("SVD")])
    rows = [{**r, **row} for r in svd["results"] for row in r.get("adaptive", {}).get("rows", [])]
    if rows:  # adaptive sampling, the same command's other part
        lines += ["## Adaptive sampling as its paper measures it", "", *fill(ADAPTIVE_CAPTION)]
        lines += table(ADAPTIVE, [{**r, **d} for r, d in zip(rows, nums["adaptive"])])[:-1]
    return lines + [PAPER_ROW.format(**ADAPTIVE_PAPER), ""] if rows else lines


def render(out_dir: str, docs: str) -> Tuple[str, Dict]:
    """The page from the json in ``out_dir`` (linked relative to ``docs``) and the reading in ``docs``, and its
    derived numbers."""
    records = os.path.relpath(out_dir, docs)
    svd, ds, dec = (load(out_dir, name) for name in ("svd_study", "ds", "decoding"))
    if svd is None and ds is None:
        raise SystemExit(f"{out_dir}: neither svd_study.json nor ds.json (collect with --svd / --ds first)")
    nums = derived(ds, svd, dec, load(out_dir, UNRECORDED))
    lines = ["# Fast softmax, measured as its sources measure it", ""]
    lines += ds_tables(ds, nums) if ds else svd_section(svd, nums)  # the page opens with its table
    reading = written_reading(os.path.join(docs, READING), sum(len(o["results"]) for o in (ds, svd, dec) if o))
    lines += (["## Reading", "", reading, ""] if reading else []) + fill(
        f"Generated by `python -m studies.fast_softmax.fast_report` from `{records}/*.json` (the derived "
        f"numbers: [numbers.json]({records}/numbers.json)); how the heads work and the speed benchmark: "
        f"[fast_inference.md]({DOCS}/fast_inference.md), DS-Softmax's synthetic and PTB rows: "
        f"[ds_softmax.md]({DOCS}/ds_softmax.md)."
    )
    lines += commands("DS-Softmax", "ds_softmax --tasks ptb wikitext-2 smollm2", ds["notes"]) if ds else []
    lines += svd_section(svd, nums) if ds and svd else []
    if dec:
        lines += commands("Decoding at batch 1", "decoding", dec["notes"])
        lines += [x for t, rows in zip((DECODE_AGREE, DECODE_SPEED), decoding_rows(dec, nums)) for x in table(t, rows)]
    lines += ["## CPU-hours of the kept runs", "", *fill(CPU_CAPTION), *table(CPU, nums["cpu"]["rows"])]
    return "\n".join(lines).rstrip() + "\n", nums


def main(argv=None) -> str:
    """Collect (unless ``--no-collect``), then write the page and ``numbers.json``; returns the page."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--svd", help="an output directory of the study's svd_study command")
    p.add_argument("--ds", nargs="+", default=[], help="output folders of the study's ds_softmax command")
    p.add_argument("--decoding", nargs="+", default=[], help="output folders of the study's decoding command")
    p.add_argument("--note", help="a sentence kept with the collected numbers (e.g. how the machine was loaded)")
    p.add_argument("--no-collect", action="store_true", help="only write the page from the committed json")
    p.add_argument("--docs", default=HOME, help="the folder of the page (README.md), its reading and figures/")
    p.add_argument("--records", default=RECORDS, help="the folder of the committed json and the derived numbers")
    args = p.parse_args(argv)
    if not args.no_collect:
        if not (args.svd or args.ds or args.decoding):
            p.error("--svd, --ds and/or --decoding (or --no-collect)")
        collect(args.svd, args.ds, args.records, args.note, os.path.join(args.docs, FIGURES), args.decoding)
    text, nums = render(args.records, args.docs)
    with open(os.path.join(args.records, "numbers.json"), "w") as f:
        json.dump(nums, f, indent=1)
    with open(os.path.join(args.docs, PAGE), "w") as f:
        f.write(text)
    print(f"wrote {f.name} and {os.path.join(args.records, 'numbers.json')}")
    return text


if __name__ == "__main__":
    from hf_heads.cli.runner import run

    run(main)
