"""Group-sequential decisions for a sweep's claims: repeated confidence intervals.

A sequential sweep declares, before its runs, a :class:`SequentialPlan`: looks after
``first``, ``first + batch``, ... evaluation seeds up to ``cap`` (the declared seeds in
order), and a Lan-DeMets alpha-spending function. At each look every undecided claim is
tested on the paired differences of all seeds so far with a *repeated* confidence
interval: ``mean ± c_k * sd / sqrt(n_k)``, whose critical value ``c_k`` is larger than the
fixed-n t quantile so that the chance of a false decision at *any* look stays within
the declared level. A claim decided at a look keeps that verdict; the sweep stops adding
seeds to an arm once every claim that names it is decided.

**Spending.** Each one-sided test at level ``a`` spends ``a(t)`` of its level by
information fraction ``t = n_k / cap``: O'Brien-Fleming-type
``a(t) = 2 - 2 Phi(z_{1 - a/2} / sqrt(t))`` (almost nothing early, nearly the fixed-n
critical value at the cap) or Pocock-type ``a(t) = a ln(1 + (e - 1) t)`` (even spending:
earlier stops, a wider last interval). This is the one-sided convention of gsDesign's
``sfLDOF``/``sfLDPocock`` (and ldbounds with a level per side); a two-sided test at
level ``alpha`` is two one-sided tests at ``alpha / 2``.

**Boundaries for the t statistic.** The usual recipe (z boundaries from the spending
function by recursive integration, each converted to its nominal level and read off the
t distribution with ``n_k - 1`` degrees of freedom) over-spends at 3-20 seeds: in a
simulation with looks of 3-5 seeds it gave one-sided error rates of 0.026-0.027
(O'Brien-Fleming-type) and 0.027-0.028 (Pocock-type) for a declared 0.025. So the
boundaries here are calibrated for the paired t statistic itself: under normal
differences the joint law of the t statistics at the looks does not depend on the mean
shift being tested or on the standard deviation, only on the look schedule, so ``c_k``
is found by simulating that law (:data:`CALIBRATION_PATHS` paths from a frozen legacy
``RandomState`` stream, so the boundaries are the same on every machine and NumPy
version): ``c_1`` is the exact t quantile at the first look's spend, and each later
``c_k`` the simulated quantile that makes the paths crossing first at look ``k`` exactly
the spend increment. To absorb the Monte Carlo error of that calibration the spend is
reduced by :data:`CALIBRATION_SAFETY` standard errors (1.8% of 0.025, 1.3% of 0.05,
with 2^20 paths). The simulation test
(``tests/experiments/common/test_sequential.py``) checks the error rates on fresh draws.

**Claims** (the kinds of :class:`experiments.common.sweeps.sweep_spec.Claim`, verdict words as
in the fixed claims table), with ``alpha`` the plan's level (0.05 by default):

* ``better``/``worse``: decided when the repeated ``1 - alpha`` interval excludes 0
  (*held* on the claimed side, *opposite* on the other). With no effect, the chance of
  either verdict at any look is at most ``alpha`` (``alpha / 2`` each).
* ``equivalent``: *held* when the repeated ``1 - 2 alpha`` interval lies inside
  ``(-margin, margin)`` (a repeated TOST at level ``alpha``; at most ``alpha`` when the
  true difference is ``±margin``); *differs* when the repeated ``1 - alpha`` interval
  excludes 0 (at most ``alpha`` with no difference).
* ``not_better``: *held* when the repeated one-sided ``1 - alpha`` bound on the arm's gain
  (in the metric's better direction) is below ``margin`` (at most ``alpha`` when the
  gain is ``margin``); *opposite* when the repeated ``1 - alpha`` interval shows a gain
  (at most ``alpha / 2`` with no gain).

Stopping a claim once it is decided cannot raise these rates: each is bounded by the
chance that its boundary is ever crossed.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Callable, Mapping, NamedTuple, Sequence

import numpy as np
from scipy import stats

SPENDING_FUNCTIONS = ("obrien_fleming", "pocock")

# Frozen stream (NumPy's legacy RandomState never changes its output), so a boundary
# and every report built from it reproduce exactly.
CALIBRATION_PATHS = 2**20
CALIBRATION_SEED = 36
CALIBRATION_SAFETY = 3.0  # Monte Carlo standard errors taken off the spend

# Verdict codes of the vectorized decisions (index into a claim's verdict words).
UNDECIDED, HELD, OPPOSITE, DIFFERS = 0, 1, 2, 3


@dataclasses.dataclass(frozen=True)
class SequentialPlan:
  """A sequential sweep's plan, declared with the sweep before any run.

  Looks at ``first, first + batch, ...`` evaluation seeds, the last at ``cap`` (the
  sweep's first ``cap`` declared seeds, in order). ``spending`` is ``"obrien_fleming"``
  or ``"pocock"`` (see the module docstring); ``alpha`` is the two-sided level of the
  *better*/*worse*/*differs*/*opposite* intervals and the one-sided level of the
  equivalence and non-superiority tests, as in the fixed claims table.
  """

  batch: int
  cap: int
  spending: str = "obrien_fleming"
  first: int = 0  # seeds at the first look; 0: ``batch``
  alpha: float = 0.05

  def __post_init__(self):
    for name in ("batch", "cap", "first"):
      value = getattr(self, name)
      if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"SequentialPlan.{name} must be an int, got {value!r}")
    if self.batch < 1:
      raise ValueError(f"SequentialPlan.batch must be >= 1, got {self.batch}")
    first = self.first or self.batch
    if first < 2:  # a t-interval needs two paired seeds
      raise ValueError(f"the first look needs >= 2 seeds, got {first} (batch {self.batch}, "
                       f"first {self.first})")
    if self.cap <= first:
      raise ValueError(f"SequentialPlan.cap ({self.cap}) must exceed the first look's "
                       f"{first} seeds: with one look, declare a fixed sweep")
    if self.spending not in SPENDING_FUNCTIONS:
      raise ValueError(f"SequentialPlan.spending must be one of {SPENDING_FUNCTIONS}, "
                       f"got {self.spending!r}")
    if not 0.0 < self.alpha < 0.5:
      raise ValueError(f"SequentialPlan.alpha must be in (0, 0.5), got {self.alpha}")

  def looks(self) -> tuple[int, ...]:
    """Seeds analysed at each look: ``first, first + batch, ..., cap``."""
    first = self.first or self.batch
    return tuple(range(first, self.cap, self.batch)) + (self.cap,)


def spent_alpha(spending: str, alpha: float, t) -> np.ndarray:
  """Level of a one-sided test at level ``alpha`` spent by information fraction ``t``."""
  t = np.asarray(t, dtype=np.float64)
  if np.any((t <= 0) | (t > 1)):
    raise ValueError(f"information fractions must be in (0, 1], got {t}")
  if spending == "obrien_fleming":
    return 2.0 - 2.0 * stats.norm.cdf(stats.norm.isf(alpha / 2) / np.sqrt(t))
  if spending == "pocock":
    return alpha * np.log1p((math.e - 1.0) * t)
  raise ValueError(f"spending must be one of {SPENDING_FUNCTIONS}, got {spending!r}")


def _check_looks(looks: Sequence[int], cap: int) -> tuple[int, ...]:
  looks = tuple(int(n) for n in looks)
  if not looks or looks[0] < 2 or any(b <= a for a, b in zip(looks, looks[1:])):
    raise ValueError(f"looks must be increasing seed counts >= 2, got {looks}")
  if looks[-1] > cap:
    raise ValueError(f"looks {looks} go past the cap {cap}")
  return looks


def calibrate(looks: Sequence[int], targets: np.ndarray, *, known_variance: bool = False,
              paths: int = CALIBRATION_PATHS, seed: int = CALIBRATION_SEED) -> np.ndarray:
  """Upper boundaries ``c[a, k]`` of the null t statistics (z with ``known_variance``)
  at ``looks`` such that, for each row ``a`` of ``targets`` (cumulative crossing
  probabilities per look), the paths first above ``c[a, k]`` at look ``k`` are the
  increment ``targets[a, k] - targets[a, k - 1]``: exactly (the t or normal quantile)
  at the first look, in ``paths`` simulated N(0, 1) paths after it (rounded down)."""
  looks = _check_looks(looks, looks[-1] if looks else 0)
  targets = np.atleast_2d(np.asarray(targets, dtype=np.float64))
  if targets.shape[1] != len(looks) or np.any(np.diff(targets, axis=1) < 0):
    raise ValueError(f"targets must be non-decreasing, one per look {looks}; got {targets}")
  rng = np.random.RandomState(seed)
  total, squares = np.zeros(paths), np.zeros(paths)
  alive = np.ones((targets.shape[0], paths), dtype=bool)
  bounds = np.empty(targets.shape)
  previous = 0
  for k, n in enumerate(looks):
    # Look-major draws: a schedule's first looks see the same numbers as any longer
    # schedule that begins with them, so boundaries never change as looks are added.
    x = rng.standard_normal((paths, n - previous))
    previous = n
    total += x.sum(axis=1)
    squares += np.einsum("ij,ij->i", x, x)
    mean = total / n
    if known_variance:
      statistic = mean * math.sqrt(n)
    else:
      var = np.maximum(squares - n * mean * mean, 0.0) / (n - 1)
      statistic = mean / np.sqrt(var / n)
    for a in range(targets.shape[0]):
      spend = targets[a, k] - (targets[a, k - 1] if k else 0.0)
      if k == 0:
        bounds[a, k] = (stats.norm.isf(spend) if known_variance
                        else stats.t.isf(spend, n - 1))
      else:
        candidates = statistic[alive[a]]
        crossing = min(int(math.floor(spend * paths)), candidates.size - 1)
        # The (crossing + 1)-th largest: exactly `crossing` alive paths lie above it.
        bounds[a, k] = np.partition(candidates, candidates.size - 1 - crossing)[
            candidates.size - 1 - crossing]
      alive[a] &= statistic <= bounds[a, k]
  return bounds


class Boundaries(NamedTuple):
  """Critical values of the repeated intervals at each look, on the t scale.

  ``two_sided[k]``: the repeated ``1 - alpha`` interval's (one-sided tests at
  ``alpha / 2``); ``one_sided[k]``: the repeated ``1 - 2 alpha`` interval's (one-sided
  tests at ``alpha``)."""

  looks: tuple[int, ...]
  two_sided: tuple[float, ...]
  one_sided: tuple[float, ...]


@functools.lru_cache(maxsize=64)
def boundaries(looks: tuple[int, ...], cap: int, alpha: float = 0.05,
               spending: str = "obrien_fleming") -> Boundaries:
  """The calibrated critical values for a claim analysed at ``looks`` (seed counts) of a
  plan with ``cap`` seeds. A prefix of a schedule has the same boundaries as the whole
  (spending depends only on the looks so far)."""
  looks = _check_looks(looks, cap)
  rows = []
  for level in (alpha / 2, alpha):
    relief = CALIBRATION_SAFETY * math.sqrt((1 - level) / (level * CALIBRATION_PATHS))
    rows.append(spent_alpha(spending, level, np.asarray(looks) / cap) * (1 - relief))
  c = calibrate(looks, np.stack(rows))
  return Boundaries(looks, tuple(float(x) for x in c[0]), tuple(float(x) for x in c[1]))


def look_statistics(differences: np.ndarray, looks: Sequence[int]
                    ) -> tuple[np.ndarray, np.ndarray]:
  """Mean and standard error of ``differences[..., :n]`` for each ``n`` in ``looks``:
  two arrays of shape ``(..., len(looks))``."""
  d = np.asarray(differences, dtype=np.float64)
  looks = _check_looks(looks, d.shape[-1])
  n = np.asarray(looks, dtype=np.float64)
  total = np.cumsum(d, axis=-1)[..., np.asarray(looks) - 1]
  mean = total / n
  # Two-pass variance per look (prefix sums of squares lose digits when |mean| >> sd).
  se = np.stack([d[..., :k].std(axis=-1, ddof=1) for k in looks], axis=-1) / np.sqrt(n)
  return mean, se


def look_verdicts(kind: str, mean: np.ndarray, se: np.ndarray, two_sided: Sequence[float],
                  one_sided: Sequence[float], *, margin: float = 0.0,
                  higher_is_better: bool = False) -> np.ndarray:
  """The verdict code each look alone would give (``UNDECIDED``, ``HELD``, ``OPPOSITE``,
  ``DIFFERS``), shape of ``mean``; the critical values broadcast over the last axis."""
  c2, c1 = np.asarray(two_sided), np.asarray(one_sided)
  better_sign = 1.0 if higher_is_better else -1.0
  with np.errstate(divide="ignore", invalid="ignore"):
    # Comparisons of t statistics, so a zero standard error decides by the mean's sign
    # and a zero mean with zero spread decides nothing (nan compares false).
    t_zero = mean / se
    above, below = t_zero > c2, t_zero < -c2
    codes = np.full(np.shape(mean), UNDECIDED, dtype=np.int8)
    if kind in ("better", "worse"):
      claimed_up = (kind == "better") == (better_sign > 0)
      codes[above] = HELD if claimed_up else OPPOSITE
      codes[below] = OPPOSITE if claimed_up else HELD
    elif kind == "equivalent":
      codes[above | below] = DIFFERS
      inside = ((mean + margin) / se > c1) & ((mean - margin) / se < -c1)
      codes[inside] = HELD
    elif kind == "not_better":
      gain = better_sign * mean
      codes[gain / se > c2] = OPPOSITE
      codes[(gain - margin) / se < -c1] = HELD
    else:
      raise ValueError(f"unknown claim kind {kind!r}")
  return codes


def first_decisions(codes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """``(look index, verdict code)`` of the first deciding look along the last axis
  (index -1 and ``UNDECIDED`` where no look decides)."""
  decided = codes != UNDECIDED
  index = np.where(decided.any(axis=-1), decided.argmax(axis=-1), -1)
  code = np.where(index >= 0, np.take_along_axis(
      codes, np.maximum(index, 0)[..., None], axis=-1)[..., 0], UNDECIDED)
  return index, code


def decide(differences: np.ndarray, plan: SequentialPlan, kind: str, *, margin: float = 0.0,
           higher_is_better: bool = False) -> tuple[np.ndarray, np.ndarray]:
  """Vectorized: the first deciding look and verdict code of a claim for each row of
  ``differences`` (shape ``(..., cap)``, ``arm - baseline`` in seed order) under
  ``plan``. Look index -1: not decided by the cap."""
  looks = plan.looks()
  b = boundaries(looks, plan.cap, plan.alpha, plan.spending)
  mean, se = look_statistics(differences, looks)
  codes = look_verdicts(kind, mean, se, b.two_sided, b.one_sided, margin=margin,
                        higher_is_better=higher_is_better)
  return first_decisions(codes)


# ---- One claim of a sweep, for the runner and the report ----------------------------

_HELD_WORDS = {"better": "held", "worse": "held",
               "equivalent": "held (equivalent within the margin)",
               "not_better": "held (no gain beyond the margin)"}
_UNDECIDED_WORDS = {"better": "not decided (the repeated interval holds 0)",
                    "worse": "not decided (the repeated interval holds 0)",
                    "equivalent": "not decided (no power to show equivalence)",
                    "not_better": "not decided (the bound reaches the margin)"}


class ClaimLook(NamedTuple):
  """One claim at one look: ``look`` (1-based, the plan's), the paired ``seeds`` used,
  the mean difference ``arm - baseline`` with its repeated ``1 - alpha`` interval
  (``ci``) and repeated ``1 - 2 alpha`` interval (``inner``), the critical values, the
  seeds where the arm is better in the metric's direction, and the look's verdict code."""

  look: int
  seeds: tuple[int, ...]
  mean: float
  ci: tuple[float, float]
  inner: tuple[float, float]
  two_sided: float
  one_sided: float
  arm_better: int
  code: int

  @property
  def n(self) -> int:
    return len(self.seeds)


class ClaimOutcome(NamedTuple):
  """A claim after the looks done so far: the verdict words, the look that decided it
  (0: none yet), and every look it was analysed at (ending at the deciding one)."""

  verdict: str
  decided_look: int
  history: tuple[ClaimLook, ...]

  @property
  def code(self) -> int:
    return self.history[-1].code if self.decided_look else UNDECIDED

  @property
  def last(self) -> ClaimLook | None:
    return self.history[-1] if self.history else None


def _fmt(x: float) -> str:
  return f"{x:.4f}" if math.isfinite(x) else "n/a"


def interval_cell(claim: Mapping, look: ClaimLook, plan: SequentialPlan,
                  higher_is_better: bool, *, constants: bool) -> str:
  """Markdown: a claim's repeated interval at ``look``, ``mean [lo, hi] (repeated 95%),
  n, arm better on a/n``, then the equivalence claims' inner interval or the
  non-superiority claims' one-sided bound on the gain. ``constants``: the claims
  table's form, with the critical values and the margin; else the side-by-side
  table's shorter one."""
  level, inner = f"{100 * (1 - plan.alpha):g}%", f"{100 * (1 - 2 * plan.alpha):g}%"
  c = f", c = {look.two_sided:.2f}" if constants else ""
  cell = (f"{_fmt(look.mean)} [{_fmt(look.ci[0])}, {_fmt(look.ci[1])}] (repeated "
          f"{level}{c}), n = {look.n}, arm better on {look.arm_better}/{look.n}")
  c = f" (c = {look.one_sided:.2f})" if constants else ""
  if claim["kind"] == "equivalent":
    margin = f"margin ±{claim['margin']:g}: " if constants else ""
    cell += (f"; {margin}repeated {inner} [{_fmt(look.inner[0])}, "
             f"{_fmt(look.inner[1])}]{c}")
  elif claim["kind"] == "not_better":
    bound = look.inner[1] if higher_is_better else -look.inner[0]
    if constants:
      cell += (f"; non-superiority margin {claim['margin']:g}: repeated one-sided "
               f"{level} bound on the gain {_fmt(bound)}{c}")
    else:
      cell += f"; repeated one-sided bound on the gain {_fmt(bound)}"
  return cell


def claim_outcome(claim: Mapping, arm: Mapping[int, float], baseline: Mapping[int, float],
                  higher_is_better: bool, plan: SequentialPlan, seeds: Sequence[int],
                  looks_done: int) -> ClaimOutcome:
  """The sequential verdict of one claim (``kind``, ``margin`` as in
  :class:`experiments.common.sweeps.sweep_spec.Claim`) after the first ``looks_done`` looks.

  ``seeds``: the plan's evaluation seeds in order (the sweep's first ``cap``); ``arm``,
  ``baseline``: seed -> value. A look uses the seeds up to its count that both arms
  have a value for; a look that adds no pair (a metric missing on the new seeds) is
  skipped, and the boundaries are those of the looks actually analysed (Lan-DeMets
  spending at ``n / cap``, so missing values only make the test more conservative).
  """
  schedule = plan.looks()
  if not 0 <= looks_done <= len(schedule):
    raise ValueError(f"looks_done must be in [0, {len(schedule)}], got {looks_done}")
  seeds = tuple(seeds)
  if len(seeds) < plan.cap:
    raise ValueError(f"the plan needs {plan.cap} seeds, got {len(seeds)}")
  kind, margin = claim["kind"], float(claim.get("margin") or 0.0)
  paired = [s for s in seeds[:plan.cap] if s in arm and s in baseline]
  analysed: list[tuple[int, int]] = []  # (plan look, paired seeds at it)
  for k, n in enumerate(schedule[:looks_done], start=1):
    m = sum(1 for s in paired if seeds.index(s) < n)
    if m >= 2 and (not analysed or m > analysed[-1][1]):
      analysed.append((k, m))
  if not analysed:
    return ClaimOutcome(f"not decided ({len(paired)} paired seeds)" if looks_done == len(
        schedule) else _not_yet(looks_done, len(schedule)), 0, ())
  counts = tuple(m for _, m in analysed)
  b = boundaries(counts, plan.cap, plan.alpha, plan.spending)
  d = np.asarray([arm[s] - baseline[s] for s in paired[:counts[-1]]], dtype=np.float64)
  mean, se = look_statistics(d, counts)
  codes = look_verdicts(kind, mean, se, b.two_sided, b.one_sided, margin=margin,
                        higher_is_better=higher_is_better)
  sign = 1.0 if higher_is_better else -1.0
  history = []
  for i, (k, m) in enumerate(analysed):
    c2, c1 = b.two_sided[i], b.one_sided[i]
    mu, s = float(mean[i]), float(se[i])
    history.append(ClaimLook(k, tuple(paired[:m]), mu, (mu - c2 * s, mu + c2 * s),
                             (mu - c1 * s, mu + c1 * s), c2, c1,
                             int(np.sum(sign * d[:m] > 0)), int(codes[i])))
    if codes[i] != UNDECIDED:
      return ClaimOutcome(verdict_words(kind, int(codes[i])), k, tuple(history))
  if looks_done < len(schedule):
    return ClaimOutcome(_not_yet(looks_done, len(schedule)), 0, tuple(history))
  return ClaimOutcome(_UNDECIDED_WORDS[kind], 0, tuple(history))


def _not_yet(done: int, total: int) -> str:
  return f"not decided yet (after look {done} of {total})"


def verdict_words(kind: str, code: int) -> str:
  """The claims table's words for a decided verdict code."""
  if code == HELD:
    return _HELD_WORDS[kind]
  if code == OPPOSITE:
    return "opposite"
  if code == DIFFERS:
    return "differs"
  raise ValueError(f"verdict code {code} is not a decision")


def sweep_outcomes(plan: SequentialPlan, claims: Sequence[Mapping], seeds: Sequence[int],
                   higher_is_better: Sequence[str],
                   values_of: Callable[[str, str], Mapping[int, float]],
                   looks_done: int) -> list[ClaimOutcome]:
  """Every claim's :func:`claim_outcome`; ``values_of(arm, metric) -> {seed: value}``."""
  higher = set(higher_is_better)
  return [claim_outcome(c, values_of(c["arm"], c["metric"]),
                        values_of(c["baseline"], c["metric"]), c["metric"] in higher,
                        plan, seeds, looks_done) for c in claims]


def arms_needed(claims: Sequence[Mapping], outcomes: Sequence[ClaimOutcome]) -> set[str]:
  """The arms an undecided claim names (as arm or baseline): the next look runs these."""
  return {name for c, o in zip(claims, outcomes) if not o.decided_look
          for name in (c["arm"], c["baseline"])}
