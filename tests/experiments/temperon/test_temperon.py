"""End-to-end smoke test of experiments.temperon: what it writes, exact resume, the sweep."""

import dataclasses
import json
import math
import os

import pytest

from experiments.temperon import experiment as temperon
from experiments.common.results import read_results
from experiments.common.run_options import RunOptions
from experiments.common.tensorboard_reader import read_hparams_session, read_scalars
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

  # stop before the switch, resume across it: the same trajectory
  _run(tmp_path / "split", stop_at_step=6)
  resumed = _run(tmp_path / "split", resume=True)
  assert resumed["completed"] and resumed["resumed_from_step"] == 6
  a = read_scalars(str(wd))["train/loss"]
  b = read_scalars(str(tmp_path / "split"))["train/loss"]
  assert dict(a) == pytest.approx(dict(b), rel=1e-6)


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


def test_sweep_declares_arms_and_ablations():
  sweep = registry.get("temperon")
  names = {a.name for a in sweep.arms}
  assert {"temperon", "sgd", "sgd_sam", "sam_muon", "abl_sgd_refiner", "abl_single_cosine",
          "abl_handoff_0.25", "abl_handoff_0.6"} <= names
  assert sweep.baseline == "temperon" and len(sweep.seeds) >= 3
