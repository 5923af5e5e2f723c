"""experiments.common.trainers.rl.report.completed_runs: which runs count as completed.

Before: a run counted only if it logged ``train/reward`` at every logged update, so a
sweep whose events were thinned by launch.thin_events (fair_cast: every 16th update of
512) had no completed run and its appendix tables came out empty.
"""

import dataclasses

from experiments.common.evidence.tensorboard_writer import MetricWriter
from experiments.common.trainers.rl.report import completed_runs
from launch import registry
from launch.manifest import expand, write_manifest


def test_a_thinned_run_is_complete_and_a_stopped_one_is_not(tmp_path):
  full = registry.get("fair_cast")
  base = dataclasses.replace(full.base, num_updates=32)
  sweep = dataclasses.replace(full, base=base, arms=full.arms[:1], claims=(),
                              baseline=full.arms[0].name, seeds=(1, 2, 3))
  runs = expand(sweep, str(tmp_path))
  write_manifest(sweep, runs, str(tmp_path))
  last = {1: 32, 2: 32, 3: 24}  # seed 3 stopped at update 24
  every = {1: 1, 2: 16, 3: 1}   # seed 2's events thinned to every 16th update
  for r in runs:
    w = MetricWriter(r.workdir)
    for u in range(every[r.seed], last[r.seed] + 1, every[r.seed]):
      w.write_scalars(u, {"train/reward": 0.5})
    w.close()
  _, done = completed_runs(str(tmp_path))
  assert sorted(done[full.arms[0].name]) == [1, 2]
