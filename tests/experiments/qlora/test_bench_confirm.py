"""experiments.qlora.bench_confirm: the speed claims' sequential benchmark on a tiny
model and plan; its JSON records the git state; its report rebuilds byte for byte."""

import json
import os
import shutil

from experiments.common.sweeps.sequential import SequentialPlan
from experiments.qlora import bench_confirm, sweeps
from experiments.qlora import experiment as ql

TINY = dict(d_model=64, num_layers=1, num_heads=2, d_ff=128, seq_len=16, batch_size=4,
            rank=4)


def test_sequential_benchmark_runs_records_and_rebuilds(tmp_path, monkeypatch):
  monkeypatch.setattr(sweeps, "SPEED_PLAN", SequentialPlan(batch=2, cap=4))
  monkeypatch.setattr(sweeps, "SPEED_REPEATS", 1)
  affinity = os.sched_getaffinity(0)
  record = bench_confirm.run(str(tmp_path), -1, ql.QLoRAConfig(**TINY))
  assert os.sched_getaffinity(0) == affinity  # unpinned again
  assert len(record["git"]["commit"]) == 40 and record["git"]["dirty"] in (True, False)
  rounds = record["looks"][-1]["rounds"]
  assert rounds in (2, 4)
  assert all(len(v) == rounds for v in record["per_round_s"].values())
  assert record["declaration"]["plan"] == {"batch": 2, "cap": 4, "spending":
                                           "obrien_fleming", "first": 0, "alpha": 0.05}
  first = open(bench_confirm.build_report(str(tmp_path))).read()
  assert "## Pilot and confirmatory, side by side" in first
  copy = tmp_path / "copy"
  copy.mkdir()
  shutil.copy(tmp_path / bench_confirm.JSON_FILE, copy)
  assert open(bench_confirm.build_report(str(copy))).read() == first
  assert json.load(open(copy / bench_confirm.JSON_FILE)) == record


def test_declaration_is_the_pilots_methods_and_claims():
  assert set(sweeps.SPEED_METHODS) <= {"nf4_lora", "bf16_lora", "nf4_lora_materialize"}
  for c in sweeps.SPEED_CLAIMS:
    assert {c.arm, c.baseline} <= set(sweeps.SPEED_METHODS)
    assert c.metric == sweeps.STEP_LOG_S
