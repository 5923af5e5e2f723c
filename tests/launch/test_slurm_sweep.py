"""A real sweep on a real SLURM cluster: ``launch.sweep --target=slurm`` end to end, and a
preempted task that resumes bit for bit.

The sweep is two tiny LM runs (2 arms, seed 0). Task 0 gets ``scancel --signal=TERM``
once it has checkpointed; every scalar it logs must equal those of the same command run
uninterrupted outside SLURM. (The job script's own SIGTERM path, as at the time-limit
warning, is tested with stand-in runs in test_slurm_runner.py.)
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from experiments.common.evidence.results import read_results
from experiments.common.evidence.tensorboard_reader import read_scalars
from experiments.common.harness.repo_paths import REPO_DIR
from launch import tensorboard_views
from tests.launch.slurm_tools import checkpoint_steps, read_text, scancel_briefly, wait_until

pytestmark = pytest.mark.slurm

SWEEP = "lm_builtin_recipes"
# 100 steps with a checkpoint every 5: the preempted run gets SIGTERM after its first
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


def _reference(run, workdir):
  """The run's manifest command with its own workdir and results file, not under SLURM."""
  command = [sys.executable if c == "python" else c for c in run["command"]]
  command = [c for c in command if not c.startswith(("--workdir=", "--results_file="))]
  return subprocess.Popen([*command, f"--workdir={workdir}",
                           f"--results_file={workdir}/results.jsonl"], cwd=REPO_DIR,
                          stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)


def test_sweep_on_slurm_preempted_task_resumes_bit_for_bit(tmp_path, slurm_env):
  sweep_dir, reference_dir = str(tmp_path / "sw"), str(tmp_path / "reference")
  sweep = _start_sweep(sweep_dir, slurm_env, ["--seeds=0"])
  reference = None
  try:
    runs = wait_until(lambda: os.path.exists(os.path.join(sweep_dir, "slurm_array.sbatch"))
                      and _manifest(sweep_dir), "the sweep's submission")
    reference = _reference(runs[0], reference_dir)
    workdir = os.path.join(REPO_DIR, runs[0]["workdir"])
    wait_until(lambda: checkpoint_steps(workdir), f"a checkpoint of {runs[0]['run_name']}")
    task = re.findall(r"array task (\d+_\d+)", read_text(os.path.join(workdir, "launch.log")))
    scancel_briefly(slurm_env, "--signal=TERM", task[-1])
    out, _ = sweep.communicate(timeout=480)
    assert reference.wait(timeout=300) == 0
  finally:
    for proc in (sweep, reference):
      if proc is not None and proc.poll() is None:
        proc.kill()
    subprocess.run(["scancel", f"--name={SWEEP}"], env=slurm_env, check=False)
  assert sweep.returncode == 0, out[-4000:]

  # Every task COMPLETED, as the scheduler recorded it (and the launcher printed it).
  tasks = _tasks(sweep_dir)
  assert sorted(tasks) == sorted(r["run_name"] for r in runs)
  for r in runs:
    record = tasks[r["run_name"]]["record"]
    assert record["state"] == "COMPLETED" and record["exit_code"] == "0:0", record
    assert f"{record['array_job_id']}_{record['task_id']} {r['run_name']} COMPLETED" in \
        " ".join(out.split())
  # Task 1 ran once; task 0 went back to the queue (requeued by its script on status 75,
  # or resubmitted by the launcher where the run exits 0 after checkpointing).
  first, second = tasks[runs[0]["run_name"]], tasks[runs[1]["run_name"]]
  assert second["record"]["restarts"] == 0 and len(second["submissions"]) == 1
  assert first["record"]["restarts"] >= 1 or len(first["submissions"]) >= 2, first
  log = read_text(os.path.join(workdir, "launch.log"))
  stopped = re.findall(r"stopping at step (\d+) of 100 \(preemption\)", log)
  assert stopped, f"task {task[-1]} was not preempted mid-run:\n{log[-3000:]}"
  assert f"resumed from step {stopped[0]}" in log and "completed at step 100" in log

  # Results, events and report where the local runner puts them.
  rows = read_results(os.path.join(sweep_dir, "results.jsonl"))
  assert sorted(row["run_name"] for row in rows) == sorted(r["run_name"] for r in runs)
  for r in runs:
    assert [f for f in os.listdir(os.path.join(REPO_DIR, r["workdir"]))
            if f.startswith("events.out")], r["workdir"]
  report = read_text(os.path.join(sweep_dir, "REPORT.md"))
  assert "## Ablation table" in report and "| `bf16`" in report
  exp = tensorboard_views.read_experiment(sweep_dir)  # in the first run: no `.` run
  assert sorted(exp["hparams"]["recipe"]) == ["bf16", "fp32"]

  # The preempted run equals the uninterrupted one in every logged scalar and its row.
  assert len(_logged(workdir)["train/loss"]) == 100
  assert _logged(workdir) == _logged(reference_dir)
  (row,) = [r for r in rows if r["run_name"] == runs[0]["run_name"]]
  (ref,) = read_results(os.path.join(reference_dir, "results.jsonl"))
  assert row["metrics"] == ref["metrics"]
