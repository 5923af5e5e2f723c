"""The ``fair_cast`` sweep: how the served bf16 copy lags float32 masters in RL.

    python -m launch.sweep --sweep=fair_cast --sweep_dir=experiments/reports/fair_cast \
        --parallel=2

GRPO on 3-digit addition (:mod:`experiments.fair_cast`) with float32 masters started on
the bf16 grid and a bf16 sampler exported at every update. Arms: export rounding
(nearest, stochastic, error feedback) x loss on the served copy (off / on) x optimizer
(Adam at 1e-5 and 3e-5; SGD with momentum 0.9 at 3e-4 and 1e-3, chosen so its
per-update master change is of the same order: the report lists the measured
``master_step_rms``), 2 seeds, 128 updates.

The appendix tabulates, per arm, the effective lag k*, the unchanged fraction, the
share of the masters' movement the sampler sees, the sampler-learner mismatch, the
reward and the learner's greedy accuracy, and the per-update time as a ratio to the
nearest-export arm with the same optimizer, learning rate and loss (paired by seed).
"""

from __future__ import annotations

import numpy as np

from launch.sweep_spec import Arm, Sweep
from launch.sweep_stale_sampler import completed_runs, spread

SEEDS = (0, 1)
ROUNDINGS = ("nearest", "stochastic", "error_feedback")
OPTIMIZERS = (("adam", 1e-5), ("adam", 3e-5), ("sgdm", 3e-4), ("sgdm", 1e-3))
_LR = {1e-5: "1e-5", 3e-5: "3e-5", 3e-4: "3e-4", 1e-3: "1e-3"}
BASELINE = "adam_lr1e-5_nearest"
# Updates whose timing is left out of the step-time ratio (compilation, warm-up).
WARMUP_UPDATES = 8


def arm_name(optimizer: str, lr: float, rounding: str, served: bool) -> str:
  return f"{optimizer}_lr{_LR[lr]}_{rounding}" + ("_served" if served else "")


def fair_cast() -> Sweep:
  """3 roundings x loss on served copy x 4 optimizer settings, 2 seeds."""
  from experiments.fair_cast import FairCastConfig  # pylint: disable=import-outside-toplevel
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
      appendix="launch.sweep_fair_cast:fair_cast_appendix",
      description="Fair Cast in miniature: float32 masters, a bf16 sampler exported "
      "every update with nearest / stochastic / error-feedback rounding, with and "
      "without the loss on the served copy, Adam and SGD with momentum at two "
      "learning rates each. Arms are <optimizer>_lr<lr>_<rounding>[_served].")


def _mean(curve, start: int = 0) -> float:
  vals = [v for s, v in curve if s > start]
  return float(np.mean(vals)) if vals else float("nan")


def fair_cast_table(sweep_dir: str) -> str:
  """Markdown: lag, visibility, mismatch, reward and the step-time ratio per arm."""
  info, runs = completed_runs(sweep_dir)
  n = int(info["base"]["num_updates"])
  over = {a["name"]: a["overrides"] for a in info["arms"]}
  lines = ["", "## Lag, visibility, mismatch and cost", "",
           "Per arm, mean ± sample std over seeds of: *lag k\\**, the effective lag "
           "argmin_k ‖served_t − master_{t−k}‖ over all weights (updates; mean over the "
           f"second half of the {n} updates, where the lag has built up; the history "
           f"holds {info['base']['lag_history']} updates); *unchanged*: the fraction "
           "of bf16 weights bit-identical to the previous export (mean over training); "
           "*visible*: ‖served_t − served_0‖ / ‖master_t − master_0‖ at the end (the "
           "share of the masters' movement the sampler sees); *k3*: the sampler-learner "
           "mismatch on the sampled tokens (mean over training); *step rms*: the "
           "root-mean-square master change per update; reward (mean over training); the "
           "learner's final greedy accuracy; and *time ratio*: the median update time "
           f"(after the first {WARMUP_UPDATES}) over that of the nearest-export arm "
           "with the same optimizer, learning rate and loss, paired by seed.", "",
           "| arm | lag k* | unchanged | visible | k3 | step rms | reward | greedy | "
           "time ratio |", "|---|---|---|---|---|---|---|---|---|"]

  def median_time(curve):
    return float(np.median([v for s, v in curve if s > WARMUP_UPDATES]))

  for arm in [a["name"] for a in info["arms"]]:
    seeds = runs.get(arm, {})
    if not seeds:
      lines.append(f"| `{arm}` | | | | | | | | |")
      continue
    o = over[arm]
    ref = arm_name(o["optimizer_kind"], o["learning_rate"], "nearest",
                   o["loss_on_served"])
    col: dict[str, list[float]] = {k: [] for k in
                                   ("lag", "unch", "vis", "k3", "rms", "rew", "acc", "t")}
    for seed, s in seeds.items():
      col["lag"].append(_mean(s.get("export/lag_steps", []), n // 2))
      col["unch"].append(_mean(s["export/unchanged_fraction"]))
      col["vis"].append(s["export/visible_displacement"][-1][1]
                        if s.get("export/visible_displacement") else float("nan"))
      col["k3"].append(_mean(s["train/mismatch_k3"]))
      col["rms"].append(_mean(s["export/master_step_rms"]))
      col["rew"].append(_mean(s["train/reward"]))
      col["acc"].append(s["eval/greedy_accuracy"][-1][1])
      base = runs.get(ref, {}).get(seed)
      if base is not None:
        col["t"].append(median_time(s["perf/update_s"]) / median_time(base["perf/update_s"]))
    lines.append(
        f"| `{arm}` | {spread(col['lag'], 1)} | {spread(col['unch'], 4)} | "
        f"{spread(col['vis'], 3)} | {spread(col['k3'], 5)} | "
        f"{spread([x * 1e6 for x in col['rms']], 2)}e-6 | {spread(col['rew'])} | "
        f"{spread(col['acc'])} | {spread(col['t'], 2)} |")
  return "\n".join(lines) + "\n"


def fair_cast_appendix(sweep_dir: str) -> str:
  """The report appendix: :func:`fair_cast_table`."""
  return fair_cast_table(sweep_dir)
