"""The ``fair_cast`` sweep: how the served bf16 copy lags float32 masters in RL.

    python -m launch.sweep --sweep=fair_cast --sweep_dir=experiments/fair_cast/report \
        --parallel=2

GRPO on 3-digit addition (:mod:`experiments.fair_cast`) with float32 masters started on
the bf16 grid and a bf16 sampler exported at every update. Arms: export rounding
(nearest, stochastic, error feedback) x loss on the served copy (off / on) x optimizer
(Adam at 1e-5 and 3e-5; SGD with momentum 0.9 at 3e-4 and 1e-3, chosen so its
per-update master change is of the same order: the report lists the measured
``master_step_rms``), 2 seeds, 128 updates.

The appendix (:mod:`experiments.fair_cast.appendix`) tabulates, per arm, the effective
lag k*, the unchanged fraction, the share of the masters' movement the sampler sees,
the sampler-learner mismatch, the reward and the learner's greedy accuracy, and the
per-update time as a ratio to the nearest-export arm with the same optimizer, learning
rate and loss (paired by seed).
"""

from __future__ import annotations

from experiments.common.sweep_spec import Arm, Sweep
from experiments.fair_cast.experiment import FairCastConfig

SEEDS = (0, 1)
ROUNDINGS = ("nearest", "stochastic", "error_feedback")
OPTIMIZERS = (("adam", 1e-5), ("adam", 3e-5), ("sgdm", 3e-4), ("sgdm", 1e-3))
_LR = {1e-5: "1e-5", 3e-5: "3e-5", 3e-4: "3e-4", 1e-3: "1e-3"}
BASELINE = "adam_lr1e-5_nearest"


def arm_name(optimizer: str, lr: float, rounding: str, served: bool) -> str:
  return f"{optimizer}_lr{_LR[lr]}_{rounding}" + ("_served" if served else "")


def fair_cast() -> Sweep:
  """3 roundings x loss on served copy x 4 optimizer settings, 2 seeds."""
  base = FairCastConfig(num_updates=128, eval_every=16, lag_every=8, lag_history=128)
  arms = tuple(
      Arm(arm_name(opt, lr, rounding, served),
          {"optimizer_kind": opt, "learning_rate": lr, "export_rounding": rounding,
           "loss_on_served": served})
      for opt, lr in OPTIMIZERS for served in (False, True) for rounding in ROUNDINGS)
  return Sweep(
      name="fair_cast", module="experiments.fair_cast", base=base, arms=arms,
      seeds=SEEDS, baseline=BASELINE,
      metrics=("reward/mean_over_training", "eval/greedy_accuracy",
               "export/unchanged_fraction", "train/mismatch_k3"),
      higher_is_better=("reward/mean_over_training", "eval/greedy_accuracy"),
      curves=("export/lag_steps", "export/visible_displacement", "train/mismatch_k3"),
      appendix="experiments.fair_cast.appendix:fair_cast_appendix",
      description="Fair Cast in miniature: float32 masters, a bf16 sampler exported "
      "every update with nearest / stochastic / error-feedback rounding, with and "
      "without the loss on the served copy, Adam and SGD with momentum at two "
      "learning rates each. Arms are <optimizer>_lr<lr>_<rounding>[_served].",
      report_dir="experiments/fair_cast/report")
