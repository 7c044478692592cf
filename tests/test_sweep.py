"""The mini cells' stopping rule and learning-rate sweep (recipes/reproduce/engine/sweep.py): curves from fairseq logs,
the stopping decision, the choice of a rate on valid loss, the grid growing past an end that is best, and the
table loop that runs the sweep, the chosen rate's seeds, and resumes."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from recipes.reproduce.engine import results as result_files
from recipes.reproduce.engine import sweep as sweep_rules
from recipes.common import runtime
from recipes.reproduce.analysis import collect, facts
from recipes.reproduce.analysis import compare as head_comparison
from recipes.reproduce.report import layout as tables


def _log(points, walls):
    """A fairseq-train json log: a valid line then the epoch's train line, per epoch."""
    lines = []
    for (epoch, updates, loss), wall in zip(points, walls):
        lines.append(
            f'2026 | INFO | valid | {{"epoch": {epoch}, "valid_loss": "{loss}", "valid_nll_loss": '
            f'"{loss - 1:.3f}", "valid_num_updates": "{updates}"}}'
        )
        lines.append(
            f'2026 | INFO | train | {{"epoch": {epoch}, "train_loss": "9", "train_train_wall": "{wall}", '
            f'"train_wall": "{wall + 1}"}}'
        )
    return "\n".join(lines) + "\n"


def test_curve_sums_the_training_seconds_and_keeps_the_last_line_of_a_resumed_epoch():
    text = _log([(1, 10, 5.0), (2, 20, 4.0)], [30, 20]) + _log([(2, 20, 4.5), (3, 30, 3.5)], [25, 10])
    curve = sweep_rules.parse_curve(text)
    assert [p["epoch"] for p in curve] == [1, 2, 3]
    assert [p["loss"] for p in curve] == [5.0, 4.5, 3.5]  # epoch 2 again after a resume: its last line counts
    assert [p["seconds"] for p in curve] == [30.0, 55.0, 65.0]
    assert curve[0]["nll_loss"] == 4.0 and curve[2]["updates"] == 30


def test_stopping_rule_patience_and_cap():
    rule = sweep_rules.StopRule(patience=2, max_epochs=5)
    curve = [{"epoch": e, "loss": loss} for e, loss in enumerate([5.0, 4.0, 4.1, 4.0], 1)]
    assert sweep_rules.best_point(curve)["epoch"] == 2  # a tie keeps the first best, as fairseq's checkpoint_best
    assert sweep_rules.stopped(curve, rule) == "patience"  # epochs 3 and 4 did not improve on 4.0
    assert sweep_rules.stopped(curve[:3], rule) is None
    improving = [{"epoch": e, "loss": 10.0 - e} for e in range(1, 6)]
    assert sweep_rules.stopped(improving, rule) == "max_epochs" and sweep_rules.stopped(improving[:4], rule) is None
    assert rule.fairseq_args() == ["--max-epoch", "5", "--patience", "2"]
    with pytest.raises(ValueError, match="patience must be >= 1"):
        sweep_rules.StopRule(patience=0, max_epochs=5)


def test_the_rate_of_the_lowest_valid_loss_is_chosen_and_the_grid_grows_past_a_best_end():
    assert sweep_rules.grid(0.005, 2.0) == [0.0025, 0.005, 0.01]
    assert sweep_rules.choose_lr({0.0025: 4.2, 0.005: 4.1, 0.01: 4.3}) == 0.005
    assert sweep_rules.choose_lr({0.0025: 4.1, 0.005: 4.1}) == 0.0025  # a tie: the smaller rate
    rates = [0.0025, 0.005, 0.01]
    assert sweep_rules.extend_grid(rates, {0.0025: 4.2, 0.005: 4.1, 0.01: 4.3}, 2.0, 5) is None  # inside: done
    assert sweep_rules.extend_grid(rates, {0.0025: 4.2, 0.005: 4.1, 0.01: 4.0}, 2.0, 5) == 0.02
    assert sweep_rules.extend_grid(rates, {0.0025: 4.0, 0.005: 4.1, 0.01: 4.3}, 2.0, 5) == 0.00125
    # no factor: the grid's own step at the end the best sits at (1e-4 / 3e-4 / 1e-3: x10/3 up, /3 down)
    uneven = [1e-4, 3e-4, 1e-3]
    assert sweep_rules.extend_grid(uneven, {1e-4: 5, 3e-4: 4, 1e-3: 3}, None, 5) == pytest.approx(1e-3 * 10 / 3)
    assert sweep_rules.extend_grid(uneven, {1e-4: 3, 3e-4: 4, 1e-3: 5}, None, 5) == pytest.approx(1e-4 / 3)
    assert sweep_rules.extend_grid([1e-3], {1e-3: 3}, None, 5) is None  # one rate: no step to take
    assert sweep_rules.extend_grid(rates, {0.0025: 4.0, 0.005: 4.1}, 2.0, 5) is None  # a cell is missing: wait for it
    assert (
        sweep_rules.extend_grid(rates + [0.02, 0.04], {r: 5.0 - r for r in rates + [0.02, 0.04]}, 2.0, 5) is None
    )  # cap
    with pytest.raises(ValueError, match="no finished sweep cell"):
        sweep_rules.choose_lr({})


def test_loss_within_a_time_budget():
    curve = [
        {"epoch": 1, "seconds": 30.0, "loss": 5.0},
        {"epoch": 2, "seconds": 60.0, "loss": 4.0},
        {"epoch": 3, "seconds": 90.0, "loss": 4.2},
    ]
    assert sweep_rules.within(curve, "seconds", 65.0) == 4.0 and sweep_rules.within(curve, "seconds", 200.0) == 4.0
    assert sweep_rules.within(curve, "seconds", 10.0) is None


class FakeTable:
    """The sweep loop of recipes.reproduce.engine.table.Table with cells that 'train' instantly: the valid loss of a
    cell is a function of its rate (best at 0.01 for mixtape, 0.005 for softmax) and seed."""

    def __new__(cls, best):
        from recipes.reproduce.engine.table import Table

        class Fake(Table):
            name, metric, description = "fake", "bleu", "fake table"
            mini_stop = sweep_rules.StopRule(patience=2, max_epochs=4)
            mini_lr = 0.005
            cost_columns = False
            trained, scored, sweep_seen = [], [], []

            def variants(self, args):
                from recipes.reproduce.engine.variants import Variant

                return [Variant("softmax", "softmax"), Variant("mixtape", "mixtape")]

            def seeds_for(self, variant, args):
                return [1, 2, 3] if variant.name == "softmax" else [1, 2]

            def prepare(self, runner, args, table_dir):
                return {}

            def dataset(self, args):
                return "fake"

            def paper_for(self, variant, split):
                return None

            def cell_config(self, variant, seed, args, lr=None):
                return {
                    "table": self.name,
                    "head": variant.name,
                    "options": {},
                    "seed": seed,
                    "scale": "mini",
                    "lr": lr,
                    "stop": self.stop_rule(args).as_dict(),
                }

            def train_cell(self, runner, prepared, variant, seed, args, table_dir, label, lr=None):
                self.trained.append((variant.name, lr, seed))
                self.sweep_seen.append(result_files.load_json(table_dir + "/sweep.json"))
                loss = 4.0 + abs(lr - best[variant.name]) * 100 + seed / 100
                log = result_files.cell_dir(table_dir, variant.name, seed, lr) + "/train.log"
                with open(log, "w") as f:
                    f.write(
                        _log(
                            [(1, 10, loss + 1), (2, 20, loss), (3, 30, loss + 0.1), (4, 40, loss + 0.2)],
                            [10, 10, 10, 10],
                        )
                    )
                return self.trained_record(table_dir, variant, seed, args, log, ["train"], lr)

            def score_cell(self, runner, prepared, variant, seed, args, table_dir, label, record):
                self.scored.append((variant.name, record["lr"], seed))
                return {"test": 30.0 - record["best"]["loss"]}, ["score"]

        return Fake()


