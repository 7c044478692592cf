"""Paired statistics for the reproduced tables: two heads compared seed by seed.

Two cells with the same seed share the data order and the initialisation of every layer but the head, so the
difference of their scores removes most of the seed-to-seed spread. For a table's family of comparisons (each head
against softmax, per split):

* :func:`paired` gives the mean paired difference, its two-sided ``1 - alpha`` confidence interval (Student's t with
  ``n - 1`` degrees of freedom), the paired t statistic and its two-sided p-value, and the exact sign test's p-value
  (how often the difference has one sign, under "either sign is as likely");
* :func:`holm` adjusts the p-values of a family (Holm 1979, step-down): a comparison is significant at ``alpha`` when
  its adjusted p-value is at most ``alpha``, with the family-wise error rate at most ``alpha``;
* :func:`mcnemar` compares two classifiers on the same items (McNemar's exact test on the items where they disagree);
* :func:`wilson` gives a proportion's interval (a success rate over queries);
* :func:`detectable` gives what a comparison could have found: the smallest true mean difference that a two-sided
  paired t-test at a given level detects with a given power (80%), from the seeds' paired standard deviation
  (the noncentral t distribution), to set beside the difference a paper claims.

With 3 seeds a paired t-test has 2 degrees of freedom (t = 4.30 for a 95% interval): only large, consistent
differences pass; the wording of the report follows these tests, not a rule of thumb on standard deviations.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import List, Optional, Sequence

import numpy as np
from scipy import special as _special
from scipy import stats as _stats


@dataclass(frozen=True)
class Paired:
    """One paired comparison (``a - b`` per seed)."""

    n: int
    mean: float
    std: Optional[float]  # sample std of the differences (None for n < 2)
    low: Optional[float]  # confidence interval of the mean difference
    high: Optional[float]
    t: Optional[float]
    p: Optional[float]  # two-sided paired t-test
    p_sign: float  # two-sided exact sign test (ties dropped)
    positive: int  # seeds where a > b

    def describe(self, digits: int = 2) -> str:
        """``+1.23 [0.45, 2.01], p = 0.012 (t-test), 5/5 positive`` (for the report)."""
        if self.low is None:
            return f"{self.mean:+.{digits}f} (one seed: no interval)"
        return (
            f"{self.mean:+.{digits}f} [{self.low:+.{digits}f}, {self.high:+.{digits}f}], p = {format_p(self.p)} "
            f"(paired t, {self.n} seeds), {self.positive}/{self.n} positive"
        )


def format_p(p: Optional[float]) -> str:
    """A p-value as the report writes it: 2 decimals from 0.1, 4 below (so 0.0497 is not shown as 0.050), then
    scientific below 0.001, and "< 1e-300" below that: a p of 0 is a bound, whether it underflowed (a binomial
    test's over 300k tokens) or came from a paired test without spread."""
    if p is None:
        return "-"
    if p < 1e-300:
        return "< 1e-300"
    return f"{p:.2f}" if p >= 0.1 else f"{p:.4f}" if p >= 0.001 else f"{p:.1e}"


def format_diff(x: float, sign: bool = True) -> str:
    """A difference as the report writes it: 2 decimals, or 2 significant digits when it is not 0 but would round to
    0.00 there (a significant -0.0004 is not shown as -0.00); ``sign``: with its + or -."""
    if x != 0 and abs(x) < 0.005:
        return f"{x:+.2g}" if sign else f"{x:.2g}"
    return f"{x:+.2f}" if sign else f"{x:.2f}"


def format_seeds(n: int, planned: Optional[int] = None) -> str:
    """A count of seeds as the reports print it: ``"2"``, or ``"2 of 5"`` while seeds fixed before the runs are to
    come."""
    return f"{n} of {planned}" if planned and n < planned else str(n)


def paired(a: Sequence[float], b: Sequence[float], alpha: float = 0.05) -> Paired:
    """The paired comparison of ``a`` and ``b`` (the same seeds, in the same order)."""
    if len(a) != len(b) or not a:
        raise ValueError(f"paired: need two equally long, non-empty lists of scores (got {len(a)} and {len(b)})")
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"paired: alpha must be in (0, 1), got {alpha}")
    d = [float(x) - float(y) for x, y in zip(a, b)]
    n = len(d)
    mean = sum(d) / n
    positive, negative = sum(x > 0 for x in d), sum(x < 0 for x in d)
    p_sign = (
        min(1.0, 2 * _stats.binom.cdf(min(positive, negative), positive + negative, 0.5))
        if positive + negative
        else 1.0
    )
    if n < 2:
        return Paired(n, mean, None, None, None, None, None, p_sign, positive)
    std = math.sqrt(sum((x - mean) ** 2 for x in d) / (n - 1))
    se = std / math.sqrt(n)
    q = _stats.t.ppf(1 - alpha / 2, n - 1)
    if se == 0.0:  # every seed the same difference: no spread to test against
        t, p = (math.copysign(math.inf, mean), 0.0) if mean != 0 else (0.0, 1.0)
    else:
        t = mean / se
        p = float(2 * _stats.t.sf(abs(t), n - 1))
    return Paired(n, mean, std, mean - q * se, mean + q * se, t, p, float(p_sign), positive)


