"""The paired statistics of the reproduced tables (recipes/common/stats.py) against hand-checked examples and
scipy's own tests."""

import math

import pytest

scipy_stats = pytest.importorskip("scipy.stats", reason="scipy not installed: run `make install` (recipes extra)")

from recipes.common.stats import format_diff, holm, paired  # noqa: E402
from recipes.reproduce.analysis import compare as head_comparison  # noqa: E402
from recipes.reproduce.analysis import facts  # noqa: E402
from recipes.reproduce.report import layout as tables  # noqa: E402


def test_paired_t_by_hand():
    # differences 1, 2, 3: mean 2, sample std 1, se 1/sqrt(3), t = 2 sqrt(3) = 3.4641 with 2 df
    r = paired([11.0, 12.0, 13.0], [10.0, 10.0, 10.0])
    assert r.n == 3 and r.mean == 2.0 and r.std == pytest.approx(1.0)
    assert r.t == pytest.approx(2 * math.sqrt(3))
    q = 4.302652729911275  # t(0.975, 2), from tables
    assert (r.low, r.high) == pytest.approx((2 - q / math.sqrt(3), 2 + q / math.sqrt(3)))
    assert r.p == pytest.approx(0.07418, abs=1e-5)  # two-sided, 2 df: 2 * (1 - F(3.4641)) by hand
    assert r.positive == 3 and r.p_sign == pytest.approx(0.25)  # 2 * (1/2)^3


def test_paired_agrees_with_scipy_ttest_rel_and_binomtest():
    a = [25.1, 26.3, 24.9, 25.7, 26.0]
    b = [24.0, 25.9, 25.1, 24.8, 24.9]
    r = paired(a, b)
    ref = scipy_stats.ttest_rel(a, b)
    assert r.t == pytest.approx(ref.statistic) and r.p == pytest.approx(ref.pvalue)
    ci = ref.confidence_interval(0.95)
    assert (r.low, r.high) == pytest.approx((ci.low, ci.high))
    assert r.p_sign == pytest.approx(scipy_stats.binomtest(4, 5, 0.5).pvalue)
    assert "p = " in r.describe() and "4/5 positive" in r.describe()


def test_paired_edge_cases_and_errors():
    one = paired([3.0], [1.0])
    assert one.low is None and one.p is None and "one seed" in one.describe()
    same = paired([2.0, 3.0], [1.0, 2.0])  # the same difference every seed
    assert same.p == 0.0 and same.low == same.high == 1.0
    assert paired([1.0, 2.0], [1.0, 2.0]).p == 1.0
    with pytest.raises(ValueError, match="equally long"):
        paired([1.0], [1.0, 2.0])
    with pytest.raises(ValueError, match="alpha must be in"):
        paired([1.0, 2.0], [0.0, 1.0], alpha=1.5)


def test_holm_by_hand():
    # p = 0.01, 0.04, 0.03 -> sorted 0.01 (x3), 0.03 (x2), 0.04 (x1), each at least the one before
    assert holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    assert holm([0.5, None, 0.01]) == [pytest.approx(0.5), None, pytest.approx(0.02)]
    assert holm([0.6, 0.7]) == pytest.approx([1.0, 1.0])
    # a planned family of 4 with two p-values so far: the missing two count as p = 1, last in the ranking
    assert holm([0.01, None, 0.03], size=4) == [pytest.approx(0.04), None, pytest.approx(0.09)]
    assert holm([0.01, 0.03], size=1) == pytest.approx([0.02, 0.03])  # never smaller than the p-values it has
    with pytest.raises(ValueError, match="NaN"):  # sorted with the others, a NaN would reorder the family silently
        holm([0.01, float("nan"), 0.03])


