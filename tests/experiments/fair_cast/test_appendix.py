"""The fair_cast sweep: its declaration, its appendix tables on planted runs, and the
export benchmark's smoke run."""

import dataclasses
import json

import pytest

from experiments.common.evidence.results import append_result
from experiments.common.evidence.tensorboard_writer import MetricWriter
from experiments.fair_cast import appendix, bench_export, sweeps
from launch import registry
from launch.manifest import expand, write_manifest


def _rows(md):
  return {l.split("|")[1].strip(): [c.strip() for c in l.split("|")[2:-1]]
          for l in md.splitlines() if l.startswith("| `")}


def _section(md, title):
  part = md.split(f"## {title}")[1].split("\n## ")[0]
  return [[c.strip() for c in l.split("|")[1:-1]] for l in part.splitlines()
          if l.startswith("| ") and not l.startswith("| setting") and
          not l.startswith("| export |")]


def test_fair_cast_declaration_is_the_papers_regime():
  sweep = registry.get("fair_cast")
  base = sweep.base
  assert base.num_updates >= 512 and base.lag_history >= 512
  assert base.warm_start_per_seed and base.pretrain_target_accuracy > 0
  assert base.refresh_interval == 1 and base.master_on_grid
  assert len(sweep.seeds) >= 4 and not set(sweep.seeds) & set(sweep.calibration_seeds)
  grid = {(a.overrides["learning_rate"], a.overrides["is_method"],
           a.overrides["export_rounding"], a.overrides["loss_on_served"])
          for a in sweep.arms}
  assert len(grid) == len(sweep.arms) == 24
  assert {g[0] for g in grid} == {1e-6, 3e-6, 3e-5}
  assert {g[1] for g in grid} == {"token_tis", "none"}
  assert {g[2] for g in grid} == set(sweeps.ROUNDINGS)
  # The loss on the served copy at both RL learning rates, with every rounding.
  assert {(g[0], g[2]) for g in grid if g[3]} == {(lr, r) for lr in sweeps.RL_LRS
                                                  for r in sweeps.ROUNDINGS}
  # Every arm its own rollout stream; every claim on a declared metric.
  assert len({a.overrides["sampling_stream"] for a in sweep.arms}) == len(sweep.arms)
  metrics = set(sweep.metrics)
  assert {c.metric for c in sweep.claims} <= metrics
  # Learner accuracy and sampled reward are claimed separately.
  assert {"accuracy/mean_over_training", "reward/mean_over_training",
          "export/lag_second_half", "export/unchanged_mean"} <= {c.metric
                                                                 for c in sweep.claims}
  assert all(dataclasses.replace(base, **a.overrides) for a in sweep.arms)


def _planted_sweep(tmp_path, arm_names, num_updates=20):
  full = registry.get("fair_cast")
  arms = tuple(a for a in full.arms if a.name in arm_names)
  base = dataclasses.replace(full.base, num_updates=num_updates, lag_history=8)
  sweep = dataclasses.replace(full, base=base, arms=arms, claims=(),
                              baseline=arms[0].name, seeds=(1, 2, 3))
  runs = expand(sweep, str(tmp_path))
  write_manifest(sweep, runs, str(tmp_path))
  return sweep, runs


