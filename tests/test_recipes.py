"""The main job (synthetic softmax-bottleneck experiment) on a tiny setting, and at full size (slow)."""
from __future__ import annotations

import json

import pytest
import torch

import hf_heads
from recipes import synthetic_bottleneck as sb


def test_task_is_dirichlet_like_and_frequency_ordered():
    p = sb.make_task(64, 40, alpha=0.01, seed=0)
    torch.testing.assert_close(p.sum(1), torch.ones(64))
    assert (p >= 0).all()
    mass = p.sum(0)
    assert (mass[:-1] >= mass[1:]).all()  # ids ordered by total mass (most frequent first)
    assert p.max(1).values.mean() > 0.5  # alpha = 0.01: sparse, peaked distributions


def test_metrics_on_known_inputs():
    p = torch.tensor([[0.7, 0.2, 0.1], [0.1, 0.1, 0.8]])
    assert sb.mode_matching(p.log(), p) == 100.0
    q = torch.tensor([[0.6, 0.3, 0.1], [0.5, 0.4, 0.1]])  # right mode in row 0 only
    assert sb.mode_matching(q.log(), p) == 50.0
    assert abs(sb.kl_to_truth(p.log(), p)) < 1e-6
    assert sb.kl_to_truth(torch.full((2, 3), 1 / 3).log(), p) > 0


def test_tiny_run_trains_every_head_and_writes_table_and_plot(tmp_path):
    out = tmp_path / "syn"
    results = sb.main(["--num-contexts", "24", "--num-outcomes", "20", "--dim", "3", "--steps", "40",
                       "--no-progress", "--out", str(out),
                       "--head-options", '{"mos": {"num_components": 2}, "mos_plif": {"num_components": 2, "num_knots": 1000}, '
                                         '"plif": {"num_knots": 1000}}'])
    assert {r["head"] for r in results} == set(hf_heads.available_heads())
    for r in results:
        first_kl, last_kl = r["curve"][0][1], r["curve"][-1][1]
        assert last_kl < first_kl, r["head"]
    table = (out / "results.md").read_text()
    for name in hf_heads.available_heads():
        assert f"| {name} |" in table
    saved = json.loads((out / "results.json").read_text())
    assert saved["setup"]["num_contexts"] == 24 and len(saved["results"]) == len(results)
    assert (out / "synthetic_bottleneck.png").stat().st_size > 10_000


def test_bad_arguments_are_named(capsys):
    with pytest.raises(SystemExit):
        sb.main(["--dim", "0"])
    assert "--dim=0 is out of range" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        sb.main(["--heads", "softmax", "nope"])
    assert "unknown head(s) ['nope']" in capsys.readouterr().err


@pytest.mark.slow
def test_full_demo_shows_the_bottleneck(tmp_path):
    """`make demo` settings: Mixtape and PLIF must beat softmax on mode matching and KL."""
    results = {r["head"]: r for r in sb.main(["--no-progress", "--out", str(tmp_path),
                                              "--heads", "softmax", "mixtape", "plif"])}
    for name in ("mixtape", "plif"):
        assert results[name]["mode_matching"] > results["softmax"]["mode_matching"] + 5, name
        assert results[name]["kl"] < results["softmax"]["kl"], name
