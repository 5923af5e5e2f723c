"""A sweep's TensorBoard views (launch.tensorboard_views) from synthetic sweeps."""

import os
import subprocess
import sys

import numpy as np
from scipy import stats
from tensorboard.backend.event_processing.event_file_loader import RawEventFileLoader
from tensorboard.compat.proto.event_pb2 import Event
from tensorboard.plugins.custom_scalar import layout_pb2
from tensorboard.plugins.hparams import metadata as hparams_metadata
from tensorboard.plugins.hparams import plugin_data_pb2
from tensorboard.plugins.hparams import summary_v2 as hparams_summary
from tensorboard.summary.writer.event_file_writer import EventFileWriter

from experiments.common.evidence.results import append_result
from experiments.common.evidence.tensorboard_reader import (event_files, read_hparams_experiment,
                                                            read_hparams_session, read_scalars)
from experiments.common.evidence.tensorboard_writer import MetricWriter
from experiments.common.harness.repo_paths import REPO_DIR
from experiments.common.sweeps.sweep_spec import Arm, Sweep
from experiments.lm.experiment import LMConfig
from launch import tensorboard_views
from launch.manifest import expand, write_manifest
from launch.sweep import write_tensorboard_experiment


def _sweep(tmp_path, seeds=(0, 1, 2)):
  """2 arms x ``seeds``: train/loss at steps 1-20, eval/loss at 5, 10, ..., 20."""
  sweep = Sweep("toy", "experiments.lm", LMConfig(), (Arm("base", {"recipe": "fp32"}),
                                                      Arm("low", {"recipe": "bf16"})),
                seeds=seeds, baseline="base", metrics=("eval/loss",))
  runs = expand(sweep, str(tmp_path))
  write_manifest(sweep, runs, str(tmp_path))
  rng = np.random.default_rng(0)
  for r in runs:
    w = MetricWriter(r.workdir)
    w.write_hparams(r.config, trial_id=r.run_name)
    for step in range(1, 21):
      w.write_scalars(step, {"train/loss": 2.0 / step + rng.normal(0, 0.1)})
      if step % 5 == 0:
        w.write_scalars(step, {"eval/loss": 1.0 / step + rng.normal(0, 0.1)})
    w.close()
    append_result(r.results_file, {"run_name": r.run_name,
                                   "metrics": {"eval/loss": read_scalars(r.workdir)
                                               ["eval/loss"][-1][1]}})
  return sweep, runs


def test_arm_view_is_the_mean_and_t_interval_of_the_seeds(tmp_path):
  sweep, runs = _sweep(tmp_path)
  root = tensorboard_views.write_arm_view(str(tmp_path))
  assert sorted(os.listdir(root)) == ["base", "low"] and not event_files(root)
  for arm in ("base", "low"):
    seeds = [read_scalars(r.workdir) for r in runs if r.arm == arm]
    view = read_scalars(os.path.join(root, arm))
    for tag, steps in (("train/loss", range(1, 21)), ("eval/loss", range(5, 21, 5))):
      x = np.array([[v for _, v in s[tag]] for s in seeds], np.float64)  # seed x step
      mean = x.mean(axis=0)
      half = stats.t.ppf(0.975, 2) * x.std(axis=0, ddof=1) / np.sqrt(3)
      assert [s for s, _ in view[tag]] == list(steps)
      np.testing.assert_array_equal([v for _, v in view[tag]], np.float32(mean))
      np.testing.assert_allclose([v for _, v in view[tag + "/ci95_lo"]], mean - half,
                                 rtol=1e-6)
      np.testing.assert_allclose([v for _, v in view[tag + "/ci95_hi"]], mean + half,
                                 rtol=1e-6)
    session = read_hparams_session(os.path.join(root, arm))
    assert session["trial_id"] == arm and session["status"] == "STATUS_SUCCESS"
    assert session["hparams"]["arm"] == arm and session["hparams"]["runs"] == "3"
  # The Custom Scalars layout: a margin chart per curve; no empty metrics category
  # (every metric here is a curve).
  layouts = [value.tensor.string_val[0] for path in event_files(os.path.join(root, "base"))
             for record in RawEventFileLoader(path).Load()
             for value in Event.FromString(record).summary.value
             if value.tag == "custom_scalars__config__"]
  layout = layout_pb2.Layout.FromString(layouts[0])
  assert [c.title for c in layout.category] == ["curves: mean over seeds, 95% band"]
  assert [(s.value, s.lower, s.upper) for c in layout.category[0].chart
          for s in c.margin.series] == [
              (t, t + "/ci95_lo", t + "/ci95_hi") for t in ("train/loss", "eval/loss")]
  exp = read_hparams_experiment(os.path.join(root, "base"))
  assert exp["hparams"]["arm"] == ["base", "low"]
  assert exp["hparams"]["recipe"] == ["fp32", "bf16"]
  assert exp["metrics"] == ["eval/loss", "eval/loss/ci95_lo", "eval/loss/ci95_hi"]