def _args(tmp_path, **kw):
    return SimpleNamespace(
        **{
            "out": str(tmp_path),
            "scale": "mini",
            "dry_run": False,
            "quiet": True,
            "no_costs": True,
            "keep_checkpoints": False,
            "lrs": None,
            "patience": None,
            "max_epochs": None,
            "seeds": None,
            "lr_from": None,
            "max_rates": None,
            **kw,
        }
    )


def test_table_sweeps_every_head_then_trains_the_seeds_at_the_chosen_rate_and_resumes(tmp_path):
    table = FakeTable({"softmax": 0.005, "mixtape": 0.01})
    logs = []
    rows = table.run(_args(tmp_path), log=logs.append)
    # seed 1 at the grid 0.0025 / 0.005 / 0.01; mixtape's best is the top end: the grid grows to 0.02 (worse)
    sweep = [c for c in table.trained if c[2] == 1]
    assert sweep == [
        ("softmax", 0.0025, 1),
        ("softmax", 0.005, 1),
        ("softmax", 0.01, 1),
        ("mixtape", 0.0025, 1),
        ("mixtape", 0.005, 1),
        ("mixtape", 0.01, 1),
        ("mixtape", 0.02, 1),
    ]
    assert [c for c in table.trained if c[2] > 1] == [
        ("softmax", 0.005, 2),
        ("mixtape", 0.01, 2),
        ("softmax", 0.005, 3),
    ]
    # every cell is scored when it finishes (a cell restored on another machine needs no checkpoint), the sweep's
    # too; the rate is chosen on the valid loss (below), the test scores of the other rates are never read
    assert table.scored == sweep + [("softmax", 0.005, 2), ("mixtape", 0.01, 2), ("softmax", 0.005, 3)]
    # sweep.json after every cell: a run cut short is committed as far as it went (heads not chosen yet: None)
    assert table.sweep_seen[:2] == [
        None,
        {
            "softmax": {"rates": [0.0025, 0.005, 0.01], "chosen": None},
            "mixtape": {"rates": [0.0025, 0.005, 0.01], "chosen": None},
        },
    ]
    chosen = json.load(open(tmp_path / "fake" / "sweep.json"))
    assert chosen == {
        "softmax": {"rates": [0.0025, 0.005, 0.01], "chosen": 0.005},
        "mixtape": {"rates": [0.0025, 0.005, 0.01, 0.02], "chosen": 0.01},
    }
    assert {r["head"]: r["seeds"] for r in rows} == {"softmax": [1, 2, 3], "mixtape": [1, 2]}
    record = result_files.load_cell(str(tmp_path / "fake"), "mixtape", 2, 0.01)
    assert record["best"]["epoch"] == 2 and record["stopped"] == "patience" and record["bleu"] == {"test": 30.0 - 4.02}
    assert record["curve"][-1]["seconds"] == 40.0
    # a rerun trains and scores nothing again
    table.trained.clear(), table.scored.clear()
    again = table.run(_args(tmp_path), log=logs.append)
    assert table.trained == [] and table.scored == [] and again == rows


def test_a_given_grid_grows_past_a_best_end_only_up_to_max_rates(tmp_path, capsys):
    """--lrs alone is the grid (a best at its end stays there); with --max-rates it grows as the table's grid does."""
    from recipes.reproduce.__main__ import parse_args

    table = FakeTable({"softmax": 0.005, "mixtape": 0.04})
    table.run(_args(tmp_path / "fixed", lrs=[0.005, 0.01], seeds=1), log=lambda m: None)
    assert json.load(open(tmp_path / "fixed" / "fake" / "sweep.json"))["mixtape"] == {
        "rates": [0.005, 0.01],
        "chosen": 0.01,
    }
    table.trained.clear()
    table.run(_args(tmp_path / "grown", lrs=[0.005, 0.01], max_rates=3, seeds=1), log=lambda m: None)
    sweep = json.load(open(tmp_path / "grown" / "fake" / "sweep.json"))
    # mixtape's best is beyond the top end: one more rate, then the cap; softmax's best is the lower end: 0.0025 is
    # tried and is worse
    assert sweep == {
        "softmax": {"rates": [0.0025, 0.005, 0.01], "chosen": 0.005},
        "mixtape": {"rates": [0.005, 0.01, 0.02], "chosen": 0.02},
    }
    assert ("mixtape", 0.02, 1) in table.trained and ("softmax", 0.0025, 1) in table.trained
    for argv, message in (
        (["mt-en-de", "--lrs", "0.01", "0.02", "--max-rates", "1"], "below the 2 rates"),
        (["mt-en-fr", "--lr-from", "mt-en-de", "--max-rates", "3"], "--lr-from trains at one"),
        (["mt-en-de", "--max-rates", "0"], "--max-rates must be >= 1"),
    ):
        with pytest.raises(SystemExit):
            parse_args(argv)
        assert message in capsys.readouterr().err


