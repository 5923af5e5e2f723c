"""The temperon sweep's report appendix: cost and time-to-target as ratios."""

from __future__ import annotations

import collections
import json
import math
import os

import numpy as np

from experiments.common.evidence.results import benchmark_provenance
from experiments.common.sweeps.sweep_data import read_manifest, results_by_run
from experiments.temperon.sweeps import BASELINE, TARGET


def _mean(xs):
  xs = [x for x in xs if isinstance(x, (int, float)) and math.isfinite(x)]
  return (float(np.mean(xs)), len(xs)) if xs else (math.nan, 0)


def cost_appendix(sweep_dir: str) -> str:
  """Markdown: per-arm cost and time-to-target as ratios to ``sgd`` and to ``temperon``.

  Ratios of per-arm means over the seeds that have a value (``n`` shown); s/step ratios
  use each run's own median seconds per step (all runs shared the same 2 cores).
  """
  manifest = {m["run_name"]: m for m in read_manifest(sweep_dir)}
  by_arm: dict[str, list[dict]] = collections.defaultdict(list)
  for name, row in results_by_run(sweep_dir).items():
    by_arm[manifest[name]["arm"]].append(row["metrics"])
  arms = list(dict.fromkeys(m["arm"] for m in manifest.values()))
  t = f"{TARGET:g}"
  keys = ("cost/grad_evals_per_step", "cost/total_s", f"grad_evals_to/{t}",
          f"time_to/{t}", f"steps_to/{t}")
  means = {a: {k: _mean([r.get(k) for r in by_arm.get(a, [])]) for k in keys} for a in arms}

  def ratio(a, ref, k):
    (x, n), (y, _) = means[a][k], means.get(ref, {}).get(k, (math.nan, 0))
    return ("n/a" if not (math.isfinite(x) and math.isfinite(y) and y) else
            f"{x / y:.2f} (n={n})")

  lines = ["", "## Cost and time-to-target as ratios", "",
           "Ratio of arm means (n = seeds with a value). `SAM steps`: the share of steps "
           "that take SAM's second gradient (grad evals/step - 1). `wall/run`: steps x the "
           "run's measured median s/step of each step kind (phase, SAM or not). "
           f"`... to {t}`: gradient evaluations / calibrated seconds / steps to the first "
           f"evaluation at {t} test accuracy.", "",
           "| arm | SAM steps | grad evals/run vs sgd | wall/run vs sgd | wall/run vs temperon "
           f"| grad evals to {t} vs temperon | time to {t} vs temperon | steps to {t} vs "
           "temperon |", "|---|---|---|---|---|---|---|---|"]
  for a in arms:
    share = means[a][keys[0]][0] - 1
    lines.append(f"| `{a}` | {share:.2f} | {ratio(a, 'sgd', keys[0])} | "
                 f"{ratio(a, 'sgd', keys[1])} | {ratio(a, BASELINE, keys[1])} | "
                 f"{ratio(a, BASELINE, keys[2])} | {ratio(a, BASELINE, keys[3])} | "
                 f"{ratio(a, BASELINE, keys[4])} |")
  return "\n".join(lines + bench_section(sweep_dir)) + "\n"


BENCH_FILE = "bench_step.json"


def bench_section(sweep_dir: str) -> list[str]:
  """The interleaved wall-clock benchmark (:mod:`experiments.temperon.bench_step`), if
  its JSON is in the sweep directory: each arm's training seconds per run per round and
  its ratio to ``temperon`` in every round."""
  path = os.path.join(sweep_dir, BENCH_FILE)
  if not os.path.exists(path):
    return []
  with open(path) as f:
    bench = json.load(f)
  runs = bench["s_per_run"]
  lines = ["", "## Wall-clock per run, arms interleaved in one process", "",
           f"`python -m experiments.temperon.bench_step` ({BENCH_FILE}): each arm's own "
           f"jitted step for its {bench['num_steps']} steps on one batch, no evaluation, "
           f"the arms interleaved in each of {bench['rounds']} rounds (in "
           f"{bench.get('chunks', 1)} chunks per run, the arms in turn) on "
           f"{bench['device']} ({benchmark_provenance(bench)}). Ratio `arm / temperon` "
           "per round; *every round* says "
           "whether it is on the same side of 1 in all rounds.", "",
           "| arm | s/run per round | arm / temperon per round | every round |",
           "|---|---|---|---|"]
  for arm, ts in runs.items():
    ratios = [t / b for t, b in zip(ts, runs[BASELINE])]
    side = ("> 1" if min(ratios) > 1 else "< 1" if max(ratios) < 1 else "mixed")
    lines.append(f"| `{arm}` | {', '.join(f'{t:.2f}' for t in ts)} | "
                 f"{', '.join(f'{r:.2f}' for r in ratios)} | "
                 f"{side if arm != BASELINE else '-'} |")
  return lines


def confirm_appendix(sweep_dir: str) -> str:
  """The confirmatory sweep's appendix: the pilot beside each claim, and the sizing."""
  from experiments.common.sweeps.confirmatory import confirm_sections  # pylint: disable=import-outside-toplevel
  from experiments.temperon.sweeps import CONFIRM_PILOTS  # pylint: disable=import-outside-toplevel
  return confirm_sections(sweep_dir, CONFIRM_PILOTS)


def confirm2_appendix(sweep_dir: str) -> str:
  """The second confirmatory sweep's appendix: the pilot beside each claim, the
  undecided claims' needs, and the sizing."""
  from experiments.common.sweeps.confirmatory import confirm_sections  # pylint: disable=import-outside-toplevel
  from experiments.temperon.sweeps import CONFIRM2_PILOTS  # pylint: disable=import-outside-toplevel
  return confirm_sections(sweep_dir, CONFIRM2_PILOTS)
