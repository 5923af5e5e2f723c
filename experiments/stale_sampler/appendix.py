"""The stale_sampler sweep's report appendix, computed from the runs' events.

Per arm, whether and when each seed degraded (:func:`degradation_update`); the learner's
greedy accuracy, the sampled reward and the mismatch against update per refresh
interval K with the refresh points marked; the mismatch and IS statistics by position
within a refresh cycle.
"""

from __future__ import annotations

import collections
import os
from typing import Any, Sequence

import numpy as np

from experiments.common.evidence.curve_plots import plot_curves
from experiments.common.sweeps.confirmatory import confirm_sections
from experiments.common.trainers.rl.report import completed_runs, spread
from experiments.common.sweeps.sweep_data import config_value

# The sampled reward is the *sampler's* (flat within a cycle, noisy: 16 problems x 8
# samples), so degradation is judged on the learner's greedy accuracy on a fixed
# held-out set; plots of the reward use a trailing moving average over SMOOTH updates.
SMOOTH = 16
DROP = 0.10
PERSIST = 2
CYCLE_TAGS = ("train/mismatch_k3", "train/mismatch_max_abs_delta_logp", "train/is_mean",
              "train/is_clipped_frac", "train/is_ess")


def degradation_update(curve: Sequence[tuple[int, float]], *, drop: float = DROP,
                       persist: int = PERSIST) -> int | None:
  """The update at which the learner has degraded, or None.

  ``curve`` is the learner's greedy accuracy ``[(update, value), ...]`` starting with
  the warm start's (update 0). The run has degraded at the first evaluation whose
  value is more than ``drop`` below the warm start's, provided the next ``persist - 1``
  evaluations (as many as exist) are below that line too: it has become worse than the
  policy it started from, and not for a single evaluation.
  """
  if not curve:
    return None
  steps = [s for s, _ in curve]
  values = np.asarray([v for _, v in curve], np.float64)
  below = values < values[0] - drop
  for i in range(1, len(values)):
    if below[i:i + persist].all():
      return int(steps[i])
  return None


def _interval(info: dict[str, Any], arm: str) -> int:
  return int(config_value(info, arm, "refresh_interval"))


