"""Claiming a run directory before training: one process at a time, never a finished run
twice, a results file that can be written, the same config on resume.

:func:`claim` runs before anything is trained or written:

* **Lock.** An exclusive ``flock`` on ``<workdir>/.lock``, held until the run ends
  (:meth:`Claim.release`, or the process's exit). The kernel drops a ``flock`` when its
  holder dies, even by SIGKILL, so a lock is never stale: if it is held, its holder is
  alive (the pid, host and start time it wrote are in the message). Not reliable on
  NFS, whose ``flock`` emulation varies.
* **Completed runs.** A finished run leaves ``<workdir>/COMPLETED.json`` beside its
  results row (:func:`mark_completed`); rerunning or resuming it writes nothing.
* **Results file.** Opened for appending before training, so a run that cannot record
  its result fails in its first second, not after its last step.
* **Config.** ``--resume`` refuses a directory whose recorded config differs.
"""

from __future__ import annotations

import dataclasses
import fcntl
import json
import os
import socket
import time
from typing import Any

from experiments.common import run_metadata

COMPLETED = "COMPLETED.json"
LOCK = ".lock"


class WorkdirInUse(RuntimeError):
  """Another live process holds the run directory."""


class RunAlreadyCompleted(RuntimeError):
  """The run directory holds a finished run; nothing was written."""


def completion_record(workdir: str) -> dict[str, Any] | None:
  """What :func:`mark_completed` wrote in ``workdir``, or None."""
  path = os.path.join(workdir, COMPLETED)
  if not os.path.exists(path):
    return None
  with open(path) as f:
    return json.load(f)


def mark_completed(workdir: str, *, step: int, results_file: str, run_name: str) -> None:
  """Records that the run in ``workdir`` finished and wrote its results row."""
  path = os.path.join(workdir, COMPLETED)
  tmp = f"{path}.{os.getpid()}.tmp"
  with open(tmp, "w") as f:
    json.dump({"step": int(step), "results_file": results_file, "run_name": run_name,
               "at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}, f, indent=1)
  os.replace(tmp, path)


@dataclasses.dataclass
class Claim:
  """The held lock of a run directory (None where this process does not write)."""

  workdir: str
  lock_file: Any = None

  def release(self) -> None:
    if self.lock_file is not None:
      fcntl.flock(self.lock_file, fcntl.LOCK_UN)
      self.lock_file.close()
      self.lock_file = None

  def __enter__(self) -> "Claim":
    return self

  def __exit__(self, *exc) -> None:
    self.release()


def _lock(workdir: str) -> Any:
  os.makedirs(workdir, exist_ok=True)
  f = open(os.path.join(workdir, LOCK), "a+")
  try:
    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
  except BlockingIOError:
    f.seek(0)
    holder = f.read().strip() or "unknown"
    f.close()
    raise WorkdirInUse(
        f"{workdir} is in use by another process ({holder}); refusing to run a second "
        "process on it (it would mix two runs' checkpoints, events and results). A "
        "lock is released when its holder exits, even when killed, so that process is "
        "alive: wait for it, stop it, or choose another --workdir.") from None
  f.seek(0)
  f.truncate()
  f.write(f"pid {os.getpid()} on {socket.gethostname()}, since "
          f"{time.strftime('%Y-%m-%d %H:%M:%S')}\n")
  f.flush()
  return f


def check_results_writable(results_file: str) -> None:
  """Raises OSError (naming the file) unless a row can be appended to it."""
  try:
    os.makedirs(os.path.dirname(os.path.abspath(results_file)), exist_ok=True)
    with open(results_file, "a"):
      pass
  except OSError as e:
    raise OSError(e.errno, f"cannot write the results file {results_file} ({e.strerror}); "
                  "fix its permissions or pass another --results_file before training") \
        from None


def claim(workdir: str, *, results_file: str, resume: bool, config: Any = None,
          has_checkpoint: bool = False, writer_process: bool = True) -> Claim:
  """Checks and locks ``workdir`` for one run (see the module docstring).

  Args:
    workdir, results_file: the run's (absolute) paths.
    resume: ``--resume`` was given.
    config: the run's config, compared with the recorded one on resume.
    has_checkpoint: the directory already holds a checkpoint.
    writer_process: False on the non-writing processes of a multi-process job (they
      share the directory and take no lock).

  Raises:
    RunAlreadyCompleted: the directory holds a finished run.
    FileExistsError: it holds a run and ``resume`` is False.
    WorkdirInUse: another live process holds it.
    ValueError: resuming with a config that differs from the recorded one.
    OSError: the results file cannot be written.
  """
  held = Claim(workdir, _lock(workdir) if writer_process else None)
  try:
    done = completion_record(workdir)
    if done is not None:
      raise RunAlreadyCompleted(
          f"{workdir} holds a completed run (step {done['step']}; its results row is in "
          f"{done['results_file']}); nothing was written. Train again with another "
          "--workdir (or change the config: the default workdir is named after it).")
    if has_checkpoint and not resume:
      raise FileExistsError(
          f"{workdir} already holds an interrupted run; pass --resume to continue it, "
          "or choose another --workdir (or change the config: the default workdir is "
          "named after it).")
    if resume and config is not None:
      diffs = run_metadata.config_differences(workdir, config)
      if diffs:
        raise ValueError(
            f"refusing to --resume {workdir}: its recorded config differs from this one "
            "in " + "; ".join(diffs) + ". Resume with the recorded flags (see its "
            "config.json), or train this config in another --workdir.")
    if writer_process:
      check_results_writable(results_file)
  except BaseException:
    held.release()
    raise
  return held
