"""experiments.common.sweeps.sequential: spending, calibrated boundaries, and error control.

The simulations use fixed seeds, so every assertion is deterministic; each states what
its tolerance means. A false-decision rate is checked as ``observed <= level + 5 SE``
(SE the binomial Monte Carlo error of the observed rate): if the true rate is at most
the level, a single such check fails with probability below 2.9e-7, and the ~110 of them
here together below 4e-5. The calibration's own Monte Carlo error is covered in the
module, which takes 3 of its standard errors off the spend (so the boundaries' true
rate exceeds the level only if the calibration erred by more than 3 SE, probability
0.0013); the envelope checks below bound both errors together.
"""

import math

import numpy as np
import pytest
from scipy import optimize, stats

from experiments.common.sweeps import sequential as sq
from experiments.common.sweeps.sequential import SequentialPlan

PATHS = 2**19  # Monte Carlo paths per plan (fresh draws, not the calibration's stream)
Z = 5.0  # tolerance in Monte Carlo standard errors: P(N(0,1) > 5) = 2.9e-7

# Looks of 3-5 seeds, caps of 10-20, both spending functions, an unequal last batch.
PLANS = (SequentialPlan(batch=3, cap=12), SequentialPlan(batch=3, cap=12, spending="pocock"),
         SequentialPlan(batch=5, cap=20), SequentialPlan(batch=4, cap=10, spending="pocock"))


# ---- An independent reference: known-variance boundaries by numerical integration -----

def reference(fractions, bounds=None, cumulative=None, grid_points=2001):
  """Known-variance group-sequential boundaries by recursive numerical integration of
  the continuation density on the score scale (Armitage, McPherson & Rowe 1969):
  given ``bounds``, the probability that the z statistic of a standard Brownian motion
  first exceeds ``bounds[k]`` at information fraction ``fractions[k]``; given
  ``cumulative`` instead, the bounds that spend it, solved look by look. Returns
  ``(bounds, first-crossing probabilities)``."""
  solve = bounds is None
  bounds = [] if solve else list(bounds)
  spend = np.diff(np.concatenate([[0.0], cumulative])) if solve else None
  crossings, grid, density, weights = [], None, None, None
  for k, t in enumerate(fractions):
    if k == 0:
      def cross(c):
        return stats.norm.sf(c)
    else:
      sd = math.sqrt(t - fractions[k - 1])

      def cross(c, t=t, sd=sd):
        return float(np.sum(weights * density * stats.norm.sf((c * math.sqrt(t) - grid) / sd)))
    if solve:
      bounds.append(optimize.brentq(lambda c: cross(c) - spend[k], 0.0, 40.0, xtol=1e-10))
    c = bounds[k]
    crossings.append(cross(c))
    new = np.linspace(-10 * math.sqrt(t), c * math.sqrt(t), grid_points)
    if k == 0:
      density = stats.norm.pdf(new, scale=math.sqrt(t))
    else:
      density = (weights * density) @ (stats.norm.pdf((new[None] - grid[:, None]) / sd) / sd)
    grid = new
    weights = np.full(grid_points, grid[1] - grid[0])
    weights[[0, -1]] *= 0.5
  return np.asarray(bounds), np.asarray(crossings)


def test_spending_functions_match_published_boundaries():
  """gsDesign (sfLDOF, sfLDPocock; one-sided 0.025, 4 equally spaced looks) publishes
  these z boundaries; the reference integration of our spending reproduces them."""
  t = np.array([0.25, 0.5, 0.75, 1.0])
  published = {"obrien_fleming": [4.3326, 2.9631, 2.3590, 2.0141],
               "pocock": [2.3683, 2.3675, 2.3582, 2.3500]}
  for spending, z in published.items():
    cumulative = sq.spent_alpha(spending, 0.025, t)
    assert cumulative[-1] == pytest.approx(0.025)
    crossed = np.cumsum(reference(t, z)[1])
    # 4-decimal rounding moves a crossing probability by at most phi(z) * 5e-5 per look.
    np.testing.assert_allclose(crossed, cumulative, atol=2e-5)
  assert sq.spent_alpha("pocock", 0.05, 0.5) == pytest.approx(0.05 * math.log(1 + (math.e - 1) / 2))


