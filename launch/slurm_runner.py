"""Runs a sweep's manifest as a SLURM job array: submit, watch, resubmit the preempted.

``run_slurm`` writes the array script (:mod:`launch.slurm`), submits the runs that have
no results row yet (``sbatch --parsable --array=<their indices>``), and polls
``scontrol show job`` until every array task has ended, printing each task's state
changes. A preempted task normally requeues itself (the script does, on exit status
:data:`PREEMPTED_EXIT_CODE`); a run that still ends without a results row although it may
continue -- status 75 where requeueing was refused, a run that checkpointed and exited 0,
``TIMEOUT``, ``PREEMPTED``, ``NODE_FAIL`` -- is submitted again as soon as it is seen (up
to ``max_resubmits`` times), and resumes from its checkpoint. A run that failed otherwise (another exit status,
``OUT_OF_MEMORY``, ``CANCELLED`` by a user) is reported, not retried.

There is no accounting database to ask (``sacct``), so finished tasks are read from
``scontrol`` while the controller keeps them (``MinJobAge``, 300 s by default); the
results file decides whether a run completed.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import time
from typing import Mapping, Sequence

from experiments.common.evidence.results import read_results
from experiments.common.harness.preemption import PREEMPTED_EXIT_CODE
from experiments.common.harness.repo_paths import REPO_DIR
from launch.manifest import RunSpec
from launch.slurm import SlurmOptions, array_spec, write_array_script

# A task in one of these states will not change any more.
TERMINAL_STATES = frozenset({
    "COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "PREEMPTED", "NODE_FAIL", "BOOT_FAIL",
    "OUT_OF_MEMORY", "DEADLINE"})
# Ended without a result, but the run may continue from its checkpoint.
RESUMABLE_STATES = frozenset({"TIMEOUT", "PREEMPTED", "NODE_FAIL", "BOOT_FAIL"})
# Nothing will run until a person acts (e.g. `scontrol release`).
HELD_STATES = frozenset({"REQUEUE_HOLD", "SPECIAL_EXIT"})


@dataclasses.dataclass(frozen=True)
class TaskRecord:
  """One array task as ``scontrol show job`` reports it."""

  array_job_id: str
  task_id: int
  job_id: str
  state: str
  exit_code: str  # "<status>:<signal>"
  restarts: int
  run_time: str
  node: str
  reason: str

  @property
  def exit_status(self) -> int:
    return int(self.exit_code.split(":")[0]) if self.exit_code[:1].isdigit() else -1

  @property
  def task(self) -> str:
    return f"{self.array_job_id}_{self.task_id}"


def _task_ids(spec: str) -> list[int]:
  """``ArrayTaskId`` of a record: ``3``, or pending tasks ``0-2,5`` / ``0-7:2`` / ``1-3%2``."""
  ids = []
  for part in spec.split("%")[0].split(","):
    if not part:
      continue
    rng, _, step = part.partition(":")
    lo, _, hi = rng.partition("-")
    ids += range(int(lo), int(hi or lo) + 1, int(step or 1))
  return ids


def parse_scontrol_jobs(text: str) -> list[TaskRecord]:
  """Array task records from ``scontrol -o show job`` output (one job per line).

  A line for not-yet-started tasks (``ArrayTaskId=2-3``) gives one record per task.
  Lines of jobs that are not array tasks are skipped.
  """
  records = []
  for line in text.splitlines():
    fields = dict(tok.partition("=")[::2] for tok in line.split() if "=" in tok)
    if "ArrayJobId" not in fields or "ArrayTaskId" not in fields:
      continue
    state = fields.get("JobState", "UNKNOWN")
    for task in _task_ids(fields["ArrayTaskId"]):
      records.append(TaskRecord(
          array_job_id=fields["ArrayJobId"], task_id=task, job_id=fields.get("JobId", ""),
          state=state, exit_code=fields.get("ExitCode", ""),
          restarts=int(fields.get("Restarts", "0") or 0), run_time=fields.get("RunTime", ""),
          node=fields.get("BatchHost", fields.get("NodeList", "")),
          reason=fields.get("Reason", "")))
  return records


def query_tasks(array_job_id: str, env: Mapping[str, str] | None = None
                ) -> list[TaskRecord] | None:
  """The scheduler's records of an array job's tasks; None once it no longer knows the job."""
  out = subprocess.run(["scontrol", "-o", "show", "job", array_job_id], capture_output=True,
                       text=True, env=None if env is None else dict(env), timeout=60)
  if out.returncode != 0:
    if "Invalid job id" in out.stderr:
      return None
    raise RuntimeError(f"scontrol show job {array_job_id} failed: {out.stderr.strip()}")
  return [r for r in parse_scontrol_jobs(out.stdout) if r.array_job_id == array_job_id]


def submit(script: str, indices: Sequence[int], *, max_concurrent: int = 0,
           env: Mapping[str, str] | None = None) -> str:
  """``sbatch --parsable --array=<indices> script``; returns the array job id."""
  array = array_spec(indices, max_concurrent)
  out = subprocess.run(["sbatch", "--parsable", f"--array={array}", script],
                       capture_output=True, text=True, cwd=REPO_DIR,
                       env=None if env is None else dict(env), timeout=120)
  if out.returncode != 0:
    raise RuntimeError(f"sbatch {script} failed (rc={out.returncode}): "
                       f"{(out.stdout + out.stderr).strip()}")
  return out.stdout.strip().split(";")[0]


@dataclasses.dataclass(frozen=True)
class SlurmOutcome:
  """How a run ended: ``completed`` (it has a results row), its last task's record (None
  where the scheduler had forgotten it) and the array jobs it was submitted in."""

  run_name: str
  completed: bool
  record: TaskRecord | None
  submissions: tuple[str, ...]
  log_path: str


def _completed(runs: Sequence[RunSpec]) -> set[str]:
  done: set[str] = set()
  for f in {r.results_file for r in runs if r.results_file}:
    done |= {row.get("run_name") for row in read_results(os.path.join(REPO_DIR, f))}
  return done


def resumable(record: TaskRecord | None) -> bool:
  """Whether a task that ended without a results row should be submitted again."""
  if record is None:  # forgotten by the controller: its result is what counts
    return True
  if record.state in RESUMABLE_STATES:
    return True
  # Exit 0 without a results row: the run checkpointed on SIGTERM and stopped.
  return record.state in ("COMPLETED", "FAILED") and record.exit_status in (
      0, PREEMPTED_EXIT_CODE)


def _say(message: str) -> None:
  print(f"[slurm {time.strftime('%H:%M:%S')}] {message}", flush=True)


def format_record(r: TaskRecord, run_name: str = "") -> str:
  return (f"{r.task:>10s} {run_name:28s} {r.state:12s} exit={r.exit_code:6s} "
          f"restarts={r.restarts} runtime={r.run_time} node={r.node}")


def run_slurm(runs: Sequence[RunSpec], sweep_dir: str, job_name: str,
              options: SlurmOptions = SlurmOptions(), *, poll_s: float = 30.0,
              max_resubmits: int = 2, env: Mapping[str, str] | None = None
              ) -> list[SlurmOutcome]:
  """Submits every run without a results row as one array job and waits for all of them.

  Prints each task's state changes and, at the end, the scheduler's last record of
  every task; appends those records to ``<sweep_dir>/slurm/tasks.jsonl``. A run whose
  task ends resumably without a result is submitted again at once (a new array job of
  the runs found in that poll), at most ``max_resubmits`` times per run. Interrupting
  this (Ctrl-C) leaves the jobs running.
  """
  if poll_s <= 0 or max_resubmits < 0:
    raise ValueError(f"need poll_s > 0 and max_resubmits >= 0, got {poll_s}, {max_resubmits}")
  script = write_array_script(runs, sweep_dir, job_name, options)
  by_index = {r.index: r for r in runs}
  done = _completed(runs)
  if done & {r.run_name for r in runs}:
    _say(f"{len(done & {r.run_name for r in runs})} runs already have results; skipped")
  submissions: dict[int, list[str]] = {i: [] for i in by_index}
  last: dict[int, TaskRecord | None] = {}
  active: dict[str, set[int]] = {}  # array job -> its tasks not yet ended
  seen: dict[tuple[str, int], tuple[str, int]] = {}
  unlisted: dict[tuple[str, int], int] = {}

  def submit_runs(indices: list[int]) -> None:
    job = submit(script, indices, max_concurrent=options.max_concurrent, env=env)
    _say(f"submitted array job {job} (tasks {array_spec(indices)}) from {script}")
    active[job] = set(indices)
    for i in indices:
      submissions[i].append(job)

  todo = sorted(r.index for r in runs if r.run_name not in done)
  if todo:
    submit_runs(todo)
  try:
    while active:
      ended: list[int] = []
      for job, pending in list(active.items()):
        records = query_tasks(job, env)
        listed = {r.task_id for r in records or ()}
        for i in list(pending):  # purged from the controller (whole job, or this task)
          unlisted[job, i] = 0 if i in listed else unlisted.get((job, i), 0) + 1
          if records is None or unlisted[job, i] >= 3:
            last[i] = None
            pending.discard(i)
            ended.append(i)
        for rec in records or ():
          if rec.task_id not in pending:
            continue
          if seen.get((job, rec.task_id)) != (rec.state, rec.restarts):
            seen[job, rec.task_id] = (rec.state, rec.restarts)
            _say(format_record(rec, by_index[rec.task_id].run_name))
          last[rec.task_id] = rec
          if rec.state in TERMINAL_STATES:
            pending.discard(rec.task_id)
            ended.append(rec.task_id)
          elif rec.state in HELD_STATES:
            raise RuntimeError(f"array task {rec.task} is held ({rec.state}, {rec.reason}); "
                               f"release it (scontrol release {rec.task}) and rerun")
        if not pending:
          del active[job]
      if ended:
        done = _completed(runs)
        retry = sorted(i for i in ended if by_index[i].run_name not in done
                       and resumable(last.get(i)) and len(submissions[i]) <= max_resubmits)
        if retry:
          _say(f"submitting again {len(retry)} run(s) that stopped without a result: "
               f"{', '.join(by_index[i].run_name for i in retry)}")
          submit_runs(retry)
      if active:
        time.sleep(poll_s)
  except KeyboardInterrupt:
    _say(f"interrupted; array job(s) {' '.join(active)} keep running "
         f"(cancel with: scancel {' '.join(active)})")
    raise
  done = _completed(runs)
  outcomes = []
  with open(os.path.join(os.path.abspath(sweep_dir), "slurm", "tasks.jsonl"), "a") as f:
    if any(submissions.values()):
      _say("the scheduler's last record of each task:")
    for i in sorted(by_index):
      spec, rec = by_index[i], last.get(i)
      jobs = tuple(submissions[i])
      log = os.path.join(REPO_DIR, spec.workdir, "launch.log")
      outcomes.append(SlurmOutcome(spec.run_name, spec.run_name in done, rec, jobs, log))
      if not jobs:
        continue
      _say(format_record(rec, spec.run_name) if rec else
           f"{jobs[-1]}_{i} {spec.run_name}: no longer known to the controller")
      f.write(json.dumps({"run_name": spec.run_name, "submissions": list(jobs),
                          "completed": spec.run_name in done,
                          "record": dataclasses.asdict(rec) if rec else None},
                         sort_keys=True) + "\n")
  return outcomes


def scheduler_available(env: Mapping[str, str] | None = None) -> str | None:
  """None if ``sinfo`` answers (a cluster is reachable), else why not."""
  try:
    out = subprocess.run(["sinfo", "-h", "-o", "%P %a %D %t"], capture_output=True,
                         text=True, env=None if env is None else dict(env), timeout=30)
  except FileNotFoundError:
    return "sinfo not found (no SLURM client installed)"
  except subprocess.TimeoutExpired:
    return "sinfo timed out (no controller answering)"
  if out.returncode != 0:
    lines = (out.stdout + out.stderr).strip().splitlines() or ["no output"]
    return f"sinfo failed (rc={out.returncode}): {lines[-1][:200]}"
  if not out.stdout.strip():
    return "sinfo lists no partition"
  return None
