"""The ``mxfp8_rl`` sweep: learner x sampler precision in {bf16, mxfp8}^2.

    python -m launch.sweep --sweep=mxfp8_rl --sweep_dir=experiments/reports/mxfp8_rl \
        --parallel=2

GRPO on 3-digit addition (:mod:`experiments.mxfp8_rl`), sampler synced every update,
token-level TIS, the seven weight-sync checks at every sync. 3 seeds, 128 updates.
The appendix tabulates the sampler-learner mismatch over training (on the sampled
tokens, and right after each sync on the fixed probe batch) and the reward.
"""

from __future__ import annotations

import numpy as np

from launch.sweep_spec import Arm, Sweep
from launch.sweep_stale_sampler import completed_runs, spread

SEEDS = (0, 1, 2)
PAIRS = (("bf16", "bf16"), ("mxfp8", "mxfp8"), ("bf16", "mxfp8"), ("mxfp8", "bf16"))
BASELINE = "L-bf16_S-bf16"


def mxfp8_rl() -> Sweep:
  """The four (learner, sampler) recipe pairs, 3 seeds."""
  from experiments.mxfp8_rl import MXFP8RLConfig  # pylint: disable=import-outside-toplevel
  base = MXFP8RLConfig(num_updates=128, eval_every=16)
  arms = tuple(Arm(f"L-{lr}_S-{sr}", {"learner_recipe": lr, "sampler_recipe": sr})
               for lr, sr in PAIRS)
  return Sweep(
      name="mxfp8_rl", module="experiments.mxfp8_rl", base=base, arms=arms, seeds=SEEDS,
      baseline=BASELINE,
      metrics=("train/mismatch_k3", "sync/k3", "reward/mean_over_training",
               "eval/greedy_accuracy"),
      higher_is_better=("reward/mean_over_training", "eval/greedy_accuracy"),
      curves=("train/mismatch_k3", "sync/k3", "eval/greedy_accuracy"),
      appendix="launch.sweep_mxfp8_rl:mxfp8_rl_appendix",
      description="MXFP8 RL in miniature: the learner trains in one recipe and the "
      "sampler serves in another (MXFP8: the projections' kernels quantized at each "
      "sync, 1x32 blocks along the contraction axis; head bf16; embeddings and norms "
      "float32). Arms are L-<learner>_S-<sampler>.")


def mismatch_table(sweep_dir: str) -> str:
  """Markdown: per pair, mismatch on sampled tokens and on the probe, and reward."""
  info, runs = completed_runs(sweep_dir)
  lines = ["", "## Mismatch by recipe pair", "",
           "Mean ± sample std over seeds of the per-update mean. *k3 (sampled)*: "
           "KL(sampler ‖ learner) by the k3 estimator on the sampled completion tokens, "
           "before the update; *k3 / max |Δlogp| (probe)*: on the fixed probe batch "
           "right after each sync (the parity check); reward: mean over training; "
           "greedy: the learner's final greedy accuracy.", "",
           "| arm | k3 (sampled) | max abs Δlogp (sampled) | k3 (probe) | "
           "max abs Δlogp (probe) | reward | greedy |", "|---|---|---|---|---|---|---|"]
  for arm in [a["name"] for a in info["arms"]]:
    seeds = runs.get(arm, {})
    if not seeds:
      lines.append(f"| `{arm}` | | | | | | |")
      continue
    mean = lambda tag: [float(np.mean([v for _, v in s[tag]])) for s in seeds.values()]
    lines.append(
        f"| `{arm}` | {spread(mean('train/mismatch_k3'), 5)} | "
        f"{spread(mean('train/mismatch_max_abs_delta_logp'), 3)} | "
        f"{spread(mean('sync/k3'), 6)} | {spread(mean('sync/max_abs_delta_logp'), 4)} | "
        f"{spread(mean('train/reward'))} | "
        f"{spread([s['eval/greedy_accuracy'][-1][1] for s in seeds.values()])} |")
  return "\n".join(lines) + "\n"


def mxfp8_rl_appendix(sweep_dir: str) -> str:
  """The report appendix: :func:`mismatch_table`."""
  return mismatch_table(sweep_dir)
