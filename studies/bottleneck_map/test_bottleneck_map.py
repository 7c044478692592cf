"""The bottleneck map (``python -m studies.bottleneck_map``): a trunk's cached features score as fairseq scores the
trunk, and the map's cells train, choose their rates on valid and resume, on a tiny AWD-LSTM in seconds."""

from __future__ import annotations

import json
import math
import re

import pytest
import torch

pytest.importorskip("fairseq", reason="fairseq not installed: run `make install`")

from test_fairseq_cli import PLUGIN, cli, data  # noqa: E402,F401  (data: the tiny corpus fixture)
from test_streams import train_args  # noqa: E402

from studies.bottleneck_map import study as bottleneck_map  # noqa: E402


@pytest.fixture(scope="module")
def trunk(data, tmp_path_factory):
    out = tmp_path_factory.mktemp("trunk")
    cli("fairseq-train", *train_args(data / "lm-bin", out, "--max-epoch", "2", "--no-epoch-checkpoints"))
    return out / "checkpoint_last.pt", data / "lm-bin"


def test_cached_features_score_as_fairseq_eval_lm_scores_the_trunk(trunk):
    """The trunk's own head on the extracted features (the state carried along 10 streams, windows of 12) gives
    fairseq-eval-lm's perplexity: the features are what the trunk's head reads, in the papers' protocol."""
    checkpoint, bin_dir = trunk
    out = cli(
        "fairseq-eval-lm",
        bin_dir,
        "--user-dir",
        PLUGIN,
        "--task",
        "awd_language_modeling",
        "--path",
        checkpoint,
        "--gen-subset",
        "valid",
        "--bptt",
        "12",
        "--cpu",
        "--num-workers",
        "0",
    )
    expected = float(re.search(r"Perplexity: ([\d.]+)", out).group(1))
    states = bottleneck_map.trunk_features(str(checkpoint), str(bin_dir), "valid", streams=10, bptt=12)
    from fairseq import checkpoint_utils

    models, _, _ = checkpoint_utils.load_model_ensemble_and_task([str(checkpoint)])
    head = models[0].decoder.head.eval()
    with torch.no_grad():
        nll = head.loss(states.states.float(), states.targets)
    assert states.states.shape[1] == 16 and states.states.dtype == torch.float16
    assert math.exp(float(nll)) == pytest.approx(expected, rel=2e-3)  # the features are stored in float16


def test_the_fast_study_ptb_task_reads_the_trunk(trunk, tmp_path):
    """studies.common.lms.split_task on PTB: the trunk's features of the first train tokens, valid and test, its own
    softmax scoring them (valid read along 10 streams, as the map reads it)."""
    from studies.common import lms

    checkpoint, bin_dir = trunk
    task = lms.split_task("ptb", "", str(tmp_path), trunk=str(checkpoint), trunk_data=str(bin_dir), train_tokens=50)
    assert task.train_h.shape == (50, 16) and task.train_h.dtype == torch.float32
    valid = bottleneck_map.trunk_features(str(checkpoint), str(bin_dir), "valid", streams=10)
    assert torch.equal(task.valid_y, valid.targets)
    with torch.no_grad():
        nll = float(task.softmax.loss(valid.states.float(), valid.targets))
    assert task.info["softmax_valid_ppl"] == pytest.approx(math.exp(nll), rel=1e-5)
    with pytest.raises(FileNotFoundError, match="no trunk checkpoint"):
        lms.split_task("ptb", "", str(tmp_path), trunk=str(tmp_path / "none.pt"))


