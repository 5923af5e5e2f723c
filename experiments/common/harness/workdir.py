"""Claiming a run directory before training: one process at a time, never a finished run
twice, a results file that can be written, the same config on resume.

:func:`claim` runs before anything is trained or written:

* **Lock.** An exclusive ``flock`` on ``<workdir>/.lock``, held until the run ends
  (:meth:`Claim.release`, or the process's exit). The kernel drops a ``flock`` when its
  holder dies, even by SIGKILL, so a lock is never stale: if it is held, its holder is
  alive (the pid, host and start time it wrote are in the message). Not reliable on
  NFS, whose ``flock`` emulation varies.
* **Completed runs.** A finished run leaves ``<workdir>/COMPLETED.json`` beside its
  results row (:func:`mark_completed`), with a copy of that row; rerunning or resuming
  it trains nothing, and takes no lock (a fetched sweep may be read-only). If its row is missing from the results file (or damaged there),
  the rerun appends the kept copy (a run completed before copies were kept: a row
  rebuilt from its ``config.json`` and the scalars its events hold at the final step,
  marked ``restored_from``), so a sweep that reruns it counts it again.
* **Results file and run directory.** Both are checked writable before training, so
  a run that cannot record its result fails in its first second, not after its last
  step, with one line naming the path (:class:`NotWritable`).
* **Config.** ``--resume`` refuses a directory whose recorded config differs: the one in
  ``config.json``, or the one its checkpoints carry (which survives ``config.json``); it
  refuses checkpoints with no record of their config at all.
"""

from __future__ import annotations

import dataclasses
import errno
import fcntl
import json
import os
import socket
import tempfile
import time
from typing import Any

from absl import logging

from experiments.common.evidence.results_file import append_result_unless_present, read_results
from experiments.common.evidence.tensorboard_reader import read_scalars
from experiments.common.harness import run_metadata
from experiments.common.harness.repo_paths import repo_relative

COMPLETED = "COMPLETED.json"
LOCK = ".lock"


class WorkdirInUse(RuntimeError):
  """Another live process holds the run directory."""


class RunAlreadyCompleted(RuntimeError):
  """The run directory holds a finished run; nothing was trained (its results row may
  have been restored: the message says so)."""


class RunRefused(ValueError):
  """The run directory cannot be used as asked (the message says why and what to do)."""


class NotWritable(OSError):
  """The run directory or the results file cannot be written (a read-only mount, an
  immutable directory, permissions); the message names it and what to do."""

  def __init__(self, message: str, errno_: int | None = None):
    super().__init__(message)
    self.errno = errno_


def check_run_dir_writable(workdir: str) -> None:
  """Raises :class:`NotWritable` (naming ``workdir``) unless a file can be created in
  it (creating it if needed): found before orbax fails inside its checkpointer."""
  try:
    os.makedirs(workdir, exist_ok=True)
    fd, probe = tempfile.mkstemp(prefix=".write_probe.", dir=workdir)
    os.close(fd)
    os.remove(probe)
  except OSError as e:
    raise NotWritable(f"cannot write the run directory {workdir} ({e.strerror}); choose "
                      "another --workdir, or make it writable", e.errno) from None


def completion_record(workdir: str) -> dict[str, Any] | None:
  """What :func:`mark_completed` wrote in ``workdir``, or None."""
  path = os.path.join(workdir, COMPLETED)
  if not os.path.exists(path):
    return None
  with open(path) as f:
    return json.load(f)