def test_calibration_reproduces_the_known_variance_boundaries():
  """The production calibrator, run on z statistics: its boundaries' exact crossing
  probabilities (reference integration) match the spend within 5 Monte Carlo SE of the
  2^20 calibration paths (the cumulative error of a quantile calibration is that of a
  binomial proportion)."""
  looks = (3, 6, 9, 12)
  t = np.asarray(looks) / 12
  for spending in sq.SPENDING_FUNCTIONS:
    cumulative = sq.spent_alpha(spending, 0.025, t)
    bounds = sq.calibrate(looks, cumulative, known_variance=True)[0]
    assert bounds[0] == pytest.approx(stats.norm.isf(cumulative[0]))  # exact first look
    crossed = np.cumsum(reference(t, bounds)[1])
    se = np.sqrt(cumulative * (1 - cumulative) / sq.CALIBRATION_PATHS)
    assert np.all(np.abs(crossed - cumulative) <= Z * se + 1e-6), (spending, crossed)


def test_boundaries_are_deterministic_and_a_prefix_keeps_its_values():
  plan = SequentialPlan(batch=3, cap=12)
  whole = sq.boundaries(plan.looks(), 12, 0.05, "obrien_fleming")
  sq.boundaries.cache_clear()
  again = sq.boundaries(plan.looks(), 12, 0.05, "obrien_fleming")
  prefix = sq.boundaries(plan.looks()[:2], 12, 0.05, "obrien_fleming")
  assert whole == again and prefix.two_sided == whole.two_sided[:2]
  assert prefix.one_sided == whole.one_sided[:2]
  # The first look is the exact t quantile of its (safety-reduced) spend.
  relief = 1 - sq.CALIBRATION_SAFETY * math.sqrt(0.975 / (0.025 * sq.CALIBRATION_PATHS))
  first = stats.t.isf(sq.spent_alpha("obrien_fleming", 0.025, 0.25) * relief, 2)
  assert whole.two_sided[0] == pytest.approx(first)
  # O'Brien-Fleming-type: strict early, close to the fixed-n quantile at the cap.
  assert list(whole.two_sided) == sorted(whole.two_sided, reverse=True)
  assert stats.t.isf(0.025, 11) < whole.two_sided[-1] < 1.1 * stats.t.isf(0.025, 11)


def test_plan_validation_names_the_value():
  assert SequentialPlan(batch=3, cap=10).looks() == (3, 6, 9, 10)
  assert SequentialPlan(batch=4, cap=12, first=5).looks() == (5, 9, 12)
  with pytest.raises(ValueError, match="first look needs >= 2"):
    SequentialPlan(batch=1, cap=5)
  with pytest.raises(ValueError, match="cap"):
    SequentialPlan(batch=5, cap=5)
  with pytest.raises(ValueError, match="spending"):
    SequentialPlan(batch=3, cap=9, spending="haybittle")
  with pytest.raises(ValueError, match="alpha"):
    SequentialPlan(batch=3, cap=9, alpha=0.5)
  with pytest.raises(TypeError, match="cap"):
    SequentialPlan(batch=3, cap=9.0)


# ---- Error control and power, simulated --------------------------------------------

def _simulate(plan, seed):
  """Null look statistics of ``PATHS`` paired-difference paths (sd 0.03, a metric's
  scale; the t statistics do not depend on it), as (mean, se); a shift moves the mean."""
  z = np.random.default_rng(seed).standard_normal((PATHS, plan.cap)) * 0.03
  return z, *sq.look_statistics(z, plan.looks())


def _first(plan, kind, mean, se, **kw):
  b = sq.boundaries(plan.looks(), plan.cap, plan.alpha, plan.spending)
  return sq.first_decisions(sq.look_verdicts(kind, mean, se, b.two_sided, b.one_sided, **kw))


