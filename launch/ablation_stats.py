"""Statistics for an ablation table: mean/spread over seeds and paired t-intervals."""

from __future__ import annotations

import math
from typing import Mapping, NamedTuple, Sequence

import numpy as np
from scipy import stats


class Summary(NamedTuple):
  mean: float
  std: float  # sample standard deviation (ddof=1); nan for n < 2
  n: int


class PairedDifference(NamedTuple):
  """``arm - baseline`` over seeds both completed: mean and a t-based confidence interval."""

  mean: float
  ci_low: float
  ci_high: float
  n: int
  seeds: tuple[int, ...]


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


def paired_difference(arm: Mapping[int, float], baseline: Mapping[int, float],
                      confidence: float = 0.95) -> PairedDifference:
  """Paired ``arm - baseline`` by seed: ``mean ± t_{(1+c)/2, n-1} * sd / sqrt(n)``.

  Only seeds present in both are paired. With fewer than two pairs the interval is
  undefined (nan).
  """
  if not 0.0 < confidence < 1.0:
    raise ValueError(f"confidence must be in (0, 1), got {confidence}")
  seeds = tuple(sorted(set(arm) & set(baseline)))
  d = np.asarray([arm[s] - baseline[s] for s in seeds], dtype=np.float64)
  if d.size == 0:
    return PairedDifference(math.nan, math.nan, math.nan, 0, seeds)
  mean = float(d.mean())
  if d.size < 2:
    return PairedDifference(mean, math.nan, math.nan, 1, seeds)
  half = float(stats.t.ppf(0.5 + confidence / 2, d.size - 1) * d.std(ddof=1) / math.sqrt(d.size))
  return PairedDifference(mean, mean - half, mean + half, int(d.size), seeds)