def test_arm_view_thins_long_curves_keeping_the_last_step():
  assert tensorboard_views.kept_steps(list(range(10)), 4) == [0, 3, 6, 9]
  kept = tensorboard_views.kept_steps(list(range(1, 1001)))
  assert len(kept) == tensorboard_views.MAX_POINTS and kept[0] == 1 and kept[-1] == 1000


def _view_bytes(root):
  return {os.path.relpath(os.path.join(d, f), root): open(os.path.join(d, f), "rb").read()
          for d, _, files in os.walk(root) for f in files}


def test_arm_view_bytes_are_the_same_in_another_process(tmp_path):
  """Before: a session's hparams (a protobuf map) serialized in an order that varied
  with the process's hash seed, so two rebuilds wrote different bytes."""
  _sweep(tmp_path)
  root = tensorboard_views.write_arm_view(str(tmp_path))
  first = _view_bytes(root)
  code = ("import sys; from launch import tensorboard_views as v; "
          "v.write_arm_view(sys.argv[1])")
  for seed in ("1",):
    subprocess.run([sys.executable, "-c", code, str(tmp_path)], check=True, cwd=REPO_DIR,
                   env={**os.environ, "PYTHONHASHSEED": seed})
    assert _view_bytes(root) == first


def test_sequential_looks_leave_one_summary_over_every_run(tmp_path):
  """Before: each look wrote another summary at the top of runs/ (a run named ``.``),
  and TensorBoard used the first, so the seed filter offered only look 1's seeds."""
  sweep = Sweep("toy", "experiments.lm", LMConfig(), (Arm("base", {"recipe": "fp32"}),
                                                      Arm("low", {"recipe": "bf16"})),
                seeds=(201, 202, 203, 204), baseline="base", metrics=("eval/loss",))
  runs = expand(sweep, str(tmp_path))
  look1 = [r for r in runs if r.seed in (201, 202)]
  write_tensorboard_experiment(sweep, look1, str(tmp_path))
  write_tensorboard_experiment(sweep, look1 + [r for r in runs if r not in look1],
                               str(tmp_path))
  assert not event_files(str(tmp_path / "runs"))  # no `.` run
  first = os.path.join(tmp_path, "runs", look1[0].run_name)
  assert [os.path.basename(p) for p in event_files(first)] == [
      tensorboard_views.EXPERIMENT_FILE]
  exp = read_hparams_experiment(first)
  assert exp["hparams"]["seed"] == ["201", "202", "203", "204"]  # ints as integers
  assert exp["hparams"]["recipe"] == ["fp32", "bf16"]


def _sessions(path):
  """The hparams of every session start in the event file ``path``."""
  out = []
  for record in RawEventFileLoader(path).Load():
    for value in Event.FromString(record).summary.value:
      if value.tag == hparams_metadata.SESSION_START_INFO_TAG:
        out.append(plugin_data_pb2.HParamsPluginData.FromString(
            value.metadata.plugin_data.content).session_start_info.hparams)
  return out


def test_mend_moves_an_old_summary_and_shows_integers_as_integers(tmp_path):
  """A sweep written before: its summary at the top of runs/, its sessions' ints as
  numbers (the table showed 201.00). Mending twice changes nothing more."""
  sweep, runs = _sweep(tmp_path, seeds=(201, 202))
  old = EventFileWriter(str(tmp_path / "runs"))
  old.add_event(Event(step=0, summary=hparams_summary.hparams_config_pb(
      [hparams_summary.HParam("seed", hparams_summary.Discrete([201.0]))],
      [hparams_summary.Metric("eval/loss")])))
  old.close()
  legacy = EventFileWriter(runs[0].workdir)  # an old session: the seed as a number
  legacy.add_event(Event(step=0, summary=hparams_summary.hparams_pb(
      {"seed": 201, "recipe": "fp32"}, trial_id="legacy")))
  legacy.close()
  tensorboard_views.mend_runs(str(tmp_path))
  assert not event_files(str(tmp_path / "runs"))
  exp = read_hparams_experiment(runs[0].workdir)
  assert exp["hparams"]["seed"] == ["201", "202"]
  sessions = {p: _sessions(p) for r in runs for p in event_files(r.workdir)}
  assert sum(len(s) for s in sessions.values()) == len(runs) + 1  # the legacy one too
  for r in runs:
    for path in event_files(r.workdir):
      for session in sessions[path]:
        assert session["seed"].string_value == str(r.seed)
  mended = {p: open(p, "rb").read() for r in runs for p in event_files(r.workdir)}
  tensorboard_views.mend_runs(str(tmp_path))
  assert {p: open(p, "rb").read() for p in mended} == mended
