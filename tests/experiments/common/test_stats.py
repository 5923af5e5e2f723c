"""experiments.common.evidence.stats: spread, paired differences and tests, against hand-worked
values and scipy's own implementations."""

import math

import numpy as np
import pytest
from scipy import stats

from experiments.common.evidence.stats import (format_spread, mean_interval, paired_difference,
                                               paired_equivalence, sign_test, summarize)


def test_paired_difference_by_hand():
  base = {0: 1.0, 1: 2.0, 2: 3.0, 3: 9.0}
  arm = {0: 2.0, 1: 4.0, 2: 6.0}  # seed 3 missing: pairs only seeds 0-2
  d = paired_difference(arm, base)
  assert d.n == 3 and d.seeds == (0, 1, 2) and d.mean == pytest.approx(2.0)
  half = 4.302652729911275 * 1.0 / math.sqrt(3)  # t_{0.975, 2} * sd / sqrt(n)
  assert d.ci_low == pytest.approx(2.0 - half) and d.ci_high == pytest.approx(2.0 + half)
  one = paired_difference({0: 1.0}, {0: 0.5})
  assert one.n == 1 and one.mean == 0.5 and math.isnan(one.ci_low)
  assert paired_difference({}, {}).n == 0


def test_paired_matches_scipy_ttest():
  rng = np.random.default_rng(0)
  base = rng.normal(size=6)
  arm = base + 0.3 + 0.1 * rng.normal(size=6)
  d = paired_difference(dict(enumerate(arm)), dict(enumerate(base)))
  res = stats.ttest_rel(arm, base)
  ci = res.confidence_interval(0.95)
  assert d.ci_low == pytest.approx(ci.low) and d.ci_high == pytest.approx(ci.high)


def test_summarize():
  s = summarize([1.0, 2.0, 3.0])
  assert s.mean == 2.0 and s.std == 1.0 and s.n == 3
  assert math.isnan(summarize([1.0]).std)
  with pytest.raises(ValueError):
    summarize([1.0, float("nan")])


def test_format_spread():
  assert format_spread([1.0, 2.0, 3.0], 2) == "2.00 ± 1.00"
  assert format_spread([5.0], 1) == "5.0"
  # Non-finite and missing values are left out; scale multiplies before formatting.
  assert format_spread([1.0, float("nan"), None, 3.0], 1, 100.0) == "200.0 ± 141.4"
  assert format_spread([]) == "n/a" and format_spread([], empty="") == ""


def test_paired_t_statistic_wins_and_ties_by_hand():
  arm = {0: 0.7, 1: 0.8, 2: 0.6, 3: 0.9}
  base = {0: 0.5, 1: 0.8, 2: 0.4, 3: 0.6}
  d = paired_difference(arm, base)
  diffs = [0.2, 0.0, 0.2, 0.3]
  mean = sum(diffs) / 4
  sd = math.sqrt(sum((x - mean) ** 2 for x in diffs) / 3)
  assert d.t == pytest.approx(mean / (sd / 2))
  assert d.p == pytest.approx(stats.ttest_rel(list(arm.values()), list(base.values())).pvalue)
  assert (d.wins, d.ties, d.n, d.df) == (3, 1, 4, 3)
  same = paired_difference({0: 1.0, 1: 2.0}, {0: 0.5, 1: 1.5})  # constant difference
  assert same.t == math.inf and same.p == 0.0
  assert math.isnan(paired_difference({0: 1.0}, {0: 0.0}).t)


def test_mean_interval():
  s = mean_interval([0.5, 0.7, 0.6])
  half = 4.302652729911275 * 0.1 / math.sqrt(3)
  assert s.mean == pytest.approx(0.6) and s.n == 3
  assert (s.ci_low, s.ci_high) == pytest.approx((0.6 - half, 0.6 + half))
  assert math.isnan(mean_interval([1.0]).ci_low)
  with pytest.raises(ValueError):
    mean_interval([])


def test_paired_equivalence_matches_two_one_sided_scipy_tests():
  rng = np.random.default_rng(1)
  base = rng.normal(size=10)
  arm = base + 0.01 + 0.05 * rng.normal(size=10)
  e = paired_equivalence(dict(enumerate(arm)), dict(enumerate(base)), margin=0.1)
  d = arm - base
  lower = stats.ttest_1samp(d, -0.1, alternative="greater").pvalue
  upper = stats.ttest_1samp(d, 0.1, alternative="less").pvalue
  assert e.p == pytest.approx(max(lower, upper)) and e.equivalent(0.05)
  ci = stats.ttest_1samp(d, 0.0).confidence_interval(0.90)
  assert (e.ci_low, e.ci_high) == pytest.approx((ci.low, ci.high))
  # The same differences cannot show equivalence within a margin they exceed.
  assert not paired_equivalence(dict(enumerate(arm)), dict(enumerate(base)),
                                margin=0.005).equivalent(0.05)
  with pytest.raises(ValueError, match="margin"):
    paired_equivalence({0: 1.0}, {0: 1.0}, margin=0.0)


def test_sign_test_exact_binomial():
  assert sign_test([1.0] * 8) == (8, 8, pytest.approx(2 * 0.5 ** 8))
  k, n, p = sign_test([0.3, -0.1, 0.0, 0.2, 0.5])  # the zero is dropped
  assert (k, n) == (3, 4) and p == pytest.approx(stats.binomtest(3, 4).pvalue)
  assert math.isnan(sign_test([0.0, 0.0])[2])


def test_seeds_needed_matches_published_paired_t_sample_sizes():
  # Two-sided paired t-test, level 0.05, power 0.8: n for effect sizes d = 0.2, 0.5, 1
  # (Cohen's tables as G*Power reproduces them: 199, 34, 10).
  from experiments.common.evidence.stats import seeds_needed
  assert seeds_needed(0.2, 1.0) == 199
  assert seeds_needed(-1.0, 2.0) == 34  # sign does not matter; only |mean| / sd
  assert seeds_needed(1.0, 1.0) == 10
  assert seeds_needed(0.0, 1.0) is None


def test_median_interval_coverage_by_counting():
  # The sign-test interval [d_(k), d_(n+1-k)]: coverage 1 - 2 P(Bin(n, 1/2) < k),
  # counted here with math.comb; k the largest with coverage >= 0.95.
  from experiments.common.evidence.stats import median_interval
  for n in (6, 9, 20, 60):
    d = np.random.default_rng(n).standard_t(2, size=n)
    cover = lambda k: 1 - 2 * sum(math.comb(n, i) for i in range(k)) / 2 ** n
    k = max(j for j in range(1, n // 2 + 1) if cover(j) >= 0.95)
    m = median_interval(d)
    s = np.sort(d)
    assert (m.ci_low, m.ci_high, m.n) == (s[k - 1], s[n - k], n)
    assert m.coverage == pytest.approx(cover(k), abs=1e-12)
