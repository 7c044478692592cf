"""studies/fast_softmax/svd_study.py: spectra of a known matrix, the perplexity of SVD-softmax's distribution against a
slow per-query reference (and the exact softmax where the approximation is exact), and the command end to end on a tiny
corpus."""

from __future__ import annotations

import json
import math
import os

import pytest
import torch

import hf_heads
from corpora import tiny_corpus
from studies.fast_softmax import svd_study as SS


def test_spectrum_of_a_known_matrix():
    q, _ = torch.linalg.qr(torch.randn(3, 3, generator=torch.Generator().manual_seed(0)))
    w = torch.cat([torch.diag(torch.tensor([3.0, 2.0, 1.0])) @ q, torch.zeros(2, 3)])  # V = 5, d = 3
    assert torch.allclose(SS.spectrum(w), torch.tensor([1.0, 2 / 3, 1 / 3], dtype=torch.float64), atol=1e-6)


def slow_log_probs(weight, bias, g, rank, refine, leading):
    """One query, written out: preview over ``rank`` rotated dimensions, exact logits for the ``refine`` best."""
    u, s, vt = torch.linalg.svd(weight.double(), full_matrices=False)
    z = vt @ g.double()
    dims = torch.arange(rank) if leading else (z.abs() * s).topk(rank).indices
    preview = (u[:, dims] * s[dims]) @ z[dims] + bias.double()
    cand = preview.topk(refine).indices
    mixed = preview.clone()
    mixed[cand] = weight.double()[cand] @ g.double() + bias.double()[cand]
    return torch.log_softmax(mixed, 0)


@pytest.mark.parametrize("dims", ["leading", "adaptive"])
def test_perplexity_of_the_approximation_equals_a_slow_reference(dims):
    g = torch.Generator().manual_seed(1)
    V, d, n = 60, 16, 40
    weight, bias = torch.randn(V, d, generator=g), 0.1 * torch.randn(V, generator=g)
    hidden, target = torch.randn(n, d, generator=g), torch.randint(0, V, (n,), generator=g)
    head = hf_heads.build_head(
        "svd_softmax",
        hidden_size=d,
        vocab_size=V,
        weight=weight,
        bias=bias,
        preview_rank=4,
        num_refine=6,
        preview_dims=dims,
        preview_half=False,
    ).eval()
    exact_top = (hidden @ weight.T + bias).topk(10, dim=1).indices
    got = SS.scores(head, hidden, target, exact_top, batch=7)
    nll = [-float(slow_log_probs(weight, bias, hidden[i], 4, 6, dims == "leading")[target[i]]) for i in range(n)]
    assert got["ppl"] == pytest.approx(math.exp(sum(nll) / n), rel=1e-5)
    assert got["cost_gain"] == pytest.approx(V * d / (d * d + 4 * V + 6 * d))
    # where the approximation is exact (W = d, or every token refined) its perplexity is the softmax's
    setting = SS.Setting("t", weight, bias, hidden, target)
    exact_ppl = math.exp(float(torch.nn.functional.cross_entropy(hidden @ weight.T + bias, target)))
    for w, r in ((d, 6), (4, V)):
        assert SS.scores(SS.svd_head(setting, w, r, dims), hidden, target, exact_top)["ppl"] == pytest.approx(
            exact_ppl, rel=1e-4
        )


def tiny_wt2_setting(tmp_path, monkeypatch):
    """The wikitext-2 setting on a tiny generated corpus (train / valid / test) and a tiny train-split LSTM."""
    from studies.common import lms
    from corpora import TINY_LM

    monkeypatch.setattr(lms, "LSTM_SETTINGS", {**lms.LSTM_SETTINGS, **TINY_LM})
    tiny_corpus(tmp_path / "data" / "wikitext-2", num_words=20, valid_lines=20, seed=2, train_lines=60)
    return ["--settings", "wikitext-2", "--data", str(tmp_path / "data"), "--lm-dir", str(tmp_path / "lm")]


