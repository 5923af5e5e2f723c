"""A confirmatory sweep's claims next to their pilot's, for its report's appendix.

A confirmatory sweep (issue 36) decides a paper's claims again on fresh evaluation
seeds with a sequential plan (:mod:`experiments.common.sweeps.sequential`), declared and
committed before its first run. The decisions use the fresh seeds alone. The appendix
shows each claim's pilot result beside it: the committed pilot sweep's fixed-n paired
statistics on the pilot's own seeds and the verdict the fixed claims table gives them
(:func:`experiments.common.evidence.stats.decide_claim`, the rule ``launch.report.claim_verdict``
applies too; a test holds the two equal on every committed pilot claim).

A :class:`Pilot` names where the pilot figure comes from: the pilot's report directory
(relative to the repository root, read from the committed files, so a copied
confirmatory report rebuilds the same), the arms and the metric in the pilot's names,
and, where the pilot measured the comparison only along a curve (not as a results-row
metric), the step of the TensorBoard curve to read. ``declared`` says whether the pilot
had declared the comparison as a claim; an undeclared one is a descriptive figure.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Callable, Mapping, Sequence

from experiments.common.evidence.stats import decide_claim
from experiments.common.evidence.tensorboard_reader import read_scalars
from experiments.common.harness.repo_paths import REPO_DIR
from experiments.common.sweeps.sequential import (ClaimOutcome, SequentialPlan, claim_outcome,
                                                  interval_cell)
from experiments.common.sweeps.sweep_data import (evaluation_metrics, read_manifest,
                                                  read_sweep_info, run_dir)

LOOKS_FILE = "looks.jsonl"


@dataclasses.dataclass(frozen=True)
class Pilot:
  """Where a confirmatory claim's pilot figure comes from (see the module docstring)."""

  report_dir: str
  arm: str
  baseline: str
  metric: str = ""  # "": the confirmatory claim's metric
  step: int | None = None  # read the metric's curve at this step, not the results row
  declared: bool = True
  note: str = ""


def _fmt(x: float, digits: int = 4) -> str:
  return "n/a" if x != x else f"{x:.{digits}f}"  # nan != nan


def fixed_verdict(kind: str, margin: float, arm: Mapping[int, float],
                  baseline: Mapping[int, float], higher_is_better: bool) -> tuple[str, str]:
  """(statistics cell, verdict) of a claim under the fixed-n rule of the claims table
  (:func:`experiments.common.evidence.stats.decide_claim`, which ``launch.report.claim_verdict``
  uses too), in this appendix's shorter wording."""
  c = decide_claim(kind, margin, arm, baseline, higher_is_better)
  d, e = c.difference, c.equivalence
  cell = (f"{_fmt(d.mean)} [{_fmt(d.ci_low)}, {_fmt(d.ci_high)}], n = {d.n}, arm better "
          f"on {c.better}/{d.n}")
  if d.n >= 2 and kind == "equivalent":
    cell += f"; TOST ±{margin:g}: 90% CI [{_fmt(e.ci_low)}, {_fmt(e.ci_high)}]"
  elif d.n >= 2 and kind == "not_better":
    cell += f"; one-sided 95% bound on the gain {_fmt(c.gain_bound)} (margin {margin:g})"
  return cell, c.verdict


def _curve_values(report_dir: str, arm: str, metric: str, step: int) -> dict[int, float]:
  manifest = read_manifest(report_dir)
  out = {}
  for m in manifest:
    if m["arm"] != arm or m.get("calibration"):
      continue
    directory = run_dir(report_dir, m["run_name"])
    if not os.path.isdir(directory):
      continue
    for s, v in read_scalars(directory).get(metric, []):
      if s == step:
        out[m["seed"]] = float(v)
  return out


def pilot_values(pilot: Pilot, metric: str) -> tuple[dict[int, float], dict[int, float],
                                                     dict[str, Any]]:
  """(arm values, baseline values, the pilot's sweep info), by seed, from the committed
  pilot report (evaluation seeds only)."""
  directory = os.path.join(REPO_DIR, pilot.report_dir)
  metric = pilot.metric or metric
  if pilot.step is not None:
    info = read_sweep_info(directory)
    return (_curve_values(directory, pilot.arm, metric, pilot.step),
            _curve_values(directory, pilot.baseline, metric, pilot.step), info)
  info, runs = evaluation_metrics(directory)
  get = lambda a: {s: m[metric] for s, m in runs.get(a, {}).items() if metric in m}
  return get(pilot.arm), get(pilot.baseline), info


