"""studies/bf16_products: pairs of runs from the same weights and batches, their difference, the decision, resume."""

import json

from corpora import text_files

from studies.bf16_products import study


def test_bf16_products_study_runs_pairs_decides_and_resumes(tmp_path):
    """The study at a tiny size: a pair per precision (float32 against following products) from the same
    weights and batches, the largest difference of their curves, the decision by the threshold, and a rerun that keeps
    the finished runs."""
    data = tmp_path / "data"
    data.mkdir()
    train_text, _ = text_files(tmp_path)  # (PTB's word-level format: words separated by spaces, a line a sentence)
    (data / "train.txt").write_text(open(train_text).read())
    args = ["--steps", "4", "--log-every", "2", "--heads", "softmax", "--dim", "16", "--vocab", "300"]
    args += ["--data-dir", str(data), "--out", str(tmp_path / "out"), "--no-progress"]
    study.main(args)
    out = tmp_path / "out"
    summary = json.load(open(out / "summary.json"))
    assert set(summary["pairs"]) == {"softmax/bf16", "softmax/autocast"}
    runs = json.load(open(out / "runs.json"))
    assert all(len(r["curve"]) == 2 for r in runs.values())
    assert summary["all_within"] == all(p["max_abs_diff"] <= 0.02 for p in summary["pairs"].values())
    assert summary["default"] == ("follow" if summary["all_within"] else None)
    assert (out / "curves.png").stat().st_size > 0
    before = {k: r["seconds"] for k, r in runs.items()}
    study.main(args)  # resumed: nothing trains again
    assert {k: r["seconds"] for k, r in json.load(open(out / "runs.json")).items()} == before