def test_distilled_loss_is_the_cross_entropy_from_the_exact_distribution():
    torch.manual_seed(0)
    exact = hf_heads.build_head("softmax", hidden_size=6, vocab_size=9).eval()
    hier = hf_heads.build_head("class_softmax", hidden_size=6, vocab_size=9)
    h = torch.randn(5, 6)
    expected = -(torch.softmax(exact.weight @ h.T + exact.bias[:, None], 0).T * hier(h)).sum(-1).mean()
    assert float(SS.distilled(exact)(hier, h, None)) == pytest.approx(float(expected), rel=1e-5)


def tiny_study_argv(tmp_path, monkeypatch, out) -> list:
    """The study on the tiny WikiText-2 setting: two windows, one refine count, a few steps, one timing round."""
    argv = [*tiny_wt2_setting(tmp_path, monkeypatch), "--queries", "50", "--windows", "0.25", "0.5"]
    argv += ["--refine", "0.001", "--hier-steps", "3", "--timing-queries", "2", "--timing-rounds", "1"]
    argv += ["--adaptive-queries", "30", "--calibration-queries", "12", "--calibration-steps", "2"]
    return argv + ["--quiet", "--out", str(out)]


def test_study_command_on_a_tiny_corpus(tmp_path, monkeypatch):
    argv = tiny_study_argv(tmp_path, monkeypatch, tmp_path / "o")
    (result,) = SS.main(argv)
    methods = [(r["method"], r.get("preview"), r.get("W")) for r in result["rows"]]
    assert methods == [
        ("softmax (exact)", None, None),
        ("svd_softmax", "leading", 2),
        ("svd_softmax", "leading", 4),
        ("svd_softmax", "adaptive", 2),
        ("svd_softmax", "adaptive", 4),
        ("class_softmax", None, None),
        ("class_softmax (fitted to the softmax)", None, None),
    ]
    assert result["V"] == 21 and result["rows"][0]["top1"] == 1.0 and result["rows"][0]["cost_gain"] == 1.0
    timed = [r for r in result["rows"] if r["method"] != "svd_softmax" or r["N"] == 1]
    assert all("ms_per_token" in r and "ms_per_target" in r for r in timed)
    assert result["info"]["lstm_test_ppl"] < 21  # the tiny LSTM learnt the text's chains
    assert result["spectrum"][0] == 1.0
    assert result["seconds"] > 0 and result["cpu_seconds"] > 0  # what the setting took, its states included
    for name in ("results.md", "results.json", "svd-spectra.png", "svd-ppl-vs-window.png"):
        assert (tmp_path / "o" / name).stat().st_size > 100
    for bad in (["--windows", "0"], ["--deltas", "1"], ["--adaptive-queries", "0"]):
        with pytest.raises(SystemExit):
            SS.parse_args(bad)
    # adaptive sampling at its paper's criterion: a row per delta, on the test states (at most --adaptive-queries),
    # its variance scale calibrated on --calibration-queries valid states
    part = result["adaptive"]
    assert [r["delta"] for r in part["rows"]] == [0.1, 0.01] and part["epsilon"] == 0.3
    assert (part["queries"], part["calibration_queries"]) == (30, 12) and part["cpu_seconds"] > 0
    for r in part["rows"]:
        assert r["bound"]["top1"] >= r["bound"]["success"] and r["calibrated"]["gain"] > 0
        assert r["calibrated"]["variance_scale"] == 1.0 or r["calibrated"]["valid_success"] >= 1 - r["delta"]
    assert "| delta | bound: success |" in (tmp_path / "o" / "results.md").read_text()
    # --resume keeps a setting finished with the same options (results.json is written after each), not another's
    monkeypatch.setattr(SS, "study", lambda *a, **k: pytest.fail("studied again"))
    assert SS.main(argv + ["--resume"]) == [result]
    with pytest.raises(pytest.fail.Exception, match="studied again"):
        SS.main(argv + ["--resume", "--queries", "40"])
    # other adaptive-sampling options redo that part alone, the SVD part kept
    (other,) = SS.main(argv + ["--resume", "--deltas", "0.05"])
    assert other["rows"] == result["rows"] and [r["delta"] for r in other["adaptive"]["rows"]] == [0.05]
    # a setting kept after the last one studied stays in results.json too (the file once lost it)
    path = tmp_path / "o" / "results.json"
    path.write_text(json.dumps([{**result, "setting": "smollm2"}]))
    monkeypatch.setattr(SS, "study", lambda s, a: {k: v for k, v in result.items() if k not in ("seconds", "adaptive")})
    SS.main(["--settings", "wikitext-2", "smollm2", *argv[2:], "--resume"])
    assert [r["setting"] for r in json.loads(path.read_text())] == ["wikitext-2", "smollm2"]