def test_lr_from_trains_each_head_at_another_tables_chosen_rate_without_a_sweep(tmp_path, capsys):
    """--lr-from TABLE: one rate per head, the one TABLE's sweep chose (no grid, no growth), marked in sweep.json and
    in the report's sweep table; a head TABLE never swept, or a table named twice, is an error naming the fix; a run
    of some heads keeps the other heads' sweep entries."""
    from recipes.reproduce.__main__ import parse_args

    result_files.save_json(
        str(tmp_path / "mt-en-de" / "sweep.json"),
        {"softmax": {"rates": [0.005, 0.01], "chosen": 0.01}, "mixtape": {"rates": [0.005, 0.01], "chosen": 0.005}},
    )
    table = FakeTable({"softmax": 0.005, "mixtape": 0.01})
    table.trained.clear(), table.scored.clear()
    table.run(_args(tmp_path, lr_from="mt-en-de"), log=lambda m: None)
    assert sorted(table.trained) == [
        ("mixtape", 0.005, 1),
        ("mixtape", 0.005, 2),
        ("softmax", 0.01, 1),
        ("softmax", 0.01, 2),
        ("softmax", 0.01, 3),
    ]  # not the fake's own best rates
    sweep = json.load(open(tmp_path / "fake" / "sweep.json"))
    assert sweep["softmax"] == {"rates": [0.01], "chosen": 0.01, "from": "mt-en-de"}
    # the borrowed rate is chosen before the first cell trains: a report of the run so far shows it, not "running"
    assert table.sweep_seen[0] == sweep
    assert "| 0.01 (mt-en-de's choice, not swept here) |" in tables.sweep_table(
        [result_files.load_cell(str(tmp_path / "fake"), "softmax", 1, 0.01)], {"softmax": sweep["softmax"]}
    )
    # a head the source table has not chosen a rate for
    result_files.save_json(str(tmp_path / "mt-en-de" / "sweep.json"), {"softmax": {"rates": [0.01], "chosen": 0.01}})
    with pytest.raises(
        SystemExit,
        match=r"has no rate chosen for mixtape; run `python -m recipes.reproduce "
        r"mt-en-de --heads mixtape",
    ):
        table.run(_args(tmp_path, lr_from="mt-en-de"), log=lambda m: None)
    # earlier heads' entries stay when a run names fewer heads: in sweep.json and in results.json
    result_files.save_json(
        str(tmp_path / "fake" / "sweep.json"), {**sweep, "mos-4": {"rates": [0.005], "chosen": 0.005}}
    )
    rows = result_files.load_rows(str(tmp_path / "fake" / "results.json"))
    result_files.save_json(str(tmp_path / "fake" / "results.json"), [{**rows[0], "head": "mos-4"}] + rows)
    again = table.run(_args(tmp_path), log=lambda m: None)
    assert set(json.load(open(tmp_path / "fake" / "sweep.json"))) == {"softmax", "mixtape", "mos-4"}
    assert result_files.load_rows(str(tmp_path / "fake" / "results.json")) == [{**rows[0], "head": "mos-4"}] + again
    assert {r["head"] for r in again} == {"softmax", "mixtape"}  # this run's rows replace theirs
    for argv, message in (
        (["mt-en-fr", "--lr-from", "mt-en-fr"], "names the table itself"),
        (["mt-en-fr", "--lr-from", "mt-en-xx"], "no table 'mt-en-xx'"),
        (["mt-en-fr", "--lr-from", "mt-en-de", "--lrs", "0.01"], "both set the rates"),
    ):
        with pytest.raises(SystemExit):
            parse_args(argv)
        assert message in capsys.readouterr().err


def _cell(head, seed, lr, losses, wall, threads=1, **extra):
    curve = [
        {"epoch": e, "updates": 10 * e, "seconds": wall * e, "loss": loss, "nll_loss": loss}
        for e, loss in enumerate(losses, 1)
    ]
    return {
        "head": head,
        "seed": seed,
        "lr": lr,
        "curve": curve,
        "best": sweep_rules.best_point(curve),
        "stopped": "patience",
        "train_wall_s": wall * len(losses),
        "threads": threads,
        **extra,
    }


def test_sweep_table_equal_compute_and_cpu_hours():

    sweep = {
        "softmax": {"rates": [0.0025, 0.005, 0.01], "chosen": 0.005},
        "mixtape": {"rates": [0.0025, 0.005, 0.01], "chosen": 0.01},
    }
    cells = [
        _cell("softmax", 1, 0.0025, [5, 4.5, 4.6, 4.7], 10),
        _cell("softmax", 1, 0.005, [5, 4.2, 4.3, 4.4], 10),
        _cell("softmax", 1, 0.01, [5, 4.4, 4.5, 4.6], 10),
        _cell("mixtape", 1, 0.0025, [5, 4.6, 4.7, 4.8], 20),
        _cell("mixtape", 1, 0.005, [5, 4.3, 4.4, 4.5], 20),
        _cell("mixtape", 1, 0.01, [5, 4.1, 4.0, 4.2, 4.3], 20),
        _cell("softmax", 2, 0.005, [5, 4.25, 4.3, 4.4], 10),
        _cell("mixtape", 2, 0.01, [5, 4.0, 4.1, 4.2], 20),
    ]
    table = tables.sweep_table(cells, sweep)
    assert (
        "| mixtape | 4.600 (ep 2, patience) | 4.300 (ep 2, patience) | **4.000 (ep 3, patience)** | 0.01 (an end"
        in table
    )
    assert "| softmax | 4.500 (ep 2, patience) | **4.200 (ep 2, patience)** | 4.400 (ep 2, patience) | 0.005 |" in table
    spent = head_comparison.cpu_hours(cells, sweep)
    assert spent["chosen"] == pytest.approx((40 + 100 + 40 + 80) / 3600) and spent["total"] == pytest.approx(
        sum(c["train_wall_s"] for c in cells) / 3600
    )
    # a cell whose CPU time was recorded counts it, not its (shared-core) wall-clock times threads
    measured = [{**c, "cpu_s": 3.6} if c["head"] == "mixtape" else c for c in cells]
    spent = head_comparison.cpu_hours(measured, sweep)
    assert spent["total"] == pytest.approx((4 * 3.6 + 40 + 40 + 40 + 40) / 3600)
    assert spent["wall"] == pytest.approx(160 / 3600) and runtime.cpu_seconds(measured[-1]) / 3600 == pytest.approx(
        0.001
    )
    chosen = [c for c in cells if c["lr"] == sweep[c["head"]]["chosen"]]
    (row,) = head_comparison.equal_compute(chosen)
    # softmax trains 4 epochs: 40 updates, 40 s (seeds 1 and 2); mixtape (20 s an epoch) within 40 s: 4.1 (seed 1,
    # epoch 2), 4.0 (seed 2); within 40 updates: 4.0 and 4.0
    assert row["head"] == "mixtape" and row["seeds"] == 2 and row["seconds"]["softmax"] == 40
    assert row["seconds"]["diff"].mean == pytest.approx(((4.1 - 4.2) + (4.0 - 4.25)) / 2)
    assert row["updates"]["diff"].mean == pytest.approx(((4.0 - 4.2) + (4.0 - 4.25)) / 2)
    assert row["head_seconds_to_best"] == pytest.approx((60 + 40) / 2)
    assert "| mixtape | 2 | 40 | -0.225 [" in tables.equal_compute_table([row])
    assert "| 40 | -0.175 [" in tables.equal_compute_table([row])
    # the same bill by the measured cost per update: mixtape at 2x a softmax update gets 20 updates (epoch 2)
    (costed,) = head_comparison.equal_compute(chosen, {"mixtape": 2.0})
    assert costed["cost"]["diff"].mean == pytest.approx(((4.1 - 4.2) + (4.0 - 4.25)) / 2)
    assert costed["cost"]["ratio"] == 2.0 and costed["updates"] == row["updates"]
    assert "| 20 (2.00x a softmax update) | -0.175 [" in tables.equal_compute_table([costed])
    assert "cost" not in row and "a softmax update" not in tables.equal_compute_table([row])
    assert row["clock"] == "wall" and "training seconds (mean)" in tables.equal_compute_table([row])
    # with every cell's CPU time recorded the bill is CPU seconds: softmax had its core to itself (40 CPU-s in its
    # 40 logged s), mixtape shared one (100 / 80 logged s, 40 CPU-s): in softmax's 40 CPU-s it ran every epoch and
    # reached its best, 4.0, in both seeds (epoch 3 at 24 CPU-s, epoch 2 at 20)
    timed = [{**c, "cpu_s": 40.0} for c in chosen]
    (cpu_row,) = head_comparison.equal_compute(timed)
    assert cpu_row["clock"] == "cpu" and cpu_row["seconds"]["softmax"] == pytest.approx(40.0)
    assert cpu_row["seconds"]["diff"].mean == pytest.approx(((4.0 - 4.2) + (4.0 - 4.25)) / 2)
    assert cpu_row["updates"] == row["updates"] and cpu_row["head_seconds_to_best"] == pytest.approx((24 + 20) / 2)
    assert "within softmax's training CPU seconds (mean)" in tables.equal_compute_table([cpu_row])
    assert (
        head_comparison.equal_compute(timed[:-1] + [{**chosen[-1]}])[0]["clock"] == "wall"
    )  # one cell without: wall-clock


