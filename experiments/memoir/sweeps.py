"""The Memoir sweeps: coupled vs read-only pondering, at a short and a long budget.

The paper uses 12 seeds at 240 steps but 8 at 960, so the two budgets are two sweeps
of the same experiment; the long one's directory lies inside the short one's, whose
appendix (:mod:`experiments.memoir.appendix`) reports both:

    python -m launch.sweep --sweep=memoir --sweep_dir=experiments/memoir/report
    python -m launch.sweep --sweep=memoir_long --sweep_dir=experiments/memoir/report/long
    python -m launch.report --sweep_dir=experiments/memoir/report   # after both

The warmup is a fraction of ``num_steps``, so the long budget has the same schedule
shape. ``coupled`` is the baseline: the report's paired difference
``read_only - coupled`` is the paper's "read-only lead".
"""

from __future__ import annotations

import dataclasses

from experiments.common.sweep_spec import Arm, Sweep
from experiments.memoir.experiment import MemoirExperimentConfig

SHORT_STEPS = 240
LONG_STEPS = 960
SHORT_SEEDS = tuple(range(12))
LONG_SEEDS = tuple(range(8))


def memoir() -> Sweep:
  """Short budget: coupled vs read-only, 240 steps, 12 seeds (24 runs)."""
  return Sweep(
      name="memoir", module="experiments.memoir",
      base=MemoirExperimentConfig(num_steps=SHORT_STEPS),
      arms=(Arm("coupled", {"mode": "coupled"}), Arm("read_only", {"mode": "read_only"})),
      seeds=SHORT_SEEDS, baseline="coupled",
      metrics=("eval/recall", "eval/energy_margin", "train/recall", "eval/expected_depth",
               "eval/memory_drift"),
      higher_is_better=("eval/recall", "eval/energy_margin", "train/recall"),
      curves=("eval/recall", "train/energy_margin", "eval/energy_margin", "train/loss",
              "train/expected_depth"),
      description="Memoir in miniature: does rewriting the fast memory while pondering "
                  "(coupled) hurt recall against read-only pondering at a fixed budget?",
      appendix="experiments.memoir.appendix:memoir_appendix",
      report_dir="experiments/memoir/report")


def memoir_long() -> Sweep:
  """Long budget: the same sweep at 960 steps over seeds 0-7 (16 runs)."""
  short = memoir()
  return dataclasses.replace(short, name="memoir_long",
                             base=dataclasses.replace(short.base, num_steps=LONG_STEPS),
                             seeds=LONG_SEEDS, appendix="",
                             report_dir="experiments/memoir/report/long")