def test_adaptive_study_measures_the_heads_own_criterion_on_spread_queries():
    """The adaptive part is the head's success rate (its paper's criterion) on test states spread over the text,
    with the bound as written, then calibrated on the valid states: the same numbers as the head computes itself."""
    g = torch.Generator().manual_seed(3)
    V, d = 40, 12
    weight, bias = torch.randn(V, d, generator=g), 0.1 * torch.randn(V, generator=g)
    hidden, valid = 3 * torch.randn(50, d, generator=g), 3 * torch.randn(20, d, generator=g)
    s = SS.Setting("t", weight, bias, hidden, torch.zeros(50, dtype=torch.long), valid_h=valid)
    args = SS.parse_args(["--adaptive-queries", "10", "--calibration-steps", "2", "--deltas", "0.2"])
    (row,) = SS.adaptive_study(s, args, log=lambda *_: None)["rows"]
    head = hf_heads.build_head("adaptive_sampling", hidden_size=d, vocab_size=V, weight=weight, bias=bias, delta=0.2)
    queries = hidden[SS.spread(50, 10)]
    assert SS.spread(50, 10).tolist() == [0, 5, 10, 16, 21, 27, 32, 38, 43, 49]
    assert row["bound"] == head.eval().success_rate(queries)
    fit = head.calibrate(valid, steps=2)
    assert row["calibrated"] == {
        **head.success_rate(queries),
        "variance_scale": fit["variance_scale"],
        "valid_success": fit["success"],
    }