def test_map_cells_train_choose_rates_on_valid_and_resume(trunk, tmp_path, monkeypatch):
    checkpoint, bin_dir = trunk
    monkeypatch.setattr(bottleneck_map, "BPTT", 12)
    argv = [
        "--trunk",
        str(checkpoint),
        "--data",
        str(bin_dir),
        "--out",
        str(tmp_path),
        "--heads",
        "softmax",
        "mos-4",
        "--dims",
        "2",
        "8",
        "--seeds",
        "2",
        "--rates",
        "1e-2",
        "3e-2",
        "--rate-d",
        "2",
        "--max-epochs",
        "3",
        "--floor-epochs",
        "2",
        "--floor-seeds",
        "1",
        "--floor-sample",
        "200",
        "--batch-tokens",
        "256",
        "--spectrum-contexts",
        "50",
        "--quiet",
    ]
    ran, run_cell = [], bottleneck_map.run_cell
    monkeypatch.setattr(bottleneck_map, "run_cell", lambda *a, **k: ran.append(a[1:4]) or run_cell(*a, **k))
    result = bottleneck_map.main(argv, log=lambda *_: None)
    assert set(result["rates"]) == {"softmax", "mos-4"} and set(result["rates"].values()) <= {1e-2, 3e-2}
    # 4 rate cells, then 8 cells less the two that are the chosen rates' cells (seed 1 at --rate-d): 10 trainings
    assert len(ran) == 10 and ran.count(("softmax", 2, 1)) == ran.count(("mos-4", 2, 1)) == 2
    floor = ("floor_curve", "train_nll_floor", "floor_cpu_s")
    for path in (tmp_path / "rates").glob("*.json"):  # a rate cell has no floor run: only the chosen one gets it, later
        assert not set(floor) & set(json.loads(path.read_text())), path
        assert path.with_suffix(".pt").exists()  # ... from the stopping-rule weights the rate cell keeps
    for head in ("softmax", "mos-4"):
        rate_cell = json.loads((tmp_path / "rates" / f"{head}-d2-lr{result['rates'][head]:g}.json").read_text())
        cell = next(c for c in result["cells"] if (c["head"], c["d"], c["seed"]) == (head, 2, 1))
        assert rate_cell == {k: v for k, v in cell.items() if k not in floor} and set(floor) <= set(cell)
    assert not list((tmp_path / "partial").iterdir())  # each cell's training checkpoint goes once the cell is whole
    cells = {(c["head"], c["d"]): c for c in result["cells"]}
    assert len(result["cells"]) == 8 and set(cells) == {("softmax", 2), ("softmax", 8), ("mos-4", 2), ("mos-4", 8)}
    assert result["meta"]["trunk_nll"]["valid"] > 0
    for c in result["cells"]:
        assert c["curve"][0]["epoch"] == 0 and math.isfinite(c["test_nll"])
        if c["seed"] == 1:  # --floor-seeds 1: the floor run for seed 1 only
            assert len(c["floor_curve"]) == 3 and c["train_nll_floor"] == min(c["floor_curve"])  # start + 2 epochs
        else:
            assert "floor_curve" not in c and "floor_cpu_s" not in c
    # a softmax over d = 2 projected features: log p = W h + b - log Z(h), a matrix of rank at most d + 2
    for c in result["cells"]:
        if c["head"] == "softmax":
            assert c["spectrum"]["rank"] <= c["d"] + 2 and c["spectrum"]["beyond_bound"] < 1e-20  # rounding only
        else:  # MoS's log-probabilities are not linear in the features: energy past the bound, well above rounding
            assert c["spectrum"]["beyond_bound"] > 1e-12
        measures = bottleneck_map.spectrum_measures(c["spectrum"]["top"], c["d"])  # from the whole spectrum
        if c["head"] == "softmax":  # no rank past the bound at any tolerance; nothing past it but rounding
            assert max(measures["rank_at"].values()) <= c["d"] + 2 and measures["beyond_bound_after_first"] < 1e-20
        else:
            assert measures["beyond_bound_after_first"] > 1e-12
    assert max(c["spectrum"]["rank"] for c in result["cells"]) > 4  # the measure is not stuck at the d = 2 bound
    # the page: the primary test's slope (4 paired points for MoS-4; Mixtape did not run), the tables, the plot
    from studies.bottleneck_map import analysis as bottleneck_analysis
    from studies.bottleneck_map import report as bottleneck_report

    docs = tmp_path / "docs"
    docs.mkdir()
    text = bottleneck_report.main(
        ["--results", str(tmp_path), "--docs", str(docs), "--records", str(docs)], log=lambda *_: None
    )
    slopes = {
        s["head"]: s for s in bottleneck_analysis.slope_test(json.loads((docs / "bottleneck_map.json").read_text()))
    }
    # two d values: the primary test (d the unit, tested by hand in test_bottleneck_report.py) needs three
    assert slopes["mos-4"]["dims"] == [2, 8] and slopes["mos-4"]["slope"] is None
    assert "| mos-4 | 2, 8 | 2 | too few d values (3 needed) |" in text
    assert "| mixtape | none (0 of 2) | 0 of 2 | too few d values" in text  # a primary head this run left out
    derived = json.loads((docs / "bottleneck_map-numbers.json").read_text())
    assert derived["cells"] == {"finished": 8, "diverged": [], "missing": 0}
    assert "## Learning rates" in text and (docs / "bottleneck_map-spectra.png").exists()
    spectrum = json.loads((docs / "bottleneck_map.json").read_text())["cells"][0]["spectrum"]["top"]
    assert 0 < len(spectrum) <= 2 + 10
    # the committed json's measures: the run's whole spectra's, not those of the d + 10 values it keeps
    raw = {(c["head"], c["d"], c["seed"]): c["spectrum"]["top"] for c in result["cells"]}
    for c in json.loads((docs / "bottleneck_map.json").read_text())["cells"]:
        whole = bottleneck_map.spectrum_measures(raw[(c["head"], c["d"], c["seed"])], c["d"])
        assert {k: c["spectrum"][k] for k in whole} == whole
        assert len(raw[(c["head"], c["d"], c["seed"])]) > c["d"] + 10  # (so a measure of the cut one would differ)
    floors = text.split("## What each head can express")[1].split("## Numerical rank")[0]
    assert "| softmax | " in floors and floors.count(" (1) |") == 4  # one seed per (head, d), not two
    assert "| log10 share past d + 2 |" in text
    assert "## The primary test" in text and "| mos-4 | 8 | 2 |" in text and (docs / "bottleneck_map.png").exists()
    assert "## Trained jointly" not in text  # no joint cells: no section
    # the joint-training check beside the frozen cells of the same head, d and seed
    joint = tmp_path / "joint" / "cells"
    joint.mkdir(parents=True)
    for head, test_ppl in (("softmax", 100.0), ("mos-4", 90.0)):
        cell = {"head": head, "d": 2, "seed": 1, "lr": 0.0025, "epoch_cap": 3, "ppl": {"valid": 1.0, "test": test_ppl}}
        cell["command"] = "fairseq-train bin --patience 3 --max-epoch 3"
        (joint / f"{head}-d2-s1.json").write_text(json.dumps(cell))
    text = bottleneck_report.main(
        ["--results", str(tmp_path), "--docs", str(docs), "--records", str(docs), "--joint", str(tmp_path / "joint")],
        log=lambda *_: None,
    )
    cells = {(c["head"], c["d"], c["seed"]): c for c in result["cells"]}
    frozen_diff = cells[("mos-4", 2, 1)]["test_nll"] - cells[("softmax", 2, 1)]["test_nll"]
    frozen_ppl = math.exp(cells[("mos-4", 2, 1)]["test_nll"])
    assert f"| mos-4 | 2 | 1 | 90.00 | {frozen_ppl:.2f} | {math.log(0.9):+.4f} | {frozen_diff:+.4f} |" in text
    assert "--epochs 3 --lr 0.0025" in text
    # a new machine: --restore copies the committed cells into a fresh --out when the trunk is the same, none runs
    page, fresh = docs / "bottleneck_map.json", argv[: argv.index("--out") + 1] + [str(tmp_path / "fresh")]
    fresh += argv[argv.index("--out") + 2 :]
    monkeypatch.setattr(bottleneck_map, "run_cell", lambda *a, **k: pytest.fail("a committed cell ran again"))
    restored = bottleneck_map.main(fresh + ["--restore", str(page)], log=lambda *_: None)
    key = lambda c: (c["head"], c["d"], c["seed"])  # noqa: E731
    assert json.dumps(sorted(restored["cells"], key=key), sort_keys=True) == json.dumps(
        sorted(json.loads(page.read_text())["cells"], key=key), sort_keys=True
    )
    other = bottleneck_map.parse_args(fresh + ["--restore", str(page), "--out", str(tmp_path / "other")])
    lines = []  # another trunk (its NLL differs), or other options: nothing comes back
    nll = restored["meta"]["trunk_nll"]
    assert bottleneck_map.restore(other, {"trunk_nll": {**nll, "valid": nll["valid"] + 1e-6}}, lines.append) == 0
    other.max_epochs += 1
    assert bottleneck_map.restore(other, restored["meta"], lines.append) == 0
    assert "another trunk" in lines[0] and "other max_epochs" in lines[1]
    # the same checkpoint file (its md5) is the same trunk, whatever its features round to on another machine
    md5 = restored["meta"]["trunk_md5"]
    assert bottleneck_map.same_trunk(restored["meta"], {"trunk_md5": md5, "trunk_nll": {"valid": 0.0, "test": 0.0}})
    # another trunk with --carry-rates: its rate search alone comes back, each rate cell marked with its trunk's md5
    carry = bottleneck_map.parse_args(
        fresh + ["--restore", str(page), "--out", str(tmp_path / "carry"), "--carry-rates"]
    )
    moved = bottleneck_map.restore(carry, {"trunk_md5": "x", "trunk_nll": {**nll, "valid": 0.0}}, lines.append)
    rate_files = sorted((tmp_path / "carry" / "rates").iterdir())
    assert moved == len(json.loads(page.read_text())["rate_cells"]) == len(rate_files) > 0
    assert not (tmp_path / "carry" / "cells").exists() and "its rates carry over, no cell" in lines[-1]
    assert all(json.loads(f.read_text())["trunk_md5"] == md5 for f in rate_files)
    # resumable: a rerun reads every cell and rate it finds
    monkeypatch.setattr(bottleneck_map, "run_cell", lambda *a, **k: pytest.fail("a finished cell ran again"))
    again = bottleneck_map.main(argv, log=lambda *_: None)
    assert again["cells"] == result["cells"]
    # a chosen rate cell of the map's first code (a floor from a fresh start, curve points without CPU times, a
    # float32 spectrum, no weights kept): its seed-1 cell runs again whole, as every cell runs now, and both count
    rate = tmp_path / "rates" / f"softmax-d2-lr{result['rates']['softmax']:g}.json"
    old = json.loads(rate.read_text())
    del old["spectrum"]["beyond_bound"]
    old["curve"] = [{k: v for k, v in c.items() if "cpu" not in k} for c in old["curve"]]
    old.update(floor_curve=[9.0, 8.0], train_nll_floor=8.0, floor_cpu_s=1.0)
    rate.write_text(json.dumps(old))
    rate.with_suffix(".pt").unlink()
    (tmp_path / "cells" / "softmax-d2-s1.json").unlink()
    monkeypatch.setattr(bottleneck_map, "run_cell", run_cell)
    lines = []
    again = bottleneck_map.main(argv, log=lines.append)
    before, after = (
        next(c for c in r if (c["head"], c["d"], c["seed"]) == ("softmax", 2, 1))
        for r in (result["cells"], again["cells"])
    )
    assert after["rate_cell_trained_again"] and any("weights are not here" in x for x in lines)
    same = ("test_nll", "spectrum", "floor_curve")  # the same run, step for step, as the first time
    assert all(after[k] == before[k] for k in same) and "beyond_bound" in after["spectrum"]
    assert [c["valid_nll"] for c in after["curve"]] == [c["valid_nll"] for c in before["curve"]]
    obj = {**again, "rate_cells": [json.loads(p.read_text()) for p in (tmp_path / "rates").glob("*.json")]}
    counted = sum(c["cpu_s"] + c.get("floor_cpu_s", 0) for c in again["cells"])  # and the 3 rate cells not copied
    counted += sum(
        c["cpu_s"] + c.get("floor_cpu_s", 0)
        for c in obj["rate_cells"]
        if c["head"] != "mos-4" or c["lr"] != result["rates"]["mos-4"]
    )
    assert bottleneck_analysis.cells_cpu_hours(obj) == pytest.approx(counted / 3600)