def test_epoch_lead_pairs_each_seed_with_softmax_at_the_epochs_every_seed_validated():

    cells = [
        _cell("softmax", 1, 0.01, [5, 4, 3], 10),
        _cell("softmax", 2, 0.01, [5, 4.5], 10),  # stopped after 2 epochs: epoch 3 is not every seed's
        _cell("mos", 1, 0.01, [4, 3.5, 3.2], 10),
        _cell("mos", 2, 0.01, [4.5, 4.4, 4.3], 10),
        _cell("mos", 3, 0.01, [1, 1], 10),  # no softmax seed 3: not paired, not read
        _cell("plif", 1, 0.01, [5], 10),
    ]
    mos, plif = head_comparison.epoch_lead(cells)
    assert mos["head"] == "mos" and mos["seeds"] == [1, 2] and list(mos["epochs"]) == [1, 2]
    assert mos["epochs"][1] == pytest.approx([4 - 5, 4.5 - 5])  # the NLL's difference (bits)
    assert mos["epochs"][2] == pytest.approx([3.5 - 4, 4.4 - 4.5])
    assert plif["seeds"] == [1] and plif["epochs"] == {1: [0.0]}
    table = tables.epoch_lead_table([mos, plif])
    assert "| head | seeds | epoch 1 | epoch 2 |" in table
    assert "| mos | 2 | -0.750 (-1.000 to -0.500) | -0.300 (-0.500 to -0.100) |" in table
    assert "| plif | 1 | +0.000 | - |" in table  # one seed: no range; an epoch it did not reach: -
    assert tables.epoch_lead_table([]) == ""


def test_bootstrap_of_every_head_and_seed_against_softmax():

    import random

    rng = random.Random(0)
    refs = [" ".join(rng.choice("a b c d e f g h".split()) for _ in range(8)) for _ in range(150)]
    good = [r if i % 5 else "x y z" for i, r in enumerate(refs)]
    bad = [r if i % 2 else "x y z" for i, r in enumerate(refs)]
    hyps = {"softmax": {1: {"t": bad}, 2: {"t": good}}, "mixtape": {1: {"t": good}, 2: {"t": good}}}
    scores = {"softmax": {1: {"t": 40.0}, 2: {"t": 70.0}}, "mixtape": {1: {"t": 70.0}, 2: {"t": 70.0}}}
    out = head_comparison.bootstrap(hyps, {"t": refs}, scores, samples=200)
    assert [(b["head"], b["seed"], b["delta"]) for b in out] == [("mixtape", 1, 30.0), ("mixtape", 2, 0.0)]
    assert out[0]["p"] < 0.05  # a real difference
    table = tables.family_table([], "bleu", out)
    assert table == ""  # no paired rows: nothing to print