def _at_most(rate, level):
  se = math.sqrt(level * (1 - level) / PATHS)
  assert rate <= level + Z * se, f"rate {rate:.5f} > {level} + {Z} x {se:.5f}"


@pytest.mark.parametrize("index", range(len(PLANS)))
def test_false_decision_rates_are_within_alpha(index):
  plan, a = PLANS[index], PLANS[index].alpha
  z, mean, se = _simulate(plan, seed=100 + index)
  sigma = 0.03
  # better / worse with no effect: at most alpha / 2 per direction.
  for kind, higher in (("better", False), ("worse", True)):
    _, code = _first(plan, kind, mean, se, higher_is_better=higher)
    _at_most(np.mean(code == sq.HELD), a / 2)
    _at_most(np.mean(code == sq.OPPOSITE), a / 2)
    _at_most(np.mean(code != sq.UNDECIDED), a)
  # equivalent: "differs" with no difference; "held" at a difference of +-margin,
  # margins from half an sd to effectively infinite (where "differs" cannot pre-empt).
  for margin in (0.5 * sigma, sigma, 2 * sigma):
    _, code = _first(plan, "equivalent", mean, se, margin=margin)
    _at_most(np.mean(code == sq.DIFFERS), a)
    for shift in (margin, -margin):
      _, code = _first(plan, "equivalent", mean + shift, se, margin=margin)
      _at_most(np.mean(code == sq.HELD), a)
  # not_better (lower is better, so a gain is a negative difference): "held" at a gain
  # of exactly the margin, "opposite" with no gain (at most alpha / 2).
  for margin in (0.5 * sigma, sigma, 2 * sigma):
    _, code = _first(plan, "not_better", mean - margin, se, margin=margin)
    _at_most(np.mean(code == sq.HELD), a)
    _, code = _first(plan, "not_better", mean, se, margin=margin)
    _at_most(np.mean(code == sq.OPPOSITE), a / 2)
  # The worst case of every "held" above, with no early stop on another verdict: the
  # chance that the one-sided boundary is ever crossed. It is at most the level, and
  # within 5 SE (fresh draws and calibration together) of the spend the calibration
  # targets, so the boundaries are not needlessly conservative either.
  b = sq.boundaries(plan.looks(), plan.cap, plan.alpha, plan.spending)
  for level, c in ((a / 2, b.two_sided), (a, b.one_sided)):
    ever = np.mean(np.any(mean / se > np.asarray(c), axis=-1))
    _at_most(ever, level)
    target = level * (1 - sq.CALIBRATION_SAFETY * math.sqrt(
        (1 - level) / (level * sq.CALIBRATION_PATHS)))
    tolerance = Z * math.sqrt(level * (1 - level) * (1 / PATHS + 1 / sq.CALIBRATION_PATHS))
    assert ever >= target - tolerance, (level, ever)
  # decide() is the composition used above.
  look, code = sq.decide(z[:1000] - 0.03, plan, "better")
  ref_look, ref_code = _first(plan, "better", mean[:1000] - 0.03, se[:1000])
  np.testing.assert_array_equal(look, ref_look)
  np.testing.assert_array_equal(code, ref_code)


def test_the_usual_nominal_level_t_conversion_over_spends_at_these_n():
  """Why the boundaries are calibrated: z boundaries (reference integration) converted
  to nominal levels and read off t with n_k - 1 df give a one-sided error well above
  the declared 0.025 with looks of 3 seeds (Pocock-type; about 0.028)."""
  plan = SequentialPlan(batch=3, cap=12, spending="pocock")
  looks = np.asarray(plan.looks())
  z_bounds, _ = reference(looks / 12, cumulative=sq.spent_alpha("pocock", 0.025, looks / 12))
  naive = stats.t.isf(stats.norm.sf(z_bounds), looks - 1)
  _, mean, se = _simulate(plan, seed=7)
  rate = np.mean(np.any(mean / se > naive, axis=-1))
  assert rate > 0.025 + Z * math.sqrt(0.025 * 0.975 / PATHS)