def test_two_processes_share_one_map_by_claiming_its_cells(trunk, tmp_path, monkeypatch):
    """The same command run twice shares the map: a cell or rate cell that another running process holds (its lock)
    is passed over, a head's seed cells wait for its rate, and a process with nothing left to claim waits and then
    reads the other's cells; a lock whose process has ended is taken over."""
    import os
    import socket
    import subprocess

    from recipes.reproduce.engine import results as result_files

    checkpoint, bin_dir = trunk
    monkeypatch.setattr(bottleneck_map, "BPTT", 12)
    argv = ["--trunk", str(checkpoint), "--data", str(bin_dir), "--out", str(tmp_path), "--heads", "softmax", "mos-4"]
    argv += ["--dims", "2", "8", "--seeds", "2", "--rates", "1e-2", "3e-2", "--rate-d", "2", "--quiet"]
    args = bottleneck_map.parse_args(argv)

    def fake_cell(head, d, seed, lr):  # softmax best at 1e-2, MoS-4 at 3e-2
        valid = 5.0 + (lr if head == "softmax" else -lr)
        return {"head": head, "d": d, "seed": seed, "lr": lr, "valid_nll": valid, "spectrum": {"beyond_bound": 0.0}}

    ran = []
    monkeypatch.setattr(
        bottleneck_map, "run_cell", lambda a, h, d, s, lr, *_, **k: ran.append((h, d, s, lr)) or fake_cell(h, d, s, lr)
    )
    host, ended = socket.gethostname(), subprocess.Popen(["true"])
    ended.wait()
    held = {  # another running process (this test's parent) holds two; a killed one left the third
        bottleneck_map.rate_cell_path(args, "mos-4", 2, 3e-2): (os.getppid(), fake_cell("mos-4", 2, 1, 3e-2)),
        bottleneck_map.cell_path(args, "softmax", 8, 2): (os.getppid(), fake_cell("softmax", 8, 2, 1e-2)),
        bottleneck_map.cell_path(args, "mos-4", 8, 2): (ended.pid, None),
    }
    for path, (pid, _) in held.items():
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path + ".lock", "w") as f:
            f.write(f"{host} {pid}")
    with result_files.claimed(next(iter(held))) as mine:
        assert not mine  # a running process's claim
    slept = []

    def other_process_finishes(seconds):  # the wait: meanwhile the other process saves its two cells
        slept.append(seconds)
        for path, (_, cell) in held.items():
            if cell:
                result_files.save_json(path, cell)
                os.remove(path + ".lock")

    monkeypatch.setattr(bottleneck_map.time, "sleep", other_process_finishes)
    lines = []
    result = bottleneck_map.main(argv, log=lines.append)
    assert slept == [bottleneck_map.WAIT_SECONDS] and "waiting for 5 cell(s) another process holds" in "\n".join(lines)
    # the other process's: its rate cell (the fake keeps no weights, so the seed-1 cell trains once, here) and its cell
    assert ran.count(("mos-4", 2, 1, 3e-2)) == 1 and ("softmax", 8, 2, 1e-2) not in ran
    assert ("mos-4", 8, 2, 3e-2) in ran  # taken over from the process that ended
    assert result["rates"] == {"softmax": 1e-2, "mos-4": 3e-2} and len(result["cells"]) == 8
    assert next(c for c in result["cells"] if (c["head"], c["d"], c["seed"]) == ("softmax", 8, 2)) == fake_cell(
        "softmax", 8, 2, 1e-2
    )
    assert not list(tmp_path.rglob("*.lock"))  # every claim let go