def test_report_section_of_a_swept_table(tmp_path):
    """The report shows the sweep, the CPU-hours, the Holm family with the bootstrap column and the equal-compute
    table for a table whose json has a sweep (lm-ptb's numbers, made up)."""
    from recipes.reproduce.report import page

    sweep = {
        "softmax": {"rates": [0.0025, 0.005, 0.01], "chosen": 0.005},
        "mixtape": {"rates": [0.0025, 0.005, 0.01], "chosen": 0.01},
    }
    cells = [_cell("softmax", 1, lr, [5, 4.2 + lr, 4.3, 4.4], 30) for lr in (0.0025, 0.01)]
    cells += [_cell("mixtape", 1, lr, [5, 4.3 + lr, 4.4, 4.5], 20) for lr in (0.0025, 0.005)]
    for s in (1, 2, 3):
        cells.append(_cell("softmax", s, 0.005, [5, 4.2 + s / 100, 4.3, 4.4], 10, ppl={"test": 100.0 + s}))
        cells.append(_cell("mixtape", s, 0.01, [5, 4.0 + s / 100, 4.1, 4.2], 20, ppl={"test": 90.0 + s}))
    rows = [
        result_files.make_row(
            table="lm-ptb",
            dataset="ptb",
            split="test",
            head=h,
            options={},
            metric="ppl",
            values=[b + s for s in (1, 2, 3)],
            seeds=[1, 2, 3],
            paper=None,
            scale="mini",
            command=f"fairseq-train x --output-head {h}",
        )
        for h, b in (("softmax", 100.0), ("mixtape", 90.0))
    ]
    result_files.save_json(
        str(tmp_path / "reproduction" / "lm-ptb.json"),
        {
            "table": "lm-ptb",
            "description": "PTB",
            "notes": "Mini.",
            "rows": rows,
            "cells": cells,
            "costs": None,
            "sweep": sweep,
        },
    )
    (tmp_path / "reproduction" / "lm-ptb-reading.md").write_text("<!-- cells: 10 -->\nMixtape is ahead\nof softmax.\n")
    text = page.build_report(str(tmp_path), str(tmp_path / "reproduction"))
    assert "**Reading.** Mixtape is ahead\nof softmax.\n" in text  # written for the 10 cells there are, as written
    (tmp_path / "reproduction" / "lm-ptb-reading.md").write_text("<!-- cells: 8 -->\nMixtape is ahead.")
    stale = "**Reading.** *(Written when 8 cells had finished; 10 have now: the numbers below may have moved since.)*"
    assert stale + "\n\nMixtape is ahead.\n" in page.build_report(
        str(tmp_path), str(tmp_path / "reproduction")
    )  # the note first, where one starts
    (tmp_path / "reproduction" / "lm-ptb-reading.md").unlink()
    text = page.build_report(str(tmp_path), str(tmp_path / "reproduction"))
    assert "**Reading.**" not in text
    assert (
        "| mixtape | 4.303 (ep 2, patience) | 4.305 (ep 2, patience) | **4.010 (ep 2, patience)** | 0.01 (an end"
        in text
    )
    # the table's training hours, in the derived numbers its reading may cite: the sweep's other rates (softmax 2 x
    # 120 s, mixtape 2 x 80 s) and the chosen rates' seeds (3 x 40 s + 3 x 80 s)
    spent = facts.all_numbers(str(tmp_path / "reproduction"))["lm-ptb"]["cpu_hours"]
    assert spent == pytest.approx({"sweep": 400 / 3600, "chosen": 360 / 3600, "wall": 760 / 3600, "total": 760 / 3600})
    # every seed 10 lower: no spread, p = 0, below 0.05 after Holm
    assert "| mixtape - softmax | test | 3 | -10.00 [-10.00, -10.00] | < 1e-300 | < 1e-300 |" in text
    assert "| mixtape | 3 | 40 |" in text and "previous protocol" not in text
    # the lead per epoch (a perplexity table), in bits: level after epoch 1, 0.2 below at every later epoch
    assert "| head | seeds | epoch 1 | epoch 2 | epoch 3 | epoch 4 |" in text
    lead = "| mixtape | 3 | +0.000 (+0.000 to +0.000) | -0.200 (-0.200 to -0.200) | -0.200 (-0.200 to -0.200) |"
    assert lead in text
    assert "| lm-ptb | 4 | 6 | 0.1 / 0.1 / 0.2 | 0.2 |" in text  # the compute section: 400 s + 360 s, all wall-clock
    assert "| all, with the cells set aside | - | - | - / - / 0.2 | 0.2 |" in text
    # a cell's training time: the chosen rate's seeds (40 s), not the sweep's other rates (120 s)
    assert (
        "| softmax | 3 | 0.005 | patience 3 | 2, 2, 2 | 0.7 |" in text
        and "| mixtape | 3 | 0.01 | patience 3 | 2, 2, 2 | 1.3 |" in text
    )
    assert "CPU minutes" not in text  # none recorded
    obj = result_files.load_json(str(tmp_path / "reproduction" / "lm-ptb.json"))
    for c in obj["cells"]:
        if c["lr"] == {"softmax": 0.005, "mixtape": 0.01}[c["head"]] and c["seed"] < 3:
            c["cpu_s"] = 60.0 * c["seed"]
    result_files.save_json(str(tmp_path / "reproduction" / "lm-ptb.json"), obj)
    text = page.build_report(str(tmp_path), str(tmp_path / "reproduction"))
    assert "| softmax | 3 | 0.005 | patience 3 | 2, 2, 2 | 0.7 | 1.5 (2 of 3) |" in text
    assert "| mixtape | 3 | 0.01 | patience 3 | 2, 2, 2 | 1.3 | 1.5 (2 of 3) |" in text
    for c in obj["cells"]:  # a run too short for fairseq to log a wall time (0.0) still has its CPU time
        if c["head"] == "softmax":
            c["train_wall_s"] = 0.0
    result_files.save_json(str(tmp_path / "reproduction" / "lm-ptb.json"), obj)
    text = page.build_report(str(tmp_path), str(tmp_path / "reproduction"))
    assert "| softmax | 3 | 0.005 | patience 3 | 2, 2, 2 | - | 1.5 (2 of 3) |" in text
    assert "| mixtape | 3 | 0.01 | patience 3 | 2, 2, 2 | 1.3 | 1.5 (2 of 3) |" in text


def test_cells_set_aside_keep_counting_in_the_compute_section(tmp_path):
    """Cells moved aside when a table's mini settings changed: their CPU time where recorded, else their training
    seconds (a resumed run's every process) times their threads, in their own row and in the total."""
    from recipes.reproduce.report import page
    from recipes.reproduce.engine import runner as RN

    aside = tmp_path / "mt-en-de-4096"
    measured = result_files.cell_dir(str(aside), "softmax", 1, 0.02)
    logged = result_files.cell_dir(str(aside), "softmax", 1, 0.01)
    for d in (measured, logged):
        (tmp_path / d).mkdir(parents=True)
    epoch = '| INFO | train | {"epoch": %d, "train_wall": "%d"}\n'
    with open(f"{measured}/train.log", "w") as f:
        f.write("$ fairseq-train a\n" + epoch % (1, 100))
    result_files.save_json(RN.cpu_path(f"{measured}/train.log"), [{"pid": 1, "cpu_s": 720.0, "finished": False}])
    with open(f"{logged}/train.log", "w") as f:  # two processes: 1800 s + 900 s, two threads by its record
        f.write("$ fairseq-train a\n" + epoch % (1, 900) + epoch % (2, 1800) + "$ fairseq-train a\n" + epoch % (3, 900))
    result_files.save_json(
        str(aside / "cells" / "softmax-lr0.01-seed1.json"), {"head": "softmax", "seed": 1, "lr": 0.01, "threads": 2}
    )
    entry = collect.set_aside(str(aside), "mt-en-de", "4096-token batches", str(tmp_path / "reproduction"))
    assert entry["cells"] == 2 and entry["total"] == pytest.approx(0.2 + 1.5) and entry["wall"] == pytest.approx(1.5)
    sweep = {"softmax": {"rates": [0.005], "chosen": 0.005}}
    result_files.save_json(
        str(tmp_path / "reproduction" / "lm-ptb.json"),
        {
            "table": "lm-ptb",
            "description": "PTB",
            "notes": "Mini.",
            "rows": [],
            "costs": None,
            "sweep": sweep,
            "cells": [_cell("softmax", 1, 0.005, [5, 4.2], 1800)],
        },
    )
    text = page.build_report(str(tmp_path), str(tmp_path / "reproduction"))
    assert "| mt-en-de, set aside: 4096-token batches | 2 | - | - / - / 1.7 | 1.5 |" in text
    assert "| the tables' own cells | - | - | - / - / 1.0 | - |" in text
    assert "| all, with the cells set aside | - | - | - / - / 2.7 | 2.5 |" in text
    with pytest.raises(SystemExit, match="no cell's train.log"):
        collect.set_aside(str(tmp_path / "empty"), "mt-en-de", "x", str(tmp_path / "reproduction"))
    # the train splits' plan counts its own set-aside cells in its table (the earlier plan's no longer has them)
    page.main(
        ["--no-collect", "--docs", str(tmp_path), "--records", str(tmp_path / "reproduction")]
        + ["--set-aside", str(aside), "--table", "mt-en-de"]
        + ["--reason", "4096-token batches", "--train-splits"]
    )
    kept = json.loads((tmp_path / "reproduction" / collect.SET_ASIDE).read_text())["mt-en-de-4096"]
    assert kept["plan"] == "train-splits" and kept["total"] == pytest.approx(1.7)
    assert "| mt-en-de, set aside: 4096-token batches | 2 | - |" not in page.build_report(
        str(tmp_path), str(tmp_path / "reproduction")
    )


