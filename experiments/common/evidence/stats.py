"""Statistics for sweep reports: spread over seeds, paired differences and their tests.

Used by the report builder (``launch.report``) and by the papers' report appendices
(``experiments/<paper>/appendix.py``), which may not import ``launch``. Differences are
paired by seed (each arm's seed s shares data order, initialisation and keys with the
baseline's seed s), so the t-interval is on the per-seed differences.
"""

from __future__ import annotations

import math
from typing import Mapping, NamedTuple, Sequence

import numpy as np
from scipy import stats


class Summary(NamedTuple):
  mean: float
  std: float  # sample standard deviation (ddof=1); nan for n < 2
  n: int


class Interval(NamedTuple):
  """A mean and its t-based confidence interval over seeds."""

  mean: float
  ci_low: float
  ci_high: float
  n: int


class PairedDifference(NamedTuple):
  """``arm - baseline`` over the seeds both completed: mean, t-interval and t-test.

  ``t``/``p``: the paired t statistic and its two-sided p-value (n - 1 degrees of
  freedom; inf/0 when every difference is equal and non-zero, nan for all-zero
  differences or n < 2). ``wins``/``ties``: seeds where the difference is > 0 / == 0.
  """

  mean: float
  ci_low: float
  ci_high: float
  n: int
  seeds: tuple[int, ...]
  t: float = math.nan
  p: float = math.nan
  wins: int = 0
  ties: int = 0

  @property
  def df(self) -> int:
    return self.n - 1

  @property
  def excludes_zero(self) -> bool:
    """The interval lies strictly on one side of 0 (needs n >= 2)."""
    return self.n >= 2 and (self.ci_low > 0 or self.ci_high < 0)


class Equivalence(NamedTuple):
  """Paired TOST (two one-sided t-tests) of ``|arm - baseline| < margin``.

  ``p`` is the larger of the two one-sided p-values; equivalence is shown at level
  ``alpha`` when ``p < alpha``, i.e. when the ``1 - 2 alpha`` interval
  ``[ci_low, ci_high]`` lies inside ``(-margin, margin)``.
  """

  mean: float
  ci_low: float
  ci_high: float
  margin: float
  p: float
  n: int

  def equivalent(self, alpha: float = 0.05) -> bool:
    return self.n >= 2 and self.p < alpha


def _t_half(sd: float, n: int, confidence: float) -> float:
  if not 0.0 < confidence < 1.0:
    raise ValueError(f"confidence must be in (0, 1), got {confidence}")
  return float(stats.t.ppf(0.5 + confidence / 2, n - 1) * sd / math.sqrt(n))


def summarize(values: Sequence[float]) -> Summary:
  """Mean and sample std of finite ``values`` (non-finite values are an error)."""
  x = np.asarray(values, dtype=np.float64)
  if x.ndim != 1:
    raise ValueError(f"expected a 1-D sequence, got shape {x.shape}")
  if not np.all(np.isfinite(x)):
    raise ValueError(f"non-finite values: {values}")
  if x.size == 0:
    return Summary(math.nan, math.nan, 0)
  return Summary(float(x.mean()), float(x.std(ddof=1)) if x.size > 1 else math.nan, int(x.size))


def mean_interval(values: Sequence[float], confidence: float = 0.95) -> Interval:
  """Mean ± ``t_{(1+c)/2, n-1} sd / sqrt(n)`` of ``values`` (nan interval for n < 2)."""
  s = summarize(values)
  if s.n == 0:
    raise ValueError("need at least one value")
  if s.n < 2:
    return Interval(s.mean, math.nan, math.nan, 1)
  half = _t_half(s.std, s.n, confidence)
  return Interval(s.mean, s.mean - half, s.mean + half, s.n)


def format_spread(values: Sequence[float | None], digits: int = 4, scale: float = 1.0, *,
                  empty: str = "n/a") -> str:
  """``"mean ± sample std"`` of the finite ``values`` times ``scale`` (just the value
  for one; ``empty`` for none), for report tables."""
  xs = [x * scale for x in values if x is not None and math.isfinite(x)]
  if not xs:
    return empty
  if len(xs) == 1:
    return f"{xs[0]:.{digits}f}"
  return f"{np.mean(xs):.{digits}f} ± {np.std(xs, ddof=1):.{digits}f}"


