"""The bottleneck map's page (``python -m studies.bottleneck_map.report``): its primary test by hand, its families and
what it leaves out, its tables against the cells they come from, on made-up cells (no training); the committed page,
its derived numbers, and every number of its hand-written reading against the json."""

from __future__ import annotations

import json
import math
import os

import pytest

from studies.bottleneck_map import analysis as bottleneck_analysis
from studies.bottleneck_map import page as bottleneck_page
from studies.bottleneck_map import report as bottleneck_report
from studies.bottleneck_map import study as bottleneck_map
from recipes.common import stats as paired_stats
from recipes.common.reading import number_values, unmatched_numbers

paired_p = paired_stats.format_p
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DOCS, RECORDS = os.path.join(ROOT, bottleneck_report.HOME), os.path.join(ROOT, bottleneck_analysis.RECORDS)


def _rows(text, header):
    """The rows (lines) of the first table of ``text`` whose header line starts with ``header``."""
    lines = text.split("\n")
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            return rows
        rows.append(line)
    return rows


def _cells_of(row):
    return [c.strip() for c in row.strip("|").split(" | ")]


def _cell(head, d, seed, test_nll, **extra):
    cell = {
        "head": head,
        "d": d,
        "seed": seed,
        "lr": 1e-2,
        "test_nll": test_nll,
        "valid_nll": test_nll + 0.05,
        "cpu_s": 60.0,
        "stopped": "patience",
        "parameters": 1000 + d,
        "spectrum": {"rank": d + 2, "top": [1.0 / (i + 1) for i in range(d + 10)]},
        "train_tokens": 1000,
        # patience ended it; 0.5 CPU-s of training steps an epoch
        "curve": [
            {"epoch": e, "train_cpu_seconds": 0.5 * (e > 0), **({"best": True} if e == 5 else {})} for e in range(8)
        ],
    }
    return {**cell, **extra}


def _map(cells):
    args = {
        "heads": ["softmax", "mos-4", "mixtape"],
        "dims": [4, 16, 64],
        "seeds": 3,
        "rates": [1e-3, 1e-2],
        "rate_d": 16,
        "batch_tokens": 2048,
        "patience": 2,
        "max_epochs": 20,
        "floor_epochs": 10,
        "floor_seeds": 1,
        "floor_sample": 50_000,
        "spectrum_contexts": 2000,
        "data": "/elsewhere/results/reproduce/lm-ptb/data/bin",
    }
    meta = {
        "trunk": "/elsewhere/results/reproduce/lm-ptb/softmax/lr0.01/seed1/checkpoints/checkpoint_best.pt",
        "trunk_md5": "0",
        "width": 200,
        "vocab": 100,
        "tokens": {"train": 1000, "valid": 100, "test": 100},
        "args": args,
    }
    rates = {"softmax": 1e-2, "mos-4": 1e-2, "mixtape": 1e-2}
    rate_cells = [
        _cell(h, 16, 1, 5.0, lr=lr, cpu_s=3600.0 if lr == 1e-2 else 1800.0)
        for h in ("softmax", "mos-4", "mixtape")
        for lr in (1e-3, 1e-2)
    ]
    return {"meta": meta, "rates": rates, "rate_cells": rate_cells, "cells": cells}


# head - softmax per (d, seed): MoS's gain shrinks with d; a per-d offset shared by the seeds at that d
DIFFS = {4: [-0.30, -0.25, -0.32], 16: [-0.12, -0.15, -0.10], 64: [0.01, -0.02, 0.0]}


def _cells():
    cells = []
    for d, diffs in DIFFS.items():
        for seed, diff in enumerate(diffs, 1):
            base = 5.0 + 0.01 * seed - 0.1 * math.log2(d)
            cells += [_cell("softmax", d, seed, base), _cell("mos-4", d, seed, base + diff)]
            if d != 64:  # Mixtape at two d values: no slope to test
                cells.append(_cell("mixtape", d, seed, base + 0.01))
    return cells


def test_the_primary_test_fits_the_per_d_means_with_d_as_the_unit():
    """The slope of the per-d mean difference on log2 d, by hand: least squares over 3 points, t on 1 degree of
    freedom (not 7: the three seeds at one d are not independent points); Holm over both heads, Mixtape's missing
    test counting as p = 1."""
    from scipy import stats as scipy_stats

    slopes = {r["head"]: r for r in bottleneck_analysis.slope_test(_map(_cells()))}
    x = [2.0, 4.0, 6.0]  # log2 of 4, 16, 64
    y = [sum(DIFFS[d]) / 3 for d in (4, 16, 64)]
    mx, my = sum(x) / 3, sum(y) / 3
    sxx = sum((a - mx) ** 2 for a in x)
    slope = sum((a - mx) * (b - my) for a, b in zip(x, y)) / sxx
    resid = [b - (my + slope * (a - mx)) for a, b in zip(x, y)]
    se = math.sqrt(sum(r * r for r in resid) / 1 / sxx)
    p = 2 * scipy_stats.t.sf(abs(slope / se), 1)
    mos = slopes["mos-4"]
    assert mos["slope"] == pytest.approx(slope) and mos["df"] == 1 and mos["p"] == pytest.approx(p)
    q = scipy_stats.t.ppf(0.975, 1)
    assert (mos["low"], mos["high"]) == pytest.approx((slope - q * se, slope + q * se))
    assert mos["holm"] == pytest.approx(min(1.0, 2 * p))  # a family of two, Mixtape's place taken by p = 1
    assert slopes["mixtape"]["slope"] is None and slopes["mixtape"]["dims"] == [4, 16]
    # pooling the 9 (d, seed) points as independent would claim 7 degrees of freedom and a smaller p
    pooled = scipy_stats.linregress([math.log2(d) for d in DIFFS for _ in range(3)], sum(DIFFS.values(), []))
    assert pooled.pvalue < p


