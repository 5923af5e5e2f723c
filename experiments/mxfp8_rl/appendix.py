"""The mxfp8_rl sweep's report appendix: mismatch and reward by recipe pair."""

from __future__ import annotations

import numpy as np

from experiments.common.rl.report import completed_runs, spread


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
