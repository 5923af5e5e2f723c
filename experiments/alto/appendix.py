"""The ALTO sweep's report appendix, computed from the runs' events.

* the convergence overhead as ALTO defines it: per seed, the steps an arm needs to
  reach that seed's bf16 final validation loss, over the steps bf16 needed, minus 1;
  with validation loss at 50/75/100% of training;
* the validation loss over the second half of training (where the arms separate);
* ALTO's operator-level SNR table (Linear and grouped GEMM), from
  :mod:`numerics.operator_snr`.
"""

from __future__ import annotations

import collections
import os

from experiments.common.curve_plots import plot_curves
from experiments.common.curves import steps_to_target, value_at
from experiments.common.stats import format_spread
from experiments.common.sweep_data import read_manifest, read_sweep_info, run_dir
from experiments.common.tensorboard_reader import read_scalars


def convergence_table(sweep_dir: str, tag: str = "eval/loss") -> str:
  """Markdown: per arm, final/50%/75% validation loss, gap to bf16 and the overhead."""
  info = read_sweep_info(sweep_dir)
  num_steps = int(info["base"]["num_steps"])
  curves: dict[str, dict[int, list]] = collections.defaultdict(dict)
  for m in read_manifest(sweep_dir):
    directory = run_dir(sweep_dir, m["run_name"])
    if os.path.isdir(directory):
      curve = read_scalars(directory).get(tag, [])
      if curve and curve[-1][0] >= num_steps:  # completed runs only
        curves[m["arm"]][m["seed"]] = curve
  base = curves.get(info["baseline"], {})
  lines = ["", "## Convergence overhead and late-training losses", "",
           f"`{tag}` (mean ± sample std over seeds). *gap*: arm − bf16, paired by seed. "
           "*overhead*: per seed, steps to reach that seed's bf16 final validation loss "
           "(linear interpolation between evaluations every "
           f"{info['base'].get('eval_every')} steps) over the steps bf16 took to first "
           "reach it, minus 1; *reached* counts the seeds that got there within "
           f"{num_steps} steps (the overhead averages those only). *bf16-equivalent "
           "overhead*: when an arm does not reach bf16's final loss in the run, "
           f"{num_steps} / (steps bf16 took to reach the arm's final loss) − 1, per seed: "
           "how much sooner bf16 got to where the arm ended (a lower bound on the "
           "overhead, since bf16's schedule had not finished decaying at that step).", "",
           f"| arm | n | loss @ {num_steps // 2} | loss @ {3 * num_steps // 4} | "
           f"final loss | gap to bf16 | overhead % | reached | bf16-equivalent overhead % |",
           "|---|---|---|---|---|---|---|---|---|"]
  for arm in [a["name"] for a in info["arms"]]:
    runs = curves.get(arm, {})
    if not runs:
      lines.append(f"| `{arm}` | 0 | | | | | | | |")
      continue
    finals = {s: c[-1][1] for s, c in runs.items()}
    gaps, overheads, equivalent, reached = [], [], [], 0
    for seed, curve in runs.items():
      if seed not in base:
        continue
      target = base[seed][-1][1]
      gaps.append(finals[seed] - target)
      ref_steps = steps_to_target(base[seed], target)
      steps = steps_to_target(curve, target)
      if steps is not None and ref_steps:
        reached += 1
        overheads.append(steps / ref_steps - 1.0)
      else:
        bf16_steps = steps_to_target(base[seed], finals[seed])
        if bf16_steps:
          equivalent.append(num_steps / bf16_steps - 1.0)
    half = [value_at(c, num_steps // 2) for c in runs.values()]
    three_q = [value_at(c, 3 * num_steps // 4) for c in runs.values()]
    lines.append(
        f"| `{arm}` | {len(runs)} | {format_spread(half)} | {format_spread(three_q)} | "
        f"{format_spread(list(finals.values()))} | {format_spread(gaps)} | "
        f"{format_spread(overheads, 1, 100.0)} | {reached}/{len(gaps)} | "
        f"{format_spread(equivalent, 1, 100.0)} |")
  return "\n".join(lines) + "\n"


SNR_RECIPES = (("1d2d", "mxfp4_1d2d"), ("+RHT", "mxfp4_rht"), ("+RHT+SR", "mxfp4"),
               ("NVFP4 +RHT+SR", "nvfp4"))


def snr_table(tokens: int = 1024, k: int = 512, n: int = 512, experts: int = 8,
              repeats: int = 2) -> str:
  """Markdown: ALTO's operator-level SNR (dB), Linear and grouped expert GEMM."""
  import jax  # pylint: disable=import-outside-toplevel
  from numerics import operator_snr, recipes  # pylint: disable=import-outside-toplevel
  rows = [(label, recipes.get(name)) for label, name in SNR_RECIPES]
  rows.append(("+RHT+SR+MBS", recipes.with_macro_blocks("mxfp4")))
  lines = ["", "## Operator-level SNR (dB): forward O / dgrad dX / wgrad dW", "",
           f"Operands N(0, 1) + Bernoulli(0.005) N(0, 1e4) (`numerics.operator_snr.snr`); Linear: "
           f"X {tokens}x{k}, W {k}x{n}; grouped: {experts} experts, X {experts}x"
           f"{tokens // experts}x{k}, W {experts}x{k}x{n}; mean of {repeats} draws. ALTO "
           "(Linear): 1d2d 13.48 / 11.80 / 13.02, +RHT 13.48 / 11.80 / 13.25, +RHT+SR "
           "13.48 / 11.02 / 13.04 (grouped 13.47 / 12.26 / 12.33), +RHT+MBS 14.64 / 12.20 / "
           "13.75; their shapes are not stated.", "",
           "| recipe | Linear | grouped GEMM |", "|---|---|---|"]
  for label, recipe in rows:
    cells = []
    for e, t in ((0, tokens), (experts, tokens // experts)):
      s = operator_snr.snr(recipe, tokens=t, k=k, n=n, experts=e, key=jax.random.key(0),
                   repeats=repeats)
      cells.append(f"{s['forward']:.2f} / {s['dgrad']:.2f} / {s['wgrad']:.2f}")
    lines.append(f"| {label} | {cells[0]} | {cells[1]} |")
  return "\n".join(lines) + "\n"


def late_training_plot(sweep_dir: str, tag: str = "eval/loss") -> str:
  """Markdown linking a plot of ``tag`` over the second half of training (where the
  arms separate; the full curves are in the report's Curves section)."""
  info = read_sweep_info(sweep_dir)
  start = int(info["base"]["num_steps"]) // 2
  curves: dict[str, list] = {a["name"]: [] for a in info["arms"]}
  for m in read_manifest(sweep_dir):
    directory = run_dir(sweep_dir, m["run_name"])
    if os.path.isdir(directory):
      curve = [(s, v) for s, v in read_scalars(directory).get(tag, []) if s >= start]
      if curve:
        curves[m["arm"]].append(curve)
  curves = {a: c for a, c in curves.items() if c}
  if not curves:
    return ""
  rel = os.path.join("plots", "late_" + tag.replace("/", "_") + ".png")
  plot_curves(f"{tag} from step {start}", curves, os.path.join(sweep_dir, rel),
              baseline=info["baseline"])
  return f"\n## Late training\n\n![{tag} from step {start}]({rel})\n"


def alto_appendix(sweep_dir: str) -> str:
  """The report appendix: :func:`convergence_table`, :func:`late_training_plot` and
  :func:`snr_table`."""
  return convergence_table(sweep_dir) + late_training_plot(sweep_dir) + snr_table()