def test_cells_the_cap_ended_are_read_from_their_curves():
    """A run that reached the cap counts as ended by it only where its best epoch is within the last ``patience``
    epochs: patience firing exactly at the cap is patience; the main table marks them per head and d, the paired table
    beside the difference they may explain."""
    cells = _cells()
    cap = [
        {"epoch": e, "train_cpu_seconds": 0.5, **({"best": True} if e == best else {})}
        for best in (20, 18)
        for e in range(21)
    ]
    cells[1]["curve"], cells[3]["curve"] = cap[:21], cap[21:]  # two MoS-4 cells: best at 20, best at 18
    obj = _map(cells)
    assert [bottleneck_analysis.capped(obj, [c for c in cells if c["head"] == h]) for h in ("softmax", "mos-4")] == [
        0,
        1,
    ]
    text = bottleneck_report.page(obj, "/tmp/x.png")
    tests = _rows(text, "| head | d = ")  # the page's main table: test perplexity
    mos = next(line for line in tests if line.startswith("| mos-4 |"))
    assert mos.count(" cap 1 |") == 1 and _cells_of(mos)[1].endswith("(3) cap 1") and " cap " not in tests[0]
    rows = {tuple(_cells_of(ln)[:2]): _cells_of(ln)[3] for ln in _rows(text, "| head | d | seeds | capped")}
    assert rows == {
        ("mos-4", "4"): "1, 0",
        ("mos-4", "16"): "0, 0",
        ("mos-4", "64"): "0, 0",
        ("mixtape", "4"): "0, 0",
        ("mixtape", "16"): "0, 0",
    }


def test_the_cap_table_says_how_far_behind_a_capped_head_is_and_how_fast_it_still_gained():
    """Per head cell the cap ended: valid NLL minus softmax's at the same d and seed, its mean gain per epoch over the
    last patience + 1 epochs, and the epochs that pace needs to draw level (rounded up); a head ahead is "ahead";
    softmax's own capped cells and cells patience ended are not rows."""

    def capped_curve(best_valid):  # valid NLL falls 0.01 an epoch to the cap, best at the last epoch
        return [
            {
                "epoch": e,
                "train_cpu_seconds": 0.5,
                "valid_nll": best_valid + 0.01 * (20 - e),
                **({"best": True} if e == 20 else {}),
            }
            for e in range(21)
        ]

    cells = _cells()
    by = {(c["head"], c["d"], c["seed"]): c for c in cells}
    by[("mos-4", 4, 1)]["valid_nll"] = by[("softmax", 4, 1)]["valid_nll"] + 0.105  # behind by 0.105: 11 epochs
    by[("mixtape", 4, 2)]["valid_nll"] = by[("softmax", 4, 2)]["valid_nll"] - 0.02  # ahead
    by[("mixtape", 4, 2)]["curve"] = capped_curve(by[("mixtape", 4, 2)]["valid_nll"])
    by[("softmax", 16, 1)]["curve"] = capped_curve(by[("softmax", 16, 1)]["valid_nll"])  # softmax's own: no row
    by[("mos-4", 4, 1)]["curve"] = capped_curve(by[("mos-4", 4, 1)]["valid_nll"])
    # best at epoch 19, the last epoch 0.01 above it: epochs 17 to 20 gained 0.01 / 3, not epochs 17 to 19's 0.02 / 3
    by[("mos-4", 16, 1)]["valid_nll"] = v = by[("softmax", 16, 1)]["valid_nll"] + 0.05
    late = capped_curve(v - 0.01)  # epoch 17 at v + 0.02, 18 at v + 0.01
    late[19]["best"], late[20]["best"] = True, False
    late[19]["valid_nll"], late[20]["valid_nll"] = v, v + 0.01
    by[("mos-4", 16, 1)]["curve"] = late
    # behind, best at epoch 19, but epoch 20 ended 0.003 above epoch 17: no gain over the last 3 epochs as they ran
    by[("mixtape", 16, 1)]["valid_nll"] = w = by[("softmax", 16, 1)]["valid_nll"] + 0.03
    flat = capped_curve(w)
    for epoch, valid in zip((17, 18, 19, 20), (w + 0.002, w + 0.004, w, w + 0.005)):
        flat[epoch]["valid_nll"] = valid
    flat[19]["best"], flat[20]["best"] = True, False
    by[("mixtape", 16, 1)]["curve"] = flat
    rows = [ln for ln in bottleneck_page.cap_reach_table(_map(cells)) if ln.startswith("| m")]
    assert rows == [
        "| mos-4 | 4 | 1 | +0.1050 | 0.0100 | at least 11 | no |",
        "| mos-4 | 16 | 1 | +0.0500 | 0.0033 | at least 15 | yes |",
        "| mixtape | 4 | 2 | -0.0200 | 0.0100 | ahead | no |",
        "| mixtape | 16 | 1 | +0.0300 | -0.0010 | never at that pace | yes |",
    ]
    assert "gain / epoch, last 3" in bottleneck_report.page(_map(cells), "/tmp/x.png")
    reach = bottleneck_analysis.numbers(_map(cells))["map"]["cap_reach"]  # the reading's numbers: the table's
    assert [(r["gap"], r["epochs"]) for r in reach] == [(0.105, 11), (0.05, 15), (-0.02, None), (0.03, None)]
    assert bottleneck_page.cap_reach_table(_map(_cells())) == []  # nothing capped: no table