def test_map_refuses_a_d_above_the_features_width(trunk, tmp_path):
    checkpoint, bin_dir = trunk
    with pytest.raises(SystemExit, match=r"--dims \[32\]: above the trunk's feature width 16"):
        bottleneck_map.main(
            [
                "--trunk",
                str(checkpoint),
                "--data",
                str(bin_dir),
                "--out",
                str(tmp_path),
                "--dims",
                "8",
                "32",
                "--quiet",
            ],
            log=lambda *_: None,
        )


# ----------------------------------------------------------------------------- the joint-training check
def test_the_joint_check_trains_the_tables_cell_with_a_d_unit_last_layer_and_an_untied_head(tmp_path):
    """studies.bottleneck_map.joint: the lm-ptb table's command for the head, only the last layer's units, the epoch cap
    and the untied head changed (so softmax's logits have rank <= d + 1, and MoS's contexts are d-dimensional)."""
    from studies.bottleneck_map import joint as bottleneck_joint
    from recipes.reproduce import get_table
    from recipes.reproduce.__main__ import parse_args as table_parse_args

    (tmp_path / "dict.txt").write_text("a 1\n")
    args = bottleneck_joint.parse_args(["--bin", str(tmp_path), "--epochs", "2", "--lr", "0.004"])
    table = get_table("lm-ptb")
    table_args = table_parse_args(["lm-ptb", "--scale", "mini", "--heads", "softmax", "mos-4"])
    for variant in table.variants(table_args):
        base = table.train_command(str(tmp_path), variant, 3, "SAVE", table_args, 0.004)
        cmd = bottleneck_joint.joint_command(table, variant, 8, 3, "SAVE", args, table_args)
        assert cmd[-1] == "--untie-weights" and len(cmd) == len(base) + 1
        changed = {base[i - 1]: cmd[i] for i in range(len(base)) if cmd[i] != base[i]}
        assert changed == {"--nhidlast": "8", "--max-epoch": "2"}, changed
    with pytest.raises(SystemExit):
        bottleneck_joint.parse_args(["--bin", str(tmp_path / "nothing")])
    with pytest.raises(SystemExit):
        bottleneck_joint.parse_args(["--bin", str(tmp_path), "--dims", "0"])


