"""The bottleneck map's page (``python -m recipes.bottleneck_report``): its primary test by hand, its families and
what it leaves out, on made-up cells (no training)."""

from __future__ import annotations

import json
import math
import re

import pytest

from recipes import bottleneck_map, bottleneck_report

paired_p = bottleneck_report.paired_stats.format_p


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

    slopes = {r["head"]: r for r in bottleneck_report.slope_test(_map(_cells()))}
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
    epochs: patience firing exactly at the cap is patience."""
    cells = _cells()
    cap = [
        {"epoch": e, "train_cpu_seconds": 0.5, **({"best": True} if e == best else {})}
        for best in (20, 18)
        for e in range(21)
    ]
    cells[1]["curve"], cells[3]["curve"] = cap[:21], cap[21:]  # two MoS-4 cells: best at 20, best at 18
    text = "\n".join(bottleneck_report.stopped_sentence(_map(cells)))
    assert "not their stopping rule (best epoch within the last 2;" in text and "softmax 0 of 9, mos-4 1 of 9" in text
    # ... and marked where they are, per head and d, in the test table
    tests = bottleneck_report.page(_map(cells), "/tmp/x.png").split("## Test perplexity")[1].strip().split("\n\n")[0]
    mos = next(line for line in tests.splitlines() if line.startswith("| mos-4 |"))
    assert mos.count(" cap 1 |") == 1 and " cap " not in tests.split("| mos-4 |")[0]
    # ... and in the paired table, beside the difference it may explain
    paired = bottleneck_report.page(_map(cells), "/tmp/x.png").split("## Paired differences per d")[1].split("![")[0]
    rows = {tuple(ln.split(" | ")[:2]): ln.split(" | ")[3] for ln in paired.splitlines() if ln.startswith("| m")}
    assert rows == {
        ("| mos-4", "4"): "1, 0",
        ("| mos-4", "16"): "0, 0",
        ("| mos-4", "64"): "0, 0",
        ("| mixtape", "4"): "0, 0",
        ("| mixtape", "16"): "0, 0",
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
    rows = [ln for ln in bottleneck_report.cap_reach(_map(cells)) if ln.startswith("| m")]
    assert rows == [
        "| mos-4 | 4 | 1 | +0.1050 | 0.0100 | at least 11 | no |",
        "| mos-4 | 16 | 1 | +0.0500 | 0.0033 | at least 15 | yes |",
        "| mixtape | 4 | 2 | -0.0200 | 0.0100 | ahead | no |",
        "| mixtape | 16 | 1 | +0.0300 | -0.0010 | never at that pace | yes |",
    ]
    assert "gain / epoch, last 3" in bottleneck_report.page(_map(cells), "/tmp/x.png")
    assert bottleneck_report.cap_reach(_map(_cells())) == []  # nothing capped: no paragraph


def test_the_page_leaves_diverged_cells_out_and_counts_the_chosen_rate_cell_once():
    """A cell with a NaN score is named and left out (a NaN would reorder Holm's family); the missing cells are named;
    the chosen rate's cell, also the seed-1 cell at --rate-d, is counted once in the cost; cells without a floor run
    leave the floor table empty, not zero."""
    never = [{"epoch": e, "train_cpu_seconds": 0.5 * (e > 0), **({"best": True} if e == 0 else {})} for e in range(3)]
    cells = _cells() + [_cell("mixtape", 64, 1, float("nan")), _cell("mixtape", 64, 2, 4.0, curve=never)]
    text = bottleneck_report.page(_map(cells), "/tmp/x.png")
    # the second never improved on its untrained start (a run that diverges keeps those weights): finite, left out
    assert (
        "Diverged (a non-finite valid or test NLL, or no epoch better than the untrained start; left out of every "
        "table and test): mixtape d=64 seed 1, mixtape d=64 seed 2." in text
    )
    assert "| mixtape | 4, 16 (2 of 3) | 3 | too few d values (3 needed) | - | - | - |" in text
    assert "**Interim**" not in text  # mixtape has no fit to call interim; mos-4's cells have all run
    fewer = [c for c in cells if (c["head"], c["d"], c["seed"]) != ("mos-4", 64, 3)]
    interim = bottleneck_report.page(_map(fewer), "/tmp/x.png")
    assert "**Interim** for mos-4: a fit to the cells finished so far, not the primary test" in interim
    assert "The heads' seeds differ at d = 64 (softmax: seeds 1, 2, 3; mos-4: seeds 1, 2): there an entry" in interim
    assert "The heads' seeds differ" not in bottleneck_report.page(_map(_cells()), "/tmp/x.png")
    complete = bottleneck_report.page(_map(_cells() + [_cell("mixtape", 64, s, 4.5) for s in (1, 2, 3)]), "/tmp/x.png")
    # every planned cell run: no "so far" in the paired family or in part 1's cost
    assert "comparisons, one family, each with two seeds or more. Capped:" in complete
    assert re.search(r"CPU-core-hours planned: [0-9.]+ in all \(", complete)
    assert re.search(r"CPU-core-hours planned: [0-9.]+ so far \(", text)  # a cell still to run
    assert "| d = 64 |" in text and "- diverged 2 |" in text  # the planned d column, its diverged cells counted
    assert "(missing: seed 3: mixtape d=64)" in text
    assert "| mos-4 | 4, 16, 64 | 3 | " in text
    # each seed's difference beside the paired test: mos-4 at d = 16 is DIFFS[16], seed by seed
    assert "| mos-4 | 16 | 3 | 0, 0 | s1 -0.1200, s2 -0.1500, s3 -0.1000 | -0.1233 [" in text
    # the family is the 6 planned (head, d) pairs, the one with a single finite seed counting as p = 1
    assert "Holm over the 6 planned (head, d) comparisons, one family, 5 of them with two seeds or more" in text
    rows = bottleneck_report.paired_rows(bottleneck_report.finite(_map(cells))[0])
    pvalues = [r["paired"].p for r in rows]
    expected = bottleneck_report.paired_stats.holm(pvalues + [1.0] * (6 - sum(p is not None for p in pvalues)))
    assert [r["holm"] for r in rows] == expected[: len(rows)]
    # 25 cells of 1 CPU-minute, the diverged one too, and 3 rate cells of 30 (the 3 chosen rate cells are seed-1
    # cells, counted there; counted twice, the total would be 4.9)
    # the cell still to run (mixtape d=64 seed 3) estimated from its head's cells at that d: the two diverged, 1 minute
    assert "still to run: 1 cell, about 0.0 for the 1 of them with cells of their head" in text
    assert "1.9 so far (1.9 in 26 cells and 6 rate cells, each chosen rate's cell counted once" in text
    # the heads' cost at equal work: 0.5 CPU-s an epoch of 1,000 tokens
    assert "| softmax | 500 ± 0 (3) | 500 ± 0 (3) | 500 ± 0 (3) |" in text.split("CPU minutes of a floor run.")[1]
    assert "Chosen at an end of the grid" in text and "mos-4 (0.01)" in text
    # the commands rerun it from the repository's root with every option the map recorded
    commands = text.split("## Commands")[1].split("## Cost")[0]
    assert "--trunk results/reproduce/lm-ptb/softmax/lr0.01/seed1/checkpoints/checkpoint_best.pt" in commands
    assert "python -m recipes.reproduce lm-ptb --scale mini --heads softmax --seeds 1 --lrs 0.01\n" in commands
    assert "--dims 4 16 64 --rates 0.001 0.01 --seeds 3 --rate-d 16" in commands and "--floor-seeds 1" in commands
    assert "# with --restore docs/bottleneck_map.json it resumes from the committed cells (a new machine" in commands
    assert "earlier trunk's search" not in commands  # its rates searched on its own trunk: nothing carried to say
    assert "- (0) |" not in text and "| mos-4 | - | - | - |" in text.split("## What each head can express")[1]


def test_the_command_writes_page_and_plots_around_a_diverged_cell(tmp_path, monkeypatch):
    """``python -m recipes.bottleneck_report --no-collect``: a NaN cell among paired seeds is left out of the plot's
    tests too (a NaN p-value would stop Holm), both plots are written, and the differences' plot draws the primary
    test's line of each head it fits, with its slope and Holm p."""
    import json

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
    text = bottleneck_report.main(["--docs", str(tmp_path), "--no-collect"], log=lambda *_: None)
    assert "Diverged (a non-finite valid or test NLL" in text and "| mixtape | 4 | 2 |" in text
    assert "dashed: the primary test" not in text  # (the plot's title, not the page's)
    fits = {f["head"]: f for f in bottleneck_report.slope_test(bottleneck_report.finite(_map(cells))[0])}
    fitted = [h for h in sorted(fits) if fits[h]["slope"] is not None]
    assert "mos-4" in fitted and [label for label, _ in dashed] == [
        f"{h}: slope {fits[h]['slope']:+.4f} / doubling, Holm p {paired_p(fits[h]['holm'])}" for h in fitted
    ]
    x, y = dashed[fitted.index("mos-4")][1]  # mos-4's line through its fit at each d
    assert y == pytest.approx([fits["mos-4"]["intercept"] + fits["mos-4"]["slope"] * math.log2(d) for d in x])
    assert (tmp_path / "bottleneck_map.png").exists() and (tmp_path / "bottleneck_map-spectra.png").exists()


def test_before_the_seed_cells_the_page_shows_the_rate_search_and_no_empty_map(tmp_path):
    """With rate cells only (the map's first stage), the page gives the rates run so far (a head whose grid is whole
    has its rate before rates.json exists), says the seed cells follow, and writes no empty tables or plots."""
    import json

    obj = _map([])
    obj["rates"] = {}
    obj["rate_cells"] = [c for c in obj["rate_cells"] if c["head"] != "mixtape" or c["lr"] == 1e-3]
    obj["rate_cells"][0]["valid_nll"] = 4.9  # softmax at 1e-3: its grid is whole, so its rate is known
    (tmp_path / "bottleneck_map.json").write_text(json.dumps(obj))
    text = bottleneck_report.main(["--docs", str(tmp_path), "--no-collect"], log=lambda *_: None)
    assert (
        "Cells finished: 0 of the 27 planned (3 heads x 3 d x 3 seeds; d = 8, 32, 128 of the map's default set (4, 8, "
        "16, 32, 64, 128) left out by this run's --dims); the rate cells at d = 16 run first" in text
    )
    assert "| softmax | **4.9000** | 5.0500 |" in text and "| mixtape | 5.0500 | - |" in text
    assert "Not chosen yet (their rate cells run): mixtape." in text and "Seeds 1, 2, 3, fixed" in text
    assert "## Test perplexity" not in text and "| head |  |" not in text and "## Commands" in text
    assert not (tmp_path / "bottleneck_map.png").exists()
    # the cost still to come, from the chosen rate's cell (1,800 CPU-s over 7 epochs): a seed-2 cell trains as long;
    # seed 1's adds its floor (10 epochs at its CPU per epoch); the chosen rate cell itself, trained, its floor only
    estimate = lambda *cell: bottleneck_report.cell_estimate(obj, *cell) * 3600  # noqa: E731
    assert estimate("softmax", 4, 2) == pytest.approx(1800) and estimate("softmax", 16, 1) == pytest.approx(18000 / 7)
    assert estimate("softmax", 4, 1) == pytest.approx(1800 + 18000 / 7) and estimate("mixtape", 4, 2) == 1800


def test_the_reading_written_beside_the_page_opens_it_and_says_when_cells_have_finished_since(tmp_path):
    """docs/bottleneck_map-reading.md, written by hand for N finished cells, opens the page, each of its paragraphs
    (separated by a blank line) on one line; once the page counts another number of cells (map, joint check and
    upgrade table together) it says the numbers may have moved; without the file the page has no reading."""
    import json

    obj = _map(_cells())
    (tmp_path / "bottleneck_map.json").write_text(json.dumps(obj))
    run = ["--docs", str(tmp_path), "--no-collect"]
    assert "## Reading" not in bottleneck_report.main(run, log=lambda *_: None)
    n = bottleneck_report.page_cells(obj)
    assert n == len(obj["cells"]) > 0
    (tmp_path / bottleneck_report.READING).write_text(f"<!-- cells: {n} -->\nMoS-4 pays\nbelow d = 16.\n")
    text = bottleneck_report.main(run, log=lambda *_: None)
    assert text.split("## How")[0].endswith("## Reading\n\nMoS-4 pays below d = 16.\n\n")
    # a blank line (spaces on it too) ends a paragraph
    two = f"<!-- cells: {n} -->\nMoS-4 pays\nbelow d = 16.\n \nNot at 64.\n"
    (tmp_path / bottleneck_report.READING).write_text(two)
    text = bottleneck_report.main(run, log=lambda *_: None)
    assert text.split("## How")[0].endswith("## Reading\n\nMoS-4 pays below d = 16.\n\nNot at 64.\n\n")
    (tmp_path / bottleneck_report.READING).write_text(f"<!-- cells: {n - 1} -->\nMoS-4 pays.")
    text = bottleneck_report.main(run, log=lambda *_: None)
    assert f"## Reading\n\n*(Written when {n - 1} cells had finished; {n} have now" in text
    assert "the numbers below may have moved since.)*\n\nMoS-4 pays.\n" in text


def test_the_committed_page_is_what_its_committed_json_gives(tmp_path):
    """docs/bottleneck_map.md is generated: rebuilt from docs/bottleneck_map.json it comes out the same, so a change
    of the generator lands with the page it writes."""
    import os
    import shutil

    docs = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs")
    for name in ("bottleneck_map.json", bottleneck_report.READING):
        if os.path.exists(os.path.join(docs, name)):
            shutil.copy(os.path.join(docs, name), tmp_path / name)
    text = bottleneck_report.main(["--docs", str(tmp_path), "--no-collect"], log=lambda *_: None)
    with open(os.path.join(docs, "bottleneck_map.md")) as f:
        assert text + "\n" == f.read()


def test_the_joint_check_says_whether_its_stopping_rule_could_fire():
    """The joint cells' patience is read from their commands: at or above the epoch cap it cannot fire."""
    obj = _map(_cells())

    def joint(cap, patience, d=4):
        return [
            {
                "head": h,
                "d": d,
                "seed": 1,
                "lr": 0.0025,
                "epoch_cap": cap,
                "ppl": {"valid": 1.0, "test": p},
                "command": f"fairseq-train bin --patience {patience} --max-epoch {cap}",
            }
            for h, p in (("softmax", 100.0), ("mos-4", 90.0))
        ]

    text = "\n".join(bottleneck_report.joint_section({**obj, "joint": joint(3, 3)}))
    assert "3 epochs, the table's patience of 3 unable to fire within them;" in text
    text = "\n".join(bottleneck_report.joint_section({**obj, "joint": joint(8, 3)}))
    assert "8 epochs, within them the table's stopping rule (patience 3);" in text
    # beside the frozen cell of its head, d and seed; a d the map leaves out says so, rather than "not run yet"
    assert "| mos-4 | 4 | 1 | 90.00 | 90.92 | -0.1054 | -0.3000 | - |" in text
    text = "\n".join(bottleneck_report.joint_section({**obj, "joint": joint(3, 3, 128)}))
    assert "| mos-4 | 128 | 1 | 90.00 | not in the map's plan (--heads / --dims / --seeds) | -0.1054 | - | - |" in text


def test_a_collection_on_another_trunk_sets_the_committed_cells_aside_and_keeps_the_other_parts(tmp_path):
    """A map run on a trunk trained again (not bit for bit) collects beside the committed json: the committed rate
    cells are set aside (their trunk named, their CPU time counted), the joint check and the upgrade table, whose
    folders this machine lacks, stay as committed."""
    import json

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
            "command": "python -m recipes.bottleneck_joint",
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
    argv = ["--docs", str(docs), "--results", str(results), "--joint", str(tmp_path / "no"), "--upgrade", "-"]
    text = bottleneck_report.main(argv, log=lambda *_: None)
    obj = json.loads((docs / "bottleneck_map.json").read_text())
    assert obj["joint"] == committed["joint"] and obj["upgrade"] == committed["upgrade"]
    assert [len(obj["rate_cells"]), len(obj["cells"])] == [1, 0]
    (aside,) = obj["set_aside"]
    assert aside["trunk_md5"] == "first" and aside["rate_cells"] == committed["rate_cells"]
    assert (
        "An earlier trunk from the same command, not bit for bit this one, is set aside (counted in the cost): md5 "
        "`first`, its valid NLL 0.0100 nats lower than this one's, its 6 rate cells shown nowhere else. " in text
    )
    # 6 rate cells set aside (3 x 1800 + 3 x 3600 CPU-s = 4.5 h), the new rate cell (60 s), the joint check (2 h)
    assert "6.5 so far (0.0 in 1 rate cell; 4.5 in" in text  # no rate chosen: no cell counted for two
    assert "; 4.5 in 6 rate cells set aside with their earlier trunk; 2.0 in the joint" in text
    # collected again from the same trunk: nothing more set aside
    bottleneck_report.main(argv, log=lambda *_: None)
    assert len(json.loads((docs / "bottleneck_map.json").read_text())["set_aside"]) == 1


def test_run_paths_are_written_as_the_commands_write_them():
    """The page's commands run from the repository's root: a run's path from its ``results/``, and the trunk trained
    with another ``--out`` as the trunk command (``recipes.reproduce lm-ptb``) writes it."""
    portable = bottleneck_report.portable
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
    text = "\n".join(bottleneck_report.commands_section(obj))
    assert (
        "#   python -m recipes.reproduce lm-ptb --scale mini --heads softmax --seeds 1 --lrs 0.0025 --out artifacts"
        in text
    )
    assert f"--trunk {portable(kept)} --data artifacts/lm-ptb/data/bin" in text
    assert "\npython -m recipes.reproduce" not in text  # nothing to train first


def test_the_page_says_how_the_trunk_trained_and_whether_it_still_improved():
    """The trunk's valid perplexity per epoch (from its table cell's log, in the map's meta): a last epoch that is
    still the best is said to be still falling, with its change; a run without the curve says nothing of it."""
    curve = [{"epoch": e, "valid_ppl": p} for e, p in enumerate((242.86, 169.01, 125.98, 116.24), 1)]
    text = bottleneck_report.trunk_training({"trunk_curve": curve})
    assert text == (
        "; trained 4 epochs (valid perplexity 242.86, 169.01, 125.98, 116.24 by epoch, from its fairseq log, which "
        "rounds the loss; still falling, -7.7% in its last epoch: the trunk stopped before it converged)"
    )
    five = curve + [{"epoch": 5, "valid_ppl": 110.0}]  # the lm-ptb table's mini cap: said
    assert "the trunk stopped at its table's 5-epoch cap (mini scale), before it converged)" in (
        bottleneck_report.trunk_training({"trunk_curve": five})
    )
    flat = curve[:3] + [{"epoch": 4, "valid_ppl": 130.0}]
    assert bottleneck_report.trunk_training({"trunk_curve": flat}).endswith(
        "130.00 by epoch, from its fairseq log, which rounds the loss)"
    )
    assert bottleneck_report.trunk_training({}) == ""


def test_the_upgrade_table_says_which_heads_control_b_is_not_sized_to():
    """Control (b) (the residual MLP) is sized to MoS-3: a head adding more than 2% more or fewer parameters is named
    as compared with a control of another size; with every head within 2%, nothing is said."""
    from recipes import upgrade_table

    def cell(row, params):
        return {"row": row, "seed": 1, "head_parameters": params}

    base = {1: 1000}
    cells = [cell("softmax", 1000), cell("softmax-mlp", 1500), cell("mos-3", 1495), cell("mixtape", 2000)]
    assert bottleneck_report.size_matched(cells, base, upgrade_table.ROW_NAMES) == [
        "",
        "Control (b) adds 500 parameters; MoS-3 adds 495, within 1.00% of it; Mixtape adds 1,000: its comparison with "
        "(b) is against a control of another size.",
    ]
    assert bottleneck_report.size_matched(cells[:3], base, upgrade_table.ROW_NAMES) == []


def test_each_paired_difference_gives_the_difference_its_seeds_could_detect():
    """The paired table's last column: the difference a paired t-test of the row's seeds detects with 80% power at
    0.05 / m, m the planned family (here 2 heads x 3 d), from the seed differences' spread."""
    import statistics

    text = bottleneck_report.page(_map(_cells()), "/tmp/x.png")
    table = text.split("## Paired differences per d")[1].split("![")[0]
    family = 2 * 3
    std = statistics.stdev(DIFFS[4])
    det = bottleneck_report.paired_stats.detectable(std, 3, 0.05 / family, 0.8)
    row = next(line for line in table.splitlines() if line.startswith("| mos-4 | 4 | 3 |"))
    assert row.endswith(f"| ±{det:.4f} |")
    assert "| detectable (80% power) |" in table and "Detectable: the difference a paired t-test" in table


def test_spectrum_measures_by_hand_and_only_from_a_whole_spectrum(tmp_path):
    """The ranks at a fraction of the largest singular value and the share past d + 2 without the first, by hand; the
    collected json takes them from a cell's whole spectrum only, never from a restored cell's cut one (d + 10)."""
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
    got = {c["seed"]: c["spectrum"] for c in bottleneck_report.collect(str(tmp_path))["cells"]}
    assert got[1]["rank_at"] == bottleneck_map.spectrum_measures(whole["spectrum"]["top"], 1)["rank_at"]
    assert len(got[1]["top"]) == 11 and "rank_at" not in got[2] and "beyond_bound_after_first" not in got[2]
    obj = _map(_cells())
    for c in obj["cells"][1:]:  # every cell but one with its whole spectrum's measures
        c["spectrum"].update(bottleneck_map.spectrum_measures(c["spectrum"]["top"], c["d"]))
    shares = [c["spectrum"]["first_share"] for c in obj["cells"][1:]]
    text = bottleneck_report.page(obj, "/tmp/x.png")
    assert "Rank at 0.001 of the largest singular value" in text and "among all but the first" in text
    assert f"the first holds {min(shares):.1%} to {max(shares):.1%} of the squared sum" in text
    assert (
        "Left out of the last three tables: 1 cell(s) restored without their whole spectrum (softmax d=4 seed 1)"
        in text
    )


def _upgrade_cell(row, seed, valid, test_ppl, best, cap):
    """A made-up upgrade_head cell: its valid NLL per epoch (epoch 0 first), its best epoch, its cap (patience 1)."""
    curve = [{"epoch": e, "valid_nll": v, **({"best": True} if e == best else {})} for e, v in enumerate(valid)]
    return {"row": row, "seed": seed, "curve": curve, "after": {"test": {"ppl": test_ppl}}, "max_epochs": cap,
            "patience": 1}  # fmt: skip


def test_the_cap_check_sits_beside_the_tables_seed_1_cells():
    """The cap check's rows at their stopping rule beside the table's cells at its cap: how each ended, both test
    perplexities, each row-minus-control difference at both (by hand), that its first epochs repeat the table's; the
    page counts its cells, and a collection without its folder keeps the committed ones."""
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
    text = "\n".join(bottleneck_report.cap_section(obj))
    assert "(a) softmax, fine-tuned seed 1, (b) softmax + residual MLP" in text
    assert "at most 6 epochs (patience 1), the table's at most 2; otherwise as the table's cell" in text
    assert "differ by at most 1.0e-04 nats" in text  # mos-3's epoch 2: 3.1801 against the table's 3.18
    assert "| (a) softmax, fine-tuned | 1 | 6 | cap (6 epochs) | 32.00 | 30.00 |" in text
    assert "| (b) softmax + residual MLP (MoS-3's added parameters) | 1 | 3 | stopping rule | 26.40 | 25.00 |" in text
    assert "| MoS-3 | 1 | 2 | stopping rule | 25.90 | 25.90 |" in text
    mos_b = (math.log(25.9 / 26.4), math.log(25.9 / 25.0))  # MoS-3 - (b): ahead at the cap, behind past it
    assert f"MoS-3 - (b) (seed 1) {mos_b[0]:+.4f} -> {mos_b[1]:+.4f}" in text and "the table -> the cap check:" in text
    assert f"(b) - (a) (seed 1) {math.log(26.4 / 32.0):+.4f} -> {math.log(25.0 / 30.0):+.4f}" in text
    assert bottleneck_report.page_cells(obj) == len(obj["cells"]) + 6
    assert bottleneck_report.cap_section({**obj, "upgrade_cap": {}}) == []
    new = {"meta": obj["meta"], "upgrade": {"cells": table[:1]}}
    kept = bottleneck_report.carry_over(new, obj, {"upgrade"})
    assert kept["upgrade_cap"] == obj["upgrade_cap"] and kept["upgrade"] == new["upgrade"]  # the collected one kept
    # a cap folder whose run has begun (its meta written) but not finished a cell keeps the committed cells
    begun = {"meta": obj["meta"], "upgrade_cap": {"meta": {}, "cells": []}}
    assert bottleneck_report.carry_over(begun, obj, {"upgrade_cap"})["upgrade_cap"] == obj["upgrade_cap"]
    # another rate than the table's is named, not called "as the table"
    other = [{**cap[2], "lr": 1.0}]
    text = "\n".join(bottleneck_report.cap_section({**obj, "upgrade_cap": {"cells": other}}))
    assert "unlike the table's cell of the same row and seed in MoS-3 seed 1 (lr)" in text


def test_part_2s_cost_projects_the_table_cells_still_to_run_from_their_rows():
    """Each missing table cell costs its row's finished cells' mean; a row with none is counted apart."""

    def cell(row, seed, cpu_s):
        return {"row": row, "seed": seed, "curve": [{"epoch": 0}, {"epoch": 1, "cpu_seconds": cpu_s}]}

    up = {
        "meta": {"args": {"rows": ["softmax", "mos-3", "plif"], "seeds": [1, 2]}},
        "pilot": [cell("softmax", 0, 1800.0)],
        "cells": [cell("softmax", 1, 3600.0), cell("mos-3", 1, 7200.0)],
    }
    text = "\n".join(bottleneck_report.budget_lines({**_map(_cells()), "upgrade": up}, []))
    assert (
        "Part 2 (the upgrade table), of the 15 CPU-core-hours planned: 3.5 so far (0.5 in the rate pilot's 1 " in text
    )
    assert (
        "still to run: 2 table cells, about 3.0 (each its row's finished cells' mean): about 6.5 of the 15 in all, "
        in text
    )
    assert "and 2 table cells with no cell of their row yet, not estimated." in text
    # the cap check's cells counted, those still to run named; a page with the cap check alone still has its cost
    cap = {"cells": [cell("softmax", 1, 7200.0)], "meta": {"args": {"rows": ["softmax", "mos-3"], "seeds": [1]}}}
    text = "\n".join(bottleneck_report.budget_lines({**_map(_cells()), "upgrade": up, "upgrade_cap": cap}, []))
    assert (
        "2.0 in the cap check's 1;" in text and "5.5 so far" in text and "and 1 cap check cells, not estimated" in text
    )
    text = "\n".join(bottleneck_report.budget_lines({**_map(_cells()), "upgrade_cap": cap}, []))
    assert "Part 2 (the upgrade table), of the 15 CPU-core-hours planned: 2.0 so far" in text


def test_a_rate_search_carried_from_another_trunk_is_named_and_counted_once():
    """--carry-rates: rate cells marked with an earlier trunk's md5. The rate section names that trunk and says every
    cell trained on this one; the seed-1 cell at --rate-d is not "trained already"; collecting over a committed json
    of that trunk sets its cells aside but not the rate cells carried (their cost is counted once)."""
    committed = _map(_cells())
    committed["meta"] = {**committed["meta"], "trunk_md5": "old", "trunk_nll": {"valid": 4.7, "test": 4.6}}
    carried = [{"trunk_md5": "old", **c} for c in committed["rate_cells"]]
    new = _map([c for c in _cells() if c["seed"] == 2])
    new["meta"] = {**new["meta"], "trunk_md5": "new", "trunk_nll": {"valid": 4.71, "test": 4.6}}
    new["rate_cells"] = carried
    text = "\n".join(bottleneck_report.rate_section(new))
    assert "The rate search of every head ran on an earlier trunk from the same command (md5 `old`" in text
    assert "every cell of this page trained on this trunk, the seed-1 cell at d = 16 included (so its" in text
    assert "(valid NLL at d = 16, seed 1, on an earlier trunk)" in text and "not trained twice" not in text
    commands = "\n".join(bottleneck_report.commands_section(new))
    assert (
        "this page's rates came from an earlier trunk's search (see Learning rates), which it cannot rerun" in commands
    )
    # one head's search carried, the others' run on this trunk: each said for the heads it is true of
    mixed = {**new, "rate_cells": carried[:2] + committed["rate_cells"][2:]}  # softmax's two rates carried
    text = "\n".join(bottleneck_report.rate_section(mixed))
    assert "The rate search of softmax ran on an earlier trunk" in text
    assert (
        "(valid NLL at d = 16, seed 1)" in text
        and "of mos-4, mixtape is its seed-1 cell at d = 16 (not trained" in text
    )
    assert not bottleneck_report.rate_cell_trained(new, "mos-4")
    # the cell trains (60 CPU-s, as its cells at d = 16) and its floor runs (10 epochs of 60 / 7 s), not the floor alone
    assert bottleneck_report.cell_estimate(new, "mos-4", 16, 1) == pytest.approx((60.0 + 10 * 60.0 / 7) / 3600)
    assert bottleneck_report.cell_estimate(committed, "mos-4", 16, 1) == pytest.approx(10 * 60.0 / 7 / 3600)
    for c in committed["cells"]:  # a chosen rate's seed-1 cell is its rate cell's run: the same CPU time
        c["cpu_s"] = next(
            (
                r["cpu_s"]
                for r in carried
                if c["seed"] == 1 and bottleneck_report.rate_key(r) == bottleneck_report.rate_key(c)
            ),
            c["cpu_s"],
        )
    obj = bottleneck_report.carry_over(new, committed, set())
    [aside] = obj["set_aside"]
    # every run counted once: the earlier trunk's cells and rate cells (a chosen rate's cell is also its seed-1 cell
    # there) and this trunk's cells, the rate cells carried here and not again in the set-aside cell copying them
    here = sum(c["cpu_s"] + c.get("floor_cpu_s", 0) for c in new["cells"]) / 3600
    once = bottleneck_report.cells_cpu_hours(committed) + here
    assert bottleneck_report.cells_cpu_hours(obj) + bottleneck_report.set_aside_hours(obj) == pytest.approx(once)
    with_seed1 = {**obj, "cells": obj["cells"] + [c for c in committed["cells"] if c["seed"] == 1]}
    seed1 = sum(c["cpu_s"] + c.get("floor_cpu_s", 0) for c in committed["cells"] if c["seed"] == 1) / 3600
    # this trunk's own seed-1 cell at --rate-d does not take the carried rate cell's place in the count
    assert bottleneck_report.cells_cpu_hours(with_seed1) == pytest.approx(
        bottleneck_report.cells_cpu_hours(obj) + seed1
    )
    assert aside["trunk_md5"] == "old" and aside["cells"] == committed["cells"] and aside["rate_cells"] == []
    # the set-aside cells beside this trunk's: seed 2 here (the same cells), seed 1 there alone
    text = "\n".join(bottleneck_report.set_aside_section(obj))
    there = {(c["head"], c["d"], c["seed"]): c["test_nll"] for c in committed["cells"]}
    gap = there[("mos-4", 4, 2)] - there[("softmax", 4, 2)]
    ppl = math.exp(there[("mos-4", 4, 2)])
    assert f"| `old` | mos-4 | 4 | 2 | {ppl:.2f} | {ppl:.2f} | {gap:+.4f} | {gap:+.4f} |" in text
    assert f"| `old` | mos-4 | 4 | 1 | {math.exp(there[('mos-4', 4, 1)]):.2f} | - | " in text
    assert "| `old` | softmax | 4 | 1 |" in text and text.count("| `old` |") == len(committed["cells"])
    assert "[Cells of an earlier trunk](#cells-of-an-earlier-trunk)" in bottleneck_report.page(obj, "/tmp/x.png")
    assert bottleneck_report.set_aside_section(committed) == []  # no earlier trunk
    # rate cells of this trunk: no sentence, trained already
    assert "earlier trunk" not in "\n".join(bottleneck_report.rate_section(committed))
    assert bottleneck_report.rate_cell_trained(committed, "mos-4")
    # the budget's projection says "trained already" only where a rate cell of this trunk is the seed-1 cell
    missing = [("mos-4", 16, 1)]
    assert "trained already" not in "\n".join(bottleneck_report.budget_lines(new, missing))
    assert "trained already" in "\n".join(bottleneck_report.budget_lines(committed, missing))


def test_the_floor_paragraph_says_where_the_floors_started():
    """The floor runs start from each cell's best epoch: where those differ, the page says the floors are not equal
    budgets and from which epochs they started; a floor still falling at its last epoch is counted."""
    early = [{"epoch": e, "train_cpu_seconds": 0.5 * (e > 0), **({"best": True} if e == 2 else {})} for e in range(5)]
    cells = [
        _cell("softmax", 4, 1, 5.0, floor_curve=[5.0, 4.8, 4.7], curve=early),
        _cell("mos-4", 4, 1, 5.1, floor_curve=[5.1, 5.0, 5.05]),  # best at epoch 5 (the fixture's); lowest mid-run
    ]
    text = "\n".join(bottleneck_report.floor_slope(_map(cells)))
    assert "Each starts from its cell's best epoch (epochs 2 to 5 here) at its head's rate" in text
    assert "1 of the 2 floor runs reached their lowest at the budget's last epoch" in text
    same = [_cell("softmax", 4, 1, 5.0, floor_curve=[5.0, 4.8]), _cell("mos-4", 4, 1, 5.1, floor_curve=[5.1, 5.0])]
    assert "Each starts from" not in "\n".join(bottleneck_report.floor_slope(_map(same)))


def test_the_rank_note_gives_mixtape_s_bound_and_a_mixtape_head_keeps_it():
    """The rank table's note: Mixtape's log-probability matrix has rank at most S + d + 2 (S words with gates of their
    own, the rest one mixed context's products, as a softmax's), checked on a Mixtape head of the map's form; above a
    softmax's d + 2, so the bound is not a softmax's."""
    import numpy as np
    import torch

    import hf_heads

    obj = _map(_cells())  # a vocabulary of 100: S = round(0.1 x 100)
    assert "Mixtape's is at most S + d + 2, S = 10: only its S most frequent words" in bottleneck_report.page(
        obj, "/tmp/x.png"
    )
    torch.manual_seed(0)
    name, options = bottleneck_report.bottleneck_map.HEADS["mixtape"]
    head = hf_heads.build_head(name, hidden_size=3, vocab_size=100, **options).double().eval()
    with torch.no_grad():
        rank = np.linalg.matrix_rank(head.log_probs_2d(torch.randn(400, 3, dtype=torch.float64)).numpy())
    assert 3 + 2 < rank <= 10 + 3 + 2
    assert "Mixtape's" not in bottleneck_report.mixtape_bound(
        {**obj, "meta": {**obj["meta"], "args": {**obj["meta"]["args"], "heads": ["softmax", "mos-4"]}}}
    )


def test_an_upgrade_table_best_at_its_cap_names_the_cap_check_that_has_not_run():
    """The committed upgrade table (every cell best at its 2-epoch cap), its cap check left out: the table says the
    check has not run and Commands give the command that would run it (seed 1, 3 x the cap, the table's rates)."""
    import json
    import os

    docs = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs")
    with open(os.path.join(docs, "bottleneck_map.json")) as f:
        obj = {**json.load(f), "upgrade_cap": {}}
    up = obj["upgrade"]
    cap = up["meta"]["args"]["max_epochs"]
    assert all(next(e["epoch"] for e in c["curve"] if e.get("best")) == cap for c in up["cells"])
    assert "best at the cap: numbers at that cap; the cap check has not run)" in "\n".join(
        bottleneck_report.upgrade_section(up)
    )
    assert "the cap check has not run" not in "\n".join(bottleneck_report.upgrade_section(up, checked=True))
    commands = "\n".join(bottleneck_report.commands_section(obj))
    line = commands.split(f"# the cap check, not run yet: seed 1 of every row past the table's {cap}-epoch cap")[1]
    line = line.split("\n")[1]
    assert line.startswith("python -m recipes.upgrade_table --out results/upgrade_cap ")
    assert (
        "--seeds 1 --" in line
        and f"--max-epochs {3 * cap}" in line
        and line.endswith(" --restore docs/bottleneck_map.json")
    )