def test_the_page_leaves_diverged_cells_out_and_counts_the_chosen_rate_cell_once():
    """A cell with a NaN score, or that never improved on its untrained start, is counted in its entry and left out
    (a NaN would reorder Holm's family); the missing cells are counted; the chosen rate's cell, also the seed-1 cell at
    --rate-d, is counted once in the cost; cells without a floor run leave the floor table empty, not zero."""
    never = [{"epoch": e, "train_cpu_seconds": 0.5 * (e > 0), **({"best": True} if e == 0 else {})} for e in range(3)]
    cells = _cells() + [_cell("mixtape", 64, 1, float("nan")), _cell("mixtape", 64, 2, 4.0, curve=never)]
    text = bottleneck_report.page(_map(cells), "/tmp/x.png")
    counts = bottleneck_analysis.numbers(_map(cells))["cells"]
    assert counts == {"finished": 24, "diverged": ["mixtape d=64 seed 1", "mixtape d=64 seed 2"], "missing": 1}
    assert bottleneck_analysis.missing_cells(_map(cells)) == [("mixtape", 64, 3)]
    assert "| mixtape | 4, 16 (2 of 3) | 3 | too few d values (3 needed) | - | - | - |" in text
    assert "| d = 64 |" in text and "| - diverged 2 |" in text  # the planned d column, its diverged cells counted
    assert "| mos-4 | 4, 16, 64 | 3 | " in text
    # a head with a cell to come: its fit's seeds per d say so, its entry counts its seeds
    fewer = [c for c in cells if (c["head"], c["d"], c["seed"]) != ("mos-4", 64, 3)]
    interim = bottleneck_report.page(_map(fewer), "/tmp/x.png")
    assert "| mos-4 | 4, 16, 64 | 2-3 of 3 | " in interim
    mos = _cells_of(next(r for r in _rows(interim, "| head | d = ") if r.startswith("| mos-4 |")))
    assert mos[3].endswith("(2)") and mos[1].endswith("(3)")
    # each seed's difference beside the paired test: mos-4 at d = 16 is DIFFS[16], seed by seed
    assert "| mos-4 | 16 | 3 | 0, 0 | s1 -0.1200, s2 -0.1500, s3 -0.1000 | -0.1233 [" in text
    # the family is the 6 planned (head, d) pairs, the one with a single finite seed counting as p = 1
    rows = bottleneck_analysis.paired_rows(bottleneck_analysis.finite(_map(cells))[0])
    pvalues = [r["paired"].p for r in rows]
    expected = paired_stats.holm(pvalues + [1.0] * (6 - sum(p is not None for p in pvalues)))
    assert [r["holm"] for r in rows] == expected[: len(rows)]
    # 26 cells of 1 CPU-minute, the diverged too, and 3 rate cells of 30 (the 3 chosen rate cells are seed-1 cells,
    # counted there; counted twice, the total would be 4.9)
    assert "| the map's cells and rate cells (a chosen rate's cell once) | 26 | 6 | 1.9 |" in text
    # the heads' cost at equal work: 0.5 CPU-s an epoch of 1,000 tokens
    assert "| softmax | 500 ± 0 (3) | 500 ± 0 (3) | 500 ± 0 (3) |" in text.split("CPU minutes of a floor run.")[1]
    # every head's rate is the grid's top: bold in the last column
    rates = {_cells_of(r)[0]: _cells_of(r)[1:] for r in _rows(text, "| head | 0.001 |")}
    assert all(v[-1].startswith("**") and not v[0].startswith("**") for v in rates.values()) and len(rates) == 3
    # the commands rerun it from the repository's root with every option the map recorded
    commands = text.split("## Commands")[1].split("## Cost")[0]
    assert "--trunk results/reproduce/lm-ptb/softmax/lr0.01/seed1/checkpoints/checkpoint_best.pt" in commands
    assert "python -m recipes.reproduce lm-ptb --scale mini --heads softmax --seeds 1 --lrs 0.01\n" in commands
    assert "--dims 4 16 64 --rates 0.001 0.01 --seeds 3 --rate-d 16" in commands and "--floor-seeds 1" in commands
    assert (
        "# with --restore studies/bottleneck_map/records/bottleneck_map.json it resumes from the committed cells "
        "(a new machine" in commands
    )
    assert "- (0) |" not in text and "| mos-4 | - | - | - |" in text.split("## What each head can express")[1]


def test_the_command_writes_page_and_plots_around_a_diverged_cell(tmp_path, monkeypatch):
    """``python -m studies.bottleneck_map.report --no-collect``: a NaN cell among paired seeds is left out of the plot's
    tests too (a NaN p-value would stop Holm), both plots are written, and the differences' plot draws the primary
    test's line of each head it fits, with its slope and Holm p."""
    from matplotlib.axes import Axes

    dashed, plot = [], Axes.plot
    monkeypatch.setattr(
        Axes,
        "plot",
        lambda self, *a, **k: (dashed.append((k["label"], a)) if k.get("ls") == "--" else None) or plot(self, *a, **k),
    )
    cells = _cells()
    cells[2]["test_nll"] = float("nan")  # mixtape d=4 seed 1, beside two paired seeds
    (tmp_path / "bottleneck_map.json").write_text(json.dumps(_map(cells)))
    text = bottleneck_report.main(
        ["--docs", str(tmp_path), "--records", str(tmp_path), "--no-collect"], log=lambda *_: None
    )
    assert " (2) diverged 1 |" in text and "| mixtape | 4 | 2 |" in text
    assert json.loads((tmp_path / bottleneck_report.NUMBERS).read_text())["cells"]["diverged"] == ["mixtape d=4 seed 1"]
    assert "dashed: the primary test" not in text  # (the plot's title, not the page's)
    fits = {f["head"]: f for f in bottleneck_analysis.slope_test(bottleneck_analysis.finite(_map(cells))[0])}
    fitted = [h for h in sorted(fits) if fits[h]["slope"] is not None]
    assert "mos-4" in fitted and [label for label, _ in dashed] == [
        f"{h}: slope {fits[h]['slope']:+.4f} / doubling, Holm p {paired_p(fits[h]['holm'])}" for h in fitted
    ]
    x, y = dashed[fitted.index("mos-4")][1]  # mos-4's line through its fit at each d
    assert y == pytest.approx([fits["mos-4"]["intercept"] + fits["mos-4"]["slope"] * math.log2(d) for d in x])
    assert (tmp_path / "bottleneck_map.png").exists() and (tmp_path / "bottleneck_map-spectra.png").exists()


def test_before_the_seed_cells_the_page_opens_with_the_rate_search_and_no_empty_map(tmp_path):
    """With rate cells only (the map's first stage), the page opens with the rates run so far (a head whose grid is
    whole has its rate, bold, before rates.json exists) and writes no empty tables or plots."""
    obj = _map([])
    obj["rates"] = {}
    obj["rate_cells"] = [c for c in obj["rate_cells"] if c["head"] != "mixtape" or c["lr"] == 1e-3]
    obj["rate_cells"][0]["valid_nll"] = 4.9  # softmax at 1e-3: its grid is whole, so its rate is known
    (tmp_path / "bottleneck_map.json").write_text(json.dumps(obj))
    text = bottleneck_report.main(
        ["--docs", str(tmp_path), "--records", str(tmp_path), "--no-collect"], log=lambda *_: None
    )
    lines = text.split("\n")
    assert lines[0].startswith("# ") and lines[4] == "| head | 0.001 | 0.01 |"  # title, one line, the table
    assert _rows(text, "| head | 0.001 |") == [
        "| softmax | **4.9000** | 5.0500 |",
        "| mos-4 | **5.0500** | 5.0500 |",  # its grid whole: its lowest (the first of a tie)
        "| mixtape | 5.0500 | - |",  # its grid not whole: no rate yet
    ]
    assert bottleneck_analysis.numbers(obj)["cells"] == {"finished": 0, "diverged": [], "missing": 27}
    assert "| head | d = " not in text and "| head |  |" not in text and "## Commands" in text
    assert not (tmp_path / "bottleneck_map.png").exists()


