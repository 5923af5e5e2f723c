"""The fair_cast sweep's report appendix: lag, visibility, mismatch and cost per arm."""

from __future__ import annotations

import numpy as np

from experiments.common.rl.report import completed_runs, spread
from experiments.fair_cast.sweeps import arm_name

# Updates whose timing is left out of the step-time ratio (compilation, warm-up).
WARMUP_UPDATES = 8


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