def test_cells_lost_from_the_train_split_plan_count_in_its_own_compute_table(tmp_path):
    """A set-aside entry of the train splits' plan (cells lost with a machine) counts in that plan's total and
    projection, not in the earlier plan's table."""
    from recipes.reproduce.report import sections

    sweep = {"softmax": {"rates": [0.005], "chosen": 0.005}}
    cell = _cell("softmax", 1, 0.005, [5, 4.2], 1800, data="train.txt", cpu_s=3600.0)
    objs = {"lm-ptb": {"table": "lm-ptb", "sweep": sweep, "seeds_planned": {"softmax": 2}, "cells": [cell]}}
    aside = {
        "old": {"table": "mt-en-de", "reason": "old batches", "cells": 1, "total": 5.0, "wall": 5.0},
        "lost": {"table": "lm-ptb", "plan": "train-splits", "reason": "lost", "cells": "1 unfinished", "total": 0.5},
    }
    text = sections.compute_section(facts.compute_numbers(objs, None, aside), str(tmp_path), 1)
    assert "| lm-ptb, set aside: lost | 1 unfinished | 0.5 |" in text and "old batches" not in text
    # 1.0 (the cell) + 0.5 spent; softmax's second planned seed estimated at its first's 1.0
    assert "| all | - | 1.5 |" in text and "| all, with the seed cells still to train | - | ~2.5 |" in text
    # the earlier plan's table (cells not on the train split) counts the other set-aside entry only
    earlier = {"mt-en-de": {"table": "mt-en-de", "sweep": sweep, "cells": [_cell("softmax", 1, 0.005, [5, 4.2], 1800)]}}
    text = sections.compute_section(facts.compute_numbers(earlier, None, aside), str(tmp_path), 1)
    table = text.split("### The perplexity tables on the train splits")[0]
    assert "| mt-en-de, set aside: old batches | 1 | - | - / - / 5.0 | 5.0 |" in table and "lost" not in table


def test_patience_zero_trains_the_table_cap_without_early_stopping():
    from recipes.reproduce import get_table
    from recipes.reproduce.__main__ import parse_args
    from recipes.reproduce.engine.variants import resolve

    table, variant = get_table("lm-ptb"), resolve(["softmax"], {})[0]
    for argv, epochs, patience in (
        (["lm-ptb"], "5", True),
        (["lm-ptb", "--patience", "0"], "5", False),
        (["lm-ptb", "--patience", "0", "--max-epochs", "7"], "7", False),
    ):
        cmd = table.train_command("bin", variant, 1, "save", parse_args(argv), 0.005)
        assert cmd[cmd.index("--max-epoch") + 1] == epochs and ("--patience" in cmd) == patience


def test_a_cell_made_before_a_default_changed_counts_with_the_old_default():
    """A record without a spec version was made under version 1, when Mixtape's projections were scaled unless
    stated: it stands for a cell that asks for scaled_input=True explicitly, not for one that asks for False, and a
    record made today compares as written."""
    from hf_heads.core.config import SPEC_VERSION

    base = {"table": "lm-ptb", "head": "mixtape", "seed": 1, "lr": 0.01, "stop": {"patience": 3}}
    old = {**base, "registry_head": "mixtape", "options": {"num_gates": 4}}  # no "spec_version": version 1
    assert result_files.same_config(old, {**base, "options": {"num_gates": 4, "scaled_input": True}})
    assert not result_files.same_config(old, {**base, "options": {"num_gates": 4, "scaled_input": False}})
    assert not result_files.same_config(old, {**base, "options": {"num_gates": 4}})  # today's default is the other form
    new = {**old, "spec_version": SPEC_VERSION}
    assert result_files.same_config(new, {**base, "options": {"num_gates": 4}})
    assert not result_files.same_config(new, {**base, "options": {"num_gates": 4, "scaled_input": True}})
    assert not result_files.same_config(
        {**old, "lr": 0.02}, {**base, "options": {"num_gates": 4, "scaled_input": True}}
    )


def test_a_new_machine_restores_only_the_cells_of_the_protocol_the_table_runs_now(tmp_path):
    """The committed lm-ptb json may hold cells of a replaced protocol (no rate, no stopping rule): they do not come
    back beside the new cells; a current cell of any head comes back, also one the run does not name, and with them
    the rows and sweep entries of the heads whose every cell came back, so a run naming one head keeps the others'."""
    from recipes.reproduce import get_table
    from recipes.reproduce.__main__ import parse_args

    table = get_table("lm-ptb")
    args = parse_args(["lm-ptb", "--heads", "softmax"])
    current = [
        {
            **table.cell_config(table.variants(parse_args(["lm-ptb", "--heads", head]))[0], 1, args, 0.005),
            "commands": ["train"],
            "curve": [],
        }
        for head in ("softmax", "mixtape-unscaled")
    ]
    replaced = {k: v for k, v in current[0].items() if k not in ("lr", "stop")}
    assert [table.current(r, args) for r in current + [replaced]] == [True, True, False]
    assert not table.current({**current[0], "head": "no-such-head"}, args)
    old_mixtape = {**replaced, "head": "mixtape", "seed": 1}  # a head whose only cell is of the replaced protocol
    committed = tmp_path / "lm-ptb.json"

    def row(head, ppl):
        return result_files.make_row(
            table="lm-ptb",
            dataset="ptb",
            split="test",
            head=head,
            options={},
            metric="ppl",
            values=[ppl],
            seeds=[1],
            scale="mini",
        )

    sweep = {h: {"rates": [0.005], "chosen": 0.005} for h in ("softmax", "mixtape-unscaled", "mixtape")}
    committed.write_text(
        json.dumps(
            {
                "cells": current + [{**replaced, "seed": 2}, old_mixtape],
                "sweep": sweep,
                "rows": [row("softmax", 300.0), row("mixtape-unscaled", 310.0), row("mixtape", 320.0)],
            }
        )
    )
    run = tmp_path / "run"
    result_files.save_json(str(run / "results.json"), [row("mixtape-unscaled", 305.0)])  # this machine's own row stays
    assert (
        result_files.restore_cells(str(run), str(committed), lambda m: None, wanted=lambda r: table.current(r, args))
        == 2
    )
    assert sorted(f.name for f in (run / "cells").iterdir()) == [
        "mixtape-unscaled-lr0.005-seed1.json",
        "softmax-lr0.005-seed1.json",
    ]
    # the rows and sweep entries of the heads that came back whole (softmax's has a replaced seed-2 cell: not whole)
    assert [(r["head"], r["values"]) for r in result_files.load_rows(str(run / "results.json"))] == [
        ("mixtape-unscaled", [305.0])
    ]
    assert result_files.load_json(str(run / "sweep.json")) == {"mixtape-unscaled": sweep["mixtape-unscaled"]}
    (run / "results.json").unlink()
    committed.write_text(json.dumps({**json.loads(committed.read_text()), "cells": current + [old_mixtape]}))
    result_files.restore_cells(str(run), str(committed), lambda m: None, wanted=lambda r: table.current(r, args))
    assert [r["head"] for r in result_files.load_rows(str(run / "results.json"))] == ["softmax", "mixtape-unscaled"]
    assert sorted(result_files.load_json(str(run / "sweep.json"))) == ["mixtape-unscaled", "softmax"]


