"""Memoir experiment end to end (tiny), the sweep declaration and the report statistics."""

import dataclasses
import json
import math
import os

import pytest

from experiments import memoir
from experiments import memoir_report
from experiments.common.results import read_results
from experiments.common.run_options import RunOptions
from experiments.common.tensorboard_reader import read_scalars
from launch import sweep_memoir, sweeps
from launch.sweep import prepare

TINY = memoir.MemoirExperimentConfig(
    num_steps=12, num_pairs=4, key_dim=8, num_values=4, d_latent=16, d_mem=8, d_hidden=16,
    d_pred=8, max_steps=2, batch_size=8, eval_every=6, eval_batches=1, log_every=3)


def test_smoke_writes_events_config_checkpoint_and_results(tmp_path):
  wd = tmp_path / "run"
  summary = memoir.train_and_evaluate(TINY, RunOptions(workdir=str(wd)))
  assert summary["completed"] and summary["step"] == 12
  scalars = read_scalars(str(wd))
  assert [s for s, _ in scalars["eval/recall"]] == [0, 6, 12]
  assert [s for s, _ in scalars["train/energy_margin"]] == list(range(1, 13))
  for tag in ("train/loss", "train/expected_depth", "eval/energy_margin", "train/memory_drift"):
    assert tag in scalars, tag
  meta = json.load(open(wd / "config.json"))
  assert meta["config"] == dataclasses.asdict(TINY)
  assert sorted(os.listdir(wd / "checkpoints")) == ["12"]
  rows = read_results(str(wd / "results.jsonl"))
  assert len(rows) == 1 and rows[0]["num_params"] == summary["num_params"] > 0
  assert 0.0 <= rows[0]["metrics"]["eval/recall"] <= 1.0
  assert math.isfinite(rows[0]["metrics"]["eval/energy_margin"])


def test_sweep_declaration_matches_the_paper_protocol(tmp_path):
  short = sweeps.get("memoir")
  assert short.base.num_steps == 240 and len(short.seeds) == 12
  assert [a.name for a in short.arms] == ["coupled", "read_only"]
  assert short.metrics[0] == "eval/recall" and "train/energy_margin" in short.curves
  long = sweep_memoir.memoir_long()
  assert long.base.num_steps == 960 and long.seeds == tuple(range(8))
  # The documented CLI form of the long budget expands to exactly memoir_long()'s runs.
  overrides = [sweep_memoir.LONG_COMMAND_FLAGS[0].split("=", 1)[1]]
  seeds = [int(s) for s in sweep_memoir.LONG_COMMAND_FLAGS[1].split("=", 1)[1].split(",")]
  _, via_cli = prepare(short, str(tmp_path), overrides, seeds)
  _, direct = prepare(long, str(tmp_path), [])
  assert [r.run_name for r in via_cli] == [r.run_name for r in direct]
  # Arms differ only in the mode: same data, optimizer, schedule and seeds.
  by_seed = {}
  for r in direct:
    by_seed.setdefault(r.seed, []).append({k: v for k, v in r.config.items() if k != "mode"})
  assert all(a == b for a, b in by_seed.values())


def test_report_statistics():
  s = memoir_report.arm_stats([0.5, 0.7, 0.6])
  assert s.mean == pytest.approx(0.6) and s.ci_low < 0.6 < s.ci_high
  arm = {0: 0.7, 1: 0.8, 2: 0.6, 3: 0.9}
  base = {0: 0.5, 1: 0.8, 2: 0.4, 3: 0.6}
  d = memoir_report.paired_stats(arm, base)
  diffs = [0.2, 0.0, 0.2, 0.3]
  mean = sum(diffs) / 4
  sd = math.sqrt(sum((x - mean) ** 2 for x in diffs) / 3)
  assert d.t == pytest.approx(mean / (sd / 2))
  assert (d.wins, d.ties, d.n, d.df) == (3, 1, 4, 3)
  with pytest.raises(ValueError, match="paired"):
    memoir_report.paired_stats({0: 1.0}, {0: 0.0})