def test_fast_study_page_from_both_commands(tmp_path, monkeypatch):
    """The docs page is written from the two commands' outputs only: it opens with the DS-Softmax rows, then the
    poster's, the perplexity-against-W tables, both plots, the SVD-vs-hierarchical table and numbers.json."""
    from studies.fast_softmax import ds_softmax as dsr
    from studies.fast_softmax import fast_analysis as FA
    from studies.fast_softmax import fast_report as FR
    from recipes.common.stats import wilson

    SS.main(tiny_study_argv(tmp_path, monkeypatch, tmp_path / "svd"))
    from studies.fast_softmax.test_ds_softmax_recipe import tiny_wt2_argv

    argv = tiny_wt2_argv(tmp_path, monkeypatch, "--experts", "2")
    dsr.main(argv[: argv.index("--out") + 1] + [str(tmp_path / "ds")] + argv[argv.index("--out") + 2 :])
    docs = tmp_path / "study"
    records = docs / "records"
    docs.mkdir()
    FR.main(
        [
            "--svd",
            str(tmp_path / "svd"),
            "--ds",
            str(tmp_path / "ds"),
            "--docs",
            str(docs),
            "--records",
            str(records),
            "--note",
            "timed beside two busy processes",
        ]
    )
    text = (docs / FR.PAGE).read_text()
    lines = text.splitlines()
    assert lines[0].startswith("# ") and lines[4].startswith("| task |")  # the title, one caption line, the table
    assert lines[6].startswith("| wikitext-2 | 21 | 8 | 2 (")  # the DS row, from the json
    assert "| poster DS-64 Wiki-2 | 0.257 -> 0.259 | 23.86x | 3.07 -> 0.15 | 20.5x | 0.86 |" in lines
    assert "| poster DS-64 PTB | 0.252 -> 0.258 | 15.99x | 0.73 -> 0.05 | 14.6x | 0.91 |" in lines
    assert "| poster SVD-10 PTB | 0.252 -> 0.251 | 5.00x | 0.73 -> 0.18 | 4.1x | 0.81 |" in lines
    assert "_timed beside two busy processes_" in text  # the SVD study's note
    assert "| 2 | 1 | " in text and "| 4 | 1 | " in text  # W = 2, 4 at N = 1, both previews
    classes = json.loads((tmp_path / "svd" / "results.json").read_text())[0]["rows"][-1]["classes"]
    assert f"| class_softmax ({classes} classes) |" in text and "| softmax (exact) |" in text
    assert f"| class_softmax (fitted to the softmax) ({classes} classes) |" in text
    assert "Reading" not in text  # no reading beside this page, and no sentence generated in its place
    assert max(len(line) for line in lines if not line.startswith("|")) <= 400
    ds = json.loads((records / "ds.json").read_text())
    svd = json.loads((records / "svd_study.json").read_text())
    nums = json.loads((records / "numbers.json").read_text())
    assert nums == json.loads(json.dumps(FA.derived(ds, svd)))
    (r,) = ds["results"]
    (d,) = nums["ds"]
    assert d["wall_per_flops"] == r["speedup"]["1"] / r["flops_reduction"]
    assert d["top1"] == r["top1_ds"] - r["top1_softmax"] and d["top1_vs_control"] == r["top1_ds"] - r["top1_control"]
    assert d["control_vs_lm"] == r["top1_control"] - r["top1_softmax"] and d["nearest_poster"] is True  # one row
    # two tests on the page: Holm multiplies the smaller p by 2, the larger keeps its own (at least the first)
    raw = [r["mcnemar_ds_vs_control"]["p"], r["mcnemar_control_vs_lm"]["p"]]
    assert sorted([d["p_vs_control"], d["p_control_vs_lm"]]) == [
        min(1, 2 * min(raw)),
        max(min(1, 2 * min(raw)), max(raw)),
    ]
    assert f"| {r['speedup']['1'] / r['flops_reduction']:.2f} |" in text
    control_row = f"| wikitext-2 | 2 | {r['top1_softmax']:.4f} | {r['top1_control']:.4f} | {r['top1_ds']:.4f} |"
    assert any(line.startswith(control_row) for line in lines)
    assert f"| {r['ppl_ds_covered']:.2f} | {r['ppl_control_covered']:.2f} |" in text
    # adaptive sampling at its paper's criterion, a row per delta with its success's Wilson interval, the paper's
    # figure after them; the CPU-hours the kept runs recorded, per part, and their sum
    (setting,) = svd["results"]
    for row, d in zip(setting["adaptive"]["rows"], nums["adaptive"]):
        n, b = setting["adaptive"]["queries"], row["bound"]
        assert d["bound_ci"] == pytest.approx(wilson(b["success"] * n, n)) and d["delta"] == row["delta"]
        assert f"| wikitext-2 | 21 | 8 | {row['delta']} | {b['success']:.3f} ({d['bound_ci'][0]:.3f}, " in text
    assert "| paper: Mistral-7B, WikiText | 32000 | 4096 | - | - | - | - | - | - | - | up to 30x |" in lines
    cpu = {(c["command"], c["part"]): c["hours"] for c in nums["cpu"]["rows"]}
    assert cpu["svd_study", "wikitext-2"] == pytest.approx(setting["cpu_seconds"] / 3600)
    assert cpu["svd_study", "wikitext-2 adaptive sampling"] == pytest.approx(setting["adaptive"]["cpu_seconds"] / 3600)
    assert cpu["ds_softmax", "wikitext-2 E=2"] == pytest.approx(r["cpu_seconds"] / 3600)  # its whole run, recorded
    assert cpu["ds_softmax", "wikitext-2 control"] == pytest.approx(
        r["runs"]["control"]["train_seconds"] * r["threads"] / 3600
    )
    assert cpu["lms", "wikitext-2 LSTM"] == pytest.approx(r["info"]["lm"]["cpu_seconds"] / 3600)
    assert cpu["all", ""] == nums["cpu"]["total_hours"] == pytest.approx(sum(cpu.values()) - cpu["all", ""])
    assert f"| all |  | {nums['cpu']['total_hours']:.2f} |  |" in lines
    assert "_wikitext-2: timed beside two busy processes_" in text
    for plot in FA.PLOTS:
        assert (docs / FR.FIGURES / plot).stat().st_size > 100
    # the page again from the committed json alone: the same text
    assert FR.main(["--no-collect", "--docs", str(docs), "--records", str(records)]) == text
    # the CPU-hours no run recorded (estimated from notes, committed beside the runs' json) join the table and total
    (records / f"{FA.UNRECORDED}.json").write_text(json.dumps({"rows": [{"part": "a discarded run", "hours": 0.25}]}))
    again = FR.main(["--no-collect", "--docs", str(docs), "--records", str(records)])
    total = nums["cpu"]["total_hours"] + 0.25
    assert "| - | a discarded run | 0.25 | estimated |" in again and f"| all |  | {total:.2f} |  |" in again
    assert "from `records/*.json`" in text and "(records/numbers.json)" in text
    with pytest.raises(SystemExit):
        FR.main(["--docs", str(docs), "--records", str(records)])  # nothing to collect


