"""The TF-free TensorBoard writer, read back with EventAccumulator (size_guidance 0)."""

import logging

import numpy as np
import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from experiments.common.evidence.tensorboard_reader import (event_file_damage, load,
                                                            read_hparams_experiment,
                                                            read_hparams_session, read_histograms,
                                                            read_scalars)
from experiments.common.evidence.tensorboard_writer import (MetricWriter, histogram_proto,
                                                            write_hparams_experiment)


def test_scalars_histograms_hparams_roundtrip(tmp_path):
  w = MetricWriter(str(tmp_path))
  w.write_hparams({"recipe": "bf16", "lr": 0.01, "layers": 2, "flag": True}, trial_id="t0")
  for step in range(1, 301):  # more than the default reservoir keeps for histograms
    w.write_scalars(step, {"train/loss": 1.0 / step, "perf/steps_per_s": 3.0})
  rng = np.random.default_rng(0)
  for step in (100, 200, 300):
    w.write_histograms(step, {"params/w": rng.standard_normal(1000)})
  w.write_hparams_end(300, completed=True)
  w.close()

  scalars = read_scalars(str(tmp_path))
  assert [s for s, _ in scalars["train/loss"]] == list(range(1, 301))
  np.testing.assert_array_equal([v for _, v in scalars["train/loss"]],
                                np.float32(1.0 / np.arange(1, 301)))
  hists = read_histograms(str(tmp_path))
  assert [s for s, _ in hists["params/w"]] == [100, 200, 300]
  assert hists["params/w"][0][1].num == 1000
  session = read_hparams_session(str(tmp_path))
  assert session["trial_id"] == "t0"
  # An int as its digits: the HParams table shows a number as 5 significant digits.
  assert session["hparams"] == {"recipe": "bf16", "lr": 0.01, "layers": "2", "flag": True}
  assert session["status"] == "STATUS_SUCCESS"
  assert "_hparams_/session_start_info" in load(str(tmp_path)).Tags()["tensors"]


def test_stopped_session_and_disabled_writer(tmp_path):
  w = MetricWriter(str(tmp_path / "a"))
  w.write_hparams({"x": 1}, trial_id="a")
  w.write_hparams_end(5, completed=False)
  w.close()
  assert read_hparams_session(str(tmp_path / "a"))["status"] == "STATUS_RUNNING"
  off = MetricWriter(str(tmp_path / "off"), enabled=False)
  off.write_scalars(1, {"x": 1.0})
  off.write_hparams({"x": 1}, trial_id="t")
  off.close()
  assert not (tmp_path / "off").exists()


def test_experiment_summary(tmp_path):
  """Ints are their digits (the table showed seed 201 as ``201.00``), listed in numeric
  order (not "10" before "2"); strings keep the order given (the arms')."""
  write_hparams_experiment(str(tmp_path), {"recipe": ["mxfp8", "bf16"],
                                           "seed": [2, 10, 1], "lr": [0.1, 0.01]},
                           ["eval/loss"])
  exp = read_hparams_experiment(str(tmp_path))
  assert exp["hparams"]["recipe"] == ["mxfp8", "bf16"]
  assert exp["hparams"]["seed"] == ["1", "2", "10"]
  assert exp["hparams"]["lr"] == [0.01, 0.1]
  assert exp["metrics"] == ["eval/loss"]


def test_histogram_proto_edge_cases():
  h = histogram_proto(np.full(10, 3.0))
  assert h.num == 10 and h.min == 3.0 and h.max == 3.0 and sum(h.bucket) == 10
  h = histogram_proto(np.array([np.nan, 1.0, 2.0]))
  assert h.num == 2
  assert histogram_proto(np.array([])).num == 0


def test_hparams_type_checked(tmp_path):
  w = MetricWriter(str(tmp_path))
  with pytest.raises(TypeError, match="bad"):
    w.write_hparams({"bad": [1, 2]}, trial_id="t")
  w.close()