def test_the_joint_check_restores_the_pages_cells_run_with_its_rate_and_cap(tmp_path):
    """--restore: a new machine writes the committed joint cells back (those run with the same --lr and --epochs, of
    the heads, d values and seeds asked) and trains only the missing ones; a cell already there is kept."""
    from studies.bottleneck_map import joint as bottleneck_joint

    def cell(head, d, seed=1, lr=0.0025, cap=3):
        return {"head": head, "d": d, "seed": seed, "lr": lr, "epoch_cap": cap, "ppl": {"valid": 9.0, "test": 8.0}}

    page = tmp_path / "page.json"
    committed = [cell("softmax", 4), cell("mos-4", 4), cell("softmax", 128, lr=0.01), cell("softmax", 8, cap=2)]
    committed += [cell("mos-4", 4, seed=2), cell("plif", 4), cell("softmax", 16)]
    page.write_text(json.dumps({"joint": committed}))
    out = tmp_path / "out"
    (out / "cells").mkdir(parents=True)
    kept = dict(cell("softmax", 4), ppl={"valid": 1.0, "test": 1.0})
    (out / "cells" / "softmax-d4-s1.json").write_text(json.dumps(kept))
    argv = ["--bin", str(tmp_path), "--out", str(out), "--dims", "4", "8", "128", "--restore", str(page)]
    (tmp_path / "dict.txt").write_text("a 1\n")
    args = bottleneck_joint.parse_args(argv)
    assert bottleneck_joint.restore(args, log=lambda *_: None) == 1  # mos-4 d = 4 seed 1 alone
    assert sorted(p.name for p in (out / "cells").iterdir()) == ["mos-4-d4-s1.json", "softmax-d4-s1.json"]
    assert json.loads((out / "cells" / "mos-4-d4-s1.json").read_text()) == cell("mos-4", 4)
    assert json.loads((out / "cells" / "softmax-d4-s1.json").read_text()) == kept  # not overwritten
    assert bottleneck_joint.restore(bottleneck_joint.parse_args(argv[:-2]), log=lambda *_: None) == 0


