"""End-to-end smoke test of experiments.temperon: what it writes, exact resume, the sweep."""

import dataclasses
import json
import math
import os

import pytest

from experiments.temperon import experiment as temperon
from experiments.common.evidence.results import read_results
from experiments.common.harness.run_options import RunOptions
from experiments.common.evidence.tensorboard_reader import read_hparams_session, read_scalars
from launch import registry

TINY = temperon.TemperonConfig(num_steps=16, batch_size=32, train_examples=256, width=4,
                               num_stages=1,
                               eval_every=4, log_every=2, warmup_steps=2, rewarmup_steps=2,
                               rho_ramp_steps=3, handoff_fraction=0.5, targets="0.1,1.0")


def _run(workdir, config=TINY, **options):
  return temperon.train_and_evaluate(config, RunOptions(workdir=str(workdir), **options))


def test_smoke_writes_events_results_and_resumes_exactly(tmp_path):
  full = _run(tmp_path / "full")
  wd = tmp_path / "full"
  assert full["completed"] and full["step"] == 16
  scalars = read_scalars(str(wd))
  assert [s for s, _ in scalars["eval/accuracy"]] == [0, 4, 8, 12, 16]
  phase = dict(scalars["train/phase"])
  assert phase[8] == 0.0 and phase[10] == 1.0  # switch at step 8 (0-based: 9th update)
  assert "perf/step_s" in scalars
  assert scalars["train/loss"][-1][1] < scalars["train/loss"][0][1]
  session = read_hparams_session(str(wd))
  assert session["status"] == "STATUS_SUCCESS" and session["hparams"]["refiner"] == "muon_sam"
  assert json.load(open(wd / "config.json"))["config"] == dataclasses.asdict(TINY)
  assert "16" in os.listdir(wd / "checkpoints")
  row = read_results(str(wd / "results.jsonl"))[0]["metrics"]
  assert row["cost/grad_evals_per_step"] == pytest.approx(1.5)  # 8 SGD + 8 SAM steps
  assert row["reached/0.1"] == 1.0 and math.isfinite(row["time_to/0.1"])
  assert row["steps_to/0.1"] in (4.0, 8.0, 12.0, 16.0)
  assert row["reached/1"] == 0.0 and row["steps_to/1"] is None  # never: NaN, null in JSON
  assert row["cost/phase1_s_per_step"] > 0 and row["cost/phase0_s_per_step"] > 0
  assert [s for s, _ in scalars["train/loss"]] == list(range(2, 17, 2))  # every log_every

  # stop before the switch, resume across it: the same trajectory
  _run(tmp_path / "split", stop_at_step=6)
  resumed = _run(tmp_path / "split", resume=True)
  assert resumed["completed"] and resumed["resumed_from_step"] == 6
  a = read_scalars(str(wd))["train/loss"]
  b = read_scalars(str(tmp_path / "split"))["train/loss"]
  assert dict(a) == pytest.approx(dict(b), rel=1e-6)


def test_log_every_zero_logs_train_metrics_at_the_end_only(tmp_path):
  """--log_every=0 (its declared domain starts at 0) divided by zero after training."""
  config = dataclasses.replace(TINY, num_steps=4, eval_every=2, log_every=0,
                               warmup_steps=1, rewarmup_steps=1, rho_ramp_steps=1)
  assert _run(tmp_path / "quiet", config)["completed"]
  scalars = read_scalars(str(tmp_path / "quiet"))
  assert [s for s, _ in scalars["train/loss"]] == [4]
  assert "perf/step_s" not in scalars


def test_late_and_periodic_sam_runs_count_their_sam_steps(tmp_path):
  for steps, evals in (("late", 16 + 8), ("periodic", 16 + 8)):
    config = dataclasses.replace(TINY, explorer="muon_sam", refiner="none", sam_steps=steps)
    row = _run(tmp_path / steps, config)
    assert row["completed"]
    metrics = read_results(str(tmp_path / steps / "results.jsonl"))[0]["metrics"]
    assert metrics["cost/grad_evals_per_step"] == pytest.approx(evals / 16)


def test_task_data_label_noise_and_test_set():
  config = dataclasses.replace(TINY, train_examples=100, test_set="rest", label_noise=0.2)
  train_x, train_y, test_x, test_y = temperon.task_data(config)
  assert train_x.shape[0] == 100 and test_x.shape[0] == 1797 - 100
  clean = temperon.task_data(dataclasses.replace(config, label_noise=0.0))
  assert (train_y != clean[1]).sum() == 20  # exactly 20% relabelled, to another class
  assert (temperon.task_data(dataclasses.replace(config, seed=1))[1] != train_y).any()
  assert temperon.task_data(dataclasses.replace(TINY, train_examples=100))[2].shape[0] == 359


def test_config_validation_and_grad_evals():
  with pytest.raises(ValueError, match="handoff_fraction must be in"):
    dataclasses.replace(TINY, handoff_fraction=0.0)
  with pytest.raises(ValueError, match="empty phase"):
    dataclasses.replace(TINY, handoff_fraction=0.01)
  with pytest.raises(ValueError, match="targets"):
    dataclasses.replace(TINY, targets="1.5")
  c = dataclasses.replace(TINY, explorer="sgd_sam", refiner="none")
  assert c.switch_step() == 16 and c.grad_evals(15) == 2
  assert TINY.grad_evals(7) == 1 and TINY.grad_evals(8) == 2
  late = dataclasses.replace(c, sam_steps="late")
  assert [late.grad_evals(s) for s in (7, 8)] == [1, 2]
  periodic = dataclasses.replace(c, sam_steps="periodic", handoff_fraction=0.75)
  assert [periodic.grad_evals(s) for s in range(8)] == [1, 1, 1, 2] * 2
  with pytest.raises(ValueError, match="one-phase SAM"):
    dataclasses.replace(TINY, sam_steps="late")


def test_sweep_declares_arms_and_ablations():
  sweep = registry.get("temperon")
  names = {a.name for a in sweep.arms}
  assert {"temperon", "sgd", "sgd_sam", "sam_muon", "late_sam", "periodic_sam",
          "abl_sgd_refiner"} <= names
  assert sweep.baseline == "temperon" and len(sweep.seeds) >= 12
  assert not set(sweep.seeds) & set(sweep.calibration_seeds) and sweep.claims
  # late-phase and periodic SAM spend the handoff's SAM-step budget
  budgets = {}
  for arm in sweep.arms:
    config = dataclasses.replace(sweep.base, **arm.overrides)
    budgets[arm.name] = sum(config.grad_evals(s) - 1 for s in range(config.num_steps))
  assert budgets["late_sam"] == budgets["periodic_sam"] == budgets["temperon"] == 342
