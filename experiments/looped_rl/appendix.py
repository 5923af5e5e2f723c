"""The looped_rl sweep's report appendix: exactness, mismatch and clipping by arm."""

from __future__ import annotations

from experiments.common.evidence.stats import format_spread
from experiments.common.sweeps.sweep_data import evaluation_metrics



def looped_rl_appendix(sweep_dir: str) -> str:
  """Markdown: per arm, the ratio's exactness, the dense-vs-deferred mismatch, PPO
  clipping and the reward."""
  info, runs = evaluation_metrics(sweep_dir)
  col = lambda seeds, tag, digits=4: format_spread([s.get(tag) for s in seeds.values()],
                                                   digits)
  lines = ["", "## Ratio exactness, mismatch and clipping", "",
           "Over all updates of a run, then mean ± sample std over seeds. *exact runs*: "
           "runs whose PPO ratio was exactly 1 on every counted token of every update "
           "(max |log r| = 0); *max abs log r*: the largest |learner - behaviour| "
           "log-prob the loss used; *r != 1*: mean fraction of counted tokens whose "
           "ratio was not exactly 1; *dense k3* and *dense max abs Δlogp*: the dense "
           "pass against the rollout's log-probs (computed in both arms; the replay arm "
           "does not use it for the ratio); *clip*: PPO clipped fraction; reward: mean "
           "over training; greedy: final greedy accuracy (warm start in brackets).", "",
           "| arm | exact runs | max abs log r | r != 1 | dense k3 | dense max abs Δlogp | "
           "clip | reward | greedy (warm) |", "|---|---|---|---|---|---|---|---|---|"]
  for arm in [a["name"] for a in info["arms"]]:
    seeds = runs.get(arm, {})
    if not seeds:
      lines.append(f"| `{arm}` | no runs | | | | | | | |")
      continue
    exact = sum(s.get("ratio/max_abs_log_ratio") == 0.0 for s in seeds.values())
    lines.append(
        f"| `{arm}` | {exact}/{len(seeds)} | {col(seeds, 'ratio/max_abs_log_ratio', 6)} | "
        f"{col(seeds, 'ratio/not_one_frac_mean', 4)} | "
        f"{col(seeds, 'mismatch/dense_k3_mean', 7)} | "
        f"{col(seeds, 'mismatch/dense_max_abs_dlogp', 4)} | "
        f"{col(seeds, 'ratio/clip_frac_mean', 5)} | "
        f"{col(seeds, 'reward/mean_over_training', 3)} | "
        f"{col(seeds, 'eval/greedy_accuracy', 3)} "
        f"({col(seeds, 'warm_start/greedy_accuracy', 3)}) |")
  return "\n".join(lines) + "\n"


def confirm_appendix(sweep_dir: str) -> str:
  """The confirmatory sweep's appendix: the count claims beside the pilot's counts, then
  the per-arm exactness table."""
  from experiments.common.sweeps.confirmatory import count_table  # pylint: disable=import-outside-toplevel
  from experiments.looped_rl.sweeps import CONFIRM_COUNTS, CONFIRM_PILOTS  # pylint: disable=import-outside-toplevel
  return count_table(sweep_dir, CONFIRM_COUNTS, CONFIRM_PILOTS) + looped_rl_appendix(sweep_dir)