def test_a_sweep_cut_short_is_collected_and_reported_as_far_as_it_went(tmp_path):
    """A machine may end mid-sweep: its finished cells are committed (collect.collect from sweep.json, before any
    results.json) and reported as a running sweep; the rows of a replaced protocol are not kept beside it."""
    from recipes.reproduce.report import page

    docs = tmp_path / "docs"
    result_files.save_json(
        str(docs / "reproduction" / "lm-ptb.json"),
        {
            "table": "lm-ptb",
            "description": "PTB",
            "notes": "Old.",
            "cells": [],
            "costs": None,
            "rows": [
                result_files.make_row(
                    table="lm-ptb",
                    dataset="ptb",
                    split="test",
                    head="softmax",
                    options={},
                    metric="ppl",
                    values=[300.0],
                    seeds=[1],
                    scale="mini",
                )
            ],
        },
    )
    table_dir = tmp_path / "results" / "lm-ptb"
    result_files.save_json(str(table_dir / "sweep.json"), {"softmax": {"rates": [0.0025, 0.005, 0.01], "chosen": None}})
    result_files.save_json(
        result_files.cell_path(str(table_dir), "softmax", 1, 0.0025),
        {
            "table": "lm-ptb",
            **_cell("softmax", 1, 0.0025, [5, 4.5, 4.6, 4.7], 10),
            "cpu_s": 30.0,
            "commands": ["fairseq-train x"],
        },
    )
    collect.collect(str(tmp_path / "results"), str(docs / "reproduction"))
    obj = result_files.load_json(str(docs / "reproduction" / "lm-ptb.json"))
    assert obj["rows"] == [] and [c["lr"] for c in obj["cells"]] == [0.0025] and obj["notes"] != "Old."
    text = page.build_report(str(docs), str(docs / "reproduction"))
    assert "| mini, learning-rate sweep running | 1 |" in text  # the overview table (collect wrote the description)
    assert "| softmax | 4.500 (ep 2, patience) | - | - | not yet (sweep running) |" in text
    assert "no finished cells yet" not in text
    assert "| lm-ptb | 1 | 0 | 0.0 / 0.0 / 0.0 | 0.0 |" in text  # counted as the sweep's
    # and a new machine restores it: the cell of the running sweep comes back
    assert (
        result_files.restore_cells(str(tmp_path / "again"), str(docs / "reproduction" / "lm-ptb.json"), lambda m: None)
        == 1
    )


def test_hypotheses_of_a_running_sweep_survive_a_new_machine(tmp_path):
    """mt-en-de's sweep spans machines: seed 1's hypotheses are committed under the cell's name while its head's
    rate is open, come back with the cell on the next machine, and become HEAD-seed1 once the rate is chosen there."""

    docs = tmp_path / "docs"
    hyps = {
        "test_2016_flickr": "ein brauner Hund rennt über die Wiese .\n",
        "test_2017_flickr": "eine Katze schläft auf dem roten Sofa .\n",
    }

    def machine(name, chosen):
        table_dir = tmp_path / name / "mt-en-de"
        for testset, text in hyps.items():
            (table_dir / "data" / "raw").mkdir(parents=True, exist_ok=True)
            (table_dir / "data" / "raw" / f"{testset}.de").write_text(text)
        result_files.save_json(str(table_dir / "sweep.json"), {"softmax": {"rates": [0.005, 0.01], "chosen": chosen}})
        return table_dir

    first = machine("first", None)
    result_files.save_json(
        result_files.cell_path(str(first), "softmax", 1, 0.005),
        {
            "table": "mt-en-de",
            **_cell("softmax", 1, 0.005, [5, 4.5, 4.6], 10),
            "commands": ["train"],
            "bleu": {t: 100.0 for t in hyps},
        },
    )
    (first / "softmax" / "lr0.005" / "seed1").mkdir(parents=True)
    for testset, text in hyps.items():
        (first / "softmax" / "lr0.005" / "seed1" / f"{testset}.hyp").write_text(text)
    collect.collect(str(tmp_path / "first"), str(docs / "reproduction"))
    committed = docs / "reproduction" / "hyps" / "mt-en-de"
    assert sorted(p.name for p in committed.iterdir()) == [f"softmax-lr0.005-seed1.{t}.hyp" for t in sorted(hyps)]
    second = machine("second", 0.005)  # the next machine chose 0.005 after training 0.01
    assert result_files.restore_cells(str(second), str(docs / "reproduction" / "mt-en-de.json"), lambda m: None) == 1
    assert (second / "softmax" / "lr0.005" / "seed1" / "test_2017_flickr.hyp").read_text() == hyps["test_2017_flickr"]
    collect.collect(str(tmp_path / "second"), str(docs / "reproduction"))
    assert sorted(p.name for p in committed.iterdir()) == [f"softmax-seed1.{t}.hyp" for t in sorted(hyps)]
    assert result_files.load_json(str(docs / "reproduction" / "mt-en-de.json"))["lowercased"]["softmax"][
        "test_2016_flickr"
    ]["values"] == [100.0]


def test_valid_loss_plot_uses_the_clock_of_the_equal_compute_table():
    """The plot's seconds are CPU seconds (logged seconds scaled by the cell's CPU time) when every cell recorded
    its CPU time, as the equal-compute table's; wall-clock otherwise, and said so on the axis."""
    from recipes.reproduce.report import plots

    a = _cell("softmax", 1, 0.005, [5, 4.2, 4.3], 10, cpu_s=15.0)  # 30 logged seconds, half a core: 15 CPU-s
    b = _cell("mixtape", 1, 0.01, [5, 4.0, 4.1], 20, cpu_s=60.0)  # 60 logged seconds, all CPU
    points, label = plots.curves_to_plot([a, b])
    assert [p["seconds"] for p in points[0]] == [5.0, 10.0, 15.0] and [p["seconds"] for p in points[1]] == [
        20.0,
        40.0,
        60.0,
    ]
    assert label.startswith("training CPU seconds") and [p["loss"] for p in points[0]] == [5, 4.2, 4.3]
    del b["cpu_s"]  # one cell without its CPU time: every cell on the logged wall-clock
    points, label = plots.curves_to_plot([a, b])
    assert [p["seconds"] for p in points[0]] == [10, 20, 30] and "wall-clock" in label
    old = {"head": "softmax", "seed": 1, "lr": None, "valid_curve": [[10, 5.0], [20, 4.5]]}  # no logged curve
    assert plots.curves_to_plot([old])[0] == [[{"updates": 10, "loss": 5.0}, {"updates": 20, "loss": 4.5}]]


