"""The paired statistics of the reproduced tables (recipes/reproduce/stats.py) against hand-checked examples and
scipy's own tests."""
import math

import pytest

scipy_stats = pytest.importorskip("scipy.stats", reason="scipy not installed: run `make install` (recipes extra)")

from recipes.reproduce.stats import holm, paired  # noqa: E402


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
