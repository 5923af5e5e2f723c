"""A run's records survive damage: its results row, its config record, its commits.

Each fault was reproduced on main at 0b0974a (issue 35); the docstrings say what
happened then. Tiny LM runs (:mod:`tests.experiments.common.tiny_lm`); one completed
run is trained once and copied into each test that needs it.
"""

import dataclasses
import json
import logging
import os
import shutil
import subprocess

import pytest

from experiments.common.evidence.results_file import append_result, read_results
from experiments.common.harness import run_metadata
from experiments.common.harness import workdir as workdir_lib
from experiments.common.harness.checkpoint import Checkpointer
from experiments.common.harness.repo_paths import REPO_DIR
from tests.experiments.common.tiny_lm import TINY, cli, run


@pytest.fixture(scope="module")
def completed(tmp_path_factory):
  """A completed tiny run (its directory, holding its own results.jsonl) and its row."""
  wd = tmp_path_factory.mktemp("completed") / "run"
  run(wd)
  [row] = read_results(str(wd / "results.jsonl"))
  return wd, row


@pytest.fixture(scope="module")
def stopped(tmp_path_factory):
  """A tiny run stopped after its checkpoint at step 4 (as if preempted)."""
  wd = tmp_path_factory.mktemp("stopped") / "run"
  run(wd, stop_at_step=4)
  return wd


def _copy(source, tmp_path):
  wd = tmp_path / "run"
  shutil.copytree(source, wd, ignore=shutil.ignore_patterns(".lock"))
  return wd


def _files(wd):
  return sorted(os.path.relpath(os.path.join(d, f), wd) for d, _, fs in os.walk(wd)
                for f in fs if f != ".lock")


# ------------------------------------------------------------------ the results file


def test_a_row_appended_after_a_partial_line_starts_a_line_of_its_own(tmp_path, caplog):
  """Before: a row appended to a file whose last line was cut (a crash mid-append) was
  glued onto it, so both rows were lost."""
  path = str(tmp_path / "results.jsonl")
  append_result(path, {"run_name": "a"})
  with open(path, "a") as f:
    f.write('{"run_name": "b", "metr')  # a write cut short: no newline
  with caplog.at_level(logging.WARNING):
    append_result(path, {"run_name": "c"})
  assert "ended in a partial line" in caplog.text
  problems = []
  assert [r["run_name"] for r in read_results(path, problems)] == ["a", "c"]
  assert len(problems) == 1 and problems[0].startswith(f"{path}:2: not a results row")