def test_equal_compute_pairs_the_nll_not_the_label_smoothed_loss(tmp_path):
    """A mixture's label-smoothed valid loss can be below softmax's while its NLL is above (the smoothing also
    rewards the probability a head leaves on every word, more of it in a mixture's tail): the equal-compute table
    pairs the NLL, the sweep table shows both, and a table without label smoothing shows the loss alone."""
    from recipes.reproduce.report import sections

    def cell(head, losses, nlls):
        curve = [
            {"epoch": e, "updates": 10 * e, "seconds": 10.0 * e, "loss": loss, "nll_loss": nll}
            for e, (loss, nll) in enumerate(zip(losses, nlls), 1)
        ]
        return {
            "head": head,
            "seed": 1,
            "lr": 0.005,
            "curve": curve,
            "best": sweep_rules.best_point(curve),
            "stopped": "patience",
        }

    softmax = cell("softmax", [4.0, 3.6, 3.7], [2.6, 2.2, 2.25])
    mos = cell("mos-4", [3.9, 3.5, 3.55], [2.7, 2.35, 2.3])  # 0.1 lower loss, 0.1 higher lowest NLL (epoch 3)
    (row,) = head_comparison.equal_compute([softmax, mos])
    assert row["updates"]["diff"].mean == pytest.approx(0.1) and row["seconds"]["diff"].mean == pytest.approx(0.1)
    assert row["head_seconds_to_best"] == 20.0  # the scored checkpoint: the lowest loss, epoch 2
    sweep = {h: {"rates": [0.005], "chosen": 0.005} for h in ("softmax", "mos-4")}
    table = tables.sweep_table([softmax, mos], sweep)
    assert "**3.600, NLL 2.200 (ep 2, patience)**" in table and "**3.500, NLL 2.350 (ep 2, patience)**" in table
    assert sweep_rules.label_smoothed([softmax, mos])
    assert head_comparison.rates_by_nll([softmax, mos], sweep) == {}
    # MoS-4 at 0.01: the lower best loss (3.45 against 0.005's 3.5), chosen; its checkpoint's NLL lower too, or not
    wide = {**sweep, "mos-4": {"rates": [0.005, 0.01], "chosen": 0.01}}
    agrees = {**cell("mos-4", [3.8, 3.45, 3.5], [2.5, 2.30, 2.31]), "lr": 0.01}
    assert head_comparison.rates_by_nll([softmax, mos, agrees], wide) == {}
    disagrees = {**cell("mos-4", [3.8, 3.45, 3.5], [2.5, 2.40, 2.45]), "lr": 0.01}
    assert head_comparison.rates_by_nll([softmax, mos, disagrees], wide) == {"mos-4": 0.005}
    # the report says the NLL check's outcome where a rate was chosen here, and says nothing where all were borrowed
    obj = {"table": "mt-en-fr", "description": "d", "rows": [], "cells": [softmax, mos, disagrees], "sweep": wide}
    assert facts.numbers(obj, facts.table_facts(obj))["nll_rates"] == {"mos-4": 0.005}
    borrowed = {h: {**s, "from": "mt-en-de"} for h, s in sweep.items()}
    text = sections.table_section({**obj, "cells": [softmax, mos], "sweep": borrowed}, str(tmp_path))
    assert "| 0.005 (mt-en-de's choice, not swept here) |" in text
    assert "nll_rates" not in facts.numbers(
        obj | {"cells": [softmax, mos], "sweep": borrowed},
        facts.table_facts(obj | {"cells": [softmax, mos], "sweep": borrowed}),
    )
    plain = [{**c, "curve": [{**p, "nll_loss": p["loss"]} for p in c["curve"]]} for c in (softmax, mos)]
    plain = [{**c, "best": sweep_rules.best_point(c["curve"])} for c in plain]
    assert "**3.600 (ep 2, patience)**" in tables.sweep_table(plain, sweep) and not sweep_rules.label_smoothed(plain)
    assert head_comparison.equal_compute(plain)[0]["updates"]["diff"].mean == pytest.approx(
        -0.1
    )  # no smoothing: the loss


def test_the_overview_says_which_heads_have_their_rate_while_others_sweep():
    from recipes.reproduce.report.sections import status

    row = {"scale": "mini", "head": "softmax", "seeds": [1]}
    sweep = {"softmax": {"chosen": 0.0025}, "mos-4": {"chosen": 0.0025}, "plif": {"chosen": None}}
    table = {"table": "lm-ptb", "rows": [row], "sweep": sweep}
    assert status(table, False) == "mini, running: rates chosen for softmax, mos-4; sweeping plif"
    sweep["plif"]["chosen"] = 0.005
    assert status(table, False) == "mini"
    # every rate chosen: the seed cells fixed before the runs that are still to train (a row per split and head)
    rows = [{"scale": "mini", "head": h, "seeds": s} for h, s in (("softmax", [1, 2]), ("mos-4", [1]))] * 2
    planned = {"softmax": 3, "mos-4": 3, "plif": 1}
    assert status({**table, "rows": rows, "seeds_planned": planned}, False) == (
        "mini, running: 4 of the 7 planned seed cells to train"
    )
    rows += [
        {"scale": "mini", "head": "mos-4", "seeds": [1, 2, 3]},
        {"scale": "mini", "head": "softmax", "seeds": [1, 2, 3]},
    ]
    rows = rows[-2:] + [{"scale": "mini", "head": "plif", "seeds": [1]}]
    assert status({**table, "rows": rows, "seeds_planned": planned}, False) == "mini"
    rows += [{"scale": "mini", "head": h, "seeds": []} for h in planned]  # the cost columns' rows: no seeds
    assert status({**table, "rows": rows, "seeds_planned": planned}, False) == "mini"
    assert (
        status({**table, "rows": [], "sweep": {"plif": {"chosen": None}}}, False) == "mini, learning-rate sweep running"
    )
    assert status({**table, "rows": []}, True) == "full only (the plan; not run here)"


def test_every_page_counts_a_cells_cpu_time_one_way():
    """recipes.common.runtime.cpu_seconds, the one CPU-hour account of the reproduction, the bottleneck map and the
    upgrade table: measured CPU time first (with a floor run's), then the joint check's, then an upgrade cell's
    curve (its process's time at the last epoch, else its training steps'), then training seconds times threads."""
    assert runtime.cpu_seconds({"cpu_s": 30.0, "floor_cpu_s": 12.0, "train_wall_s": 999}) == 42.0
    assert runtime.cpu_seconds({"cpu_s": 30.0, "train_wall_s": 999, "threads": 2}) == 30.0
    assert runtime.cpu_seconds({"cpu_seconds": 7.5}) == 7.5
    curve = [{"epoch": 0}, {"epoch": 1, "train_cpu_seconds": 4.0}, {"epoch": 2, "train_cpu_seconds": 5.0}]
    assert runtime.cpu_seconds({"curve": curve}) == 9.0  # the steps alone: the process's time not recorded
    assert runtime.cpu_seconds({"curve": curve[:-1] + [{**curve[-1], "cpu_seconds": 20.0}]}) == 20.0
    assert runtime.cpu_seconds({"train_wall_s": 10.0, "threads": 2, "curve": [{"epoch": 1, "loss": 3.0}]}) == 20.0
    assert runtime.cpu_seconds({"train_wall_s": None}) == 0.0