def test_the_reading_written_beside_the_page_follows_its_table_and_says_when_cells_have_finished_since(tmp_path):
    """reading.md, written by hand for N finished cells, follows the page's main table, its lines
    and paragraphs as written; once the page counts another number of cells (map, joint check and upgrade table
    together) it says the numbers may have moved; without the file the page has no reading."""
    obj = _map(_cells())
    (tmp_path / "bottleneck_map.json").write_text(json.dumps(obj))
    run = ["--docs", str(tmp_path), "--records", str(tmp_path), "--no-collect"]
    assert "## Reading" not in bottleneck_report.main(run, log=lambda *_: None)
    n = bottleneck_analysis.page_cells(obj)
    assert n == len(obj["cells"]) > 0
    two = f"<!-- cells: {n} -->\nMoS-4 pays\nbelow d = 16.\n \nNot at 64.\n"  # a blank line (spaces too) ends one
    (tmp_path / bottleneck_report.READING).write_text(two)
    text = bottleneck_report.main(run, log=lambda *_: None)
    main_table = "\n".join(_rows(text, "| head | d = "))
    assert text.split("## Reading\n\n")[0].endswith(main_table + "\n\n")
    assert text.split("## Reading\n\n")[1].startswith("MoS-4 pays\nbelow d = 16.\n\nNot at 64.\n\n## ")
    (tmp_path / bottleneck_report.READING).write_text(f"<!-- cells: {n - 1} -->\nMoS-4 pays.")
    text = bottleneck_report.main(run, log=lambda *_: None)
    assert f"## Reading\n\n*(Written when {n - 1} cells had finished; {n} have now" in text
    assert "the numbers below may have moved since.)*\n\nMoS-4 pays.\n" in text


def _committed():
    with open(os.path.join(RECORDS, "bottleneck_map.json")) as f:
        return json.load(f)


def test_the_committed_page_and_its_numbers_are_what_its_committed_json_gives(tmp_path):
    """The page (README.md) and records/bottleneck_map-numbers.json are generated: rebuilt from
    records/bottleneck_map.json they come out the same, so a change of the generator lands with the page and the
    numbers it writes."""
    import shutil

    docs, records = tmp_path / bottleneck_report.HOME, tmp_path / bottleneck_analysis.RECORDS
    records.mkdir(parents=True)
    shutil.copy(os.path.join(RECORDS, "bottleneck_map.json"), records / "bottleneck_map.json")
    if os.path.exists(os.path.join(DOCS, bottleneck_report.READING)):
        shutil.copy(os.path.join(DOCS, bottleneck_report.READING), docs / bottleneck_report.READING)
    text = bottleneck_report.main(["--docs", str(docs), "--records", str(records), "--no-collect"], log=lambda *_: None)
    with open(os.path.join(DOCS, bottleneck_report.PAGE)) as f:
        assert text + "\n" == f.read()
    with open(os.path.join(RECORDS, bottleneck_report.NUMBERS)) as f:
        assert json.load(f) == json.loads((records / bottleneck_report.NUMBERS).read_text())


def test_every_number_of_the_reading_is_a_json_value_as_the_page_formats_it():
    """Each decimal, percentage and number with a unit of reading.md is a value of the page json
    or of its derived numbers, written in a format of the page's tables (or one of at most ten listed exceptions)."""
    with open(os.path.join(DOCS, bottleneck_report.READING)) as f:
        reading = f.read()
    with open(os.path.join(RECORDS, bottleneck_report.NUMBERS)) as f:
        values = number_values(_committed()) + number_values(json.load(f))
    assert len(bottleneck_report.READING_EXCEPTIONS) <= 10
    formats = bottleneck_report.FORMATS
    assert unmatched_numbers(reading, values, formats, bottleneck_report.READING_EXCEPTIONS) == []
    # the check reads it: a digit changed is caught
    assert unmatched_numbers(reading.replace("0.0471", "0.0472"), values, formats) == ["-0.0472 nats"]


def test_the_committed_page_opens_with_its_table_and_no_prose_line_is_long():
    """The page: its title, one line, its main table; no line of prose (outside tables and commands) over 400
    characters, the reading's lines at most 120."""
    with open(os.path.join(DOCS, bottleneck_report.PAGE)) as f:
        lines = f.read().split("\n")
    assert lines[0].startswith("# ") and lines[2] and lines[4].startswith("| head | d = 4 |")
    code = False
    for line in lines:
        code ^= line.startswith("```")
        assert code or line.startswith(("|", "```")) or len(line) <= 400, line[:80]
    with open(os.path.join(DOCS, bottleneck_report.READING)) as f:
        assert max(len(line) for line in f.read().split("\n")) <= 120


def test_the_committed_tables_are_the_cells_means_and_paired_differences():
    """Entries of the committed page's tables against the cells, by hand: a test perplexity mean ± sd, each paired
    row's mean and paired t p with Holm over the 20 planned pairs, the primary test's slope, the upgrade table's
    MoS-3 - (b) pair."""
    import statistics

    from scipy import stats as scipy_stats

    obj = _committed()
    with open(os.path.join(DOCS, bottleneck_report.PAGE)) as f:
        text = f.read()
    cells = {(c["head"], c["d"], c["seed"]): c for c in obj["cells"]}
    ppl = [math.exp(cells[("mixtape", 4, s)]["test_nll"]) for s in (1, 2, 3)]
    row = _cells_of(next(r for r in _rows(text, "| head | d = ") if r.startswith("| mixtape |")))
    assert row[1] == f"{statistics.mean(ppl):.2f} ± {statistics.stdev(ppl):.2f} (3) cap 3"
    paired = {tuple(_cells_of(r)[:2]): _cells_of(r) for r in _rows(text, "| head | d | seeds | capped")}
    assert len(paired) == 20
    pvalues = {}
    for (head, d), r in paired.items():
        diffs = [cells[(head, int(d), s)]["test_nll"] - cells[("softmax", int(d), s)]["test_nll"] for s in (1, 2, 3)]
        t = scipy_stats.ttest_1samp(diffs, 0.0)
        pvalues[(head, d)] = t.pvalue
        assert r[5].startswith(f"{statistics.mean(diffs):+.4f} [") and r[6] == paired_p(t.pvalue)
    ranked, holm, running = sorted(pvalues, key=pvalues.get), {}, 0.0
    for i, key in enumerate(ranked):  # Holm's step-down by hand
        running = max(running, min(1.0, (20 - i) * pvalues[key]))
        holm[key] = running
    assert all(paired[key][7] == paired_p(holm[key]) for key in paired)
    means = [
        statistics.mean(cells[("mos-4", d, s)]["test_nll"] - cells[("softmax", d, s)]["test_nll"] for s in (1, 2, 3))
        for d in (4, 8, 16, 32, 64)
    ]
    fit = scipy_stats.linregress([2, 3, 4, 5, 6], means)
    assert _cells_of(_rows(text, "| head | d values |")[0])[3].startswith(f"{fit.slope:+.4f} [")
    up = {(c["row"], c["seed"]): math.log(c["after"]["test"]["ppl"]) for c in obj["upgrade"]["cells"]}
    diffs = [up[("mos-3", s)] - up[("softmax-mlp", s)] for s in (1, 2, 3)]
    mos_b = next(_cells_of(r) for r in _rows(text, "| row | control | seeds |") if r.startswith("| MoS-3 | (b) |"))
    assert mos_b[3].startswith(f"{statistics.mean(diffs):+.4f} [") and mos_b[4] == paired_p(
        scipy_stats.ttest_1samp(diffs, 0).pvalue
    )