def read_looks(sweep_dir: str) -> list[dict[str, Any]]:
  """The recorded looks, in order (empty before the first look completes)."""
  path = os.path.join(sweep_dir, LOOKS_FILE)
  if not os.path.exists(path):
    return []
  with open(path) as f:
    return [json.loads(line) for line in f if line.strip()]


def confirmatory_outcomes(sweep_dir: str) -> list[ClaimOutcome]:
  """Every declared claim's sequential outcome after the recorded looks, recomputed from
  the sweep's results (what the report's claims table shows)."""
  info, runs = evaluation_metrics(sweep_dir)
  plan = SequentialPlan(**info["sequential"])
  higher = set(info.get("higher_is_better", []))
  done = len(read_looks(sweep_dir))
  out = []
  for c in info["claims"]:
    get = lambda a: {s: m[c["metric"]] for s, m in runs.get(a, {}).items()
                     if c["metric"] in m}
    out.append(claim_outcome(c, get(c["arm"]), get(c["baseline"]), c["metric"] in higher,
                             plan, info["seeds"][:plan.cap], done))
  return out


def _repeated_cell(claim: Mapping[str, Any], outcome: ClaimOutcome, plan: SequentialPlan,
                   higher: bool) -> str:
  if outcome.last is None:
    return "no paired seeds yet"
  return interval_cell(claim, outcome.last, plan, higher, constants=False)


def _decided(verdict: str) -> bool:
  return not verdict.startswith("not decided")


def side_by_side(sweep_dir: str, pilots: Mapping[str, Pilot],
                 extra_rows: Callable[[], Sequence[str]] | None = None) -> str:
  """Markdown: the confirmatory claims (keyed by their text in ``pilots``) with the
  pilot's fixed-n result and verdict beside the confirmatory repeated interval, the
  look that decided it and its verdict."""
  info = read_sweep_info(sweep_dir)
  plan = SequentialPlan(**info["sequential"])
  higher = set(info.get("higher_is_better", []))
  outcomes = confirmatory_outcomes(sweep_dir)
  schedule = plan.looks()
  lines = ["", "## Pilot and confirmatory, side by side", "",
           "The pilot is the committed sweep these claims were first tested in (its own "
           "seeds, fixed-n 95% paired t-interval and the fixed claims table's rule); the "
           "confirmatory result is this sweep's, on fresh seeds only, with the repeated "
           "interval at the look that decided the claim (or the last look). A pilot "
           "figure marked *descriptive* is the same comparison on the pilot's runs where "
           "the pilot had not declared it as a claim. The last column says whether the "
           "verdicts differ. Neither column pools the other's seeds.", "",
           "| claim | pilot: `arm − baseline` (seeds) | pilot verdict | confirmatory "
           "(looks at " + ", ".join(map(str, schedule)) + ") | look decided | "
           "confirmatory verdict | verdict changed? |",
           "|---|---|---|---|---|---|---|"]
  for i, (c, o) in enumerate(zip(info["claims"], outcomes), start=1):
    pilot = pilots.get(c["text"])
    if pilot is None:
      pcell, pverdict = "no pilot", "—"
    else:
      arm, base, pinfo = pilot_values(pilot, c["metric"])
      metric = pilot.metric or c["metric"]
      phigher = metric in set(pinfo.get("higher_is_better", [])) | higher
      cell, pverdict = fixed_verdict(c["kind"], float(c.get("margin") or 0.0), arm, base,
                                     phigher)
      where = (f"`{pilot.arm} − {pilot.baseline}`, `{metric}`"
               + (f" at step {pilot.step}" if pilot.step is not None else "")
               + f", {os.path.relpath(pilot.report_dir, 'experiments')}")
      pcell = f"{where}: {cell}" + ("" if pilot.declared else " (*descriptive*)")
      if pilot.note:
        pcell += f"; {pilot.note}"
      if not pilot.declared:
        pverdict = f"({pverdict}; not declared)"
    look = (f"{o.decided_look} of {len(schedule)}" if o.decided_look else "—")
    changed = "—" if pilot is None else (
        "no" if _same(pverdict, o.verdict) else "**yes**")
    lines.append(f"| {i}. {c['text']} | {pcell} | {pverdict} | "
                 f"{_repeated_cell(c, o, plan, c['metric'] in higher)} | {look} | "
                 f"**{o.verdict}** | {changed} |")
  if extra_rows is not None:
    lines += list(extra_rows())
  lines.append("")
  return "\n".join(lines)


