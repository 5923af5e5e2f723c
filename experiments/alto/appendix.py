"""The ALTO sweep's report appendix, computed from the runs' events.

* the convergence overhead as ALTO defines it: per seed, the steps an arm needs to
  reach that seed's bf16 final validation loss, over the steps bf16 needed, minus 1
  (and at bf16's loss at 75% of training), paired by seed
  with 95% t-intervals; with validation loss at 50/75/100% of training;
* the DGE factor's statistics by quarter of training (the DGE arms);
* the validation loss over the second half of training (where the arms separate);
* ALTO's operator-level SNR table (Linear and grouped GEMM), from
  :mod:`numerics.operator_snr`.
"""

from __future__ import annotations

import collections
import json
import os

from experiments.common.evidence.curve_plots import plot_curves
from experiments.common.evidence.curves import steps_to_target, value_at
from experiments.common.evidence.stats import format_spread, mean_interval
from experiments.common.evidence.tensorboard_reader import read_scalars
from experiments.common.sweeps.sweep_data import (completed_curves, read_manifest, read_sweep_info,
                                                  run_dir)


def _interval(values: list[float], scale: float = 1.0, digits: int = 1) -> str:
  """``mean [95% t-interval]`` of ``values`` x ``scale`` ("n/a" for none)."""
  if not values:
    return "n/a"
  iv = mean_interval([v * scale for v in values])
  if iv.n < 2:
    return f"{iv.mean:+.{digits}f} (n = 1)"
  return f"{iv.mean:+.{digits}f} [{iv.ci_low:+.{digits}f}, {iv.ci_high:+.{digits}f}]"


def _completed_curves(sweep_dir: str, tag: str) -> dict[str, dict[int, list]]:
  """arm -> seed -> ``tag``'s curve, for the runs that logged it at the last step."""
  info = read_sweep_info(sweep_dir)
  _, runs = completed_curves(sweep_dir, complete_tag=tag,
                             complete_step=int(info["base"]["num_steps"]))
  return {arm: {seed: scalars[tag] for seed, scalars in seeds.items()}
          for arm, seeds in runs.items()}