# plan, effect (sd of the paired difference), and what the test holds: the least saving
# of expected seeds per arm, the most power lost at the cap against the fixed t-test on
# all `cap` seeds, and whether the plan's power beats the fixed design's at the plan's
# expected seed count (rounded up). With 2^19 paths the Monte Carlo SE of a power is
# below 0.0007 and of a mean seed count below 0.005; every margin below is over 10 SE.
POWER_CASES = (
    (PLANS[0], 1.0, 1.5, 0.04, True),
    (PLANS[1], 1.0, 2.3, 0.15, False),
    (PLANS[2], 0.8, 3.5, 0.03, True),
    (PLANS[3], 1.0, 1.4, 0.18, False),
)


def _fixed_power(d, n, alpha):
  t = d[:, :n].mean(axis=1) / (d[:, :n].std(axis=1, ddof=1) / math.sqrt(n))
  return np.mean(t < -stats.t.isf(alpha / 2, n - 1))


@pytest.mark.parametrize("case", range(len(POWER_CASES)))
def test_expected_seeds_and_power_against_the_fixed_design(case):
  """Alternative: the arm better by ``effect`` sd (lower loss). The plan stops early on
  average, costs at most the stated power at the cap against a fixed design of the
  same cap, and (O'Brien-Fleming-type) has more power than a fixed design of its
  expected size: the gain of looking. Pocock-type spending wastes its early level on
  looks of 3-4 seeds, where the t quantiles are huge; it stops earliest but pays in
  power (see docs/sweeps.md)."""
  plan, effect, saving, loss, beats_expected = POWER_CASES[case]
  z, mean, se = _simulate(plan, seed=200 + case)
  shift = -effect * 0.03
  look, code = _first(plan, "better", mean + shift, se)
  looks = np.asarray(plan.looks())
  expected_seeds = np.mean(np.where(look >= 0, looks[np.maximum(look, 0)], plan.cap))
  power = np.mean(code == sq.HELD)
  assert expected_seeds <= plan.cap - saving, expected_seeds
  assert power >= _fixed_power(z + shift, plan.cap, plan.alpha) - loss, power
  at_expected = _fixed_power(z + shift, math.ceil(expected_seeds), plan.alpha)
  assert (power > at_expected + 0.007) == beats_expected, (power, at_expected)
  # Equivalence with no true difference and a margin of one sd: decided early too.
  look, code = _first(plan, "equivalent", mean, se, margin=0.03)
  assert np.mean(np.where(look >= 0, looks[np.maximum(look, 0)], plan.cap)) < plan.cap - 1


# ---- One claim, by hand -------------------------------------------------------------

def test_claim_outcome_decides_at_the_first_look_that_crosses():
  plan = SequentialPlan(batch=3, cap=9)
  seeds = (10, 11, 12, 13, 14, 15, 16, 17, 18)
  base = {s: 1.0 for s in seeds}
  # A clear improvement (lower loss) on every seed with a little spread.
  arm = {s: 0.8 + 0.002 * (i % 3) for i, s in enumerate(seeds)}
  claim = {"kind": "better", "margin": 0.0}
  out = sq.claim_outcome(claim, arm, base, False, plan, seeds, looks_done=3)
  b = sq.boundaries((3, 6, 9), 9, 0.05, "obrien_fleming")
  d = np.asarray([arm[s] - 1.0 for s in seeds])
  first = next(k for k, n in enumerate((3, 6, 9))
               if abs(d[:n].mean()) / (d[:n].std(ddof=1) / math.sqrt(n)) > b.two_sided[k])
  assert out.verdict == "held" and out.decided_look == first + 1
  last = out.last
  n = (3, 6, 9)[first]
  half = b.two_sided[first] * d[:n].std(ddof=1) / math.sqrt(n)
  assert last.seeds == seeds[:n] and last.arm_better == n
  assert last.ci == pytest.approx((d[:n].mean() - half, d[:n].mean() + half))
  # The same data, claimed the other way, and as "worse": opposite / held.
  assert sq.claim_outcome(claim, arm, base, True, plan, seeds, 3).verdict == "opposite"
  assert sq.claim_outcome({"kind": "worse"}, arm, base, True, plan, seeds, 3).verdict == "held"