def _same(pilot: str, confirm: str) -> bool:
  """Whether two verdicts say the same: both undecided, or the same decision."""
  pilot = pilot.strip("()").split(";")[0]
  if not _decided(pilot) and not _decided(confirm):
    return True
  return pilot.split(" (")[0] == confirm.split(" (")[0]


# ---- Sizing: the pilot's effect under the confirmatory plan ----------------------------

def simulated_power(mean: float, sd: float, kind: str, margin: float,
                    higher_is_better: bool, plan: SequentialPlan, reps: int = 4000,
                    seed: int = 0) -> dict[str, float]:
  """The chance that ``plan`` decides a claim (and each verdict's chance), and the
  expected seeds it uses, if the paired differences were normal with the pilot's
  ``mean`` and ``sd``: how a confirmatory sweep was sized (a point estimate from a small
  pilot, so a guide, not a promise)."""
  import numpy as np  # pylint: disable=import-outside-toplevel
  from experiments.common.sweeps.sequential import decide  # pylint: disable=import-outside-toplevel
  d = np.random.default_rng(seed).normal(mean, sd, size=(reps, plan.cap))
  index, code = decide(d, plan, kind, margin=margin, higher_is_better=higher_is_better)
  looks = np.asarray(plan.looks())
  used = np.where(index >= 0, looks[np.maximum(index, 0)], plan.cap)
  return {"decided": float(np.mean(code != 0)), "held": float(np.mean(code == 1)),
          "opposite": float(np.mean(code == 2)), "differs": float(np.mean(code == 3)),
          "expected_seeds": float(used.mean())}


def declaration(sweep: Any) -> dict[str, Any]:
  """A :class:`experiments.common.sweeps.sweep_spec.Sweep`'s claims, plan and metric directions
  as ``sweep.json`` records them (what :func:`sizing_table` reads)."""
  return {"claims": [dataclasses.asdict(c) for c in sweep.claims],
          "sequential": dataclasses.asdict(sweep.sequential),
          "higher_is_better": list(sweep.higher_is_better)}


def sizing_table(info: Mapping[str, Any], pilots: Mapping[str, Pilot]) -> str:
  """Markdown: for each claim, the pilot's paired mean and sd and what the declared plan
  would do at them (:func:`simulated_power`): the sizing stated in the declaration.
  ``info``: ``sweep.json``'s record, or :func:`declaration` of the sweep before a run."""
  import numpy as np  # pylint: disable=import-outside-toplevel
  plan = SequentialPlan(**info["sequential"])
  higher = set(info.get("higher_is_better", []))
  lines = ["", "## Sizing (from the pilot, before the runs)", "",
           "For each claim: the pilot's paired mean and standard deviation, and, if the "
           "confirmatory differences were normal with those, the chance that this plan "
           "decides the claim by its cap and the seeds it would use on average "
           "(`experiments.common.sweeps.confirmatory.simulated_power`, 4000 simulated sweeps, "
           "seed 0). The pilot's effect is a small-sample estimate: a guide to the cap, "
           "not a prediction of the verdict.", "",
           "| claim | pilot mean | pilot sd | n | P(decided by the cap) | held / opposite / "
           "differs | expected seeds |", "|---|---|---|---|---|---|---|"]
  for i, c in enumerate(info["claims"], start=1):
    pilot = pilots.get(c["text"])
    if pilot is None:
      continue
    arm, base, pinfo = pilot_values(pilot, c["metric"])
    seeds = [s for s in arm if s in base]
    d = np.asarray([arm[s] - base[s] for s in seeds], np.float64)
    if d.size < 2 or not d.std(ddof=1) > 0:
      lines.append(f"| {i} | {_fmt(float(d.mean()) if d.size else float('nan'))} | "
                   f"{_fmt(float(d.std(ddof=1)) if d.size > 1 else float('nan'))} | "
                   f"{d.size} | n/a | n/a | n/a |")
      continue
    metric = pilot.metric or c["metric"]
    p = simulated_power(float(d.mean()), float(d.std(ddof=1)), c["kind"],
                        float(c.get("margin") or 0.0),
                        metric in set(pinfo.get("higher_is_better", [])) | higher, plan)
    lines.append(f"| {i} | {_fmt(float(d.mean()))} | {_fmt(float(d.std(ddof=1)))} | "
                 f"{d.size} | {p['decided']:.2f} | {p['held']:.2f} / {p['opposite']:.2f} "
                 f"/ {p['differs']:.2f} | {p['expected_seeds']:.1f} |")
  lines.append("")
  return "\n".join(lines)