def test_detectable_difference_has_the_stated_power_by_simulation():
    """The smallest difference a paired t-test detects with 80% power: a Monte Carlo of paired t-tests at that true
    difference rejects about 80% of the time, at half of it far less; 5 seeds need more than 1.5 sd, 30 about 0.53."""
    import math

    import torch
    from scipy import stats as sps

    from recipes.common.stats import detectable

    assert detectable(None, 5, 0.05) is None and detectable(1.0, 1, 0.05) is None
    with pytest.raises(ValueError, match="alpha"):
        detectable(1.0, 5, 1.5)
    assert 1.5 < detectable(1.0, 5, 0.05) < 1.9 and 0.5 < detectable(1.0, 30, 0.05) < 0.56
    assert detectable(2.0, 5, 0.05) == pytest.approx(2 * detectable(1.0, 5, 0.05))  # in units of the spread
    assert detectable(1.0, 3, 0.01) > detectable(1.0, 3, 0.05) > detectable(1.0, 5, 0.05)  # fewer seeds, lower alpha
    g = torch.Generator().manual_seed(0)
    n, alpha = 5, 0.05 / 3  # Holm's first level in a family of 3
    delta = detectable(1.0, n, alpha)
    q = sps.t.ppf(1 - alpha / 2, n - 1)

    def rejected(true_mean):
        d = torch.randn(20000, n, generator=g, dtype=torch.float64) + true_mean
        t = d.mean(1) / (d.std(1) / math.sqrt(n))
        return float((t.abs() > q).double().mean())

    assert rejected(delta) == pytest.approx(0.8, abs=0.015)
    assert rejected(delta / 2) < 0.4 and rejected(0.0) == pytest.approx(alpha, abs=0.005)
    # two seeds (one degree of freedom), where scipy's non-central t gives NaN for large non-centralities: the search
    # must not stop there (it once returned 5.4 sd, proportional to nothing; 80% power needs ~34.6 sd)
    n = 2
    delta = detectable(1.0, n, alpha)
    q = sps.t.ppf(1 - alpha / 2, n - 1)
    assert detectable(0.37, n, alpha) == pytest.approx(0.37 * delta) and delta > 30
    assert rejected(delta) == pytest.approx(0.8, abs=0.015)


def _row(head, split, values):
    return {
        "head": head,
        "split": split,
        "metric": "ppl",
        "seeds": list(range(1, len(values) + 1)),
        "values": values,
        "mean": sum(values) / len(values),
    }


