"""The fair_cast sweep's report appendix: lag, visibility, mismatch and cost per arm;
each unbiased export against nearest with paired intervals, the learner's accuracy and
the sampled reward apart; the sign test over independent pairs."""

from __future__ import annotations

import math

import numpy as np

from experiments.common.evidence.stats import paired_difference, sign_test
from experiments.common.sweeps.sweep_data import config_value, evaluation_metrics
from experiments.common.trainers.rl.report import completed_runs, spread
from experiments.fair_cast.sweeps import RL_LRS, arm_name

# Updates whose timing is left out of the step-time ratio (compilation, warm-up).
WARMUP_UPDATES = 8
UNBIASED = ("stochastic", "error_feedback")
# (results-row metric, column header, digits) of the paired table.
PAIRED = (("export/lag_second_half", "k* (updates)", 1),
          ("export/unchanged_mean", "unchanged", 4),
          ("accuracy/mean_over_training", "learner accuracy, mean", 3),
          ("accuracy/last_quarter", "learner accuracy, last quarter", 3),
          ("reward/mean_over_training", "sampled reward, mean", 4))
# The metrics the sign test pools over independent pairs.
SIGN_TESTED = (("accuracy/mean_over_training", "learner's greedy accuracy (mean over "
                "training)"), ("reward/mean_over_training", "sampled reward (mean over "
                                                             "training)"))


def _mean(curve, start: int = 0) -> float:
  vals = [v for s, v in curve if s > start]
  return float(np.mean(vals)) if vals else float("nan")


def _setting(info, arm: str) -> tuple[float, str, str, bool]:
  """(learning rate, correction, rounding, loss on served) of ``arm``."""
  lr = float(config_value(info, arm, "learning_rate"))
  correction = "noIS" if config_value(info, arm, "is_method") == "none" else "tis"
  return (lr, correction, str(config_value(info, arm, "export_rounding")),
          bool(config_value(info, arm, "loss_on_served")))


def fair_cast_table(sweep_dir: str) -> str:
  """Markdown: lag, visibility, mismatch, reward and the step-time ratio per arm."""
  info, runs = completed_runs(sweep_dir)
  _, rows = evaluation_metrics(sweep_dir)
  n = int(info["base"]["num_updates"])
  lines = ["", "## Lag, visibility, mismatch and cost", "",
           "Per arm, mean ± sample std over seeds of: *lag k\\**, the effective lag "
           "argmin_k ‖served_t − master_{t−k}‖ over all weights (updates; mean over the "
           f"second half of the {n} updates, where the lag has built up; the history "
           f"holds {info['base']['lag_history']} updates); *capped*: the share of those "
           "measurements at the most the history could show (k\\* there means at least "
           "that); *unchanged*: the fraction of bf16 weights bit-identical to the "
           "previous export (mean over training); *visible*: ‖served_t − served_0‖ / "
           "‖master_t − master_0‖ at the end (the share of the masters' movement the "
           "sampler sees); *k3*: the sampler-learner mismatch on the sampled tokens "
           "(mean over training); *step rms*: the root-mean-square master change per "
           "update; the sampled reward (mean over training: the served policy's); the "
           "learner's greedy accuracy (mean over the evaluations after update 0: the "
           f"learner's policy); and *time ratio*: the median update time (after the "
           f"first {WARMUP_UPDATES}) over that of the nearest-export arm with the same "
           "learning rate, correction and loss, paired by seed (the update time includes "
           "the host-side export metrics; the export's own cost is "
           "`experiments/fair_cast/bench_export.py`).", "",
           "| arm | lag k* | capped | unchanged | visible | k3 | step rms | reward | "
           "learner accuracy | time ratio |", "|---|---|---|---|---|---|---|---|---|---|"]

  def median_time(curve):
    return float(np.median([v for s, v in curve if s > WARMUP_UPDATES]))

  for arm in [a["name"] for a in info["arms"]]:
    seeds = runs.get(arm, {})
    if not seeds:
      lines.append(f"| `{arm}` | | | | | | | | | |")
      continue
    lr, correction, _, served = _setting(info, arm)
    ref = arm_name(lr, correction, "nearest", served)
    col: dict[str, list[float]] = {k: [] for k in ("lag", "cap", "unch", "vis", "k3",
                                                   "rms", "rew", "acc", "t")}
    for seed, s in seeds.items():
      # k* from the results row, which the run computed from every measurement (the
      # committed events may be thinned; see FairCastConfig.summary_metrics).
      row = rows.get(arm, {}).get(seed, {})
      col["lag"].append(row.get("export/lag_second_half", float("nan")))
      col["cap"].append(row.get("export/lag_capped_fraction", float("nan")))
      col["unch"].append(_mean(s["export/unchanged_fraction"]))
      col["vis"].append(s["export/visible_displacement"][-1][1]
                        if s.get("export/visible_displacement") else float("nan"))
      col["k3"].append(_mean(s["train/mismatch_k3"]))
      col["rms"].append(_mean(s["export/master_step_rms"]))
      col["rew"].append(_mean(s["train/reward"]))
      col["acc"].append(_mean(s["eval/greedy_accuracy"]))
      base = runs.get(ref, {}).get(seed)
      if base is not None:
        col["t"].append(median_time(s["perf/update_s"]) / median_time(base["perf/update_s"]))
    lines.append(
        f"| `{arm}` | {spread(col['lag'], 1)} | {spread(col['cap'], 2)} | "
        f"{spread(col['unch'], 4)} | {spread(col['vis'], 3)} | {spread(col['k3'], 5)} | "
        f"{spread([x * 1e6 for x in col['rms']], 2)}e-6 | {spread(col['rew'])} | "
        f"{spread(col['acc'])} | {spread(col['t'], 2)} |")
  return "\n".join(lines) + "\n"