def undecided_table(sweep_dir: str) -> str:
  """Markdown: for each *better*/*worse* claim still undecided after the sweep's last
  look, its paired differences on the confirmatory seeds (mean, sd, n), the seeds a
  fixed-n paired t-test would need to decide the observed mean with 80% power were it
  the true effect (:func:`experiments.common.evidence.stats.seeds_needed`), and the
  distribution-free sign-test interval of the median difference beside the t-interval
  (:func:`experiments.common.evidence.stats.median_interval`). Empty when every such claim is
  decided."""
  import numpy as np  # pylint: disable=import-outside-toplevel
  from experiments.common.evidence.stats import median_interval, seeds_needed  # pylint: disable=import-outside-toplevel
  info, runs = evaluation_metrics(sweep_dir)
  rows = []
  for i, (c, o) in enumerate(zip(info["claims"], confirmatory_outcomes(sweep_dir)), 1):
    if _decided(o.verdict) or c["kind"] not in ("better", "worse"):
      continue
    arm, base = runs.get(c["arm"], {}), runs.get(c["baseline"], {})
    d = np.asarray([arm[s][c["metric"]] - base[s][c["metric"]] for s in sorted(arm)
                    if s in base and c["metric"] in arm[s] and c["metric"] in base[s]])
    if d.size < 2:
      continue
    mean, sd = float(d.mean()), float(d.std(ddof=1))
    need = seeds_needed(mean, sd)
    m = median_interval(d)
    rows.append(f"| {i} | {_fmt(mean)} | {_fmt(sd)} | {d.size} | "
                f"{need if need is not None else 'n/a'} | {_fmt(m.median)} "
                f"[{_fmt(m.ci_low)}, {_fmt(m.ci_high)}] ({100 * m.coverage:.1f}%) |")
  if not rows:
    return ""
  return "\n".join([
      "", "## Undecided claims: the seeds their observed effect would need", "",
      "For each *better*/*worse* claim not decided after the last look: the paired "
      "differences `arm − baseline` on this sweep's seeds, the seeds a fixed-n two-sided "
      "paired t-test at level 0.05 would need to decide that mean with 80% power were "
      "it the true effect (`experiments.common.evidence.stats.seeds_needed`; a sequential plan "
      "needs somewhat more at its cap), and the sign-test interval of the median "
      "difference with its exact coverage, which assumes no normality "
      "(`experiments.common.evidence.stats.median_interval`). The observed mean is itself "
      "uncertain: a guide to the scale of the next round, not a prediction.", "",
      "| claim | mean | sd | n | seeds needed (80% power, fixed n) | median [sign-test "
      "interval] (coverage) |", "|---|---|---|---|---|---|", *rows, ""])


def confirm_sections(sweep_dir: str, pilots: Mapping[str, Pilot]) -> str:
  """A confirmatory sweep's appendix: :func:`side_by_side`, :func:`undecided_table` and
  :func:`sizing_table`."""
  return (side_by_side(sweep_dir, pilots) + undecided_table(sweep_dir)
          + sizing_table(read_sweep_info(sweep_dir), pilots))


