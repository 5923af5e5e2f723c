"""The fair_cast and mxfp8_rl sweeps: declarations and their appendix tables on planted
runs."""

import dataclasses

from experiments.common.tensorboard_writer import MetricWriter
from launch import sweep_fair_cast, sweep_mxfp8_rl, sweeps
from launch.sweep_spec import expand, write_manifest


def _rows(md):
  return {l.split("|")[1].strip(): [c.strip() for c in l.split("|")[2:-1]]
          for l in md.splitlines() if l.startswith("| `")}


def test_fair_cast_declaration_covers_the_issue_grid():
  sweep = sweeps.get("fair_cast")
  grid = {(a.overrides["optimizer_kind"], a.overrides["learning_rate"],
           a.overrides["export_rounding"], a.overrides["loss_on_served"])
          for a in sweep.arms}
  assert len(grid) == len(sweep.arms) == 24
  assert {g[0] for g in grid} == {"adam", "sgdm"}
  assert {g[2] for g in grid} == set(sweep_fair_cast.ROUNDINGS)
  assert len({g[1] for g in grid if g[0] == "adam"}) == 2
  assert sweep.base.refresh_interval == 1 and sweep.base.master_on_grid


def test_fair_cast_table_on_planted_runs(tmp_path):
  arms = tuple(a for a in sweeps.get("fair_cast").arms
               if a.name in ("adam_lr1e-5_nearest", "adam_lr1e-5_stochastic"))
  base = dataclasses.replace(sweeps.get("fair_cast").base, num_updates=20)
  sweep = dataclasses.replace(sweeps.get("fair_cast"), base=base, arms=arms)
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
          "perf/update_s": (10.0 if u <= sweep_fair_cast.WARMUP_UPDATES else
                            (0.1 if nearest else 0.11 + 0.01 * r.seed))})
      if u % 8 == 0:
        w.write_scalars(u, {"export/lag_steps": 20.0 if nearest else 0.0})
    w.write_scalars(20, {"eval/greedy_accuracy": 0.45})
    w.close()
  rows = _rows(sweep_fair_cast.fair_cast_appendix(str(tmp_path)))
  near, sr = rows["`adam_lr1e-5_nearest`"], rows["`adam_lr1e-5_stochastic`"]
  assert near[0] == "20.0 ± 0.0" and sr[0] == "0.0 ± 0.0"  # lag, second half
  assert near[1] == "0.9900 ± 0.0000" and sr[1] == "0.9000 ± 0.0000"
  assert near[4] == "10.00 ± 0.00e-6"
  assert near[7] == "1.00 ± 0.00"
  assert sr[7] == "1.15 ± 0.07"  # seeds: 0.11 / 0.1 and 0.12 / 0.1


def test_mxfp8_rl_table_on_planted_runs(tmp_path):
  sweep = dataclasses.replace(sweeps.get("mxfp8_rl"), seeds=(0, 1),
                              base=dataclasses.replace(sweeps.get("mxfp8_rl").base,
                                                       num_updates=4))
  assert [a.name for a in sweep.arms] == ["L-bf16_S-bf16", "L-mxfp8_S-mxfp8",
                                          "L-bf16_S-mxfp8", "L-mxfp8_S-bf16"]
  runs = expand(sweep, str(tmp_path))
  write_manifest(sweep, runs, str(tmp_path))
  for r in runs:
    if r.arm not in ("L-mxfp8_S-mxfp8", "L-bf16_S-mxfp8"):
      continue
    crossed = r.arm == "L-bf16_S-mxfp8"
    w = MetricWriter(r.workdir)
    w.write_scalars(0, {"eval/greedy_accuracy": 0.4})
    for u in range(1, 5):
      w.write_scalars(u, {"train/reward": 0.25 * u, "train/mismatch_k3":
                          0.002 * crossed + 0.0001 * r.seed,
                          "train/mismatch_max_abs_delta_logp": 0.5,
                          "sync/k3": 0.001 * crossed, "sync/max_abs_delta_logp": 0.1})
    w.write_scalars(4, {"eval/greedy_accuracy": 0.5})
    w.close()
  rows = _rows(sweep_mxfp8_rl.mxfp8_rl_appendix(str(tmp_path)))
  assert rows["`L-mxfp8_S-mxfp8`"][0] == "0.00005 ± 0.00007"
  assert rows["`L-bf16_S-mxfp8`"][0] == "0.00205 ± 0.00007"
  assert rows["`L-bf16_S-mxfp8`"][2] == "0.001000 ± 0.000000"
  assert rows["`L-bf16_S-mxfp8`"][4] == "0.625 ± 0.000"
  assert rows["`L-bf16_S-bf16`"] == [""] * 6  # no completed runs