def test_fast_study_collect_merges_ds_runs_by_task(tmp_path):
    """Each DS run collected adds its tasks' rows (and the note) to ds.json; a task collected again replaces its own
    rows and notes only."""
    from studies.fast_softmax import fast_analysis as FA

    def run(name, rows):
        (tmp_path / name).mkdir()
        (tmp_path / name / "results.json").write_text(json.dumps(rows))
        return str(tmp_path / name)

    out = str(tmp_path / "records")
    a = run("a", [{"task": "ptb", "experts": 16}, {"task": "ptb", "experts": 64}])
    b = run("b", [{"task": "smollm2", "experts": 4}])
    c = run("c", [{"task": "ptb", "experts": 8}])
    FA.collect(None, [a], out, "first")
    FA.collect(None, [b], out, None)
    assert FA.load(out, "ds") == {
        "notes": {"ptb": ["first"], "smollm2": []},
        "results": [{"task": "ptb", "experts": 16}, {"task": "ptb", "experts": 64}, {"task": "smollm2", "experts": 4}],
    }
    FA.collect(None, [c], out, "again")
    got = FA.load(out, "ds")
    assert got["results"] == [{"task": "smollm2", "experts": 4}, {"task": "ptb", "experts": 8}]
    assert got["notes"] == {"smollm2": [], "ptb": ["again"]}
    with pytest.raises(SystemExit, match="--ds .*nowhere: no results.json"):
        FA.collect(None, [str(tmp_path / "nowhere")], out, None)


def test_fast_study_committed_page_numbers_and_reading():
    """The committed page and numbers.json are what the generator makes of the committed json (and the reading);
    every decimal, percentage and number with a unit of the hand-written reading is one of their values as the
    page's tables format it, or one of the at most ten listed exceptions."""
    from studies.fast_softmax import fast_analysis as FA
    from studies.fast_softmax import fast_report as FR
    from recipes.common.reading import number_values, unmatched_numbers

    out_dir = FR.RECORDS
    text, nums = FR.render(out_dir, FR.HOME)
    with open(os.path.join(FR.HOME, FR.PAGE)) as f:
        assert f.read() == text
    with open(os.path.join(out_dir, "numbers.json")) as f:
        assert json.load(f) == json.loads(json.dumps(nums))
    lines = text.splitlines()
    assert lines[4].startswith("| task |") and "## Reading" in lines
    assert max(len(line) for line in lines if not line.startswith("|")) <= 400
    with open(os.path.join(FR.HOME, FR.READING)) as f:
        reading = f.read()
    assert max(len(line) for line in reading.splitlines()) <= 120
    values = number_values(nums) + [
        v for n in ("ds", "svd_study", "decoding") for v in number_values(FA.load(out_dir, n) or {})
    ]
    assert len(FR.EXCEPTIONS) <= 10
    assert unmatched_numbers(reading, values, FR.FORMATS, FR.EXCEPTIONS) == []
    assert unmatched_numbers("65.1x and 37%", values, FR.FORMATS) == ["65.1x"]  # 37%: 64 experts' 0.37 of the FLOPs
