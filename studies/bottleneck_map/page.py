"""The bottleneck map page's tables, plots and commands from its json, on :mod:`studies.bottleneck_map.analysis`."""

from __future__ import annotations

import math
import os
import re
from typing import Dict, List

from studies.bottleneck_map import study as bottleneck_map
from studies.head_upgrade import table as upgrade_table
from studies.bottleneck_map.analysis import (
    NAMES,
    PAGE_JSON,
    cap_cells,
    cap_pairs,
    cap_reach,
    capped,
    chosen_rate,
    cost,
    grid,
    joint_rows,
    log_share,
    rank_at,
    set_aside_rows,
    train_ms_per_1k,
    upgrade_rows,
)
from recipes.common import stats as paired_stats
from recipes.common.reading import markdown_table

TRUNK_TABLE, KEPT = "lm-ptb", "artifacts"  # the trunk: lm-ptb's seed-1 softmax cell, kept in artifacts/ (its --out)
PAIRED_HEADER = f"mean [95% CI] | paired t p | Holm p | detectable ({paired_stats.POWER:.0%} power) |"
DETECTABLE = (
    f"Detectable: the difference a paired t-test of these seeds detects with {paired_stats.POWER:.0%} power at "
    f"{paired_stats.ALPHA:g} / m (Holm's first step over the family's m planned comparisons), from the observed "
    "spread of the seed differences (an estimate)."
)


def mean_sd(values: List[float], digits: int = 2) -> str:
    m = sum(values) / len(values)
    if len(values) < 2:
        return f"{m:,.{digits}f}"
    return f"{m:,.{digits}f} ± {math.sqrt(sum((v - m) ** 2 for v in values) / (len(values) - 1)):,.{digits}f}"


def optional(value, fmt: str, missing: str = "-") -> str:
    return missing if value is None else fmt.format(value)


def para(*texts: str) -> List[str]:
    """Markdown blocks, each followed by a blank line."""
    return [line for text in texts for line in (text, "")]


def table(obj: Dict, value, digits: int = 2, mark=None, diverged=(), corner: str = "head") -> List[str]:
    """A heads x d table of ``value(cell)`` (mean ± sd over seeds, n seeds; :func:`grid`), ``-`` where none has
    finished; ``mark(cells)``, a note after an entry; ``diverged``, cells left out, counted in their entry."""
    cells, dims = grid(obj, value, diverged), sorted(set(obj["meta"]["args"]["dims"]) | {c["d"] for c in obj["cells"]})

    def entry(h, d, pairs):
        lost, vals = sum(1 for c in diverged if c["head"] == h and c["d"] == d), [v for _, v in pairs]
        shown = f"{mean_sd(vals, digits)} ({len(vals)}){mark([c for c, _ in pairs]) if mark else ''}" if vals else "-"
        return shown + (f" diverged {lost}" if lost else "")

    header = f"| {corner} | " + " | ".join(f"d = {d}" for d in dims) + " |"
    return markdown_table(header, [[h] + [entry(h, d, row[d]) for d in dims] for h, row in cells.items()])


def paired_cells(row: Dict) -> str:
    """A paired row's ``mean [95% CI] | paired t p | Holm p | detectable`` table cells."""
    p, fp = row["paired"], paired_stats.format_p
    ci = f"[{p.low:+.4f}, {p.high:+.4f}]" if p.low is not None else "(one seed)"
    return f"{p.mean:+.4f} {ci} | {fp(p.p)} | {fp(row['holm'])} | " + optional(row["detectable"], "±{:.4f}")


def slope_table(obj: Dict, slopes: List[Dict]) -> List[str]:
    a, fp, rows = obj["meta"]["args"], paired_stats.format_p, []
    for r in slopes:
        low, high = (r["seeds"][0], r["seeds"][-1]) if r["seeds"] else (0, 0)
        per_d = (str(low) if low == high else f"{low}-{high}") + (f" of {a['seeds']}" if low < a["seeds"] else "")
        few = f" ({len(r['dims'])} of {len(a['dims'])})" if len(r["dims"]) < len(a["dims"]) else ""
        fit = ["too few d values (3 needed)", "-", "-", "-"]
        if r["slope"] is not None:
            fit = [f"{r['slope']:+.4f} [{r['low']:+.4f}, {r['high']:+.4f}]", r["df"], fp(r["p"]), fp(r["holm"])]
        rows.append([r["head"], (", ".join(map(str, r["dims"])) or "none") + few, per_d, *fit])
    return markdown_table("| head | d values | seeds per d | slope [95% CI] | df | p | Holm p |", rows)