def test_the_joint_check_sits_beside_the_frozen_cells():
    """Each joint cell beside the frozen cell of its head, d and seed (test perplexity, head minus softmax both ways);
    a d the map leaves out says so, rather than "not run yet"."""
    obj = _map(_cells())

    def joint(d=4):
        return [
            {
                "head": h,
                "d": d,
                "seed": 1,
                "lr": 0.0025,
                "epoch_cap": 3,
                "ppl": {"valid": 1.0, "test": p},
                "command": "fairseq-train bin --patience 3 --max-epoch 3",
            }
            for h, p in (("softmax", 100.0), ("mos-4", 90.0))
        ]

    text = "\n".join(bottleneck_page.joint_table({**obj, "joint": joint()}))
    assert "| mos-4 | 4 | 1 | 90.00 | 90.92 | -0.1054 | -0.3000 | - |" in text
    [_, mos] = bottleneck_analysis.numbers({**obj, "joint": joint()})["joint"]
    assert mos["diff"] == pytest.approx(math.log(0.9)) and mos["over_frozen"] == pytest.approx(90.0 / 90.92, abs=1e-4)
    text = "\n".join(bottleneck_page.joint_table({**obj, "joint": joint(128)}))
    assert "| mos-4 | 128 | 1 | 90.00 | not in the map's plan (--heads / --dims / --seeds) | -0.1054 | - | - |" in text


def test_a_collection_on_another_trunk_sets_the_committed_cells_aside_and_keeps_the_other_parts(tmp_path):
    """A map run on a trunk trained again (not bit for bit) collects beside the committed json: the committed rate
    cells are set aside (their trunk named, their CPU time counted), the joint check and the upgrade table, whose
    folders this machine lacks, stay as committed."""
    committed = _map([])
    committed["meta"]["trunk_nll"] = {"valid": 4.70, "test": 4.65}
    committed["meta"]["trunk_md5"] = "first"
    committed["joint"] = [
        {
            "head": "softmax",
            "d": 4,
            "seed": 1,
            "lr": 1e-3,
            "epoch_cap": 3,
            "ppl": {"valid": 150.0, "test": 140.0},
            "cpu_seconds": 7200.0,
            "command": "python -m studies.bottleneck_map.joint",
        }
    ]
    committed["upgrade"] = {"rates": {}, "pilot": [], "cells": []}
    docs, results = tmp_path / "docs", tmp_path / "map"
    docs.mkdir()
    (docs / "bottleneck_map.json").write_text(json.dumps(committed))
    new = _map([])
    new["meta"]["trunk_nll"] = {"valid": 4.71, "test": 4.66}
    (results / "rates").mkdir(parents=True)
    (results / "meta.json").write_text(json.dumps(new["meta"]))
    (results / "rates" / "softmax-lr0.001.json").write_text(json.dumps(_cell("softmax", 16, 1, 5.0, lr=1e-3)))
    argv = ["--docs", str(docs), "--records", str(docs), "--results", str(results), "--joint", str(tmp_path / "no")]
    argv += ["--upgrade", "-"]
    text = bottleneck_report.main(argv, log=lambda *_: None)
    obj = json.loads((docs / "bottleneck_map.json").read_text())
    assert obj["joint"] == committed["joint"] and obj["upgrade"] == committed["upgrade"]
    assert [len(obj["rate_cells"]), len(obj["cells"])] == [1, 0]
    (aside,) = obj["set_aside"]
    assert aside["trunk_md5"] == "first" and aside["rate_cells"] == committed["rate_cells"]
    numbers = json.loads((docs / bottleneck_report.NUMBERS).read_text())
    assert numbers["earlier_trunks"] == {"first": pytest.approx(-0.01)}  # its valid NLL 0.01 below this trunk's
    # 6 rate cells set aside (3 x 1800 + 3 x 3600 CPU-s = 4.5 h), the new rate cell (60 s), the joint check (2 h)
    cost = {_cells_of(r)[0]: _cells_of(r)[1:] for r in _rows(text, "| part | cells |")}
    assert cost["the map's cells and rate cells (a chosen rate's cell once)"] == ["0", "1", "0.0"]  # no rate chosen
    assert cost["earlier trunks' cells, set aside"] == ["0", "6", "4.5"] and cost["the joint check"] == [
        "1",
        "-",
        "2.0",
    ]
    assert cost["in all"] == ["1", "7", "6.5"]
    # collected again from the same trunk: nothing more set aside
    bottleneck_report.main(argv, log=lambda *_: None)
    assert len(json.loads((docs / "bottleneck_map.json").read_text())["set_aside"]) == 1


def test_run_paths_are_written_as_the_commands_write_them():
    """The page's commands run from the repository's root: a run's path from its ``results/``, and the trunk trained
    with another ``--out`` as the trunk command (``recipes.reproduce lm-ptb``) writes it."""
    portable = bottleneck_page.portable
    assert portable("/x/results/bottleneck_map/cells/a.json") == "results/bottleneck_map/cells/a.json"
    trunk = "/work/runs/trunk-out/lm-ptb/softmax/lr0.0025/seed1/checkpoints/checkpoint_best.pt"
    assert portable(trunk) == "results/reproduce/lm-ptb/softmax/lr0.0025/seed1/checkpoints/checkpoint_best.pt"
    assert portable("/elsewhere/bin") == "/elsewhere/bin"
    # the trunk kept in the repository (a worktree's copy too): from its artifacts/, and the commands say so
    kept = "/work/runs/wt-1/artifacts/lm-ptb/softmax/lr0.0025/seed1/checkpoints/checkpoint_best.pt"
    assert portable(kept) == "artifacts/lm-ptb/softmax/lr0.0025/seed1/checkpoints/checkpoint_best.pt"
    obj = _map(_cells())
    obj["meta"] = {**obj["meta"], "trunk": kept}
    obj["meta"]["args"] = {**obj["meta"]["args"], "data": "/work/runs/wt-1/artifacts/lm-ptb/data/bin"}
    text = "\n".join(bottleneck_page.commands_section(obj))
    assert (
        "#   python -m recipes.reproduce lm-ptb --scale mini --heads softmax --seeds 1 --lrs 0.0025 --out artifacts"
        in text
    )
    assert f"--trunk {portable(kept)} --data artifacts/lm-ptb/data/bin" in text
    assert "\npython -m recipes.reproduce" not in text  # nothing to train first


