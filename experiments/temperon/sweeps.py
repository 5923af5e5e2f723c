"""The ``temperon`` sweep: Temperon's arms and ablations in miniature.

    python -m launch.sweep --sweep=temperon --sweep_dir=experiments/temperon/report

Scaled down from the paper (WRN-110 on CIFAR, 100 epochs, 5 seeds) to fit ~20 minutes on
2 shared CPU cores: a 2-stage ResNet (width 16, one block per stage, ~30k params,
GroupNorm) on 300 training images of sklearn digits (the full 1438 make every arm ~99%;
fewer images make generalisation, where SAM acts, matter), 600 steps of batch 64
(~128 epochs of the subset), test on the fixed 359-image split, 4 seeds. Warm-up,
re-entry warm-up and rho ramp are scaled from 200/200/400 steps to 20/20/40.
"""

from __future__ import annotations

from experiments.common.sweep_spec import Arm, Sweep
from experiments.temperon.experiment import TemperonConfig

SEEDS = (0, 1, 2, 3)
BASELINE = "temperon"


def temperon() -> Sweep:
  """SGD, full-time SAM (SGD / Muon), Temperon and its ablations, paired over seeds."""
  base = TemperonConfig(num_steps=600, batch_size=64, train_examples=300, width=16,
                        eval_every=20, log_every=10, checkpoint_every=0,
                        progress_every_s=30.0, targets="0.95,0.97,0.98")
  full_time = {"refiner": "none"}
  arms = (
      Arm("temperon", {}),  # SGD + restarts for 43%, then SAM-Muon, momentum transfer
      Arm("sgd", {**full_time, "explorer": "sgd"}),
      Arm("sgd_sam", {**full_time, "explorer": "sgd_sam"}),
      Arm("sam_muon", {**full_time, "explorer": "muon_sam"}),
      Arm("abl_sgd_refiner", {"refiner": "sgd_sam"}),
      Arm("abl_single_cosine", {"explorer_schedule": "cosine"}),
      Arm("abl_handoff_0.25", {"handoff_fraction": 0.25}),
      Arm("abl_handoff_0.6", {"handoff_fraction": 0.6}),
  )
  return Sweep(
      name="temperon", module="experiments.temperon", base=base, arms=arms, seeds=SEEDS,
      baseline=BASELINE,
      metrics=("eval/accuracy", "eval/error", "eval/loss", "steps_to/0.95", "steps_to/0.97",
               "time_to/0.95", "time_to/0.97", "reached/0.97", "reached/0.98",
               "cost/grad_evals_per_step", "cost/total_s"),
      higher_is_better=("eval/accuracy", "reached/0.97", "reached/0.98"),
      curves=("eval/accuracy", "eval/loss", "train/loss"),
      description="Temperon (SGD explorer with warm restarts -> SAM-Muon refiner) vs "
      "full-time SAM, on 300 digits images (test: 359). Differences are arm - temperon. "
      "steps_to/time_to: first eval step (every 20) / calibrated seconds (steps x the "
      "run's median s/step per phase) reaching the test accuracy; seeds that never "
      "reach it are left out of those means (see reached/*).",
      appendix="experiments.temperon.appendix:cost_appendix",
      report_dir="experiments/temperon/report")
