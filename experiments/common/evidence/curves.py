"""Reading logged curves ``[(step, value), ...]``: when a target was reached, the value
at a step. One definition for every experiment and report that asks."""

from __future__ import annotations

import math
from typing import Sequence

Curve = Sequence[tuple[int, float]]


def steps_to_target(curve: Curve, target: float, *, higher_is_better: bool = False,
                    interpolate: bool = True) -> float | None:
  """The step at which ``curve`` first reaches ``target``; None if it never does.

  "Reaches" is ``value <= target`` (a loss) or, with ``higher_is_better``,
  ``value >= target`` (an accuracy). With ``interpolate`` the step is interpolated
  linearly between the evaluation before the crossing and the first one past it (a
  curve evaluated every N steps otherwise rounds every arm up to a multiple of N);
  without it, the first evaluated step that reaches the target.
  """
  sign = -1.0 if higher_is_better else 1.0
  prev = None
  for step, value in sorted(curve):
    if sign * value <= sign * target:
      if not interpolate or prev is None or prev[1] == value:
        return float(step)
      s0, v0 = prev
      return s0 + (v0 - target) / (v0 - value) * (step - s0)
    prev = (step, value)
  return None


def value_at(curve: Curve, step: int) -> float:
  """The value logged at the last step <= ``step`` (nan if none)."""
  values = [v for s, v in sorted(curve) if s <= step]
  return values[-1] if values else math.nan