def test_family_holm_adjusts_the_test_comparisons_only_and_reads_mixtures_against_the_matched_softmax():
    from recipes.reproduce.report import layout
    from recipes.reproduce.tables.lm_ptb import TABLE

    rows = [_row("softmax", s, [100.0, 102.0, 98.0, 101.0, 99.0]) for s in ("valid", "test")]
    rows += [_row("softmax-matched", s, [99.0, 101.5, 97.0, 100.5, 98.0]) for s in ("valid", "test")]
    rows += [_row("mos-4", s, [96.0, 99.5, 94.0, 97.0, 96.5]) for s in ("valid", "test")]
    rows += [_row("plif", s, [99.9, 101.5, 98.2, 100.4, 98.9]) for s in ("valid", "test")]
    family = head_comparison.family(rows)
    pairs = {(c.head, c.baseline, c.split) for c in family}
    assert ("mos-4", "softmax-matched", "test") in pairs and ("plif", "softmax-matched", "test") not in pairs
    tests = [c for c in family if c.split == "test"]
    assert [c.holm for c in tests] == pytest.approx(holm([c.result.p for c in tests]))  # a family of 4, not 8
    assert all(c.holm is None and c.detectable is None for c in family if c.split == "valid")
    assert all(c.detectable > 0 for c in tests)
    text = tables.family_table(family, "ppl")
    assert "(valid: described)" in text and "detectable (80% power)" in text
    for line in text.splitlines():  # a valid row gives its difference and interval, no p-value to read as a test
        if "| valid |" in line:
            assert line.endswith("| - | (valid: described) | - | - |"), line
    # the papers' claims on our scale: the table's column, and the derived numbers a reading cites
    claims = facts.claims_for(TABLE, family, rows)
    plif = next(c for c in tests if c.head == "plif" and c.baseline == "softmax")
    assert claims[("plif", "softmax", "test")] == pytest.approx((57.25 / 58.37 - 1) * 100.0)
    assert ("mos-4", "softmax-matched", "test") in claims and ("softmax-matched", "softmax", "test") not in claims
    claimed = tables.family_table(family, "ppl", claims=claims)
    row = next(line for line in claimed.splitlines() if line.startswith("| plif - softmax | test |"))
    assert row.endswith(f"| ±{plif.detectable:.2f} | {claims[('plif', 'softmax', 'test')]:+.2f} |")
    obj = {"table": "lm-ptb", "description": "d", "rows": rows, "cells": []}
    derived = facts.numbers(obj, facts.table_facts(obj))
    entry = next(
        c for c in derived["comparisons"] if (c["head"], c["baseline"], c["split"]) == ("plif", "softmax", "test")
    )
    assert (
        entry["claim"] == pytest.approx(claims[("plif", "softmax", "test")]) and entry["detectable"] == plif.detectable
    )
    assert entry["per_seed"] == pytest.approx([-0.1, -0.5, 0.2, -0.6, -0.1]) and derived["claims"][
        "plif"
    ] == pytest.approx(57.25 / 58.37 - 1)
    # each head's cells: how many, and how many of them scored so far
    heads = facts.head_facts([{"head": "plif", "seed": 1, "ppl": {"test": 1.0}}, {"head": "plif", "seed": 2}], [])
    assert "| plif | 2 (1 scored) |" in layout.cells_table(heads)
    # the translation tables state theirs too, in BLEU (En-Fr's MoS number is another system's: no claim)
    from recipes.reproduce.tables.mt_en_de import TABLE as EN_DE
    from recipes.reproduce.tables.mt_en_fr import TABLE as EN_FR

    bleu = [_row(h, "test_2016_flickr", [30.0 + i + b for i in range(3)]) for h, b in (("softmax", 0), ("mos-4", -2))]
    mt = head_comparison.family(bleu)
    assert facts.claims_for(EN_DE, mt, bleu)[("mos-4", "softmax", "test_2016_flickr")] == pytest.approx(
        (29.5 / 29.0 - 1) * 31.0
    )
    assert "mos-4" not in EN_FR.paper_claims and "mixtape-unscaled" in EN_FR.paper_claims


def test_family_with_planned_seeds_keeps_its_size_while_seeds_are_missing():
    """With the seeds fixed before the runs, Holm's m counts every planned test comparison (the untestable ones
    enter as p = 1), so adjusted p-values and detectable differences do not shrink while rows wait for seeds; the
    table and the reading say how many of the planned seeds a comparison has."""

    rows = [_row("softmax", s, [100.0, 102.0, 98.0]) for s in ("valid", "test")]
    rows += [_row("mos-4", s, [96.0, 99.5, 94.5]) for s in ("valid", "test")]
    rows += [_row("plif", s, [99.0]) for s in ("valid", "test")]
    planned = {"softmax": 5, "mos-4": 5, "plif": 5, "sigsoftmax": 3}  # 3 test comparisons will be testable
    mos = next(c for c in head_comparison.family(rows) if c.head == "mos-4" and c.split == "test")
    fixed = head_comparison.family(rows, planned)
    mos_fixed = next(c for c in fixed if c.head == "mos-4" and c.split == "test")
    assert mos.holm == pytest.approx(mos.result.p)  # alone in the family of what can be tested today
    assert mos_fixed.holm == pytest.approx(min(1.0, 3 * mos.result.p))
    assert mos_fixed.detectable > mos.detectable  # at 0.05 / 3, not 0.05
    assert mos_fixed.planned == 5 and tables.seeds_of(mos_fixed) == "3 of 5"
    assert "| mos-4 - softmax | test | 3 of 5 |" in tables.family_table(fixed, "ppl")
    text = tables.family_table(fixed, "ppl")
    detects = f"±{format_diff(mos_fixed.detectable, sign=False)}"
    assert "| mos-4 - softmax | test | 3 of 5 | -3.33 [" in text and f"| 0.25 | {detects} |" in text
    assert "| plif - softmax | test | 1 of 5 | -1.00 - | - | - | 1.00 | - |" in text  # one seed: not tested


