"""Runs a sweep's manifest on this machine with N parallel processes (Linux).

Each run is pinned to its own CPU cores (``sched_setaffinity``) so parallel JAX processes
do not oversubscribe the machine; XLA sizes its thread pool from the affinity mask.

Stopping. Each run has its own process group, so a Ctrl-C at the terminal reaches only
the runner, which stops the runs once and cleanly: one SIGTERM to each run's group,
then it waits while they checkpoint (they exit 75, preempted) and raises
:class:`SweepInterrupted` with their outcomes; a second Ctrl-C kills them. A run gets
SIGTERM too when the thread that started it dies, even by SIGKILL
(``PR_SET_PDEATHSIG``), so no run outlives its runner for longer than a checkpoint.
A run whose directory is still locked by a live process (an earlier runner's run,
still checkpointing) is started once that process exits, not reported failed.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Any, Callable, Sequence

from absl import logging

from experiments.common.evidence.results import read_results
from experiments.common.harness import workdir as workdir_lib
from experiments.common.harness.preemption import PREEMPTED_EXIT_CODE
from experiments.common.harness.repo_paths import REPO_DIR
from launch.manifest import RunSpec

# Asks for SIGTERM when the runner dies (the setting survives exec), exits if it already
# has (the child was re-parented before it asked), pins, then execs the run: no
# preexec_fn, which would fork this (multithreaded, JAX importing) process unsafely.
_PR_SET_PDEATHSIG = 1
_PIN_AND_EXEC = (
    "import ctypes, os, signal, sys\n"
    f"ctypes.CDLL(None, use_errno=True).prctl({_PR_SET_PDEATHSIG}, signal.SIGTERM)\n"
    "if os.getppid() != int(sys.argv[1]):\n"
    "  sys.exit('the sweep runner exited before this run started')\n"
    "os.sched_setaffinity(0, [int(c) for c in sys.argv[2].split(',')])\n"
    "os.execvp(sys.argv[3], sys.argv[3:])")


class SweepInterrupted(KeyboardInterrupt):
  """Ctrl-C stopped :func:`run_local`: ``outcomes`` of the runs it finished or stopped
  (a stopped run that checkpointed is ``preempted``) and the names of the runs it never
  started."""

  def __init__(self, outcomes: list["RunOutcome"], not_started: list[str]):
    super().__init__(f"interrupted: {len(outcomes)} runs ended, {len(not_started)} "
                     "not started")
    self.outcomes = outcomes
    self.not_started = not_started


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
  """Run names with a results row (damaged lines skipped: their runs rerun, and a run
  that had completed restores its row without training)."""
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


def _signal_group(proc: subprocess.Popen, signum: int) -> None:
  """``signum`` to the run's process group (its own: the run and anything it started)."""
  try:
    os.killpg(proc.pid, signum)
  except ProcessLookupError:
    pass


class _CtrlC:
  """Counts Ctrl-C (SIGINT) while the runner runs, where KeyboardInterrupt would be
  raised wherever the main thread happens to be. Raised inside ``Popen.wait`` or
  ``poll`` just after ``waitpid`` reaped a run and before its status is stored, it
  lost that status: the next wait found no child and reported 0, so a run stopped by
  a second Ctrl-C counted as completed. Installed only in the main thread (the only one
  Python delivers signals to) and not where SIGINT is ignored (``nohup``, a shell's
  background job), which stays so; the previous handler is restored on exit."""

  def __init__(self):
    self.count = 0
    self._previous = None
    self._installed = False

  def _on_sigint(self, signum, frame) -> None:  # pylint: disable=unused-argument
    self.count += 1

  def __enter__(self) -> "_CtrlC":
    if (threading.current_thread() is threading.main_thread()
        and signal.getsignal(signal.SIGINT) is not signal.SIG_IGN):
      self._previous = signal.signal(signal.SIGINT, self._on_sigint)
      self._installed = True
    return self

  def __exit__(self, *exc) -> None:
    if self._installed:
      # None: a handler not set from Python; the default is the closest to it.
      signal.signal(signal.SIGINT, signal.SIG_DFL if self._previous is None
                    else self._previous)
      self._installed = False


def _next_startable(queue: list[RunSpec], waiting: set[str]) -> RunSpec | None:
  """The first queued run whose directory no live process holds; logs, once per run,
  each one it passes over because a process holds it."""
  for spec in queue:
    holder = workdir_lib.lock_holder(_in_repo(spec.workdir))
    if holder is None:
      return spec
    if spec.run_name not in waiting:
      waiting.add(spec.run_name)
      logging.warning("%s: still running (%s), started before this launch; waiting for "
                      "it to exit before starting it here", spec.run_name, holder)
  return None