def _paired(arm: Mapping[int, float], baseline: Mapping[int, float]
            ) -> tuple[tuple[int, ...], np.ndarray]:
  seeds = tuple(sorted(set(arm) & set(baseline)))
  return seeds, np.asarray([arm[s] - baseline[s] for s in seeds], dtype=np.float64)


def paired_difference(arm: Mapping[int, float], baseline: Mapping[int, float],
                      confidence: float = 0.95) -> PairedDifference:
  """Paired ``arm - baseline`` by seed: ``mean ± t_{(1+c)/2, n-1} * sd / sqrt(n)`` and
  the paired t-test. Only seeds present in both are paired; with fewer than two pairs
  the interval and the test are undefined (nan)."""
  if not 0.0 < confidence < 1.0:
    raise ValueError(f"confidence must be in (0, 1), got {confidence}")
  seeds, d = _paired(arm, baseline)
  if d.size == 0:
    return PairedDifference(math.nan, math.nan, math.nan, 0, seeds)
  mean = float(d.mean())
  wins, ties = int(np.sum(d > 0)), int(np.sum(d == 0))
  if d.size < 2:
    return PairedDifference(mean, math.nan, math.nan, 1, seeds, wins=wins, ties=ties)
  n, sd = int(d.size), float(d.std(ddof=1))
  half = _t_half(sd, n, confidence)
  if sd > 0:
    t = mean / (sd / math.sqrt(n))
    p = float(2 * stats.t.sf(abs(t), n - 1))
  else:
    t, p = (math.nan, math.nan) if mean == 0 else (math.copysign(math.inf, mean), 0.0)
  return PairedDifference(mean, mean - half, mean + half, n, seeds, float(t), p, wins, ties)


def paired_equivalence(arm: Mapping[int, float], baseline: Mapping[int, float],
                       margin: float, alpha: float = 0.05) -> Equivalence:
  """Paired TOST of ``-margin < arm - baseline < margin`` (margin stated in advance).

  The two one-sided t-tests on the per-seed differences (n - 1 degrees of freedom);
  the reported interval is the ``1 - 2 alpha`` t-interval of the mean difference.
  """
  if not margin > 0:
    raise ValueError(f"margin must be > 0, got {margin}")
  if not 0.0 < alpha < 0.5:
    raise ValueError(f"alpha must be in (0, 0.5), got {alpha}")
  _, d = _paired(arm, baseline)
  if d.size < 2:
    return Equivalence(float(d.mean()) if d.size else math.nan, math.nan, math.nan,
                       margin, math.nan, int(d.size))
  n, mean, sd = int(d.size), float(d.mean()), float(d.std(ddof=1))
  se = sd / math.sqrt(n)
  if se == 0:
    p = 0.0 if abs(mean) < margin else 1.0
  else:
    p_low = float(stats.t.sf((mean + margin) / se, n - 1))   # H0: mean <= -margin
    p_high = float(stats.t.cdf((mean - margin) / se, n - 1))  # H0: mean >= +margin
    p = max(p_low, p_high)
  half = _t_half(sd, n, 1 - 2 * alpha)
  return Equivalence(mean, mean - half, mean + half, margin, p, n)


def sign_test(differences: Sequence[float]) -> tuple[int, int, float]:
  """``(positives, non-zero count, two-sided exact binomial p)`` of ``differences``
  (zeros are dropped, as in the classical sign test)."""
  d = np.asarray(differences, np.float64)
  d = d[d != 0]
  if d.size == 0:
    return 0, 0, math.nan
  k = int(np.sum(d > 0))
  return k, int(d.size), float(stats.binomtest(k, int(d.size), 0.5).pvalue)


def seeds_needed(mean: float, sd: float, power: float = 0.8, alpha: float = 0.05,
                 cap: int = 100_000) -> int | None:
  """The smallest number of paired seeds at which a fixed-n two-sided paired t-test at
  level ``alpha`` detects a true mean difference ``mean`` (per-seed sd ``sd``) with
  probability at least ``power``: the noncentral t, power =
  P(|T| > t_{1-alpha/2, n-1}) with T ~ t'(n-1, mean*sqrt(n)/sd). None when ``mean`` is 0
  or no n up to ``cap`` reaches ``power``. How many seeds an undecided claim's observed
  effect would need, were it the true effect (a point estimate: a guide, not a promise).
  """
  if not (math.isfinite(mean) and math.isfinite(sd)) or mean == 0 or sd <= 0:
    return None
  delta = abs(mean) / sd
  # The normal approximation undershoots the t-test's n by a few: search upward from it.
  z = stats.norm.ppf(1 - alpha / 2) + stats.norm.ppf(power)
  n = max(2, int((z / delta) ** 2) - 2)
  while n <= cap:
    crit = stats.t.ppf(1 - alpha / 2, n - 1)
    nc = delta * math.sqrt(n)
    achieved = stats.nct.sf(crit, n - 1, nc) + stats.nct.cdf(-crit, n - 1, nc)
    if achieved >= power:
      return n
    n += 1
  return None


