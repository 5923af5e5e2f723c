"""The ``alto`` sweep: ALTO's recipe ladder and negative results on a small MoE LM.

    python -m launch.sweep --sweep=alto --sweep_dir=experiments/reports/alto --parallel=2

Scaled down from the paper (a ~1B-parameter MoE, 16k steps of GBS 16 on web text) to
fit about an hour on 2 shared CPU cores: a char-level MoE LM on Shakespeare (2 blocks,
d_model 128, 8 experts of width 128, top-2; 0.69M parameters), 500 steps of 32 x 64
tokens, 2 seeds. The de-oscillation schedule is scaled from (start 2000, period 200 of
16k steps) to start 60 of 500 (the same 12%) with period 25 (TetraJet-v2's default;
200/16k of 500 would be a 6-step window) and ALTO's ratio 4.

The appendix (computed from the runs' events when the report is built) gives the
convergence overhead -- per seed, the steps an arm needs to reach that seed's bf16
final validation loss, over the steps bf16 needed, minus 1 -- validation loss at
50/75/100% of training, and ALTO's operator-level SNR table (Linear and grouped GEMM).
"""

from __future__ import annotations

import collections
import math
import os
from typing import Sequence

import numpy as np

from launch.ablation_stats import format_spread
from launch.sweep_spec import Arm, Sweep

SEEDS = (0, 1)
BASELINE = "bf16"
_RHT_SR = {"recipe": "mxfp4"}


def alto() -> Sweep:
  """bf16; MXFP4 1d2d, + RHT, + RHT + SR, + de-oscillation; NVFP4; negative results."""
  from experiments.alto import AltoConfig  # pylint: disable=import-outside-toplevel
  # lr 1e-2 as in lm_recipes, where 3e-3 stayed on the bigram plateau at this length.
  base = AltoConfig(num_steps=500, warmup_steps=25, learning_rate=1e-2, seq_len=64,
                    batch_size=32, d_model=128, num_layers=2, num_heads=4, d_ff=128,
                    eval_every=25, eval_batches=8, log_every=10, checkpoint_every=0,
                    histogram_every=0, progress_every_s=30.0, deosc_start=60,
                    deosc_period=25, deosc_ratio=4.0)
  arms = (
      Arm("bf16", {"recipe": "bf16"}),
      Arm("mxfp4_1d2d", {"recipe": "mxfp4_1d2d"}),
      Arm("mxfp4_rht", {"recipe": "mxfp4_rht"}),
      Arm("mxfp4_rht_sr", dict(_RHT_SR)),
      Arm("mxfp4_rht_sr_deosc", {**_RHT_SR, "deoscillation": True}),
      Arm("nvfp4_rht_sr", {"recipe": "nvfp4"}),
      Arm("neg_dge", {**_RHT_SR, "recipe_options": "dge"}),
      Arm("neg_dynamic_clip", {**_RHT_SR, "recipe_options": "dynamic_clip"}),
      Arm("neg_static_clip", {**_RHT_SR, "recipe_options": "static_clip"}),
      Arm("neg_macro_block", {**_RHT_SR, "recipe_options": "macro_block"}),
  )
  return Sweep(
      name="alto", module="experiments.alto", base=base, arms=arms, seeds=SEEDS,
      baseline=BASELINE, metrics=("eval/loss", "eval/accuracy", "train/next_token_loss",
                                  "train/sown/moe_dropped"),
      higher_is_better=("eval/accuracy",), curves=("eval/loss", "train/next_token_loss"),
      appendix="launch.sweep_alto:alto_appendix",
      description="ALTO in miniature: MXFP4 training recipes on a small MoE char-LM "
      "(Shakespeare). The recipe quantizes attention projections and the grouped expert "
      "GEMMs; router, attention products and LM head stay bf16. The neg_* arms add one "
      "option to mxfp4 + RHT + SR (ALTO's base for its negative results).")