def test_a_completed_runs_damaged_or_missing_row_is_restored_without_training(
    completed, tmp_path):
  """Before: the rerun said "holds a completed run ... nothing was written" and exited
  0, so a sweep stayed a run short for good."""
  wd, row = _copy(completed[0], tmp_path), completed[1]
  results = wd / "results.jsonl"
  files = _files(wd)
  line = results.read_text()
  results.write_text(line[:len(line) // 2])  # the row cut mid-line
  with pytest.raises(workdir_lib.RunAlreadyCompleted, match="restored from COMPLETED.json"):
    run(wd)
  problems = []
  assert read_results(str(results), problems) == [row] and len(problems) == 1
  assert _files(wd) == files  # nothing trained: no new checkpoint or event file
  results.unlink()  # the row missing altogether (the CLI: exit 0, says so)
  out = subprocess.run(cli(wd, "--resume"), capture_output=True, text=True, timeout=300,
                       cwd=REPO_DIR)
  assert out.returncode == 0, out.stderr[-2000:]
  assert "is restored from COMPLETED.json" in out.stdout
  assert read_results(str(results)) == [row]
  with pytest.raises(workdir_lib.RunAlreadyCompleted, match="nothing was written"):
    run(wd, resume=True)  # present now: left as it is
  assert read_results(str(results)) == [row]


def test_a_run_completed_before_rows_were_kept_gets_its_row_from_its_events(
    completed, tmp_path):
  wd, row = _copy(completed[0], tmp_path), completed[1]
  record = json.loads((wd / "COMPLETED.json").read_text())
  del record["row"]
  (wd / "COMPLETED.json").write_text(json.dumps(record))
  (wd / "results.jsonl").unlink()
  with pytest.raises(workdir_lib.RunAlreadyCompleted, match="restored from events at step 8"):
    run(wd)
  [restored] = read_results(str(wd / "results.jsonl"))
  assert restored["config"] == row["config"] and restored["step"] == 8
  for name, value in row["metrics"].items():  # every metric of the run, at its value
    assert restored["metrics"][name] == pytest.approx(value, rel=1e-6), name
  (wd / "config.json").unlink()  # nothing left to restore it from: refused, one line
  (wd / "results.jsonl").unlink()
  with pytest.raises(workdir_lib.RunRefused, match="cannot be restored"):
    run(wd)


# ---------------------------------------------------------------- the config record


def test_a_changed_config_against_a_completed_run_is_refused_in_one_line(completed,
                                                                          tmp_path):
  """Before: rerunning (or --resume) with another learning rate in a completed run's
  directory printed "nothing was written" and exited 0, as if that config had run."""
  wd = _copy(completed[0], tmp_path)
  changed = dataclasses.replace(TINY, learning_rate=0.5)
  with pytest.raises(workdir_lib.RunRefused, match="learning_rate: recorded 0.003, now 0.5"):
    run(wd, config=changed, resume=True)
  out = subprocess.run(cli(wd, config=changed), capture_output=True, text=True,
                       timeout=300, cwd=REPO_DIR)
  assert out.returncode == 2, out.stderr[-2000:]
  assert "Traceback" not in out.stderr
  assert [l for l in out.stderr.splitlines() if l.startswith("error:")] == [
      l for l in out.stderr.splitlines() if "completed run whose config" in l]
  with pytest.raises(workdir_lib.RunAlreadyCompleted):  # the same config: done, exit 0
    run(wd)


def test_a_resume_is_checked_against_the_config_its_checkpoints_carry(stopped, tmp_path):
  """Before: with config.json deleted, ``--resume --learning_rate=0.5`` resumed with the
  new rate and rewrote config.json to say 0.5 for the whole run."""
  wd = _copy(stopped, tmp_path)
  (wd / "config.json").unlink()
  out = subprocess.run(cli(wd, "--resume", "--learning_rate=0.5"), capture_output=True,
                       text=True, timeout=300, cwd=REPO_DIR)
  assert out.returncode == 2, out.stderr[-2000:]
  assert "Traceback" not in out.stderr
  assert ("the config recorded in the checkpoints differs from this one in "
          "learning_rate: recorded 0.003, now 0.5") in out.stderr
  assert not (wd / "config.json").exists()
  assert Checkpointer(str(wd / "checkpoints")).all_steps() == [4]
  assert run(wd, resume=True)["completed"]  # the run's own config resumes
  assert run_metadata.read_record(str(wd))["config"]["learning_rate"] == 0.003


def test_a_resume_with_no_record_of_its_config_is_refused(stopped, tmp_path):
  wd = _copy(stopped, tmp_path)
  # Checkpoints written before they carried their config, and config.json gone.
  meta = wd / "checkpoints" / "4" / "meta" / "metadata"
  record = json.loads(meta.read_text())
  del record["config"]
  meta.write_text(json.dumps(record))
  (wd / "config.json").unlink()
  with pytest.raises(workdir_lib.RunRefused, match="no record of the config"):
    run(wd, resume=True)


# ------------------------------------------------------------------------- commits


def test_a_resume_from_another_commit_warns_and_both_are_recorded(stopped, tmp_path,
                                                                  monkeypatch, caplog):
  """Before: a commit between the kill and ``--resume`` (one that changed a recipe
  default, say) resumed silently; config.json and the row named only the new commit."""
  wd = _copy(stopped, tmp_path)
  old = run_metadata.read_record(str(wd))["git"]  # the commit the first 4 steps ran from
  new = {"commit": "b" * 40, "dirty": False}
  monkeypatch.setattr(run_metadata, "git_state", lambda *a: dict(new))
  with caplog.at_level(logging.WARNING):
    summary = run(wd, resume=True)
  assert "the run now spans commits" in caplog.text and "b" * 40 in caplog.text
  [row] = read_results(str(wd / "results.jsonl"))
  assert row["git"] == new
  assert row["git_segments"] == [{"step": 0, **old}, {"step": 4, **new}]
  assert summary["git_segments"] == row["git_segments"]
  assert run_metadata.read_record(str(wd))["earlier_git"] == [old]


def test_the_report_names_runs_that_span_commits(tmp_path):
  from experiments.common.sweeps.sweep_spec import Arm, Sweep  # pylint: disable=import-outside-toplevel
  from launch.manifest import expand, write_manifest  # pylint: disable=import-outside-toplevel
  from launch.report import build_report  # pylint: disable=import-outside-toplevel
  sweep = Sweep("toy", "experiments.lm", TINY, (Arm("a", {"recipe": "fp32"}),),
                seeds=(0, 1), baseline="a", metrics=("eval/loss",), curves=())
  runs = expand(sweep, str(tmp_path))
  write_manifest(sweep, runs, str(tmp_path))
  git = run_metadata.git_state()
  for r, segments in zip(runs, ([{"step": 0, **git}],
                                [{"step": 0, "commit": "a" * 40, "dirty": False},
                                 {"step": 4, "commit": "a" * 40, "dirty": False},
                                 {"step": 6, **git}])):
    append_result(r.results_file, {"run_name": r.run_name, "metrics": {"eval/loss": 1.0},
                                   "git": git, "git_segments": segments})
  text = open(build_report(str(tmp_path))).read()
  assert (f"- **1 run(s) span commits** (resumed from other code than their earlier steps "
          f"ran): `{runs[1].run_name}` (steps 0-: `aaaaaaaaaaaa`, steps 6-: "
          f"`{git['commit'][:12]}`") in text
  assert runs[0].run_name not in text.split("span commits")[1].split("\n")[0]


def test_the_row_of_a_dataclass_config_stays_comparable_on_resume():
  """The checkpoints' config record is JSON (tuples read back as lists); a config
  compares equal to its own record."""
  config = dataclasses.replace(TINY, seed=3)
  record = json.loads(json.dumps(run_metadata.config_record(config)))
  assert run_metadata.differences(record, config) == []
  assert run_metadata.differences(record, TINY) == ["seed: recorded 3, now 0"]