def convergence_table(sweep_dir: str, tag: str = "eval/loss") -> str:
  """Markdown: per arm, validation loss at 50/75/100%, the gap to bf16 and ALTO's
  convergence overhead, each paired by seed with a 95% t-interval over seeds."""
  info = read_sweep_info(sweep_dir)
  num_steps = int(info["base"]["num_steps"])
  curves = _completed_curves(sweep_dir, tag)
  base = curves.get(info["baseline"], {})
  three_quarters = 3 * num_steps // 4
  lines = ["", "## Convergence overhead and late-training losses", "",
           f"`{tag}` at 50%, 75% and 100% of training: mean ± sample std over seeds. "
           "Every other column is paired by seed against bf16 and given as mean [95% "
           "t-interval over seeds]. Steps to a target are interpolated linearly between "
           f"evaluations (every {info['base'].get('eval_every')} steps).", "",
           "- *gap*: the arm's final loss minus bf16's.",
           "- *overhead to bf16's final loss* (ALTO's definition): the steps the arm "
           "takes to reach that seed's bf16 final loss, over the steps bf16 took to "
           "first reach it, minus 1. It averages only the seeds that reach it within "
           f"{num_steps} steps; *reached* counts them.",
           "- *overhead, all seeds*: the same, except that a seed which never reaches "
           f"the target counts as {num_steps} / (steps bf16 took to reach the arm's "
           "final loss) − 1. That value is a lower bound, because bf16's schedule had "
           "not finished decaying at that step.",
           f"- *overhead at 75%*: the same ratio for an earlier target, bf16's loss at "
           f"step {three_quarters}. It averages the seeds that reach it (n/a: none "
           "did).", "",
           f"| arm | n | loss @ {num_steps // 2} | loss @ {three_quarters} | final loss | "
           "gap to bf16 | overhead to bf16's final loss, % | reached | overhead, all "
           "seeds, % | overhead at 75%, % |",
           "|---|---|---|---|---|---|---|---|---|---|"]
  for arm in [a["name"] for a in info["arms"]]:
    runs = curves.get(arm, {})
    if not runs:
      lines.append(f"| `{arm}` | 0 | | | | | | | | |")
      continue
    finals = {s: c[-1][1] for s, c in runs.items()}
    gaps, reached_only, all_seeds, mid = [], [], [], []
    for seed, curve in runs.items():
      if seed not in base:
        continue
      target = base[seed][-1][1]
      gaps.append(finals[seed] - target)
      ref_steps = steps_to_target(base[seed], target)
      steps = steps_to_target(curve, target)
      if steps is not None and ref_steps:
        reached_only.append(steps / ref_steps - 1.0)
        all_seeds.append(steps / ref_steps - 1.0)
      else:
        bf16_steps = steps_to_target(base[seed], finals[seed])
        if bf16_steps:
          all_seeds.append(num_steps / bf16_steps - 1.0)
      mid_target = value_at(base[seed], three_quarters)
      mid_ref, mid_steps = (steps_to_target(base[seed], mid_target),
                            steps_to_target(curve, mid_target))
      if mid_ref and mid_steps is not None:
        mid.append(mid_steps / mid_ref - 1.0)
    half = [value_at(c, num_steps // 2) for c in runs.values()]
    three_q = [value_at(c, three_quarters) for c in runs.values()]
    lines.append(
        f"| `{arm}` | {len(runs)} | {format_spread(half)} | {format_spread(three_q)} | "
        f"{format_spread(list(finals.values()))} | {_interval(gaps, digits=4)} | "
        f"{_interval(reached_only, 100.0)} | {len(reached_only)}/{len(gaps)} | "
        f"{_interval(all_seeds, 100.0)} | {_interval(mid, 100.0)} |")
  return "\n".join(lines) + "\n"


DGE_TAGS = ("train/dge/factor_mean", "train/dge/clamped_fraction",
            "train/dge/above_one_fraction", "train/dge/gradient_gain")


def dge_table(sweep_dir: str) -> str:
  """Markdown: the DGE factor's statistics by quarter of training (DGE arms only)."""
  info = read_sweep_info(sweep_dir)
  num_steps = int(info["base"]["num_steps"])
  rows = collections.defaultdict(lambda: collections.defaultdict(list))
  for m in read_manifest(sweep_dir):
    directory = run_dir(sweep_dir, m["run_name"])
    if not os.path.isdir(directory):
      continue
    scalars = read_scalars(directory)
    for tag in DGE_TAGS:
      for step, value in scalars.get(tag, []):
        quarter = min(3, 4 * (step - 1) // num_steps)
        rows[(m["arm"], quarter)][tag].append(value)
  if not rows:
    return ""
  lines = ["", "## What DGE does to the weight gradients", "",
           "Logged at every `log_every` step by `numerics.optim.dge_statistics` over the "
           "quantized weights (their f'(w), the factor the backward multiplied dW by): "
           "the mean factor, the fraction at the clamp (3), the fraction above 1, and "
           "the gradient gain ||dW_DGE|| / ||dW_STE||. Each is the mean over the logged "
           "steps of the quarter and over seeds. A gain below 1 means DGE shrank the "
           "step's weight gradient. Under Adam a constant rescaling of a gradient "
           "element cancels out, so whatever DGE changes, it is not the step size alone.",
           "", "| arm | quarter | mean f' | at clamp | f' > 1 | gradient gain |",
           "|---|---|---|---|---|---|"]
  for (arm, quarter), values in sorted(rows.items()):
    cells = " | ".join(f"{sum(values[t]) / len(values[t]):.3f}" if values[t] else ""
                       for t in DGE_TAGS)
    lines.append(f"| `{arm}` | {quarter + 1} | {cells} |")
  return "\n".join(lines) + "\n"


SNR_RECIPES = (("1d2d", "mxfp4_1d2d"), ("+RHT", "mxfp4_rht"), ("+RHT+SR", "mxfp4"),
               ("NVFP4 +RHT+SR", "nvfp4"), ("+RHT+SR+MBS", "mxfp4+macro_blocks"))
SNR_FILE = "operator_snr.json"  # in the report directory, beside results.jsonl
SNR_SHAPE = {"tokens": 1024, "k": 512, "n": 512, "experts": 8, "repeats": 2}


def _snr_recipe(name: str):
  from lowprec.numerics import recipes  # pylint: disable=import-outside-toplevel
  base, _, option = name.partition("+")
  return recipes.with_macro_blocks(base) if option == "macro_blocks" else recipes.get(base)


def measure_snr(label: str, recipe: str, gemm: str, shape: dict[str, int] = SNR_SHAPE
                ) -> dict[str, float]:
  """One cell of the SNR table: forward / dgrad / wgrad SNR (dB) of ``recipe`` (a name
  of :data:`SNR_RECIPES`) on the Linear (``gemm="linear"``) or grouped expert GEMM."""
  del label
  import jax  # pylint: disable=import-outside-toplevel
  from lowprec.numerics import operator_snr  # pylint: disable=import-outside-toplevel
  experts = shape["experts"] if gemm == "grouped" else 0
  tokens = shape["tokens"] // shape["experts"] if experts else shape["tokens"]
  s = operator_snr.snr(_snr_recipe(recipe), tokens=tokens, k=shape["k"], n=shape["n"],
                       experts=experts, key=jax.random.key(0), repeats=shape["repeats"])
  return {part: float(s[part]) for part in ("forward", "dgrad", "wgrad")}


def write_snr_data(report_dir: str, shape: dict[str, int] = SNR_SHAPE) -> str:
  """Measures every cell of the SNR table (about a minute on 2 cores) and writes them to
  ``report_dir/operator_snr.json`` with the git state; returns the path. The report
  reads the committed file (:func:`snr_table`) instead of measuring on every rebuild."""
  from experiments.common.harness import run_metadata  # pylint: disable=import-outside-toplevel
  rows = [{"label": label, "recipe": recipe,
           **{gemm: measure_snr(label, recipe, gemm, shape) for gemm in ("linear", "grouped")}}
          for label, recipe in SNR_RECIPES]
  path = os.path.join(report_dir, SNR_FILE)
  with open(path, "w") as f:
    json.dump({"command": "python -m experiments.alto.operator_snr --table_dir=" + report_dir,
               "git": run_metadata.git_state(), "shape": shape, "rows": rows}, f, indent=1)
    f.write("\n")
  return path


def snr_table(sweep_dir: str) -> str:
  """Markdown: ALTO's operator-level SNR (dB), Linear and grouped expert GEMM, from the
  committed ``operator_snr.json`` (:func:`write_snr_data`); empty without it."""
  path = os.path.join(sweep_dir, SNR_FILE)
  if not os.path.exists(path):
    return ""
  with open(path) as f:
    data = json.load(f)
  shape = data["shape"]
  tokens, k, n, experts = shape["tokens"], shape["k"], shape["n"], shape["experts"]
  lines = ["", "## Operator-level SNR (dB): forward O / dgrad dX / wgrad dW", "",
           f"Operands N(0, 1) + Bernoulli(0.005) N(0, 1e4) (`numerics.operator_snr.snr`); Linear: "
           f"X {tokens}x{k}, W {k}x{n}; grouped: {experts} experts, X {experts}x"
           f"{tokens // experts}x{k}, W {experts}x{k}x{n}; mean of {shape['repeats']} draws. ALTO "
           "(Linear): 1d2d 13.48 / 11.80 / 13.02, +RHT 13.48 / 11.80 / 13.25, +RHT+SR "
           "13.48 / 11.02 / 13.04 (grouped 13.47 / 12.26 / 12.33), +RHT+MBS 14.64 / 12.20 / "
           "13.75; their shapes are not stated.", "",
           "| recipe | Linear | grouped GEMM |", "|---|---|---|"]
  for row in data["rows"]:
    cells = [f"{row[g]['forward']:.2f} / {row[g]['dgrad']:.2f} / {row[g]['wgrad']:.2f}"
             for g in ("linear", "grouped")]
    lines.append(f"| {row['label']} | {cells[0]} | {cells[1]} |")
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
  """The report appendix: :func:`convergence_table`, :func:`dge_table`,
  :func:`late_training_plot` and :func:`snr_table`."""
  return (convergence_table(sweep_dir) + dge_table(sweep_dir) + late_training_plot(sweep_dir)
          + snr_table(sweep_dir))


def confirm_appendix(sweep_dir: str) -> str:
  """The confirmatory sweep's appendix: the pilot beside each claim, and the sizing."""
  from experiments.alto.sweeps import CONFIRM_PILOTS  # pylint: disable=import-outside-toplevel
  from experiments.common.sweeps.confirmatory import confirm_sections  # pylint: disable=import-outside-toplevel
  return confirm_sections(sweep_dir, CONFIRM_PILOTS)


def confirm2_appendix(sweep_dir: str) -> str:
  """The second confirmatory sweep's appendix: the pilot beside each claim, the
  undecided claims' needs, and the sizing."""
  from experiments.alto.sweeps import CONFIRM2_PILOTS  # pylint: disable=import-outside-toplevel
  from experiments.common.sweeps.confirmatory import confirm_sections  # pylint: disable=import-outside-toplevel
  return confirm_sections(sweep_dir, CONFIRM2_PILOTS)
