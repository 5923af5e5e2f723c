"""The ``temperon`` sweep: Temperon's arms and ablations in miniature, and a cost appendix.

    python -m launch.sweep --sweep=temperon --sweep_dir=experiments/reports/temperon
    python -m launch.sweep_temperon --sweep_dir=experiments/reports/temperon  # ratios

Scaled down from the paper (WRN-110 on CIFAR, 100 epochs, 5 seeds) to fit ~20 minutes on
2 shared CPU cores: a 2-stage ResNet (width 16, one block per stage, ~30k params,
GroupNorm) on 300 training images of sklearn digits (the full 1438 make every arm ~99%;
fewer images make generalisation, where SAM acts, matter), 600 steps of batch 64
(~128 epochs of the subset), test on the fixed 359-image split, 4 seeds. Warm-up,
re-entry warm-up and rho ramp are scaled from 200/200/400 steps to 20/20/40.
"""

from __future__ import annotations

import collections
import math
import os
import sys

import numpy as np
from absl import app, flags

from launch.sweep_spec import Arm, Sweep

SEEDS = (0, 1, 2, 3)
BASELINE = "temperon"


def temperon() -> Sweep:
  """SGD, full-time SAM (SGD / Muon), Temperon and its ablations, paired over seeds."""
  from experiments.temperon import TemperonConfig  # pylint: disable=import-outside-toplevel
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
      "reach it are left out of those means (see reached/*).")


def _mean(xs):
  xs = [x for x in xs if isinstance(x, (int, float)) and math.isfinite(x)]
  return (float(np.mean(xs)), len(xs)) if xs else (math.nan, 0)


def cost_appendix(sweep_dir: str) -> str:
  """Markdown: per-arm cost and time-to-target as ratios to ``sgd`` and to ``temperon``.

  Ratios of per-arm means over the seeds that have a value (``n`` shown); s/step ratios
  use each run's own median seconds per step (all runs shared the same 2 cores).
  """
  from experiments.common.results import read_results  # pylint: disable=import-outside-toplevel
  from launch.sweep_spec import read_manifest  # pylint: disable=import-outside-toplevel
  manifest = {m["run_name"]: m for m in read_manifest(sweep_dir)}
  by_arm: dict[str, list[dict]] = collections.defaultdict(list)
  for row in read_results(os.path.join(sweep_dir, "results.jsonl")):
    if row.get("run_name") in manifest:
      by_arm[manifest[row["run_name"]]["arm"]].append(row["metrics"])
  arms = list(dict.fromkeys(m["arm"] for m in manifest.values()))
  keys = ("cost/grad_evals_per_step", "cost/total_s", "time_to/0.95", "time_to/0.97",
          "steps_to/0.97")
  means = {a: {k: _mean([r.get(k) for r in by_arm.get(a, [])]) for k in keys} for a in arms}

  def ratio(a, ref, k):
    (x, n), (y, _) = means[a][k], means.get(ref, {}).get(k, (math.nan, 0))
    return ("n/a" if not (math.isfinite(x) and math.isfinite(y) and y) else
            f"{x / y:.2f} (n={n})")

  lines = ["", "## Cost and time-to-target as ratios", "",
           "Ratio of arm means (n = seeds with a value). `grad evals/step`: 2 for SAM "
           "steps, 1 otherwise. `wall/run`: steps x measured median s/step per phase. "
           "`time to 0.97`: calibrated seconds to first reach 97% test accuracy.", "",
           "| arm | grad evals/step vs sgd | wall/run vs sgd | wall/run vs temperon | "
           "time to 0.95 vs temperon | time to 0.97 vs temperon | steps to 0.97 vs temperon |",
           "|---|---|---|---|---|---|---|"]
  for a in arms:
    lines.append(f"| `{a}` | {ratio(a, 'sgd', keys[0])} | {ratio(a, 'sgd', keys[1])} | "
                 f"{ratio(a, BASELINE, keys[1])} | {ratio(a, BASELINE, keys[2])} | "
                 f"{ratio(a, BASELINE, keys[3])} | {ratio(a, BASELINE, keys[4])} |")
  return "\n".join(lines) + "\n"


def append_cost_appendix(sweep_dir: str) -> str:
  """Appends :func:`cost_appendix` to ``REPORT.md`` (replacing an earlier one)."""
  path = os.path.join(sweep_dir, "REPORT.md")
  with open(path) as f:
    text = f.read()
  marker = "\n## Cost and time-to-target as ratios"
  text = text.split(marker)[0].rstrip("\n") + "\n"
  with open(path, "w") as f:
    f.write(text + cost_appendix(sweep_dir))
  return path


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  print(append_cost_appendix(flags.FLAGS.sweep_dir))


if __name__ == "__main__":
  flags.DEFINE_string("sweep_dir", None, "The temperon sweep's output directory.")
  flags.mark_flag_as_required("sweep_dir")
  app.run(lambda argv: sys.exit(main(argv)))