def degradation_table(sweep_dir: str) -> str:
  """Markdown: per arm, reward over training / at the end, and when each seed degraded."""
  info, runs = completed_runs(sweep_dir)
  lines = ["", "## Does the run degrade, and when?", "",
           "*Reward* is the mean exact-match reward of the sampled groups at each update "
           "(the sampler's policy, so it is flat within a cycle and jumps at a refresh). "
           "*Greedy accuracy* is the learner's exact-match accuracy with greedy decoding "
           f"on {info['base']['eval_problems']} fixed held-out problems, every "
           f"{info['base']['eval_every']} updates. A seed *degrades* at the first "
           f"evaluation where the learner's greedy accuracy is more than {DROP:.2f} below "
           f"the warm start's and stays below for {PERSIST} evaluations (it has become "
           "worse than the policy it began from); the update is given as *cycle c, step "
           "s of K* (cycle 0 runs on the initial sampler copy, and step K is the last "
           "update before the next refresh). *Ends degraded*: the final evaluation is "
           "below that line too (a dip the run recovered from does not count). Mean ± "
           "sample std over seeds.", "",
           "| arm | K | seeds | reward, mean over training | reward, last quarter | "
           "final greedy accuracy | degraded | ends degraded | where (per seed) |",
           "|---|---|---|---|---|---|---|---|---|"]
  for arm in [a["name"] for a in info["arms"]]:
    k = _interval(info, arm)
    seeds = runs.get(arm, {})
    if not seeds:
      lines.append(f"| `{arm}` | {k} | 0 | | | | | | |")
      continue
    means, lasts, greedy, where, n_bad, n_end = [], [], [], [], 0, 0
    for seed in sorted(seeds):
      r = [v for _, v in seeds[seed]["train/reward"]]
      means.append(float(np.mean(r)))
      lasts.append(float(np.mean(r[-max(1, len(r) // 4):])))
      accuracy = seeds[seed]["eval/greedy_accuracy"]
      greedy.append(accuracy[-1][1])
      n_end += accuracy[-1][1] < accuracy[0][1] - DROP
      t = degradation_update(seeds[seed]["eval/greedy_accuracy"])
      if t is None:
        where.append(f"seed {seed}: no")
      else:  # the evaluation after update t (1-based) ran on the learner after t updates
        n_bad += 1
        where.append(f"seed {seed}: update {t} (cycle {(t - 1) // k}, step "
                     f"{(t - 1) % k + 1} of {k})")
    lines.append(f"| `{arm}` | {k} | {len(seeds)} | {spread(means)} | {spread(lasts)} | "
                 f"{spread(greedy)} | {n_bad}/{len(seeds)} | {n_end}/{len(seeds)} | "
                 f"{'; '.join(where)} |")
  return "\n".join(lines) + "\n"


def cycle_table(sweep_dir: str, bins: int = 4) -> str:
  """Markdown: mismatch and IS statistics by position within the refresh cycle.

  For each arm the cycle ``[0, K)`` is cut into ``bins`` equal parts; each cell is the
  mean over every update in that part of every cycle, then mean ± std over seeds.
  """
  info, runs = completed_runs(sweep_dir)
  header = " | ".join(f"{i * 100 // bins}–{(i + 1) * 100 // bins}%" for i in range(bins))
  out = ["", "## Within a refresh cycle", "",
         f"Each cell: the statistic averaged over the updates in that fraction of every "
         f"refresh cycle (cycle step / K), then mean ± std over seeds. `mismatch_k3` is "
         "the k3 estimate of KL(sampler ‖ learner) on the sampled tokens (the sampler's "
         "tempered distribution against the learner's at temperature 1); the `is_*` "
         "rows are the TIS weights min(π/μ, 2) (all 1 for the uncorrected arms, so "
         "they are left out there).", ""]
  for tag in CYCLE_TAGS:
    out += [f"**`{tag}`**", "", f"| arm | K | {header} |",
            "|---|---|" + "---|" * bins]
    for arm in [a["name"] for a in info["arms"]]:
      seeds = runs.get(arm, {})
      if not seeds or (tag.startswith("train/is_")
                       and config_value(info, arm, "is_method") == "none"):
        continue
      k = _interval(info, arm)
      cells = []
      for b in range(bins):
        per_seed = []
        for s in seeds.values():
          vals = [v for step, v in s.get(tag, [])
                  if b * k <= ((step - 1) % k) * bins < (b + 1) * k]
          if vals:
            per_seed.append(float(np.mean(vals)))
        cells.append(spread(per_seed))
      out.append(f"| `{arm}` | {k} | " + " | ".join(cells) + " |")
    out.append("")
  return "\n".join(out)


def reward_plots(sweep_dir: str) -> str:
  """Markdown linking, per refresh interval K, the greedy accuracy, sampled reward and
  mismatch of every arm with that K against update, with the refresh points marked."""
  info, runs = completed_runs(sweep_dir)
  n = int(info["base"]["num_updates"])
  by_k: dict[int, dict[str, bool]] = collections.defaultdict(dict)
  for arm in [a["name"] for a in info["arms"]]:
    if runs.get(arm):
      by_k[_interval(info, arm)][arm] = True
  out = ["", "## Learner accuracy, sampled reward and mismatch against update", "",
         "One row per refresh interval K: the learner's greedy accuracy (raw), the "
         f"sampled reward and the k3 mismatch (trailing moving averages over {SMOOTH} "
         "updates). Thin lines are seeds, thick lines their mean; dotted verticals are "
         "the sampler refreshes.", ""]
  for k in sorted(by_k):
    for tag, smooth in (("eval/greedy_accuracy", 1), ("train/reward", SMOOTH),
                        ("train/mismatch_k3", SMOOTH)):
      curves = {arm: [s[tag] for s in runs[arm].values()] for arm in by_k[k]}
      rel = os.path.join("plots", f"{tag.split('/')[1]}_K{k}.png")
      plot_curves(tag, curves, os.path.join(sweep_dir, rel), smooth=smooth,
                  vlines=[x + 0.5 for x in range(k, n, k)][:64],
                  vline_label="sampler refresh", title=f"{tag}, K = {k}")
      out.append(f"![{tag}, K = {k}]({rel})")
    out.append("")
  return "\n".join(out)


def warm_start_table(sweep_dir: str) -> str:
  """Markdown: per evaluation seed, its warm start (supervised steps used, greedy
  accuracy on its own held-out problems, the learner's at update 0 on the RL
  evaluation set) and what the on-policy control (the sweep's baseline) reached; seeds
  whose warm start stopped short of ``pretrain_target_accuracy`` are named."""
  info, runs = completed_runs(sweep_dir)
  target = float(info["base"].get("pretrain_target_accuracy", 0.0))
  control = runs.get(info["baseline"], {})
  seeds = sorted({seed for arm in runs.values() for seed in arm})
  last = lambda curves, tag: curves[tag][-1][1] if curves.get(tag) else float("nan")
  lines = ["", "## Warm starts", "",
           "Each seed has its own supervised warm start"
           + (f", trained until its greedy accuracy on its own held-out problems reached "
              f"{target:g} (checked every {info['base'].get('pretrain_check_every')} "
              f"steps, at most {info['base']['pretrain_steps']})" if target > 0 else "")
           + f". *Update 0* is the learner's accuracy on the RL evaluation set before "
           f"any update; the last two columns are the on-policy control "
           f"(`{info['baseline']}`) at the end (`accuracy/last_quarter`) and its gain "
           "over update 0.", "",
           "| seed | pretraining steps | warm-start accuracy (own held-out) | update 0 | "
           "control at the end | control's gain |", "|---|---|---|---|---|---|"]
  short = []
  for seed in seeds:
    curves = next((arm[seed] for arm in runs.values() if seed in arm), {})
    steps = last(curves, "warm_start/pretrain_steps")
    own = last(curves, "warm_start/greedy_accuracy")
    start = curves.get("eval/greedy_accuracy", [(0, float("nan"))])[0][1]
    end = last(control.get(seed, {}), "accuracy/last_quarter")
    if target > 0 and own < target:
      short.append(seed)
    lines.append(f"| {seed} | {steps:.0f} | {own:.3f} | {start:.3f} | {end:.3f} | "
                 f"{end - start:+.3f} |")
  if short:
    lines += ["", f"**Warm starts short of the target:** seeds {short} stopped at the "
              "step cap below the target accuracy."]
  return "\n".join(lines) + "\n"


def stale_sampler_appendix(sweep_dir: str) -> str:
  """The report appendix: :func:`warm_start_table`, :func:`degradation_table`,
  :func:`reward_plots` and :func:`cycle_table`."""
  return (warm_start_table(sweep_dir) + degradation_table(sweep_dir)
          + reward_plots(sweep_dir) + cycle_table(sweep_dir))


def confirm_appendix(sweep_dir: str) -> str:
  """The confirmatory sweep's appendix: the pilot beside each claim, and the sizing."""
  from experiments.stale_sampler.sweeps import CONFIRM_PILOTS  # pylint: disable=import-outside-toplevel
  return confirm_sections(sweep_dir, CONFIRM_PILOTS)