def paired_table(rows: List[Dict]) -> List[str]:
    cells = []
    for r in rows:
        by_seed = ", ".join(f"s{s} {v:+.4f}" for s, v in sorted(r["by_seed"].items()))
        cells.append([r["head"], r["d"], r["seeds"], "{}, {}".format(*r["capped"]), by_seed, paired_cells(r)])
    header = "| head | d | seeds | capped (head, softmax) | by seed | " + PAIRED_HEADER
    return markdown_table(header, cells) + para(DETECTABLE)


def cap_reach_table(obj: Dict) -> List[str]:
    rows, cells = cap_reach(obj), []
    for r in rows:
        need = "ahead" if r["gap"] <= 0 else f"at least {r['epochs']}" if r["epochs"] else "never at that pace"
        cells.append(
            [r["head"], r["d"], r["seed"], f"{r['gap']:+.4f}", f"{r['pace']:.4f}", need, "no yes".split()[r["base"]]]
        )
    caption = (
        "Per head cell the epoch cap ended: its best valid NLL minus softmax's (same d and seed, nats), its valid gain "
        "per epoch over its last patience + 1 epochs, the epochs that pace needs to draw level (a lower bound)."
    )
    header = "| head | d | seed | valid NLL, head - softmax | gain / epoch, last {} | epochs to draw level | "
    header += "softmax capped |"
    return para(caption) + markdown_table(header.format(obj["meta"]["args"]["patience"] + 1), cells) if rows else []


def rate_table(obj: Dict) -> List[str]:
    """Each head's valid NLL per rate at --rate-d (seed 1), its rate in bold, ``(cap)`` where the cap ended the cell."""
    a, rows, rates = obj["meta"]["args"], [], sorted(obj["meta"]["args"]["rates"])
    for head in a["heads"]:
        mine = {c["lr"]: c for c in obj["rate_cells"] if c["head"] == head and c["d"] == a["rate_d"]}
        chosen = chosen_rate(obj, head) if mine else None
        for lr, c in mine.items():
            v = f"{c['valid_nll']:.4f}"
            mine[lr] = (f"**{v}**" if lr == chosen else v) + " (cap)" * capped(obj, [c])
        rows += [[head] + [mine.get(lr, "-") for lr in rates]] if mine else []
    caption = "Valid NLL at the rate search's d (seed 1); bold: the head's rate; (cap): the cap ended the cell."
    header = "| head | " + " | ".join(f"{lr:g}" for lr in rates) + " |"
    return para("## Learning rates", caption) + markdown_table(header, rows)


def section(title: str, caption: str, header: str, rows) -> List[str]:
    """A section of one captioned table, or nothing without rows."""
    return para(title, caption) + markdown_table(header, rows) if rows else []


def joint_table(obj: Dict) -> List[str]:
    a, rows = obj["meta"]["args"], []
    for r in joint_rows(obj):
        planned = r["head"] in a["heads"] and r["d"] in a["dims"] and r["seed"] <= a["seeds"]
        not_run = "not run yet" if planned else "not in the map's plan (--heads / --dims / --seeds)"
        diffs = [optional(r[k], "{:+.4f}") for k in ("diff", "frozen_diff")]
        cpu = optional(r["cpu_minutes"], "{:.0f}")
        rows.append(
            [r["head"], r["d"], r["seed"], f"{r['test_ppl']:.2f}", optional(r["frozen_ppl"], "{:.2f}", not_run)]
        )
        rows[-1] += [*diffs, cpu]
    caption = (
        "Test perplexity of `python -m studies.bottleneck_map.joint` (the whole AWD-LSTM trained, its last layer d "
        "units wide) beside the frozen-trunk cell; diffs: head minus softmax, test NLL (nats), same d and seed."
    )
    header = "| head | d | seed | jointly | frozen trunk | joint diff | frozen diff | joint CPU minutes |"
    return section("## Trained jointly with the trunk", caption, header, rows)


