"""The ``memoir`` sweep: coupled vs read-only pondering, at a short and a long budget.

``launch.sweep_spec.Sweep`` has one seed list for all arms, and the paper uses 12 seeds
at 240 steps but 8 at 960, so the two budgets are two sweeps of the same experiment:

    # short budget (the registered `memoir` sweep): 2 arms x 12 seeds x 240 steps
    python -m launch.sweep --sweep=memoir --sweep_dir=experiments/reports/memoir
    # long budget (= memoir_long()): 2 arms x 8 seeds x 960 steps
    python -m launch.sweep --sweep=memoir --sweep_dir=experiments/reports/memoir/long \\
        --override=num_steps=960 --seeds=0,1,2,3,4,5,6,7
    # t statistics, win counts and the long-budget table appended to the short REPORT.md
    python -m experiments.memoir_report --sweep_dir=experiments/reports/memoir \\
        --long_sweep_dir=experiments/reports/memoir/long

The warmup is a fraction of ``num_steps``, so overriding ``num_steps`` alone gives the
long budget the same schedule shape. ``coupled`` is the baseline: the report's paired
difference ``read_only - coupled`` is the paper's "read-only lead".
"""

from __future__ import annotations

import dataclasses

from launch.sweep_spec import Arm, Sweep

SHORT_STEPS = 240
LONG_STEPS = 960
SHORT_SEEDS = tuple(range(12))
LONG_SEEDS = tuple(range(8))
LONG_COMMAND_FLAGS = (f"--override=num_steps={LONG_STEPS}",
                      "--seeds=" + ",".join(str(s) for s in LONG_SEEDS))


def memoir() -> Sweep:
  """Short budget: coupled vs read-only, 240 steps, 12 seeds (24 runs)."""
  from experiments.memoir import MemoirExperimentConfig  # pylint: disable=import-outside-toplevel
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
                  "(coupled) hurt recall against read-only pondering at a fixed budget?")


def memoir_long() -> Sweep:
  """Long budget: the same sweep at 960 steps over seeds 0-7 (16 runs)."""
  short = memoir()
  return dataclasses.replace(short, base=dataclasses.replace(short.base, num_steps=LONG_STEPS),
                             seeds=LONG_SEEDS)