# ---- Count claims: "exact in n of n runs" ---------------------------------------------

COUNT_RULES = {"zero": lambda v: v == 0.0, "positive": lambda v: v > 0.0}


@dataclasses.dataclass(frozen=True)
class CountClaim:
  """A claim about every run of an arm, decided by a count, not a t-interval.

  Each run of ``arm`` either meets ``rule`` on ``metric`` (``"zero"``: exactly 0, e.g. a
  PPO ratio that is exactly 1; ``"positive"``: above 0) or not. Declared with a fixed
  number of runs n (the sweep's seeds): *held* when all n runs meet it, with the exact
  one-sided 95% upper bound on the rate of runs that would not (Clopper-Pearson:
  ``1 - 0.05^(1/n)`` for 0 of n); *not held* when any run does not, with the count.
  """

  text: str
  arm: str
  metric: str
  rule: str
  source: str = ""

  def __post_init__(self):
    if self.rule not in COUNT_RULES:
      raise ValueError(f"rule must be one of {tuple(COUNT_RULES)}, got {self.rule!r}")


def count_upper_bound(failures: int, n: int, level: float = 0.95) -> float:
  """Exact (Clopper-Pearson) one-sided ``level`` upper bound on a rate with
  ``failures`` of ``n``."""
  from scipy import stats  # pylint: disable=import-outside-toplevel
  if failures >= n:
    return 1.0
  return float(stats.beta.ppf(level, failures + 1, n - failures))


def count_verdict(claim: CountClaim, values: Mapping[int, float], n_declared: int
                  ) -> tuple[int, int, str]:
  """(runs meeting the rule, runs counted, verdict) for ``values`` (seed -> value)."""
  rule = COUNT_RULES[claim.rule]
  met = sum(bool(rule(v)) for v in values.values())
  n = len(values)
  if n < n_declared:
    return met, n, f"not decided ({n} of {n_declared} runs)"
  if met == n:
    return met, n, "held"
  return met, n, f"not held ({n - met} of {n} runs break it)"


def count_table(sweep_dir: str, claims: Sequence[CountClaim],
                pilots: Mapping[str, Pilot]) -> str:
  """Markdown: each count claim on this sweep's runs beside its pilot's count."""
  info, runs = evaluation_metrics(sweep_dir)
  n_declared = len(info["seeds"])
  word = {"zero": "exactly 0", "positive": "above 0"}
  lines = ["", "## Claims (counts, declared before the runs)", "",
           f"Each claim is about every run: it is *held* when all {n_declared} runs of its "
           "arm meet the rule, and the upper bound is the exact one-sided 95% bound on "
           "the rate of runs that would not (Clopper-Pearson). The pilot column counts the "
           "pilot's runs by the same rule (the pilot declared a paired t-interval against "
           "the dense learner instead, whose verdict is given); the decision uses this "
           "sweep's fresh seeds only.", "",
           "| claim | rule | pilot count | pilot's declared verdict | confirmatory count | "
           "95% upper bound on the rate of runs breaking it | verdict |",
           "|---|---|---|---|---|---|---|"]
  for i, c in enumerate(claims, start=1):
    values = {s: m[c.metric] for s, m in runs.get(c.arm, {}).items() if c.metric in m}
    met, n, verdict = count_verdict(c, values, n_declared)
    bound = count_upper_bound(n - met, n) if n else float("nan")
    pilot = pilots.get(c.text)
    pcount, pverdict = "—", "—"
    if pilot is not None:
      directory = os.path.join(REPO_DIR, pilot.report_dir)
      _, pruns = evaluation_metrics(directory)
      pvalues = [m[c.metric] for m in pruns.get(pilot.arm, {}).values() if c.metric in m]
      pmet = sum(bool(COUNT_RULES[c.rule](v)) for v in pvalues)
      pcount = f"{pmet} of {len(pvalues)}"
      pverdict = pilot.note or "—"
    lines.append(f"| {i}. {c.text} | `{c.arm}`: `{c.metric}` {word[c.rule]} | {pcount} | "
                 f"{pverdict} | {met} of {n} | {_fmt(bound, 3)} | **{verdict}** |")
  lines.append("")
  return "\n".join(lines)