def set_aside_table(obj: Dict) -> List[str]:
    rows = []
    for r in set_aside_rows(obj):
        rows.append([f"`{r['trunk'][:8]}`", r["head"], r["d"], r["seed"], f"{r['there']:.2f}"])
        rows[-1] += [optional(r["here"], "{:.2f}")] + [optional(r[k], "{:+.4f}") for k in ("diff_there", "diff_here")]
    caption = (
        "Cells of an earlier trunk from the same command (its md5's first 8 digits), in no other table or test, beside "
        "this trunk's: test perplexity; diffs: head minus softmax in test NLL (nats)."
    )
    header = "| trunk | head | d | seed | there | here | diff there | diff here |"
    return section("## Cells of an earlier trunk", caption, header, rows)


def pilot_table(up: Dict) -> List[str]:
    """The upgrade table's rate pilot: each row's valid NLL per rate, bold the rate it chose."""
    pilot, chosen = up.get("pilot", []), {row: r["lr"] for row, r in (up.get("rates") or {}).items()}
    rates, rows = sorted({c["lr"] for c in pilot}), []
    for row in [r for r in upgrade_table.ROWS if any(c["row"] == r for c in pilot)]:
        by_lr = {c["lr"]: c["curve"][1]["valid_nll"] for c in pilot if c["row"] == row}
        shown = {lr: "diverged" if not math.isfinite(v) else f"{v:.4f}" for lr, v in by_lr.items()}
        shown = {lr: f"**{v}**" if lr == chosen.get(row) and v != "diverged" else v for lr, v in shown.items()}
        rows.append([NAMES[row]] + [shown.get(lr, "-") for lr in rates])
    caption = "**Rate pilot**: valid NLL after one epoch of seed 0 on a shorter text; bold: the rate the row chose."
    return (
        para(caption) + markdown_table("| row | " + " | ".join(f"lr {r:g}" for r in rates) + " |", rows)
        if pilot
        else []
    )


def upgrade_section(up: Dict) -> List[str]:
    """The head-upgrade table: its rate pilot, its rows (means over seeds), the paired comparisons with controls."""
    cells = up.get("cells", [])
    if not cells and not up.get("pilot"):
        return []
    lines = para("## Upgrading a pretrained LM's head") + pilot_table(up)
    if not cells:
        return lines
    planned = len((up.get("meta") or {}).get("args", {}).get("seeds") or {c["seed"] for c in cells})
    base, rows = {c["seed"]: c["head_parameters"] for c in cells if c["row"] == "softmax"}, []
    for row in [r for r in upgrade_table.ROWS if any(c["row"] == r for c in cells)]:
        mine = [c for c in cells if c["row"] == row]
        added = sorted({c["head_parameters"] - base[c["seed"]] for c in mine if c["seed"] in base})
        test = f"{mean_sd([c['after']['test']['ppl'] for c in mine])} ({paired_stats.format_seeds(len(mine), planned)})"
        rows.append([NAMES[row], ", ".join(f"{lr:g}" for lr in sorted({c["lr"] for c in mine}))])
        rows[-1] += [
            ", ".join(f"{a:,}" for a in added) or "-",
            test,
            mean_sd([c["after"]["test"]["word_ppl"] for c in mine]),
        ]
        rows[-1] += [
            mean_sd([c[k] for c in mine]) for k in ("train_cpu_ms_per_1k_tokens", "inference_cpu_ms_per_1k_tokens")
        ]
        rows[-1].append(mean_sd([c["inference_costs"]["ratio"] for c in mine], 3))
    lines += para(
        "**The table**: test perplexity per token and per word, mean ± sd over seeds (seeds); CPU ms per 1k tokens of "
        "the head alone; the whole model at inference over the pretrained one (each cell's own process)."
    )
    header = "| row | lr | parameters added | test ppl / token | test ppl / word | train ms / 1k | score ms / 1k | "
    lines += markdown_table(header + "model at inference (x pretrained) |", rows)
    lines += para(
        "Paired on seeds, test NLL (nats), row minus control; Holm over every planned comparison of this table, those "
        "not yet run counting as p = 1:"
    )
    paired = [
        [NAMES[r["row"]], NAMES[r["control"]].split(" ")[0], r["seeds"], paired_cells(r)] for r in upgrade_rows(up)
    ]
    paired = [[row, control, paired_stats.format_seeds(n, planned), rest] for row, control, n, rest in paired]
    table = markdown_table("| row | control | seeds | " + PAIRED_HEADER, paired)
    if not paired:
        return lines + table[:2] + ["| no comparison yet (a row and its control share no seed) | | | | | | |", ""]
    return lines + table + para(DETECTABLE)


