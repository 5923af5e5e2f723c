"""A sweep's declaration: a base config, ablation arms and seeds (data, no machinery).

Each paper declares its sweeps in ``experiments/<paper>/sweeps.py`` with these types;
``launch`` expands them into runs (``launch.manifest``), runs them and builds the report.
The declaration lives here, below ``launch``, because the papers' folders may not import
``launch``.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from experiments.common.harness.config_flags import replace_checked
from experiments.common.sweeps.sequential import SequentialPlan


@dataclasses.dataclass(frozen=True)
class Arm:
  """One ablation arm: a name and the config fields it changes."""

  name: str
  overrides: Mapping[str, Any] = dataclasses.field(default_factory=dict)


CLAIM_KINDS = ("better", "worse", "equivalent", "not_better")
_MARGIN_KINDS = ("equivalent", "not_better")


@dataclasses.dataclass(frozen=True)
class Claim:
  """A claim the sweep exists to decide, declared before the runs.

  ``arm`` vs ``baseline`` on ``metric``, paired by seed (``arm - baseline`` per seed):

  * ``better`` / ``worse``: the paper says ``arm`` is better / worse on ``metric`` (in
    the metric's own direction: lower is better unless the sweep lists it in
    ``higher_is_better``). Decided by the paired 95% t-interval: *held* when it
    excludes 0 on the claimed side, *opposite* when on the other side, else *not
    decided*.
  * ``equivalent``: the paper says they match. Decided by a paired TOST at level 0.05
    with ``margin`` (stated here, before the runs): *held* when equivalence is shown,
    *differs* when the 95% interval excludes 0, else *not decided* (no power).
  * ``not_better``: the paper says ``arm`` is no better than ``baseline`` (e.g.
    "stronger cooling is not better"). Decided by the one-sided paired t-test of
    non-superiority at level 0.05 with ``margin``: *held* when the one-sided 95% upper
    bound of ``arm``'s gain (in the metric's better direction) is below ``margin``,
    *opposite* when the 95% interval shows a gain, else *not decided*.

  ``text`` is the claim in the paper's words, ``source`` where it comes from.
  """

  text: str
  kind: str
  arm: str
  baseline: str
  metric: str
  margin: float = 0.0
  source: str = ""

  def __post_init__(self):
    if self.kind not in CLAIM_KINDS:
      raise ValueError(f"claim kind must be one of {CLAIM_KINDS}, got {self.kind!r}")
    if self.kind in _MARGIN_KINDS and not self.margin > 0:
      raise ValueError(f"a {self.kind!r} claim needs a margin > 0, got {self.margin}")
    if self.kind not in _MARGIN_KINDS and self.margin:
      raise ValueError(f"margin is only for equivalence claims (kind {self.kind!r})")


@dataclasses.dataclass(frozen=True)
class Sweep:
  """An ablation: ``arms x seeds`` runs of ``module`` from ``base``.

  Attributes:
    name: the sweep's registry name.
    module: the experiment entry point, run as ``python -m <module>``.
    base: the experiment's config instance every run starts from.
    arms: the ablation arms; ``baseline`` names the one differences are taken against.
    seeds: the evaluation seeds: each arm runs once per seed (set in the config field
      ``seed_field``).
    calibration_seeds: seeds that were used to choose something before the sweep (a
      learning rate, a task difficulty). They may never be evaluation seeds; a run on
      one (``launch.sweep --seeds`` with ``--allow_calibration_seeds``) is kept out of
      the report's statistics.
    metrics: result metrics the report tabulates (lower is better unless listed in
      ``higher_is_better``); the first is the headline metric.
    curves: TensorBoard scalar tags the report plots.
    appendix: ``"module:function"``; ``function(sweep_dir) -> markdown`` is appended
      to the report (sweep-specific tables computed from the runs' data).
    report_dir: where the committed evidence of this sweep lives, relative to the
      repository root (``experiments/<paper>/report``); empty if none is committed.
    claims: the paper's claims this sweep decides (:class:`Claim`), tabulated by the
      report with their paired statistics and verdicts.
    sequential: a :class:`experiments.common.sweeps.sequential.SequentialPlan` (None: a fixed
      sweep, every arm on every seed): ``launch.sweep`` then runs the first ``cap``
      seeds in looks, only for the arms that an undecided claim names, and the report
      decides the claims by repeated confidence intervals (docs/sweeps.md).
  """

  name: str
  module: str
  base: Any
  arms: tuple[Arm, ...]
  seeds: tuple[int, ...]
  baseline: str
  metrics: tuple[str, ...] = ("eval/loss",)
  higher_is_better: tuple[str, ...] = ()
  curves: tuple[str, ...] = ("train/loss", "eval/loss")
  seed_field: str = "seed"
  description: str = ""
  appendix: str = ""
  calibration_seeds: tuple[int, ...] = ()
  report_dir: str = ""
  claims: tuple[Claim, ...] = ()
  sequential: SequentialPlan | None = None

  def __post_init__(self):
    names = [a.name for a in self.arms]
    if not names:
      raise ValueError(f"sweep {self.name!r} has no arms")
    if len(set(names)) != len(names):
      raise ValueError(f"sweep {self.name!r} has duplicate arm names: {names}")
    if self.baseline not in names:
      raise ValueError(f"baseline {self.baseline!r} is not one of the arms {names}")
    if self.appendix and self.appendix.count(":") != 1:
      raise ValueError(f"appendix must be 'module:function', got {self.appendix!r}")
    if not self.seeds or len(set(self.seeds)) != len(self.seeds):
      raise ValueError(f"sweep {self.name!r} needs distinct seeds, got {self.seeds}")
    overlap = sorted(set(self.seeds) & set(self.calibration_seeds))
    if overlap:
      raise ValueError(f"sweep {self.name!r}: seeds {overlap} were used for calibration "
                       "and cannot be evaluation seeds")
    if self.report_dir.startswith("/"):
      raise ValueError(f"report_dir must be relative to the repository root, got "
                       f"{self.report_dir!r}")
    for claim in self.claims:
      for arm in (claim.arm, claim.baseline):
        if arm not in names:
          raise ValueError(f"claim {claim.text!r} names arm {arm!r}, not one of {names}")
    if self.sequential is not None:
      if not isinstance(self.sequential, SequentialPlan):
        raise TypeError(f"sweep {self.name!r}: sequential must be a SequentialPlan, got "
                        f"{self.sequential!r}")
      if not self.claims:
        raise ValueError(f"sweep {self.name!r} has a sequential plan but no claims to decide")
      if self.sequential.cap > len(self.seeds):
        raise ValueError(f"sweep {self.name!r}: the sequential plan's cap "
                         f"{self.sequential.cap} exceeds its {len(self.seeds)} seeds")
    for arm in self.arms:  # fail at declaration, not halfway through a launch
      replace_checked(self.base, {**arm.overrides, self.seed_field: self.seeds[0]})