def test_the_numbers_say_how_the_trunk_scores_and_whether_it_still_improved():
    """The trunk's perplexity by its own head, and its last epoch's change of valid perplexity (from its table cell's
    log, in the map's meta): none for a run without the curve."""
    curve = [{"epoch": e, "valid_ppl": p} for e, p in enumerate((242.86, 169.01, 125.98, 116.24), 1)]
    obj = _map(_cells())
    obj["meta"] = {**obj["meta"], "trunk_curve": curve, "trunk_nll": {"valid": math.log(116.0), "test": 4.6}}
    trunk = bottleneck_analysis.numbers(obj)["trunk"]
    assert f"{100 * trunk['last_epoch_change']:+.1f}%" == "-7.7%" and f"{trunk['valid_ppl']:.2f}" == "116.00"
    assert bottleneck_analysis.numbers(_map(_cells()))["trunk"] == {}


def _upgrade_row(row, seed, params, ppl):
    costs = {"ratio": 1.0, "tokens": 10, "body_ms": 1.0}
    after = {"test": {"ppl": ppl, "word_ppl": 2 * ppl}}
    curve = [
        {"epoch": 0, "valid_nll": 4.0},
        {"epoch": 1, "valid_nll": 3.5},
        {"epoch": 2, "valid_nll": 3.4, "best": True},
    ]
    return {"row": row, "seed": seed, "head_parameters": params, "after": after, "inference_costs": costs, "lr": 1e-3,
            "curve": curve, "train_cpu_ms_per_1k_tokens": 1.0, "inference_cpu_ms_per_1k_tokens": 1.0}  # fmt: skip


def test_the_upgrade_numbers_say_how_far_each_head_is_from_control_b_s_size():
    """Control (b) (the residual MLP) is sized to MoS-3: each row's parameters added over (b)'s, and that ratio less
    1 (how far apart), beside the table's column of parameters added; the valid NLL each row's last epoch gained."""
    cells = [
        _upgrade_row(r, s, p, ppl)
        for s in (1, 2)
        for r, p, ppl in (
            ("softmax", 1000, 30.0),
            ("softmax-mlp", 1500, 26.0),
            ("mos-3", 1495, 25.0),
            ("mixtape", 2000, 26.0),
        )
    ]
    rows = bottleneck_analysis.upgrade_numbers({"cells": cells})["rows"]
    assert rows["mos-3"]["apart_from_b"] == pytest.approx(-0.01) and rows["mixtape"]["added_over_b"] == pytest.approx(
        2.0
    )
    assert rows["mos-3"]["last_epoch_gain"] == pytest.approx([0.1, 0.1]) and rows["mos-3"]["test_ppl"] == 25.0
    table = "\n".join(bottleneck_page.upgrade_section({"cells": cells}))
    assert "| MoS-3 | 0.001 | 495 | 25.00 ± 0.00 (2) |" in table and "| Mixtape | 0.001 | 1,000 | " in table


def test_each_paired_difference_gives_the_difference_its_seeds_could_detect():
    """The paired table's last column: the difference a paired t-test of the row's seeds detects with 80% power at
    0.05 / m, m the planned family (here 2 heads x 3 d), from the seed differences' spread."""
    import statistics

    text = bottleneck_report.page(_map(_cells()), "/tmp/x.png")
    table = text.split("## Paired differences per d")[1].split("![")[0]
    family = 2 * 3
    std = statistics.stdev(DIFFS[4])
    det = paired_stats.detectable(std, 3, 0.05 / family, 0.8)
    row = next(line for line in table.splitlines() if line.startswith("| mos-4 | 4 | 3 |"))
    assert row.endswith(f"| ±{det:.4f} |")
    assert "| detectable (80% power) |" in table and "Detectable: the difference a paired t-test" in table


def test_spectrum_measures_by_hand_and_only_from_a_whole_spectrum(tmp_path):
    """The ranks at a fraction of the largest singular value and the share past d + 2 without the first, by hand; the
    collected json takes them from a cell's whole spectrum only, never from a restored cell's cut one (d + 10), and
    the page's tables of them leave a cut one out."""
    s = [10.0, 1.0, 0.5, 0.01, 1e-5]
    m = bottleneck_map.spectrum_measures(s, 1)  # d = 1: a softmax's bound at 3
    assert m["rank_at"] == {"0.001": 3, "0.0001": 4}  # above 0.01 and above 0.001 (0.01 itself is not above 0.01)
    rest = 1.0 + 0.25 + 1e-4 + 1e-10
    assert m["beyond_bound_after_first"] == pytest.approx((1e-4 + 1e-10) / rest)
    assert m["first_share"] == pytest.approx(100.0 / (100.0 + rest))
    (tmp_path / "cells").mkdir()
    (tmp_path / "meta.json").write_text(json.dumps({"vocab": 100}))
    whole = _cell("softmax", 1, 1, 5.0, spectrum={"rank": 5, "contexts": 20, "top": [1.0 / (i + 1) for i in range(20)]})
    cut = _cell("softmax", 1, 2, 5.0, spectrum={"rank": 5, "contexts": 20, "top": whole["spectrum"]["top"][:11]})
    for c in (whole, cut):
        (tmp_path / "cells" / f"softmax-d1-s{c['seed']}.json").write_text(json.dumps(c))
    got = {c["seed"]: c["spectrum"] for c in bottleneck_analysis.collect(str(tmp_path))["cells"]}
    assert got[1]["rank_at"] == bottleneck_map.spectrum_measures(whole["spectrum"]["top"], 1)["rank_at"]
    assert len(got[1]["top"]) == 11 and "rank_at" not in got[2] and "beyond_bound_after_first" not in got[2]
    obj = _map(_cells())
    for c in obj["cells"][1:]:  # every cell but one (softmax d=4 seed 1) with its whole spectrum's measures
        c["spectrum"].update(bottleneck_map.spectrum_measures(c["spectrum"]["top"], c["d"]))
    shares = [c["spectrum"]["first_share"] for c in obj["cells"][1:]]
    text = bottleneck_report.page(obj, "/tmp/x.png")
    assert bottleneck_analysis.numbers(obj)["map"]["first_share"] == pytest.approx([min(shares), max(shares)])
    for corner in ("| rank at 0.001 |", "| rank at 0.0001 |", "| log10 share past d + 2 |"):
        softmax = _cells_of(_rows(text, corner)[0])
        assert softmax[0] == "softmax" and softmax[1].endswith(" (2)") and softmax[2].endswith(" (3)")
    assert _cells_of(_rows(text, "| rank (numpy's tolerance) |")[0])[1].endswith(" (3)")