def cap_section(obj: Dict) -> List[str]:
    """The upgrade table's cap check: seed-1 rows trained again under a higher epoch cap beside the table's cells at
    its cap (test perplexity; how each ended), and the row-minus-control differences at both caps."""
    table = {(c["row"], c["seed"]): c for c in (obj.get("upgrade") or {}).get("cells") or []}
    at, rows = ", ".join(map(str, sorted({c["max_epochs"] for c in table.values()}))) or "-", []
    for c in sorted(cap_cells(obj), key=lambda c: (list(upgrade_table.ROWS).index(c["row"]), c["seed"])):
        t, by = table.get((c["row"], c["seed"])), bottleneck_map.ended_by(c["curve"], c["max_epochs"], c["patience"])
        ended = "stopping rule" if by == "patience" else f"cap ({c['max_epochs']} epochs)"
        rows.append([NAMES[c["row"]], c["seed"], bottleneck_map.best_epoch(c["curve"]), ended])
        rows[-1] += [optional(t and t["after"]["test"]["ppl"], "{:.2f}"), f"{c['after']['test']['ppl']:.2f}"]
    gaps = []
    for p in cap_pairs(obj):
        gaps.append([NAMES[p["row"]].split(" ")[0], NAMES[p["control"]].split(" ")[0], p["seed"]])
        gaps[-1] += [optional(p[k], "{:+.4f}") for k in ("table", "cap_check")]
    caption = (
        "**The cap, checked**: seed 1 of each row trained again under a higher epoch cap, beside the table's cell."
    )
    lines = para(caption) + markdown_table(
        f"| row | seed | best epoch | ended by | test ppl / token, the table (cap {at}) | the cap check |", rows
    )
    lines += markdown_table("| row | control | seed | row - control, the table | the cap check |", gaps) if gaps else []
    return lines if rows else []


#: the CPU tables of the map's cells: (caption, value, digits)
CPU_TABLES = (
    ("CPU minutes of the stopping-rule run per cell (validation included).", lambda c: c["cpu_s"] / 60, 2),
    ("CPU minutes of a floor run.", lambda c: c["floor_cpu_s"] / 60 if "floor_cpu_s" in c else None, 2),
    (
        "CPU ms per 1k tokens of the training steps alone, over the cell's epochs (compare the heads here).",
        train_ms_per_1k,
        0,
    ),
)


def cpu_tables(obj: Dict, full: Dict) -> List[str]:
    """The map cells' CPU time per head and d (``obj``, when it has cells), and CPU-hours spent per part of the page
    (``full``: every cell, the diverged too; :func:`cost`)."""
    lines = para("## Cost")
    for caption, value, digits in CPU_TABLES if obj["cells"] else ():
        lines += para(caption) + table(obj, value, digits)
    rows = [r for r in cost(full) if r["part"].startswith("the map") or r["cells"] or r["rate_cells"]]
    cells = [[r["part"], r["cells"], optional(r["rate_cells"], "{}"), f"{r['hours']:.1f}"] for r in rows]
    total = [sum(r[k] or 0 for r in rows) for k in ("cells", "rate_cells")] + [f"{sum(r['hours'] for r in rows):.1f}"]
    return (
        lines
        + para("CPU-hours spent, per part of the page.")
        + markdown_table("| part | cells | rate cells | CPU-hours |", cells + [["in all", *total]])
    )


#: the map's heads x d tables after the primary test, the paired differences and the rates: (section and caption,
#: value, digits, the header's first cell)
MAP_TABLES = (
    (
        ("## What each head can express: the train-NLL floor within a fixed budget",
         "Lowest train NLL (nats) within a fixed number of further epochs on train, mean ± sd (seeds)."),
        lambda c: c.get("train_nll_floor"), 2, "head",
    ),
    (
        ("## Numerical rank of the log-probability matrix",
         "Mean ± sd (seeds); a softmax over d inputs has rank at most d + 2 (W h, the bias, the normaliser)."),
        lambda c: c["spectrum"]["rank"], 1, "rank (numpy's tolerance)",
    ),
    *(((), rank_at(t), 1, f"rank at {t:g}") for t in bottleneck_map.RELATIVE_TOLERANCES),
    ((), log_share, 1, "log10 share past d + 2"),
)  # fmt: skip


