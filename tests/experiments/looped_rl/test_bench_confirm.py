"""experiments.looped_rl.bench_confirm: the rollout throughput claims' sequential
benchmark on a short plan; its JSON records the git state and the declaration; its
report rebuilds byte for byte.

The rollouts are stand-ins (plain Python calls, one slower than the other): compiling
the real ones costs about 15 s on one pinned core, and the machinery they would run
through (pinning, interleaved rounds, looks) is the one
tests/experiments/qlora/test_bench_confirm.py runs with compiled steps.
"""

import json
import os
import shutil

from experiments.common.sweeps.sequential import SequentialPlan
from experiments.looped_rl import bench_confirm, bench_rollout, sweeps


def _stand_in_rollouts(calls):
  def rollout_fns(recipe, prompt_len, num_new, batch):
    calls.append((recipe, prompt_len, num_new, batch))
    return {"deferred": lambda: sum(range(1_000)), "dense": lambda: sum(range(20_000))}
  return rollout_fns


def test_sequential_rollout_benchmark_runs_records_and_rebuilds(tmp_path, monkeypatch):
  monkeypatch.setattr(sweeps, "ROLLOUT_PLAN", SequentialPlan(batch=2, cap=4))
  monkeypatch.setattr(sweeps, "ROLLOUT_REPEATS", 1)
  monkeypatch.setattr(sweeps, "ROLLOUT_SHAPES", ((8, 5),))
  monkeypatch.setattr(sweeps, "ROLLOUT_CLAIMS", sweeps.ROLLOUT_CLAIMS[:1])
  calls = []
  monkeypatch.setattr(bench_rollout, "rollout_fns", _stand_in_rollouts(calls))
  affinity = os.sched_getaffinity(0)
  record = bench_confirm.run(str(tmp_path), -1, batch=4)
  assert os.sched_getaffinity(0) == affinity  # unpinned again
  assert calls == [(sweeps.ROLLOUT_RECIPE, 8, 5, 4)]
  assert len(record["git"]["commit"]) == 40 and record["git"]["dirty"] in (True, False)
  rounds = record["looks"][-1]["rounds"]
  assert rounds in (2, 4)
  assert set(record["per_round_s"]) == {"deferred_p8_n5", "dense_p8_n5"}
  assert all(len(v) == rounds for v in record["per_round_s"].values())
  assert record["declaration"]["plan"]["cap"] == 4 and record["batch_run"] == 4
  first = open(bench_confirm.build_report(str(tmp_path))).read()
  assert first.index("## Claims") < first.index("## Setup")
  assert "| prompt 8 + 5 new |" in first
  copy = tmp_path / "copy"
  copy.mkdir()
  shutil.copy(tmp_path / bench_confirm.JSON_FILE, copy)
  assert open(bench_confirm.build_report(str(copy))).read() == first
  assert json.load(open(copy / bench_confirm.JSON_FILE)) == record


def test_declaration_pairs_each_shape():
  shapes = {bench_confirm.method_name(p, *s) for s in sweeps.ROLLOUT_SHAPES
            for p in ("deferred", "dense")}
  for c in sweeps.ROLLOUT_CLAIMS:
    assert c.kind == "better" and c.metric == sweeps.ROLLOUT_LOG_S
    assert {c.arm, c.baseline} <= shapes
    assert c.arm.split("_", 1)[1] == c.baseline.split("_", 1)[1]  # the same shape


def test_cpu_flag_outside_the_allowed_cpus_is_a_usage_error():
  from experiments.common.sweeps import bench_sequential  # pylint: disable=import-outside-toplevel
  allowed = sorted(os.sched_getaffinity(0))
  assert bench_sequential.cpu_error(-1) is None
  assert bench_sequential.cpu_error(allowed[0]) is None
  assert "not one of the CPUs" in bench_sequential.cpu_error(allowed[-1] + 1000)
