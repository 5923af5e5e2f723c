"""A real sweep on a real SLURM cluster: ``launch.sweep --target=slurm`` end to end, and a
preempted task that resumes bit for bit.

Two sweeps of the same two tiny LM runs (2 arms, seed 0) go to the cluster together: one
never interrupted, one whose tasks get SIGTERM once they have checkpointed -- task 0 as
``scancel --signal=TERM`` (the run itself), task 1 as ``scancel --batch --signal=TERM``
(the job script, as at the time-limit warning). Every logged scalar of a preempted run
must equal the uninterrupted run's.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from experiments.common.repo_paths import REPO_DIR
from experiments.common.results import read_results
from experiments.common.tensorboard_reader import read_hparams_experiment, read_scalars
from tests.launch.slurm_tools import checkpoint_steps, read_text, scancel_briefly, wait_until

pytestmark = pytest.mark.slurm

SWEEP = "lm_builtin_recipes"
# 100 steps with a checkpoint every 5: the preempted runs get SIGTERM after their first
# checkpoint, with most of the run still ahead.
OVERRIDES = ["--override=num_steps=100", "--override=eval_every=25",
             "--override=checkpoint_every=5", "--override=histogram_every=50",
             "--override=log_every=1"]
SLURM = ["--target=slurm", "--slurm_cpus_per_task=1", "--slurm_mem=1G",
         "--slurm_time=00:20:00", "--slurm_poll_s=1", "--slurm_max_resubmits=2"]


def _start_sweep(sweep_dir, env, extra=()):
  # --allow_dirty: these tests run in development trees too.
  return subprocess.Popen(
      [sys.executable, "-m", "launch.sweep", f"--sweep={SWEEP}", f"--sweep_dir={sweep_dir}",
       "--allow_dirty", *SLURM, *OVERRIDES, *extra], cwd=REPO_DIR, env=env,
      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _manifest(sweep_dir):
  with open(os.path.join(sweep_dir, "manifest.jsonl")) as f:
    return [json.loads(line) for line in f]


def _tasks(sweep_dir):
  with open(os.path.join(sweep_dir, "slurm", "tasks.jsonl")) as f:
    return {r["run_name"]: r for r in map(json.loads, f)}


def _logged(workdir):
  """Every scalar the run logged, less the timings (perf/*)."""
  return {tag: values for tag, values in read_scalars(workdir).items()
          if not tag.startswith("perf/")}


def _preempt(sweep_dir, env):
  """Waits for each run's first checkpoint, then sends its task SIGTERM (see the module
  docstring); returns the tasks signalled."""
  runs = wait_until(lambda: os.path.exists(os.path.join(sweep_dir, "manifest.jsonl"))
                    and _manifest(sweep_dir), "the preempted sweep's manifest")
  signalled = []
  for run, how in zip(runs, (["--signal=TERM"], ["--batch", "--signal=TERM"])):
    workdir = os.path.join(REPO_DIR, run["workdir"])
    wait_until(lambda: checkpoint_steps(workdir), f"a checkpoint of {run['run_name']}")
    task = re.findall(r"array task (\d+_\d+)", read_text(os.path.join(workdir, "launch.log")))
    scancel_briefly(env, *how, task[-1])
    signalled.append(task[-1])
  return signalled


def test_sweep_on_slurm_preempted_tasks_resume_bit_for_bit(tmp_path, slurm_env):
  whole_dir, preempted_dir = str(tmp_path / "whole"), str(tmp_path / "preempted")
  preempted = _start_sweep(preempted_dir, slurm_env, ["--seeds=0", "--noreport"])
  whole = None
  try:
    wait_until(lambda: os.path.exists(os.path.join(preempted_dir, "slurm_array.sbatch")),
               "the preempted sweep's submission")
    whole = _start_sweep(whole_dir, slurm_env, ["--seeds=0"])  # queued behind the other
    signalled = _preempt(preempted_dir, slurm_env)
    out_p, _ = preempted.communicate(timeout=480)
    out_w, _ = whole.communicate(timeout=480)
  finally:
    for proc in (preempted, whole):
      if proc is not None and proc.poll() is None:
        proc.kill()
        subprocess.run(["scancel", f"--name={SWEEP}"], env=slurm_env, check=False)
  assert preempted.returncode == 0, out_p[-4000:]
  assert whole.returncode == 0, out_w[-4000:]

  # The uninterrupted sweep: every task COMPLETED once, as the scheduler recorded it.
  runs = _manifest(whole_dir)
  tasks = _tasks(whole_dir)
  assert sorted(tasks) == sorted(r["run_name"] for r in runs)
  for r in runs:
    record = tasks[r["run_name"]]["record"]
    assert record["state"] == "COMPLETED" and record["exit_code"] == "0:0", record
    assert record["restarts"] == 0 and len(tasks[r["run_name"]]["submissions"]) == 1
    assert f"{record['array_job_id']}_{record['task_id']} {r['run_name']}" in \
        " ".join(out_w.split())  # the launcher printed the record
  # Results, events and report where the local runner puts them.
  rows = read_results(os.path.join(whole_dir, "results.jsonl"))
  assert sorted(row["run_name"] for row in rows) == sorted(r["run_name"] for r in runs)
  for r in runs:
    assert [f for f in os.listdir(os.path.join(REPO_DIR, r["workdir"]))
            if f.startswith("events.out")], r["workdir"]
    assert "completed at step 100" in read_text(os.path.join(REPO_DIR, r["workdir"],
                                                            "launch.log"))
  report = read_text(os.path.join(whole_dir, "REPORT.md"))
  assert "## Ablation table" in report and "| `bf16`" in report
  exp = read_hparams_experiment(os.path.join(whole_dir, "runs"))
  assert sorted(exp["hparams"]["recipe"]) == ["bf16", "fp32"]

  # The preempted sweep: each run was stopped by SIGTERM after a checkpoint, went back
  # to the queue (requeued by its script on status 75, or resubmitted by the launcher
  # where the run exits 0 after checkpointing), resumed, and matches the whole sweep's
  # run of the same config (same run name) in every logged scalar.
  tasks = _tasks(preempted_dir)
  assert len(tasks) == 2
  for run, task in zip(_manifest(preempted_dir), signalled):
    name, workdir = run["run_name"], os.path.join(REPO_DIR, run["workdir"])
    log = read_text(os.path.join(workdir, "launch.log"))
    stopped = re.findall(r"stopping at step (\d+) of 100 \(preemption\)", log)
    assert stopped, f"{name} ({task}) was not preempted mid-run:\n{log[-3000:]}"
    assert f"resumed from step {stopped[0]}" in log and "completed at step 100" in log
    record = tasks[name]
    assert record["completed"] and record["record"]["state"] == "COMPLETED"
    assert record["record"]["restarts"] >= 1 or len(record["submissions"]) >= 2, record
    reference = os.path.join(whole_dir, "runs", name)
    assert _logged(workdir) == _logged(reference), name
    assert len(_logged(workdir)["train/loss"]) == 100
  (row,) = [r for r in read_results(os.path.join(preempted_dir, "results.jsonl"))
            if r["run_name"] == _manifest(preempted_dir)[0]["run_name"]]
  (ref,) = [r for r in read_results(os.path.join(whole_dir, "results.jsonl"))
            if r["run_name"] == row["run_name"]]
  assert row["metrics"] == ref["metrics"]