def _cell(d, digits: int) -> str:
  if d.n == 0:
    return ""
  if d.n < 2:
    return f"{d.mean:+.{digits}f} (n = 1)"
  return (f"{d.mean:+.{digits}f} [{d.ci_low:+.{digits}f}, {d.ci_high:+.{digits}f}] "
          f"({d.wins}/{d.n})")


def paired_table(sweep_dir: str) -> str:
  """Markdown: each unbiased export minus nearest, paired by seed, within each
  (learning rate, correction, loss) setting, on k*, the unchanged fraction, the
  learner's accuracy and the sampled reward."""
  info, runs = evaluation_metrics(sweep_dir)
  names = {a["name"] for a in info["arms"]}
  lines = ["", "## Unbiased export against nearest, paired by seed", "",
           "Per setting (learning rate, correction, loss on the served copy), `arm − "
           "nearest` per seed on the results-row metrics: mean [95% t-interval] (seeds "
           "where the difference is > 0 / pairs). The learner's greedy accuracy (its "
           "own policy, on 256 fixed held-out problems) and the sampled reward (the "
           "served copy's samples) are separate columns: a served copy that lags earns "
           "the lagging policy's reward, so an unbiased export can raise the sampled "
           "reward without the learner learning more.", "",
           "| setting | export | " + " | ".join(h for _, h, _ in PAIRED) + " |",
           "|---|---|" + "---|" * len(PAIRED)]
  for arm in [a["name"] for a in info["arms"]]:
    lr, correction, rounding, served = _setting(info, arm)
    ref = arm_name(lr, correction, "nearest", served)
    if rounding == "nearest" or ref not in names:
      continue
    setting = f"lr {lr:g}, {correction}" + (", loss on served" if served else "")
    cells = []
    for metric, _, digits in PAIRED:
      get = lambda a: {s: m[metric] for s, m in runs.get(a, {}).items() if metric in m}
      cells.append(_cell(paired_difference(get(arm), get(ref)), digits))
    lines.append(f"| {setting} | {rounding} | " + " | ".join(cells) + " |")
  return "\n".join(lines) + "\n"


def sign_test_lines(sweep_dir: str) -> str:
  """Markdown: for each unbiased export, the sign test of ``arm − nearest`` over the
  independent (RL learning rate, correction, seed) pairs without the loss on the
  served copy (each such pair has its own arms and rollout streams), for the learner's
  accuracy and for the sampled reward."""
  info, runs = evaluation_metrics(sweep_dir)
  names = {a["name"] for a in info["arms"]}
  lines = ["", "## Sign test over independent pairs", "",
           f"Each (learning rate in {list(RL_LRS)}, correction, seed) gives one "
           "difference `arm − nearest` (the arms of one pair share the warm start and "
           "the problems, and draw their own rollouts); zero differences are dropped; "
           "two-sided exact binomial p. Pairs from one seed at two learning rates share "
           "that seed's warm start, so they are not fully independent.", "",
           "| export | metric | positive / pairs | mean difference | p |",
           "|---|---|---|---|---|"]
  for rounding in UNBIASED:
    for metric, label in SIGN_TESTED:
      diffs = []
      for lr in RL_LRS:
        for correction in ("tis", "noIS"):
          arm, ref = (arm_name(lr, correction, rounding),
                      arm_name(lr, correction, "nearest"))
          if arm not in names or ref not in names:
            continue
          a, b = runs.get(arm, {}), runs.get(ref, {})
          diffs += [a[s][metric] - b[s][metric] for s in sorted(set(a) & set(b))
                    if metric in a[s] and metric in b[s]]
      k, n, p = sign_test(diffs)
      mean = f"{np.mean(diffs):+.4f}" if diffs else ""
      lines.append(f"| {rounding} | {label} | {k}/{n} | {mean} | "
                   f"{'' if math.isnan(p) else f'{p:.4f}'} |")
  return "\n".join(lines) + "\n"


def fair_cast_appendix(sweep_dir: str) -> str:
  """The report appendix: :func:`fair_cast_table`, :func:`paired_table` and
  :func:`sign_test_lines`."""
  return (fair_cast_table(sweep_dir) + paired_table(sweep_dir)
          + sign_test_lines(sweep_dir))


def confirm_appendix(sweep_dir: str) -> str:
  """The confirmatory sweep's appendix: the pilot beside each claim, and the sizing."""
  from experiments.common.sweeps.confirmatory import confirm_sections  # pylint: disable=import-outside-toplevel
  from experiments.fair_cast.sweeps import CONFIRM_PILOTS  # pylint: disable=import-outside-toplevel
  return confirm_sections(sweep_dir, CONFIRM_PILOTS)