def test_the_cap_facts_give_the_last_epochs_slope():
    def cell(stopped, losses):
        return {"stopped": stopped, "curve": [{"epoch": i + 1, "loss": x, "nll_loss": x} for i, x in enumerate(losses)]}

    capped = [cell("max_epochs", [6.0, 5.5, 5.3, 5.2]), cell("max_epochs", [6.0, 5.6, 5.4, 5.36])]
    got = facts.cap_facts(capped + [cell("patience", [6.0, 5.0, 5.1, 5.2])])
    assert (got["capped"], got["cells"], got["epochs"]) == (2, 3, 4)
    # the median of an even count is the mean of the middle two (not the upper one, -0.120)
    assert got["slopes"] == pytest.approx([-0.15, -0.12]) and got["median"] == pytest.approx(-0.135)
    assert (
        got["ppl_pct_at_median"] == pytest.approx(100 * (2**-0.135 - 1)) and f"{got['ppl_pct_at_median']:.1f}" == "-8.9"
    )
    assert facts.cap_facts([cell("patience", [6, 5, 5.1, 5.2])]) is None  # none at the cap


def test_a_difference_that_rounds_to_zero_keeps_two_significant_digits():
    from recipes.common.stats import format_diff

    assert [format_diff(x) for x in (-1.4249, 0.0, 0.005, -0.00137, 2.3e-5)] == [
        "-1.42",
        "+0.00",
        "+0.01",
        "-0.0014",
        "+2.3e-05",
    ]
    assert format_diff(0.00093, sign=False) == "0.00093" and format_diff(0.42, sign=False) == "0.42"


def test_mcnemar_by_hand():
    """10 items: a alone right on 6, b alone on 1, both on 2, neither on 1. The 7 discordant items decide: two-sided
    exact p = 2 P(X >= 6) for X ~ Bin(7, 1/2) = 2 (C(7, 6) + C(7, 7)) / 2^7 = 0.125; the difference 0.5."""
    from recipes.common.stats import mcnemar

    a = [True] * 6 + [False] + [True, True] + [False]
    b = [False] * 6 + [True] + [True, True] + [False]
    r = mcnemar(a, b)
    assert (r.n, r.a_only, r.b_only) == (10, 6, 1) and r.difference == pytest.approx(0.5)
    assert r.p == pytest.approx(2 * (1 + 7) / 2**7)
    assert mcnemar(b, a).p == pytest.approx(r.p) and mcnemar(b, a).difference == pytest.approx(-0.5)
    assert mcnemar([True, False], [True, False]).p == 1.0  # no discordant item: no evidence either way
    with pytest.raises(ValueError, match="one of each per item"):
        mcnemar([True], [True, False])


def test_a_p_value_prints_at_its_precision_and_one_that_underflows_as_a_bound():
    """McNemar's test over 300k tokens can return p = 0.0 (below the smallest float): printed as a bound, not 0."""
    from recipes.common.stats import format_p, mcnemar

    assert [format_p(p) for p in (None, 0.5, 0.0497, 0.00042, 1e-250)] == ["-", "0.50", "0.0497", "4.2e-04", "1.0e-250"]
    underflow = mcnemar([True] * 30000 + [False] * 18000, [False] * 30000 + [True] * 18000).p
    assert underflow == 0.0 and format_p(underflow) == "< 1e-300"


def test_wilson_interval_matches_published_values_and_stays_in_bounds():
    """Wilson's score interval at 95%: 0 of 10 -> [0, 0.2775], 5 of 10 -> [0.2366, 0.7634] (Newcombe 1998, table I's
    method 3 gives these); all of n stays below 1, and n = 0 is refused."""
    from recipes.common.stats import wilson

    assert wilson(0, 10) == pytest.approx((0.0, 0.2775), abs=1e-4)
    assert wilson(5, 10) == pytest.approx((0.2366, 0.7634), abs=1e-4)
    low, high = wilson(10, 10)
    assert low == pytest.approx(1 - 0.2775, abs=1e-4) and high == pytest.approx(1.0)
    with pytest.raises(ValueError, match="n=0"):
        wilson(0, 0)
