"""Memoir experiment end to end (tiny), the sweep declaration and the report statistics."""

import dataclasses
import json
import math
import os

import pytest

from experiments.memoir import experiment as memoir
from experiments.common.results import read_results
from experiments.common.run_options import RunOptions
from experiments.common.tensorboard_reader import read_scalars
from launch import registry
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
  assert [s for s, _ in scalars["train/energy_margin"]] == [3, 6, 9, 12]  # log_every
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
  short = registry.get("memoir")
  # The short budget stops the long run's schedule early (sweep docstring).
  assert short.base.num_steps == 400 and short.base.schedule_steps == 960
  assert len(short.seeds) == 12
  assert [a.name for a in short.arms] == ["coupled", "read_only", "no_write"]
  assert short.metrics[0] == "eval/recall" and "train/energy_margin" in short.curves
  assert short.claims and not set(short.seeds) & set(short.calibration_seeds)
  long = registry.get("memoir_long")
  assert long.base.num_steps == 960 and long.claims
  # The long budget is the short sweep at 960 steps (evaluated every 80).
  _, via_cli = prepare(short, str(tmp_path),
                       ["num_steps=960", "schedule_steps=0", "eval_every=80"],
                       list(long.seeds))
  _, direct = prepare(long, str(tmp_path), [])
  assert [r.run_name for r in via_cli] == [r.run_name for r in direct]
  # Arms differ only in the mode (and no_write's wider core): same data, optimizer,
  # schedule and seeds.
  by_seed = {}
  for r in direct:
    by_seed.setdefault(r.seed, []).append(
        {k: v for k, v in r.config.items() if k not in ("mode", "d_hidden")})
  assert all(a == b == c for a, b, c in by_seed.values())


def test_a_budget_that_stops_the_schedule_early_is_the_longer_runs_prefix(tmp_path):
  long = dataclasses.replace(TINY, num_steps=8, eval_every=4, log_every=1,
                             checkpoint_every=0)
  short = dataclasses.replace(long, num_steps=4, schedule_steps=8)
  memoir.train_and_evaluate(long, RunOptions(workdir=str(tmp_path / "long")))
  memoir.train_and_evaluate(short, RunOptions(workdir=str(tmp_path / "short")))
  a, b = read_scalars(str(tmp_path / "long")), read_scalars(str(tmp_path / "short"))
  for tag in ("train/loss", "eval/recall", "eval/energy_margin"):
    assert b[tag] == [(s, v) for s, v in a[tag] if s <= 4], tag
  # Its own schedule (warm-up and decay over 4 steps) is another trajectory.
  own = dataclasses.replace(short, schedule_steps=0)
  memoir.train_and_evaluate(own, RunOptions(workdir=str(tmp_path / "own")))
  assert read_scalars(str(tmp_path / "own"))["train/loss"][1:] != b["train/loss"][1:]


def test_schedule_shorter_than_the_run_raises():
  with pytest.raises(ValueError, match="schedule_steps=4 is shorter than num_steps=8"):
    dataclasses.replace(TINY, num_steps=8, schedule_steps=4)


def test_no_write_arm_runs_and_writes_nothing(tmp_path):
  config = dataclasses.replace(TINY, mode="no_write", num_steps=4, eval_every=2)
  summary = memoir.train_and_evaluate(config, RunOptions(workdir=str(tmp_path / "nw")))
  assert summary["completed"]
  assert read_scalars(str(tmp_path / "nw"))["eval/memory_drift"][-1][1] == 0.0