class MedianInterval(NamedTuple):
  """A distribution-free interval for the median of paired differences: the order
  statistics ``[d_(k), d_(n+1-k)]`` with the largest ``k`` whose exact binomial coverage
  ``1 - 2 P(Bin(n, 1/2) < k)`` is at least the level asked (``coverage`` is the exact
  value; it assumes only independent differences with a continuous distribution)."""

  median: float
  ci_low: float
  ci_high: float
  coverage: float
  n: int


def median_interval(differences: Sequence[float], confidence: float = 0.95
                    ) -> MedianInterval:
  """The sign-test interval for the median of ``differences`` (:class:`MedianInterval`):
  the check beside a t-interval when the differences are far from normal (heavy tails).
  With too few values for ``confidence`` (n < 6 at 95%) the interval is the full range
  and ``coverage`` says what it reaches."""
  d = np.sort(np.asarray(differences, np.float64))
  n = int(d.size)
  if n == 0:
    return MedianInterval(math.nan, math.nan, math.nan, math.nan, 0)
  k, coverage = 1, 1 - 2 * float(stats.binom.cdf(0, n, 0.5))
  for j in range(2, n // 2 + 1):
    c = 1 - 2 * float(stats.binom.cdf(j - 1, n, 0.5))
    if c < confidence:
      break
    k, coverage = j, c
  return MedianInterval(float(np.median(d)), float(d[k - 1]), float(d[n - k]), coverage, n)


class ClaimDecision(NamedTuple):
  """A declared claim decided by the fixed-n rule of the claims table: the paired
  difference, the equivalence test (``equivalent`` and ``not_better`` claims; else
  None), the seeds where the arm is better in the metric's direction, the one-sided 95%
  bound on the gain (``not_better``; else None) and the verdict."""

  difference: PairedDifference
  equivalence: Equivalence | None
  better: int
  gain_bound: float | None
  verdict: str


def decide_claim(kind: str, margin: float, arm: Mapping[int, float],
                 baseline: Mapping[int, float], higher_is_better: bool) -> ClaimDecision:
  """The fixed-n verdict of a claim of ``kind`` (better / worse / equivalent /
  not_better) on ``arm`` against ``baseline`` (seed -> value): 95% paired t-interval,
  TOST at level 0.05 within ``margin``, one-sided non-superiority at level 0.05."""
  d = paired_difference(arm, baseline)
  # Seeds where the arm is better in the metric's own direction (a lower loss is a
  # win), not merely seeds with a positive difference.
  sign = 1.0 if higher_is_better else -1.0
  better = sum(sign * (arm[s] - baseline[s]) > 0 for s in arm if s in baseline)
  if d.n < 2:
    return ClaimDecision(d, None, better, None, f"not decided ({d.n} paired seeds)")
  if kind == "equivalent":
    e = paired_equivalence(arm, baseline, margin)
    verdict = ("held (equivalent within the margin)" if e.equivalent(0.05) else
               "differs" if d.excludes_zero else
               "not decided (no power to show equivalence)")
    return ClaimDecision(d, e, better, None, verdict)
  if kind == "not_better":
    e = paired_equivalence(arm, baseline, margin)  # its 90% interval's ends
    bound = e.ci_high if higher_is_better else -e.ci_low  # one-sided 95% bound
    verdict = ("held (no gain beyond the margin)" if bound < margin else
               "opposite" if d.excludes_zero and d.mean * sign > 0 else
               "not decided (the bound reaches the margin)")
    return ClaimDecision(d, e, better, bound, verdict)
  claimed = sign if kind == "better" else -sign
  if not d.excludes_zero:
    return ClaimDecision(d, None, better, None, "not decided (the interval holds 0)")
  return ClaimDecision(d, None, better, None,
                       "held" if (d.mean > 0) == (claimed > 0) else "opposite")