def holm(pvalues: Sequence[Optional[float]], size: int = 0) -> List[Optional[float]]:
    """Holm's step-down adjusted p-values of a family (None stays None and does not count in the family; a NaN, which
    cannot be ranked, is refused). ``size``: the family's planned size, when some of its comparisons have no p-value
    yet; they count as p = 1 (last in the ranking), so an adjusted p does not shrink while they wait."""
    if any(p is not None and math.isnan(p) for p in pvalues):
        raise ValueError(f"holm: a p-value is NaN (a test on NaN scores?): {list(pvalues)}")
    known = sorted((p, i) for i, p in enumerate(pvalues) if p is not None)
    m = max(len(known), size)
    adjusted: List[Optional[float]] = [None] * len(pvalues)
    running = 0.0
    for rank, (p, i) in enumerate(known):
        running = max(running, min(1.0, (m - rank) * p))
        adjusted[i] = running
    return adjusted


#: the reports' test level (Holm-adjusted p-values are read against it; the detectable difference divides it by the
#: family's size, Holm's first step) and the power at which a difference counts as detectable
ALPHA, POWER = 0.05, 0.8
#: how many quantiles of the variance's distribution :func:`detectable` averages the power over
_POWER_QUANTILES = 20000


def detectable(std: Optional[float], n: int, alpha: float, power: float = 0.8) -> Optional[float]:
    """The smallest true mean paired difference that a two-sided paired t-test of ``n`` seeds at level ``alpha``
    detects with probability ``power``, when the differences spread with standard deviation ``std`` (the observed
    one: an estimate). None below 2 seeds or without a spread."""
    if std is None or n < 2 or std <= 0.0:
        return None
    if not 0.0 < alpha < 1.0 or not 0.0 < power < 1.0:
        raise ValueError(f"detectable: alpha and power must be in (0, 1), got {alpha} and {power}")
    # The test rejects when |mean| > q s / sqrt(n), s**2 ~ std**2 chi2(df) / df independent of the mean: its power at a
    # true difference delta is the normal tail beyond q sqrt(v / df) - nc, averaged over v's distribution, here over
    # 20,000 evenly spaced quantiles of chi2(df) (midpoints: within ~1e-6 of the exact power). scipy's non-central t
    # gives NaN for large non-centralities at df = 1 (its lower tail), which would end the search early.
    df, q = n - 1, _stats.t.ppf(1 - alpha / 2, n - 1)
    quantiles = (np.arange(_POWER_QUANTILES) + 0.5) / _POWER_QUANTILES
    critical = q * np.sqrt(_stats.chi2.ppf(quantiles, df) / df)

    def power_at(delta: float) -> float:
        nc = delta * math.sqrt(n) / std
        return float(np.mean(_special.ndtr(nc - critical) + _special.ndtr(-nc - critical)))

    low, high = 0.0, std
    while power_at(high) < power:
        high *= 2
    for _ in range(100):  # bisection: power grows with the difference
        mid = (low + high) / 2
        low, high = (mid, high) if power_at(mid) < power else (low, mid)
    return high


def paired_bootstrap_p(
    baseline: Sequence[str], system: Sequence[str], references: Sequence[str], samples: int = 1000
) -> float:
    """sacrebleu's paired bootstrap resampling (Koehn 2004; ``sacrebleu REF -i BASE SYS --paired-bs``): the p-value
    of ``system``'s BLEU differing from ``baseline``'s on one test set, from ``samples`` resamplings of the
    sentences with sacrebleu's own seed (``SACREBLEU_SEED``, default 12345), so a rerun gives the same p."""
    from sacrebleu.metrics import BLEU
    from sacrebleu.significance import PairedTest

    if not len(baseline) == len(system) == len(references):
        raise ValueError(
            f"paired_bootstrap_p: {len(baseline)} baseline, {len(system)} system hypotheses and "
            f"{len(references)} references: one of each per sentence"
        )
    test = PairedTest(
        [("baseline", list(baseline)), ("system", list(system))],
        {"BLEU": BLEU()},
        [list(references)],
        test_type="bs",
        n_samples=samples,
    )
    _, scores = test()
    return float(scores["BLEU"][1].p_value)


@dataclass(frozen=True)
class McNemar:
    """Two classifiers scored on the same items (``a`` and ``b`` right or wrong per item)."""

    n: int  # items
    a_only: int  # items a gets right and b wrong
    b_only: int  # items b gets right and a wrong
    difference: float  # a's accuracy minus b's, (a_only - b_only) / n
    p: float  # two-sided exact McNemar test: the binomial test of a_only among the a_only + b_only discordant items


def mcnemar(a_right: Sequence[bool], b_right: Sequence[bool]) -> McNemar:
    """McNemar's exact test of two classifiers on the same items (e.g. two heads' top-1 on the same test tokens):
    only the items where they disagree count, a_only of them for ``a`` against b_only for ``b``, two-sided p of
    the binomial test at 1/2 (1 without discordant items)."""
    a, b = np.asarray(a_right, dtype=bool), np.asarray(b_right, dtype=bool)
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError(f"mcnemar: {a.shape} and {b.shape} outcomes: one of each per item, the same items")
    a_only, b_only = int((a & ~b).sum()), int((b & ~a).sum())
    p = 1.0 if a_only + b_only == 0 else float(_stats.binomtest(a_only, a_only + b_only, 0.5).pvalue)
    return McNemar(len(a), a_only, b_only, (a_only - b_only) / len(a) if len(a) else 0.0, p)


def wilson(successes: float, n: int, z: float = 1.959963984540054) -> tuple:
    """Wilson's score interval ``(low, high)`` of a binomial proportion, ``successes`` of ``n`` (95% by default):
    unlike the normal approximation it stays inside [0, 1] and is not empty at 0 or ``n`` successes."""
    if n < 1:
        raise ValueError(f"wilson: n={n}; it must be >= 1")
    p = successes / n
    centre, half = p + z * z / (2 * n), z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return (centre - half) / (1 + z * z / n), (centre + half) / (1 + z * z / n)