@pytest.mark.slow  # two fairseq trainings and four scorings: about a minute
def test_the_joint_check_runs_end_to_end_and_resumes(data, tmp_path):
    from fairseq import checkpoint_utils

    from studies.bottleneck_map import joint as bottleneck_joint

    argv = ["--bin", str(data / "lm-bin"), "--out", str(tmp_path), "--dims", "4", "--epochs", "1", "--quiet"]
    records = bottleneck_joint.main(argv, log=lambda *_: None)
    assert [(r["head"], r["d"]) for r in records] == [("softmax", 4), ("mos-4", 4)]
    for r in records:
        assert set(r["ppl"]) == {"valid", "test"} and all(1 < p < 1e4 for p in r["ppl"].values())
        models, _, _ = checkpoint_utils.load_model_ensemble_and_task(
            [str(tmp_path / "cells" / f"{r['head']}-d4-s1" / "checkpoints" / "checkpoint_best.pt")]
        )
        head = models[0].decoder.head
        assert head.weight.shape[1] == 4 and head.config.hidden_size == 4  # the head reads 4 units, untied
        assert head.weight.data_ptr() != models[0].decoder.embed_tokens.weight.data_ptr()
    assert bottleneck_joint.main(argv, log=lambda *_: None) == records  # finished cells are read, not rerun