def test_claim_outcome_not_yet_and_undecided_and_missing_values():
  plan = SequentialPlan(batch=3, cap=6)
  seeds = tuple(range(6))
  base = {s: 0.0 for s in seeds}
  noisy = {0: 0.1, 1: -0.1, 2: 0.05, 3: -0.02, 4: 0.08, 5: -0.09}
  claim = {"kind": "better"}
  out = sq.claim_outcome(claim, noisy, base, False, plan, seeds, looks_done=1)
  assert out.verdict == "not decided yet (after look 1 of 2)" and out.decided_look == 0
  out = sq.claim_outcome(claim, noisy, base, False, plan, seeds, looks_done=2)
  assert out.verdict == "not decided (the repeated interval holds 0)"
  assert [h.look for h in out.history] == [1, 2] and out.last.n == 6
  # Seeds 1 and 2 lack the metric: look 1 has one pair (not analysed), look 2 four.
  gappy = {s: v for s, v in noisy.items() if s not in (1, 2)}
  out = sq.claim_outcome(claim, gappy, base, False, plan, seeds, looks_done=2)
  assert [(h.look, h.seeds) for h in out.history] == [(2, (0, 3, 4, 5))]
  b = sq.boundaries((4,), 6, 0.05, "obrien_fleming")
  assert out.last.two_sided == b.two_sided[0]
  eq = {"kind": "equivalent", "margin": 0.001}
  assert sq.claim_outcome(eq, noisy, base, False, plan, seeds, 2).verdict.startswith(
      "not decided (no power")
  same = {s: 1e-4 * (-1) ** s for s in seeds}
  assert sq.claim_outcome({"kind": "equivalent", "margin": 0.01}, same, base, False, plan,
                          seeds, 2).verdict == "held (equivalent within the margin)"
  assert sq.claim_outcome({"kind": "not_better", "margin": 0.01}, same, base, True, plan,
                          seeds, 2).verdict == "held (no gain beyond the margin)"
  assert sq.claim_outcome(claim, {}, base, False, plan, seeds, 2).verdict == (
      "not decided (0 paired seeds)")


def test_arms_needed_follow_the_undecided_claims():
  claims = [{"arm": "a", "baseline": "base"}, {"arm": "b", "baseline": "base"},
            {"arm": "c", "baseline": "b"}]
  decided = sq.ClaimOutcome("held", 1, ())
  open_ = sq.ClaimOutcome("not decided yet (after look 1 of 3)", 0, ())
  assert sq.arms_needed(claims, [decided, open_, decided]) == {"b", "base"}
  assert sq.arms_needed(claims, [decided, decided, open_]) == {"b", "c"}
  assert sq.arms_needed(claims, [decided] * 3) == set()


def _power_table():  # pragma: no cover - prints the numbers docs/sweeps.md quotes
  for case, (plan, effect, *_) in enumerate(POWER_CASES):
    z, mean, se = _simulate(plan, seed=200 + case)
    look, code = _first(plan, "better", mean - effect * 0.03, se)
    looks = np.asarray(plan.looks())
    expected = np.mean(np.where(look >= 0, looks[np.maximum(look, 0)], plan.cap))
    print(plan.spending, plan.looks(), effect, f"E[n] {expected:.2f}",
          f"power {np.mean(code == sq.HELD):.3f}",
          f"fixed at cap {_fixed_power(z - effect * 0.03, plan.cap, plan.alpha):.3f}",
          f"fixed at E[n] {_fixed_power(z - effect * 0.03, math.ceil(expected), plan.alpha):.3f}")
