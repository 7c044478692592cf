"""studies/mixtape_forms: each form's rate chosen on the tuning seed, the seeds paired, resume."""

import json

import pytest
import torch

from recipes import synthetic_bottleneck as sb
from studies.mixtape_forms import study as mf


def test_mixtape_forms_chooses_each_rate_on_the_tuning_seed_and_pairs_the_seeds(tmp_path, monkeypatch):
    """The study: the rate of each (optimizer, form) is the tuning seed's lowest KL; seeds 1..S run at
    it; the paired difference is nn.Linear minus scaled per seed; a rerun trains nothing again."""
    argv = [
        "--num-contexts",
        "16",
        "--num-outcomes",
        "32",
        "--dim",
        "4",
        "--steps",
        "6",
        "--seeds",
        "2",
        "--adam-lrs",
        "0.01",
        "0.1",
        "--sgd-lrs",
        "3",
        "30",
        "--out",
        str(tmp_path),
        "--no-progress",
    ]
    runs = mf.main(argv)
    grids = json.load(open(tmp_path / "results.json"))["grids"]  # the grids as run: grown past a best end
    assert len(runs) == sum(len(g) + 2 for by_form in grids.values() for g in by_form.values())
    for opt, start in (("adam", [0.01, 0.1]), ("sgd", [3.0, 30.0])):
        chosen = {}
        for form in mf.FORMS:
            grid = grids[opt][form]
            assert set(start) <= set(grid) and len(grid) <= len(start) + mf.MAX_GROWTH
            kls = {lr: runs[mf.run_key(opt, form, lr, 0)]["kl"] for lr in grid}
            chosen[form] = min(kls, key=kls.get)
            assert mf.choose(runs, opt, form, grid) == chosen[form]
        paired, lower = mf.compare(runs, opt, chosen, [1, 2])
        diffs = [
            runs[mf.run_key(opt, "nn.Linear", chosen["nn.Linear"], s)]["kl"]
            - runs[mf.run_key(opt, "scaled", chosen["scaled"], s)]["kl"]
            for s in (1, 2)
        ]
        assert paired.mean == pytest.approx(sum(diffs) / 2) and lower == sum(d < 0 for d in diffs)
    text = (tmp_path / "results.md").read_text()
    assert "| optimizer | seeds | mean difference [95% CI] |" in text and "**What it shows.** Under adam" in text
    # a grid grows a step past a best end (at most 3 times), both ways
    import math

    for kl_of, grid, expected in (
        (lambda lr: abs(math.log(lr)), [0.01, 0.1], [0.01, 0.1, 1.0, 10.0]),
        (lambda lr: -lr, [0.01, 0.1], [0.01, 0.1, 1.0, 10.0, 100.0]),
        (lambda lr: lr, [1.0, 3.0], [0.037, 0.111, 0.333, 1.0, 3.0]),
        (lambda lr: abs(lr - 2.5), [1.0, 3.0, 9.0], [1.0, 3.0, 9.0]),
    ):
        fake_runs = {}

        def fake_run(lr):
            fake_runs[mf.run_key("adam", "scaled", lr, 0)] = {"kl": kl_of(lr)}

        assert mf.grown_grid(fake_runs, "adam", "scaled", grid, fake_run) == expected
    # a diverged rate (KL not finite) is never chosen; a grid not fully run has no choice yet
    fake = {mf.run_key("sgd", "scaled", lr, 0): {"kl": kl} for lr, kl in ((1.0, float("nan")), (2.0, 0.5))}
    assert mf.choose(fake, "sgd", "scaled", [1.0, 2.0]) == 2.0 and mf.choose(fake, "sgd", "scaled", [1.0, 3.0]) is None
    with pytest.raises(ValueError, match="optimizer='lbfgs'; allowed: adam, sgd"):
        sb.train_head("softmax", torch.rand(2, 4).softmax(1), 2, 1, 0.1, 0, optimizer="lbfgs")
    monkeypatch.setattr(sb, "train_head", lambda *a, **k: pytest.fail("trained again"))
    assert mf.main(argv) == runs  # every run kept in results.json
