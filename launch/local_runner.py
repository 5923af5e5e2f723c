"""Runs a sweep's manifest on this machine with N parallel processes.

Each run is pinned to its own CPU cores (``sched_setaffinity``) so parallel JAX processes
do not oversubscribe the machine; XLA sizes its thread pool from the affinity mask.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import time
from typing import Sequence

from absl import logging

from experiments.common.preemption import PREEMPTED_EXIT_CODE
from experiments.common.repo_paths import REPO_DIR
from experiments.common.results import read_results
from launch.manifest import RunSpec

# Pins, then execs the run: no preexec_fn, which would fork this (multithreaded, JAX
# importing) process in an unsafe way.
_PIN_AND_EXEC = ("import os, sys; os.sched_setaffinity(0, [int(c) for c in "
                 "sys.argv[1].split(',')]); os.execvp(sys.argv[2], sys.argv[2:])")


def available_memory_gb() -> float | None:
  """MemAvailable from /proc/meminfo, or None where it cannot be read."""
  try:
    with open("/proc/meminfo") as f:
      for line in f:
        if line.startswith("MemAvailable:"):
          return int(line.split()[1]) / 2**20
  except OSError:
    pass
  return None


def default_parallelism(cpus_per_run: int = 1, mem_per_run_gb: float = 2.0) -> int:
  """As many runs as fit: by the cores this process may use and the free memory."""
  if cpus_per_run < 1:
    raise ValueError(f"cpus_per_run must be >= 1, got {cpus_per_run}")
  by_cpu = len(os.sched_getaffinity(0)) // cpus_per_run
  mem = available_memory_gb()
  by_mem = int(mem // mem_per_run_gb) if mem is not None and mem_per_run_gb > 0 else by_cpu
  return max(1, min(by_cpu, by_mem))


@dataclasses.dataclass(frozen=True)
class RunOutcome:
  run_name: str
  returncode: int | None  # None: skipped (already has a results row)
  wall_s: float
  log_path: str

  @property
  def status(self) -> str:
    """``skipped``, ``completed``, ``preempted`` (checkpointed, no results row: rerun
    the sweep to resume it) or ``failed``."""
    if self.returncode is None:
      return "skipped"
    if self.returncode == 0:
      return "completed"
    return "preempted" if self.returncode == PREEMPTED_EXIT_CODE else "failed"


def completed_runs(results_file: str) -> set[str]:
  """Run names with a results row (damaged lines skipped: their runs rerun)."""
  problems: list[str] = []
  rows = read_results(results_file, problems)
  for p in problems:
    logging.warning("ignoring %s", p)
  return {row.get("run_name") for row in rows}


def _in_repo(path: str) -> str:
  """A manifest path (relative to the repository root, or absolute) as an absolute path."""
  return os.path.join(REPO_DIR, path)


def _argv(command: Sequence[str]) -> list[str]:
  """The manifest command with this interpreter in place of ``python``."""
  return [sys.executable, *command[1:]] if command and command[0] == "python" else list(command)


def run_local(runs: Sequence[RunSpec], *, parallel: int = 0, cpus_per_run: int = 1,
              mem_per_run_gb: float = 2.0, env: dict[str, str] | None = None,
              timeout_s: float | None = None, poll_s: float = 0.2) -> list[RunOutcome]:
  """Runs every not-yet-completed run, ``parallel`` at a time (0: default_parallelism).

  Runs whose ``run_name`` already has a row in their results file are skipped, and every
  command carries ``--resume``, so re-running a sweep finishes only what is missing.
  Commands run from the repository root (manifest paths are relative to it).
  A run past ``timeout_s`` is killed (returncode -9).
  """
  parallel = parallel or default_parallelism(cpus_per_run, mem_per_run_gb)
  cpus = sorted(os.sched_getaffinity(0))
  slots = [cpus[i * cpus_per_run:(i + 1) * cpus_per_run] or cpus for i in range(parallel)]
  if len(cpus) < parallel * cpus_per_run:
    logging.warning("%d parallel runs x %d cpus exceed the %d cpus available; sharing them",
                    parallel, cpus_per_run, len(cpus))
    slots = [cpus] * parallel
  done = set()
  for r in runs:
    done |= completed_runs(_in_repo(r.results_file)) if r.results_file else set()
  queue = [r for r in runs if r.run_name not in done]
  outcomes = [RunOutcome(r.run_name, None, 0.0, "") for r in runs if r.run_name in done]
  running: dict[int, tuple[subprocess.Popen, RunSpec, float, str, object]] = {}
  free = list(range(parallel))
  base_env = {**os.environ, **(env or {})}
  logging.info("running %d runs (%d already complete), %d at a time", len(queue),
               len(outcomes), parallel)
  try:
    while queue or running:
      while queue and free:
        slot = free.pop(0)
        spec = queue.pop(0)
        workdir = _in_repo(spec.workdir)
        os.makedirs(workdir, exist_ok=True)
        log_path = os.path.join(workdir, "launch.log")
        log = open(log_path, "ab")
        cores = slots[slot]
        argv = [sys.executable, "-c", _PIN_AND_EXEC, ",".join(map(str, cores)),
                *spec.command]
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=base_env)
        running[slot] = (proc, spec, time.monotonic(), log_path, log)
        logging.info("started %s on cpus %s (log %s)", spec.run_name, cores, log_path)
      time.sleep(poll_s)
      for slot, (proc, spec, t0, log_path, log) in list(running.items()):
        rc = proc.poll()
        if rc is None and timeout_s is not None and time.monotonic() - t0 > timeout_s:
          proc.kill()
          rc = proc.wait()
          logging.error("%s timed out after %.0f s", spec.run_name, timeout_s)
        if rc is None:
          continue
        log.close()
        wall = time.monotonic() - t0
        outcomes.append(RunOutcome(spec.run_name, rc, wall, log_path))
        (logging.info if rc == 0 else logging.error)(
            "%s %s (rc=%d) in %.1f s", spec.run_name, outcomes[-1].status, rc, wall)
        del running[slot]
        free.append(slot)
  finally:
    # Interrupted (Ctrl-C, an error): SIGTERM makes each run checkpoint and exit, so a
    # re-run of the sweep resumes them.
    for proc, spec, _, _, log in running.values():
      if proc.poll() is None:
        proc.terminate()
        try:
          proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
          proc.kill()
      log.close()
  return outcomes