def steps_to_target(curve: Sequence[tuple[int, float]], target: float) -> float | None:
  """First step at which ``curve`` (step, loss) reaches ``target``, interpolated
  linearly between the two evaluations around the crossing; None if it never does."""
  prev = None
  for step, value in curve:
    if value <= target:
      if prev is None or prev[1] == value:
        return float(step)
      (s0, v0) = prev
      return s0 + (v0 - target) / (v0 - value) * (step - s0)
    prev = (step, value)
  return None


def value_at(curve: Sequence[tuple[int, float]], step: int) -> float:
  """The value logged at the last step <= ``step`` (nan if none)."""
  values = [v for s, v in curve if s <= step]
  return values[-1] if values else math.nan


def convergence_table(sweep_dir: str, tag: str = "eval/loss") -> str:
  """Markdown: per arm, final/50%/75% validation loss, gap to bf16 and the overhead."""
  from experiments.common.tensorboard_reader import read_scalars  # pylint: disable=import-outside-toplevel
  from launch.sweep_spec import read_manifest, read_sweep_info  # pylint: disable=import-outside-toplevel
  info = read_sweep_info(sweep_dir)
  num_steps = int(info["base"]["num_steps"])
  curves: dict[str, dict[int, list]] = collections.defaultdict(dict)
  for m in read_manifest(sweep_dir):
    if os.path.isdir(m["workdir"]):
      curve = read_scalars(m["workdir"]).get(tag, [])
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
  from numerics import qdot, recipes  # pylint: disable=import-outside-toplevel
  rows = [(label, recipes.get(name)) for label, name in SNR_RECIPES]
  rows.append(("+RHT+SR+MBS", recipes.with_macro_blocks("mxfp4")))
  lines = ["", "## Operator-level SNR (dB): forward O / dgrad dX / wgrad dW", "",
           f"Operands N(0, 1) + Bernoulli(0.005) N(0, 1e4) (`numerics.qdot.snr`); Linear: "
           f"X {tokens}x{k}, W {k}x{n}; grouped: {experts} experts, X {experts}x"
           f"{tokens // experts}x{k}, W {experts}x{k}x{n}; mean of {repeats} draws. ALTO "
           "(Linear): 1d2d 13.48 / 11.80 / 13.02, +RHT 13.48 / 11.80 / 13.25, +RHT+SR "
           "13.48 / 11.02 / 13.04 (grouped 13.47 / 12.26 / 12.33), +RHT+MBS 14.64 / 12.20 / "
           "13.75; their shapes are not stated.", "",
           "| recipe | Linear | grouped GEMM |", "|---|---|---|"]
  for label, recipe in rows:
    cells = []
    for e, t in ((0, tokens), (experts, tokens // experts)):
      s = qdot.snr(recipe, tokens=t, k=k, n=n, experts=e, key=jax.random.key(0),
                   repeats=repeats)
      cells.append(f"{s['forward']:.2f} / {s['dgrad']:.2f} / {s['wgrad']:.2f}")
    lines.append(f"| {label} | {cells[0]} | {cells[1]} |")
  return "\n".join(lines) + "\n"


def late_training_plot(sweep_dir: str, tag: str = "eval/loss") -> str:
  """Markdown linking a plot of ``tag`` over the second half of training (where the
  arms separate; the full curves are in the report's Curves section)."""
  from experiments.common.tensorboard_reader import read_scalars  # pylint: disable=import-outside-toplevel
  from launch.curve_plots import plot_curves  # pylint: disable=import-outside-toplevel
  from launch.sweep_spec import read_manifest, read_sweep_info  # pylint: disable=import-outside-toplevel
  info = read_sweep_info(sweep_dir)
  start = int(info["base"]["num_steps"]) // 2
  curves: dict[str, list] = {a["name"]: [] for a in info["arms"]}
  for m in read_manifest(sweep_dir):
    if os.path.isdir(m["workdir"]):
      curve = [(s, v) for s, v in read_scalars(m["workdir"]).get(tag, []) if s >= start]
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