def run_local(runs: Sequence[RunSpec], *, parallel: int = 0, cpus_per_run: int = 1,
              mem_per_run_gb: float = 2.0, env: dict[str, str] | None = None,
              timeout_s: float | None = None, poll_s: float = 0.2) -> list[RunOutcome]:
  """Runs every not-yet-completed run, ``parallel`` at a time (0: default_parallelism).

  Runs whose ``run_name`` already has a row in their results file are skipped, and every
  command carries ``--resume``, so re-running a sweep finishes only what is missing.
  Commands run from the repository root (manifest paths are relative to it), with this
  interpreter in place of ``python``. A run past ``timeout_s`` is killed (returncode
  -9). Call from the thread that lives as long as the runs (the main thread): a run is
  sent SIGTERM when the thread that started it exits.

  Raises:
    SweepInterrupted: Ctrl-C (see the module docstring), once the runs have stopped.
  """
  parallel = parallel or default_parallelism(cpus_per_run, mem_per_run_gb)
  slots = _cpu_slots(parallel, cpus_per_run)
  done = set()
  for results_file in dict.fromkeys(r.results_file for r in runs if r.results_file):
    done |= completed_runs(_in_repo(results_file))
  queue = [r for r in runs if r.run_name not in done]
  outcomes = [RunOutcome(r.run_name, None, 0.0, "") for r in runs if r.run_name in done]
  running: dict[int, tuple[subprocess.Popen, RunSpec, float, str, object]] = {}
  free = list(range(parallel))
  waiting: set[str] = set()
  base_env = {**os.environ, **(env or {})}
  logging.info("running %d runs (%d already complete), %d at a time", len(queue),
               len(outcomes), parallel)

  def reap(slot: int, rc: int) -> None:
    proc, spec, t0, log_path, log = running.pop(slot)
    log.close()
    wall = time.monotonic() - t0
    outcomes.append(RunOutcome(spec.run_name, rc, wall, log_path))
    (logging.info if rc == 0 else logging.error)(
        "%s %s (rc=%d) in %.1f s", spec.run_name, outcomes[-1].status, rc, wall)
    free.append(slot)

  try:
    with _CtrlC() as ctrl_c:
      while (queue or running) and not ctrl_c.count:
        while free and (spec := _next_startable(queue, waiting)) is not None:
          queue.remove(spec)
          slot = free.pop(0)
          running[slot] = _start(spec, slots[slot], base_env)
        time.sleep(poll_s)
        for slot, (proc, spec, t0, _, _) in list(running.items()):
          rc = proc.poll()
          if rc is None and timeout_s is not None and time.monotonic() - t0 > timeout_s:
            _signal_group(proc, signal.SIGKILL)
            rc = proc.wait()
            logging.error("%s timed out after %.0f s", spec.run_name, timeout_s)
          if rc is not None:
            reap(slot, rc)
      if ctrl_c.count:
        _stop_interrupted(running, ctrl_c, reap, poll_s)
        raise SweepInterrupted(outcomes, [r.run_name for r in queue])
  finally:
    _stop_all(running)
  return outcomes


def _cpu_slots(parallel: int, cpus_per_run: int) -> list[list[int]]:
  """The cores each of ``parallel`` slots pins its run to (all shared, with a warning,
  when there are too few)."""
  cpus = sorted(os.sched_getaffinity(0))
  if len(cpus) < parallel * cpus_per_run:
    logging.warning("%d parallel runs x %d cpus exceed the %d cpus available; sharing them",
                    parallel, cpus_per_run, len(cpus))
    return [cpus] * parallel
  return [cpus[i * cpus_per_run:(i + 1) * cpus_per_run] or cpus for i in range(parallel)]


def _start(spec: RunSpec, cores: list[int], env: dict[str, str]
           ) -> tuple[subprocess.Popen, RunSpec, float, str, Any]:
  """Starts ``spec`` pinned to ``cores`` in a session of its own, its output appended
  to ``<workdir>/launch.log``: (process, spec, start time, log path, open log)."""
  workdir = _in_repo(spec.workdir)
  os.makedirs(workdir, exist_ok=True)
  log_path = os.path.join(workdir, "launch.log")
  log = open(log_path, "ab")  # pylint: disable=consider-using-with  # closed on reap
  argv = [sys.executable, "-c", _PIN_AND_EXEC, str(os.getpid()),
          ",".join(map(str, cores)), *_argv(spec.command)]
  proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env,
                          start_new_session=True)
  logging.info("started %s on cpus %s (log %s)", spec.run_name, cores, log_path)
  return proc, spec, time.monotonic(), log_path, log


def _stop_interrupted(running: dict[int, tuple], ctrl_c: _CtrlC,
                      reap: Callable[[int, int], None], poll_s: float) -> None:
  """After Ctrl-C: SIGTERM to every run (each checkpoints and exits), SIGKILL after a
  second Ctrl-C; returns when all have exited (each reaped)."""
  logging.warning("interrupted: stopping %d running run(s); each checkpoints and "
                  "exits (Ctrl-C again kills them without a checkpoint)", len(running))
  for proc, *_ in running.values():
    _signal_group(proc, signal.SIGTERM)
  killed = False
  while running:
    if ctrl_c.count > 1 and not killed:
      logging.warning("interrupted again: killing %d run(s)", len(running))
      for proc, *_ in running.values():
        _signal_group(proc, signal.SIGKILL)
      killed = True
    time.sleep(poll_s)
    for slot, (proc, *_) in list(running.items()):
      rc = proc.poll()
      if rc is not None:
        reap(slot, rc)


def _stop_all(running: dict[int, tuple]) -> None:
  """On any other error: SIGTERM makes each run checkpoint and exit, so a re-run of
  the sweep resumes them (SIGKILL after 60 s)."""
  for proc, _, _, _, log in running.values():
    if proc.poll() is None:
      _signal_group(proc, signal.SIGTERM)
      try:
        proc.wait(timeout=60)
      except subprocess.TimeoutExpired:
        _signal_group(proc, signal.SIGKILL)
    log.close()
