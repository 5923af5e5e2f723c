"""The SLURM runner on a real cluster, with stand-in runs: requeue, resubmit, failure.

Needs a SLURM cluster (CI starts one on localhost; see ``launch/local_slurm.py``).
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time

import pytest

from experiments.common.harness.repo_paths import REPO_DIR
from launch.manifest import RunSpec
from launch.slurm import SlurmOptions
from launch.slurm_runner import run_slurm
from tests.launch.slurm_tools import read_text, scancel_briefly, wait_until

pytestmark = pytest.mark.slurm

FAKE = os.path.join("tests", "launch", "fake_slurm_run.py")


def _runs(sweep_dir, modes):
  results = os.path.join(sweep_dir, "results.jsonl")
  runs = []
  for i, mode in enumerate(modes):
    name = f"{mode}-{i}"
    workdir = os.path.join(sweep_dir, "runs", name)
    runs.append(RunSpec(i, name, mode, 0, workdir, results, {}, (
        "python", FAKE, f"--mode={mode}", f"--workdir={workdir}", f"--run_name={name}",
        f"--results_file={results}")))
  return runs


def _in_background(fn):
  """Runs ``fn()`` in a thread; returns (thread, dict holding its result or error)."""
  box = {}

  def target():
    try:
      box["result"] = fn()
    except BaseException as e:  # pylint: disable=broad-except
      box["error"] = e

  thread = threading.Thread(target=target, daemon=True)
  thread.start()
  return thread, box


def _wait_for(path):
  """The content of ``path`` once it exists (the run then sleeps, waiting for SIGTERM)."""
  text = wait_until(lambda: read_text(path).strip(), f"{path} to appear", poll_s=0.2)
  time.sleep(0.2)  # written just before the run's sleep: let it get there
  return text


def _attempts(run):
  with open(os.path.join(run.workdir, "attempts")) as f:
    return [json.loads(line) for line in f]


def _finish(thread, box, job_name, env):
  thread.join(timeout=240)
  if thread.is_alive():
    subprocess.run(["scancel", f"--name={job_name}"], env=env, check=False)
    pytest.fail("run_slurm did not return within 240 s")
  if "error" in box:
    raise box["error"]
  return box["result"]


def test_term_requeues_exit_zero_resubmits_failure_reported(tmp_path, slurm_env):
  """scancel --signal=TERM (the run) and --batch (the script's trap, as at the time-limit
  warning) -> exit 75 -> the task requeues itself; exit 0 without a result -> the launcher
  resubmits; exit 3 -> reported, not retried; a plain scancel -> cancelled for good."""
  sweep_dir = str(tmp_path / "sw")
  runs = _runs(sweep_dir, ["wait_term", "wait_term", "stop_once", "fail", "wait_term"])
  name = f"fake-{tmp_path.name}"
  options = SlurmOptions(time="00:05:00", cpus_per_task=1, mem="200M", signal_s=0)
  thread, box = _in_background(lambda: run_slurm(
      runs, sweep_dir, name, options, poll_s=0.5, max_resubmits=1, env=slurm_env))
  ready = [os.path.join(run.workdir, "ready") for run in runs]
  scancel_briefly(slurm_env, "--signal=TERM", _wait_for(ready[0]))
  scancel_briefly(slurm_env, "--batch", "--signal=TERM", _wait_for(ready[1]))
  scancel_briefly(slurm_env, _wait_for(ready[4]))
  outcomes = {o.run_name: o for o in _finish(thread, box, name, slurm_env)}

  for run in runs[:2]:  # requeued by the script: same array job, SLURM counts a restart
    o = outcomes[run.run_name]
    assert o.completed and len(o.submissions) == 1, o
    assert o.record.state == "COMPLETED" and o.record.restarts == 1, o.record
    tries = _attempts(run)
    assert [t["restart"] for t in tries] == ["0", "1"]
    assert tries[0]["task"] == tries[1]["task"] == o.record.task
    log = open(os.path.join(run.workdir, "launch.log")).read()
    assert "run exited with status 75" in log and "requeueing" in log
  assert "batch shell got SIGTERM" in open(os.path.join(runs[1].workdir, "launch.log")).read()
  # Exit 0 without a results row: the launcher submitted it again (a new array job).
  o = outcomes[runs[2].run_name]
  assert o.completed and len(o.submissions) == 2 and o.record.restarts == 0, o
  assert [t["task"].split("_")[0] for t in _attempts(runs[2])] == list(o.submissions)
  # A real failure: reported with the scheduler's record, never retried.
  o = outcomes[runs[3].run_name]
  assert not o.completed and len(o.submissions) == 1
  assert (o.record.state, o.record.exit_code) == ("FAILED", "3:0")
  assert len(_attempts(runs[3])) == 1
  # Cancelled by its user: the run exited 75, but the script does not requeue a task
  # being cancelled, and the launcher does not resubmit it.
  o = outcomes[runs[4].run_name]
  assert not o.completed and len(o.submissions) == 1
  assert o.record.state == "CANCELLED" and o.record.restarts == 0, o.record
  assert len(_attempts(runs[4])) == 1
  assert "not requeueing" in open(os.path.join(runs[4].workdir, "launch.log")).read()

  rows = [json.loads(l) for l in open(runs[0].results_file)]
  assert sorted(r["run_name"] for r in rows) == sorted(r.run_name for r in runs[:3])
  records = [json.loads(l) for l in open(os.path.join(sweep_dir, "slurm", "tasks.jsonl"))]
  assert [r["run_name"] for r in records] == [r.run_name for r in runs]


def test_time_limit_warning_checkpoints_and_requeues(tmp_path, slurm_env):
  """--signal=B:TERM@115 with --time=2 min: SLURM itself warns the batch shell, which
  signals the run; it exits 75 and the task requeues and completes."""
  sweep_dir = str(tmp_path / "sw")
  runs = _runs(sweep_dir, ["wait_term"])
  name = f"fake-{tmp_path.name}"
  options = SlurmOptions(time="00:02:00", cpus_per_task=1, mem="200M", signal_s=115)
  thread, box = _in_background(lambda: run_slurm(
      runs, sweep_dir, name, options, poll_s=0.5, max_resubmits=0, env=slurm_env))
  (o,) = _finish(thread, box, name, slurm_env)
  assert o.completed and o.record.state == "COMPLETED" and o.record.restarts == 1, o
  log = open(os.path.join(runs[0].workdir, "launch.log")).read()
  assert "batch shell got SIGTERM" in log and "run exited with status 75" in log
  assert os.path.exists(os.path.join(REPO_DIR, runs[0].workdir, "ready"))