def test_a_collection_without_cells_leaves_the_committed_page_json_as_it_was(tmp_path):
    from studies.bottleneck_map import report as bottleneck_report

    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "bottleneck_map.json").write_text('{"committed": true}')
    (tmp_path / "run").mkdir()
    with pytest.raises(SystemExit, match="no cells"):
        bottleneck_report.main(
            ["--results", str(tmp_path / "run"), "--docs", str(docs), "--records", str(docs)], log=lambda *_: None
        )
    assert (docs / "bottleneck_map.json").read_text() == '{"committed": true}'


def test_the_floor_run_goes_on_from_the_cells_weights_as_the_plain_loop_and_after_a_stop(tmp_path, monkeypatch):
    """The floor run (resumable through ``train_head_on_states``) gives bitwise the floor curve of the plain loop: the
    cell's stopping-rule weights trained on with a fresh Adam at its rate, shuffled by its seed, the train sample's NLL
    at the start and after every epoch; stopped mid-run, a rerun goes on to the same curve."""
    import argparse

    from hf_heads.hf.upgrade import States, train_epoch

    g = torch.Generator().manual_seed(0)
    states = torch.randn(640, 6, generator=g)
    targets = (states[:, :2].sum(1) > 0).long() * 5 + torch.randint(0, 5, (640,), generator=g)
    data = {"train": States(states, targets, 1)}
    args = argparse.Namespace(
        out=str(tmp_path), vocab=12, floor_epochs=3, floor_sample=200, batch_tokens=64, quiet=True
    )
    name, seed, lr, d = "mos-4", 2, 3e-2, 3
    head, options = bottleneck_map.HEADS[name]
    torch.manual_seed(7)  # the cell's weights at its stopping rule (here: other weights than the seed's own)
    start = bottleneck_map.ProjectedHead(6, d, 12, head, options).state_dict()
    # the reference: the plain loop
    torch.manual_seed(seed)
    module = bottleneck_map.ProjectedHead(6, d, 12, head, options)
    module.load_state_dict(start)
    optimizer = torch.optim.Adam(module.parameters(), lr=lr)
    order = torch.Generator().manual_seed(seed)
    sample = States(states[:200], targets[:200], 1)
    reference = [bottleneck_map.train_nll(module, sample)]
    for _ in range(3):
        train_epoch(module, data["train"], optimizer, order, 64)
        reference.append(bottleneck_map.train_nll(module, sample))

    steps, step = {"n": 0}, torch.optim.Adam.step

    def stopping(self, *a, **k):
        if steps["n"] == 14:  # in the second epoch (10 steps an epoch)
            raise KeyboardInterrupt
        steps["n"] += 1
        return step(self, *a, **k)

    monkeypatch.setattr(torch.optim.Adam, "step", stopping)
    with pytest.raises(KeyboardInterrupt):
        bottleneck_map.floor_run(args, name, d, seed, lr, data, start)
    monkeypatch.setattr(torch.optim.Adam, "step", step)
    checkpoint = tmp_path / "partial" / "mos-4-d3-s2-lr0.03-floor.pt"
    assert checkpoint.exists() and torch.load(checkpoint, weights_only=False)["epoch"] == 2
    torch.manual_seed(99)  # another process's random state: the checkpoint's is restored
    floor = bottleneck_map.floor_run(args, name, d, seed, lr, data, start)
    assert floor["floor_curve"] == reference and floor["train_nll_floor"] == min(reference)
    assert floor["floor_cpu_s"] > 0