def _upgrade_cell(row, seed, valid, test_ppl, best, cap):
    """A made-up upgrade_head cell: its valid NLL per epoch (epoch 0 first), its best epoch, its cap (patience 1)."""
    curve = [{"epoch": e, "valid_nll": v, **({"best": True} if e == best else {})} for e, v in enumerate(valid)]
    return {"row": row, "seed": seed, "curve": curve, "after": {"test": {"ppl": test_ppl}}, "max_epochs": cap,
            "patience": 1}  # fmt: skip


def test_the_cap_check_sits_beside_the_tables_seed_1_cells():
    """The cap check's rows at their stopping rule beside the table's cells at its cap: how each ended, both test
    perplexities, each row-minus-control difference at both (by hand); the page counts its cells, and a collection
    without its folder keeps the committed ones."""
    table = [
        _upgrade_cell("softmax", 1, [3.9, 3.43, 3.39], 32.0, 2, 2),
        _upgrade_cell("softmax-mlp", 1, [3.9, 3.24, 3.20], 26.4, 2, 2),
        _upgrade_cell("mos-3", 1, [3.9, 3.19, 3.18], 25.9, 2, 2),
    ]
    cap = [
        _upgrade_cell("softmax", 1, [3.9, 3.43, 3.39, 3.37, 3.36, 3.355, 3.354], 30.0, 6, 6),  # the cap again
        _upgrade_cell("softmax-mlp", 1, [3.9, 3.24, 3.20, 3.17, 3.18], 25.0, 3, 6),  # patience fired at epoch 4
        _upgrade_cell("mos-3", 1, [3.9, 3.19, 3.1801, 3.19], 25.9, 2, 6),
    ]
    obj = {**_map(_cells()), "upgrade": {"cells": table}, "upgrade_cap": {"cells": cap}}
    text = "\n".join(bottleneck_page.cap_section(obj))
    assert "| (a) softmax, fine-tuned | 1 | 6 | cap (6 epochs) | 32.00 | 30.00 |" in text
    assert "| (b) softmax + residual MLP (MoS-3's added parameters) | 1 | 3 | stopping rule | 26.40 | 25.00 |" in text
    assert "| MoS-3 | 1 | 2 | stopping rule | 25.90 | 25.90 |" in text and "the table (cap 2) |" in text
    mos_b = (math.log(25.9 / 26.4), math.log(25.9 / 25.0))  # MoS-3 - (b): ahead at the cap, behind past it
    assert f"| MoS-3 | (b) | 1 | {mos_b[0]:+.4f} | {mos_b[1]:+.4f} |" in text
    assert f"| (b) | (a) | 1 | {math.log(26.4 / 32.0):+.4f} | {math.log(25.0 / 30.0):+.4f} |" in text
    pairs = bottleneck_analysis.cap_pairs(obj)  # (the numbers' cap_check)
    assert [(p["row"], p["control"]) for p in pairs] == [
        ("softmax-mlp", "softmax"),
        ("mos-3", "softmax"),
        ("mos-3", "softmax-mlp"),
    ]
    assert pairs[2]["cap_check"] == pytest.approx(mos_b[1])
    assert bottleneck_analysis.page_cells(obj) == len(obj["cells"]) + 6
    assert bottleneck_page.cap_section({**obj, "upgrade_cap": {}}) == []
    new = {"meta": obj["meta"], "upgrade": {"cells": table[:1]}}
    kept = bottleneck_analysis.carry_over(new, obj, {"upgrade"})
    assert kept["upgrade_cap"] == obj["upgrade_cap"] and kept["upgrade"] == new["upgrade"]  # the collected one kept
    # a cap folder whose run has begun (its meta written) but not finished a cell keeps the committed cells
    begun = {"meta": obj["meta"], "upgrade_cap": {"meta": {}, "cells": []}}
    assert bottleneck_analysis.carry_over(begun, obj, {"upgrade_cap"})["upgrade_cap"] == obj["upgrade_cap"]


def test_the_cost_table_counts_each_part_s_cpu_hours():
    """CPU-hours spent per part: the upgrade table's pilot, cells and cap check each their cells' whole process's
    CPU time (a cell run before that was recorded: its training steps'), the total summed."""

    def cell(row, seed, cpu_s, whole=True):
        last = {"epoch": 1, "cpu_seconds": cpu_s} if whole else {"epoch": 1, "train_cpu_seconds": cpu_s}
        return {"row": row, "seed": seed, "curve": [{"epoch": 0}, last]}

    up = {"pilot": [cell("softmax", 0, 1800.0)], "cells": [cell("softmax", 1, 3600.0), cell("mos-3", 1, 7200.0, False)]}
    cap = {"cells": [cell("softmax", 1, 7200.0)]}
    text = "\n".join(bottleneck_page.cpu_tables({"cells": []}, {**_map(_cells()), "upgrade": up, "upgrade_cap": cap}))
    cost = {_cells_of(r)[0]: _cells_of(r)[1:] for r in _rows(text, "| part | cells |")}
    assert cost["the upgrade table's rate pilot"] == ["1", "-", "0.5"] and cost["the upgrade table's cells"] == [
        "2",
        "-",
        "3.0",
    ]
    assert cost["the upgrade table's cap check"] == ["1", "-", "2.0"] and "the joint check" not in cost
    hours = bottleneck_analysis.cells_cpu_hours(_map(_cells()))
    assert cost["in all"] == ["28", "6", f"{hours + 5.5:.1f}"]  # 24 map cells and 4 upgrade cells