def test_a_damaged_event_file_is_read_past_the_damage_and_named(tmp_path, caplog):
  """Before: TensorBoard's reader stopped at the first record failing its checksum and
  silently dropped every record after it (issue 35)."""
  w = MetricWriter(str(tmp_path))
  for step in range(1, 41):
    w.write_scalars(step, {"train/loss": float(step)})
  w.close()
  [path] = [str(p) for p in tmp_path.iterdir()]
  raw = bytearray(open(path, "rb").read())
  raw[len(raw) // 2] ^= 0xFF  # one byte in the middle of the file
  open(path, "wb").write(bytes(raw))
  plain = EventAccumulator(str(tmp_path), size_guidance={"scalars": 0}).Reload()
  assert len(plain.Scalars("train/loss")) < 25  # TensorBoard's own reader stops there
  problems = []
  steps = [s for s, _ in read_scalars(str(tmp_path), problems)["train/loss"]]
  assert len(steps) == 39 and steps[-1] == 40  # one record lost, none after it
  [damage] = problems
  assert damage.path == path and damage.offset <= len(raw) // 2 < damage.offset + damage.length
  assert f"{path}: bytes {damage.offset}-" in str(damage)
  assert event_file_damage(str(tmp_path)) == [damage]
  with caplog.at_level(logging.WARNING):  # a resumed run adding events beside it says so
    MetricWriter(str(tmp_path)).close()
  assert f"damaged event file in this run's directory: {path}: bytes" in caplog.text


def test_an_event_file_cut_short_is_named(tmp_path):
  w = MetricWriter(str(tmp_path))
  for step in range(1, 11):
    w.write_scalars(step, {"train/loss": float(step)})
  w.close()
  [path] = [str(p) for p in tmp_path.iterdir()]
  raw = open(path, "rb").read()
  open(path, "wb").write(raw[:-7])  # a crash mid-write
  problems = []
  assert len(read_scalars(str(tmp_path), problems)["train/loss"]) == 9
  [damage] = problems
  assert damage.offset + damage.length == len(raw) - 7 and "truncated" in damage.reason


def test_finish_run_logs_every_row_metric_the_writer_has_not(tmp_path):
  """Fair Cast's export/lag_second_half was in results.jsonl only, so its HParams column
  was empty: a completed run now logs each row metric its events lack, at the final
  step, and no metric twice."""
  from experiments.common.evidence.results import finish_run
  from experiments.common.evidence.tensorboard_writer import MetricWriter
  writer = MetricWriter(str(tmp_path / "run"))
  writer.write_scalars(3, {"export/unchanged_step": 0.25, "train/loss": 2.0})
  summary = {"run_name": "run", "metrics": {
      "export/unchanged_step": 0.25, "train/loss": 2.0, "export/lag_second_half": 7.0,
      "steps_to/0.97": 12.0, "bad": float("nan")}}
  finish_run(writer, str(tmp_path / "results.jsonl"), summary, completed=True, step=3)
  scalars = read_scalars(str(tmp_path / "run"))
  assert scalars["export/lag_second_half"] == [(3, 7.0)]
  assert scalars["steps_to/0.97"] == [(3, 12.0)]
  assert scalars["export/unchanged_step"] == [(3, 0.25)] and "bad" not in scalars


def test_resumed_run_scalars_as_tensorboards_accumulator_reads_them(tmp_path):
  """read_scalars decodes the checked records itself (no EventAccumulator, 3-4x faster
  on the committed reports); a resume's SessionLog.START must still drop what an
  earlier process logged at that step or later, in this file and in earlier ones, as
  TensorBoard's accumulator does; the HParams session survives the purge."""
  first = MetricWriter(str(tmp_path))
  first.write_hparams({"recipe": "bf16"}, trial_id="t0")
  for step in range(1, 11):
    first.write_scalars(step, {"loss": float(step), "only_first": 1.0})
  first.close()
  second = MetricWriter(str(tmp_path))  # a second event file, as a resumed process writes
  second.mark_restart(6)
  for step in range(6, 9):
    second.write_scalars(step, {"loss": 100.0 + step})
  second.write_hparams_end(8, completed=True)
  second.close()

  scalars = read_scalars(str(tmp_path))
  assert scalars["loss"] == [(s, float(s)) for s in range(1, 6)] + [
      (s, 100.0 + s) for s in range(6, 9)]
  assert scalars["only_first"] == [(s, 1.0) for s in range(1, 6)]
  acc = EventAccumulator(str(tmp_path), size_guidance={"scalars": 0})
  acc.Reload()
  assert {tag: [(e.step, e.value) for e in acc.Scalars(tag)]
          for tag in acc.Tags()["scalars"]} == scalars
  session = read_hparams_session(str(tmp_path))
  assert (session["trial_id"], session["status"]) == ("t0", "STATUS_SUCCESS")
