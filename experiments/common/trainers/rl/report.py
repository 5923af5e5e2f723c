"""Reading a sweep of RL runs back for the papers' report tables."""

from __future__ import annotations

from typing import Any, Sequence

from experiments.common.evidence.stats import format_spread
from experiments.common.sweeps.sweep_data import completed_curves, read_sweep_info


def completed_runs(sweep_dir: str
                   ) -> tuple[dict[str, Any], dict[str, dict[int, dict[str, list]]]]:
  """Sweep info and ``arm -> seed -> tag -> [(update, value)]`` of the completed runs
  of a sweep over the RL loop: those that logged ``train/reward`` at the last update
  (events thinned by :mod:`launch.thin_events` keep it)."""
  info = read_sweep_info(sweep_dir)
  return completed_curves(sweep_dir, complete_tag="train/reward",
                          complete_step=int(info["base"]["num_updates"]))


def spread(xs: Sequence[float], digits: int = 3) -> str:
  """:func:`experiments.common.evidence.stats.format_spread` as the RL tables print it (3
  digits, an empty cell for no runs)."""
  return format_spread(xs, digits, empty="")
