"""Memoir experiment end to end (tiny), the sweep declaration, the schedule of a short
budget and the per-step recall table of the appendix."""

import dataclasses
import json
import math
import os

import jax.numpy as jnp
import numpy as np
import pytest

from experiments.memoir import experiment as memoir
from experiments.common.evidence.results import read_results
from experiments.common.harness.run_options import RunOptions
from experiments.common.evidence.tensorboard_reader import read_scalars
from launch import registry
from launch.sweep import prepare
from tests import compile_cache


# Runs of one tiny config (a run and its prefix, resumes) rebuild the same jitted steps.
_compile_each_program_once = compile_cache.module_fixture()


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
  # Its own schedule (warm-up and decay over 4 steps) would be another trajectory: the
  # same gradients give other updates.
  params = {"w": jnp.ones(3)}
  grads = {"w": jnp.asarray([0.5, -1.0, 2.0])}

  def updates(config):
    opt = memoir.make_optimizer(config)
    state, out = opt.init(params), []
    for _ in range(4):
      u, state = opt.update(grads, state, params)
      out.append(np.asarray(u["w"]))
    return np.stack(out)

  np.testing.assert_array_equal(updates(short), updates(long))
  assert not np.array_equal(updates(dataclasses.replace(short, schedule_steps=0)),
                            updates(long))


def test_schedule_shorter_than_the_run_raises():
  with pytest.raises(ValueError, match="schedule_steps=4 is shorter than num_steps=8"):
    dataclasses.replace(TINY, num_steps=8, schedule_steps=4)


def test_no_write_arm_runs_and_writes_nothing(tmp_path):
  config = dataclasses.replace(TINY, mode="no_write", num_steps=4, eval_every=2)
  summary = memoir.train_and_evaluate(config, RunOptions(workdir=str(tmp_path / "nw")))
  assert summary["completed"]
  assert read_scalars(str(tmp_path / "nw"))["eval/memory_drift"][-1][1] == 0.0


def test_recall_by_step_table_from_planted_curves(tmp_path):
  from experiments.common.evidence.tensorboard_writer import MetricWriter
  from experiments.memoir import appendix
  from launch.manifest import expand, write_manifest
  short = registry.get("memoir")
  sweep = dataclasses.replace(short, seeds=(0, 1, 2),
                              base=dataclasses.replace(short.base, num_steps=80))
  runs = expand(sweep, str(tmp_path))
  write_manifest(sweep, runs, str(tmp_path))
  lead = {"coupled": 0.0, "read_only": 0.1, "no_write": -0.05}
  for r in runs:
    if r.seed == 2 and r.arm == "no_write":
      continue  # a run that never wrote events: left out of its arm and of its pairs
    writer = MetricWriter(r.workdir)
    for step in (0, 40, 80):
      writer.write_scalars(step, {"eval/recall": 0.1 * r.seed + step / 100
                                  + (lead[r.arm] if step else 0.0)})
    writer.close()
  lines = appendix.recall_by_step_section(str(tmp_path))
  rows = {int(l.split("|")[1]): [c.strip() for c in l.split("|")[2:-1]]
          for l in lines if l.startswith("| 40") or l.startswith("| 80")}
  # coupled mean at 40: 0.4 + mean(0, 0.1, 0.2); read_only +0.1 on every seed
  assert rows[40][:2] == ["0.5000", "0.6000"]
  assert rows[40][2] == "0.4000"  # no_write: seeds 0 and 1 only (0.35, 0.45)
  assert rows[80][3] == "+0.1000 [+0.1000, +0.1000], 3/3"
  assert rows[80][4].startswith("-0.0500") and rows[80][4].endswith("0/2")