def map_tables(obj: Dict, rows: List[Dict], slopes: List[Dict], png: str) -> List[str]:
    """The map's sections after its main table: the primary test, the paired differences and their plot, the cap
    table, the rates, the floors, the ranks and spectra, the parameters."""
    lines = para(
        "## The primary test: does the head's difference from softmax change with d?",
        "Slope of the per-d mean paired difference on log2 d (nats per doubling; d the unit); Holm over the two heads.",
    )
    lines += slope_table(obj, slopes) + para(
        "## Paired differences per d",
        "Test NLL, head minus softmax at the same d and seed (nats); Holm over the planned (head, d) pairs.",
    )
    figures = [os.path.basename(p) for p in (png, spectra_png(png))]
    lines += paired_table(rows) + para(f"![{figures[0]}]({figures[0]})") + cap_reach_table(obj) + rate_table(obj)
    for texts, value, digits, corner in MAP_TABLES:
        lines += para(*texts) + table(obj, value, digits, corner=corner)
    if any(c["seed"] == 1 for c in obj["cells"]):
        lines += para(f"![{figures[1]}]({figures[1]})", "Seed 1's singular values over its largest, per d.")
    lines += para("## Parameters", "The projection's and the head's parameters (seed 1's cell).")
    return lines + table(obj, lambda c: c["parameters"] if c["seed"] == 1 else None, 0)


def portable(path: str) -> str:
    """A results path as the commands write it from the repository's root (``results/...``), wherever it ran: from
    its ``results/``, the trunk kept in the repository from its ``artifacts/`` (:data:`KEPT`), else, for the trunk's
    table run with another ``--out``, from the table's folder as the page's trunk command writes it."""
    for mark in ("results" + os.sep, KEPT + os.sep):
        if mark in path:
            return path[path.index(mark) :]
    table = os.sep + TRUNK_TABLE + os.sep
    return os.path.join("results", "reproduce", path[path.index(table) + 1 :]) if table in path else path


#: the commands' comments
COMMENTS = dict(
    trunk="# the trunk: lm-ptb's seed-1 softmax cell at its chosen rate (trained again, it is not bit for bit this "
    "one, and the map's --restore refuses the committed cells)",
    kept=f"# kept in the repository ({KEPT}/README.md); it came from",
    map="# the map: the same command started in a second shell shares its cells (two cores)",
    restore=f"# with --restore {PAGE_JSON} it resumes from the committed cells (a new machine, this trunk)",
    cap="# the cap check: seed 1 of every row at 3 x the table's epoch cap (its rate pilot restored from the table's)",
)


def commands_section(obj: Dict) -> List[str]:
    """The commands that rerun every number of the page from the repository's root, with the options the cells
    recorded (every option of the map; the joint check, the upgrade table and its cap check at what they ran)."""
    a, trunk = obj["meta"]["args"], portable(obj["meta"]["trunk"])
    rate = next(iter(re.findall(r"[/\\]lr([0-9.e+-]+)[/\\]", trunk)), "")  # the trunk's cell folder names its rate
    a, flags = {**a, "floor_seeds": a.get("floor_seeds", a["seeds"])}, []  # a run before the option: every seed floored
    for k in [k for k in ("heads", "dims", "rates") + bottleneck_map.COUNTS if k in a]:
        values = " ".join(
            f"{v:g}" if isinstance(v, float) else str(v) for v in (a[k] if isinstance(a[k], list) else [a[k]])
        )
        flags.append(f"--{k.replace('_', '-')} {values}")
    train = (
        f"python -m recipes.reproduce {TRUNK_TABLE} --scale mini --heads softmax --seeds 1"
        + f" --lrs {rate}" * bool(rate)
    )
    lines = para(
        "## Commands",
        "From the repository's root (`make install` first); each is resumable and reads the cells already saved:",
    )
    lines += ["```bash", COMMENTS["trunk"]]
    lines += [COMMENTS["kept"], f"#   {train} --out {KEPT}"] if trunk.startswith(KEPT + os.sep) else [train]
    lines += [COMMENTS["map"], f"python -m studies.bottleneck_map --trunk {trunk} --data {portable(a['data'])} \\"]
    lines += ["    --out results/bottleneck_map " + " ".join(flags), COMMENTS["restore"]]
    if joint := obj.get("joint") or []:
        runs = f"--heads {' '.join(dict.fromkeys(c['head'] for c in joint))} --dims "
        runs += " ".join(map(str, sorted({c["d"] for c in joint}))) + f" --seeds {max(c['seed'] for c in joint)}"
        runs += f" --epochs {max(c['epoch_cap'] for c in joint)} --lr {max(c['lr'] for c in joint):g}"
        lines.append(
            f"python -m studies.bottleneck_map.joint --bin {portable(a['data'])} --out results/bottleneck_joint {runs}"
        )
    up, cap = obj.get("upgrade") or {}, obj.get("upgrade_cap") or {}
    if up.get("pilot") or up.get("cells"):
        default = "python -m studies.head_upgrade.table --out results/upgrade_table --data ../shared/data/wikitext-2"
        table = upgrade_table.command_line(up["meta"]) if up.get("meta") else default
        lines.append(table + "   # --dry-run: every upgrade_head command")
    if cap.get("meta") or (up.get("meta") and up.get("cells")):
        args = up.get("meta", {}).get("args", {})
        meta = cap.get("meta") or {
            **up["meta"],
            "args": {**args, "seeds": [1], "max_epochs": 3 * args.get("max_epochs", 0)},
        }
        lines += [
            COMMENTS["cap"],
            upgrade_table.command_line(meta, "results/upgrade_cap") + f" --restore {PAGE_JSON}",
        ]
    report = "python -m studies.bottleneck_map.report --results results/bottleneck_map --joint results/bottleneck_joint"
    return lines + [report + " \\", "    --upgrade results/upgrade_table --upgrade-cap results/upgrade_cap", "```", ""]