def test_a_rate_search_carried_from_another_trunk_is_named_and_counted_once():
    """--carry-rates: rate cells marked with an earlier trunk's md5 are another trunk's; collecting over a committed
    json of that trunk sets its cells aside but not the rate cells carried (their cost is counted once), and the set
    aside cells sit beside this trunk's."""
    committed = _map(_cells())
    committed["meta"] = {**committed["meta"], "trunk_md5": "old", "trunk_nll": {"valid": 4.7, "test": 4.6}}
    carried = [{"trunk_md5": "old", **c} for c in committed["rate_cells"]]
    new = _map([c for c in _cells() if c["seed"] == 2])
    new["meta"] = {**new["meta"], "trunk_md5": "new", "trunk_nll": {"valid": 4.71, "test": 4.6}}
    new["rate_cells"] = carried
    assert bottleneck_analysis.carried_rate_cells(new) == carried
    mixed = {**new, "rate_cells": carried[:2] + committed["rate_cells"][2:]}  # softmax's two rates carried
    assert (
        bottleneck_analysis.carried_rate_cells(mixed) == carried[:2]
        and bottleneck_analysis.carried_rate_cells(committed) == []
    )
    assert "| mos-4 | 5.0500 | **5.0500** |" in "\n".join(bottleneck_page.rate_table(new))  # still its rate
    for c in committed["cells"]:  # a chosen rate's seed-1 cell is its rate cell's run: the same CPU time
        c["cpu_s"] = next(
            (
                r["cpu_s"]
                for r in carried
                if c["seed"] == 1 and bottleneck_analysis.rate_key(r) == bottleneck_analysis.rate_key(c)
            ),
            c["cpu_s"],
        )
    obj = bottleneck_analysis.carry_over(new, committed, set())
    [aside] = obj["set_aside"]
    # every run counted once: the earlier trunk's cells and rate cells (a chosen rate's cell is also its seed-1 cell
    # there) and this trunk's cells, the rate cells carried here and not again in the set-aside cell copying them
    here = sum(c["cpu_s"] + c.get("floor_cpu_s", 0) for c in new["cells"]) / 3600
    once = bottleneck_analysis.cells_cpu_hours(committed) + here
    assert bottleneck_analysis.cells_cpu_hours(obj) + bottleneck_analysis.set_aside_hours(obj) == pytest.approx(once)
    with_seed1 = {**obj, "cells": obj["cells"] + [c for c in committed["cells"] if c["seed"] == 1]}
    seed1 = sum(c["cpu_s"] + c.get("floor_cpu_s", 0) for c in committed["cells"] if c["seed"] == 1) / 3600
    # this trunk's own seed-1 cell at --rate-d does not take the carried rate cell's place in the count
    assert bottleneck_analysis.cells_cpu_hours(with_seed1) == pytest.approx(
        bottleneck_analysis.cells_cpu_hours(obj) + seed1
    )
    assert aside["trunk_md5"] == "old" and aside["cells"] == committed["cells"] and aside["rate_cells"] == []
    # the set-aside cells beside this trunk's: seed 2 here (the same cells), seed 1 there alone
    text = "\n".join(bottleneck_page.set_aside_table(obj))
    there = {(c["head"], c["d"], c["seed"]): c["test_nll"] for c in committed["cells"]}
    gap = there[("mos-4", 4, 2)] - there[("softmax", 4, 2)]
    ppl = math.exp(there[("mos-4", 4, 2)])
    assert f"| `old` | mos-4 | 4 | 2 | {ppl:.2f} | {ppl:.2f} | {gap:+.4f} | {gap:+.4f} |" in text
    assert f"| `old` | mos-4 | 4 | 1 | {math.exp(there[('mos-4', 4, 1)]):.2f} | - | " in text
    assert "| `old` | softmax | 4 | 1 |" in text and text.count("| `old` |") == len(committed["cells"])
    moved = {(r["head"], r["d"], r["seed"]): r["moved"] for r in bottleneck_analysis.numbers(obj)["set_aside"]}
    assert moved[("mos-4", 4, 2)] == pytest.approx(0.0) and moved[("mos-4", 4, 1)] is None
    assert "## Cells of an earlier trunk" in bottleneck_report.page(obj, "/tmp/x.png")
    assert bottleneck_page.set_aside_table(committed) == []  # no earlier trunk


def test_the_floor_table_gives_each_cell_s_floor_and_none_where_it_did_not_run():
    """The train-NLL floor per head and d (seed 1's run), ``-`` where no floor ran; its difference from softmax's in
    the numbers the reading cites."""
    cells = [
        _cell("softmax", 4, 1, 5.0, floor_curve=[5.0, 4.8, 4.7], train_nll_floor=4.7),
        _cell("mos-4", 4, 1, 5.1, floor_curve=[5.1, 5.0, 5.05], train_nll_floor=5.0),
        _cell("mos-4", 16, 1, 5.1),
    ]
    text = bottleneck_report.page(_map(cells), "/tmp/x.png").split("## What each head can express")[1]
    assert _rows(text, "| head | d = ")[:2] == ["| softmax | 4.70 (1) | - | - |", "| mos-4 | 5.00 (1) | - | - |"]
    floors = bottleneck_analysis.numbers(_map(cells))["map"]["floor_over_softmax"]
    assert floors["mos-4"] == {"4": pytest.approx(0.3)}


def test_the_numbers_give_mixtape_s_rank_bound_and_a_mixtape_head_keeps_it():
    """Mixtape's log-probability matrix has rank at most S + d + 2 (S words with gates of their own, the rest one
    mixed context's products, as a softmax's): S in the numbers, checked on a Mixtape head of the map's form; above a
    softmax's d + 2, so the bound is not a softmax's."""
    import numpy as np
    import torch

    import hf_heads

    obj = _map(_cells())  # a vocabulary of 100: S = round(0.1 x 100)
    assert bottleneck_analysis.numbers(obj)["map"]["mixtape_frequent_words"] == 10
    torch.manual_seed(0)
    name, options = bottleneck_map.HEADS["mixtape"]
    head = hf_heads.build_head(name, hidden_size=3, vocab_size=100, **options).double().eval()
    with torch.no_grad():
        rank = np.linalg.matrix_rank(head.log_probs_2d(torch.randn(400, 3, dtype=torch.float64)).numpy())
    assert 3 + 2 < rank <= 10 + 3 + 2
    other = {**obj, "meta": {**obj["meta"], "args": {**obj["meta"]["args"], "heads": ["softmax", "mos-4"]}}}
    assert "mixtape_frequent_words" not in bottleneck_analysis.numbers(other)["map"]


def test_an_upgrade_table_best_at_its_cap_gives_the_cap_check_s_command():
    """The committed upgrade table (every cell best at its 2-epoch cap), its cap check left out: Commands give the
    command that would run it (seed 1, 3 x the cap, the table's rates)."""
    obj = {**_committed(), "upgrade_cap": {}}
    up = obj["upgrade"]
    cap = up["meta"]["args"]["max_epochs"]
    assert all(next(e["epoch"] for e in c["curve"] if e.get("best")) == cap for c in up["cells"])
    lines = bottleneck_page.commands_section(obj)
    [line] = [ln for ln in lines if ln.startswith("python -m studies.head_upgrade.table --out results/upgrade_cap ")]
    assert "--seeds 1 --" in line and f"--max-epochs {3 * cap}" in line
    assert line.endswith(" --restore studies/bottleneck_map/records/bottleneck_map.json")