def test_fair_cast_tables_on_planted_runs(tmp_path):
  near, sr = "lr1e-6_tis_nearest", "lr1e-6_tis_stochastic"
  _, runs = _planted_sweep(tmp_path, (near, sr))
  results = str(tmp_path / "results.jsonl")
  for r in runs:
    nearest = r.arm == near
    w = MetricWriter(r.workdir)
    w.write_scalars(0, {"eval/greedy_accuracy": 0.4})
    for u in range(1, 21):
      w.write_scalars(u, {
          "train/reward": 0.3, "train/mismatch_k3": 0.001,
          "export/unchanged_fraction": 0.99 if nearest else 0.9,
          "export/master_step_rms": 1e-5, "export/visible_displacement": 0.5,
          # The first WARMUP_UPDATES are left out of the time ratio.
          "perf/update_s": (10.0 if u <= appendix.WARMUP_UPDATES else
                            (0.1 if nearest else 0.11 + 0.01 * (r.seed - 1)))})
    w.write_scalars(20, {"eval/greedy_accuracy": 0.45})
    w.close()
    # Results rows: the learner's accuracy does not move, the sampled reward does.
    append_result(results, {
        "run_name": r.run_name, "completed": True, "metrics": {
            "accuracy/mean_over_training": 0.45 + 0.01 * r.seed,
            "accuracy/last_quarter": 0.45,
            "reward/mean_over_training": 0.3 + (0.0 if nearest else 0.002 * r.seed),
            # k* and its capped share come from the rows (events may be thinned)
            "export/lag_second_half": 8.0 if nearest else 0.0,
            "export/lag_capped_fraction": 1.0 if nearest else 0.0,
            "export/unchanged_mean": 0.99 if nearest else 0.9}})
  md = appendix.fair_cast_appendix(str(tmp_path))
  rows = _rows(md)
  n, s = rows[f"`{near}`"], rows[f"`{sr}`"]
  assert n[0] == "8.0 ± 0.0" and s[0] == "0.0 ± 0.0"  # lag, second half
  assert n[1] == "1.00 ± 0.00" and s[1] == "0.00 ± 0.00"  # at the cap
  assert n[2] == "0.9900 ± 0.0000" and s[2] == "0.9000 ± 0.0000"
  assert n[5] == "10.00 ± 0.00e-6"
  assert n[7] == "0.450 ± 0.000"  # learner accuracy, mean over the evaluations after 0
  assert n[8] == "1.00 ± 0.00" and s[8] == "1.20 ± 0.10"
  [paired] = _section(md, "Unbiased export against nearest")
  assert paired[:2] == ["lr 1e-06, tis", "stochastic"]
  assert paired[2] == "-8.0 [-8.0, -8.0] (0/3)"
  assert paired[4] == "+0.000 [+0.000, +0.000] (0/3)"  # the learner: no change
  assert paired[6].startswith("+0.0040 [") and paired[6].endswith("(3/3)")
  signs = _section(md, "Sign test")
  reward = [r for r in signs if r[0] == "stochastic" and r[1].startswith("sampled")][0]
  assert reward[2:] == ["3/3", "+0.0040", "0.2500"]
  accuracy = [r for r in signs if r[0] == "stochastic" and r[1].startswith("learner")][0]
  assert accuracy[2] == "0/0"  # every difference is zero


def test_fair_cast_summary_metrics():
  config = registry.get("fair_cast").base
  config = dataclasses.replace(config, lag_history=4)
  scalars = {"export/lag_steps": [(5, 4.0), (9, 2.0), (17, 4.0)],
             "export/unchanged_fraction": [(1, 1.0), (2, 0.5)],
             "train/mismatch_k3": [(1, 0.25), (2, 0.75)]}
  m = config.summary_metrics(scalars, done=16)
  assert m["export/lag_second_half"] == 3.0  # steps 9, 17 are past update 8
  assert m["export/lag_capped_fraction"] == 0.5  # 4 = the cap at step 17
  assert m["export/unchanged_mean"] == 0.75
  assert m["mismatch/k3_mean_over_training"] == 0.5


@pytest.mark.parametrize("rounds", [2])
def test_bench_export_smoke(rounds, tmp_path):
  config = dataclasses.replace(registry.get("fair_cast").base, d_model=16, d_ff=32,
                               num_layers=1, num_heads=2, prompts_per_update=2,
                               group_size=2)
  result = bench_export.run(config, rounds=rounds, repeats=1)
  names = {"update", "host_metrics"} | {f"export/{r}" for r in sweeps.ROUNDINGS}
  assert set(result["times"]) == names
  assert result["times"]["update"]["ratio"] == 1.0
  assert all(s["ms"] > 0 and s["ratio_min"] <= s["ratio"] <= s["ratio_max"]
             for s in result["times"].values())
  assert all(len(v) == rounds for v in result["per_round_s"].values())
  json.dumps(result)
