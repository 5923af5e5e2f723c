"""The fair_cast sweep: its declaration and its appendix table on planted runs."""

import dataclasses

from experiments.common.tensorboard_writer import MetricWriter
from experiments.fair_cast import appendix, sweeps
from launch import registry
from launch.manifest import expand, write_manifest


def _rows(md):
  return {l.split("|")[1].strip(): [c.strip() for c in l.split("|")[2:-1]]
          for l in md.splitlines() if l.startswith("| `")}


def test_fair_cast_declaration_covers_the_issue_grid():
  sweep = registry.get("fair_cast")
  grid = {(a.overrides["optimizer_kind"], a.overrides["learning_rate"],
           a.overrides["export_rounding"], a.overrides["loss_on_served"])
          for a in sweep.arms}
  assert len(grid) == len(sweep.arms) == 24
  assert {g[0] for g in grid} == {"adam", "sgdm"}
  assert {g[2] for g in grid} == set(sweeps.ROUNDINGS)
  assert len({g[1] for g in grid if g[0] == "adam"}) == 2
  assert sweep.base.refresh_interval == 1 and sweep.base.master_on_grid


def test_fair_cast_table_on_planted_runs(tmp_path):
  arms = tuple(a for a in registry.get("fair_cast").arms
               if a.name in ("adam_lr1e-5_nearest", "adam_lr1e-5_stochastic"))
  base = dataclasses.replace(registry.get("fair_cast").base, num_updates=20)
  sweep = dataclasses.replace(registry.get("fair_cast"), base=base, arms=arms)
  runs = expand(sweep, str(tmp_path))
  write_manifest(sweep, runs, str(tmp_path))
  for r in runs:
    nearest = r.arm.endswith("nearest")
    w = MetricWriter(r.workdir)
    w.write_scalars(0, {"eval/greedy_accuracy": 0.4})
    for u in range(1, 21):
      w.write_scalars(u, {
          "train/reward": 0.3, "train/mismatch_k3": 0.001,
          "export/unchanged_fraction": 0.99 if nearest else 0.9,
          "export/master_step_rms": 1e-5, "export/visible_displacement": 0.5,
          # The first WARMUP_UPDATES are left out of the time ratio.
          "perf/update_s": (10.0 if u <= appendix.WARMUP_UPDATES else
                            (0.1 if nearest else 0.11 + 0.01 * r.seed))})
      if u % 8 == 0:
        w.write_scalars(u, {"export/lag_steps": 20.0 if nearest else 0.0})
    w.write_scalars(20, {"eval/greedy_accuracy": 0.45})
    w.close()
  rows = _rows(appendix.fair_cast_appendix(str(tmp_path)))
  near, sr = rows["`adam_lr1e-5_nearest`"], rows["`adam_lr1e-5_stochastic`"]
  assert near[0] == "20.0 ± 0.0" and sr[0] == "0.0 ± 0.0"  # lag, second half
  assert near[1] == "0.9900 ± 0.0000" and sr[1] == "0.9000 ± 0.0000"
  assert near[4] == "10.00 ± 0.00e-6"
  assert near[7] == "1.00 ± 0.00"
  assert sr[7] == "1.15 ± 0.07"  # seeds: 0.11 / 0.1 and 0.12 / 0.1
