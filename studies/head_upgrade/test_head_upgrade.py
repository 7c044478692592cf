"""The head-upgrade study (studies/head_upgrade/): its "more parameters" control and its table, end to end on the
tiny GPT-2 of tests/test_upgrade_head.py, in seconds."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("transformers", reason="transformers not installed: run `make install`")
pytest.importorskip("scipy", reason="scipy not installed: run `make install` (the recipes extra)")

from hf_heads.hf import upgrade  # noqa: E402
from test_upgrade_head import pretrained, run  # noqa: E402,F401  (pretrained: the tiny GPT-2 fixture)


def test_the_more_parameters_control_starts_at_the_softmax_and_adds_what_mos_adds(pretrained):
    """python -m studies.head_upgrade --residual-mlp mos-3 (the study's control, studies/head_upgrade/control.py): a
    residual MLP before the pretrained softmax, as many parameters as MoS-3 adds over a softmax (3 d^2 + 6 d), starting
    at the pretrained model; it trains, and it cannot be saved as a head. The library command has no such option."""
    from studies.head_upgrade import command as upgrade_head
    from studies.head_upgrade.control import mlp_size_matching

    tmp_path, files = pretrained
    result = run(
        tmp_path, files, "softmax", "--no-save", "--residual-mlp", "mos-3", command="studies.head_upgrade.command"
    )
    d = 16
    added = result["head_parameters"] - (44 * d)  # the softmax's W (no bias: GPT-2's lm_head has none)
    assert result["residual_mlp"] == mlp_size_matching(d, 3 * d * d + 6 * d) == 26
    assert abs(added - (3 * d * d + 6 * d)) <= 2 * d + 1
    assert result["start_valid_ppl"] == pytest.approx(result["pretrained_ppl"]["valid"], rel=1e-5)
    assert result["after"]["valid"]["ppl"] < result["before"]["valid"]["ppl"]
    assert (
        run(tmp_path, files, "softmax", "--no-save", "--max-epochs", "1", command="studies.head_upgrade.command")[
            "residual_mlp"
        ]
        is None
    )
    base = ["--model", "m", "--train-file", "t", "--valid-file", "v"]
    for bad in (
        ["--residual-mlp", "mos-3"],
        ["--residual-mlp", "0", "--no-save"],
        ["--residual-mlp", "mos-1", "--no-save"],
    ):
        with pytest.raises(SystemExit):
            upgrade_head.parse_args(base + bad)
    from hf_heads.cli import upgrade as library_command

    with pytest.raises(SystemExit):
        library_command.parse_args(base + ["--residual-mlp", "mos-3", "--no-save"])


def test_the_moved_control_names_still_resolve_from_the_library_with_a_warning():
    """hf_heads.hf.upgrade.ResidualMLP and mlp_size_matching (documented in 0.1) moved to the study: for a release the
    old names warn and, from a checkout, are the study's; other names stay AttributeErrors."""
    from studies.head_upgrade import control as upgrade_control

    for name in ("ResidualMLP", "mlp_size_matching"):
        with pytest.warns(FutureWarning, match=rf"hf_heads.hf.upgrade.{name} moved to .*studies.head_upgrade.control"):
            assert getattr(upgrade, name) is getattr(upgrade_control, name)
    with pytest.raises(AttributeError, match="no attribute 'ResidualMLQ'"):
        upgrade.ResidualMLQ  # noqa: B018


def test_the_upgrade_table_chooses_each_rows_rate_on_valid_pairs_seeds_and_resumes(pretrained, monkeypatch, request):
    """python -m studies.head_upgrade.table: the rate pilot (seed 0, a shorter text), each row's rate its lowest valid
    NLL, the table's cells at that rate per seed, scored on test; a rerun runs nothing; the page's section pairs the
    rows with both controls seed by seed (Holm over the table's test comparisons)."""
    import math

    # the cells record torch's threads and the page names them: one here, whatever OMP_NUM_THREADS the run has
    threads = torch.get_num_threads()
    request.addfinalizer(lambda: torch.set_num_threads(threads))
    torch.set_num_threads(1)

    from studies.bottleneck_map import analysis as bottleneck_analysis
    from studies.bottleneck_map import page as bottleneck_page
    from studies.head_upgrade import table as upgrade_table
    from recipes.common import stats as paired_stats

    tmp_path, _ = pretrained
    out = tmp_path / "table"
    argv = ["--model", str(tmp_path / "pre"), "--data", str(tmp_path), "--out", str(out)]
    argv += ["--rows", "softmax", "softmax-mlp", "mos-3", "--rates", "1e-3", "3e-2", "--seeds", "1", "2"]
    argv += ["--extra-rates", "0"]  # (tested below: a grid of two rates puts every best at an end)
    argv += ["--pilot-tokens", "1024", "--pilot-valid-tokens", "256", "--train-tokens", "2048", "--valid-tokens", "512"]
    argv += ["--block-size", "32", "--batch-tokens", "256"]  # passed on to studies.head_upgrade
    result = upgrade_table.main(argv, log=lambda *_: None)
    pilot = bottleneck_analysis.collect_upgrade(str(out))["pilot"]
    assert len(pilot) == 6 and {c["tokens"]["train"] for c in pilot} == {1024 // 32 * 31}
    for row, chosen in result["rates"].items():
        scores = {c["lr"]: c["curve"][1]["valid_nll"] for c in pilot if c["row"] == row}
        assert chosen["lr"] == min(scores, key=scores.get)
        for seed in (1, 2):
            cell = result["cells"][f"{row}-seed{seed}"]
            assert cell["lr"] == chosen["lr"] and cell["seed"] == seed and cell["tokens"]["train"] == 2048 // 32 * 31
            assert "test" in cell["after"] and cell["max_epochs"] == 2 and cell["patience"] == 1
    assert result["cells"]["softmax-mlp-seed1"]["residual_mlp"] == 26
    assert result["cells"]["mos-3-seed1"]["head_options"]["num_components"] == 3
    with pytest.raises(SystemExit):
        upgrade_table.parse_args(argv[:6] + ["--seeds", "0", "1"])  # seed 0 is the pilot's
    # resumable: every cell is read back, none runs
    monkeypatch.setattr(upgrade_head_module(), "main", lambda *a, **k: pytest.fail("a finished cell ran again"))
    again = upgrade_table.main(argv, log=lambda *_: None)["cells"]
    assert json.dumps(again, sort_keys=True) == json.dumps(result["cells"], sort_keys=True)  # (NaN != NaN in ==)
    # a new machine: --restore copies the committed cells (the page's json) into a fresh --out, none runs
    page = tmp_path / "page.json"
    page.write_text(json.dumps({"upgrade": bottleneck_analysis.collect_upgrade(str(out))}))
    fresh = argv[: argv.index("--out")] + ["--out", str(tmp_path / "fresh")] + argv[argv.index("--out") + 2 :]
    restored = upgrade_table.main(fresh + ["--restore", str(page)], log=lambda *_: None)
    assert json.dumps(restored["cells"], sort_keys=True) == json.dumps(result["cells"], sort_keys=True)
    assert json.loads((tmp_path / "fresh" / "rates.json").read_text()) == result["rates"]
    # committed cells of other options stand for nothing: the table's with another --train-tokens are not copied
    other = upgrade_table.parse_args(fresh + ["--restore", str(page), "--out", str(tmp_path / "other")])
    assert upgrade_table.restore(other, "pilot", log=lambda *_: None) == 6
    other.train_tokens += 1
    assert upgrade_table.restore(other, "cells", result["rates"], log=lambda *_: None) == 0
    # the cap check (the table's command at a higher --max-epochs): its cells restore from the page's upgrade_cap part,
    # its pilot from the table's
    committed = bottleneck_analysis.collect_upgrade(str(out))
    cap_meta = {**committed["meta"], "args": {**committed["meta"]["args"], "max_epochs": 3}}
    page.write_text(json.dumps({"upgrade": committed, "upgrade_cap": {"cells": committed["cells"], "meta": cap_meta}}))
    capped = upgrade_table.parse_args(fresh + ["--restore", str(page), "--out", str(tmp_path / "cap")])
    capped.max_epochs = 3
    assert upgrade_table.restore(capped, "pilot", log=lambda *_: None) == 6
    assert upgrade_table.restore(capped, "cells", result["rates"], log=lambda *_: None) == 6
    capped.max_epochs, capped.out = 4, str(tmp_path / "cap4")  # neither part ran at this cap
    assert upgrade_table.restore(capped, "cells", result["rates"], log=lambda *_: None) == 0
    # the page's section
    up = bottleneck_analysis.collect_upgrade(str(out))
    rows = {(r["row"], r["control"]): r for r in bottleneck_analysis.upgrade_rows(up)}
    assert set(rows) == {("softmax-mlp", "softmax"), ("mos-3", "softmax"), ("mos-3", "softmax-mlp")}
    table_rows = ("softmax", "softmax-mlp", "mos-3")
    nll = {k: math.log(c["after"]["test"]["ppl"]) for k, c in result["cells"].items()}
    expected = sum(nll[f"mos-3-seed{s}"] - nll[f"softmax-seed{s}"] for s in (1, 2)) / 2
    assert rows[("mos-3", "softmax")]["paired"].mean == pytest.approx(expected)
    holm = paired_stats.holm([r["paired"].p for r in bottleneck_analysis.upgrade_rows(up)])
    assert [r["holm"] for r in bottleneck_analysis.upgrade_rows(up)] == holm
    text = "\n".join(bottleneck_page.upgrade_section(up))
    assert "| MoS-3 | (a) | 2 |" in text
    assert f"| MoS-3 | (a) | 2 | {expected:+.4f} [" in text  # the pair's mean, as computed from the cells
    # the whole model's inference cost, upgraded over pretrained, timed in each cell: its mean over the row's seeds
    table = text.split("| row | lr | parameters added")[1]
    mos_row = next(line for line in table.splitlines() if line.startswith("| MoS-3 |"))
    ratios = [result["cells"][f"mos-3-seed{s}"]["inference_costs"]["ratio"] for s in (1, 2)]
    assert mos_row.endswith(f"| {bottleneck_page.mean_sd(ratios, 3)} |") and "x pretrained" in table
    names = bottleneck_analysis.NAMES  # the pilot table: each row's valid NLL per rate, bold its chosen rate's
    for r in table_rows:
        scores = {c["lr"]: c["curve"][1]["valid_nll"] for c in pilot if c["row"] == r}
        line = next(ln for ln in text.splitlines() if ln.startswith(f"| {names[r]} | ") and "**" in ln)
        assert f"**{scores[result['rates'][r]['lr']]:.4f}**" in line and line.count("**") == 2
    assert "| (b) softmax + residual MLP (MoS-3's added parameters) |" in text
    # the run's options (OUT/meta.json): the rerun command with every one, passed options last; the seeds planned
    assert up["meta"]["args"]["seeds"] == [1, 2] and up["meta"]["passed"] == argv[-4:]
    command = upgrade_table.command_line(up["meta"])
    assert "--rows softmax softmax-mlp mos-3 --rates 0.001 0.03" in command and command.endswith(" ".join(argv[-4:]))
    assert "--seeds 1 2 " in command and "--max-epochs 2" in command
    # a table short of its seeds says so: the seed-2 cells gone, each row and comparison has "1 of 2"
    up["cells"] = [c for c in up["cells"] if c["seed"] == 1]
    text = "\n".join(bottleneck_page.upgrade_section(up))
    assert "(1 of 2) |" in text and "| MoS-3 | (a) | 1 of 2 |" in text


def upgrade_head_module():
    from studies.head_upgrade import command as upgrade_head

    return upgrade_head


def test_a_pilot_rate_at_an_end_of_the_grid_is_tried_one_step_past_it(tmp_path, monkeypatch):
    """studies.head_upgrade.table: a row whose best pilot rate is the grid's top (bottom) tries the rate a grid step
    above (below) it, again while that one is best, up to --extra-rates; a row best inside the grid tries none; a
    diverged (NaN) rate is never chosen."""
    import math

    from studies.head_upgrade import table as upgrade_table

    best = {"softmax": 3e-3, "mos-3": 3e-4, "plif": 1e-5}  # each row's valid NLL is lowest at this rate
    ran = []

    def fake(argv, dry_run, log):
        out = argv[argv.index("--output-dir") + 1]
        row = next(r for r in best if f"/{r}-" in out)
        lr = float(argv[argv.index("--lr") + 1])
        if "/rates/" in out:  # the pilot's cells (the table's are under cells/)
            ran.append((row, lr))
        nll = math.nan if lr > 1e-2 else abs(math.log(lr / best[row]))
        return {"curve": [{"valid_nll": 9.0}, {"valid_nll": nll}], "lr": lr}

    monkeypatch.setattr(upgrade_table, "run_cell", fake)
    (tmp_path / "data").mkdir()
    for split in ("train", "valid", "test"):
        (tmp_path / "data" / f"{split}.txt").write_text("x\n")
    argv = ["--data", str(tmp_path / "data"), "--out", str(tmp_path / "out"), "--rows", *best, "--seeds", "1"]
    (tmp_path / "out").mkdir()
    result = upgrade_table.main(argv + ["--rates", "1e-4", "3e-4", "1e-3", "--extra-rates", "2"], log=lambda *_: None)
    extra = {row: sorted(lr for r, lr in ran if r == row and lr not in (1e-4, 3e-4, 1e-3)) for row in best}
    assert extra["mos-3"] == []  # best inside the grid
    # 3.3e-3 best, so one more: 1.1e-2 diverges (NaN), never chosen
    assert extra["softmax"] == pytest.approx([1e-3 * 10 / 3, 1e-3 * (10 / 3) ** 2], rel=1e-5)
    assert extra["plif"] == pytest.approx([1e-4 / 9, 1e-4 / 3], rel=1e-5)  # down twice: the cap of 2
    rates = json.loads((tmp_path / "out" / "rates.json").read_text())
    assert rates["softmax"]["lr"] == pytest.approx(1e-3 * 10 / 3, rel=1e-5) and rates["mos-3"]["lr"] == 3e-4
    assert result["rates"]["plif"]["lr"] == pytest.approx(1e-4 / 9, rel=1e-5)
    with pytest.raises(SystemExit):
        upgrade_table.parse_args(argv + ["--extra-rates", "-1"])
    assert (
        upgrade_table.best_rate(
            {1e-3: {"curve": [{}, {"valid_nll": math.nan}]}, 1e-4: {"curve": [{}, {"valid_nll": 5.0}]}}
        )
        == 1e-4
    )


def test_a_cells_row_is_read_back_from_the_folder_the_table_names():
    """studies.head_upgrade.table.row_of inverts cell_dir for pilot and table cells, rows with dashes and small rates
    too (the page's collector reads each cell's row this way)."""
    import argparse

    from studies.head_upgrade import table as upgrade_table

    args = argparse.Namespace(out="/o")
    for row in ("softmax", "softmax-mlp", "mos-3"):
        for stage, key in (("pilot", 1e-05), ("pilot", 0.003), ("cells", 2)):
            assert upgrade_table.row_of(upgrade_table.cell_dir(args, stage, row, key)) == row