def mark_completed(workdir: str, *, step: int, results_file: str, run_name: str,
                   row: dict[str, Any] | None = None) -> None:
  """Records that the run in ``workdir`` finished and wrote its results row ``row``
  (kept here too, so a rerun can restore a lost or damaged row)."""
  path = os.path.join(workdir, COMPLETED)
  tmp = f"{path}.{os.getpid()}.tmp"
  record = {"step": int(step), "results_file": results_file, "run_name": run_name,
            "at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
  if row is not None:
    record["row"] = row
  try:
    with open(tmp, "w") as f:
      json.dump(record, f, indent=1, allow_nan=False)
    os.replace(tmp, path)
  except BaseException:
    if os.path.exists(tmp):  # a full disk: leave no half-written copy behind
      os.remove(tmp)
    raise


def _row_from_events(workdir: str, done: dict[str, Any]) -> dict[str, Any] | None:
  """The results row of a completed run that kept no copy of it: config and commit from
  its ``config.json``, metrics from the scalars its events hold at the final step (the
  loop logs every train and eval metric there, and the run's summary metrics); None
  when either is missing."""
  record = run_metadata.read_record(workdir)
  if record is None:
    return None
  step = int(done["step"])
  at_end = {tag: v for tag, curve in read_scalars(workdir).items() for s, v in curve
            if s == step}
  if not any(tag.startswith(("train/", "eval/")) for tag in at_end):
    return None
  return {"run_name": done.get("run_name") or os.path.basename(workdir.rstrip(os.sep)),
          "experiment": record.get("experiment"), "workdir": repo_relative(workdir),
          "completed": True, "step": step, "config": record.get("config"),
          "metrics": {t: v for t, v in at_end.items() if not t.startswith("perf/")},
          "steps_per_s": at_end.get("perf/steps_per_s"), "git": record.get("git"),
          "restored_from": f"events at step {step} and config.json (the run kept no copy "
                           "of its row)"}


def _restore_row(workdir: str, done: dict[str, Any], results_file: str) -> str:
  """Appends the completed run's row to ``results_file`` unless it holds a readable one;
  returns what was done (the end of :class:`RunAlreadyCompleted`'s message)."""
  present = f"its results row is in {results_file}); nothing was written"
  row = done.get("row")
  if row is None:  # completed before rows were kept: rebuild one only if it is needed
    if any(r.get("run_name") == done.get("run_name")
           for r in read_results(results_file, problems=[])):
      return present
    row = _row_from_events(workdir, done)
    if row is None:
      raise RunRefused(
          f"{workdir} holds a completed run (step {done['step']}) whose results row is "
          f"missing from {results_file} or damaged there, and it cannot be restored: "
          "the run kept no copy of its row and its config.json or final-step events "
          "are missing. Train it again in another --workdir.")
  try:
    appended = append_result_unless_present(results_file, row)
  except OSError as e:
    raise NotWritable(f"{workdir} holds a completed run whose results row is missing from "
                      f"{results_file}, which cannot be written ({e.strerror}); pass a "
                      "writable --results_file to restore the row there", e.errno) from None
  if not appended:
    return present
  source = row.get("restored_from", COMPLETED)
  logging.warning("restored the results row of %s into %s (from %s)", workdir,
                  results_file, source)
  return (f"its results row was missing from {results_file} or damaged there, and is "
          f"restored from {source}); nothing was trained")


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


class DirectoryLocked(RuntimeError):
  """A live process holds the lock of ``directory``; ``holder`` is what it wrote there
  (its pid, host and start time)."""

  def __init__(self, directory: str, holder: str):
    super().__init__(f"{directory} is locked by {holder}")
    self.directory = directory
    self.holder = holder


def lock_directory(directory: str) -> Any:
  """Takes the exclusive ``flock`` on ``<directory>/.lock`` (creating both) and writes
  this process's pid, host and time into it; returns the open file, which holds the
  lock until it is closed or this process exits.

  Raises:
    DirectoryLocked: another live process holds it.
  """
  os.makedirs(directory, exist_ok=True)
  f = open(os.path.join(directory, LOCK), "a+")
  try:
    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
  except BlockingIOError:
    f.seek(0)
    holder = f.read().strip() or "unknown"
    f.close()
    raise DirectoryLocked(directory, holder) from None
  f.seek(0)
  f.truncate()
  f.write(f"pid {os.getpid()} on {socket.gethostname()}, since "
          f"{time.strftime('%Y-%m-%d %H:%M:%S')}\n")
  f.flush()
  return f


def lock_holder(directory: str) -> str | None:
  """Who holds the lock of ``directory`` (what it wrote: pid, host, time), or None when
  nobody does. Probes without creating anything."""
  path = os.path.join(directory, LOCK)
  try:
    f = open(path, "r")
  except FileNotFoundError:
    return None
  with f:
    try:
      fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
      return f.read().strip() or "unknown"
    fcntl.flock(f, fcntl.LOCK_UN)
  return None


def _lock(workdir: str) -> Any:
  try:
    return lock_directory(workdir)
  except OSError as e:
    if e.errno not in (errno.EROFS, errno.EACCES, errno.EPERM):
      raise
    raise NotWritable(f"cannot lock the run directory {workdir} ({e.strerror}); choose "
                      "another --workdir, or make it writable", e.errno) from None
  except DirectoryLocked as e:
    raise WorkdirInUse(
        f"{workdir} is in use by another process ({e.holder}); refusing to run a second "
        "process on it (it would mix two runs' checkpoints, events and results). A "
        "lock is released when its holder exits, even when killed, so that process is "
        "alive: wait for it, stop it, or choose another --workdir.") from None


def check_results_writable(results_file: str) -> None:
  """Raises :class:`NotWritable` (naming the file) unless a row can be appended to it."""
  try:
    os.makedirs(os.path.dirname(os.path.abspath(results_file)), exist_ok=True)
    with open(results_file, "a"):
      pass
  except OSError as e:
    raise NotWritable(f"cannot write the results file {results_file} ({e.strerror}); fix "
                      "its permissions or pass another --results_file before training",
                      e.errno) from None


def _config_records(workdir: str, checkpointer: Any) -> list[tuple[str, dict]]:
  """``(source, record)`` of the run's recorded configs: config.json, and the
  checkpoints' own record (which survives config.json)."""
  records = []
  file_record = run_metadata.read_record(workdir)
  if file_record is not None and "config" in file_record:
    records.append(("config.json", file_record))
  checkpoint_record = checkpointer.recorded_config() if checkpointer is not None else None
  if checkpoint_record is not None:
    records.append(("the checkpoints", checkpoint_record))
  return records


def _check_completed_config(workdir: str, config: Any, checkpointer: Any) -> None:
  """Refuses a config that differs from the one a completed run recorded (as a resume
  with one is refused), instead of reporting the run as done."""
  for source, record in _config_records(workdir, checkpointer):
    diffs = run_metadata.differences(record, config)
    if diffs:
      raise RunRefused(
          f"refusing to run in {workdir}: it holds a completed run whose config (in "
          f"{source}) differs from this one in " + "; ".join(diffs) + ". Train this "
          "config in another --workdir.")


def _check_resumed_config(workdir: str, config: Any, has_checkpoint: bool,
                          checkpointer: Any) -> None:
  """Refuses a resume whose config differs from a recorded one (config.json, or the
  checkpoints' own record, which survives config.json), or whose checkpoints have no
  record of their config at all."""
  records = _config_records(workdir, checkpointer)
  if has_checkpoint and not records and checkpointer is not None \
      and not checkpointer.steps_with_metadata():
    raise RunRefused(
        f"refusing to --resume {workdir}: config.json is missing or unreadable, and no "
        f"checkpoint step there ({checkpointer.all_steps()}) has readable metadata (each "
        "is empty or was cut short while being written), so there is nothing to resume "
        "and nothing shows which config trained them. Move "
        f"{checkpointer.directory} aside and train again without --resume, or put the "
        "run's config.json back.")
  if has_checkpoint and not records:
    raise RunRefused(
        f"refusing to --resume {workdir}: it holds checkpoints but no record of the "
        "config they were trained with (config.json is missing or unreadable, and the "
        "checkpoints predate carrying their config), so nothing can show that this "
        "config is theirs. Put the run's config.json back, or train in another "
        "--workdir.")
  for source, record in records:
    diffs = run_metadata.differences(record, config)
    if diffs:
      raise RunRefused(
          f"refusing to --resume {workdir}: the config recorded in {source} differs "
          "from this one in " + "; ".join(diffs) + ". Resume with the recorded flags, "
          "or train this config in another --workdir.")


def claim(workdir: str, *, results_file: str, resume: bool, config: Any = None,
          has_checkpoint: bool = False, checkpointer: Any = None,
          writer_process: bool = True) -> Claim:
  """Checks and locks ``workdir`` for one run (see the module docstring).

  Args:
    workdir, results_file: the run's (absolute) paths.
    resume: ``--resume`` was given.
    config: the run's config, compared (on resume, or with a completed run) with the
      one recorded in config.json and with the one the checkpoints carry.
    has_checkpoint: the directory already holds a checkpoint (implied by a
      ``checkpointer`` that holds one).
    checkpointer: the run's :class:`experiments.common.harness.checkpoint.Checkpointer`, whose
      checkpoints may carry the config they were trained with.
    writer_process: False on the non-writing processes of a multi-process job (they
      share the directory and take no lock).

  Raises:
    RunAlreadyCompleted: the directory holds a finished run (its results row restored
      into ``results_file`` if it was missing there or damaged).
    FileExistsError: it holds a run and ``resume`` is False.
    WorkdirInUse: another live process holds it.
    RunRefused: resuming with, or finding a completed run of, a config that differs
      from a recorded one; or resuming checkpoints with no record of their config.
    NotWritable: the run directory or the results file cannot be written.
  """
  # A completed run is final, so it is recognized before the lock: a fetched sweep on
  # a read-only mount reruns to "already completed" (its row restored elsewhere if
  # need be), not to a PermissionError on .lock.
  done = completion_record(workdir)
  if done is not None:
    if config is not None:
      _check_completed_config(workdir, config, checkpointer)
    what = (_restore_row(workdir, done, results_file) if writer_process
            else f"its results row is in {done['results_file']}); nothing was written")
    raise RunAlreadyCompleted(
        f"{workdir} holds a completed run (step {done['step']}; {what}. Train again "
        "with another --workdir (or change the config: the default workdir is named "
        "after it).")
  held = Claim(workdir, _lock(workdir) if writer_process else None)
  try:
    if checkpointer is not None and checkpointer.latest_step() is not None:
      has_checkpoint = True
    if has_checkpoint and not resume:
      raise FileExistsError(
          f"{workdir} already holds an interrupted run; pass --resume to continue it, "
          "or choose another --workdir (or change the config: the default workdir is "
          "named after it).")
    if resume and config is not None:
      _check_resumed_config(workdir, config, has_checkpoint, checkpointer)
    if writer_process:
      check_results_writable(results_file)
  except BaseException:
    held.release()
    raise
  return held
