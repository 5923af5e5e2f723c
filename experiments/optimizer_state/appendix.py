"""The optimizer_state sweep's report appendix, from the runs' events and results.

* per arm: final validation loss, the paired gap to its own model's fp32-moment arm
  (95% t-interval), the state's measured bytes per parameter, and the worst values
  over the run of the stored second moment's zero fraction and update ratio;
* per model: the memory budget of a training step's persistent state as measured by
  the runs (float32 weights, float32 gradients, the optimizer state), and the
  optimizer state's share of it for each format.
"""

from __future__ import annotations

import math

from experiments.common.evidence.stats import format_spread, paired_difference
from experiments.common.sweeps.sweep_data import (completed_curves, evaluation_metrics,
                                                  read_sweep_info)

LOSS = "eval/loss"
_OPTIM = "train/optim/"


def _model_and_format(arm: str) -> tuple[str, str]:
  model, _, fmt = arm.partition("_")
  return model, fmt


def _final(curves: dict[int, dict], tag: str) -> dict[int, float]:
  return {seed: c[tag][-1][1] for seed, c in curves.items() if c.get(tag)}


def _worst(curves: dict[int, dict], tag: str) -> list[float]:
  return [max(v for _, v in c[tag]) for c in curves.values() if c.get(tag)]


def _interval(arm: dict[int, float], base: dict[int, float]) -> str:
  d = paired_difference(arm, base)
  if d.n == 0:
    return "n/a"
  if d.n < 2 or not math.isfinite(d.ci_low):
    return f"{d.mean:+.4f} (n = {d.n})"
  mark = " *" if d.ci_low > 0 or d.ci_high < 0 else ""
  return f"{d.mean:+.4f} [{d.ci_low:+.4f}, {d.ci_high:+.4f}]{mark}"


def _evaluations(info: dict) -> int:
  """Evaluations a completed run logs: at step 0, every ``eval_every``, at the end."""
  steps, every = int(info["base"]["num_steps"]), int(info["base"]["eval_every"])
  return 1 + steps // every + (steps % every != 0)


def optimizer_state_appendix(sweep_dir: str) -> str:
  """Markdown: the per-arm table and the per-model memory budget."""
  info, runs = completed_curves(sweep_dir, complete_tag=LOSS,
                                complete_len=_evaluations(read_sweep_info(sweep_dir)))
  arms = [a["name"] for a in info["arms"]]
  # Final values from each run's results row, which event thinning leaves whole (the
  # byte counts are read from there).
  finals = evaluation_metrics(sweep_dir)[1]
  lines = ["", "## Every moment format", "",
           f"Completed runs; mean ± sample std over seeds. *gap*: final `{LOSS}` minus "
           "the same model's `fp32` arm, paired by seed, mean and 95% t-interval (* "
           "excludes 0). *B/param*: the whole optimizer state's bytes per model "
           "parameter, measured from the state pytree (codes, block scales, counters, "
           "the float32 moments of leaves under 4096 elements). *v = 0*: the largest "
           "fraction, over the run's logged steps, of quantized-leaf elements whose "
           "stored second moment decodes to 0 while the first moment does not. *max "
           "|m|/(√v+ε)*: the largest update the stored state asked for, worst step of "
           "the run (a healthy Adam stays near 1).", "",
           "| arm | n | final loss | gap to fp32 | B/param | v = 0 | max abs m/(√v+ε) |",
           "|---|---|---|---|---|---|---|"]
  for arm in arms:
    curves = runs.get(arm, {})
    if not curves:
      lines.append(f"| `{arm}` | 0 | no completed runs | | | | |")
      continue
    model, _ = _model_and_format(arm)
    loss = _final(curves, LOSS)
    base = _final(runs.get(f"{model}_fp32", {}), LOSS)
    gap = "(baseline)" if arm == f"{model}_fp32" else _interval(loss, base)
    bpp = format_spread([finals[arm][seed][_OPTIM + "state_bytes_per_param"]
                         for seed in curves], 3)
    zero = format_spread(_worst(curves, _OPTIM + "nu_zero_frac"), 4)
    ratio = format_spread(_worst(curves, _OPTIM + "max_update_ratio"), 1)
    lines.append(f"| `{arm}` | {len(curves)} | {format_spread(list(loss.values()))} | "
                 f"{gap} | {bpp} | {zero} | {ratio} |")

  lines += ["", "## Memory budget of the persistent training state", "",
            "Measured by the runs (first seed of each arm): float32 weights, float32 "
            "gradients (the same bytes as the weights) and the optimizer state; "
            "activations are not counted (they depend on batch and sequence, not on "
            "the parameter count). *share*: the optimizer state's fraction of the three.",
            "", "| arm | params | weights MB | gradients MB | optimizer state MB | share |",
            "|---|---|---|---|---|---|"]
  for arm in arms:
    curves = runs.get(arm, {})
    if not curves:
      continue
    first = finals[arm][min(curves)]
    weights = first[_OPTIM + "param_bytes"]
    state = first[_OPTIM + "state_bytes"]
    total = 2 * weights + state
    lines.append(f"| `{arm}` | {weights / 4 / 1e6:.3f} M | {weights / 1e6:.3f} | "
                 f"{weights / 1e6:.3f} | {state / 1e6:.3f} | {state / total:.1%} |")
  return "\n".join(lines + [""])



def confirm_appendix(sweep_dir: str) -> str:
  """The confirmatory sweep's appendix: the pilot beside each claim, and the sizing."""
  from experiments.common.sweeps.confirmatory import confirm_sections  # pylint: disable=import-outside-toplevel
  from experiments.optimizer_state.sweeps import CONFIRM_PILOTS  # pylint: disable=import-outside-toplevel
  return confirm_sections(sweep_dir, CONFIRM_PILOTS)
