"""launch.thin_events: what a thinned event file keeps, by hand."""

import os

import pytest

from experiments.common.evidence.tensorboard_reader import read_hparams_session, read_scalars
from experiments.common.evidence.tensorboard_writer import MetricWriter
from launch.thin_events import thin_event_file, thin_sweep


def _write(logdir):
  writer = MetricWriter(logdir)
  writer.write_hparams({"lr": 0.1}, trial_id="t")
  for step in range(1, 9):
    writer.write_scalars(step, {"train/reward": step / 10, "train/loss": -step,
                                "accuracy/min": 0.5})
  writer.write_scalars(8, {"eval/acc": 0.9})
  writer.close()
  [name] = [f for f in os.listdir(logdir) if f.startswith("events")]
  return os.path.join(logdir, name)


def test_thinning_keeps_the_named_tags_at_the_kept_steps(tmp_path):
  path = _write(str(tmp_path / "run"))
  before, after = thin_event_file(path, ["train/reward", "eval/acc"], ["accuracy/"],
                                  every=4)
  assert after < before
  scalars = read_scalars(str(tmp_path / "run"))
  assert scalars["train/reward"] == [(4, pytest.approx(0.4)), (8, pytest.approx(0.8))]
  assert scalars["accuracy/min"] == [(4, 0.5), (8, 0.5)]
  assert scalars["eval/acc"] == [(8, pytest.approx(0.9))]
  assert "train/loss" not in scalars
  assert read_hparams_session(str(tmp_path / "run"))["hparams"]["lr"] == 0.1


def test_thin_sweep_covers_every_run_and_refuses_to_keep_nothing(tmp_path):
  paths = [_write(str(tmp_path / "runs" / name)) for name in ("a", "b")]
  sizes = sum(os.path.getsize(p) for p in paths)
  before, after = thin_sweep(str(tmp_path), ["train/reward"])
  assert before == sizes and after == sum(os.path.getsize(p) for p in paths) < before
  for path in paths:
    assert set(read_scalars(os.path.dirname(path))) == {"train/reward"}
  with pytest.raises(ValueError, match="nothing to keep"):
    thin_sweep(str(tmp_path), [])


def test_thin_sweep_refuses_to_drop_a_kept_tag_entirely(tmp_path):
  """Before: fair_cast's lag (logged at steps 17, 33, ...) vanished at --every=16."""
  writer = MetricWriter(str(tmp_path / "runs" / "a"))
  for step in (17, 33, 49):
    writer.write_scalars(step, {"export/lag_steps": 3.0})
  for step in (16, 32, 48):
    writer.write_scalars(step, {"train/reward": 0.5})
  writer.close()
  [path] = [os.path.join(tmp_path, "runs", "a", f)
            for f in os.listdir(tmp_path / "runs" / "a")]
  size = os.path.getsize(path)
  with pytest.raises(ValueError, match=r"\['export/lag_steps'\].*nothing was rewritten"):
    thin_sweep(str(tmp_path), ["train/reward", "export/lag_steps"], every=16)
  assert os.path.getsize(path) == size
  assert read_scalars(str(tmp_path / "runs" / "a"))["export/lag_steps"][0][0] == 17
