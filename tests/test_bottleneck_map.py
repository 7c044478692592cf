"""The bottleneck map (``python -m recipes.bottleneck_map``): a trunk's cached features score as fairseq scores the
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

from recipes import bottleneck_map  # noqa: E402


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
        "--floor-sample",
        "200",
        "--batch-tokens",
        "256",
        "--spectrum-contexts",
        "50",
        "--quiet",
    ]
    result = bottleneck_map.main(argv, log=lambda *_: None)
    assert set(result["rates"]) == {"softmax", "mos-4"} and set(result["rates"].values()) <= {1e-2, 3e-2}
    cells = {(c["head"], c["d"]): c for c in result["cells"]}
    assert len(result["cells"]) == 8 and set(cells) == {("softmax", 2), ("softmax", 8), ("mos-4", 2), ("mos-4", 8)}
    assert result["meta"]["trunk_nll"]["valid"] > 0
    for c in cells.values():
        assert c["curve"][0]["epoch"] == 0 and math.isfinite(c["test_nll"]) and len(c["floor_curve"]) == 2
        assert c["train_nll_floor"] == min(c["floor_curve"])
    # a softmax over d = 2 projected features: log p = W h + b - log Z(h), a matrix of rank at most d + 2
    for c in result["cells"]:
        if c["head"] == "softmax":
            assert c["spectrum"]["rank"] <= c["d"] + 2
    assert max(c["spectrum"]["rank"] for c in result["cells"]) > 4  # the measure is not stuck at the d = 2 bound
    # the page: the primary test's slope (4 paired points for MoS-4; Mixtape did not run), the tables, the plot
    from recipes import bottleneck_report

    docs = tmp_path / "docs"
    docs.mkdir()
    text = bottleneck_report.main(["--results", str(tmp_path), "--docs", str(docs)], log=lambda *_: None)
    slopes = {
        s["head"]: s for s in bottleneck_report.slope_test(json.loads((docs / "bottleneck_map.json").read_text()))
    }
    assert (
        slopes["mos-4"]["points"] == 4 and slopes["mos-4"]["low"] < slopes["mos-4"]["slope"] < slopes["mos-4"]["high"]
    )
    assert slopes["mixtape"]["slope"] is None and "| mixtape | 0 | too few points |" in text
    assert "Cells finished: 8 of the 8 planned (2 heads x 2 d x 2 seeds)." in text
    assert "## The primary test" in text and "| mos-4 | 2 | 2 |" in text and (docs / "bottleneck_map.png").exists()
    # resumable: a rerun reads every cell and rate it finds
    monkeypatch.setattr(bottleneck_map, "run_cell", lambda *a, **k: pytest.fail("a finished cell ran again"))
    again = bottleneck_map.main(argv, log=lambda *_: None)
    assert again["cells"] == result["cells"]


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