def spectra_png(png: str) -> str:
    return png[: -len(".png")] + "-spectra.png"


def plot(obj: Dict, rows: List[Dict], slopes: List[Dict], path: str, interim=()) -> None:
    """The paired differences per d (``path``; each head's points a little apart on the d axis, ``slopes``: the
    primary test's fitted lines, dashed; ``interim``: heads whose fit waits for cells), and seed 1's normalised
    spectra (:func:`spectra_png` of it)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    heads, fits = sorted({r["head"] for r in rows}), {f["head"]: f for f in slopes if f["slope"] is not None}
    for i, head in enumerate(heads):
        mine = [r for r in rows if r["head"] == head]
        spread = [r for r in mine if r["paired"].low is not None]
        shift = 2 ** (0.06 * (i - (len(heads) - 1) / 2))  # apart on the log axis, so the intervals do not overlap
        line = ax.plot([r["d"] * shift for r in mine], [r["paired"].mean for r in mine], marker="o", label=head)[0]
        if f := fits.get(head):
            label = f"{head}: slope {f['slope']:+.4f} / doubling, Holm p {paired_stats.format_p(f['holm'])}"
            y = [f["intercept"] + f["slope"] * math.log2(d) for d in f["dims"]]
            ax.plot(f["dims"], y, ls="--", lw=1, color=line.get_color(), label=label + " (interim)" * (head in interim))
        x, y = [r["d"] * shift for r in spread], [r["paired"].mean for r in spread]
        yerr = [
            [r["paired"].mean - r["paired"].low for r in spread],
            [r["paired"].high - r["paired"].mean for r in spread],
        ]
        ax.errorbar(x, y, yerr=yerr, fmt="none", capsize=3, color=line.get_color())
    ax.axhline(0, color="grey", lw=0.8)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("d (the projection's width)")
    ax.set_ylabel("test NLL, head - softmax (nats; < 0: head better)")
    title = "Head - softmax per d: mean over seeds, 95% t intervals per d (not adjusted; none for one seed);\n"
    ax.set_title(title + "dashed: the primary test's least-squares line on log2 d", fontsize=8)
    if heads:
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    cells = [c for c in obj["cells"] if c["seed"] == 1]
    if not (dims := sorted({c["d"] for c in cells})):
        return
    fig, axes = plt.subplots(1, len(dims), figsize=(2.6 * len(dims), 3), squeeze=False)
    for ax, d in zip(axes[0], dims):
        for c in sorted((c for c in cells if c["d"] == d), key=lambda c: c["head"]):
            top = c["spectrum"]["top"]
            ax.semilogy(range(1, len(top) + 1), [v / top[0] for v in top], label=c["head"], lw=1)
        ax.axvline(d + 2, color="grey", lw=0.8, ls=":")
        ax.set_title(f"d = {d}", fontsize=9)
        ax.set_xlabel("index", fontsize=8)
    axes[0][0].set_ylabel("singular value / largest", fontsize=8)
    axes[0][0].legend(fontsize=7)
    fig.suptitle("Log-probability matrix spectra (seed 1; dotted: d + 2, a softmax's bound)", fontsize=9)
    fig.tight_layout()
    fig.savefig(spectra_png(path), dpi=110)
    plt.close(fig)
